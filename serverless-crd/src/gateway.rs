//! The gateway (activator): `POST /function/<namespace>/<name>` invokes a function. It routes to
//! the function's running pods (least outstanding requests, at most `targetConcurrency` each),
//! holds requests in a bounded queue while the function scales from zero or all pods are busy,
//! retries a connection refused while a just-started pod opens its port (this decides the cold
//! start, not the kubelet's probes), and stops sending to pods being removed. It rebuilds all
//! of this from the API (Functions and pods), so a restart loses nothing that matters. Its
//! autoscaler writes each function's Deployment `scale`; `/metrics` is Prometheus text.

use crate::autoscaler::{self, Decider, Samples};
use crate::revision::{self, deployment_name};
use crate::runtime::{CODE_HASH, FUNCTION_LABEL, RUNTIME_PORT};
use crate::types::Metric;
use crate::types::{Function, FunctionRevision, REVISION_LABEL};
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, Limited};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::json;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Largest request body (as AWS Lambda's synchronous payload limit).
pub const MAX_BODY: usize = 6 * 1024 * 1024;
/// How long one connection attempt to a pod may take before it is made again.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(100);
/// How long a pod may refuse connections before the call fails.
const CONNECT_FOR: Duration = Duration::from_secs(30);
/// How often the autoscaler looks at every function.
const TICK: Duration = Duration::from_secs(1);

/// What the gateway needs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where it listens (a host port).
    pub listen: SocketAddr,
}

/// One pod requests can go to.
#[derive(Debug)]
struct Backend {
    pod: String,
    addr: SocketAddr,
    /// The path calls are POSTed to: `/` for a function's own pod, `/<ns>/<fn>/<revision>`
    /// for a module in a base.
    path: String,
    /// A module in a base (which answers at once or is down; never "starting").
    module: bool,
    inflight: AtomicUsize,
    /// The pod is being removed (or gone): nothing new is sent to it.
    removed: std::sync::atomic::AtomicBool,
}

/// What the gateway keeps per revision (rebuilt from pods and requests after a restart).
#[derive(Default)]
struct FnState {
    backends: Mutex<Vec<Arc<Backend>>>,
    waiting: AtomicUsize,
    inflight: AtomicUsize,
    changed: tokio::sync::Notify,
    last_request: Mutex<Option<Instant>>,
    /// Requests that arrived, ever; and the count and time at the last tick (for `rps`).
    arrived: std::sync::atomic::AtomicU64,
    arrived_at_tick: Mutex<Option<(u64, Instant)>>,
    samples: Mutex<Samples>,
    decider: Mutex<Decider>,
}

impl FnState {
    /// Requests a second that arrived since the last tick (0 at the first).
    fn rps(&self, now: Instant) -> f64 {
        let arrived = self.arrived.load(Ordering::SeqCst);
        let mut last = self.arrived_at_tick.lock().expect("arrived");
        let rate = match *last {
            Some((count, at)) if now > at => {
                (arrived - count) as f64 / now.duration_since(at).as_secs_f64()
            }
            _ => 0.0,
        };
        *last = Some((arrived, now));
        rate
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FnLabels {
    namespace: String,
    function: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RevisionLabels {
    namespace: String,
    function: String,
    revision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    namespace: String,
    function: String,
    revision: String,
    code: String,
}

struct Metrics {
    registry: Arc<Registry>,
    requests: Family<CodeLabels, Counter>,
    duration: Family<RevisionLabels, Histogram>,
    cold_starts: Family<FnLabels, Counter>,
    cold_start_duration: Family<FnLabels, Histogram>,
    inflight: Family<FnLabels, Gauge>,
    queue: Family<FnLabels, Gauge>,
    desired_pods: Family<RevisionLabels, Gauge>,
    panic_mode: Family<RevisionLabels, Gauge>,
}

fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    /// The gateway's metrics, added to `registry` (which may hold others' already).
    fn new(mut registry: Registry) -> Self {
        let requests = Family::<CodeLabels, Counter>::default();
        let duration = Family::<RevisionLabels, Histogram>::new_with_constructor(
            histogram as fn() -> Histogram,
        );
        let cold_starts = Family::<FnLabels, Counter>::default();
        let cold_start_duration =
            Family::<FnLabels, Histogram>::new_with_constructor(histogram as fn() -> Histogram);
        let inflight = Family::<FnLabels, Gauge>::default();
        let queue = Family::<FnLabels, Gauge>::default();
        let desired_pods = Family::<RevisionLabels, Gauge>::default();
        let panic_mode = Family::<RevisionLabels, Gauge>::default();
        registry.register(
            "minik8s_function_requests",
            "Invocations by answer code",
            requests.clone(),
        );
        registry.register(
            "minik8s_function_request_duration_seconds",
            "Invocation latency through the gateway",
            duration.clone(),
        );
        registry.register(
            "minik8s_function_cold_starts",
            "Invocations that waited for a pod to start",
            cold_starts.clone(),
        );
        registry.register(
            "minik8s_function_cold_start_duration_seconds",
            "From a cold request's arrival to its answer",
            cold_start_duration.clone(),
        );
        registry.register(
            "minik8s_function_inflight",
            "Invocations being served",
            inflight.clone(),
        );
        registry.register(
            "minik8s_function_queue_length",
            "Invocations waiting for a pod",
            queue.clone(),
        );
        registry.register(
            "minik8s_function_desired_pods",
            "Pods the autoscaler asks for (Knative's desired_pods)",
            desired_pods.clone(),
        );
        registry.register(
            "minik8s_function_panic_mode",
            "1 while the autoscaler is in panic mode (Knative's panic_mode)",
            panic_mode.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            requests,
            duration,
            cold_starts,
            cold_start_duration,
            inflight,
            queue,
            desired_pods,
            panic_mode,
        }
    }
}

/// The gateway's shared state.
pub struct Gateway {
    client: Client,
    functions: Store<Function>,
    revisions: Store<FunctionRevision>,
    deployments: Store<Deployment>,
    pods: Store<Pod>,
    states: Mutex<HashMap<(String, String), Arc<FnState>>>,
    metrics: Metrics,
}

/// The header carrying an invocation's id to the function (`context["invocation_id"]`); a
/// caller that retries sends the same id again, so a handler can deduplicate.
pub const INVOCATION_ID: &str = "x-invocation-id";

/// The header naming the tag a call goes to (as `<function>@<tag>` in the path).
pub const FUNCTION_TAG: &str = "x-function-tag";
/// The answer's header naming the revision that gave it.
pub const FUNCTION_REVISION: &str = "x-function-revision";

/// A function's answer to an invocation.
#[derive(Debug)]
pub struct Answer {
    /// Its code (any the function itself gave).
    pub code: StatusCode,
    /// Its headers (those of the pod's answer, hop-by-hop ones removed).
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
    /// The revision that answered.
    pub revision: String,
}

/// What a call sends to a revision's pod.
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// Its method.
    pub method: Method,
    /// Its path and query; `None`: the backend's invocation path (`/`, or a module's).
    pub path: Option<String>,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// The annotation of a Function listing the hosts that reach it (a Knative Route's): `host`
/// or `host=tag`, comma-separated.
pub const HOSTS: &str = "serverless.minik8s.io/hosts";

/// `name@tag` → `(name, Some(tag))`.
pub fn split_target(target: &str) -> (&str, Option<&str>) {
    match target.split_once('@') {
        Some((name, tag)) => (name, Some(tag)),
        None => (target, None),
    }
}

/// A failed invocation: its HTTP answer.
#[derive(Debug)]
pub struct Failure {
    /// The answer's code.
    pub code: StatusCode,
    /// What went wrong.
    pub message: String,
    retry_after: Option<u64>,
}

impl Failure {
    fn new(code: StatusCode, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut r = (
            self.code,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"error": self.message}).to_string(),
        )
            .into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }
}

/// Marks the function active when a request ends (idleness counts from the last answer).
struct Activity<'a>(&'a FnState);

impl Drop for Activity<'_> {
    fn drop(&mut self) {
        *self.0.last_request.lock().expect("last") = Some(Instant::now());
    }
}

/// Decrements a counter when dropped (a request leaving the queue or a pod).
struct Count<'a>(&'a AtomicUsize);

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn count(c: &AtomicUsize) -> Count<'_> {
    c.fetch_add(1, Ordering::SeqCst);
    Count(c)
}

impl Gateway {
    /// Whether Function `ns/name` exists (as the gateway's watch last saw it); `name@tag`:
    /// whether it has that tag too.
    pub fn has_function(&self, ns: &str, target: &str) -> bool {
        let (name, tag) = split_target(target);
        let Some(f) = self.functions.get(&ObjectRef::new(name).within(ns)) else {
            return false;
        };
        match tag {
            None => true,
            Some(t) => f.spec.traffic.iter().any(|x| x.tag.as_deref() == Some(t)),
        }
    }

    /// The function (`ns`, `name` or `name@tag`) a request for `host` goes to: the one whose
    /// [`HOSTS`] lists it.
    pub fn by_host(&self, host: &str) -> Option<(String, String)> {
        let host = host.to_ascii_lowercase();
        self.functions.state().into_iter().find_map(|f| {
            let listed = f.annotations().get(HOSTS)?;
            listed.split(',').find_map(|entry| {
                let (h, tag) = match entry.trim().split_once('=') {
                    Some((h, t)) => (h, Some(t)),
                    None => (entry.trim(), None),
                };
                (h == host).then(|| {
                    let name = f.name_any();
                    let target = tag.map_or_else(|| name.clone(), |t| format!("{name}@{t}"));
                    (f.namespace().unwrap_or_default(), target)
                })
            })
        })
    }

    /// Whether `ns/name` (or `name@tag`) is a container function (a Knative revision's),
    /// called with requests as they come.
    pub fn is_container(&self, ns: &str, target: &str) -> bool {
        let (name, _) = split_target(target);
        self.functions
            .get(&ObjectRef::new(name).within(ns))
            .is_some_and(|f| f.spec.runtime == crate::types::Runtime::Container)
    }

    /// Waits until the gateway's view of Functions is complete (after a start).
    pub async fn ready(&self) {
        let _ = self.functions.wait_until_ready().await;
    }

    fn state(&self, ns: &str, revision: &str) -> Arc<FnState> {
        self.states
            .lock()
            .expect("states")
            .entry((ns.to_owned(), revision.to_owned()))
            .or_default()
            .clone()
    }

    /// Rebuilds a revision's backends from its pods: running, with an address, not being
    /// removed. Backends that stay keep their in-flight counts.
    fn refresh(&self, ns: &str, revision: &str) {
        let state = self.state(ns, revision);
        let mut backends = state.backends.lock().expect("backends");
        let pods: Vec<Arc<Pod>> = self
            .pods
            .state()
            .into_iter()
            .filter(|p| {
                p.namespace().as_deref() == Some(ns)
                    && p.labels().get(REVISION_LABEL).map(String::as_str) == Some(revision)
            })
            .collect();
        let mut next = Vec::new();
        for p in pods {
            let status = p.status.as_ref();
            let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
            let ip = status.and_then(|s| s.pod_ip.as_deref()).unwrap_or_default();
            if !running || ip.is_empty() || p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
                continue;
            };
            let name = p.name_any();
            let module = p
                .labels()
                .get(minik8s_vnode::PROVIDER_LABEL)
                .map(String::as_str)
                == Some(crate::modules::PROVIDER);
            let path = if module {
                let function = p.labels().get(FUNCTION_LABEL).cloned().unwrap_or_default();
                let code = p.annotations().get(CODE_HASH).cloned().unwrap_or_default();
                format!("/{ns}/{function}/{code}")
            } else {
                "/".to_owned()
            };
            let port = if module {
                RUNTIME_PORT
            } else {
                self.revisions
                    .get(&ObjectRef::new(revision).within(ns))
                    .map_or(RUNTIME_PORT, |r| {
                        revision::serving_port(r.spec.template.as_ref())
                    })
            };
            match backends.iter().find(|b| b.pod == name) {
                Some(b) => next.push(b.clone()),
                None => next.push(Arc::new(Backend {
                    pod: name,
                    addr: SocketAddr::new(ip, port as u16),
                    path,
                    module,
                    inflight: AtomicUsize::new(0),
                    removed: std::sync::atomic::AtomicBool::new(false),
                })),
            }
        }
        for old in backends.iter() {
            if !next.iter().any(|b| Arc::ptr_eq(b, old)) {
                old.removed.store(true, Ordering::SeqCst);
            }
        }
        *backends = next;
        drop(backends);
        state.changed.notify_waiters();
    }

    /// Picks the least loaded backend with a free slot (`limit` requests a pod; `None`: no
    /// limit), other than `skip`, and takes the slot.
    fn pick(state: &FnState, limit: Option<usize>, skip: Option<&str>) -> Option<Arc<Backend>> {
        let backends = state.backends.lock().expect("backends");
        let b = backends
            .iter()
            .filter(|b| limit.is_none_or(|l| b.inflight.load(Ordering::SeqCst) < l))
            .filter(|b| Some(b.pod.as_str()) != skip)
            .min_by_key(|b| b.inflight.load(Ordering::SeqCst))?
            .clone();
        b.inflight.fetch_add(1, Ordering::SeqCst);
        Some(b)
    }

    /// Sets the revision's Deployment to at least one pod, now (the first request of a
    /// revision scaled to zero must not wait for the autoscaler's tick).
    async fn wake(&self, ns: &str, name: &str) {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
        let child = deployment_name(name);
        match api.get_scale(&child).await {
            Ok(s) if s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0) == 0 => {
                let patch = Patch::Merge(json!({"spec": {"replicas": 1}}));
                if let Err(e) = api
                    .patch_scale(&child, &PatchParams::default(), &patch)
                    .await
                {
                    tracing::warn!(function = %name, error = %e, "scaling from zero");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(function = %name, error = %e, "reading the scale"),
        }
    }

    /// The revision a call of `ns/name` goes to: the tag's, or one picked by the split.
    /// Waits (up to `wait`) while the function has no route yet: just made, its first
    /// revision is on its way.
    async fn route(
        &self,
        ns: &str,
        name: &str,
        tag: Option<&str>,
        wait: Duration,
    ) -> Result<(Arc<Function>, String), Failure> {
        let until = Instant::now() + wait;
        loop {
            let f = self
                .functions
                .get(&ObjectRef::new(name).within(ns))
                .ok_or_else(|| {
                    Failure::new(
                        StatusCode::NOT_FOUND,
                        format!("function {ns}/{name} not found"),
                    )
                })?;
            let traffic = f
                .status
                .as_ref()
                .map(|s| s.traffic.as_slice())
                .unwrap_or(&[]);
            let picked = match tag {
                Some(t) => match revision::tagged(traffic, t) {
                    Some(r) => Some(r.to_owned()),
                    None if traffic.is_empty() => None,
                    None => {
                        return Err(Failure::new(
                            StatusCode::NOT_FOUND,
                            format!("function {ns}/{name} has no tag {t}"),
                        ));
                    }
                },
                None => revision::pick(traffic, rand::random_range(0..100)).map(str::to_owned),
            };
            if let Some(r) = picked {
                return Ok((f, r));
            }
            if Instant::now() >= until {
                let mut e = Failure::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("function {ns}/{name} has no revision to route to yet"),
                );
                e.retry_after = Some(1);
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Invokes `target` (`<function>` or `<function>@<tag>`) in `ns` with a JSON `body`: the
    /// function's answer (code and body, any code the function itself gave) and the revision
    /// that gave it, or why the gateway could not get one.
    pub async fn call(
        &self,
        ns: &str,
        target: &str,
        body: Bytes,
        invocation_id: &str,
    ) -> Result<Answer, Failure> {
        if serde_json::from_slice::<serde_json::Value>(&body).is_err() && !body.is_empty() {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "the request body is not JSON",
            ));
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Ok(v) = HeaderValue::from_str(invocation_id) {
            headers.insert(INVOCATION_ID, v);
        }
        let out = Outgoing {
            method: Method::POST,
            path: None,
            headers,
            body,
        };
        self.send(ns, target, out).await
    }

    /// Sends `out` to `target` (`<function>` or `<function>@<tag>`) in `ns`: to a pod of the
    /// revision the traffic split (or the tag) picks, scaling it from zero and waiting in
    /// the queue as needed. The pod's answer, or why the gateway could not get one.
    pub async fn send(&self, ns: &str, target: &str, out: Outgoing) -> Result<Answer, Failure> {
        let started = Instant::now();
        let (name, tag) = split_target(target);
        let (f, rev) = self.route(ns, name, tag, Duration::from_secs(10)).await?;
        let revision = self.revisions.get(&ObjectRef::new(&rev).within(ns));
        if let Some(message) = revision.as_deref().and_then(revision::load_error) {
            // Its code does not load: nothing would come up to answer.
            return Err(Failure::new(
                StatusCode::BAD_GATEWAY,
                format!("the function's source does not load: {message}"),
            ));
        }
        let spec = &f.spec;
        let state = self.state(ns, &rev);
        *state.last_request.lock().expect("last") = Some(started);
        state.arrived.fetch_add(1, Ordering::SeqCst);
        let deadline = started + Duration::from_secs(spec.timeout_seconds.max(1) as u64);
        let limit = spec.scale.per_pod_limit();
        let labels = FnLabels {
            namespace: ns.to_owned(),
            function: name.to_owned(),
        };

        // A slot on a pod, waiting in the bounded queue if there is none; again if the pod
        // went away before the request could be sent to it.
        let mut cold = false;
        // A module whose base failed the call is tried once more on another base.
        let mut failed_module: Option<String> = None;
        let (backend, result) = loop {
            let skip = failed_module.as_deref();
            let backend = match Self::pick(&state, limit, skip) {
                Some(b) => b,
                None => {
                    if state.waiting.load(Ordering::SeqCst)
                        >= spec.scale.queue_limit.max(0) as usize
                    {
                        let mut f = Failure::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!(
                                "function {ns}/{name} is at its queue limit ({})",
                                spec.scale.queue_limit
                            ),
                        );
                        f.retry_after = Some(1);
                        return Err(f);
                    }
                    let _waiting = count(&state.waiting);
                    self.metrics.queue.get_or_create(&labels).inc();
                    cold = state.backends.lock().expect("backends").is_empty();
                    if cold {
                        self.wake(ns, &rev).await;
                    }
                    let got = loop {
                        let notified = state.changed.notified();
                        tokio::pin!(notified);
                        notified.as_mut().enable();
                        if let Some(b) = Self::pick(&state, limit, skip) {
                            break Some(b);
                        }
                        tokio::select! {
                            _ = notified => {}
                            _ = tokio::time::sleep_until(deadline.into()) => break None,
                        }
                    };
                    self.metrics.queue.get_or_create(&labels).dec();
                    got.ok_or_else(|| {
                        Failure::new(
                            StatusCode::GATEWAY_TIMEOUT,
                            format!(
                                "function {ns}/{name} had no pod free within {} s",
                                spec.timeout_seconds
                            ),
                        )
                    })?
                }
            };
            let _inflight = count(&state.inflight);
            let _active = Activity(&state);
            let gauge = self.metrics.inflight.get_or_create_owned(&labels);
            gauge.inc();
            let result = forward(&backend, &out, deadline).await;
            gauge.dec();
            backend.inflight.fetch_sub(1, Ordering::SeqCst);
            state.changed.notify_waiters();
            match result {
                Err(Forward::Gone) => continue,
                Err(Forward::Failed(e)) if backend.module && failed_module.is_none() => {
                    tracing::info!(function = %name, pod = %backend.pod, error = %e, "module call failed; trying another base");
                    failed_module = Some(backend.pod.clone());
                    continue;
                }
                other => break (backend, other),
            }
        };
        let answer = match result {
            Ok((code, headers, bytes)) => {
                if code == StatusCode::BAD_GATEWAY {
                    self.source_failed(ns, &rev, revision.as_deref(), &bytes)
                        .await;
                }
                Ok(Answer {
                    code,
                    headers,
                    body: bytes,
                    revision: rev.clone(),
                })
            }
            Err(Forward::Timeout) => {
                // A handler that never returns: the pod is recycled.
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                let _ = pods
                    .delete(&backend.pod, &DeleteParams::default().grace_period(0))
                    .await;
                Err(Failure::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "function {ns}/{name} did not answer within {} s",
                        spec.timeout_seconds
                    ),
                ))
            }
            // Retried above; kept total rather than assumed.
            Err(Forward::Gone) => Err(Failure::new(
                StatusCode::BAD_GATEWAY,
                format!("calling function {ns}/{name}: its pod went away"),
            )),
            Err(Forward::Failed(e)) => Err(Failure::new(
                StatusCode::BAD_GATEWAY,
                format!("calling function {ns}/{name}: {e}"),
            )),
        };
        let code = match &answer {
            Ok(a) => a.code,
            Err(f) => f.code,
        };
        let elapsed = started.elapsed();
        self.metrics
            .requests
            .get_or_create(&CodeLabels {
                namespace: ns.to_owned(),
                function: name.to_owned(),
                revision: rev.clone(),
                code: code.as_u16().to_string(),
            })
            .inc();
        self.metrics
            .duration
            .get_or_create(&RevisionLabels {
                namespace: ns.to_owned(),
                function: name.to_owned(),
                revision: rev.clone(),
            })
            .observe(elapsed.as_secs_f64());
        if cold && code.is_success() {
            self.metrics.cold_starts.get_or_create(&labels).inc();
            self.metrics
                .cold_start_duration
                .get_or_create(&labels)
                .observe(elapsed.as_secs_f64());
            let api: Api<Function> = Api::namespaced(self.client.clone(), ns);
            let patch = Patch::Merge(
                json!({"status": {"lastColdStartMillis": elapsed.as_millis() as i64}}),
            );
            let _ = api
                .patch_status(name, &PatchParams::default(), &patch)
                .await;
        }
        answer
    }

    /// A pod answered that the revision's code does not load: the revision says so (for
    /// good: its code is frozen), and the Function follows.
    async fn source_failed(
        &self,
        ns: &str,
        rev: &str,
        known: Option<&FunctionRevision>,
        body: &[u8],
    ) {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
            return;
        };
        if v.get("sourceReady") != Some(&json!(false)) {
            return;
        }
        let message = v.get("error").and_then(|e| e.as_str()).unwrap_or_default();
        if known.and_then(revision::load_error).as_deref() == Some(message) {
            return;
        }
        let now = jiff::Timestamp::now().to_string();
        let conditions = json!([{"type": "Ready", "status": "False", "reason": "ImportError",
            "message": message, "lastTransitionTime": now}]);
        let api: Api<FunctionRevision> = Api::namespaced(self.client.clone(), ns);
        let patch = Patch::Merge(json!({"status": {"conditions": conditions}}));
        if let Err(e) = api.patch_status(rev, &PatchParams::default(), &patch).await {
            tracing::warn!(revision = %rev, error = %e, "reporting the source error");
        }
    }

    /// One autoscaler pass over every revision: each scales on its own traffic, with its
    /// function's scale settings (`minScale` only while it takes traffic).
    async fn autoscale(&self) {
        let now = Instant::now();
        let revisions = self.revisions.state();
        // The state of deleted revisions goes (requests still running hold their own).
        self.states.lock().expect("states").retain(|(ns, name), _| {
            revisions
                .iter()
                .any(|r| r.namespace().as_deref() == Some(ns) && r.name_any() == *name)
        });
        for r in revisions {
            if revision::load_error(&r).is_some() {
                // Left at zero by the revision controller: its code does not load.
                continue;
            }
            let ns = r.namespace().unwrap_or_default();
            let rev = r.name_any();
            let Some(f) = self
                .functions
                .get(&ObjectRef::new(&r.spec.function).within(&ns))
            else {
                continue;
            };
            let child = deployment_name(&rev);
            let Some(current) = self
                .deployments
                .get(&ObjectRef::new(&child).within(&ns))
                .and_then(|d| d.spec.as_ref().and_then(|s| s.replicas))
            else {
                continue;
            };
            let routed = f
                .status
                .as_ref()
                .and_then(|s| revision::traffic_of(&s.traffic, &rev))
                .is_some();
            let state = self.state(&ns, &rev);
            let concurrency =
                state.inflight.load(Ordering::SeqCst) + state.waiting.load(Ordering::SeqCst);
            let s = &f.spec.scale;
            let window = s.window();
            let value = match s.metric {
                Metric::Concurrency => concurrency as f64,
                Metric::Rps => state.rps(now),
            };
            let (stable, panic) = {
                let mut samples = state.samples.lock().expect("samples");
                samples.record(now, value, window);
                (
                    samples.average(now, window),
                    samples.average(now, autoscaler::panic_window(window)),
                )
            };
            let ready = state.backends.lock().expect("backends").len();
            let idle = state
                .last_request
                .lock()
                .expect("last")
                .map_or(Duration::MAX, |t| now.duration_since(t));
            let (want, was_panicking, panicking) = {
                let mut decider = state.decider.lock().expect("decider");
                let was_panicking = decider.panicking();
                let want = decider.desired(
                    now,
                    autoscaler::Inputs {
                        current,
                        ready,
                        stable,
                        panic,
                        now: concurrency,
                        per_pod: match s.metric {
                            Metric::Concurrency => s.per_pod_limit(),
                            Metric::Rps => None,
                        },
                        idle,
                        target: s.target_value(),
                        min: if routed { s.min_scale } else { 0 },
                        max: s.max_scale,
                        to_zero_after: Duration::from_secs(
                            s.scale_to_zero_after_seconds.max(0) as u64
                        ),
                        window,
                        routed,
                    },
                );
                (want, was_panicking, decider.panicking())
            };
            let labels = RevisionLabels {
                namespace: ns.clone(),
                function: r.spec.function.clone(),
                revision: rev.clone(),
            };
            self.metrics
                .desired_pods
                .get_or_create(&labels)
                .set(i64::from(want));
            self.metrics
                .panic_mode
                .get_or_create(&labels)
                .set(i64::from(panicking));
            if panicking != was_panicking {
                tracing::info!(revision = %rev, namespace = %ns, panic, stable, "{}", if panicking { "panicking" } else { "un-panicking" });
            }
            if want < current && !revision::is_ready(&r) {
                // Not down before it has shown it can serve (its first pod is coming up).
                continue;
            }
            if want != current {
                tracing::info!(revision = %rev, namespace = %ns, from = current, to = want, metric = ?s.metric, stable, panic, "scaling");
                let api: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
                let patch = Patch::Merge(json!({"spec": {"replicas": want}}));
                if let Err(e) = api
                    .patch_scale(&child, &PatchParams::default(), &patch)
                    .await
                {
                    tracing::warn!(revision = %rev, error = %e, "scaling");
                }
            }
        }
    }
}

/// Why forwarding failed.
#[derive(Debug)]
enum Forward {
    /// No answer by the deadline.
    Timeout,
    /// The pod could not be called.
    Failed(String),
    /// The pod went away before the request was sent: another may take it.
    Gone,
}

/// Sends `out` to the pod, retrying a refused connection (the runtime is starting) until
/// the deadline.
async fn forward(
    backend: &Backend,
    out: &Outgoing,
    deadline: Instant,
) -> Result<(StatusCode, HeaderMap, Bytes), Forward> {
    let addr = backend.addr;
    let call = async {
        // A pod that has just started may refuse (its runtime is not listening yet) or not
        // answer at all (its network is still being wired): each attempt is short, and they
        // go on until the deadline. A pod that keeps failing past CONNECT_FOR is reported.
        let first = Instant::now();
        let tcp = loop {
            let attempt =
                tokio::time::timeout(CONNECT_ATTEMPT, tokio::net::TcpStream::connect(addr)).await;
            match attempt {
                Ok(Ok(s)) => break s,
                _ if backend.removed.load(Ordering::SeqCst) => return Err(Forward::Gone),
                Ok(Err(e)) if first.elapsed() > CONNECT_FOR || backend.module => {
                    return Err(Forward::Failed(e.to_string()));
                }
                Ok(Err(e)) => {
                    tracing::debug!(%addr, error = %e, "pod not answering yet");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(_) => tracing::debug!(%addr, "connect attempt timed out"),
            }
        };
        request_on(tcp, &addr.to_string(), out, &backend.path)
            .await
            .map_err(Forward::Failed)
    };
    match tokio::time::timeout_at(deadline.into(), call).await {
        Ok(r) => r,
        Err(_) => Err(Forward::Timeout),
    }
}

/// Headers that concern one connection only (RFC 9110 7.6.1): not passed on by a proxy.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
}

/// Sends `out` on a connected stream (HTTP/1.1), to its path or `default_path`, with `host`
/// as its `Host` unless it names one; the answer's code, headers and body.
async fn request_on(
    tcp: tokio::net::TcpStream,
    host: &str,
    out: &Outgoing,
    default_path: &str,
) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    minik8s_task::spawn("function-connection", conn);
    let path = out.path.as_deref().unwrap_or(default_path);
    let mut req = hyper::Request::builder()
        .method(out.method.clone())
        .uri(path)
        .body(Full::new(out.body.clone()))
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = out.headers.clone();
    strip_hop_by_hop(req.headers_mut());
    req.headers_mut().remove(header::CONTENT_LENGTH);
    if !req.headers().contains_key(header::HOST) {
        let v = HeaderValue::from_str(host).map_err(|e| e.to_string())?;
        req.headers_mut().insert(header::HOST, v);
    }
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status();
    let (parts, body) = resp.into_parts();
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((code, headers, bytes))
}

/// POSTs a JSON body on a connected stream (HTTP/1.1) with extra `headers`; the answer's
/// code and body.
pub async fn post_on(
    tcp: tokio::net::TcpStream,
    host: &str,
    path: &str,
    body: Bytes,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, Bytes), String> {
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    minik8s_task::spawn("function-connection", conn);
    let mut req = hyper::Request::post(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((code, bytes))
}

/// POSTs a JSON body to an `http://host:port/path` URL.
pub async fn post(url: &str, body: Bytes) -> Result<(StatusCode, Bytes), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("not an http:// URL: {url}"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| format!("connecting to {authority}: {e}"))?;
    post_on(tcp, authority, path, body, &[]).await
}

/// The host a request asked for (`X-Forwarded-Host` from the router, else `Host`), without
/// its port.
fn host_of(req: &Request) -> &str {
    let host = req
        .headers()
        .get("x-forwarded-host")
        .or_else(|| req.headers().get(header::HOST))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    })
}

/// Requests for a Knative Route's host go, as they came, to the function the host names
/// (before the gateway's own routes: an app's `/metrics` is the app's); others go on.
async fn hosts_first(
    State(g): State<Arc<Gateway>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let Some((ns, target)) = g.by_host(host_of(&req)) else {
        return next.run(req).await;
    };
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    proxy(&g, &ns, &target, path, req).await
}

/// Neither a route of the gateway nor a known host.
async fn unknown(req: Request) -> Response {
    let host = host_of(&req).to_owned();
    Failure::new(
        StatusCode::NOT_FOUND,
        format!("no route for http://{host}{}", req.uri().path()),
    )
    .into_response()
}

/// Sends a request as it came (method, `path`, headers, body) to `target` in `ns`.
async fn proxy(g: &Gateway, ns: &str, target: &str, path: String, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Failure::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {MAX_BODY} bytes"),
            )
            .into_response();
        }
    };
    let out = Outgoing {
        method: parts.method,
        path: Some(path),
        headers: parts.headers,
        body,
    };
    match g.send(ns, target, out).await {
        Ok(a) => {
            let mut r = (a.code, a.body).into_response();
            r.headers_mut().extend(a.headers);
            if let Ok(v) = HeaderValue::from_str(&a.revision) {
                r.headers_mut().insert(FUNCTION_REVISION, v);
            }
            r
        }
        Err(f) => f.into_response(),
    }
}

/// A request's query with its `?`, or nothing.
fn query_of(req: &Request) -> String {
    req.uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default()
}

/// `/function/<ns>/<name>/<path>`: a request for a container function (a Knative
/// revision's) in the gateway's path form.
async fn invoke_path(
    State(g): State<Arc<Gateway>>,
    Path((ns, name, rest)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let query = query_of(&req);
    if !g.is_container(&ns, &name) {
        return Failure::new(
            StatusCode::NOT_FOUND,
            format!("function {ns}/{name} is called at /function/{ns}/{name} (POST)"),
        )
        .into_response();
    }
    proxy(&g, &ns, &name, format!("/{rest}{query}"), req).await
}

async fn invoke(
    State(g): State<Arc<Gateway>>,
    Path((ns, name)): Path<(String, String)>,
    req: Request,
) -> Response {
    if g.is_container(&ns, &name) {
        let query = query_of(&req);
        return proxy(&g, &ns, &name, format!("/{query}"), req).await;
    }
    if req.method() != Method::POST {
        return Failure::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("function {ns}/{name} is invoked with POST"),
        )
        .into_response();
    }
    // `<name>@<tag>` in the path, or the tag in a header.
    let tag = req
        .headers()
        .get(FUNCTION_TAG)
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty());
    let target = match tag {
        Some(t) if !name.contains('@') => format!("{name}@{t}"),
        _ => name,
    };
    // The caller's invocation id (a retry of the same invocation), or a new one.
    let id = req
        .headers()
        .get(INVOCATION_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Failure::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {MAX_BODY} bytes"),
            )
            .into_response();
        }
    };
    let mut r = match g.call(&ns, &target, body, &id).await {
        Ok(a) => {
            let mut r =
                (a.code, [(header::CONTENT_TYPE, "application/json")], a.body).into_response();
            if let Ok(v) = HeaderValue::from_str(&a.revision) {
                r.headers_mut().insert(FUNCTION_REVISION, v);
            }
            r
        }
        Err(f) => f.into_response(),
    };
    if let Ok(v) = HeaderValue::from_str(&id) {
        r.headers_mut().insert(INVOCATION_ID, v);
    }
    r
}

async fn metrics(State(g): State<Arc<Gateway>>) -> Response {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &g.metrics.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The gateway's HTTP routes.
fn app(g: Arc<Gateway>) -> Router {
    Router::new()
        .route("/function/{ns}/{name}", routing::any(invoke))
        .route("/function/{ns}/{name}/{*rest}", routing::any(invoke_path))
        .route("/metrics", routing::get(metrics))
        .route("/healthz", routing::get(|| async { "ok" }))
        .fallback(unknown)
        .layer(axum::middleware::from_fn_with_state(g.clone(), hosts_first))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(g)
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding its port.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A started gateway: its address, and the task serving it.
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The gateway, for calls from this process (workflows).
    pub gateway: Arc<Gateway>,
    /// Ends when the gateway has stopped.
    pub done: tokio::task::JoinHandle<()>,
}

/// Starts the gateway (routes, pod and Function watches, autoscaler) until `shutdown`.
pub async fn start(
    client: Client,
    cfg: Config,
    registry: Registry,
    shutdown: CancellationToken,
) -> Result<Running, Error> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| Error::Listen {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Listen {
        addr: cfg.listen,
        source,
    })?;
    let (functions, fn_writer) = reflector::store::<Function>();
    let (revisions, rev_writer) = reflector::store::<FunctionRevision>();
    let (deployments, deploy_writer) = reflector::store::<Deployment>();
    let (pods, pod_writer) = reflector::store::<Pod>();
    let g = Arc::new(Gateway {
        client: client.clone(),
        functions,
        revisions,
        deployments,
        pods,
        states: Mutex::new(HashMap::new()),
        metrics: Metrics::new(registry),
    });
    let fn_watch = reflector::reflector(
        fn_writer,
        watcher(
            Api::<Function>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .for_each(|_| async {});
    let rev_watch = reflector::reflector(
        rev_writer,
        watcher(
            Api::<FunctionRevision>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .for_each(|_| async {});
    let deploy_watch = reflector::reflector(
        deploy_writer,
        watcher(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default().labels(REVISION_LABEL),
        ),
    )
    .default_backoff()
    .for_each(|_| async {});
    let pod_watch = {
        let g = g.clone();
        reflector::reflector(
            pod_writer,
            watcher(
                Api::<Pod>::all(client.clone()),
                watcher::Config::default().labels(FUNCTION_LABEL),
            ),
        )
        .default_backoff()
        .for_each(move |ev| {
            let g = g.clone();
            async move {
                let touched: Vec<Pod> = match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) => vec![p],
                    Ok(watcher::Event::InitDone) => {
                        g.pods.state().iter().map(|p| (**p).clone()).collect()
                    }
                    _ => vec![],
                };
                for p in touched {
                    if let (Some(ns), Some(r)) = (p.namespace(), p.labels().get(REVISION_LABEL)) {
                        g.refresh(&ns, r);
                    }
                }
            }
        })
    };
    let scaler = {
        let g = g.clone();
        async move {
            let mut tick = tokio::time::interval(TICK);
            loop {
                tick.tick().await;
                g.autoscale().await;
            }
        }
    };
    let serve = axum::serve(listener, app(g.clone())).with_graceful_shutdown({
        let s = shutdown.clone();
        async move { s.cancelled().await }
    });
    let done = minik8s_task::spawn("gateway", async move {
        tokio::select! {
            r = serve => if let Err(e) = r { tracing::error!(error = %e, "the gateway stopped") },
            _ = fn_watch => {},
            _ = rev_watch => {},
            _ = deploy_watch => {},
            _ = pod_watch => {},
            _ = scaler => {},
            _ = shutdown.cancelled() => {},
        }
    });
    tracing::info!(%addr, "function gateway listening");
    Ok(Running {
        addr,
        gateway: g,
        done,
    })
}

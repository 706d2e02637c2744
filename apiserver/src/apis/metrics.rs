//! `metrics.k8s.io/v1beta1` (NodeMetrics, PodMetrics), as metrics-server serves it: every
//! `resolution` (15 s by default, metrics-server's `--metric-resolution`) a task reads each Ready
//! node's kubelet `/stats/summary` and keeps the last two samples of every container's
//! cumulative CPU time. CPU usage is the rate between them, over the stated `window`, ending at
//! the stated `timestamp`; memory is the working set at the last sample. A container that
//! started less than one resolution before its first sample is measured from its start (so a
//! new pod's metrics appear within one window), as metrics-server does. `kubectl top` and the
//! HPA read it; requests are answered from these samples, without calling the kubelets.

use crate::context::{Ctx, json_response};
use crate::error::{ApiError, ApiResult};
use crate::object;
use axum::http::StatusCode;
use axum::response::Response;
use minik8s_storage::Store;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// metrics-server's default resolution.
pub const DEFAULT_RESOLUTION: Duration = Duration::from_secs(15);

/// The shortest window a rate is reported over (shorter ones are mostly start-up noise).
const SHORTEST_WINDOW_NS: i128 = 1_000_000_000;

/// One sample: when (ns since the epoch), cumulative CPU (ns), working set (bytes), and when
/// the container (or node) started (ns since the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Point {
    at: i128,
    cpu: u64,
    memory: u64,
    start: i128,
}

/// The last two samples of something.
#[derive(Clone, Copy, Debug)]
struct Series {
    prev: Option<Point>,
    last: Point,
}

impl Series {
    /// Adds a sample after `old` (the series so far, if any), as metrics-server's storage does:
    /// the previous sample is kept when the new one is later and the container did not restart;
    /// otherwise a container that started within `resolution` counts from its start at zero.
    fn next(old: Option<&Series>, new: Point, resolution: Duration) -> Series {
        let prev = match old {
            Some(o) if new.start < o.last.at && new.at > o.last.at && new.cpu >= o.last.cpu => {
                Some(o.last)
            }
            Some(o) if new.at == o.last.at => o.prev,
            _ => None,
        };
        let prev = prev.or_else(|| {
            let age = new.at - new.start;
            (new.start > 0 && age >= SHORTEST_WINDOW_NS && age < resolution.as_nanos() as i128)
                .then_some(Point {
                    at: new.start,
                    cpu: 0,
                    memory: 0,
                    start: new.start,
                })
        });
        Series { prev, last: new }
    }

    /// CPU in nano-cores over the window, the window's end and its length (ns).
    fn rate(&self) -> Option<(u64, i128, i128)> {
        let prev = self.prev?;
        let window = self.last.at - prev.at;
        if window < SHORTEST_WINDOW_NS || self.last.cpu < prev.cpu {
            return None;
        }
        let cores = (self.last.cpu - prev.cpu) as i128 * 1_000_000_000 / window;
        Some((cores as u64, self.last.at, window))
    }
}

/// What was sampled: nodes by name; containers by (namespace, pod, container).
#[derive(Debug, Default)]
struct Samples {
    nodes: HashMap<String, Series>,
    containers: HashMap<(String, String, String), Series>,
}

/// The samples every metrics request reads, kept fresh by [`run`].
#[derive(Debug)]
pub struct Metrics {
    resolution: Duration,
    samples: RwLock<Arc<Samples>>,
    /// When the last extra round was taken for pods not sampled yet (ms since the epoch).
    extra: std::sync::atomic::AtomicI64,
}

impl Metrics {
    /// Metrics sampled every `resolution`.
    pub fn new(resolution: Duration) -> Self {
        Metrics {
            resolution: resolution.max(Duration::from_secs(1)),
            samples: RwLock::default(),
            extra: std::sync::atomic::AtomicI64::new(0),
        }
    }

    fn snapshot(&self) -> Arc<Samples> {
        self.samples.read().expect("metrics lock").clone()
    }

    /// Folds one round of summaries in; whatever was not in them is dropped.
    fn record(&self, summaries: &[(String, Value)]) {
        let old = self.snapshot();
        let mut new = Samples::default();
        for (node, summary) in summaries {
            let n = &summary["node"];
            if let Some(p) = point(&n["cpu"], &n["memory"], &n["startTime"]) {
                let s = Series::next(old.nodes.get(node), p, self.resolution);
                new.nodes.insert(node.clone(), s);
            }
            for pod in summary["pods"].as_array().into_iter().flatten() {
                let (ns, name) = (
                    pod["podRef"]["namespace"].as_str().unwrap_or_default(),
                    pod["podRef"]["name"].as_str().unwrap_or_default(),
                );
                for c in pod["containers"].as_array().into_iter().flatten() {
                    let Some(p) = point(&c["cpu"], &c["memory"], &c["startTime"]) else {
                        continue;
                    };
                    let key = (
                        ns.to_owned(),
                        name.to_owned(),
                        c["name"].as_str().unwrap_or_default().to_owned(),
                    );
                    let s = Series::next(old.containers.get(&key), p, self.resolution);
                    new.containers.insert(key, s);
                }
            }
        }
        *self.samples.write().expect("metrics lock") = Arc::new(new);
    }
}

/// Nanoseconds since the epoch of an RFC 3339 time.
fn nanos(v: &Value) -> Option<i128> {
    v.as_str()?
        .parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_nanosecond())
}

fn point(cpu: &Value, memory: &Value, start: &Value) -> Option<Point> {
    Some(Point {
        at: nanos(&cpu["time"])?,
        cpu: cpu["usageCoreNanoSeconds"].as_u64()?,
        memory: memory["workingSetBytes"].as_u64().unwrap_or(0),
        start: nanos(start).unwrap_or(0),
    })
}

/// A duration as Go's `time.Duration` prints it (`15.002s`, `1m0.5s`), as metav1.Duration does.
fn go_duration(ns: i128) -> String {
    let minutes = ns / 60_000_000_000;
    let rest = ns % 60_000_000_000;
    let secs = format!("{}.{:09}", rest / 1_000_000_000, rest % 1_000_000_000);
    let secs = secs.trim_end_matches('0').trim_end_matches('.');
    if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

/// A sample's time as metav1.Time (whole seconds).
fn timestamp(ns: i128) -> String {
    jiff::Timestamp::from_nanosecond(ns - ns.rem_euclid(1_000_000_000))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Every Ready node's summary: (node name, summary).
async fn summaries(api: &crate::Api) -> ApiResult<Vec<(String, Value)>> {
    let Some(client) = api.kubelet.as_ref() else {
        return Ok(Vec::new());
    };
    let nodes = api
        .store
        .range(minik8s_storage::RangeRequest::prefix(
            "/registry/core/nodes/",
        ))
        .await?;
    let mut calls = Vec::new();
    for kv in &nodes.kvs {
        let node = object::from_store(kv)?;
        let ready = node
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        let Ok((host, port)) = crate::aggregation::kubelet::endpoint(&node) else {
            continue;
        };
        if !ready {
            continue;
        }
        let name = object::meta_str(&node, "name")
            .unwrap_or_default()
            .to_owned();
        calls.push(async move {
            let got = tokio::time::timeout(
                Duration::from_secs(5),
                client.json(&host, port, "/stats/summary", &api.tasks),
            )
            .await;
            match got {
                Ok(Ok(v)) => Some((name, v)),
                Ok(Err(e)) => {
                    tracing::warn!(node = %name, error = %e, "reading kubelet stats");
                    None
                }
                Err(_) => {
                    tracing::warn!(node = %name, "reading kubelet stats timed out");
                    None
                }
            }
        });
    }
    Ok(futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect())
}

/// Samples every Ready node each resolution until the server stops.
pub async fn run(api: Arc<crate::Api>) {
    let mut tick = tokio::time::interval(api.metrics.resolution);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = api.shutdown.cancelled() => return,
        }
        match summaries(&api).await {
            Ok(all) => api.metrics.record(&all),
            Err(e) => tracing::warn!(error = %e, "sampling node metrics"),
        }
    }
}

fn usage(cores: u64, memory: u64) -> Value {
    json!({"cpu": format!("{cores}n"), "memory": format!("{}Ki", memory / 1024)})
}

fn node_metrics(name: &str, s: &Series) -> Option<Value> {
    let (cores, at, window) = s.rate()?;
    Some(json!({
        "kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {"name": name, "creationTimestamp": object::now()},
        "timestamp": timestamp(at), "window": go_duration(window),
        "usage": usage(cores, s.last.memory),
    }))
}

/// Each pod with a rate for every container it reports.
fn pod_metrics(samples: &Samples) -> Vec<Value> {
    let mut pods: HashMap<(&str, &str), Vec<(&str, &Series)>> = HashMap::new();
    for ((ns, pod, container), s) in &samples.containers {
        pods.entry((ns, pod)).or_default().push((container, s));
    }
    let mut out = Vec::new();
    for ((ns, pod), mut containers) in pods {
        containers.sort_by_key(|(name, _)| *name);
        let rates: Option<Vec<_>> = containers
            .iter()
            .map(|(name, s)| s.rate().map(|r| (name, s, r)))
            .collect();
        let Some(rates) = rates else { continue };
        let (_, _, (_, at, window)) = rates[0];
        out.push(json!({
            "kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {"name": pod, "namespace": ns, "creationTimestamp": object::now()},
            "timestamp": timestamp(at), "window": go_duration(window),
            "containers": rates.iter().map(|(name, s, (cores, _, _))| json!({
                "name": name, "usage": usage(*cores, s.last.memory),
            })).collect::<Vec<_>>(),
        }));
    }
    out
}

/// All metrics of the request's kind (in its namespace, for pods).
async fn items(ctx: &Ctx) -> ApiResult<Vec<Value>> {
    if ctx.api.kubelet.is_none() {
        return Err(ApiError::unavailable(
            "this apiserver has no kubelet client certificate",
        ));
    }
    let mut samples = ctx.api.metrics.snapshot();
    let stale = if ctx.res.plural == "pods" {
        unsampled(ctx, &samples).await?
    } else {
        // A node sampled once has no rate yet (metrics-server waits for its second scrape).
        samples.nodes.is_empty() || samples.nodes.values().any(|s| s.rate().is_none())
    };
    if stale && ctx.api.metrics.may_add_round() {
        // A pod running for a while but started after the last round, or a node without a
        // rate yet: sample now rather than wait up to a resolution (the Python client's
        // get_pods_metrics waits 10 s after the pod runs).
        ctx.api.metrics.record(&summaries(&ctx.api).await?);
        samples = ctx.api.metrics.snapshot();
    }
    let mut out: Vec<Value> = if ctx.res.plural == "nodes" {
        samples
            .nodes
            .iter()
            .filter_map(|(n, s)| node_metrics(n, s))
            .collect()
    } else {
        pod_metrics(&samples)
    };
    if let Some(ns) = ctx.namespace() {
        out.retain(|m| m["metadata"]["namespace"] == ns);
    }
    // A label selector applies to the pods' (or nodes') own labels, read from the store.
    if let Some(sel) = &ctx.params.label_selector {
        let sel = minik8s_types::selector::LabelSelector::parse(sel)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let prefix = match (ctx.res.plural.as_str(), ctx.namespace()) {
            ("nodes", _) => "/registry/core/nodes/".to_owned(),
            (_, Some(ns)) => format!("/registry/core/pods/{ns}/"),
            (_, None) => "/registry/core/pods/".to_owned(),
        };
        let stored = ctx
            .api
            .store
            .range(minik8s_storage::RangeRequest::prefix(prefix))
            .await?;
        let mut chosen = std::collections::HashSet::new();
        for kv in &stored.kvs {
            let obj = object::from_store(kv)?;
            if sel.matches_json(obj.pointer("/metadata/labels")) {
                chosen.insert((
                    object::meta_str(&obj, "namespace")
                        .unwrap_or_default()
                        .to_owned(),
                    object::meta_str(&obj, "name")
                        .unwrap_or_default()
                        .to_owned(),
                ));
            }
        }
        out.retain(|m| {
            let ns = m["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let name = m["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            chosen.contains(&(ns, name))
        });
    }
    out.sort_by_key(|m| {
        (
            m["metadata"]["namespace"].to_string(),
            m["metadata"]["name"].to_string(),
        )
    });
    Ok(out)
}

impl Metrics {
    /// Whether an extra round may be taken now (at most one a second).
    fn may_add_round(&self) -> bool {
        use std::sync::atomic::Ordering;
        let now = jiff::Timestamp::now().as_millisecond();
        let last = self.extra.load(Ordering::Relaxed);
        now - last >= 1000
            && self
                .extra
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// Whether a pod in the request's scope (the named one, or its namespace's) has run for
/// over a second on a node without being sampled yet.
async fn unsampled(ctx: &Ctx, samples: &Samples) -> ApiResult<bool> {
    let prefix = match (ctx.namespace(), ctx.req.name.as_deref()) {
        (Some(ns), Some(name)) => format!("/registry/core/pods/{ns}/{name}"),
        (Some(ns), None) => format!("/registry/core/pods/{ns}/"),
        (None, _) => "/registry/core/pods/".to_owned(),
    };
    let stored = ctx
        .api
        .store
        .range(minik8s_storage::RangeRequest::prefix(prefix))
        .await?;
    let now = jiff::Timestamp::now();
    for kv in &stored.kvs {
        let pod = object::from_store(kv)?;
        let running = pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running");
        let started = pod
            .pointer("/status/startTime")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .is_some_and(|t| (now - t).get_seconds() >= 2);
        if !(running && started) {
            continue;
        }
        let ns = object::meta_str(&pod, "namespace").unwrap_or_default();
        let name = object::meta_str(&pod, "name").unwrap_or_default();
        if !samples
            .containers
            .keys()
            .any(|(n, p, _)| n == ns && p == name)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `GET …/nodes/{name}` or `…/namespaces/{ns}/pods/{name}`.
pub async fn get(ctx: Ctx) -> ApiResult<Response> {
    let name = ctx.name().to_owned();
    items(&ctx)
        .await?
        .into_iter()
        .find(|m| m["metadata"]["name"] == name.as_str())
        .map(|m| json_response(StatusCode::OK, &m, &[]))
        .ok_or_else(|| ApiError::not_found("metrics.k8s.io", &ctx.res.plural, &name))
}

/// `GET …/nodes` or `…/pods` (optionally in a namespace).
pub async fn list(ctx: Ctx) -> ApiResult<Response> {
    let items = items(&ctx).await?;
    let list = json!({
        "kind": ctx.res.list_kind, "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {}, "items": items,
    });
    Ok(json_response(StatusCode::OK, &list, &[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    fn p(at: i128, cpu: u64, start: i128) -> Point {
        Point {
            at: at * S,
            cpu,
            memory: 1 << 20,
            start: start * S,
        }
    }

    #[test]
    fn cpu_is_the_rate_between_two_samples_over_their_window() {
        let res = Duration::from_secs(15);
        // A container that started long ago: no rate until a second sample.
        let first = Series::next(None, p(1000, 5 * S as u64, 10), res);
        assert_eq!(first.rate(), None);
        // 15 s later it has used 3 s of CPU: 200m over a 15 s window ending at the sample.
        let second = Series::next(Some(&first), p(1015, 8 * S as u64, 10), res);
        assert_eq!(second.rate(), Some((200_000_000, 1015 * S, 15 * S)));
        assert_eq!(go_duration(15 * S), "15s");
        assert_eq!(go_duration(15 * S + 2_000_000), "15.002s");
        assert_eq!(go_duration(61 * S + S / 2), "1m1.5s");
        // The same sample again (no new data) keeps the rate.
        let again = Series::next(Some(&second), p(1015, 8 * S as u64, 10), res);
        assert_eq!(again.rate(), second.rate());
    }

    #[test]
    fn new_and_restarted_containers_count_from_their_start() {
        let res = Duration::from_secs(15);
        // Started 5 s before its first sample, having used 1 s: 200m over 5 s.
        let fresh = Series::next(None, p(1005, S as u64, 1000), res);
        assert_eq!(fresh.rate(), Some((200_000_000, 1005 * S, 5 * S)));
        // Started more than a resolution ago: unknown until the next sample.
        assert_eq!(
            Series::next(None, p(1030, S as u64, 1000), res).rate(),
            None
        );
        // Restarted between samples (a new start, less CPU): measured from the new start.
        let old = Series::next(None, p(1000, 50 * S as u64, 10), res);
        let restarted = Series::next(Some(&old), p(1015, S as u64 / 2, 1010), res);
        assert_eq!(restarted.rate(), Some((100_000_000, 1015 * S, 5 * S)));
    }
}

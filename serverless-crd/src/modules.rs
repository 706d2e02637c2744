//! Function modules: functions with `placement: module` run as modules loaded into warm
//! *bases* (the Python runtime in base mode, `runtime/base.py`) instead of pods of their own.
//! This is the design document's base/module model (Koupleless' ModuleControllerV2) on the
//! virtual-node library:
//!
//! - every Ready base pod (the `function-bases` Deployment in `minik8s-system`) is a virtual
//!   node named after it, with capacity `pods: <modules per base>` and the base's memory;
//! - a module function's pods (*module pods*) tolerate the virtual nodes' taint and select
//!   them; the ordinary scheduler places them, spread over bases by a topology spread
//!   constraint on `kubernetes.io/hostname`;
//! - the provider loads a module pod's code into its base (`PUT /modules/<ns>/<fn>/<rev>`)
//!   and reports the pod Running and Ready with the base's address once it loaded, or
//!   `Failed` (`ModuleLoadFailed`, Python's message) when the code does not import.
//!
//! A module pod's code reference is the pod spec of a function pod: the `code` volume's
//! ConfigMap and key, the `FUNCTION_HANDLER` and `FUNCTION_TIMEOUT_SECONDS` environment of
//! its container, and the revision in the `serverless.minik8s.io/code-hash` annotation.

use crate::runtime::{CODE_HASH, FUNCTION_LABEL, RUNTIME_PORT, python_image};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodStatus};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use minik8s_vnode::{
    Discovered, LogOptions, NodeNotify, NodeProvider, PodLifecycleHandler, PodNotifier, PodNotify,
    ProviderError, Streams, VNodeInfo,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The user the module controller runs as (bound to `minik8s:function-modules` by
/// [`crate::install`]).
pub const USER: &str = "system:minik8s-function-modules";
/// The virtual-node provider's name (the taint's value, the provider label's value).
pub const PROVIDER: &str = "functions";
/// The bases' Deployment (in `minik8s-system`).
pub const BASES: &str = "function-bases";
/// The label a base's virtual node carries while it holds modules of one namespace (a base
/// serves one namespace at a time): module pods of other namespaces avoid it.
pub const NAMESPACE_LABEL: &str = "serverless.minik8s.io/namespace";
/// The label of base pods.
pub const BASE_LABEL: &str = "serverless.minik8s.io/base";
/// Modules one base holds (its virtual node's `pods` capacity).
pub const MODULES_PER_BASE: u32 = 50;
/// How long a call to a base may take before the base counts as not answering.
const BASE_TIMEOUT: Duration = Duration::from_secs(5);

/// How the module controller runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// This replica's identity (the node Leases' holder).
    pub identity: String,
    /// The address the apiserver reaches this process's kubelet endpoint at.
    pub address: String,
    /// Where the kubelet endpoint listens.
    pub listen: SocketAddr,
    /// The cluster CA (the kubelet endpoint's clients); no endpoint without it.
    pub client_ca: Option<std::path::PathBuf>,
    /// The node Lease duration (40 s as upstream's; shorter in tests).
    pub lease_duration: Duration,
}

impl Config {
    /// Upstream's timings, as replica `identity`.
    pub fn new(identity: &str) -> Config {
        Config {
            identity: identity.to_owned(),
            address: "127.0.0.1".into(),
            listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            client_ca: None,
            lease_duration: Duration::from_secs(40),
        }
    }
}

/// The module pods' template changes: the provider taint tolerated, module nodes selected,
/// spread over bases, and the provider label for the one shared pod watch.
pub fn module_template(template: &mut Value, namespace: &str) {
    template["metadata"]["labels"][minik8s_vnode::PROVIDER_LABEL] = json!(PROVIDER);
    // Bases holding this namespace's modules, or none.
    template["spec"]["affinity"] = json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "In", "values": [namespace]}]},
            {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "DoesNotExist"}]},
        ]},
    }});
    // Spread over bases, so one base lost costs a function one of its pods, not all.
    let function = template["metadata"]["labels"][FUNCTION_LABEL].clone();
    template["spec"]["topologySpreadConstraints"] = json!([{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {FUNCTION_LABEL: function}},
    }]);
    template["spec"]["nodeSelector"] = json!({minik8s_vnode::PROVIDER_LABEL: PROVIDER});
    template["spec"]["tolerations"] = json!([{
        "key": minik8s_vnode::TAINT_KEY, "operator": "Equal", "value": PROVIDER,
        "effect": "NoSchedule",
    }]);
}

/// The bases' Deployment (applied when the first module function appears).
pub fn bases_deployment(replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": BASES, "namespace": crate::SYSTEM_NAMESPACE,
            "labels": {"app": BASES}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": BASES}},
            "template": {
                "metadata": {"labels": {"app": BASES, BASE_LABEL: "true"}},
                "spec": {
                    "containers": [{
                        "name": "base",
                        "image": python_image(),
                        "imagePullPolicy": "IfNotPresent",
                        "env": [
                            {"name": "RUNTIME_MODE", "value": "base"},
                            {"name": "BASE_MAX_MODULES", "value": MODULES_PER_BASE.to_string()},
                        ],
                        "ports": [{"name": "http", "containerPort": RUNTIME_PORT}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": RUNTIME_PORT},
                            "periodSeconds": 1, "timeoutSeconds": 2},
                        // A module that blocks the whole interpreter: the base is restarted.
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": RUNTIME_PORT},
                            "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
                        "resources": {"limits": {"memory": "512Mi"}},
                    }],
                    "terminationGracePeriodSeconds": 5,
                    "enableServiceLinks": false,
                },
            },
        },
    })
}

/// Makes the bases' Deployment if it does not exist (its replicas are the operator's after).
pub async fn ensure_bases(client: &Client, replicas: i32) -> Result<(), kube::Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), crate::SYSTEM_NAMESPACE);
    if api.get_opt(BASES).await?.is_some() {
        return Ok(());
    }
    let pp = PatchParams::apply("function-controller");
    api.patch(BASES, &pp, &Patch::Apply(&bases_deployment(replicas)))
        .await?;
    tracing::info!("made the function bases' Deployment ({replicas} bases)");
    Ok(())
}

/// One HTTP/1.1 request to a runtime (a base, or a function's pod): the answer's code and
/// body.
pub(crate) async fn request(
    addr: SocketAddr,
    method: hyper::Method,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), ProviderError> {
    let call = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to the base {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
        minik8s_task::spawn("base-connection", conn);
        let data = body.map(|b| b.to_string()).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(data)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let code = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    };
    match tokio::time::timeout(BASE_TIMEOUT, call).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(ProviderError::Failed(e)),
        Err(_) => Err(ProviderError::Failed(format!(
            "the base {addr} did not answer within {BASE_TIMEOUT:?}"
        ))),
    }
}

/// What a module pod asks for: its function, revision, handler, timeout and code reference.
struct ModuleSpec {
    function: String,
    revision: String,
    handler: String,
    timeout: i64,
    /// The ConfigMap and key holding the code.
    code: Option<(String, String)>,
}

fn module_spec(pod: &Pod) -> Result<ModuleSpec, String> {
    let function = pod
        .labels()
        .get(FUNCTION_LABEL)
        .cloned()
        .ok_or_else(|| format!("the pod has no {FUNCTION_LABEL} label"))?;
    let revision = pod
        .annotations()
        .get(CODE_HASH)
        .cloned()
        .unwrap_or_else(|| "0".into());
    let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
    let env: HashMap<&str, &str> = spec
        .containers
        .first()
        .and_then(|c| c.env.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
        .collect();
    let code = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "code")
        .and_then(|v| v.config_map.as_ref())
        .map(|cm| {
            let key = cm
                .items
                .iter()
                .flatten()
                .next()
                .map(|i| i.key.clone())
                .unwrap_or_else(|| "main.py".into());
            (cm.name.clone(), key)
        });
    Ok(ModuleSpec {
        function,
        revision,
        handler: env
            .get("FUNCTION_HANDLER")
            .unwrap_or(&"main.handler")
            .to_string(),
        timeout: env
            .get("FUNCTION_TIMEOUT_SECONDS")
            .and_then(|t| t.parse().ok())
            .unwrap_or(60),
        code,
    })
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A module pod loaded and answering: Running and Ready at the base's address.
fn running_status(pod: &Pod, ip: &str) -> PodStatus {
    let t = now();
    let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": t});
    let containers: Vec<Value> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": true,
                "started": true, "restartCount": 0, "containerID": format!("module://{}", pod.name_any()),
                "state": {"running": {"startedAt": t}}})
        })
        .collect();
    serde_json::from_value(json!({
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip, "startTime": t,
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
        "containerStatuses": containers,
    }))
    .expect("pod status")
}

/// A module pod that stopped: `phase` with every container terminated for `reason`.
fn stopped_status(pod: &Pod, phase: &str, reason: &str, message: &str, code: i32) -> PodStatus {
    let t = now();
    let containers: Vec<Value> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            json!({"name": c.name, "image": c.image, "imageID": "", "ready": false,
                "started": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "reason": reason, "message": message,
                    "startedAt": t, "finishedAt": t}}})
        })
        .collect();
    serde_json::from_value(json!({
        "phase": phase, "reason": reason, "message": message, "startTime": t,
        "conditions": [{"type": "Ready", "status": "False", "reason": reason, "lastTransitionTime": t}],
        "containerStatuses": containers,
    }))
    .expect("pod status")
}

/// One base's provider.
pub struct Base {
    name: String,
    ip: String,
    addr: SocketAddr,
    client: Client,
    notify: Mutex<Option<PodNotify>>,
    node: Mutex<Option<NodeNotify>>,
    /// The namespace the node's label names now (`Some(None)`: none), as last set.
    claimed: Mutex<Option<Option<String>>>,
}

impl Base {
    /// The provider of base `name` at `ip`.
    pub fn new(name: &str, ip: &str, client: Client) -> Result<Base, String> {
        let addr: SocketAddr = format!("{ip}:{RUNTIME_PORT}")
            .parse()
            .map_err(|e| format!("base address {ip}: {e}"))?;
        Ok(Base {
            name: name.to_owned(),
            ip: ip.to_owned(),
            addr,
            client,
            notify: Mutex::new(None),
            node: Mutex::new(None),
            claimed: Mutex::new(None),
        })
    }

    /// Labels the node with the one namespace the base holds modules of (none when it holds
    /// none, or shares namespaces), when that changed.
    fn claim(&self, health: &Value) {
        let namespaces: Vec<&str> = health["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let shared = health["shareNamespaces"].as_bool().unwrap_or(false);
        let claim = match namespaces.as_slice() {
            [one] if !shared => Some((*one).to_owned()),
            _ => None,
        };
        let mut claimed = self.claimed.lock().expect("claimed");
        if claimed.as_ref() == Some(&claim) {
            return;
        }
        let Some(node) = self.node.lock().expect("node").clone() else {
            return;
        };
        let mut labels = BTreeMap::from([(BASE_LABEL.to_owned(), "true".to_owned())]);
        if let Some(ns) = &claim {
            labels.insert(NAMESPACE_LABEL.to_owned(), ns.clone());
        }
        node.labels(labels);
        *claimed = Some(claim);
    }

    /// Asks the base what it holds and labels the node accordingly.
    async fn refresh_claim(&self) {
        if let Ok((200, health)) = request(self.addr, hyper::Method::GET, "/healthz", None).await {
            self.claim(&health);
        }
    }

    fn send(&self, pod: Pod) {
        if let Some(n) = self.notify.lock().expect("notify").as_ref() {
            n.notify(pod);
        }
    }

    fn report(&self, pod: &Pod, status: PodStatus) {
        let mut p = pod.clone();
        p.status = Some(status);
        self.send(p);
    }

    async fn code(
        &self,
        ns: &str,
        reference: &(String, String),
    ) -> Result<Option<String>, ProviderError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let cm = api
            .get_opt(&reference.0)
            .await
            .map_err(|e| ProviderError::Failed(format!("reading the code ConfigMap: {e}")))?;
        Ok(cm.and_then(|c| c.data?.get(&reference.1).cloned()))
    }

    /// Every module pod the base holds, as `(namespace, function, revision, pod, uid, error)`.
    async fn modules(&self) -> Result<Vec<Loaded>, ProviderError> {
        let (code, body) = request(self.addr, hyper::Method::GET, "/modules", None).await?;
        if code != 200 {
            return Err(ProviderError::Failed(format!(
                "the base answered {code} to GET /modules"
            )));
        }
        let mut out = Vec::new();
        for m in body["modules"].as_array().into_iter().flatten() {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            for (pod, uid) in m["pods"].as_object().into_iter().flatten() {
                out.push(Loaded {
                    namespace: s("namespace"),
                    function: s("name"),
                    revision: s("revision"),
                    pod: pod.clone(),
                    uid: uid.as_str().unwrap_or_default().to_owned(),
                    error: m["error"].as_str().map(str::to_owned),
                });
            }
        }
        Ok(out)
    }

    fn pod_of(&self, l: &Loaded) -> Pod {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": l.pod, "namespace": l.namespace,
                "labels": {FUNCTION_LABEL: l.function}, "annotations": {CODE_HASH: l.revision}},
            "spec": {"containers": [{"name": "function"}], "nodeName": self.name},
        }))
        .expect("pod");
        if !l.uid.is_empty() {
            pod.metadata.uid = Some(l.uid.clone());
        }
        pod.status = Some(match &l.error {
            None => running_status(&pod, &self.ip),
            Some(e) => stopped_status(&pod, "Failed", "ModuleLoadFailed", e, 1),
        });
        pod
    }
}

/// A module pod a base holds.
struct Loaded {
    namespace: String,
    function: String,
    revision: String,
    pod: String,
    uid: String,
    error: Option<String>,
}

#[async_trait]
impl PodLifecycleHandler for Base {
    async fn create_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        let ns = pod.namespace().unwrap_or_default();
        let spec = match module_spec(pod) {
            Ok(s) => s,
            Err(e) => {
                self.report(
                    pod,
                    stopped_status(pod, "Failed", "ModuleSpecInvalid", &e, 1),
                );
                return Ok(());
            }
        };
        let source = match &spec.code {
            Some(r) => self.code(&ns, r).await?,
            None => None,
        };
        let Some(source) = source else {
            let e = "the module's code is missing (its ConfigMap or key does not exist)";
            self.report(pod, stopped_status(pod, "Failed", "ModuleLoadFailed", e, 1));
            return Ok(());
        };
        let path = format!("/modules/{ns}/{}/{}", spec.function, spec.revision);
        let body = json!({"pod": pod.name_any(), "uid": pod.uid(), "handler": spec.handler,
            "source": source, "timeoutSeconds": spec.timeout});
        let (code, answer) = request(self.addr, hyper::Method::PUT, &path, Some(body)).await?;
        let error = answer["error"].as_str().unwrap_or_default().to_owned();
        match code {
            200 => {
                self.refresh_claim().await;
                self.report(pod, running_status(pod, &self.ip));
            }
            422 => self.report(
                pod,
                stopped_status(pod, "Failed", "ModuleLoadFailed", &error, 1),
            ),
            // Full, or serving another namespace: the pod fails here and its ReplicaSet makes
            // another, which the scheduler places anew.
            409 => self.report(pod, stopped_status(pod, "Failed", "BaseRefused", &error, 1)),
            other => {
                return Err(ProviderError::Failed(format!(
                    "the base answered {other} to loading {path}: {error}"
                )));
            }
        }
        Ok(())
    }

    async fn update_pod(&self, _pod: &Pod) -> Result<(), ProviderError> {
        // A module's code and handler are fixed for its revision (a change is a new pod).
        Ok(())
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        let ns = pod.namespace().unwrap_or_default();
        let spec = module_spec(pod).map_err(ProviderError::NotFound)?;
        let path = format!(
            "/modules/{ns}/{}/{}?pod={}",
            spec.function,
            spec.revision,
            pod.name_any()
        );
        let (code, _) = request(self.addr, hyper::Method::DELETE, &path, None).await?;
        match code {
            200 => {
                self.refresh_claim().await;
                self.report(
                    pod,
                    stopped_status(pod, "Succeeded", "Completed", "unloaded", 0),
                );
                Ok(())
            }
            404 => Err(ProviderError::NotFound(path)),
            other => Err(ProviderError::Failed(format!(
                "the base answered {other} to DELETE {path}"
            ))),
        }
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ProviderError> {
        Ok(self
            .modules()
            .await?
            .iter()
            .find(|l| l.namespace == namespace && l.pod == name)
            .map(|l| self.pod_of(l)))
    }

    async fn get_pod_status(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PodStatus>, ProviderError> {
        Ok(self.get_pod(namespace, name).await?.and_then(|p| p.status))
    }

    async fn get_pods(&self) -> Result<Vec<Pod>, ProviderError> {
        Ok(self
            .modules()
            .await?
            .iter()
            .map(|l| self.pod_of(l))
            .collect())
    }
}

impl PodNotifier for Base {
    fn notify_pods(&self, notify: PodNotify) {
        *self.notify.lock().expect("notify") = Some(notify);
    }
}

#[async_trait]
impl NodeProvider for Base {
    async fn ping(&self) -> Result<(), ProviderError> {
        match request(self.addr, hyper::Method::GET, "/healthz", None).await? {
            (200, health) => {
                self.claim(&health);
                Ok(())
            }
            (code, _) => Err(ProviderError::Failed(format!(
                "the base's /healthz answered {code}"
            ))),
        }
    }

    fn notify_node_status(&self, notify: NodeNotify) {
        // A new holder labels the node anew from the base (at its first ping).
        *self.node.lock().expect("node") = Some(notify);
        *self.claimed.lock().expect("claimed") = None;
    }
}

#[async_trait]
impl Streams for Base {
    async fn container_logs(
        &self,
        namespace: &str,
        pod: &str,
        _container: &str,
        opts: &LogOptions,
    ) -> Result<String, ProviderError> {
        let modules = self.modules().await?;
        let l = modules
            .iter()
            .find(|l| l.namespace == namespace && l.pod == pod)
            .ok_or_else(|| {
                ProviderError::NotFound(format!("pod {namespace}/{pod} on base {}", self.name))
            })?;
        let path = format!("/modules/{namespace}/{}/{}/logs", l.function, l.revision);
        let (code, body) = request(self.addr, hyper::Method::GET, &path, None).await?;
        if code != 200 {
            return Err(ProviderError::NotFound(path));
        }
        let lines: Vec<minik8s_kubelet::logs::Line> = body["lines"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| minik8s_kubelet::logs::Line {
                time: l[0].as_str().unwrap_or_default().to_owned(),
                text: l[1].as_str().unwrap_or_default().to_owned(),
            })
            .collect();
        Ok(minik8s_kubelet::logs::render(&lines, opts))
    }
}

/// A base pod as a virtual node: capacity `pods` as many as the base takes (its
/// `BASE_MAX_MODULES`, default [`MODULES_PER_BASE`]), the base's memory limit.
fn base_info(pod: &Pod) -> VNodeInfo {
    let limits = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref()?.limits.clone())
        .unwrap_or_default();
    let get = |k: &str, default: &str| limits.get(k).map_or(default.to_owned(), |q| q.0.clone());
    // The base's own limit (its BASE_MAX_MODULES), which the operator may change.
    let modules = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.env.as_ref())
        .into_iter()
        .flatten()
        .find(|e| e.name == "BASE_MAX_MODULES")
        .and_then(|e| e.value.as_deref()?.parse::<u32>().ok())
        .unwrap_or(MODULES_PER_BASE);
    VNodeInfo {
        name: pod.name_any(),
        labels: BTreeMap::from([(BASE_LABEL.to_owned(), "true".to_owned())]),
        capacity: BTreeMap::from([
            ("pods".to_owned(), modules.to_string()),
            ("memory".to_owned(), get("memory", "512Mi")),
            ("cpu".to_owned(), get("cpu", "1")),
        ]),
        node_info: BTreeMap::from([(
            "containerRuntimeVersion".to_owned(),
            format!("base://{}", python_image()),
        )]),
        ..Default::default()
    }
}

/// Runs the module controller (one replica) until `shutdown`: base pods discovered from one
/// watch become virtual nodes served through the virtual-node library.
pub async fn run(
    client: Client,
    cfg: Config,
    shutdown: CancellationToken,
) -> Result<(), minik8s_vnode::Error> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut vcfg = minik8s_vnode::Config::new(PROVIDER, &cfg.identity);
    vcfg.address = cfg.address.clone();
    vcfg.listen = cfg.listen;
    vcfg.client_ca = cfg.client_ca.clone();
    vcfg.lease_duration = cfg.lease_duration;
    vcfg.renew_interval = (cfg.lease_duration / 4).max(Duration::from_secs(1));
    // A base that restarted lost its modules: found at the next resync.
    vcfg.resync = Duration::from_secs(5);
    let discovery = minik8s_task::spawn(
        "function-bases-discovery",
        discover(client.clone(), tx, shutdown.clone()),
    );
    let r = minik8s_vnode::run(client, vcfg, rx, None, shutdown).await;
    let _ = discovery.await;
    r
}

/// Watches the base pods: a Ready base with an address is Up, a base deleted or finished is
/// Down (a base that is only not Ready stays, and its node goes NotReady).
async fn discover(
    client: Client,
    tx: mpsc::UnboundedSender<Discovered>,
    shutdown: CancellationToken,
) {
    let api: Api<Pod> = Api::namespaced(client.clone(), crate::SYSTEM_NAMESPACE);
    let stream = watcher::watcher(
        api,
        watcher::Config::default().labels(&format!("{BASE_LABEL}=true")),
    );
    futures::pin_mut!(stream);
    // Base name → the address it was announced with.
    let mut up: HashMap<String, String> = HashMap::new();
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
        };
        let pods = match ev {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => vec![(p, false)],
            Ok(watcher::Event::Delete(p)) => vec![(p, true)],
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "base watch (retrying)");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        for (pod, deleted) in pods {
            let name = pod.name_any();
            let status = pod.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
            let gone = deleted
                || pod.metadata.deletion_timestamp.is_some()
                || matches!(phase, "Succeeded" | "Failed");
            if gone {
                if up.remove(&name).is_some() {
                    tracing::info!(base = %name, "base gone");
                    let _ = tx.send(Discovered::Down(name));
                }
                continue;
            }
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let ip = status.and_then(|s| s.pod_ip.clone()).unwrap_or_default();
            if !ready || ip.is_empty() || up.get(&name) == Some(&ip) {
                continue;
            }
            match Base::new(&name, &ip, client.clone()) {
                Ok(base) => {
                    tracing::info!(base = %name, %ip, "base ready");
                    up.insert(name, ip);
                    let _ = tx.send(Discovered::Up(base_info(&pod), Arc::new(base)));
                }
                Err(e) => tracing::warn!(base = %name, error = %e, "base skipped"),
            }
        }
    }
}

/// `function-modules` (also `minik8s function-modules`): one replica of the module
/// controller as its own process. Several replicas share the bases by racing for their
/// node Leases.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kubeconfig of the identity it acts as (`system:minik8s-function-modules`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: std::path::PathBuf,
    /// This replica's identity (default: host name and a random suffix).
    #[arg(long)]
    pub identity: Option<String>,
    /// The address the apiserver reaches this replica's kubelet endpoint at.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
    /// Where the kubelet endpoint listens.
    #[arg(long, default_value = "0.0.0.0:0")]
    pub listen: SocketAddr,
    /// The cluster CA (clients of the kubelet endpoint); no endpoint without it.
    #[arg(long)]
    pub client_ca: Option<std::path::PathBuf>,
    /// The node Leases' duration in seconds (upstream's node lease: 40).
    #[arg(long, default_value_t = 40)]
    pub lease_duration_seconds: u64,
}

/// Runs one replica from its command line until SIGINT/SIGTERM.
pub async fn run_cli(args: Args) -> anyhow::Result<()> {
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    let client = minik8s_kubeconfig::client(&args.kubeconfig).await?;
    let identity = args
        .identity
        .unwrap_or_else(minik8s_controllers::leader::identity);
    let mut cfg = Config::new(&identity);
    cfg.address = args.address;
    cfg.listen = args.listen;
    cfg.client_ca = args.client_ca;
    cfg.lease_duration = Duration::from_secs(args.lease_duration_seconds.max(2));
    run(client, cfg, shutdown).await?;
    Ok(())
}

//! A provider that runs nothing (as virtual-kubelet's mock provider): a created pod is
//! Running and Ready at once, a deleted one Succeeded, and every call can be recorded with
//! the replica that made it. What a node "runs" lives in a [`Backend`] that the replicas
//! share, as a real backend outlives the replica serving it. For tests and `vnode-bench`.

use crate::{
    LogOptions, NodeNotify, NodeProvider, PodLifecycleHandler, PodNotifier, PodNotify,
    ProviderError, Streams,
};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::ResourceExt;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One provider call.
#[derive(Clone, Debug)]
pub struct Call {
    /// The node it was for.
    pub node: String,
    /// The replica that made it.
    pub replica: String,
    /// `create_pod`, `delete_pod`, `get_pods`…
    pub call: &'static str,
    /// When it started and ended.
    pub started: Instant,
    /// When it ended.
    pub ended: Instant,
}

/// Every call of every fake provider that shares it.
#[derive(Default, Debug)]
pub struct CallLog(Mutex<Vec<Call>>);

impl CallLog {
    /// The calls so far.
    pub fn calls(&self) -> Vec<Call> {
        self.0.lock().expect("calls").clone()
    }

    /// The first pair of calls for one node from two replicas whose times overlap (two
    /// replicas serving one node at once), if any.
    pub fn overlap(&self) -> Option<(Call, Call)> {
        let calls = self.calls();
        let mut by_node: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
        for c in &calls {
            by_node.entry(&c.node).or_default().push(c);
        }
        for list in by_node.values() {
            for (i, a) in list.iter().enumerate() {
                for b in &list[i + 1..] {
                    if a.replica != b.replica && a.started <= b.ended && b.started <= a.ended {
                        return Some(((*a).clone(), (*b).clone()));
                    }
                }
            }
        }
        None
    }
}

/// What one fake node runs, shared by the replicas' providers of that node.
#[derive(Debug)]
pub struct Backend {
    /// The node's name.
    pub name: String,
    pods: Mutex<BTreeMap<(String, String), Pod>>,
    /// Whether the node answers pings.
    pub up: AtomicBool,
    /// How many pods were ever created on it (adoption leaves this alone).
    pub created: AtomicU32,
}

impl Backend {
    /// An empty node `name`, up.
    pub fn new(name: &str) -> Arc<Backend> {
        Arc::new(Backend {
            name: name.to_owned(),
            pods: Mutex::default(),
            up: AtomicBool::new(true),
            created: AtomicU32::new(0),
        })
    }

    /// How many pods it runs now.
    pub fn running(&self) -> usize {
        self.pods.lock().expect("pods").len()
    }

    /// Whether it runs the pod `namespace/name`.
    pub fn runs(&self, namespace: &str, name: &str) -> bool {
        self.pods
            .lock()
            .expect("pods")
            .contains_key(&(namespace.to_owned(), name.to_owned()))
    }

    /// Loses a pod behind the library's back (as a crashed backend would).
    pub fn lose(&self, namespace: &str, name: &str) -> bool {
        self.pods
            .lock()
            .expect("pods")
            .remove(&(namespace.to_owned(), name.to_owned()))
            .is_some()
    }
}

/// One replica's provider of one fake node.
pub struct Fake {
    backend: Arc<Backend>,
    replica: String,
    log: Option<Arc<CallLog>>,
    notify: Mutex<Option<PodNotify>>,
}

impl Fake {
    /// Replica `replica`'s provider of `backend`, recording into `log`.
    pub fn new(backend: Arc<Backend>, replica: &str, log: Option<Arc<CallLog>>) -> Fake {
        Fake {
            backend,
            replica: replica.to_owned(),
            log,
            notify: Mutex::new(None),
        }
    }

    fn record(&self, call: &'static str, started: Instant) {
        if let Some(log) = &self.log {
            log.0.lock().expect("calls").push(Call {
                node: self.backend.name.clone(),
                replica: self.replica.clone(),
                call,
                started,
                ended: Instant::now(),
            });
        }
    }

    fn send(&self, pod: Pod) {
        if let Some(n) = self.notify.lock().expect("notify").as_ref() {
            n.notify(pod);
        }
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A pod as the fake runs it: Running and Ready, every container started.
fn running(pod: &Pod, ip: u32) -> PodStatus {
    let t = now();
    let containers: Vec<_> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            json!({"name": c.name, "image": c.image.unwrap_or_default(), "imageID": "",
                   "containerID": format!("fake://{}", c.name), "ready": true, "started": true,
                   "restartCount": 0, "state": {"running": {"startedAt": t}}})
        })
        .collect();
    let cond = |ty: &str| json!({"type": ty, "status": "True", "lastTransitionTime": t});
    serde_json::from_value(json!({
        "phase": "Running",
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
        "podIP": format!("10.255.{}.{}", (ip >> 8) & 0xff, ip & 0xff),
        "podIPs": [{"ip": format!("10.255.{}.{}", (ip >> 8) & 0xff, ip & 0xff)}],
        "startTime": t,
        "containerStatuses": containers,
    }))
    .expect("pod status")
}

/// The pod stopped by a deletion: Succeeded, every container terminated.
fn stopped(pod: &Pod) -> PodStatus {
    let t = now();
    let mut status = pod.status.clone().unwrap_or_default();
    status.phase = Some("Succeeded".into());
    for c in status.container_statuses.iter_mut().flatten() {
        c.ready = false;
        c.state = serde_json::from_value(json!({"terminated": {"exitCode": 0,
            "reason": "MockProviderPodDeleted", "startedAt": t, "finishedAt": t}}))
        .ok();
    }
    status
}

#[async_trait]
impl PodLifecycleHandler for Fake {
    async fn create_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        let started = Instant::now();
        let n = self.backend.created.fetch_add(1, Ordering::Relaxed);
        let mut p = pod.clone();
        p.status = Some(running(pod, n));
        self.backend.pods.lock().expect("pods").insert(
            (pod.namespace().unwrap_or_default(), pod.name_any()),
            p.clone(),
        );
        self.record("create_pod", started);
        self.send(p);
        Ok(())
    }

    async fn update_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        let started = Instant::now();
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let mut pods = self.backend.pods.lock().expect("pods");
        let result = match pods.get_mut(&key) {
            Some(p) => {
                p.spec = pod.spec.clone();
                Ok(())
            }
            None => Err(ProviderError::NotFound(format!("{}/{}", key.0, key.1))),
        };
        drop(pods);
        self.record("update_pod", started);
        result
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        let started = Instant::now();
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let removed = self.backend.pods.lock().expect("pods").remove(&key);
        self.record("delete_pod", started);
        match removed {
            Some(mut p) => {
                p.status = Some(stopped(&p));
                self.send(p);
                Ok(())
            }
            None => Err(ProviderError::NotFound(format!("{}/{}", key.0, key.1))),
        }
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ProviderError> {
        let started = Instant::now();
        let p = self
            .backend
            .pods
            .lock()
            .expect("pods")
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned();
        self.record("get_pod", started);
        Ok(p)
    }

    async fn get_pod_status(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PodStatus>, ProviderError> {
        Ok(self.get_pod(namespace, name).await?.and_then(|p| p.status))
    }

    async fn get_pods(&self) -> Result<Vec<Pod>, ProviderError> {
        let started = Instant::now();
        let pods = self
            .backend
            .pods
            .lock()
            .expect("pods")
            .values()
            .cloned()
            .collect();
        self.record("get_pods", started);
        Ok(pods)
    }
}

impl PodNotifier for Fake {
    fn notify_pods(&self, notify: PodNotify) {
        *self.notify.lock().expect("notify") = Some(notify);
    }
}

#[async_trait]
impl NodeProvider for Fake {
    async fn ping(&self) -> Result<(), ProviderError> {
        if self.backend.up.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(ProviderError::Failed(format!(
                "{} is down",
                self.backend.name
            )))
        }
    }

    fn notify_node_status(&self, _notify: NodeNotify) {}
}

#[async_trait]
impl Streams for Fake {
    async fn container_logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        opts: &LogOptions,
    ) -> Result<String, ProviderError> {
        if self.get_pod(namespace, pod).await?.is_none() {
            return Err(ProviderError::NotFound(format!("pod {namespace}/{pod}")));
        }
        let lines: Vec<minik8s_kubelet::logs::Line> = (1..=3)
            .map(|i| minik8s_kubelet::logs::Line {
                time: now(),
                text: format!(
                    "{container} of {namespace}/{pod} on {}: line {i}\n",
                    self.backend.name
                ),
            })
            .collect();
        Ok(minik8s_kubelet::logs::render(&lines, opts))
    }
}

/// The description of fake node `name` (`pods` of capacity).
pub fn info(name: &str, pods: u32) -> crate::VNodeInfo {
    crate::VNodeInfo {
        name: name.to_owned(),
        capacity: BTreeMap::from([
            ("cpu".to_owned(), "8".to_owned()),
            ("memory".to_owned(), "16Gi".to_owned()),
            ("pods".to_owned(), pods.to_string()),
        ]),
        ..Default::default()
    }
}

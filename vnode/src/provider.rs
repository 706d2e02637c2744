//! The provider interfaces, virtual-kubelet's `node.PodLifecycleHandler`, `node.PodNotifier`
//! and `node.NodeProvider` (plus the `ContainerLogs` of its API server), as async Rust
//! traits. A provider implements them once per virtual node; the library calls them only
//! while this process holds that node's Lease.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{NodeStatus, Pod, PodStatus};
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// What a provider call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The pod (or container) is not known to the provider (virtual-kubelet's `errdefs.NotFound`).
    #[error("not found: {0}")]
    NotFound(String),
    /// The provider cannot do this (exec on a provider without one).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Anything else; retried with back-off.
    #[error("{0}")]
    Failed(String),
}

/// The pods of one virtual node (virtual-kubelet's `PodLifecycleHandler`).
#[async_trait]
pub trait PodLifecycleHandler: Send + Sync {
    /// Starts the pod. The library calls it once per pod uid it has not seen in
    /// [`get_pods`](Self::get_pods); the pod's status arrives later through the notifier.
    async fn create_pod(&self, pod: &Pod) -> Result<(), ProviderError>;
    /// The pod's spec changed (only the fields a pod may change: images, tolerations).
    async fn update_pod(&self, pod: &Pod) -> Result<(), ProviderError>;
    /// Stops the pod. A graceful deletion completes once the provider reports the pod
    /// terminal (or no longer has it).
    async fn delete_pod(&self, pod: &Pod) -> Result<(), ProviderError>;
    /// The pod as the provider runs it.
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ProviderError>;
    /// The pod's status as the provider sees it.
    async fn get_pod_status(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PodStatus>, ProviderError>;
    /// Every pod the provider runs on this node (at start-up and every resync: adoption of
    /// what runs, deletion of what the API no longer has).
    async fn get_pods(&self) -> Result<Vec<Pod>, ProviderError>;
}

/// A pod change a provider reports.
#[derive(Clone, Debug)]
pub(crate) enum PodUpdate {
    /// The pod with its new status.
    Status(Pod),
    /// The provider no longer has the pod (its deletion finished there).
    Gone(Pod),
}

/// Where a provider sends pod changes (a pod with its new status).
#[derive(Clone, Debug)]
pub struct PodNotify(pub(crate) mpsc::UnboundedSender<PodUpdate>);

impl PodNotify {
    /// Reports the pod's current status (the pod as the provider runs it). Quietly dropped
    /// once this process no longer serves the node.
    pub fn notify(&self, pod: Pod) {
        let _ = self.0.send(PodUpdate::Status(pod));
    }

    /// Reports that the provider no longer runs the pod (namespace, name and uid set): a pod
    /// being deleted finishes its deletion at once instead of at the next resync.
    pub fn gone(&self, pod: Pod) {
        let _ = self.0.send(PodUpdate::Gone(pod));
    }
}

/// Asynchronous pod status (virtual-kubelet's `PodNotifier`).
pub trait PodNotifier: Send + Sync {
    /// Called when this process starts serving the node: from then on the provider reports
    /// every pod status change through `notify` (replacing any earlier sender).
    fn notify_pods(&self, notify: PodNotify);
}

/// A change a provider reports about its node.
#[derive(Clone, Debug)]
pub(crate) enum NodeUpdate {
    /// The node's status (capacity, conditions…).
    Status(Box<NodeStatus>),
    /// The provider's labels on the Node (replacing those it set before).
    Labels(BTreeMap<String, String>),
    /// Compare the node's pods with the provider's now, and reconcile each of them at once
    /// (the provider's backend is back after an outage).
    Resync,
}

/// Where a provider sends node changes.
#[derive(Clone, Debug)]
pub struct NodeNotify(pub(crate) mpsc::UnboundedSender<NodeUpdate>);

impl NodeNotify {
    /// Reports a change of the node's status (capacity, conditions…): written at once.
    pub fn notify(&self, status: NodeStatus) {
        let _ = self.0.send(NodeUpdate::Status(Box::new(status)));
    }

    /// Sets the provider's labels on the Node (what the scheduler may select on, such as
    /// which tenant a node serves now); applied at once.
    pub fn labels(&self, labels: BTreeMap<String, String>) {
        let _ = self.0.send(NodeUpdate::Labels(labels));
    }

    /// Asks for the node's pods to be compared with the provider's and reconciled now, past
    /// any back-off (the backend answers again after an outage: what changed meanwhile on
    /// either side is caught up).
    pub fn resync(&self) {
        let _ = self.0.send(NodeUpdate::Resync);
    }
}

/// The node's health (virtual-kubelet's `NodeProvider`).
#[async_trait]
pub trait NodeProvider: Send + Sync {
    /// Whether the node's backend answers; the node is Ready while it does.
    async fn ping(&self) -> Result<(), ProviderError>;
    /// Called when this process starts serving the node.
    fn notify_node_status(&self, notify: NodeNotify);
}

/// What a `containerLogs` request asks for (the kubelet's options).
pub type LogOptions = minik8s_kubelet::logs::Options;

/// A byte stream to a kubelet API server (HTTP/1.1 runs over it).
pub trait Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Conn for T {}

/// The kubelet endpoint's streams (virtual-kubelet's `api.ContainerLogsHandlerFunc` and
/// `ContainerExecHandlerFunc`); a provider without them answers `NotSupported`.
#[async_trait]
pub trait Streams: Send + Sync {
    /// The container's log, as the client asked for it (tail, since, timestamps, limit).
    async fn container_logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        opts: &LogOptions,
    ) -> Result<String, ProviderError> {
        let _ = (namespace, pod, container, opts);
        Err(ProviderError::NotSupported("container logs".into()))
    }

    /// A connection to the node's own kubelet API, which serves `containerLogs` (`follow`
    /// included), `exec`, `attach` and `portForward` itself (an edge node's, over its link):
    /// the endpoint forwards those requests as they are. Opened per request.
    async fn kubelet_api(&self) -> Result<Box<dyn Conn>, ProviderError> {
        Err(ProviderError::NotSupported(
            "exec, attach and port-forward".into(),
        ))
    }
}

/// Everything a virtual node's provider implements.
pub trait Provider: PodLifecycleHandler + PodNotifier + NodeProvider + Streams + 'static {}
impl<T: PodLifecycleHandler + PodNotifier + NodeProvider + Streams + 'static> Provider for T {}

/// A virtual node as its provider describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VNodeInfo {
    /// The Node's name.
    pub name: String,
    /// Extra labels (the library adds `type: virtual-kubelet`, the provider label and
    /// `kubernetes.io/hostname`).
    pub labels: BTreeMap<String, String>,
    /// Capacity (= allocatable): `cpu`, `memory`, `pods`.
    pub capacity: BTreeMap<String, String>,
    /// `status.nodeInfo` fields the provider knows (`operatingSystem`, `architecture`,
    /// `kernelVersion`, `osImage`, `containerRuntimeVersion`).
    pub node_info: BTreeMap<String, String>,
    /// Annotations of the Node.
    pub annotations: BTreeMap<String, String>,
    /// The backend's own address, shown as the node's `ExternalIP` (the InternalIP stays the
    /// process's, where the apiserver reaches the kubelet endpoint).
    pub external_ip: Option<String>,
}

/// A change in the set of virtual nodes a provider has (every replica sees every node).
pub enum Discovered {
    /// A virtual node exists (or changed), with its provider.
    Up(VNodeInfo, std::sync::Arc<dyn Provider>),
    /// A virtual node is gone: its holder deletes the Node and its Lease.
    Down(String),
}

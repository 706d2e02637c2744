//! The cloud side: the edge registry (admits edges, issues their certificates, keeps one
//! Node per edge) and each edge node's virtual-kubelet provider, a gRPC client of its
//! edgelet that follows the edge's changes (a `Watch` stream; the polling `Heartbeat` when
//! the stream is down) and reconciles both sides when the link comes back.

use crate::proto::edgelet_client::EdgeletClient;
use crate::proto::registry_server::{Registry, RegistryServer};
use crate::proto::*;
use crate::{ADDRESS_ANNOTATION, AUTONOMY_ANNOTATION, PROVIDER, ROLE_LABEL, check_hello, hello};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Node, NodeCondition, NodeStatus, Pod, PodStatus, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use minik8s_kubeconfig::join as kjoin;
use minik8s_vnode::{
    Conn, Discovered, NodeNotify, NodeProvider, PodLifecycleHandler, PodNotifier, PodNotify,
    ProviderError, Streams, VNodeInfo,
};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The user the registry runs as (bound to `minik8s:edge-registry`).
pub const USER: &str = "system:minik8s-edge-registry";
/// The field manager of the registry's writes.
pub const MANAGER: &str = "minik8s-edge-registry";
/// The annotation with the edge's facts (JSON) from its join.
pub const FACTS_ANNOTATION: &str = "edge.minik8s.io/facts";

/// Why the registry could not run.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// A TLS setting is unusable.
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The server could not start.
    #[error("the edge registry's server: {0}")]
    Serve(String),
    /// The API refused.
    #[error("api: {0}")]
    Api(#[from] kube::Error),
}

/// How the registry runs.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Where it serves edges.
    pub listen: SocketAddr,
    /// The apiserver's URL (bootstrap-token clients use it).
    pub apiserver: String,
    /// The cluster CA (PEM).
    pub ca_pem: String,
    /// The registry's serving certificate and key (PEM).
    pub serving: (String, String),
    /// The registry's client certificate and key (PEM), presented to edgelets; its CN is the
    /// identity edgelets accept.
    pub client: (String, String),
    /// How often a provider polls an edge whose watch stream is down.
    pub heartbeat: Duration,
    /// The virtual nodes' settings (replica identity, endpoint, timings).
    pub vnode: minik8s_vnode::Config,
}

impl RegistryConfig {
    /// The virtual-node settings of edge nodes: the `edge` provider, the pods bound to any
    /// node (users' pods carry no provider label; each replica serves only its nodes').
    pub fn vnode_config(identity: &str) -> minik8s_vnode::Config {
        let mut v = minik8s_vnode::Config::new(PROVIDER, identity);
        v.pod_selector = String::new();
        v.pod_fields = Some("spec.nodeName!=".into());
        v
    }
}

/// The ClusterRole and binding of [`USER`].
pub fn rbac() -> (serde_json::Value, serde_json::Value) {
    let manage = [
        "create", "delete", "get", "list", "patch", "update", "watch",
    ];
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
    "metadata": {"name": "minik8s:edge-registry"},
    "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": manage},
        {"apiGroups": [""], "resources": ["nodes/status", "pods/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["configmaps", "secrets", "services"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": manage},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "get", "patch", "update"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["create", "get", "list", "watch"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["update", "patch"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
         "resourceNames": ["kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet"], "verbs": ["approve"]},
    ]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "minik8s:edge-registry"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "minik8s:edge-registry"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]});
    (role, binding)
}

/// Applies [`rbac`] (as an administrator).
pub async fn install(admin: Client) -> Result<(), kube::Error> {
    let (role, binding) = rbac();
    let pp = PatchParams::apply(MANAGER).force();
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
        .patch("minik8s:edge-registry", &pp, &Patch::Apply(&role))
        .await?;
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin)
        .patch("minik8s:edge-registry", &pp, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

struct Shared {
    client: Client,
    cfg: RegistryConfig,
    tx: mpsc::UnboundedSender<Discovered>,
    rx: Mutex<Option<mpsc::UnboundedReceiver<Discovered>>>,
    providers: Mutex<HashMap<String, (String, Arc<EdgeProvider>)>>,
    cloud_identity: String,
    tasks: tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
}

/// Runs the registry until `shutdown`: its gRPC server, the watch of edge Nodes, and (from the
/// first edge on) the virtual nodes serving them.
pub async fn run(
    client: Client,
    cfg: RegistryConfig,
    shutdown: CancellationToken,
) -> Result<(), CloudError> {
    let cloud_identity = rustls::pki_types::CertificateDer::from(
        pem_der(&cfg.client.0)
            .ok_or_else(|| CloudError::Serve("the client certificate is not PEM".into()))?,
    );
    let cloud_identity = crate::tls::common_name(cloud_identity.as_ref())
        .ok_or_else(|| CloudError::Serve("the client certificate has no CN".into()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let tasks = tokio_util::task::TaskTracker::new();
    let shared = Arc::new(Shared {
        client: client.clone(),
        cfg: cfg.clone(),
        tx,
        rx: Mutex::new(Some(rx)),
        providers: Mutex::new(HashMap::new()),
        cloud_identity,
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
    });
    let tls = crate::tls::server_config(&cfg.serving.0, &cfg.serving.1, &cfg.ca_pem, true);
    let server = tonic::transport::Server::builder()
        .tls_config(tls)
        .map_err(|e| CloudError::Serve(e.to_string()))?
        .add_service(
            RegistryServer::new(RegistryService(shared.clone()))
                .max_decoding_message_size(crate::MAX_MESSAGE),
        );
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| CloudError::Serve(format!("binding {}: {e}", cfg.listen)))?;
    tracing::info!(listen = %cfg.listen, "edge registry serving");
    {
        let stop = shutdown.clone();
        minik8s_task::spawn_on(&tasks, "edge-registry-server", async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            if let Err(e) = server
                .serve_with_incoming_shutdown(incoming, stop.cancelled())
                .await
            {
                tracing::error!(error = %e, "the edge registry's server stopped");
            }
        });
    }
    minik8s_task::spawn_on(&tasks, "edge-registry-nodes", watch_nodes(shared.clone()));
    shutdown.cancelled().await;
    for (_, (_, p)) in shared.providers.lock().expect("providers").drain() {
        p.stop.cancel();
    }
    tasks.close();
    tasks.wait().await;
    Ok(())
}

fn pem_der(pem: &str) -> Option<Vec<u8>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .ok()
        .map(|c| c.to_vec())
}

/// Follows the edge Nodes: each is announced to the virtual nodes with its provider; a Node
/// deleted is announced gone. The virtual nodes start with the first edge.
async fn watch_nodes(shared: Arc<Shared>) {
    let nodes: Api<Node> = Api::all(shared.client.clone());
    let stream = watcher::watcher(nodes, watcher::Config::default().labels(ROLE_LABEL));
    futures::pin_mut!(stream);
    loop {
        let ev = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
        };
        match ev {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => announce(&shared, &n),
            Ok(watcher::Event::Delete(n)) => {
                let name = n.name_any();
                if let Some((_, p)) = shared.providers.lock().expect("providers").remove(&name) {
                    p.stop.cancel();
                    tracing::info!(node = %name, "edge node gone");
                }
                let _ = shared.tx.send(Discovered::Down(name));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "edge node watch (retrying)");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn announce(shared: &Arc<Shared>, node: &Node) {
    let name = node.name_any();
    let annotations = node.annotations();
    let Some(address) = annotations.get(ADDRESS_ANNOTATION).cloned() else {
        return;
    };
    let facts: BTreeMap<String, String> = annotations
        .get(FACTS_ANNOTATION)
        .and_then(|f| serde_json::from_str(f).ok())
        .unwrap_or_default();
    let provider = {
        let mut providers = shared.providers.lock().expect("providers");
        match providers.get(&name) {
            Some((a, p)) if *a == address => p.clone(),
            _ => {
                let p = match EdgeProvider::new(shared, &name, &address) {
                    Ok(p) => Arc::new(p),
                    Err(e) => {
                        tracing::error!(node = %name, error = %e, "cannot reach the edge");
                        return;
                    }
                };
                if let Some((_, old)) = providers.insert(name.clone(), (address.clone(), p.clone()))
                {
                    old.stop.cancel();
                }
                p.follow();
                p
            }
        }
    };
    let fact = |k: &str| facts.get(k).cloned().unwrap_or_default();
    let info = VNodeInfo {
        name: name.clone(),
        labels: BTreeMap::from([(ROLE_LABEL.to_owned(), String::new())]),
        capacity: BTreeMap::from([
            ("cpu".to_owned(), fact("cpu")),
            ("memory".to_owned(), fact("memory")),
            ("pods".to_owned(), "110".to_owned()),
        ]),
        node_info: BTreeMap::from([
            ("architecture".to_owned(), fact("architecture")),
            ("kernelVersion".to_owned(), fact("kernelVersion")),
            ("osImage".to_owned(), fact("osImage")),
            (
                "containerRuntimeVersion".to_owned(),
                fact("containerRuntimeVersion"),
            ),
        ]),
        annotations: BTreeMap::from([
            (ADDRESS_ANNOTATION.to_owned(), address.clone()),
            (AUTONOMY_ANNOTATION.to_owned(), "true".to_owned()),
            (
                FACTS_ANNOTATION.to_owned(),
                annotations
                    .get(FACTS_ANNOTATION)
                    .cloned()
                    .unwrap_or_default(),
            ),
        ]),
        external_ip: Some(fact("ip")).filter(|s| !s.is_empty()),
    };
    // The virtual nodes start with the first edge.
    if let Some(rx) = shared.rx.lock().expect("rx").take() {
        let (client, vcfg, stop) = (
            shared.client.clone(),
            shared.cfg.vnode.clone(),
            shared.shutdown.clone(),
        );
        minik8s_task::spawn_on(&shared.tasks, "edge-vnodes", async move {
            if let Err(e) = minik8s_vnode::run(client, vcfg, rx, None, stop).await {
                tracing::error!(error = %e, "the edge virtual nodes stopped");
            }
        });
    }
    let _ = shared.tx.send(Discovered::Up(info, provider));
}

struct RegistryService(Arc<Shared>);

type Reply<T> = Result<Response<T>, Status>;

impl RegistryService {
    /// The node the caller's client certificate names (`system:node:<name>`), which must be
    /// the one its hello names.
    #[allow(clippy::result_large_err)]
    fn caller<T>(&self, req: &Request<T>, h: &Hello) -> Result<String, Status> {
        let cn = crate::tls::peer_cn(req).ok_or_else(|| {
            Status::unauthenticated("this call needs the node's client certificate")
        })?;
        match cn.strip_prefix("system:node:") {
            Some(n) if n == h.node => Ok(n.to_owned()),
            _ => Err(Status::permission_denied(format!(
                "the certificate of {cn:?} cannot act for node {:?}",
                h.node
            ))),
        }
    }
}

fn api_status(what: &str, e: kube::Error) -> Status {
    match &e {
        kube::Error::Api(s) if s.code == 401 => Status::unauthenticated(format!(
            "{what}: the bootstrap token was refused ({}); create a valid one with `minik8s token create` on the control plane",
            s.message
        )),
        kube::Error::Api(s) if s.code == 403 => {
            Status::permission_denied(format!("{what}: {}", s.message))
        }
        _ => Status::unavailable(format!("{what}: {e}")),
    }
}

#[tonic::async_trait]
impl Registry for RegistryService {
    async fn discover(&self, req: Request<DiscoverRequest>) -> Reply<DiscoverReply> {
        check_hello(req.get_ref().hello.as_ref())?;
        let cm = Api::<ConfigMap>::namespaced(
            self.0.client.clone(),
            minik8s_types::bootstrap::CLUSTER_INFO_NAMESPACE,
        )
        .get(minik8s_types::bootstrap::CLUSTER_INFO)
        .await
        .map_err(|e| api_status("reading cluster-info", e))?;
        Ok(Response::new(DiscoverReply {
            cluster_info: cm.data.unwrap_or_default().into_iter().collect(),
        }))
    }

    async fn register(&self, req: Request<RegisterRequest>) -> Reply<RegisterReply> {
        let h = check_hello(req.get_ref().hello.as_ref())?.clone();
        let r = req.into_inner();
        let node = h.node.clone();
        let cn = format!("system:node:{node}");
        // The requests must be for this node: the client one without SANs, the serving one
        // with the advertised address.
        let client_req = minik8s_kubeconfig::csr::parse_request(&r.client_csr).map_err(|e| {
            Status::invalid_argument(format!("the client certificate request: {e}"))
        })?;
        let serving_req = minik8s_kubeconfig::csr::parse_request(&r.serving_csr).map_err(|e| {
            Status::invalid_argument(format!("the serving certificate request: {e}"))
        })?;
        if client_req.common_name != cn || serving_req.common_name != cn {
            return Err(Status::permission_denied(format!(
                "the certificate requests are for {:?} and {:?}, not for node {node:?}",
                client_req.common_name, serving_req.common_name
            )));
        }
        let ip: std::net::IpAddr = r
            .address
            .rsplit_once(':')
            .and_then(|(h, _)| h.trim_matches(['[', ']']).parse().ok())
            .ok_or_else(|| {
                Status::invalid_argument(format!("the address {:?} is not IP:PORT", r.address))
            })?;
        if serving_req.ips != [ip] || !serving_req.dns_names.is_empty() {
            return Err(Status::permission_denied(format!(
                "the serving certificate request must name exactly the address {ip}"
            )));
        }
        // Another machine's node, or another edge's, is not taken over.
        let nodes: Api<Node> = Api::all(self.0.client.clone());
        if let Some(existing) = nodes
            .get_opt(&node)
            .await
            .map_err(|e| api_status("reading the node", e))?
        {
            if !existing.labels().contains_key(ROLE_LABEL) {
                return Err(Status::already_exists(format!(
                    "a node named {node:?} already exists and is not an edge node; choose another --node-name"
                )));
            }
            let at = existing
                .annotations()
                .get(ADDRESS_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            if at != r.address {
                return Err(Status::already_exists(format!(
                    "edge node {node:?} is already joined from {at}; run `edgectl reset` there (or `kubectl delete node {node}`) first"
                )));
            }
        }
        // The client certificate as `minik8s join` gets it: the CSR posted with the
        // bootstrap token (the apiserver checks the token; the approver approves it).
        let discovery = kjoin::Discovery {
            server: self.0.cfg.apiserver.clone(),
            ca_pem: self.0.cfg.ca_pem.clone(),
        };
        let bootstrap = kjoin::client(
            &discovery,
            "tls-bootstrap-token-user",
            minik8s_kubeconfig::kubeconfig::User {
                token: Some(r.token.clone()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        let timeout = Duration::from_secs(30);
        let client_cert = kjoin::submit_request(
            bootstrap.clone(),
            &node,
            &r.client_csr,
            "kubernetes.io/kube-apiserver-client-kubelet",
            &["digital signature", "client auth"],
            timeout,
            None,
        )
        .await
        .map_err(|e| match e {
            kjoin::JoinError::Api { what, source } => api_status(what, source),
            other => Status::unavailable(other.to_string()),
        })?;
        // The serving certificate: posted with the token too, approved by the registry,
        // which has just checked its subject and address.
        let serving_cert = kjoin::submit_request(
            bootstrap,
            &node,
            &r.serving_csr,
            "kubernetes.io/kubelet-serving",
            &["digital signature", "key encipherment", "server auth"],
            timeout,
            Some((
                &self.0.client,
                "the edge registry approved the serving certificate of an edge it admitted",
            )),
        )
        .await
        .map_err(|e| match e {
            kjoin::JoinError::Api { what, source } => api_status(what, source),
            other => Status::unavailable(other.to_string()),
        })?;
        let facts: BTreeMap<String, String> = serde_json::from_str(&r.facts).unwrap_or_default();
        let obj = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node,
                "labels": {ROLE_LABEL: "", minik8s_vnode::PROVIDER_LABEL: PROVIDER, "type": "virtual-kubelet",
                           "kubernetes.io/hostname": node},
                "annotations": {ADDRESS_ANNOTATION: r.address, AUTONOMY_ANNOTATION: "true",
                                FACTS_ANNOTATION: serde_json::to_string(&facts).unwrap_or_default()}},
            "spec": {"taints": [{"key": minik8s_vnode::TAINT_KEY, "value": PROVIDER, "effect": "NoSchedule"}]}});
        nodes
            .patch(
                &node,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&obj),
            )
            .await
            .map_err(|e| api_status("creating the node", e))?;
        tracing::info!(%node, address = %r.address, "edge joined");
        Ok(Response::new(RegisterReply {
            client_cert,
            serving_cert,
            ca: self.0.cfg.ca_pem.clone(),
            cloud_identity: self.0.cloud_identity.clone(),
            cloud_version: crate::VERSION.into(),
        }))
    }

    async fn leave(&self, req: Request<LeaveRequest>) -> Reply<LeaveReply> {
        let h = check_hello(req.get_ref().hello.as_ref())?.clone();
        let node = self.caller(&req, &h)?;
        let _ = self.0.tx.send(Discovered::Down(node.clone()));
        let nodes: Api<Node> = Api::all(self.0.client.clone());
        match nodes.delete(&node, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_status("deleting the node", e)),
        }
        tracing::info!(%node, "edge left");
        Ok(Response::new(LeaveReply {
            message: format!("the Node {node} was deleted"),
        }))
    }

    async fn renew(&self, req: Request<RenewRequest>) -> Reply<RenewReply> {
        let h = check_hello(req.get_ref().hello.as_ref())?.clone();
        let node = self.caller(&req, &h)?;
        let r = req.into_inner();
        let cn = format!("system:node:{node}");
        let mut reply = RenewReply::default();
        if !r.client_csr.is_empty() {
            let parsed = minik8s_kubeconfig::csr::parse_request(&r.client_csr)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            if parsed.common_name != cn {
                return Err(Status::permission_denied("the request is for another node"));
            }
            reply.client_cert = kjoin::submit_request(
                self.0.client.clone(),
                &node,
                &r.client_csr,
                "kubernetes.io/kube-apiserver-client-kubelet",
                &["digital signature", "client auth"],
                Duration::from_secs(30),
                Some((
                    &self.0.client,
                    "the edge registry renewed the certificate of a node presenting its current one",
                )),
            )
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        }
        if !r.serving_csr.is_empty() {
            // The same subject and the address the edge joined with, nothing else.
            let parsed = minik8s_kubeconfig::csr::parse_request(&r.serving_csr)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            let nodes: Api<Node> = Api::all(self.0.client.clone());
            let address = nodes
                .get_opt(&node)
                .await
                .map_err(|e| api_status("reading the node", e))?
                .and_then(|n| n.annotations().get(ADDRESS_ANNOTATION).cloned())
                .unwrap_or_default();
            let ip: Option<std::net::IpAddr> = address
                .rsplit_once(':')
                .and_then(|(h, _)| h.trim_matches(['[', ']']).parse().ok());
            if parsed.common_name != cn
                || ip.is_none_or(|ip| parsed.ips != [ip])
                || !parsed.dns_names.is_empty()
            {
                return Err(Status::permission_denied(format!(
                    "the serving certificate request must be for {cn} at exactly the address the edge joined with ({address})"
                )));
            }
            reply.serving_cert = kjoin::submit_request(
                self.0.client.clone(),
                &node,
                &r.serving_csr,
                "kubernetes.io/kubelet-serving",
                &["digital signature", "key encipherment", "server auth"],
                Duration::from_secs(30),
                Some((
                    &self.0.client,
                    "the edge registry renewed the serving certificate of a node presenting its current client one",
                )),
            )
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        }
        Ok(Response::new(reply))
    }

    async fn version(&self, req: Request<VersionRequest>) -> Reply<VersionReply> {
        check_hello(req.get_ref().hello.as_ref())?;
        Ok(Response::new(VersionReply {
            version: crate::VERSION.into(),
            protocol: crate::PROTOCOL,
            commit: String::new(),
            peer: String::new(),
        }))
    }
}

/// One edge node's provider: its edgelet's gRPC client.
pub struct EdgeProvider {
    node: String,
    rpc: EdgeletClient<tonic::transport::Channel>,
    kube: Client,
    pods: Mutex<Option<PodNotify>>,
    nodes: Mutex<Option<NodeNotify>>,
    connected: AtomicBool,
    last: Mutex<Option<NodeStatusReply>>,
    /// What was shipped: (kind, namespace, name) → resourceVersion.
    shipped: Mutex<HashMap<(String, String, String), String>>,
    /// The pods handed to the edge (uid → pod), whose volumes are kept up to date.
    given: Mutex<HashMap<String, Pod>>,
    heartbeat: Duration,
    stop: CancellationToken,
    following: AtomicBool,
    tasks: tokio_util::task::TaskTracker,
}

fn provider_error(node: &str, s: Status) -> ProviderError {
    match s.code() {
        tonic::Code::NotFound => ProviderError::NotFound(s.message().to_owned()),
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Cancelled
        | tonic::Code::Unknown => ProviderError::Failed(format!(
            "the edge node {node} does not answer: {}",
            s.message()
        )),
        _ => ProviderError::Failed(format!("the edge node {node} refused: {}", s.message())),
    }
}

fn seq_of(pod: &Pod) -> u64 {
    pod.resource_version()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

impl EdgeProvider {
    fn new(
        shared: &Arc<Shared>,
        node: &str,
        address: &str,
    ) -> Result<EdgeProvider, crate::tls::TlsError> {
        let cfg = &shared.cfg;
        let tls = crate::tls::client_config(
            &cfg.ca_pem,
            Some((&cfg.client.0, &cfg.client.1)),
            Some(format!("system:node:{node}")),
        )?;
        let channel = crate::tls::channel(address, tls, Duration::from_secs(20))?;
        Ok(EdgeProvider {
            node: node.to_owned(),
            rpc: EdgeletClient::new(channel)
                .max_decoding_message_size(crate::MAX_MESSAGE)
                .max_encoding_message_size(crate::MAX_MESSAGE),
            kube: shared.client.clone(),
            pods: Mutex::new(None),
            nodes: Mutex::new(None),
            connected: AtomicBool::new(false),
            last: Mutex::new(None),
            shipped: Mutex::new(HashMap::new()),
            given: Mutex::new(HashMap::new()),
            heartbeat: cfg.heartbeat,
            stop: shared.shutdown.child_token(),
            following: AtomicBool::new(false),
            tasks: shared.tasks.clone(),
        })
    }

    fn hello(&self) -> Option<Hello> {
        hello(&self.node)
    }

    /// Hands the pod to the edge (created, or updated), its volumes' data first.
    async fn give(&self, pod: &Pod, create: bool) -> Result<(), ProviderError> {
        self.ship_volumes(pod).await?;
        self.ship_services(&pod.namespace().unwrap_or_default())
            .await?;
        let req = PodRequest {
            hello: self.hello(),
            pod: serde_json::to_vec(pod).unwrap_or_default(),
            seq: seq_of(pod),
        };
        let mut rpc = self.rpc.clone();
        let sent = if create {
            rpc.create_pod(req).await
        } else {
            rpc.update_pod(req).await
        };
        sent.map_err(|s| provider_error(&self.node, s))?;
        self.given
            .lock()
            .expect("given")
            .insert(pod.uid().unwrap_or_default(), pod.clone());
        Ok(())
    }

    /// Ships the ConfigMaps, Secrets and service-account tokens the pod uses (what the node
    /// authorizer would let its kubelet read), when they changed since last shipped.
    async fn ship_volumes(&self, pod: &Pod) -> Result<(), ProviderError> {
        let ns = pod.namespace().unwrap_or_default();
        let (maps, secrets, token) = references(pod);
        for name in maps {
            match Api::<ConfigMap>::namespaced(self.kube.clone(), &ns)
                .get_opt(&name)
                .await
            {
                Ok(Some(cm)) => self.ship("configmaps", &ns, &name, &cm).await?,
                Ok(None) => {}
                Err(e) => {
                    return Err(ProviderError::Failed(format!(
                        "reading configmap {ns}/{name}: {e}"
                    )));
                }
            }
        }
        for name in secrets {
            match Api::<Secret>::namespaced(self.kube.clone(), &ns)
                .get_opt(&name)
                .await
            {
                Ok(Some(s)) => self.ship("secrets", &ns, &name, &s).await?,
                Ok(None) => {}
                Err(e) => {
                    return Err(ProviderError::Failed(format!(
                        "reading secret {ns}/{name}: {e}"
                    )));
                }
            }
        }
        if let Some((sa, seconds)) = token {
            let name = pod.name_any();
            // A token is requested again once 80 % of its lifetime has passed, as the
            // kubelet's token manager does.
            let key = ("tokens".to_owned(), ns.clone(), name.clone());
            let now = jiff::Timestamp::now().as_second();
            let due = self
                .shipped
                .lock()
                .expect("shipped")
                .get(&key)
                .and_then(|renew_at| renew_at.parse::<i64>().ok())
                .is_none_or(|renew_at| now >= renew_at);
            if !due {
                return Ok(());
            }
            let req = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": [], "expirationSeconds": seconds,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.uid()}}});
            let req: k8s_openapi::api::authentication::v1::TokenRequest =
                serde_json::from_value(req).map_err(|e| ProviderError::Failed(e.to_string()))?;
            let api: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                Api::namespaced(self.kube.clone(), &ns);
            let out = api
                .create_subresource::<_, k8s_openapi::api::authentication::v1::TokenRequest>(
                    "token",
                    &sa,
                    &PostParams::default(),
                    &req,
                )
                .await
                .map_err(|e| ProviderError::Failed(format!("requesting the pod's token: {e}")))?;
            let status = out
                .status
                .ok_or_else(|| ProviderError::Failed("the token request has no token".into()))?;
            let object = json!({"serviceAccount": sa, "token": status.token,
                                "expirationTimestamp": status.expiration_timestamp});
            self.send_volume("tokens", &ns, &name, &object, now as u64)
                .await?;
            let renew_at = now + seconds * 4 / 5;
            self.shipped
                .lock()
                .expect("shipped")
                .insert(key, renew_at.to_string());
        }
        Ok(())
    }

    /// Ships the Services and EndpointSlices of namespace `ns` (the names, rules and service
    /// variables of the edge's pods there) when they changed, and removes at the edge those
    /// the cloud no longer has.
    async fn ship_services(&self, ns: &str) -> Result<(), ProviderError> {
        let failed = |what: &str, e: kube::Error| {
            ProviderError::Failed(format!("listing the {what} of namespace {ns}: {e}"))
        };
        let lp = kube::api::ListParams::default();
        let services = Api::<Service>::namespaced(self.kube.clone(), ns)
            .list(&lp)
            .await
            .map_err(|e| failed("services", e))?;
        let slices = Api::<EndpointSlice>::namespaced(self.kube.clone(), ns)
            .list(&lp)
            .await
            .map_err(|e| failed("endpointslices", e))?;
        let mut present = std::collections::HashSet::new();
        for svc in &services.items {
            present.insert(("services", svc.name_any()));
            self.ship("services", ns, &svc.name_any(), svc).await?;
        }
        for slice in &slices.items {
            present.insert(("endpointslices", slice.name_any()));
            self.ship("endpointslices", ns, &slice.name_any(), slice)
                .await?;
        }
        let gone: Vec<(String, String)> = self
            .shipped
            .lock()
            .expect("shipped")
            .keys()
            .filter(|(kind, n, name)| {
                n == ns
                    && matches!(kind.as_str(), "services" | "endpointslices")
                    && !present.contains(&(kind.as_str(), name.clone()))
            })
            .map(|(kind, _, name)| (kind.clone(), name.clone()))
            .collect();
        for (kind, name) in gone {
            self.rpc
                .clone()
                .create_volume(VolumeRequest {
                    hello: self.hello(),
                    kind: kind.clone(),
                    namespace: ns.into(),
                    name: name.clone(),
                    object: Vec::new(),
                    seq: 0,
                })
                .await
                .map_err(|s| provider_error(&self.node, s))?;
            self.shipped
                .lock()
                .expect("shipped")
                .remove(&(kind, ns.to_owned(), name));
        }
        Ok(())
    }

    async fn ship<K: serde::Serialize + kube::Resource>(
        &self,
        kind: &str,
        ns: &str,
        name: &str,
        obj: &K,
    ) -> Result<(), ProviderError> {
        let rv = obj.meta().resource_version.clone().unwrap_or_default();
        let key = (kind.to_owned(), ns.to_owned(), name.to_owned());
        if self.shipped.lock().expect("shipped").get(&key) == Some(&rv) {
            return Ok(());
        }
        let mut value =
            serde_json::to_value(obj).map_err(|e| ProviderError::Failed(e.to_string()))?;
        // Only what a volume, a variable or a rule needs (a slice's Service is a label).
        if let Some(meta) = value["metadata"].as_object_mut() {
            meta.retain(|k, _| {
                matches!(
                    k.as_str(),
                    "name" | "namespace" | "uid" | "resourceVersion" | "labels"
                )
            });
        }
        self.send_volume(kind, ns, name, &value, rv.parse().unwrap_or(0))
            .await?;
        self.shipped.lock().expect("shipped").insert(key, rv);
        Ok(())
    }

    async fn send_volume(
        &self,
        kind: &str,
        ns: &str,
        name: &str,
        object: &serde_json::Value,
        seq: u64,
    ) -> Result<(), ProviderError> {
        self.rpc
            .clone()
            .create_volume(VolumeRequest {
                hello: self.hello(),
                kind: kind.into(),
                namespace: ns.into(),
                name: name.into(),
                object: serde_json::to_vec(object).unwrap_or_default(),
                seq,
            })
            .await
            .map_err(|s| provider_error(&self.node, s))?;
        Ok(())
    }

    /// Follows the edge while this replica serves it: the watch stream, the heartbeat when
    /// the stream is down, and a resync of both sides when the link comes back.
    fn follow(self: &Arc<Self>) {
        if self.following.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        minik8s_task::spawn_on(&self.tasks.clone(), "edge-follow", async move {
            me.follow_loop().await;
            me.following.store(false, Ordering::SeqCst);
        });
    }

    fn set_connected(&self, up: bool) {
        let was = self.connected.swap(up, Ordering::SeqCst);
        if up && !was {
            tracing::info!(node = %self.node, "edge reachable");
            if let Some(n) = self.nodes.lock().expect("nodes").as_ref() {
                n.resync();
            }
        } else if !up && was {
            tracing::warn!(node = %self.node, "edge unreachable; its pods keep running there (autonomy)");
        }
    }

    async fn follow_loop(self: &Arc<Self>) {
        let (mut since, mut boot) = (0u64, 0i64);
        let mut refresh = tokio::time::interval(Duration::from_secs(10));
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            let mut rpc = self.rpc.clone();
            let watched = tokio::select! {
                _ = self.stop.cancelled() => return,
                r = rpc.watch(WatchRequest { hello: self.hello(), since }) => r,
            };
            // A watch that ran and ended (the edgelet restarted, the link broke) is followed
            // by a probe a second later, not a heartbeat period later: the edge is back or
            // known lost at once.
            let mut ended = watched.is_ok();
            if let Ok(stream) = watched {
                self.set_connected(true);
                let mut stream = stream.into_inner();
                loop {
                    let next = tokio::select! {
                        _ = self.stop.cancelled() => return,
                        _ = refresh.tick() => { self.refresh_volumes().await; continue; }
                        // Nothing for 40 s (keep-alives come every 15 s): the link is gone.
                        n = tokio::time::timeout(Duration::from_secs(40), stream.next()) => n,
                    };
                    match next {
                        Ok(Some(Ok(change))) => {
                            if change.boot != boot {
                                boot = change.boot;
                                if let Some(n) = self.nodes.lock().expect("nodes").as_ref() {
                                    n.resync();
                                }
                            }
                            since = since.max(change.seq);
                            self.apply(change.what).await;
                        }
                        Ok(Some(Err(s))) => {
                            tracing::debug!(node = %self.node, error = %s, "edge watch ended");
                            break;
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            // The fallback: heartbeats. An edge that answers them (but not a watch) is polled
            // every heartbeat period; one that does not answer is probed every second, so that
            // its return is seen at once.
            let mut answered = self.connected.load(Ordering::SeqCst);
            self.set_connected(false);
            loop {
                let wait = if answered && !std::mem::take(&mut ended) {
                    self.heartbeat
                } else {
                    Duration::from_secs(1)
                };
                tokio::select! {
                    _ = self.stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                let beat = tokio::time::timeout(
                    self.heartbeat.max(Duration::from_secs(5)),
                    self.rpc.clone().heartbeat(HeartbeatRequest {
                        hello: self.hello(),
                        since,
                    }),
                )
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("no heartbeat reply")));
                answered = beat.is_ok();
                match beat {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        if reply.boot != boot {
                            boot = reply.boot;
                            since = 0;
                        }
                        self.set_connected(true);
                        if let Some(n) = reply.node {
                            self.apply(Some(change::What::Node(n))).await;
                        }
                        for p in reply.pods {
                            self.apply(Some(change::What::Pod(p))).await;
                        }
                        for e in reply.events {
                            self.apply(Some(change::What::Event(e))).await;
                        }
                        since = since.max(reply.seq);
                        break;
                    }
                    Err(s) => {
                        tracing::debug!(node = %self.node, error = %s, "edge heartbeat failed")
                    }
                }
            }
        }
    }

    async fn apply(&self, what: Option<change::What>) {
        match what {
            Some(change::What::Pod(p)) => {
                let notify = self.pods.lock().expect("pods").clone();
                let Some(notify) = notify else { return };
                if p.gone {
                    self.given.lock().expect("given").remove(&p.uid);
                    let mut pod = Pod::default();
                    pod.metadata.namespace = Some(p.namespace);
                    pod.metadata.name = Some(p.name);
                    pod.metadata.uid = Some(p.uid);
                    notify.gone(pod);
                } else if let Ok(pod) = serde_json::from_slice::<Pod>(&p.pod) {
                    notify.notify(pod);
                }
            }
            Some(change::What::Node(n)) => {
                let status = node_status(&n);
                *self.last.lock().expect("last") = Some(n);
                if let Some(notify) = self.nodes.lock().expect("nodes").as_ref() {
                    notify.notify(status);
                }
            }
            Some(change::What::Event(e)) => {
                if let Ok(ev) = serde_json::from_slice::<Event>(&e) {
                    self.record(ev).await;
                }
            }
            None => {}
        }
    }

    /// Writes an event the edge recorded (an event of the same name is updated).
    async fn record(&self, mut ev: Event) {
        let ns = ev.namespace().unwrap_or_else(|| "default".into());
        ev.metadata.resource_version = None;
        ev.metadata.uid = None;
        ev.metadata.creation_timestamp = None;
        ev.metadata.managed_fields = None;
        let api: Api<Event> = Api::namespaced(self.kube.clone(), &ns);
        match api.create(&PostParams::default(), &ev).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let patch = json!({"count": ev.count, "lastTimestamp": ev.last_timestamp, "message": ev.message});
                let _ = api
                    .patch(
                        &ev.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
            }
            Err(e) => tracing::debug!(node = %self.node, error = %e, "writing an edge event"),
        }
    }

    async fn refresh_volumes(&self) {
        let pods: Vec<Pod> = self
            .given
            .lock()
            .expect("given")
            .values()
            .cloned()
            .collect();
        let mut namespaces = std::collections::BTreeSet::new();
        for pod in pods {
            if let Err(e) = self.ship_volumes(&pod).await {
                tracing::debug!(node = %self.node, error = %e, "refreshing the edge's volumes");
            }
            namespaces.insert(pod.namespace().unwrap_or_default());
        }
        for ns in namespaces {
            if let Err(e) = self.ship_services(&ns).await {
                tracing::debug!(node = %self.node, error = %e, "refreshing the edge's services");
            }
        }
    }
}

/// The ConfigMaps and Secrets a pod uses (volumes, projected sources, env and envFrom of
/// every container), and its projected service-account token (account, seconds).
fn references(pod: &Pod) -> (Vec<String>, Vec<String>, Option<(String, i64)>) {
    let (mut maps, mut secrets, mut token) = (Vec::new(), Vec::new(), None);
    let Some(spec) = pod.spec.as_ref() else {
        return (maps, secrets, token);
    };
    let sa = spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| "default".into());
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            maps.push(c.name.clone());
        }
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.push(s);
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &src.config_map {
                maps.push(c.name.clone());
            }
            if let Some(s) = &src.secret {
                secrets.push(s.name.clone());
            }
            if let Some(t) = &src.service_account_token {
                token = Some((sa.clone(), t.expiration_seconds.unwrap_or(3600)));
            }
        }
    }
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(r) = &from.config_map_key_ref {
                    maps.push(r.name.clone());
                }
                if let Some(r) = &from.secret_key_ref {
                    secrets.push(r.name.clone());
                }
            }
        }
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                maps.push(r.name.clone());
            }
            if let Some(r) = &f.secret_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    maps.sort();
    maps.dedup();
    secrets.sort();
    secrets.dedup();
    (maps, secrets, token)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn pct(used: u64, total: u64) -> u64 {
    used.saturating_mul(100).checked_div(total).unwrap_or(0)
}

/// The Node status of what the edge reports: memory and disk pressure at its thresholds, and
/// its capacity.
pub fn node_status(r: &NodeStatusReply) -> NodeStatus {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
    let cond = |t: &str, on: bool, yes: &str, no: &str, message: String| NodeCondition {
        type_: t.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: Some(if on { yes } else { no }.into()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    let memory = format!(
        "memory use {}% of {} (pressure above {}%)",
        pct(r.memory_used_bytes, r.memory_total_bytes),
        gib(r.memory_total_bytes),
        r.memory_threshold
    );
    let disk = format!(
        "disk use {}% of {} on {} (pressure above {}%)",
        pct(r.disk_used_bytes, r.disk_total_bytes),
        gib(r.disk_total_bytes),
        r.disk_path,
        r.disk_threshold
    );
    let capacity = BTreeMap::from([
        ("cpu".to_owned(), Quantity(r.cpus.to_string())),
        (
            "memory".to_owned(),
            Quantity(format!("{}Ki", r.memory_total_bytes / 1024)),
        ),
        (
            "ephemeral-storage".to_owned(),
            Quantity(format!("{}Ki", r.disk_total_bytes / 1024)),
        ),
        ("pods".to_owned(), Quantity("110".into())),
    ]);
    let mut conditions = vec![
        cond(
            "MemoryPressure",
            r.memory_pressure,
            "EdgeHasInsufficientMemory",
            "KubeletHasSufficientMemory",
            memory,
        ),
        cond(
            "DiskPressure",
            r.disk_pressure,
            "EdgeHasDiskPressure",
            "KubeletHasNoDiskPressure",
            disk,
        ),
    ];
    // The edge's runtime down (Docker stopped): NotReady in the kubelet's words. A ready
    // runtime adds nothing, and the virtual node's own Ready (the link answers) stands.
    if !r.runtime_problem.is_empty() {
        conditions.push(cond(
            "Ready",
            false,
            "KubeletReady",
            "KubeletNotReady",
            r.runtime_problem.clone(),
        ));
    }
    NodeStatus {
        conditions: Some(conditions),
        capacity: Some(capacity.clone()),
        allocatable: Some(capacity),
        ..Default::default()
    }
}

fn decode_pod(bytes: &[u8]) -> Result<Option<Pod>, ProviderError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(bytes)
        .map(Some)
        .map_err(|e| ProviderError::Failed(format!("the edge sent a pod that does not parse: {e}")))
}

#[async_trait::async_trait]
impl PodLifecycleHandler for EdgeProvider {
    async fn create_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        self.give(pod, true).await
    }

    async fn update_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        self.give(pod, false).await
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                pod.spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        self.rpc
            .clone()
            .delete_pod(DeletePodRequest {
                hello: self.hello(),
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
                grace_period_seconds: grace,
                seq: seq_of(pod),
            })
            .await
            .map_err(|s| provider_error(&self.node, s))?;
        Ok(())
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ProviderError> {
        let r = self
            .rpc
            .clone()
            .get_pod(GetPodRequest {
                hello: self.hello(),
                namespace: namespace.into(),
                name: name.into(),
            })
            .await
            .map_err(|s| provider_error(&self.node, s))?;
        decode_pod(&r.into_inner().pod)
    }

    async fn get_pod_status(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PodStatus>, ProviderError> {
        Ok(self.get_pod(namespace, name).await?.and_then(|p| p.status))
    }

    async fn get_pods(&self) -> Result<Vec<Pod>, ProviderError> {
        let r = self
            .rpc
            .clone()
            .get_pods(GetPodsRequest {
                hello: self.hello(),
            })
            .await
            .map_err(|s| provider_error(&self.node, s))?;
        let mut out = Vec::new();
        for p in r.into_inner().pods {
            if let Some(pod) = decode_pod(&p)? {
                out.push(pod);
            }
        }
        let mut given = self.given.lock().expect("given");
        for p in &out {
            given
                .entry(p.uid().unwrap_or_default())
                .or_insert_with(|| p.clone());
        }
        Ok(out)
    }
}

impl PodNotifier for EdgeProvider {
    fn notify_pods(&self, notify: PodNotify) {
        *self.pods.lock().expect("pods") = Some(notify);
    }
}

#[async_trait::async_trait]
impl NodeProvider for EdgeProvider {
    async fn ping(&self) -> Result<(), ProviderError> {
        if self.connected.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(ProviderError::Failed(format!(
                "the edge node {} does not answer",
                self.node
            )))
        }
    }

    fn notify_node_status(&self, notify: NodeNotify) {
        if let Some(last) = self.last.lock().expect("last").as_ref() {
            notify.notify(node_status(last));
        }
        *self.nodes.lock().expect("nodes") = Some(notify);
    }
}

#[async_trait::async_trait]
impl Streams for EdgeProvider {
    /// A `Stream` call to the edgelet, carrying one connection to its kubelet API.
    async fn kubelet_api(&self) -> Result<Box<dyn Conn>, ProviderError> {
        let (tx, rx) = mpsc::channel(crate::tunnel::QUEUE);
        let _ = tx.send(crate::tunnel::opening(self.hello())).await;
        let call = self
            .rpc
            .clone()
            .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|s| provider_error(&self.node, s))?;
        let conn = crate::tunnel::join(call.into_inner(), tx, |f| f, &self.tasks, &self.stop);
        Ok(Box::new(conn))
    }
}

/// `minik8s edge-registry`: one more registry replica (the one in `minik8s up` is the first);
/// replicas share the edge nodes by racing for their Leases, as the virtual nodes do.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kubeconfig of the identity it acts as (`system:minik8s-edge-registry`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: std::path::PathBuf,
    /// The apiserver's URL (bootstrap-token clients of joins use it).
    #[arg(long)]
    pub apiserver: String,
    /// The cluster CA.
    #[arg(long)]
    pub ca: std::path::PathBuf,
    /// The registry's serving certificate and key (PEM files).
    #[arg(long, num_args = 2, value_names = ["CERT", "KEY"], required = true)]
    pub tls: Vec<std::path::PathBuf>,
    /// The client certificate and key presented to edgelets (PEM files; CN
    /// `system:minik8s-edge-registry`).
    #[arg(long, num_args = 2, value_names = ["CERT", "KEY"], required = true)]
    pub client: Vec<std::path::PathBuf>,
    /// Where it serves edges.
    #[arg(long, default_value = "0.0.0.0:10360")]
    pub listen: SocketAddr,
    /// This replica's identity (default: host name and a random suffix).
    #[arg(long)]
    pub identity: Option<String>,
    /// The address the apiserver reaches this replica's kubelet endpoint at.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
    /// Where the kubelet endpoint listens.
    #[arg(long, default_value = "0.0.0.0:0")]
    pub kubelet_listen: SocketAddr,
    /// Seconds between heartbeats to an edge whose watch stream is down (the seed's: 60).
    #[arg(long, default_value_t = 10)]
    pub heartbeat_seconds: u64,
}

/// Runs one registry replica from its command line until SIGINT/SIGTERM.
pub async fn run_cli(args: Args) -> anyhow::Result<()> {
    let read = |p: &std::path::Path| {
        std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
    };
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    let client = minik8s_kubeconfig::client(&args.kubeconfig).await?;
    let identity = args
        .identity
        .unwrap_or_else(minik8s_controllers::leader::identity);
    let mut vnode = RegistryConfig::vnode_config(&identity);
    vnode.address = args.address;
    vnode.listen = args.kubelet_listen;
    vnode.client_ca = Some(args.ca.clone());
    let cfg = RegistryConfig {
        listen: args.listen,
        apiserver: args.apiserver,
        ca_pem: read(&args.ca)?,
        serving: (read(&args.tls[0])?, read(&args.tls[1])?),
        client: (read(&args.client[0])?, read(&args.client[1])?),
        heartbeat: Duration::from_secs(args.heartbeat_seconds.max(1)),
        vnode,
    };
    run(client, cfg, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edge_gets_only_what_its_pods_use() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "serviceAccountName": "robot",
                "volumes": [
                    {"name": "a", "configMap": {"name": "cm-a"}},
                    {"name": "b", "secret": {"secretName": "s-b"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"secret": {"name": "s-c"}},
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    ]}},
                    {"name": "d", "emptyDir": {}},
                ],
                "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "cm-i"}}]}],
                "containers": [{"name": "c", "env": [
                    {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s-x", "key": "k"}}},
                    {"name": "Y", "valueFrom": {"configMapKeyRef": {"name": "cm-a", "key": "k"}}},
                ]}],
            },
        }))
        .unwrap();
        let (maps, secrets, token) = references(&pod);
        assert_eq!(maps, ["cm-a", "cm-i", "kube-root-ca.crt"]);
        assert_eq!(secrets, ["s-b", "s-c", "s-x"]);
        assert_eq!(token, Some(("robot".to_owned(), 3607)));
    }

    #[test]
    fn pressure_follows_the_edges_thresholds() {
        let r = NodeStatusReply {
            memory_total_bytes: 100 << 20,
            memory_used_bytes: 95 << 20,
            memory_pressure: true,
            memory_threshold: 90,
            disk_total_bytes: 100 << 30,
            disk_used_bytes: 10 << 30,
            disk_threshold: 80,
            disk_path: "/var/lib/edge".into(),
            cpus: 4,
            ..Default::default()
        };
        let st = node_status(&r);
        let conds = st.conditions.unwrap();
        let mem = conds.iter().find(|c| c.type_ == "MemoryPressure").unwrap();
        assert_eq!(mem.status, "True");
        assert!(mem.message.as_deref().unwrap().contains("memory use 95%"));
        assert!(
            mem.message
                .as_deref()
                .unwrap()
                .contains("pressure above 90%")
        );
        let disk = conds.iter().find(|c| c.type_ == "DiskPressure").unwrap();
        assert_eq!(disk.status, "False");
        assert!(
            disk.message
                .as_deref()
                .unwrap()
                .contains("on /var/lib/edge")
        );
        assert_eq!(st.capacity.unwrap()["cpu"].0, "4");
    }
}

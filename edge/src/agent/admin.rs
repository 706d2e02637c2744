//! The edgelet's two services: `Edgelet` for the cloud (mutual TLS; only the registry's
//! certificate may call) and `EdgeAdmin` for `edgectl` (loopback): join, reset, upgrade,
//! version, status.

use crate::agent::Agent;
use crate::proto::edge_admin_server::{EdgeAdmin, EdgeAdminServer};
use crate::proto::edgelet_server::{Edgelet, EdgeletServer};
use crate::proto::registry_client::RegistryClient;
use crate::proto::*;
use crate::store::AgentConfig;
use crate::{check_hello, hello};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use minik8s_kubeconfig::join::{self as kjoin, JoinError};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

type Reply<T> = Result<Response<T>, Status>;

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// The cloud-facing service.
#[derive(Clone)]
pub struct EdgeletService(pub Arc<Agent>);

impl EdgeletService {
    /// Checks a call: the protocol version, this node, and the registry's certificate.
    #[allow(clippy::result_large_err)]
    fn admit<T>(&self, req: &Request<T>, h: Option<&Hello>) -> Result<(), Status> {
        let h = check_hello(h)?;
        let cfg = self.0.store.config();
        if !cfg.joined() {
            return Err(Status::failed_precondition(
                "this edgelet has not joined a cluster",
            ));
        }
        if h.node != self.0.node {
            return Err(Status::permission_denied(format!(
                "this edgelet is node {:?}, not {:?}",
                self.0.node, h.node
            )));
        }
        let cn = crate::tls::peer_cn(req).unwrap_or_default();
        if cn != cfg.cloud_identity {
            return Err(Status::permission_denied(format!(
                "only the edge registry ({}) may call this edgelet, not {cn:?}",
                cfg.cloud_identity
            )));
        }
        self.0.contact();
        Ok(())
    }

    #[allow(clippy::result_large_err)]
    fn pod_of(&self, bytes: &[u8]) -> Result<Pod, Status> {
        let pod: Pod = serde_json::from_slice(bytes).map_err(|e| crate::bad_json("the pod", e))?;
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if bound != self.0.node {
            return Err(Status::permission_denied(format!(
                "pod {}/{} is bound to {bound:?}, not to this node {:?}",
                pod.namespace().unwrap_or_default(),
                pod.name_any(),
                self.0.node
            )));
        }
        Ok(pod)
    }
}

fn ack(applied: bool) -> Response<Ack> {
    Response::new(Ack {
        applied,
        message: if applied {
            "applied"
        } else {
            "already applied"
        }
        .into(),
    })
}

#[tonic::async_trait]
impl Edgelet for EdgeletService {
    async fn create_pod(&self, req: Request<PodRequest>) -> Reply<Ack> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let r = req.into_inner();
        let pod = self.pod_of(&r.pod)?;
        tracing::info!(pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()), "pod from the cloud");
        let applied = self.0.store.put_pod(pod, r.seq, true).map_err(internal)?;
        Ok(ack(applied))
    }

    async fn update_pod(&self, req: Request<PodRequest>) -> Reply<Ack> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let r = req.into_inner();
        let pod = self.pod_of(&r.pod)?;
        let uid = pod.uid().unwrap_or_default();
        if self.0.store.pod_by_uid(&uid).is_none() {
            return Err(Status::not_found(format!("pod {uid} is not on this edge")));
        }
        let applied = self.0.store.put_pod(pod, r.seq, false).map_err(internal)?;
        Ok(ack(applied))
    }

    async fn delete_pod(&self, req: Request<DeletePodRequest>) -> Reply<Ack> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let r = req.into_inner();
        let Some(pod) = self.0.store.pod_by_uid(&r.uid) else {
            return Err(Status::not_found(format!(
                "pod {}/{} ({}) is not on this edge",
                r.namespace, r.name, r.uid
            )));
        };
        tracing::info!(pod = %format!("{}/{}", r.namespace, pod.name_any()), grace = r.grace_period_seconds, "deleting a pod at the cloud's request");
        let applied = self
            .0
            .store
            .delete_pod(&r.uid, r.grace_period_seconds)
            .map_err(internal)?;
        Ok(ack(applied))
    }

    async fn get_pod(&self, req: Request<GetPodRequest>) -> Reply<PodReply> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let r = req.into_inner();
        let pod = self
            .0
            .store
            .pod(&r.namespace, &r.name)
            .map(|p| serde_json::to_vec(&p).unwrap_or_default())
            .unwrap_or_default();
        Ok(Response::new(PodReply { pod }))
    }

    async fn get_pods(&self, req: Request<GetPodsRequest>) -> Reply<PodsReply> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let pods = self
            .0
            .store
            .pods()
            .iter()
            .map(|p| serde_json::to_vec(p).unwrap_or_default())
            .collect();
        Ok(Response::new(PodsReply { pods }))
    }

    type StreamStream = tokio_stream::wrappers::ReceiverStream<Result<StreamFrame, Status>>;

    /// One kubelet API connection from the cloud: served by the kubelet's stream handlers
    /// over this edge's pods and runtime.
    async fn stream(
        &self,
        mut req: Request<tonic::Streaming<StreamFrame>>,
    ) -> Reply<Self::StreamStream> {
        let first =
            req.get_mut().message().await?.ok_or_else(|| {
                Status::invalid_argument("the stream ended before its first frame")
            })?;
        self.admit(&req, first.hello.as_ref())?;
        let agent = &self.0;
        let (tx, rx) = tokio::sync::mpsc::channel(crate::tunnel::QUEUE);
        let conn = crate::tunnel::join(req.into_inner(), tx, Ok, &agent.tasks, &agent.shutdown);
        let api = agent.kubelet_api.clone();
        let stop = agent.shutdown.clone();
        minik8s_task::spawn_on(&agent.tasks.clone(), "edgelet-kubelet-api", async move {
            let service = hyper_util::service::TowerToHyperService::new(api);
            // The cloud may end its half first (a request sent whole); the answer still goes.
            let served = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                .with_upgrades();
            tokio::select! {
                r = served => if let Err(e) = r {
                    tracing::debug!(error = %e, "kubelet API connection ended");
                },
                _ = stop.cancelled() => {}
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn describe_node_status(
        &self,
        req: Request<NodeStatusRequest>,
    ) -> Reply<NodeStatusReply> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let status = self.0.measure().await;
        self.0.store.set_node(status.clone());
        Ok(Response::new(status))
    }

    async fn create_volume(&self, req: Request<VolumeRequest>) -> Reply<Ack> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let r = req.into_inner();
        let store = &self.0.store;
        // No object: the cloud no longer has it.
        let applied = if r.object.is_empty() {
            store.remove_volume(&r.kind, &r.namespace, &r.name)
        } else {
            let object: serde_json::Value =
                serde_json::from_slice(&r.object).map_err(|e| crate::bad_json("the object", e))?;
            store.put_volume(&r.kind, &r.namespace, &r.name, object, r.seq)
        }
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(ack(applied))
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatReply> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let since = req.into_inner().since;
        let c = self.0.store.changes_since(since);
        let node = match c.node {
            Some((_, n)) => Some(n),
            None => self.0.store.node(),
        };
        Ok(Response::new(HeartbeatReply {
            node,
            pods: c.pods,
            seq: c.seq,
            events: c
                .events
                .iter()
                .map(|(_, e)| serde_json::to_vec(e).unwrap_or_default())
                .collect(),
            boot: self.0.store.boot,
        }))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<Change, Status>> + Send>>;

    async fn watch(&self, req: Request<WatchRequest>) -> Reply<Self::WatchStream> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        let mut since = req.into_inner().since;
        let agent = self.0.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Change, Status>>(256);
        minik8s_task::spawn_on(&agent.tasks.clone(), "edgelet-watch", async move {
            let mut changed = agent.store.subscribe();
            let boot = agent.store.boot;
            loop {
                let c = agent.store.changes_since(since);
                // In change order, each with its number: a stream cut anywhere resumes
                // after the last change received.
                let mut out: Vec<Change> = Vec::new();
                if let Some((seq, n)) = c.node {
                    out.push(Change {
                        what: Some(change::What::Node(n)),
                        boot,
                        seq,
                    });
                }
                for p in c.pods {
                    let seq = p.seq;
                    out.push(Change {
                        what: Some(change::What::Pod(p)),
                        boot,
                        seq,
                    });
                }
                for (seq, e) in c.events {
                    out.push(Change {
                        what: Some(change::What::Event(
                            serde_json::to_vec(&e).unwrap_or_default(),
                        )),
                        boot,
                        seq,
                    });
                }
                out.sort_by_key(|c| c.seq);
                for change in out {
                    if tx.send(Ok(change)).await.is_err() {
                        return;
                    }
                }
                since = c.seq;
                agent.contact();
                tokio::select! {
                    _ = agent.shutdown.cancelled() => return,
                    _ = tx.closed() => return,
                    r = changed.changed() => if r.is_err() { return },
                    // A keep-alive node status, so the cloud knows the stream lives.
                    _ = tokio::time::sleep(Duration::from_secs(15)) => {
                        if let Some(n) = agent.store.node()
                            && tx.send(Ok(Change { what: Some(change::What::Node(n)), boot, seq: since })).await.is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn version(&self, req: Request<VersionRequest>) -> Reply<VersionReply> {
        self.admit(&req, req.get_ref().hello.as_ref())?;
        Ok(Response::new(VersionReply {
            version: crate::VERSION.into(),
            protocol: crate::PROTOCOL,
            commit: String::new(),
            peer: self.0.store.config().cloud_version,
        }))
    }
}

/// Starts (or restarts) the cloud-facing server with the node's serving certificate.
pub fn start_cloud(agent: &Arc<Agent>) -> Result<(), crate::agent::AgentError> {
    let pki = agent.store.pki();
    let read = |f: &str| {
        std::fs::read_to_string(pki.join(f))
            .map_err(|e| crate::agent::AgentError::Serve(format!("{}: {e}", pki.join(f).display())))
    };
    let (cert, key, ca) = (read("serving.crt")?, read("serving.key")?, read("ca.crt")?);
    let stop = agent.shutdown.child_token();
    if let Some(old) = agent.cloud.lock().expect("cloud").replace(stop.clone()) {
        old.cancel();
    }
    let tls = crate::tls::server_config(&cert, &key, &ca, false);
    let service = EdgeletServer::new(EdgeletService(agent.clone()))
        .max_decoding_message_size(crate::MAX_MESSAGE);
    let listen = agent.cfg.listen;
    // Keep-alives, so a stream to a cloud that went away ends instead of lingering.
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tls_config(tls)
        .map_err(|e| crate::agent::AgentError::Serve(format!("TLS: {e}")))?
        .add_service(service);
    minik8s_task::spawn_on(&agent.tasks.clone(), "edgelet-cloud-server", async move {
        // The old server may still hold the port for a moment.
        for _ in 0..50 {
            match tokio::net::TcpListener::bind(listen).await {
                Ok(l) => {
                    tracing::info!(%listen, "serving the cloud");
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(l);
                    if let Err(e) = server
                        .serve_with_incoming_shutdown(incoming, stop.cancelled())
                        .await
                    {
                        tracing::error!(error = %e, "the cloud-facing server stopped");
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "binding the cloud-facing address");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        tracing::error!(%listen, "cannot bind the cloud-facing address");
    });
    Ok(())
}

/// Serves `EdgeAdmin` on the loopback admin address.
pub async fn serve_admin(agent: Arc<Agent>) -> Result<(), crate::agent::AgentError> {
    let addr = agent.cfg.admin;
    if !addr.ip().is_loopback() {
        return Err(crate::agent::AgentError::Serve(format!(
            "the admin address {addr} is not a loopback address"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| crate::agent::AgentError::Serve(format!("binding {addr}: {e}")))?;
    let service = EdgeAdminServer::new(AdminService(agent.clone()))
        .max_decoding_message_size(crate::MAX_MESSAGE);
    let stop = agent.shutdown.clone();
    minik8s_task::spawn_on(&agent.tasks.clone(), "edgelet-admin-server", async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        if let Err(e) = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stop.cancelled())
            .await
        {
            tracing::error!(error = %e, "the admin server stopped");
        }
    });
    Ok(())
}

/// `edgectl`'s service.
pub struct AdminService(pub Arc<Agent>);

fn join_status(e: JoinError) -> Status {
    match &e {
        JoinError::UnknownToken(_) | JoinError::BadSignature => {
            Status::unauthenticated(e.to_string())
        }
        JoinError::CaNotPinned { .. } | JoinError::BadPin(_) => {
            Status::failed_precondition(e.to_string())
        }
        _ => Status::unavailable(e.to_string()),
    }
}

/// A registry client with the node's client certificate (after join).
#[allow(clippy::result_large_err)]
fn registry_client(
    agent: &Agent,
    cfg: &AgentConfig,
) -> Result<RegistryClient<tonic::transport::Channel>, Status> {
    let pki = agent.store.pki();
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).map_err(internal);
    let (ca, cert, key) = (read("ca.crt")?, read("client.crt")?, read("client.key")?);
    let tls = crate::tls::client_config(&ca, Some((&cert, &key)), None).map_err(internal)?;
    let ch = crate::tls::channel(&cfg.registry, tls, Duration::from_secs(30)).map_err(internal)?;
    Ok(RegistryClient::new(ch).max_decoding_message_size(crate::MAX_MESSAGE))
}

#[tonic::async_trait]
impl EdgeAdmin for AdminService {
    async fn join(&self, req: Request<JoinRequest>) -> Reply<JoinReply> {
        check_hello(req.get_ref().hello.as_ref())?;
        let r = req.into_inner();
        let agent = &self.0;
        let cfg = agent.store.config();
        if cfg.joined() {
            return Err(Status::already_exists(format!(
                "this edgelet already joined {} as node {:?}; run `edgectl reset` first",
                cfg.registry, cfg.node
            )));
        }
        let token = minik8s_types::bootstrap::Token::parse(&r.token).ok_or_else(|| {
            Status::invalid_argument(format!(
                "{:?} is not a bootstrap token: want [a-z0-9]{{6}}.[a-z0-9]{{16}}",
                r.token
            ))
        })?;
        let pins = kjoin::parse_pins(&r.ca_cert_hashes).map_err(join_status)?;
        let node = if r.node_name.is_empty() {
            agent.node.clone()
        } else {
            r.node_name.clone()
        };
        if node != agent.node {
            return Err(Status::failed_precondition(format!(
                "this edgelet runs as node {:?}: start it with --node-name {node} to join under that name",
                agent.node
            )));
        }
        // Discovery: cluster-info from the registry, trusted only once the token's
        // signature and the CA pin check out.
        let insecure = crate::tls::channel(
            &r.registry,
            crate::tls::insecure_config(),
            Duration::from_secs(15),
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let info = RegistryClient::new(insecure)
            .discover(DiscoverRequest {
                hello: hello(&node),
            })
            .await
            .map_err(|s| {
                Status::unavailable(format!(
                    "reading cluster-info from {}: {}",
                    r.registry,
                    s.message()
                ))
            })?
            .into_inner()
            .cluster_info;
        let info: std::collections::BTreeMap<String, String> = info.into_iter().collect();
        let ca = kjoin::verify_cluster_info(&info, &token, &pins).map_err(join_status)?;
        let address = if r.advertise_address.is_empty() {
            format!("{}:{}", agent.facts.ip, agent.cfg.listen.port())
        } else {
            r.advertise_address.clone()
        };
        let ip = address
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']).to_owned())
            .unwrap_or_default();
        if ip.parse::<std::net::IpAddr>().is_err() {
            return Err(Status::invalid_argument(format!(
                "the advertised address {address:?} is not IP:PORT"
            )));
        }
        let cn = format!("system:node:{node}");
        let (client_key, client_csr) =
            minik8s_kubeconfig::csr::new_request(&cn, &["system:nodes"]).map_err(internal)?;
        let (serving_key, serving_csr) = minik8s_kubeconfig::csr::new_request_with_sans(
            &cn,
            &["system:nodes"],
            std::slice::from_ref(&ip),
        )
        .map_err(internal)?;
        let tls = crate::tls::client_config(&ca, None, None).map_err(internal)?;
        let ch =
            crate::tls::channel(&r.registry, tls, Duration::from_secs(60)).map_err(internal)?;
        let st = agent.measure().await;
        let facts = serde_json::json!({
            "kernelVersion": st.kernel, "osImage": st.os_image, "architecture": st.architecture,
            "containerRuntimeVersion": st.runtime_version, "cpu": st.cpus.to_string(),
            "memory": st.memory_total_bytes.to_string(), "ip": st.ip, "podCIDR": st.pod_cidr,
        });
        let reply = RegistryClient::new(ch)
            .register(RegisterRequest {
                hello: hello(&node),
                token: r.token.clone(),
                client_csr,
                serving_csr,
                address: address.clone(),
                facts: facts.to_string(),
            })
            .await?
            .into_inner();
        let pki = agent.store.pki();
        for (file, body) in [
            ("ca.crt", &reply.ca),
            ("client.crt", &reply.client_cert),
            ("client.key", &client_key),
            ("serving.crt", &reply.serving_cert),
            ("serving.key", &serving_key),
        ] {
            crate::store::write_atomic(&pki.join(file), body.as_bytes()).map_err(internal)?;
        }
        let disk_path = agent
            .cfg
            .disk_path
            .clone()
            .unwrap_or_else(|| agent.cfg.data_dir.clone());
        agent
            .store
            .set_config(AgentConfig {
                node: node.clone(),
                registry: r.registry.clone(),
                address,
                disk_path: disk_path.display().to_string(),
                cloud_identity: reply.cloud_identity,
                cloud_version: reply.cloud_version,
            })
            .map_err(internal)?;
        start_cloud(agent).map_err(internal)?;
        tracing::info!(%node, registry = %r.registry, "joined the cluster");
        Ok(Response::new(JoinReply {
            node: node.clone(),
            message: format!(
                "This edge node has joined the cluster as {node}:\n* Its certificates were issued by the cluster CA.\n* The cloud now drives it through its edgelet.\n\nRun 'kubectl get nodes' on the control plane to see it."
            ),
        }))
    }

    async fn reset(&self, req: Request<ResetRequest>) -> Reply<ResetReply> {
        check_hello(req.get_ref().hello.as_ref())?;
        let agent = &self.0;
        let cfg = agent.store.config();
        if !cfg.joined() {
            return Ok(Response::new(ResetReply {
                message: "this edgelet is not a member of a cluster; nothing to do".into(),
            }));
        }
        let left = match registry_client(agent, &cfg) {
            Ok(mut c) => c
                .leave(LeaveRequest {
                    hello: hello(&agent.node),
                })
                .await
                .map(|r| r.into_inner().message),
            Err(e) => Err(e),
        };
        if let Some(stop) = agent.cloud.lock().expect("cloud").take() {
            stop.cancel();
        }
        let pki = agent.store.pki();
        for f in [
            "client.crt",
            "client.key",
            "serving.crt",
            "serving.key",
            "ca.crt",
        ] {
            let _ = std::fs::remove_file(pki.join(f));
        }
        agent
            .store
            .set_config(AgentConfig {
                node: String::new(),
                disk_path: cfg.disk_path.clone(),
                ..Default::default()
            })
            .map_err(internal)?;
        let cloud = match left {
            Ok(m) => m,
            Err(s) => format!(
                "the registry could not be told ({}); delete the Node {} there with kubectl",
                s.message(),
                cfg.node
            ),
        };
        tracing::info!(node = %cfg.node, "left the cluster; the pods keep running");
        Ok(Response::new(ResetReply {
            message: format!(
                "This edge node has left the cluster: {cloud}.\nIts {} pod(s) keep running on this machine.",
                agent.store.pods().len()
            ),
        }))
    }

    async fn upgrade(&self, req: Request<UpgradeRequest>) -> Reply<UpgradeReply> {
        check_hello(req.get_ref().hello.as_ref())?;
        let r = req.into_inner();
        if r.component != "edgelet" {
            return Err(Status::invalid_argument(format!(
                "unknown component {:?}: only \"edgelet\" can be upgraded",
                r.component
            )));
        }
        let from = std::path::PathBuf::from(&r.from);
        let out = tokio::process::Command::new(&from)
            .arg("--version")
            .output()
            .await
            .map_err(|e| {
                Status::invalid_argument(format!("{} does not run: {e}", from.display()))
            })?;
        let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || !said.starts_with("edgelet ") {
            return Err(Status::invalid_argument(format!(
                "{} is not an edgelet binary (`--version` said {said:?})",
                from.display()
            )));
        }
        let current = std::env::current_exe().map_err(internal)?;
        // Copy beside the current binary, then rename over it: atomic on one file system.
        let staged = current.with_extension("new");
        std::fs::copy(&from, &staged).map_err(|e| {
            Status::internal(format!(
                "copying {} to {}: {e}",
                from.display(),
                staged.display()
            ))
        })?;
        std::fs::File::open(&staged)
            .and_then(|f| f.sync_all())
            .map_err(internal)?;
        std::fs::rename(&staged, &current).map_err(internal)?;
        tracing::info!(binary = %current.display(), version = %said, "edgelet upgraded; restarting into it");
        *self.0.reexec.lock().expect("reexec") = Some(current.clone());
        let stop = self.0.shutdown.clone();
        // Answered first; the restart follows (the serving tasks stop, `run` re-executes).
        minik8s_task::spawn_on(&self.0.tasks, "edgelet-upgrade-restart", async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.cancel();
        });
        Ok(Response::new(UpgradeReply {
            message: format!(
                "edgelet replaced by {said} at {}; restarting it (the pods keep running)",
                current.display()
            ),
        }))
    }

    async fn version(&self, req: Request<VersionRequest>) -> Reply<VersionReply> {
        check_hello(req.get_ref().hello.as_ref())?;
        let agent = &self.0;
        let cfg = agent.store.config();
        let peer = if cfg.joined() {
            let live = match registry_client(agent, &cfg) {
                Ok(mut c) => tokio::time::timeout(
                    Duration::from_secs(3),
                    c.version(VersionRequest {
                        hello: hello(&agent.node),
                    }),
                )
                .await
                .ok()
                .and_then(Result::ok)
                .map(|r| r.into_inner()),
                Err(_) => None,
            };
            match live {
                Some(v) => format!("{} (protocol v{})", v.version, v.protocol),
                None => format!(
                    "{} (at join; the registry does not answer now)",
                    cfg.cloud_version
                ),
            }
        } else {
            String::new()
        };
        Ok(Response::new(VersionReply {
            version: crate::VERSION.into(),
            protocol: crate::PROTOCOL,
            commit: String::new(),
            peer,
        }))
    }

    async fn status(&self, req: Request<StatusRequest>) -> Reply<StatusReply> {
        check_hello(req.get_ref().hello.as_ref())?;
        let agent = &self.0;
        let cfg = agent.store.config();
        let pods = agent.store.pods();
        let running = pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        let last = *agent.last_contact.lock().expect("contact");
        Ok(Response::new(StatusReply {
            node: agent.node.clone(),
            registry: cfg.registry.clone(),
            joined: cfg.joined(),
            last_contact: last
                .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default(),
            connected: agent.connected(),
            pods: pods.len() as u32,
            running: running as u32,
            node_status: Some(agent.measure().await),
        }))
    }
}

/// When a certificate file is due for renewal: 80 % into its life, as the kubelet's
/// certificate manager renews (`None`: no readable certificate).
fn renewal_due(path: &std::path::Path) -> Option<i64> {
    let cert = std::fs::read_to_string(path).ok()?;
    let (from, to) = minik8s_kubeconfig::csr::validity(&cert).ok()?;
    Some(from + (to - from) * 4 / 5)
}

/// Renews the node's certificates through the registry (presenting the current client one),
/// each once 80 % of its life has passed: the client certificate, and the serving one of the
/// cloud-facing service, which then restarts on it. Checked when the next is due (at most a
/// minute apart; every 5 s before a join).
pub async fn renew_certificates(agent: Arc<Agent>) {
    loop {
        let pki = agent.store.pki();
        let now = jiff::Timestamp::now().as_second();
        let next = ["client.crt", "serving.crt"]
            .iter()
            .filter_map(|f| renewal_due(&pki.join(f)))
            .min()
            // Not joined yet: look again soon (a join brings certificates).
            .map_or(5, |due| (due - now).clamp(1, 60));
        tokio::select! {
            _ = agent.shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(next as u64)) => {}
        }
        let cfg = agent.store.config();
        if !cfg.joined() {
            continue;
        }
        let now = jiff::Timestamp::now().as_second();
        let due = |f: &str| renewal_due(&pki.join(f)).is_some_and(|d| now >= d);
        let (client, serving) = (due("client.crt"), due("serving.crt"));
        if !client && !serving {
            continue;
        }
        match renew(&agent, &cfg, client, serving).await {
            Ok(()) => {
                tracing::info!(node = %agent.node, client, serving, "renewed the node's certificates");
                if serving && let Err(e) = start_cloud(&agent) {
                    tracing::error!(error = %e, "restarting the cloud-facing server on the renewed certificate");
                }
            }
            Err(e) => {
                tracing::warn!(node = %agent.node, error = %e.message(), "renewing the node's certificates failed; retrying")
            }
        }
    }
}

/// One renewal: new keys and requests, the registry's certificates, written over the old.
async fn renew(
    agent: &Agent,
    cfg: &AgentConfig,
    client: bool,
    serving: bool,
) -> Result<(), Status> {
    let cn = format!("system:node:{}", agent.node);
    let groups = ["system:nodes"];
    let client_req = if client {
        Some(minik8s_kubeconfig::csr::new_request(&cn, &groups).map_err(internal)?)
    } else {
        None
    };
    let serving_req = if serving {
        let ip = cfg
            .address
            .rsplit_once(':')
            .map(|(h, _)| h.trim_matches(['[', ']']).to_owned())
            .unwrap_or_default();
        Some(
            minik8s_kubeconfig::csr::new_request_with_sans(&cn, &groups, &[ip])
                .map_err(internal)?,
        )
    } else {
        None
    };
    let reply = registry_client(agent, cfg)?
        .renew(RenewRequest {
            hello: hello(&agent.node),
            client_csr: client_req.as_ref().map(|r| r.1.clone()).unwrap_or_default(),
            serving_csr: serving_req
                .as_ref()
                .map(|r| r.1.clone())
                .unwrap_or_default(),
        })
        .await?
        .into_inner();
    let pki = agent.store.pki();
    let write = |f: &str, text: &str| {
        crate::store::write_atomic(&pki.join(f), text.as_bytes()).map_err(internal)
    };
    if let Some((key, _)) = client_req {
        write("client.key", &key)?;
        write("client.crt", &reply.client_cert)?;
    }
    if let Some((key, _)) = serving_req {
        write("serving.key", &key)?;
        write("serving.crt", &reply.serving_cert)?;
    }
    Ok(())
}

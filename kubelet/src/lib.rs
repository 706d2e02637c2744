//! The minik8s kubelet: registers its Node, keeps its Lease, and runs the pods bound to it on
//! containerd through the CRI (sandbox with a CNI bridge address, init containers, containers,
//! restart policy with back-off, volumes, env), reporting their status as upstream does. A
//! restarted kubelet adopts what the runtime already runs.

pub mod containerd;
pub mod cri;
mod daemon;
pub mod devices;
pub mod down;
pub mod error;
pub mod logs;
pub mod metrics;
pub mod netguard;
pub mod node;
pub mod pod;
pub mod provisioner;
pub mod registry;
pub mod routes;
pub mod server;
pub mod spdy;
pub mod static_pods;
pub mod stats;
pub mod stream;
pub mod wsframes;

pub use error::{Error, Result};

use containerd::{Containerd, RuntimeConfig};
use cri::{Cri, labels};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use pod::Worker;
use pod::spec::Layout;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How the kubelet runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The node's name.
    pub node_name: String,
    /// The node's folder: pods, logs, and (when the kubelet starts it) containerd's runtime.
    pub root: PathBuf,
    /// The node's runtime; the kubelet starts (or adopts) this containerd.
    pub runtime: RuntimeConfig,
    /// Image archives to import into the runtime at start.
    pub images: Vec<PathBuf>,
    /// The node's InternalIP; found from the default route when `None`.
    pub node_ip: Option<String>,
    /// Parent cgroup of every pod (e.g. `/minik8s/<node>`).
    pub cgroup_root: String,
    /// Where the kubelet's HTTPS server listens (port 0: any free port).
    pub listen: std::net::SocketAddr,
    /// The cluster CA its clients' certificates must chain to; no server without it.
    pub client_ca: Option<PathBuf>,
    /// The static pod manifest folder (watched; `None`: no static pods).
    pub manifests: Option<PathBuf>,
    /// The cluster DNS servers pods use (`--cluster-dns`; empty: the node's resolvers).
    pub cluster_dns: Vec<String>,
    /// The cluster domain (`--cluster-domain`).
    pub cluster_domain: String,
}

impl Config {
    /// A kubelet for `node_name` keeping everything under `root`.
    pub fn new(node_name: &str, root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Config {
            node_name: node_name.to_owned(),
            runtime: RuntimeConfig::new(root.join("containerd")),
            root,
            images: Vec::new(),
            node_ip: None,
            cgroup_root: format!("/minik8s/{node_name}"),
            listen: ([0, 0, 0, 0], 10250).into(),
            client_ca: None,
            manifests: None,
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
        }
    }

    /// Folders and cgroups of this node's pods.
    pub fn layout(&self) -> Layout {
        Layout {
            node: self.node_name.clone(),
            root: self.root.clone(),
            cgroup_root: self.cgroup_root.clone(),
            cluster_dns: self.cluster_dns.clone(),
            cluster_domain: self.cluster_domain.clone(),
        }
    }
}

fn error_policy(pod: Arc<Pod>, e: &Error, _: Arc<Worker>) -> Action {
    tracing::warn!(pod = %pod.name_any(), error = %e, "pod pass failed");
    Action::requeue(Duration::from_secs(1))
}

/// Removes sandboxes of this node whose pod is no longer in `live`, and forgets the probes
/// of containers that are gone.
pub async fn remove_orphans(w: &Worker, live: &HashSet<String>) -> Result<()> {
    let mine = HashMap::from([(labels::NODE.to_owned(), w.layout.node.clone())]);
    let mut gone: HashSet<String> = HashSet::new();
    for s in w.cri.sandboxes(mine).await? {
        if let Some(uid) = s.labels.get(labels::POD_UID)
            && !live.contains(uid)
        {
            gone.insert(uid.clone());
        }
    }
    let live: HashSet<String> = w
        .cri
        .containers(HashMap::from([(
            labels::NODE.to_owned(),
            w.layout.node.clone(),
        )]))
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    w.probes.retain(&live);
    for uid in gone {
        tracing::info!(%uid, "removing the sandbox of a pod that no longer exists");
        w.teardown(&uid, 0, None).await?;
    }
    Ok(())
}

/// Says plainly at start when the runtime has no sandbox (pause) image and cannot pull one:
/// every pod would stay in ContainerCreating with `FailedCreatePodSandBox` events.
pub async fn check_pause_image(cri: &Cri, image: &str) {
    if matches!(cri.image_id(image).await, Ok(Some(_))) {
        return;
    }
    if let Err(e) = cri.pull_image(image).await {
        tracing::error!(
            image,
            error = %e,
            "the node has no pause image, so no pod can start: build the local images with \
             `bash hack/images.sh DATA_DIR/images` (hack/up.sh does) and restart, or load an \
             archive with `bash hack/load-image.sh pause.tar`"
        );
    }
}

/// Registers the node and posts its first heartbeat.
async fn register(client: &Client, facts: &node::Facts, port: u16, name: &str) -> Result<()> {
    node::register(client, facts, port).await?;
    node::heartbeat(client, name, None).await?;
    tracing::info!(node = %name, ip = %facts.ip, runtime = %facts.runtime, port, "node registered");
    Ok(())
}

/// Runs the kubelet until `shutdown`. The runtime and its pods keep running after it stops.
pub async fn run(client: Client, mut cfg: Config, shutdown: CancellationToken) -> Result<()> {
    netguard::install(&cfg.node_name).await?;
    if cfg.runtime.pod_cidr.is_empty() {
        // No `--pod-cidr`: the node IPAM controller gives the node its block.
        match node::await_pod_cidr(&client, &cfg.node_name, &shutdown).await? {
            Some(cidr) => {
                tracing::info!(node = %cfg.node_name, %cidr, "the node's pod CIDR");
                cfg.runtime.pod_cidr = cidr;
            }
            None => return Ok(()),
        }
    }
    let runtime = Containerd::start(&cfg.runtime).await?;
    for image in &cfg.images {
        runtime.import(image).await?;
    }
    let cri = Cri::connect(&runtime.socket()).await?;
    check_pause_image(&cri, &cfg.runtime.sandbox_image).await;
    let facts = node::Facts::gather(
        &cfg.node_name,
        cfg.node_ip.clone(),
        &cfg.runtime.pod_cidr,
        &cfg.root,
        &cri,
    )
    .await?;
    let pods: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={}", cfg.node_name);
    let controller = Controller::new(pods, watcher::Config::default().fields(&selector));
    let store = controller.store();
    let (port, server) = match &cfg.client_ca {
        Some(ca) => {
            let (addr, serve) = server::bind(
                cfg.listen,
                ca,
                &cfg.node_name,
                cri.clone(),
                store.clone(),
                shutdown.clone(),
            )
            .await?;
            (addr.port(), Some(serve))
        }
        None => (0, None),
    };
    // Registration waits for the apiserver, but static pods do not: they may be the
    // apiserver itself (a static control plane).
    let registered = match register(&client, &facts, port, &cfg.node_name).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register the node yet; static pods start anyway and registration is retried");
            false
        }
    };
    let worker = Arc::new(Worker::new(
        client.clone(),
        cri.clone(),
        cfg.layout(),
        facts.ip.clone(),
    ));
    let device_plugins = worker.devices.clone().serve(shutdown.clone());
    let server = async move {
        if let Some(serve) = server {
            serve.await;
        }
    };

    let heartbeat = {
        let client = client.clone();
        let name = cfg.node_name.clone();
        let cri = cri.clone();
        let shutdown = shutdown.clone();
        let facts = facts.clone();
        async move {
            let mut registered = registered;
            loop {
                let wait = if registered { 10_000 } else { 500 };
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                }
                if !registered {
                    registered = register(&client, &facts, port, &name).await.is_ok();
                    continue;
                }
                let problem = cri.problem().await;
                if let Err(e) = node::heartbeat(&client, &name, problem.as_deref()).await {
                    tracing::warn!(error = %e, "node heartbeat");
                }
            }
        }
    };

    // Read before orphan removal first runs, so the static pods a restarted kubelet finds in
    // the runtime are live.
    let running = static_pods::Running::default();
    let statics = {
        let worker = worker.clone();
        let running = running.clone();
        let store = store.clone();
        let shutdown = shutdown.clone();
        let dir = cfg.manifests.clone();
        if let Some(dir) = &dir {
            running.load(dir, &cfg.node_name);
        }
        async move {
            if let Some(dir) = dir {
                static_pods::run(dir, worker, running, store, shutdown).await;
            }
        }
    };
    let orphans = {
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        async move {
            // After the first full list, then every 10 s.
            let _ = store.wait_until_ready().await;
            loop {
                let mut live: HashSet<String> =
                    store.state().iter().filter_map(|p| p.uid()).collect();
                live.extend(running.uids());
                worker.devices.release_except(&live);
                worker.retain_admitted(&live);
                if let Err(e) = remove_orphans(&worker, &live).await {
                    tracing::warn!(error = %e, "removing orphaned sandboxes");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        }
    };
    let pods = {
        let shutdown = shutdown.clone();
        controller
            .graceful_shutdown_on(async move { shutdown.cancelled().await })
            .run(pod::reconcile, error_policy, worker)
            .for_each(|_| async {})
    };
    let routes = routes::run(
        client.clone(),
        cfg.node_name.clone(),
        facts.ip.clone(),
        shutdown.clone(),
    );
    let provisioner = provisioner::run(
        client.clone(),
        cfg.node_name.clone(),
        cfg.root.clone(),
        shutdown.clone(),
    );
    tokio::join!(
        heartbeat,
        orphans,
        pods,
        server,
        statics,
        routes,
        provisioner,
        device_plugins
    );
    Ok(())
}

//! The edgelet: runs the pods the cloud gave it on the machine's own containerd, through the
//! kubelet's pod worker (planner, runtime, volumes, probes, restart policy and back-off),
//! whose API client is the [local](crate::local) one. It keeps serving and restarting its pods
//! whether or not the cloud is there (edge autonomy): every pod and volume is in the
//! [store](crate::store), and a restarted edgelet adopts what the runtime runs.
//!
//! It serves the cloud (`Edgelet`, mutual TLS, once joined) and `edgectl` (`EdgeAdmin`, on
//! loopback), measures the node (memory and disk use with their pressure conditions), and
//! keeps the edge's Service rules and names ([`services`]).

pub mod admin;
pub mod services;

use crate::proto::NodeStatusReply;
use crate::store::Store;
use minik8s_kubelet::containerd::Containerd;
use minik8s_kubelet::cri::Cri;
use minik8s_kubelet::pod::{self, Worker};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the edgelet could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The store could not be opened.
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The runtime could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] minik8s_kubelet::Error),
    /// The Docker runtime could not start.
    #[error("docker runtime: {0}")]
    Docker(#[from] minik8s_dockershim::Error),
    /// A server could not start.
    #[error("{0}")]
    Serve(String),
}

/// Which container runtime runs the edge's pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Runtime {
    /// A private containerd the edgelet starts (the default).
    #[default]
    Containerd,
    /// The machine's Docker Engine, through its API socket; the pods join a user network of
    /// that name.
    Docker {
        /// Docker's API socket.
        socket: String,
        /// The pods' user network.
        network: String,
    },
}

/// How the edgelet runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Its folder: the store, the node's runtime and pods.
    pub data_dir: PathBuf,
    /// Where it serves the cloud.
    pub listen: SocketAddr,
    /// Where it serves `edgectl` (a loopback address).
    pub admin: SocketAddr,
    /// The node's name before it joined (default: the host name).
    pub node_name: Option<String>,
    /// The node's address (default: the default route's source).
    pub node_ip: Option<String>,
    /// The pods' subnet on this machine.
    pub pod_cidr: String,
    /// The CNI bridge's name.
    pub bridge: String,
    /// Image archives imported at start.
    pub images: Vec<PathBuf>,
    /// The path whose file system's use is reported (default: the data folder).
    pub disk_path: Option<PathBuf>,
    /// Memory pressure above this use (percent).
    pub memory_threshold: u32,
    /// Disk pressure above this use (percent).
    pub disk_threshold: u32,
    /// DNS servers of the pods (empty: the edge's own, at the pods' gateway, which forwards
    /// what it does not know to the machine's resolvers).
    pub cluster_dns: Vec<String>,
    /// How often the node is measured.
    pub status_interval: Duration,
    /// The pods' parent cgroup (`None`: the kubelet's, `/minik8s/<node>`).
    pub cgroup_root: Option<String>,
    /// The container runtime.
    pub runtime: Runtime,
}

impl Config {
    /// An edgelet keeping everything under `data_dir`, with the seed's thresholds.
    pub fn new(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            data_dir: data_dir.into(),
            listen: SocketAddr::from(([0, 0, 0, 0], crate::EDGELET_PORT)),
            admin: crate::ADMIN_ADDRESS.parse().expect("the admin address"),
            node_name: None,
            node_ip: None,
            pod_cidr: "10.88.0.0/24".into(),
            bridge: "mk8sedge0".into(),
            images: Vec::new(),
            disk_path: None,
            memory_threshold: 90,
            disk_threshold: 80,
            cluster_dns: Vec::new(),
            status_interval: Duration::from_secs(10),
            cgroup_root: None,
            runtime: Runtime::Containerd,
        }
    }

    /// The Docker runtime's settings for node `node`, when the pods run on Docker.
    pub fn docker(&self, node: &str) -> Option<minik8s_dockershim::Config> {
        let Runtime::Docker { socket, network } = &self.runtime else {
            return None;
        };
        Some(minik8s_dockershim::Config {
            socket: socket.clone(),
            network: network.clone(),
            bridge: self.bridge.clone(),
            pod_cidr: self.pod_cidr.clone(),
            pause_image: self.kubelet(node).runtime.sandbox_image,
            node: node.to_owned(),
        })
    }

    /// The kubelet configuration of this node's runtime and pods (under `<data>/node`).
    pub fn kubelet(&self, node: &str) -> minik8s_kubelet::Config {
        let mut k = minik8s_kubelet::Config::new(node, self.data_dir.join("node"));
        k.runtime.pod_cidr = self.pod_cidr.clone();
        k.runtime.bridge = self.bridge.clone();
        k.images = self.images.clone();
        k.node_ip = self.node_ip.clone();
        k.cluster_dns = if self.cluster_dns.is_empty() {
            services::dns_address(&self.pod_cidr)
                .map(|a| vec![a.ip().to_string()])
                .unwrap_or_default()
        } else {
            self.cluster_dns.clone()
        };
        if let Some(root) = &self.cgroup_root {
            k.cgroup_root = root.clone();
        }
        k
    }
}

/// The node name: the joined one, the configured one, or the host name.
pub fn node_name(cfg: &Config, store: &Store) -> String {
    let joined = store.config().node;
    if !joined.is_empty() {
        return joined;
    }
    cfg.node_name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_else(|_| "edge".into())
            .trim()
            .to_ascii_lowercase()
    })
}

/// The running edgelet.
pub struct Agent {
    /// Its settings.
    pub cfg: Config,
    /// The node's name.
    pub node: String,
    /// The local store.
    pub store: Arc<Store>,
    /// The runtime.
    pub cri: Cri,
    /// The kubelet's pod worker.
    pub worker: Arc<Worker>,
    /// The kubelet API's stream handlers over this edge's pods, served to the cloud's
    /// `Stream` calls.
    pub kubelet_api: axum::Router,
    /// The machine's facts.
    pub facts: minik8s_kubelet::node::Facts,
    /// When the cloud last called.
    pub last_contact: Mutex<Option<jiff::Timestamp>>,
    /// Stops the cloud-facing server (replaced on join, cancelled on reset).
    pub cloud: Mutex<Option<CancellationToken>>,
    /// The edgelet's stop.
    pub shutdown: CancellationToken,
    /// Its tasks.
    pub tasks: TaskTracker,
    /// An upgrade asked for the process to run its new binary once stopped.
    pub reexec: Mutex<Option<PathBuf>>,
}

impl Agent {
    /// Notes a call from the cloud.
    pub fn contact(&self) {
        *self.last_contact.lock().expect("contact") = Some(jiff::Timestamp::now());
    }

    /// Whether the cloud called within the last 30 s.
    pub fn connected(&self) -> bool {
        self.last_contact
            .lock()
            .expect("contact")
            .is_some_and(|t| jiff::Timestamp::now().duration_since(t).as_secs() < 30)
    }

    /// The node's status now.
    pub async fn measure(&self) -> NodeStatusReply {
        let disk_path = self
            .cfg
            .disk_path
            .clone()
            .unwrap_or_else(|| self.cfg.data_dir.clone());
        let (mem_total, mem_used) = memory();
        let (disk_total, disk_used) = disk(&disk_path).await;
        let pct = |used: u64, total: u64| used.saturating_mul(100).checked_div(total).unwrap_or(0);
        NodeStatusReply {
            ip: self.facts.ip.clone(),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            os_image: os_image(),
            architecture: match std::env::consts::ARCH {
                "x86_64" => "amd64".into(),
                "aarch64" => "arm64".into(),
                other => other.into(),
            },
            runtime_version: self.facts.runtime.clone(),
            edgelet_version: crate::VERSION.into(),
            cpus: self.facts.cpus as u32,
            memory_total_bytes: mem_total,
            memory_used_bytes: mem_used,
            disk_path: disk_path.display().to_string(),
            disk_total_bytes: disk_total,
            disk_used_bytes: disk_used,
            memory_pressure: pct(mem_used, mem_total) > u64::from(self.cfg.memory_threshold),
            disk_pressure: pct(disk_used, disk_total) > u64::from(self.cfg.disk_threshold),
            memory_threshold: self.cfg.memory_threshold,
            disk_threshold: self.cfg.disk_threshold,
            pods: self.store.pods().len() as u32,
            pod_cidr: self.cfg.pod_cidr.clone(),
            runtime_problem: self.cri.problem().await.unwrap_or_default(),
        }
    }
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".into())
}

/// (total, used) memory in bytes, from `/proc/meminfo` (used = total − available).
fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    let total = field("MemTotal:");
    (total, total.saturating_sub(field("MemAvailable:")))
}

/// (total, used) bytes of the file system holding `path` (from `df`).
async fn disk(path: &std::path::Path) -> (u64, u64) {
    let out = tokio::process::Command::new("df")
        .args(["-B1", "--output=size,used"])
        .arg(path)
        .output()
        .await;
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            let line = s.lines().nth(1)?.to_owned();
            let mut w = line.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .unwrap_or((0, 0))
}

/// Runs the edgelet until `shutdown`. Its runtime and pods keep running after it stops.
/// Returns the binary to run next when an upgrade asked for one.
pub async fn run(cfg: Config, shutdown: CancellationToken) -> Result<Option<PathBuf>, AgentError> {
    let store = Arc::new(Store::open(&cfg.data_dir.join("store"))?);
    let node = node_name(&cfg, &store);
    let kcfg = cfg.kubelet(&node);
    minik8s_kubelet::netguard::install(&node).await?;
    let tasks = TaskTracker::new();
    let cri = match cfg.docker(&node) {
        None => {
            let runtime = Containerd::start(&kcfg.runtime).await?;
            for image in &kcfg.images {
                runtime.import(image).await?;
            }
            Cri::connect(&runtime.socket()).await?
        }
        Some(docker) => {
            // Docker's pods, through the CRI served on a socket of the edgelet's own.
            let shim = minik8s_dockershim::Shim::connect(docker).await?;
            shim.ensure_network().await?;
            shim.load(&kcfg.images).await?;
            let socket = cfg.data_dir.join("docker-cri.sock");
            shim.serve(&socket, &tasks, shutdown.clone()).await?;
            tracing::info!(docker = %shim.version().await.unwrap_or_default(), "pods run on docker");
            Cri::connect(&socket).await?
        }
    };
    minik8s_kubelet::check_pause_image(&cri, &kcfg.runtime.sandbox_image).await;
    let facts = minik8s_kubelet::node::Facts::gather(
        &node,
        cfg.node_ip.clone(),
        &cfg.pod_cidr,
        &kcfg.root,
        &cri,
    )
    .await?;
    let local = crate::local::client(store.clone());
    let worker = Arc::new(Worker::new(
        local,
        cri.clone(),
        kcfg.layout(),
        facts.ip.clone(),
    ));
    let pods = store.clone();
    let kubelet_api = minik8s_kubelet::server::streams(minik8s_kubelet::server::StreamState {
        cri: cri.clone(),
        pods: Arc::new(move || pods.pods().into_iter().map(Arc::new).collect()),
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
    });
    let agent = Arc::new(Agent {
        cfg: cfg.clone(),
        node: node.clone(),
        store: store.clone(),
        cri,
        worker,
        kubelet_api,
        facts,
        last_contact: Mutex::new(None),
        cloud: Mutex::new(None),
        shutdown: shutdown.clone(),
        tasks: tasks.clone(),
        reexec: Mutex::new(None),
    });
    let first = agent.measure().await;
    store.set_node(first);
    minik8s_task::spawn_on(&tasks, "edgelet-pods", run_pods(agent.clone()));
    minik8s_task::spawn_on(&tasks, "edgelet-orphans", orphans(agent.clone()));
    minik8s_task::spawn_on(&tasks, "edgelet-node-status", node_status(agent.clone()));
    minik8s_task::spawn_on(&tasks, "edgelet-services", services::run(agent.clone()));
    minik8s_task::spawn_on(
        &tasks,
        "edgelet-certificates",
        admin::renew_certificates(agent.clone()),
    );
    admin::serve_admin(agent.clone()).await?;
    if store.config().joined() {
        admin::start_cloud(&agent)?;
    }
    tracing::info!(node = %node, pods = store.pods().len(), joined = store.config().joined(), "edgelet started");
    shutdown.cancelled().await;
    tasks.close();
    tasks.wait().await;
    let next = agent.reexec.lock().expect("reexec").take();
    tracing::info!("edgelet stopped; its pods keep running");
    Ok(next)
}

/// Every stored pod gets a runner that syncs it through the kubelet's worker every relist
/// period and at once when the cloud changes it; a pod gone from the store ends its runner.
async fn run_pods(agent: Arc<Agent>) {
    let mut changed = agent.store.pod_changed.subscribe();
    let mut runners: HashMap<String, Arc<tokio::sync::Notify>> = HashMap::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(5));
    loop {
        let live: HashSet<String> = agent
            .store
            .pods()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        runners.retain(|uid, _| live.contains(uid));
        for uid in live {
            runners.entry(uid.clone()).or_insert_with(|| {
                let wake = Arc::new(tokio::sync::Notify::new());
                minik8s_task::spawn_on(
                    &agent.tasks.clone(),
                    "edgelet-pod",
                    run_pod(agent.clone(), uid, wake.clone()),
                );
                wake
            });
        }
        tokio::select! {
            _ = agent.shutdown.cancelled() => return,
            uid = changed.recv() => {
                if let Ok(uid) = uid && let Some(w) = runners.get(&uid) {
                    w.notify_one();
                }
            }
            _ = sweep.tick() => {}
        }
    }
}

async fn run_pod(agent: Arc<Agent>, uid: String, wake: Arc<tokio::sync::Notify>) {
    loop {
        let Some(p) = agent.store.pod_by_uid(&uid) else {
            return;
        };
        let name = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        if let Err(e) = pod::reconcile(Arc::new(p), agent.worker.clone()).await {
            tracing::warn!(pod = %name, error = %e, "pod pass failed");
        }
        tokio::select! {
            _ = agent.shutdown.cancelled() => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(pod::RELIST) => {}
        }
    }
}

/// Removes the sandboxes of pods the store no longer has, every 10 s.
async fn orphans(agent: Arc<Agent>) {
    loop {
        let live: HashSet<String> = agent
            .store
            .pods()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        agent.worker.retain_admitted(&live);
        if let Err(e) = minik8s_kubelet::remove_orphans(&agent.worker, &live).await {
            tracing::warn!(error = %e, "removing orphaned sandboxes");
        }
        tokio::select! {
            _ = agent.shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}

/// Measures the node every status interval; a change of pressure reaches the cloud at once.
async fn node_status(agent: Arc<Agent>) {
    loop {
        tokio::select! {
            _ = agent.shutdown.cancelled() => return,
            _ = tokio::time::sleep(agent.cfg.status_interval) => {}
        }
        let status = agent.measure().await;
        agent.store.set_node(status);
    }
}

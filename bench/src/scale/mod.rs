//! The scale harness behind `scale-bench` (and `bench/scale`): N simulated nodes (the
//! controllers' `simnodes`: Leases every 10 s, node status every 60 s, pod status as a
//! kubelet writes it) and ClusterLoader2's load ([`load`]) against a control plane, either
//! `minik8s up` started here in a cgroup of its own or one started elsewhere (upstream's, by
//! `bench/upstream-plane.sh`). Phases: create everything, scale every Deployment to between
//! half and one and a half times its size, roll a quarter of them, delete it all. It
//! measures ([`measure`]) the API calls from both sides against the scalability SIG's SLOs,
//! pod start-up from a watch (first seen → Running), watch losses (the watch's view against a
//! LIST once each phase settled), 5xx answers, memory (RssAnon, PSS, cgroup) and CPU of each
//! component, the store's size, memory per stored object, and with `kill`, a SIGKILL of
//! `minik8s up` at the peak: the time it takes to answer again and for every node to renew
//! its Lease, and the objects counted before and after. The pod watch and the sampled reads
//! run in a thread and runtime of their own (`spawn_measuring`), apart from the simulated
//! nodes and the load's writes.

pub mod load;
pub mod measure;

use crate::bench::{Cgroup, Server, cgroup_memory_mib, cpu_seconds, memory, percentiles};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use load::{Deploy, LOAD_LABEL};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The control plane under load.
pub enum Plane {
    /// `minik8s up` (apiserver and controller-manager in one process), started here.
    Minik8s {
        /// The `minik8s` binary.
        binary: PathBuf,
        /// More flags for `minik8s up` (kept through the SIGKILL's restart).
        args: Vec<String>,
    },
    /// A control plane started elsewhere.
    External(External),
}

/// A control plane started elsewhere, and where to measure it.
pub struct External {
    /// Its name in the report.
    pub name: String,
    /// An admin kubeconfig for it.
    pub kubeconfig: PathBuf,
    /// Its processes by component name.
    pub pids: Vec<(String, u32)>,
    /// The cgroup its processes run in.
    pub cgroup: Option<PathBuf>,
    /// Its store's folder.
    pub data: Option<PathBuf>,
}

/// The size of the run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Simulated nodes.
    pub nodes: usize,
    /// Pods of the load, over all its Deployments.
    pub pods: usize,
    /// How long each phase may take to settle.
    pub limit: Duration,
    /// ConfigMaps created at the peak, to measure memory per stored ConfigMap (0: none).
    pub configmaps: usize,
    /// SIGKILL `minik8s up` at the peak and count what comes back.
    pub kill: bool,
    /// Pods per second the load creates at most: ClusterLoader2 paces its load so
    /// (`CL2_LOAD_TEST_THROUGHPUT`, 50 in upstream's 5,000-node job).
    pub pod_rate: f64,
}

/// How many of the harness's own writes are in flight at once.
const PARALLEL: usize = 16;

/// The pod CIDR `minik8s up` is given: 16,384 nodes' /24s (the shared address space of
/// RFC 6598, clear of the Service range).
const POD_CIDR: &str = "100.64.0.0/10";

/// What the pod watch has seen of one pod.
struct Tracked {
    rv: String,
    seen: Instant,
    bound: Option<Instant>,
    running: bool,
    terminating: bool,
    /// Seen from its creation (not in the watch's first list).
    fresh: bool,
    /// The phase of the load it was first seen in.
    phase: &'static str,
}

/// The pod watch's view: every pod of the load, start-up latencies and relists.
#[derive(Default)]
struct Tracker {
    pods: HashMap<String, Tracked>,
    startup: Vec<Duration>,
    scheduled_to_running: Vec<Duration>,
    /// First seen → Running, by the phase the pod was first seen in.
    startup_by_phase: BTreeMap<&'static str, Vec<Duration>>,
    /// First seen → bound (the scheduler's share), by the same phase.
    bound_by_phase: BTreeMap<&'static str, Vec<Duration>>,
    /// The phase of the load under way.
    phase: &'static str,
    relists: u64,
    events: u64,
}

impl Tracker {
    fn apply(&mut self, pod: &Pod, listing: bool) {
        let now = Instant::now();
        let uid = pod.uid().unwrap_or_default();
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some();
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let phase = self.phase;
        let t = self.pods.entry(uid).or_insert_with(|| Tracked {
            rv: String::new(),
            seen: now,
            bound: None,
            running: false,
            terminating: false,
            fresh: !listing,
            phase,
        });
        t.rv = pod.resource_version().unwrap_or_default();
        t.terminating = pod.metadata.deletion_timestamp.is_some();
        if bound && t.bound.is_none() {
            t.bound = Some(now);
            if t.fresh {
                self.bound_by_phase
                    .entry(t.phase)
                    .or_default()
                    .push(now - t.seen);
            }
        }
        if running && !t.running {
            t.running = true;
            if t.fresh {
                self.startup.push(now - t.seen);
                self.scheduled_to_running.push(now - t.bound.unwrap_or(now));
                self.startup_by_phase
                    .entry(t.phase)
                    .or_default()
                    .push(now - t.seen);
            }
        }
    }

    /// Pod start-up so far of the pods first seen in `phase` (first seen → Running).
    fn startup_in(&self, phase: &str) -> Value {
        let mut d = self
            .startup_by_phase
            .get(phase)
            .cloned()
            .unwrap_or_default();
        percentiles(&mut d)
    }

    /// Pods not being deleted, and how many of them run.
    fn live(&self) -> (usize, usize) {
        let live = self.pods.values().filter(|t| !t.terminating);
        let (mut n, mut running) = (0, 0);
        for t in live {
            n += 1;
            running += usize::from(t.running);
        }
        (n, running)
    }
}

/// Follows every pod of the load until `stop`.
async fn watch_pods(client: Client, tracker: Arc<Mutex<Tracker>>, stop: CancellationToken) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().labels(&format!("{LOAD_LABEL}=true"));
    let mut events = watcher(api, config).boxed();
    let mut relisted: HashSet<String> = HashSet::new();
    let mut lists = 0u64;
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = events.next() => ev,
        };
        let Some(ev) = ev else { return };
        let Ok(ev) = ev else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut t = tracker.lock().expect("tracker");
        t.events += 1;
        match ev {
            watcher::Event::Init => relisted.clear(),
            watcher::Event::InitApply(p) => {
                relisted.insert(p.uid().unwrap_or_default());
                t.apply(&p, true);
            }
            watcher::Event::InitDone => {
                t.pods.retain(|uid, _| relisted.contains(uid));
                lists += 1;
                t.relists = lists - 1;
            }
            watcher::Event::Apply(p) => t.apply(&p, false),
            watcher::Event::Delete(p) => {
                t.pods.remove(&p.uid().unwrap_or_default());
            }
        }
    }
}

/// Starts the pod watch and the sampled reads on a runtime of their own, in a thread named
/// `scale-measure`, with a client of their own: the thousands of simulated nodes and the
/// load's writes in the harness's main runtime do not delay when a watch event is stamped or
/// a read is timed (ClusterLoader2 measures from a process apart from its hollow nodes).
/// The thread ends when `stop` is cancelled.
async fn spawn_measuring(
    kubeconfig: PathBuf,
    tracker: Arc<Mutex<Tracker>>,
    rec: Arc<measure::Client>,
    plan: Arc<Vec<Deploy>>,
    nodes: usize,
    stop: CancellationToken,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("scale-measure")
        .enable_all()
        .build()?;
    let (made, client_made) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("scale-measure".into())
        .spawn(move || {
            rt.block_on(async move {
                // The client's connections and its buffer's worker run on this runtime.
                let client = match minik8s_kubeconfig::client(&kubeconfig).await {
                    Ok(c) => {
                        let _ = made.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = made.send(Err(e));
                        return;
                    }
                };
                let watch = tokio::spawn(watch_pods(client.clone(), tracker, stop.clone()));
                let reads = tokio::spawn(sample_reads(client, rec, plan, nodes, stop));
                let _ = tokio::join!(watch, reads);
            });
        })?;
    client_made
        .await
        .map_err(|_| anyhow::anyhow!("the measuring thread ended before its client was made"))??;
    Ok(thread)
}

/// A raw GET through the client (the body is read, not decoded): LISTs and GETs as their
/// latency, without the harness's own decoding.
async fn raw_get(client: &Client, path: &str) -> kube::Result<String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(req).await
}

/// Whether a paged LIST's continue token has expired (410: its revision was compacted away,
/// as etcd's every 5 minutes). A client lists again from the start (client-go's pager falls
/// back to a whole list), so a long paged read at 150,000 pods is not a failure.
fn expired(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 410)
}

/// [`raw_get`] for the read sampler: a 404 (an object of the load deleted or not yet
/// created) is an answer like any other.
async fn sampled_get(client: &Client, path: &str) -> kube::Result<String> {
    match raw_get(client, path).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(String::new()),
        other => other,
    }
}

/// Reads of the kind ClusterLoader2's load makes beside its writes, until `stop`: a LIST of
/// pods in a namespace every 5 s, of nodes every 10 s and of every pod every 30 s; a GET of
/// a node and of a Deployment every 5 s.
async fn sample_reads(
    client: Client,
    rec: Arc<measure::Client>,
    plan: Arc<Vec<Deploy>>,
    nodes: usize,
    stop: CancellationToken,
) {
    let mut tick = 0u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        tick += 1;
        let d = &plan[tick as usize % plan.len()];
        let node = format!("sim-{}", tick as usize % nodes);
        let reads = [
            (
                1,
                ("LIST", "pods", "namespace"),
                format!("/api/v1/namespaces/{}/pods", d.namespace),
            ),
            (
                1,
                ("GET", "nodes", "resource"),
                format!("/api/v1/nodes/{node}"),
            ),
            (
                1,
                ("GET", "deployments", "resource"),
                format!(
                    "/apis/apps/v1/namespaces/{}/deployments/{}",
                    d.namespace, d.name
                ),
            ),
            (2, ("LIST", "nodes", "cluster"), "/api/v1/nodes".to_owned()),
            (6, ("LIST", "pods", "cluster"), "/api/v1/pods".to_owned()),
        ];
        for (every, class, path) in reads {
            if tick.is_multiple_of(every) {
                let _ = rec.time(class, sampled_get(&client, &path)).await;
            }
        }
    }
}

/// Every Deployment settled at its replicas (observed, updated, available) and the watch
/// sees exactly that many pods, all Running; how long it took.
async fn settle(
    client: &Client,
    rec: &measure::Client,
    tracker: &Mutex<Tracker>,
    plan: &[Deploy],
    limit: Duration,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let want: usize = plan.iter().map(|d| d.replicas).sum();
    let replicas: HashMap<(&str, &str), usize> = plan
        .iter()
        .map(|d| ((d.namespace.as_str(), d.name.as_str()), d.replicas))
        .collect();
    let namespaces: Vec<&str> = {
        let mut n: Vec<&str> = plan.iter().map(|d| d.namespace.as_str()).collect();
        n.dedup();
        n
    };
    loop {
        let mut pending = 0;
        for ns in &namespaces {
            let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
            let lp = ListParams::default().labels(&format!("{LOAD_LABEL}=true"));
            let Ok(list) = rec
                .time(("LIST", "deployments", "namespace"), api.list(&lp))
                .await
            else {
                pending += 1;
                continue;
            };
            for d in &list.items {
                let want = replicas
                    .get(&(ns, d.name_any().as_str()))
                    .copied()
                    .unwrap_or(0) as i32;
                let s = d.status.clone().unwrap_or_default();
                let done = s.observed_generation >= d.metadata.generation
                    && s.replicas == Some(want)
                    && s.updated_replicas.unwrap_or(0) == want
                    && s.available_replicas.unwrap_or(0) == want;
                pending += usize::from(!done);
            }
        }
        let (live, running) = tracker.lock().expect("tracker").live();
        if pending == 0 && live == want && running == want {
            return Ok(t0.elapsed());
        }
        anyhow::ensure!(
            t0.elapsed() < limit,
            "not settled after {limit:?}: {pending} Deployments pending, the watch sees {live} pods ({running} Running) of {want}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether the watch's view of the pods (uid → resourceVersion) matches a LIST, once it has
/// caught up (15 s at most); the pods that differ otherwise.
async fn watch_matches_list(
    client: &Client,
    rec: &measure::Client,
    tracker: &Mutex<Tracker>,
) -> anyhow::Result<usize> {
    let t0 = Instant::now();
    loop {
        let listed = list_versions(client, rec).await?;
        let differ = {
            let t = tracker.lock().expect("tracker");
            let seen: HashMap<&str, &str> = t
                .pods
                .iter()
                .map(|(u, p)| (u.as_str(), p.rv.as_str()))
                .collect();
            let mut differ = listed
                .iter()
                .filter(|(u, rv)| seen.get(u.as_str()) != Some(&rv.as_str()))
                .count();
            differ += seen.keys().filter(|u| !listed.contains_key(**u)).count();
            differ
        };
        if differ == 0 || t0.elapsed() > Duration::from_secs(15) {
            return Ok(differ);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// uid → resourceVersion of every pod of the load, by pages of 5,000.
async fn list_versions(
    client: &Client,
    rec: &measure::Client,
) -> anyhow::Result<HashMap<String, String>> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut out = HashMap::new();
    let first = ListParams::default()
        .labels(&format!("{LOAD_LABEL}=true"))
        .limit(5000);
    let (mut lp, mut restarts) = (first.clone(), 0);
    loop {
        let page = match rec
            .time(("LIST", "pods", "cluster"), api.list_metadata(&lp))
            .await
        {
            Err(e) if expired(&e) && restarts < 10 => {
                tracing::info!("pod list's continue token expired; listing again");
                (lp, restarts) = (first.clone(), restarts + 1);
                out.clear();
                continue;
            }
            page => page?,
        };
        for p in &page.items {
            out.insert(
                p.uid().unwrap_or_default(),
                p.resource_version().unwrap_or_default(),
            );
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// How many objects of each kind the cluster stores (cluster-wide LISTs by pages).
async fn count_objects(client: &Client) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut out = BTreeMap::new();
    for (name, path) in [
        ("pods", "/api/v1/pods"),
        ("configmaps", "/api/v1/configmaps"),
        ("secrets", "/api/v1/secrets"),
        ("services", "/api/v1/services"),
        ("nodes", "/api/v1/nodes"),
        // The simulated nodes' Leases only: each start of `minik8s up` adds identity Leases
        // of its own (the apiserver's, as upstream's; the Function replicas').
        (
            "node leases",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        ),
        ("deployments", "/apis/apps/v1/deployments"),
        ("replicasets", "/apis/apps/v1/replicasets"),
        ("endpointslices", "/apis/discovery.k8s.io/v1/endpointslices"),
    ] {
        let (mut n, mut next, mut restarts) = (0, String::new(), 0);
        loop {
            let page = match raw_get(client, &format!("{path}?limit=5000&continue={next}")).await {
                Err(e) if expired(&e) && restarts < 10 => {
                    tracing::info!(
                        kind = name,
                        "count's continue token expired; counting again"
                    );
                    (n, next, restarts) = (0, String::new(), restarts + 1);
                    continue;
                }
                page => page?,
            };
            let page: Value = serde_json::from_str(&page)?;
            n += page["items"].as_array().map_or(0, |items| {
                items
                    .iter()
                    .filter(|o| {
                        name != "node leases"
                            || o["metadata"]["name"]
                                .as_str()
                                .is_some_and(|n| n.starts_with("sim-"))
                    })
                    .count()
            });
            match page["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => next = c.to_owned(),
                _ => break,
            }
        }
        out.insert(name.to_owned(), n);
    }
    Ok(out)
}

/// Bytes of the files under `dir`.
fn folder_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => folder_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Each component's memory and CPU, the cgroup's `memory.current`, the store's size.
fn snapshot(pids: &[(String, u32)], cgroup: Option<&Path>, data: Option<&Path>) -> Value {
    let mut components = serde_json::Map::new();
    for (name, pid) in pids {
        let mut m = memory(*pid);
        m["cpu_s"] = json!(cpu_seconds(*pid));
        components.insert(name.clone(), m);
    }
    let total = |field: &str| {
        let sum: f64 = components.values().filter_map(|m| m[field].as_f64()).sum();
        (sum * 10.0).round() / 10.0
    };
    json!({
        "rss_anon_mib": total("rss_anon_mib"),
        "pss_mib": total("pss_mib"),
        "cgroup_mib": cgroup.map(cgroup_memory_mib),
        "store_mib": data.map(|d| (folder_bytes(d) as f64 / 1048576.0 * 10.0).round() / 10.0),
        "cpu_s": total("cpu_s"),
        "components": components,
    })
}

/// What the server served since `began` (a scrape), which becomes the scrape taken now.
async fn served_since(
    client: &Client,
    began: &mut measure::Scrape,
) -> anyhow::Result<measure::Scrape> {
    let now = scrape(client).await?;
    let served = now.since(began);
    *began = now;
    Ok(served)
}

/// Keeps what the server served in `phase` and tells on stderr that it ended, with its
/// breaches and its pods' start-up: a run of hours that fails later still leaves these.
fn phase_ended(
    served_by_phase: &mut Vec<(&'static str, measure::Scrape)>,
    tracker: &Mutex<Tracker>,
    phase: &'static str,
    served: measure::Scrape,
) {
    let (_, broken) = measure::server_latencies(&served);
    let startup = tracker.lock().expect("tracker").startup_in(phase);
    tracing::info!(phase, %startup, ?broken, "phase ended");
    served_by_phase.push((phase, served));
}

/// The server's `/metrics`.
async fn scrape(client: &Client) -> anyhow::Result<measure::Scrape> {
    Ok(measure::Scrape::parse(&raw_get(client, "/metrics").await?))
}

/// Creates `object` in `ns` (a namespaced resource of the core group or `apps`), timed.
async fn create(
    client: &Client,
    rec: &measure::Client,
    ns: &str,
    resource: &'static str,
    object: Value,
) -> anyhow::Result<()> {
    let group = if resource == "deployments" {
        "/apis/apps/v1"
    } else {
        "/api/v1"
    };
    let path = format!("{group}/namespaces/{ns}/{resource}");
    post(client, rec, &path, ("POST", resource, "namespace"), object).await
}

/// Creates a cluster-scoped `object` (of the core group), timed.
async fn create_cluster(
    client: &Client,
    rec: &measure::Client,
    resource: &'static str,
    object: Value,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/{resource}");
    post(client, rec, &path, ("POST", resource, "cluster"), object).await
}

/// How often a create answered with a 5xx is sent again before the run gives up.
const SERVER_ERROR_RETRIES: u32 = 5;

/// POSTs `object` to `path`, timed as `class`. A 5xx is sent again (a few times, a second
/// apart) so that the run goes on and reports it: the server counts it, and the report lists
/// it as a broken SLO.
async fn post(
    client: &Client,
    rec: &measure::Client,
    path: &str,
    class: (&str, &str, &str),
    object: Value,
) -> anyhow::Result<()> {
    let body = serde_json::to_vec(&object)?;
    let mut tries = 0;
    loop {
        let req = http::Request::post(path)
            .header("content-type", "application/json")
            .body(body.clone())?;
        match rec.time(class, client.request_text(req)).await {
            // A create answered with a 504 after it was stored, sent again.
            Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code >= 500 && tries < SERVER_ERROR_RETRIES => {
                tries += 1;
                tracing::warn!(%path, code = s.code, message = %s.message, "create refused by the server; sending it again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return other.map(drop).map_err(Into::into),
        }
    }
}

/// Runs the load against `plane` and returns the report.
pub async fn run(plane: Plane, opts: Options) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    // Declared before the server: dropped after it, once its process is gone.
    let own_cgroup = match plane {
        Plane::Minik8s { .. } => Cgroup::create(&format!("minik8s-scale-{}", std::process::id())),
        Plane::External(_) => None,
    };
    let mut server = None;
    let mut server_args = Vec::new();
    let (name, kubeconfig, mut pids, cgroup, data) = match plane {
        Plane::Minik8s { binary, args } => {
            // A pod CIDR with a /24 for each of thousands of nodes (the default /16 has 256),
            // apart from the Service range, as upstream's large clusters are given one.
            let mut flags = vec!["--cluster-cidr", POD_CIDR];
            flags.extend(args.iter().map(String::as_str));
            let s = Server::start_in(&binary, dir.path(), own_cgroup.as_ref(), &flags).await?;
            server_args = args;
            let pids = vec![("minik8s".to_owned(), s.pid())];
            let kubeconfig = s.kubeconfig.clone();
            server = Some(s);
            (
                "minik8s".to_owned(),
                kubeconfig,
                pids,
                own_cgroup.as_ref().map(|c| c.path().to_owned()),
                Some(dir.path().to_owned()),
            )
        }
        Plane::External(e) => (e.name, e.kubeconfig, e.pids, e.cgroup, e.data),
    };
    let client = minik8s_kubeconfig::client(&kubeconfig).await?;
    let rec = Arc::new(measure::Client::default());
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let mut violations: Vec<String> = Vec::new();

    // The nodes.
    let t0 = Instant::now();
    let sim = minik8s_controllers::simnodes::SimConfig {
        count: opts.nodes,
        ..Default::default()
    };
    tokio::spawn(minik8s_controllers::simnodes::run(
        client.clone(),
        sim,
        shutdown.clone(),
    ));
    let node_api: Api<Node> = Api::all(client.clone());
    let register_limit = Duration::from_secs(60 + opts.nodes as u64 / 20);
    while node_api
        .list_metadata(&ListParams::default())
        .await?
        .items
        .len()
        < opts.nodes
    {
        anyhow::ensure!(
            t0.elapsed() < register_limit,
            "{} nodes did not register in {register_limit:?}",
            opts.nodes
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let nodes_registered_s = t0.elapsed().as_secs_f64();

    // The namespaces, each with its default ServiceAccount (pods need it).
    for ns in load::namespaces(opts.nodes) {
        create_cluster(&client, &rec, "namespaces", load::namespace(&ns)).await?;
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        let t = Instant::now();
        while sa.get_opt("default").await?.is_none() {
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "no default ServiceAccount in {ns}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let idle = snapshot(&pids, cgroup.as_deref(), data.as_deref());
    let mut before = scrape(&client).await?;
    // What a process killed at the peak had served since `before` (its counters die with it).
    let mut served_before_kill = measure::Scrape::default();

    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let mut plan = load::plan(opts.nodes, opts.pods);
    let measuring = spawn_measuring(
        kubeconfig.clone(),
        tracker.clone(),
        rec.clone(),
        Arc::new(plan.clone()),
        opts.nodes,
        shutdown.clone(),
    )
    .await?;
    let mut phases = serde_json::Map::new();
    let mut watch_differ = serde_json::Map::new();

    // Pod start-up and the calls' latencies are also told by the phase of the load; what the
    // server served in each phase is the difference of scrapes at its ends.
    let enter = |phase: &'static str| {
        tracker.lock().expect("tracker").phase = phase;
        rec.enter(phase);
    };
    let mut phase_began = before.clone();
    let mut served_by_phase: Vec<(&'static str, measure::Scrape)> = Vec::new();

    let mut peak = Value::Null;
    let mut nodes_with_pod_cidr = 0;
    let mut per_configmap = Value::Null;
    let mut restart = Value::Null;
    // The phases run in one block: a plane that cannot hold the load stops it there, and the
    // report still tells where and why, with what was measured until then; so does a run
    // stopped by SIGTERM or Ctrl-C.
    let signalled = minik8s_kubeconfig::process::shutdown_on_signal();
    let load = async {
        // 1. Create, each Deployment when the pods before it are due at the pod rate.
        enter("create");
        let t = Instant::now();
        let due: Vec<Duration> = plan
            .iter()
            .scan(0usize, |before, d| {
                let at = Duration::from_secs_f64(*before as f64 / opts.pod_rate.max(1.0));
                *before += d.replicas;
                Some(at)
            })
            .collect();
        let mut writes = futures::stream::iter(plan.iter().cloned().zip(due))
            .map(|(d, due)| {
                let (client, rec) = (client.clone(), rec.clone());
                async move {
                    tokio::time::sleep_until((t + due).into()).await;
                    create(
                        &client,
                        &rec,
                        &d.namespace,
                        "configmaps",
                        load::config_map(&d),
                    )
                    .await?;
                    create(&client, &rec, &d.namespace, "secrets", load::secret(&d)).await?;
                    if d.service {
                        create(&client, &rec, &d.namespace, "services", load::service(&d)).await?;
                    }
                    create(
                        &client,
                        &rec,
                        &d.namespace,
                        "deployments",
                        load::deployment(&d),
                    )
                    .await
                }
            })
            .buffer_unordered(PARALLEL);
        while let Some(r) = writes.next().await {
            r?;
        }
        drop(writes);
        let settled = settle(&client, &rec, &tracker, &plan, opts.limit).await?;
        phases.insert("create_s".into(), json!(secs(t.elapsed())));
        phases.insert("create_settled_after_writes_s".into(), json!(secs(settled)));
        watch_differ.insert(
            "create".into(),
            json!(watch_matches_list(&client, &rec, &tracker).await?),
        );
        phase_ended(
            &mut served_by_phase,
            &tracker,
            "create",
            served_since(&client, &mut phase_began).await?,
        );
        peak = snapshot(&pids, cgroup.as_deref(), data.as_deref());
        // Every node has its block of the pod CIDR by now (minik8s's node IPAM; upstream's plane
        // here allocates none).
        let pod_cidr = minik8s_controllers::nodeipam::Config::parse(POD_CIDR, 24)
            .map_err(anyhow::Error::msg)?;
        nodes_with_pod_cidr = node_api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.pod_cidr.as_deref())
                    .is_some_and(|b| pod_cidr.contains(b))
            })
            .count();

        // Memory per stored ConfigMap: many more of them, at once.
        per_configmap = if opts.configmaps > 0 {
            enter("configmaps");
            let ns = "load-configmaps";
            create_cluster(&client, &rec, "namespaces", load::namespace(ns)).await?;
            let before_cm = snapshot(&pids, cgroup.as_deref(), data.as_deref());
            let mut writes =
                futures::stream::iter(0..opts.configmaps)
                    .map(|i| {
                        let (client, rec) = (client.clone(), rec.clone());
                        let d = Deploy {
                            namespace: ns.into(),
                            name: format!("cm-{i:06}"),
                            replicas: 0,
                            service: false,
                        };
                        async move {
                            create(&client, &rec, ns, "configmaps", load::config_map(&d)).await
                        }
                    })
                    .buffer_unordered(PARALLEL);
            while let Some(r) = writes.next().await {
                r?;
            }
            drop(writes);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let after_cm = snapshot(&pids, cgroup.as_deref(), data.as_deref());
            let per = |field: &str| {
                let d = after_cm[field].as_f64().unwrap_or(0.0)
                    - before_cm[field].as_f64().unwrap_or(0.0);
                (d * 1048576.0 / opts.configmaps as f64).round()
            };
            phase_ended(
                &mut served_by_phase,
                &tracker,
                "configmaps",
                served_since(&client, &mut phase_began).await?,
            );
            json!({"configmaps": opts.configmaps, "rss_anon_bytes": per("rss_anon_mib"),
                "cgroup_bytes": per("cgroup_mib"), "store_bytes": per("store_mib")})
        } else {
            Value::Null
        };

        // SIGKILL at the peak: it comes back, every node renews its Lease, nothing is lost.
        restart = match (&mut server, opts.kill) {
            (Some(server), true) => {
                enter("restart");
                let counted = count_objects(&client).await?;
                let last = scrape(&client).await?;
                served_before_kill = last.since(&before);
                let restart_before_kill = last.since(&phase_began);
                // The new process counts from zero.
                before = measure::Scrape::default();
                phase_began = measure::Scrape::default();
                let killed_at = jiff::Timestamp::now();
                // Calls refused while it is down are no answers to measure.
                rec.pause(true);
                let answered = server.kill_and_restart(Duration::from_secs(600)).await?;
                rec.pause(false);
                pids = vec![("minik8s".to_owned(), server.pid())];
                let t = Instant::now();
                let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
                let renewed = loop {
                    let n = leases
                        .list(&ListParams::default())
                        .await
                        .map(|l| {
                            l.items
                                .iter()
                                .filter(|l| {
                                    l.name_any().starts_with("sim-")
                                        && l.spec
                                            .as_ref()
                                            .and_then(|s| s.renew_time.as_ref())
                                            .is_some_and(|r| r.0 > killed_at)
                                })
                                .count()
                        })
                        .unwrap_or(0);
                    if n >= opts.nodes || t.elapsed() > Duration::from_secs(120) {
                        break n;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                };
                // Taken here: the recount and the settling below take minutes at 150,000 pods.
                let renewed_after = answered + t.elapsed();
                if renewed < opts.nodes {
                    violations.push(format!(
                        "after the SIGKILL only {renewed} of {} nodes renewed their Lease in 120 s",
                        opts.nodes
                    ));
                }
                let recounted = count_objects(&client).await?;
                for (kind, n) in &counted {
                    // Nothing was created or deleted meanwhile: the Leases were renewed in place.
                    if recounted.get(kind) != Some(n) {
                        violations.push(format!(
                            "after the SIGKILL {kind}: {n} before, {:?} after",
                            recounted.get(kind)
                        ));
                    }
                }
                // Logged now: a long run stopped later still leaves the restart's figures.
                tracing::info!(
                    answered_after_kill_s = secs(answered),
                    all_nodes_renewed_s = secs(renewed_after),
                    nodes_renewed = renewed,
                    objects_before = ?counted,
                    objects_after = ?recounted,
                    "restarted after the SIGKILL"
                );
                settle(&client, &rec, &tracker, &plan, opts.limit).await?;
                let restarted = served_since(&client, &mut phase_began).await?;
                phase_ended(
                    &mut served_by_phase,
                    &tracker,
                    "restart",
                    restart_before_kill.plus(&restarted),
                );
                json!({"answered_after_kill_s": secs(answered),
                    "all_nodes_renewed_s": secs(renewed_after),
                    "nodes_renewed": renewed, "objects_before": counted, "objects_after": recounted})
            }
            _ => Value::Null,
        };

        // 2. Scale every Deployment to between half and one and a half times its size (right
        // after the restart, with `kill`).
        enter("scale");
        let mut rng = load::Lcg::new(53);
        let mut added = 0;
        for d in plan.iter_mut() {
            let was = d.replicas;
            d.replicas = ((d.replicas as f64) * (0.5 + rng.next_f64()))
                .round()
                .max(1.0) as usize;
            added += d.replicas.saturating_sub(was);
        }
        let t = Instant::now();
        let spread = Duration::from_secs_f64(added as f64 / opts.pod_rate.max(1.0));
        patch_all(
            &client,
            &rec,
            &plan,
            spread,
            |d| json!({"spec": {"replicas": d.replicas}}),
        )
        .await?;
        settle(&client, &rec, &tracker, &plan, opts.limit).await?;
        phases.insert("scale_s".into(), json!(secs(t.elapsed())));
        watch_differ.insert(
            "scale".into(),
            json!(watch_matches_list(&client, &rec, &tracker).await?),
        );
        phase_ended(
            &mut served_by_phase,
            &tracker,
            "scale",
            served_since(&client, &mut phase_began).await?,
        );

        // 3. Roll a quarter of them (a new template).
        enter("rolling_update");
        let rolled: Vec<Deploy> = plan.iter().step_by(4).cloned().collect();
        let t = Instant::now();
        let spread = Duration::from_secs_f64(
            rolled.iter().map(|d| d.replicas).sum::<usize>() as f64 / opts.pod_rate.max(1.0),
        );
        patch_all(&client, &rec, &rolled, spread, |_| {
            json!({"spec": {"template": {"metadata": {"annotations": {"scale.minik8s.io/rollout": "2"}}}}})
        })
        .await?;
        settle(&client, &rec, &tracker, &plan, opts.limit).await?;
        phases.insert("rolling_update_s".into(), json!(secs(t.elapsed())));
        watch_differ.insert(
            "rolling_update".into(),
            json!(watch_matches_list(&client, &rec, &tracker).await?),
        );
        phase_ended(
            &mut served_by_phase,
            &tracker,
            "rolling_update",
            served_since(&client, &mut phase_began).await?,
        );

        // 4. Delete it all.
        enter("delete");
        let t = Instant::now();
        let mut deletes = futures::stream::iter(plan.iter().cloned())
            .map(|d| {
                let (client, rec) = (client.clone(), rec.clone());
                async move {
                    let dp = DeleteParams::background();
                    let api: Api<Deployment> = Api::namespaced(client.clone(), &d.namespace);
                    rec.time(
                        ("DELETE", "deployments", "resource"),
                        api.delete(&d.name, &dp),
                    )
                    .await?;
                    if d.service {
                        let api: Api<k8s_openapi::api::core::v1::Service> =
                            Api::namespaced(client.clone(), &d.namespace);
                        rec.time(("DELETE", "services", "resource"), api.delete(&d.name, &dp))
                            .await?;
                    }
                    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
                        Api::namespaced(client.clone(), &d.namespace);
                    rec.time(
                        ("DELETE", "configmaps", "resource"),
                        api.delete(&d.name, &dp),
                    )
                    .await?;
                    let api: Api<k8s_openapi::api::core::v1::Secret> =
                        Api::namespaced(client.clone(), &d.namespace);
                    rec.time(("DELETE", "secrets", "resource"), api.delete(&d.name, &dp))
                        .await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(PARALLEL);
        while let Some(r) = deletes.next().await {
            r?;
        }
        drop(deletes);
        loop {
            let n = tracker.lock().expect("tracker").pods.len();
            if n == 0 {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < opts.limit,
                "{n} pods left after {:?}",
                opts.limit
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        phases.insert("delete_s".into(), json!(secs(t.elapsed())));
        watch_differ.insert(
            "delete".into(),
            json!(watch_matches_list(&client, &rec, &tracker).await?),
        );
        phase_ended(
            &mut served_by_phase,
            &tracker,
            "delete",
            served_since(&client, &mut phase_began).await?,
        );
        anyhow::Ok(())
    };
    let ran = tokio::select! {
        ran = load => ran,
        _ = signalled.cancelled() => Err(anyhow::anyhow!("stopped by SIGTERM or Ctrl-C")),
    };
    let stopped = match ran {
        Ok(()) => Value::Null,
        Err(e) => {
            let phase = tracker.lock().expect("tracker").phase;
            let error = format!("{e:#}");
            tracing::warn!(phase, %error, "the load stopped short");
            if !served_by_phase.iter().any(|(p, _)| *p == phase)
                && let Ok(served) = served_since(&client, &mut phase_began).await
            {
                phase_ended(&mut served_by_phase, &tracker, phase, served);
            }
            violations.push(format!("the load stopped in its {phase} phase: {error}"));
            json!({"phase": phase, "error": error, "after_s": secs(t0.elapsed())})
        }
    };

    // The figures.
    let end = snapshot(&pids, cgroup.as_deref(), data.as_deref());
    let diff = match scrape(&client).await {
        Ok(after) => after.since(&before).plus(&served_before_kill),
        Err(e) => {
            // A plane that died: what it served is known up to the last phase's end.
            violations.push(format!(
                "the server's metrics could not be read at the end: {e:#}"
            ));
            served_by_phase
                .iter()
                .fold(measure::Scrape::default(), |all, (_, s)| all.plus(s))
        }
    };
    shutdown.cancel();
    let _ = tokio::task::spawn_blocking(move || measuring.join()).await;
    let (server_rows, broken) = measure::server_latencies(&diff);
    violations.extend(broken);
    let client_rows = rec.report();
    violations.extend(measure::client_broken(&client_rows));
    let server_errors = diff.server_errors();
    if !server_errors.is_empty() {
        violations.push(format!("5xx answers: {server_errors:?}"));
    }
    let client_errors = rec.errors();
    if !client_errors.is_empty() {
        violations.push(format!("the harness's own calls failed: {client_errors:?}"));
    }
    for (phase, n) in &watch_differ {
        if n.as_u64() != Some(0) {
            violations.push(format!(
                "after {phase}, {n} pods differ between the watch and a LIST"
            ));
        }
    }
    let (startup, relists, events) = {
        let mut t = tracker.lock().expect("tracker");
        let relists = t.relists;
        let events = t.events;
        let n = t.startup.len();
        let s = percentiles(&mut t.startup);
        let r = percentiles(&mut t.scheduled_to_running);
        let Tracker {
            startup_by_phase,
            bound_by_phase,
            ..
        } = &mut *t;
        let by_phase: serde_json::Map<String, Value> = startup_by_phase
            .iter_mut()
            .map(|(phase, d)| {
                let n = d.len();
                let bound = bound_by_phase.get_mut(phase).map(|b| percentiles(b));
                (
                    (*phase).to_owned(),
                    json!({"pods": n, "first_seen_to_running": percentiles(d),
                           "first_seen_to_bound": bound}),
                )
            })
            .collect();
        (
            json!({"pods": n, "first_seen_to_running": s, "bound_to_running": r,
                   "by_phase": by_phase}),
            relists,
            events,
        )
    };
    if startup["first_seen_to_running"]["p99_ms"]
        .as_f64()
        .unwrap_or(0.0)
        > 5000.0
    {
        violations.push(format!(
            "pod start-up p99 {} ms > 5 s",
            startup["first_seen_to_running"]["p99_ms"]
        ));
    }
    // Known only when the load reached its peak.
    let per_pod = peak["rss_anon_mib"].as_f64().map(|p| {
        let d = p - idle["rss_anon_mib"].as_f64().unwrap_or(0.0);
        (d * 1048576.0 / opts.pods.max(1) as f64).round()
    });
    // Each phase alone against the SLOs (the run is judged whole, above): where it broke.
    let mut client_by_phase = rec.report_by_phase();
    let by_phase: serde_json::Map<String, Value> = served_by_phase
        .iter()
        .map(|(phase, served)| {
            let (rows, mut broken) = measure::server_latencies(served);
            let client = client_by_phase.remove(phase).unwrap_or_default();
            broken.extend(measure::client_broken(&client));
            (
                (*phase).to_owned(),
                json!({"slos_broken": broken, "server_worst": measure::worst(&rows),
                       "client_worst": measure::worst(&client),
                       "scheduler": served.scheduler()}),
            )
        })
        .collect();
    drop(server);
    Ok(json!({
        "plane": name,
        "server_args": server_args,
        "nodes": opts.nodes,
        "pods": opts.pods,
        "deployments": load::plan(opts.nodes, opts.pods).len(),
        "nodes_registered_s": (nodes_registered_s * 1000.0).round() / 1000.0,
        "nodes_with_pod_cidr": nodes_with_pod_cidr,
        "phases": phases,
        "slo_violations": violations,
        "stopped": stopped,
        "by_phase": by_phase,
        "pod_startup": startup,
        "server_latency": server_rows,
        "scheduler": diff.scheduler(),
        "client_latency": client_rows,
        "client_slow_calls": rec.slow(),
        "watch": {"events": events, "relists": relists, "pods_differing_from_a_list": watch_differ},
        "memory": {"idle_with_nodes": idle, "peak": peak, "end": end},
        "rss_anon_bytes_per_pod_with_its_objects": per_pod,
        "per_configmap": per_configmap,
        "restart": restart,
    }))
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Merge-patches each Deployment of `plan` with `patch(d)`, timed, evenly over `spread`
/// (the pods they make, at the pod rate).
async fn patch_all(
    client: &Client,
    rec: &Arc<measure::Client>,
    plan: &[Deploy],
    spread: Duration,
    patch: impl Fn(&Deploy) -> Value,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let step = spread / plan.len().max(1) as u32;
    let mut writes = futures::stream::iter(
        plan.iter()
            .enumerate()
            .map(|(i, d)| (i, d.clone(), patch(d))),
    )
    .map(|(i, d, body)| {
        let (client, rec) = (client.clone(), rec.clone());
        async move {
            tokio::time::sleep_until((t + step * i as u32).into()).await;
            let api: Api<Deployment> = Api::namespaced(client, &d.namespace);
            rec.time(
                ("PATCH", "deployments", "resource"),
                api.patch(&d.name, &PatchParams::default(), &Patch::Merge(&body)),
            )
            .await?;
            anyhow::Ok(())
        }
    })
    .buffer_unordered(PARALLEL);
    while let Some(r) = writes.next().await {
        r?;
    }
    Ok(())
}

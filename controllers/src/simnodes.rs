//! Simulated nodes, for scale tests and controller tests only (like kwok): registers N
//! Nodes, renews their Leases, and plays kubelet for pods bound to them without running
//! anything — pods become Running and Ready at once; pods with `restartPolicy` Never or
//! OnFailure succeed after a second (exit code from the `minik8s.io/sim-exit-code`
//! annotation, default 0; a comma list gives an Indexed Job's pods the code at their
//! completion index); deleted pods are removed at once. Functional tests of the real
//! kubelet never use this.

use crate::Result;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Label every simulated node carries.
pub const SIM_LABEL: &str = "minik8s.io/simulated";

/// Field manager of the simulated kubelet.
const MANAGER: &str = "minik8s-sim-kubelet";

/// What the simulated nodes look like.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Name prefix: nodes are `<prefix>-0` … `<prefix>-<n-1>`.
    pub prefix: String,
    /// How many.
    pub count: usize,
    /// Allocatable cpu per node.
    pub cpu: String,
    /// Allocatable memory per node.
    pub memory: String,
    /// Allocatable pods per node.
    pub pods: u32,
    /// How often each node reports its status (its Lease is renewed every 10 s).
    pub status_every: Duration,
}

/// How often each node's Lease is renewed (the kubelet's default).
const LEASE_EVERY: Duration = Duration::from_secs(10);

/// How soon a refused or failed renewal is tried again.
const RETRY_LEASE: Duration = Duration::from_secs(1);

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            prefix: "sim".into(),
            count: 2,
            cpu: "4".into(),
            memory: "8Gi".into(),
            pods: 110,
            status_every: Duration::from_secs(60),
        }
    }
}

fn now() -> String {
    crate::util::rfc3339(jiff::Timestamp::now())
}

fn micro_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string()
}

fn node_names(cfg: &SimConfig) -> Vec<String> {
    (0..cfg.count)
        .map(|i| format!("{}-{i}", cfg.prefix))
        .collect()
}

/// How many of the nodes' registration, status and Lease writes are in flight at once.
const PARALLEL: usize = 16;

/// How many of the running nodes' writes (Lease renewals, heartbeats, pod status) are in
/// flight at once. Real kubelets each have their own connection; these share one process and
/// its open-file limit, and an HTTP/1.1 client opens a connection for every request in
/// flight. A write waiting here waits in the simulation, not in the server.
const IN_FLIGHT: usize = 512;

/// A node's status as a kubelet reports it: capacity, addresses, the Ready condition (ready
/// since `since`, last heard from now) and what it runs.
fn node_status(cfg: &SimConfig, i: usize, name: &str, since: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {
            "capacity": {"cpu": cfg.cpu, "memory": cfg.memory, "pods": cfg.pods.to_string()},
            "allocatable": {"cpu": cfg.cpu, "memory": cfg.memory, "pods": cfg.pods.to_string()},
            "addresses": [{"type": "InternalIP", "address": format!("10.255.{}.{}", i / 250, i % 250 + 1)},
                          {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "simulated node is ready", "lastHeartbeatTime": now(), "lastTransitionTime": since}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-minik8s-sim", "containerRuntimeVersion": "sim://0",
                "kernelVersion": "", "osImage": "simulated", "operatingSystem": "linux", "architecture": "amd64",
                "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": ""},
        },
    })
}

/// Runs `write` for every node, [`PARALLEL`] at a time; the first error.
async fn each_node<F, Fut>(cfg: &SimConfig, write: F) -> Result<()>
where
    F: Fn(usize, String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut writes = futures::stream::iter(node_names(cfg).into_iter().enumerate())
        .map(|(i, name)| write(i, name))
        .buffer_unordered(PARALLEL);
    let mut first = Ok(());
    while let Some(r) = writes.next().await {
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// Creates or refreshes the nodes, their status and their Leases; the Leases as written.
async fn register(
    client: &Client,
    cfg: &SimConfig,
    since: &str,
) -> Result<std::collections::HashMap<String, Lease>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    each_node(cfg, |_, name| {
        let (nodes, pp) = (&nodes, &pp);
        async move {
            let node = json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", SIM_LABEL: "true"}},
                "spec": {},
            });
            nodes.patch(&name, pp, &Patch::Apply(&node)).await?;
            Ok(())
        }
    })
    .await?;
    report_status(client, cfg, since).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let written = std::sync::Mutex::new(std::collections::HashMap::new());
    each_node(cfg, |_, name| {
        let (leases, written) = (&leases, &written);
        async move {
            let mut last = None;
            renew(leases, &name, &mut last).await?;
            if let Some(lease) = last {
                written.lock().expect("leases").insert(name, lease);
            }
            Ok(())
        }
    })
    .await?;
    Ok(written.into_inner().expect("leases"))
}

/// Writes every node's whole status (when the nodes register).
async fn report_status(client: &Client, cfg: &SimConfig, since: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    each_node(cfg, |i, name| {
        let (nodes, pp) = (&nodes, &pp);
        async move {
            let status = node_status(cfg, i, &name, since);
            nodes
                .patch_status(&name, pp, &Patch::Apply(&status))
                .await?;
            Ok(())
        }
    })
    .await
}

/// One node's heartbeat when nothing else changed: a strategic merge patch of its status
/// whose only change is the Ready condition's `lastHeartbeatTime` (upstream's kubelet
/// patches the difference it computes).
async fn heartbeat(nodes: &Api<Node>, name: &str) -> Result<()> {
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "lastHeartbeatTime": now()}]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}

/// Renews one node's Lease as upstream's kubelet does (component-helpers' lease
/// controller): a PUT of the last Lease it wrote with a new `renewTime`, and the Lease
/// written whole when there is none yet or the PUT is refused (it changed or went away).
async fn renew(leases: &Api<Lease>, name: &str, last: &mut Option<Lease>) -> Result<()> {
    if let Some(mut lease) = last.take() {
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        }
        match leases.replace(name, &PostParams::default(), &lease).await {
            Ok(lease) => {
                *last = Some(lease);
                return Ok(());
            }
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {}
            Err(e) => {
                // The same Lease is tried again next time.
                *last = Some(lease);
                return Err(e.into());
            }
        }
    }
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_now()},
    });
    let pp = PatchParams::apply(MANAGER).force();
    *last = Some(leases.patch(name, &pp, &Patch::Apply(&lease)).await?);
    Ok(())
}

/// One node's kubelet heartbeats, each on its own clock as every kubelet keeps its own: the
/// Lease renewed [`LEASE_EVERY`] after the last renewal ended, the status every
/// `status_every`, starting at `offset` so that the nodes' writes spread over the period.
async fn beat(
    client: Client,
    writes: Arc<tokio::sync::Semaphore>,
    cfg: Arc<SimConfig>,
    (name, mut last): (String, Option<Lease>),
    offset: Duration,
    shutdown: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client);
    let mut renewed = tokio::time::Instant::now();
    let mut next_lease = renewed + offset;
    let mut next_status = next_lease + cfg.status_every;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(next_lease.min(next_status)) => {}
        }
        let now = tokio::time::Instant::now();
        let _permit = writes.acquire().await.ok();
        if now >= next_lease {
            // A kubelet tries a refused renewal again at once a few times (upstream's
            // `retryUpdateLease`); here a second later, then its period again.
            let retry = match renew(&leases, &name, &mut last).await {
                Ok(()) => {
                    renewed = tokio::time::Instant::now();
                    false
                }
                // As long as the next try is in time for the grace period, only debug.
                Err(e) if renewed.elapsed() < 2 * LEASE_EVERY => {
                    tracing::debug!(node = %name, error = %e, "renewing simulated node lease");
                    true
                }
                Err(e) => {
                    tracing::warn!(node = %name, error = %e,
                        since_renewed = ?renewed.elapsed(), "renewing simulated node lease");
                    true
                }
            };
            next_lease =
                tokio::time::Instant::now() + if retry { RETRY_LEASE } else { LEASE_EVERY };
        }
        if now >= next_status {
            if let Err(e) = heartbeat(&nodes, &name).await {
                tracing::warn!(node = %name, error = %e, "reporting simulated node status");
            }
            // From now, as the Lease: a late heartbeat is not followed by a burst of others.
            next_status = tokio::time::Instant::now() + cfg.status_every;
        }
    }
}

struct Sim {
    client: Client,
    /// [`IN_FLIGHT`] permits, shared with the heartbeats.
    writes: Arc<tokio::sync::Semaphore>,
}

async fn reconcile(pod: Arc<Pod>, sim: Arc<Sim>) -> Result<Action> {
    // Each node's kubelet watches only its own pods: one without a node is not yet anyone's.
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_none()
    {
        return Ok(Action::await_change());
    }
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(sim.client.clone(), &ns);
    let _permit = sim.writes.acquire().await.ok();
    if pod.metadata.deletion_timestamp.is_some() {
        match api
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if matches!(s.code, 404) => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    let phase = crate::util::phase(&pod).to_owned();
    let restart = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    let containers: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
        .collect();
    let image = |c: &str| {
        pod.spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .find(|x| x.name == c)
            .and_then(|x| x.image.clone())
            .unwrap_or_default()
    };
    let status = match phase.as_str() {
        "Pending" => {
            let uid = pod.uid().unwrap_or_default();
            let ip = format!(
                "10.254.{}.{}",
                uid.as_bytes().first().copied().unwrap_or(0),
                uid.as_bytes().get(1).copied().unwrap_or(1)
            );
            let statuses: Vec<_> = containers
                .iter()
                .map(|c| json!({"name": c, "image": image(c), "imageID": "", "ready": true, "started": true,
                    "restartCount": 0, "containerID": format!("sim://{uid}-{c}"),
                    "state": {"running": {"startedAt": now()}}}))
                .collect();
            json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.255.0.1",
                "startTime": now(), "containerStatuses": statuses,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now()},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": now()},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now()}]})
        }
        "Running" if restart != "Always" => {
            // One code, or a list of codes picked by the pod's Job completion index.
            let index: usize = pod
                .annotations()
                .get("batch.kubernetes.io/job-completion-index")
                .and_then(|i| i.parse().ok())
                .unwrap_or(0);
            let code: i32 = pod
                .annotations()
                .get("minik8s.io/sim-exit-code")
                .and_then(|c| {
                    let codes: Vec<&str> = c.split(',').map(str::trim).collect();
                    codes.get(index).or(codes.last())?.parse().ok()
                })
                .unwrap_or(0);
            let started = pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0);
            if let Some(t) = started {
                let ran = jiff::Timestamp::now().duration_since(t);
                if ran < jiff::SignedDuration::from_secs(1) {
                    return Ok(Action::requeue(
                        Duration::from_millis(1100) - Duration::try_from(ran).unwrap_or_default(),
                    ));
                }
            }
            let phase = if code == 0 { "Succeeded" } else { "Failed" };
            let statuses: Vec<_> = containers
                .iter()
                .map(|c| json!({"name": c, "image": image(c), "imageID": "", "ready": false, "started": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": code,
                    "reason": if code == 0 { "Completed" } else { "Error" }, "finishedAt": now()}}}))
                .collect();
            json!({"phase": phase, "containerStatuses": statuses,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now()},
                    {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now()},
                    {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now()}]})
        }
        _ => return Ok(Action::await_change()),
    };
    match api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if matches!(s.code, 404) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Pod>, e: &crate::Error, _: Arc<Sim>) -> Action {
    tracing::debug!(error = %e, "simulated kubelet retrying");
    Action::requeue(Duration::from_millis(500))
}

/// Registers the nodes, then renews their Leases every 10 s and reports their status every
/// `status_every` (as kubelets do), and plays kubelet for each node until `shutdown`.
pub async fn run(client: Client, cfg: SimConfig, shutdown: CancellationToken) -> Result<()> {
    let mut written = register(&client, &cfg, &now()).await?;
    let writes = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let sim = Arc::new(Sim {
        client: client.clone(),
        writes: writes.clone(),
    });
    let cfg = Arc::new(cfg);
    let mut beats = tokio::task::JoinSet::new();
    for (i, name) in node_names(&cfg).into_iter().enumerate() {
        let offset = LEASE_EVERY.mul_f64(i as f64 / cfg.count.max(1) as f64);
        let last = written.remove(&name);
        beats.spawn(beat(
            client.clone(),
            writes.clone(),
            cfg.clone(),
            (name, last),
            offset,
            shutdown.clone(),
        ));
    }
    let heartbeats = async move { while beats.join_next().await.is_some() {} };
    // One kubelet a node, each watching its own node's pods as a kubelet does
    // (`fieldSelector=spec.nodeName=<node>`): the API sees one pod watch a node.
    let mut kubelets = tokio::task::JoinSet::new();
    for node in node_names(&cfg) {
        let pods: Api<Pod> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let shutdown = shutdown.clone();
        let kubelet = Controller::new(pods, config)
            .graceful_shutdown_on(async move { shutdown.cancelled().await })
            .run(reconcile, error_policy, sim.clone())
            .for_each(|_| async {});
        kubelets.spawn(kubelet);
    }
    let kubelets = async move { while kubelets.join_next().await.is_some() {} };
    tokio::join!(heartbeats, kubelets);
    Ok(())
}

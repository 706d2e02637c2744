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

/// Creates or refreshes the nodes and their Leases; the Leases as written.
async fn register(client: &Client, cfg: &SimConfig, since: &str) -> Result<Leases> {
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
    let leases = Leases::default();
    leases.renew(client, cfg).await?;
    Ok(leases)
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

/// The heartbeat a kubelet sends every `status_every` when nothing else changed: a
/// strategic merge patch of its status whose only change is the Ready condition's
/// `lastHeartbeatTime` (upstream's kubelet patches the difference it computes).
async fn heartbeat(client: &Client, cfg: &SimConfig) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::default();
    each_node(cfg, |_, name| {
        let (nodes, pp) = (&nodes, &pp);
        async move {
            let patch = json!({"status": {"conditions": [
                {"type": "Ready", "lastHeartbeatTime": now()}]}});
            nodes
                .patch_status(&name, pp, &Patch::Strategic(&patch))
                .await?;
            Ok(())
        }
    })
    .await
}

/// The nodes' Leases as last written, renewed as upstream's kubelet renews its own
/// (component-helpers' lease controller): a PUT of the last Lease with a new `renewTime`,
/// and, when that is refused (the Lease changed or went away), the Lease written whole again.
#[derive(Default)]
struct Leases {
    latest: std::sync::Mutex<std::collections::HashMap<String, Lease>>,
}

impl Leases {
    /// Renews every node's Lease in `kube-node-lease`.
    async fn renew(&self, client: &Client, cfg: &SimConfig) -> Result<()> {
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        each_node(cfg, |_, name| {
            let leases = &leases;
            async move {
                let last = self.latest.lock().expect("leases").get(&name).cloned();
                let renewed = match last {
                    Some(mut lease) => {
                        if let Some(spec) = lease.spec.as_mut() {
                            spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
                        }
                        match leases.replace(&name, &PostParams::default(), &lease).await {
                            Ok(lease) => Some(lease),
                            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => None,
                            Err(e) => return Err(e.into()),
                        }
                    }
                    None => None,
                };
                let lease = match renewed {
                    Some(lease) => lease,
                    None => {
                        let lease = json!({
                            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                            "metadata": {"name": name, "namespace": "kube-node-lease"},
                            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                                "renewTime": micro_now()},
                        });
                        let pp = PatchParams::apply(MANAGER).force();
                        leases.patch(&name, &pp, &Patch::Apply(&lease)).await?
                    }
                };
                self.latest.lock().expect("leases").insert(name, lease);
                Ok(())
            }
        })
        .await
    }
}

struct Sim {
    client: Client,
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
    let leases = register(&client, &cfg, &now()).await?;
    let sim = Arc::new(Sim {
        client: client.clone(),
    });
    let renewer = {
        let client = client.clone();
        let cfg = cfg.clone();
        let shutdown = shutdown.clone();
        async move {
            let mut reported = std::time::Instant::now();
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(LEASE_EVERY) => {}
                }
                if let Err(e) = leases.renew(&client, &cfg).await {
                    tracing::warn!(error = %e, "renewing simulated node leases");
                }
                if reported.elapsed() >= cfg.status_every {
                    reported = std::time::Instant::now();
                    if let Err(e) = heartbeat(&client, &cfg).await {
                        tracing::warn!(error = %e, "reporting simulated node status");
                    }
                }
            }
        }
    };
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
    tokio::join!(renewer, kubelets);
    Ok(())
}

//! The kubelet's Node: registration with the machine's real capacity, addresses and runtime
//! version, then a heartbeat (Lease renewal and Ready condition) every 10 s.

use crate::cri::Cri;
use crate::error::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::path::Path;

/// Field manager of the kubelet's writes.
pub const MANAGER: &str = "minik8s-kubelet";
/// The kubelet version it reports.
pub const VERSION: &str = "v1.33.0-minik8s";
/// Pods per node, as upstream's default `maxPods`.
pub const MAX_PODS: u32 = 110;

/// What the node reports about itself.
#[derive(Clone, Debug)]
pub struct Facts {
    /// Node name.
    pub name: String,
    /// InternalIP.
    pub ip: String,
    /// The node's pod subnet.
    pub pod_cidr: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory in bytes.
    pub memory: u64,
    /// Size of the filesystem holding the node's data, in bytes.
    pub ephemeral_storage: u64,
    /// `containerd://1.6.20~ds1`.
    pub runtime: String,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The machine's CPUs.
pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Total memory from `/proc/meminfo`, in bytes.
pub(crate) fn memory() -> u64 {
    read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Size of the filesystem under `dir` (from `df`), in bytes.
async fn disk(dir: &Path) -> u64 {
    let out = tokio::process::Command::new("df")
        .args(["-B1", "--output=size"])
        .arg(dir)
        .output()
        .await;
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().nth(1)?.trim().parse().ok())
        .unwrap_or(0)
}

/// The source address of the default route (the node's InternalIP).
pub async fn default_ip() -> String {
    let out = tokio::process::Command::new("ip")
        .args(["-4", "route", "get", "1.1.1.1"])
        .output()
        .await;
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            let mut words = s.split_whitespace();
            words.find(|w| *w == "src")?;
            words.next().map(str::to_owned)
        })
        .unwrap_or_else(|| "127.0.0.1".into())
}

impl Facts {
    /// Reads the machine's facts.
    pub async fn gather(
        name: &str,
        ip: Option<String>,
        pod_cidr: &str,
        dir: &Path,
        cri: &Cri,
    ) -> Result<Self> {
        let v = cri.version().await?;
        Ok(Facts {
            name: name.to_owned(),
            ip: match ip {
                Some(ip) => ip,
                None => default_ip().await,
            },
            pod_cidr: pod_cidr.to_owned(),
            cpus: cpus(),
            memory: memory(),
            ephemeral_storage: disk(dir).await,
            runtime: format!("{}://{}", v.runtime_name, v.runtime_version),
        })
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The node's conditions now: each keeps its `lastTransitionTime` from `before` while its
/// status stays the same.
/// `problem` is what keeps the runtime from being ready (`None`: the node is ready).
pub fn conditions(problem: Option<&str>, before: &[NodeCondition]) -> serde_json::Value {
    let ready = problem.is_none();
    let t = now();
    let since = |kind: &str, status: &str| {
        before
            .iter()
            .find(|c| c.type_ == kind && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .and_then(|lt| serde_json::to_value(lt).ok())
            .unwrap_or_else(|| json!(t))
    };
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": t, "lastTransitionTime": since(kind, status)})
    };
    let ready_status = if ready { "True" } else { "False" };
    json!([
        condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available"
        ),
        condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure"
        ),
        condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available"
        ),
        condition(
            "Ready",
            ready_status,
            if ready {
                "KubeletReady"
            } else {
                "KubeletNotReady"
            },
            problem.unwrap_or("kubelet is posting ready status")
        ),
    ])
}

/// The node's conditions as the API has them (none if it cannot say).
async fn current_conditions(nodes: &Api<Node>, name: &str) -> Vec<NodeCondition> {
    nodes
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.status)
        .and_then(|s| s.conditions)
        .unwrap_or_default()
}

/// The node's pod CIDR as the node IPAM controller assigns it: registers the Node (without
/// one) if it is not there yet, then waits until `spec.podCIDR` is set (or `shutdown`).
pub async fn await_pod_cidr(
    client: &Client,
    name: &str,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<Option<String>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64"}},
    });
    nodes.patch(name, &pp, &Patch::Apply(&node)).await?;
    let started = std::time::Instant::now();
    let mut told = false;
    loop {
        if let Some(cidr) = nodes
            .get_opt(name)
            .await?
            .and_then(|n| n.spec?.pod_cidr)
            .filter(|c| !c.is_empty())
        {
            return Ok(Some(cidr));
        }
        if !told && started.elapsed() > std::time::Duration::from_secs(10) {
            tracing::warn!(
                node = name,
                "still waiting for the node's pod CIDR (is the nodeipam controller running?)"
            );
            told = true;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
}

/// Creates or refreshes the Node object and its status (`port`: the kubelet server's).
pub async fn register(client: &Client, f: &Facts, port: u16) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f.name, "labels": {
            "kubernetes.io/hostname": f.name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64"}},
        "spec": {"podCIDR": f.pod_cidr, "podCIDRs": [f.pod_cidr]},
    });
    nodes.patch(&f.name, &pp, &Patch::Apply(&node)).await?;
    let resources = json!({
        "cpu": f.cpus.to_string(),
        "memory": format!("{}Ki", f.memory / 1024),
        "pods": MAX_PODS.to_string(),
        "ephemeral-storage": format!("{}Ki", f.ephemeral_storage / 1024),
    });
    let info = |p: &str| read(p);
    let os_image = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|s| s.trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".into());
    let before = current_conditions(&nodes, &f.name).await;
    let status = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": f.name},
        "status": {
            "capacity": resources, "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": f.ip}, {"type": "Hostname", "address": f.name}],
            "conditions": conditions(None, &before),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "nodeInfo": {"kubeletVersion": VERSION, "containerRuntimeVersion": f.runtime,
                "kernelVersion": info("/proc/sys/kernel/osrelease"), "osImage": os_image,
                "operatingSystem": "linux", "architecture": "amd64",
                "machineID": info("/etc/machine-id"), "systemUUID": info("/etc/machine-id"),
                "bootID": info("/proc/sys/kernel/random/boot_id"), "kubeProxyVersion": ""},
        },
    });
    nodes
        .patch_status(&f.name, &pp, &Patch::Apply(&status))
        .await?;
    Ok(())
}

/// Whether a resource name is an extended resource (upstream's `IsExtendedResourceName`):
/// domain-qualified outside `kubernetes.io`, and not a quota `requests.` name.
fn is_extended(name: &str) -> bool {
    name.contains('/')
        && !name.starts_with("requests.")
        && !name.split_once('/').is_some_and(|(domain, _)| {
            domain == "kubernetes.io" || domain.ends_with(".kubernetes.io")
        })
}

/// The allocatable patch that follows the node's capacity for extended resources, as
/// upstream's kubelet does on every status update: a resource someone advertised by patching
/// `status.capacity` becomes allocatable, and one removed from capacity leaves allocatable.
/// `None` when allocatable already agrees.
fn extended_allocatable(node: &Node) -> Option<serde_json::Value> {
    let status = node.status.as_ref()?;
    let capacity = status.capacity.clone().unwrap_or_default();
    let allocatable = status.allocatable.clone().unwrap_or_default();
    let mut patch = serde_json::Map::new();
    for (k, q) in capacity.iter().filter(|(k, _)| is_extended(k)) {
        if allocatable.get(k) != Some(q) {
            patch.insert(k.clone(), json!(q.0));
        }
    }
    for k in allocatable.keys().filter(|k| is_extended(k)) {
        if !capacity.contains_key(k) {
            patch.insert(k.clone(), serde_json::Value::Null);
        }
    }
    (!patch.is_empty()).then_some(serde_json::Value::Object(patch))
}

/// Renews the node's Lease and its Ready heartbeat; `problem` is what keeps the runtime from
/// being ready (`None`: ready).
pub async fn heartbeat(client: &Client, name: &str, problem: Option<&str>) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let pp = PatchParams::apply(MANAGER).force();
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                 "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()},
    });
    leases.patch(name, &pp, &Patch::Apply(&lease)).await?;
    // A strategic merge: the conditions merge by type, and the rest of the status that
    // `register` applied stays owned by the kubelet.
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get_opt(name).await.ok().flatten();
    let before = current
        .as_ref()
        .and_then(|n| n.status.as_ref()?.conditions.clone())
        .unwrap_or_default();
    let mut status = json!({"status": {"conditions": conditions(problem, &before)}});
    if let Some(allocatable) = current.as_ref().and_then(extended_allocatable) {
        status["status"]["allocatable"] = allocatable;
    }
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&status))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn extended_resources_in_capacity_become_allocatable() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {
            "capacity": {"cpu": "2", "scheduling.k8s.io/foo": "3", "example.com/dongle": "1"},
            "allocatable": {"cpu": "2", "example.com/dongle": "1", "example.com/gone": "4"}}}))
        .unwrap();
        assert_eq!(
            extended_allocatable(&node),
            Some(json!({"scheduling.k8s.io/foo": "3", "example.com/gone": null}))
        );
        assert!(is_extended("nvidia.com/gpu"));
        assert!(!is_extended("cpu"));
        assert!(!is_extended("kubernetes.io/something"));
        assert!(!is_extended("requests.example.com/x"));
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let then: Time = serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap();
        let before = vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_transition_time: Some(then),
            ..Default::default()
        }];
        let ready = |v: &serde_json::Value| {
            v.as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == "Ready")
                .unwrap()
                .clone()
        };
        let still = ready(&conditions(None, &before));
        assert_eq!(still["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_ne!(still["lastHeartbeatTime"], "2026-01-01T00:00:00Z");
        let flipped = ready(&conditions(Some("container runtime is down"), &before));
        assert_ne!(flipped["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(flipped["status"], "False");
        assert_eq!(flipped["message"], "container runtime is down");
    }
}

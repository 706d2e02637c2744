//! `/stats/summary`: the node's and its pods' CPU and memory in upstream's Summary format
//! (the fields `metrics.k8s.io` needs). Container figures come from the CRI
//! (`ListContainerStats`), each with the time the runtime sampled it and the container's start;
//! the node's from `/proc` (CPU as the rate since the previous call). The cumulative CPU
//! (`usageCoreNanoSeconds`) is what the apiserver's metrics turn into rates over a known window.

use crate::cri::{Cri, labels};
use crate::error::Result;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Instant;

/// The previous `/proc/stat` reading, for the node's CPU rate.
#[derive(Debug, Default)]
pub struct NodeCpu {
    last: Mutex<Option<(Instant, u64)>>,
}

/// Busy CPU time of the whole machine so far, in nanoseconds (user + nice + system + irq + softirq + steal).
fn busy_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let busy: u64 = [0usize, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|i| ticks.get(*i))
        .sum();
    // USER_HZ is 100 on Linux.
    busy * 10_000_000
}

impl NodeCpu {
    /// Nano-cores used since the last call (0 on the first).
    pub fn rate(&self) -> (u64, u64) {
        let now = Instant::now();
        let busy = busy_ns();
        let mut last = self.last.lock().expect("cpu lock");
        let rate = match *last {
            Some((t, b)) if now > t => {
                let dt = now.duration_since(t).as_nanos().max(1);
                ((busy.saturating_sub(b)) as u128 * 1_000_000_000 / dt) as u64
            }
            _ => 0,
        };
        *last = Some((now, busy));
        (rate, busy)
    }
}

/// Working set of the machine: total minus available memory, in bytes.
fn node_memory() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    field("MemTotal:").saturating_sub(field("MemAvailable:"))
}

/// Nanoseconds since the epoch as RFC 3339 (with nanoseconds).
fn nanos_to_rfc3339(nanos: i64) -> String {
    jiff::Timestamp::from_nanosecond(nanos as i128)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

/// When the machine booted, from `/proc/stat`'s `btime`.
fn boot_time() -> String {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<i64>().ok())
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .unwrap_or_else(jiff::Timestamp::now)
        .to_string()
}

/// The Summary for node `node`.
pub async fn summary(cri: &Cri, node: &str, cpu: &NodeCpu) -> Result<Value> {
    let now = jiff::Timestamp::now().to_string();
    let mine = HashMap::from([(labels::NODE.to_owned(), node.to_owned())]);
    // Running containers only, as metrics-server reports them, with when each was created
    // (the CRI lists no start time; creation precedes the start by milliseconds).
    let running: HashMap<String, i64> = cri
        .containers(mine.clone())
        .await?
        .into_iter()
        .filter(|c| c.state == crate::cri::ContainerState::ContainerRunning as i32)
        .map(|c| (c.id, c.created_at))
        .collect();
    let mut stats = cri.container_stats(mine).await?;
    stats.retain(|s| {
        s.attributes
            .as_ref()
            .is_some_and(|a| running.contains_key(&a.id))
    });
    // Pods by uid: (name, namespace, earliest container creation, containers).
    let mut pods: BTreeMap<String, (String, String, i64, Vec<Value>)> = BTreeMap::new();
    for s in stats {
        let Some(attrs) = s.attributes else { continue };
        let (Some(uid), Some(name), Some(ns), Some(container)) = (
            attrs.labels.get(labels::POD_UID),
            attrs.labels.get(labels::POD_NAME),
            attrs.labels.get(labels::POD_NAMESPACE),
            attrs.labels.get(labels::CONTAINER_NAME),
        ) else {
            continue;
        };
        let cores = s
            .cpu
            .as_ref()
            .and_then(|c| c.usage_nano_cores.as_ref())
            .map_or(0, |v| v.value);
        let total = s
            .cpu
            .as_ref()
            .and_then(|c| c.usage_core_nano_seconds.as_ref())
            .map_or(0, |v| v.value);
        let sampled = s
            .cpu
            .as_ref()
            .map(|c| c.timestamp)
            .filter(|t| *t > 0)
            .map_or_else(|| now.clone(), nanos_to_rfc3339);
        let created = running.get(&attrs.id).copied().unwrap_or_default();
        let started = nanos_to_rfc3339(created);
        let working = s
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes.as_ref())
            .map_or(0, |v| v.value);
        let entry = pods
            .entry(uid.clone())
            .or_insert_with(|| (name.clone(), ns.clone(), created, Vec::new()));
        entry.2 = entry.2.min(created);
        entry.3.push(json!({
            "name": container, "startTime": started,
            "cpu": {"time": sampled, "usageNanoCores": cores, "usageCoreNanoSeconds": total},
            "memory": {"time": sampled, "workingSetBytes": working},
        }));
    }
    let (node_cores, node_total) = cpu.rate();
    Ok(json!({
        "node": {
            "nodeName": node, "startTime": boot_time(),
            "cpu": {"time": now, "usageNanoCores": node_cores, "usageCoreNanoSeconds": node_total},
            "memory": {"time": now, "workingSetBytes": node_memory()},
        },
        "pods": pods.into_iter().map(|(uid, (name, ns, created, containers))| json!({
            "podRef": {"name": name, "namespace": ns, "uid": uid},
            "startTime": nanos_to_rfc3339(created), "containers": containers,
        })).collect::<Vec<_>>(),
    }))
}

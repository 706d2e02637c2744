//! The scheduler: binds pending pods to nodes through the `binding` subresource.
//!
//! Filters (all profiles): node Ready and schedulable, taints tolerated, `nodeSelector`,
//! required node affinity, required pod (anti-)affinity on `kubernetes.io/hostname`,
//! topology spread constraints (`DoNotSchedule` filters; every constraint also scores, the
//! node whose domain has the fewest matching pods first),
//! resource requests fit allocatable (cpu, memory, pods and extended resources such as
//! `nvidia.com/gpu`), host ports free, and the node affinity of the pod's bound volumes
//! (a claim of a `WaitForFirstConsumer` class learns the chosen node first, and the pod is
//! bound once its volume is made there). Then a profile, chosen by `spec.schedulerName`, picks
//! among the nodes that pass:
//!
//! | `schedulerName`       | picks                                                          |
//! |-----------------------|----------------------------------------------------------------|
//! | `default-scheduler`   | least allocated: highest mean free fraction of cpu and memory  |
//! | `round-robin`         | the next feasible node in name order, rotating per decision    |
//! | `resource-based`      | most free resources in absolute terms (cpu, then memory)       |
//! | `affinity`            | the node named by the pod's `minik8s.io/node` label (else least allocated) |
//!
//! Decisions are serialised and "assume" the pod on its node at once, so concurrent
//! bindings never overcommit; the cluster view is rebuilt from the informers at most once a
//! second, beside the decisions (on a blocking thread, without their lock), and swapped in
//! with the pods assumed meanwhile. A pod that fits nowhere gets `PodScheduled=False`
//! (Unschedulable) and a FailedScheduling Event, and is retried. Its attempts, decisions and
//! bindings are timed in kube-scheduler's series (`scheduler_*`).
//!
//! A pod that fits nowhere may preempt (upstream's DefaultPreemption, see [`preemption`]):
//! pods of lower `spec.priority` on the best node are deleted with a `Preempted` event, the
//! pod is nominated there (`status.nominatedNodeName`), and pods of lower priority do not
//! take the room while it waits.

mod metrics;

use crate::Result;
use crate::driver::Driver;
use crate::util::{self, pod_requests, selector_matches};
use k8s_openapi::api::core::v1::{
    Binding, Node, NodeSelector, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
    Taint, Toleration,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use metrics::Outcome;
use minik8s_events::Recorder;
use minik8s_types::Quantity;
use minik8s_types::storage::SELECTED_NODE;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The label the `affinity` profile reads.
pub const NODE_LABEL: &str = "minik8s.io/node";

/// How a profile chooses among feasible nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Highest mean free fraction of cpu and memory (upstream's default scoring).
    LeastAllocated,
    /// Rotate through feasible nodes.
    RoundRobin,
    /// Most free cpu, then memory, in absolute terms.
    ResourceBased,
    /// The node the pod names in its `minik8s.io/node` label.
    Affinity,
}

impl Policy {
    /// The profile a pod's `spec.schedulerName` selects; `None`: not ours.
    pub fn for_scheduler(name: Option<&str>) -> Option<Policy> {
        match name.unwrap_or("default-scheduler") {
            "default-scheduler" | "" => Some(Policy::LeastAllocated),
            "round-robin" => Some(Policy::RoundRobin),
            "resource-based" => Some(Policy::ResourceBased),
            "affinity" => Some(Policy::Affinity),
            _ => None,
        }
    }
}

/// What is known about one node when deciding.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// The node.
    pub node: Arc<Node>,
    /// Summed requests of the pods on it.
    pub requested: BTreeMap<String, Quantity>,
    /// Number of pods on it.
    pub pods: i64,
    /// Host ports in use: (host IP, protocol, port).
    pub ports: HashSet<(String, String, i32)>,
    /// The pods on it: their namespaces and labels for affinity and spread, and the victims
    /// preemption chooses among. Shared with the informer's store, not copied: a rebuild
    /// places every pod (150,000 at the largest size measured).
    members: Vec<Arc<Pod>>,
    /// The node's allocatable resources (else its capacity), parsed once: every decision
    /// reads them for every node.
    allocatable: BTreeMap<String, Quantity>,
}

impl NodeInfo {
    fn new(node: Arc<Node>) -> Self {
        let status = node.status.as_ref();
        let allocatable = status
            .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()))
            .into_iter()
            .flatten()
            .filter_map(|(k, q)| Quantity::parse(&q.0).ok().map(|q| (k.clone(), q)))
            .collect();
        NodeInfo {
            node,
            allocatable,
            requested: BTreeMap::new(),
            pods: 0,
            ports: HashSet::new(),
            members: Vec::new(),
        }
    }

    /// Adds a pod with its requests.
    fn place(&mut self, pod: &Arc<Pod>) {
        self.add(pod, &pod_requests(pod));
    }

    /// The node with only `members` on it.
    fn with_members<'a>(node: &Arc<Node>, members: impl IntoIterator<Item = &'a Arc<Pod>>) -> Self {
        let mut info = NodeInfo::new(node.clone());
        for p in members {
            info.place(p);
        }
        info
    }

    fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or_default()
    }

    /// Adds a pod as using `requests`.
    pub fn add(&mut self, pod: &Arc<Pod>, requests: &BTreeMap<String, Quantity>) {
        for (k, v) in requests {
            *self.requested.entry(k.clone()).or_default() += *v;
        }
        self.pods += 1;
        self.ports.extend(host_ports(pod));
        self.members.push(pod.clone());
    }

    fn allocatable(&self, res: &str) -> Quantity {
        self.allocatable.get(res).copied().unwrap_or_default()
    }

    fn free(&self, res: &str) -> Quantity {
        self.allocatable(res) - self.requested.get(res).copied().unwrap_or_default()
    }
}

/// A pod's host ports: (host IP, `0.0.0.0` when unset; protocol; port).
fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            p.host_port.filter(|h| *h > 0).map(|h| {
                (
                    p.host_ip
                        .clone()
                        .filter(|ip| !ip.is_empty())
                        .unwrap_or_else(|| "0.0.0.0".into()),
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    h,
                )
            })
        })
        .collect()
}

/// Whether two host ports collide (upstream's NodePorts plugin): same protocol and port, and
/// the same host IP or either bound to all addresses.
fn ports_collide(a: &(String, String, i32), b: &(String, String, i32)) -> bool {
    a.1 == b.1 && a.2 == b.2 && (a.0 == b.0 || a.0 == "0.0.0.0" || b.0 == "0.0.0.0")
}

fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        let key_ok = t
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key);
        let value_ok = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => {
                t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
            }
        };
        effect_ok
            && key_ok
            && value_ok
            && (t.key.is_some() || t.operator.as_deref() == Some("Exists"))
    })
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `node` may hold `pod` by its taints (NoSchedule and NoExecute must be tolerated by
/// `tolerations`), node selector and required node affinity; upstream's wording otherwise.
/// The scheduler's `filter` and the DaemonSet controller's eligibility both use it.
pub fn placement(pod: &Pod, tolerations: &[Toleration], node: &Node) -> Result<(), String> {
    let spec = pod.spec.as_ref();
    for t in node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
    {
        if matches!(t.effect.as_str(), "NoSchedule" | "NoExecute") && !tolerates(tolerations, t) {
            return Err(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.key,
                t.value.as_deref().unwrap_or_default()
            ));
        }
    }
    let labels = node.labels();
    if let Some(sel) = spec.and_then(|s| s.node_selector.as_ref())
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    let affinity = spec.and_then(|s| s.affinity.as_ref());
    if let Some(required) = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        && !selector_matches(required, node)
    {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    Ok(())
}

/// Why a node does not fit a pod (upstream's wording, counted across nodes).
pub fn filter(
    pod: &Pod,
    requests: &BTreeMap<String, Quantity>,
    info: &NodeInfo,
) -> Result<(), String> {
    let node = &info.node;
    let spec = pod.spec.as_ref();
    if !node_ready(node) {
        return Err("node(s) were not ready".into());
    }
    let tolerations = spec
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    // A cordoned node takes only pods that tolerate its `unschedulable` taint (upstream's
    // NodeUnschedulable plugin; DaemonSet pods do).
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        let cordon = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if !tolerates(tolerations, &cordon) {
            return Err("node(s) were unschedulable".into());
        }
    }
    placement(pod, tolerations, node)?;
    let affinity = spec.and_then(|s| s.affinity.as_ref());
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let hostname = |terms: &[k8s_openapi::api::core::v1::PodAffinityTerm]| {
        terms
            .iter()
            .filter(|t| t.topology_key == "kubernetes.io/hostname")
            .map(|t| {
                let namespaces = t.namespaces.clone().unwrap_or_default();
                let Some(selector) = t.label_selector.as_ref().map(util::Selector::new) else {
                    return false;
                };
                info.members.iter().any(|p| {
                    let pns = p.metadata.namespace.as_deref().unwrap_or_default();
                    (if namespaces.is_empty() {
                        pns == ns
                    } else {
                        namespaces.iter().any(|n| n == pns)
                    }) && selector.matches(Some(p.labels()))
                })
            })
            .collect::<Vec<bool>>()
    };
    if let Some(terms) = affinity
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .as_deref()
        })
        && hostname(terms).iter().any(|found| !found)
    {
        return Err("node(s) didn't match pod affinity rules".into());
    }
    if let Some(terms) = affinity
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .as_deref()
        })
        && hostname(terms).iter().any(|found| *found)
    {
        return Err("node(s) didn't match pod anti-affinity rules".into());
    }
    if info.pods + 1 > info.allocatable("pods").units() as i64 {
        return Err("Too many pods".into());
    }
    for (res, q) in requests {
        if *q > Quantity::ZERO && *q > info.free(res) {
            return Err(format!("Insufficient {res}"));
        }
    }
    if host_ports(pod)
        .iter()
        .any(|p| info.ports.iter().any(|used| ports_collide(p, used)))
    {
        return Err("node(s) didn't have free ports for the requested pod ports".into());
    }
    Ok(())
}

/// The "0/N nodes are available: …" explanation of a pod that fits nowhere.
pub fn unschedulable_message(total: usize, reasons: &BTreeMap<String, usize>) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".into();
    }
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!("0/{total} nodes are available: {}.", parts.join(", "))
}

/// A pod's topology spread constraints against the nodes it may go to: the pods each
/// constraint's selector matches, counted per domain (a value of its topology key).
struct Spread {
    constraints: Vec<Constraint>,
}

/// One topology spread constraint, counted: (DoNotSchedule, maxSkew, the domain of each node,
/// matching pods per domain).
type Constraint = (bool, i64, Vec<Option<String>>, BTreeMap<String, i64>);

impl Spread {
    fn of(pod: &Pod, nodes: &[NodeInfo], eligible: &[usize]) -> Spread {
        let ns = pod.namespace().unwrap_or_default();
        let constraints = pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                let selector = c.label_selector.as_ref().map(util::Selector::new);
                let domains: Vec<Option<String>> = nodes
                    .iter()
                    .map(|n| n.node.labels().get(&c.topology_key).cloned())
                    .collect();
                let mut counts: BTreeMap<String, i64> = BTreeMap::new();
                for &i in eligible {
                    if let Some(d) = &domains[i] {
                        counts.entry(d.clone()).or_insert(0);
                    }
                }
                for (i, n) in nodes.iter().enumerate() {
                    let Some(d) = domains[i].as_ref().filter(|d| counts.contains_key(*d)) else {
                        continue;
                    };
                    let matching = n
                        .members
                        .iter()
                        .filter(|p| {
                            p.metadata.namespace.as_deref().unwrap_or_default() == ns
                                && selector
                                    .as_ref()
                                    .is_some_and(|s| s.matches(Some(p.labels())))
                        })
                        .count() as i64;
                    *counts.get_mut(d).expect("domain") += matching;
                }
                let hard = c.when_unsatisfiable == "DoNotSchedule";
                (hard, i64::from(c.max_skew.max(1)), domains, counts)
            })
            .collect();
        Spread { constraints }
    }

    /// Whether node `i` keeps every DoNotSchedule constraint's skew within its maximum.
    fn allows(&self, i: usize) -> bool {
        self.constraints
            .iter()
            .all(|(hard, max_skew, domains, counts)| {
                if !hard {
                    return true;
                }
                let Some(d) = &domains[i] else {
                    return false;
                };
                let min = counts.values().copied().min().unwrap_or(0);
                counts.get(d).copied().unwrap_or(0) + 1 - min <= *max_skew
            })
    }

    /// The matching pods in node `i`'s domains, over every constraint.
    fn matching(&self, i: usize) -> i64 {
        self.constraints
            .iter()
            .map(|(_, _, domains, counts)| {
                domains[i]
                    .as_ref()
                    .and_then(|d| counts.get(d))
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    }
}

/// Where the next choices begin: the round-robin policy's turn, and the node the default
/// policy's search starts from.
#[derive(Debug, Default)]
pub struct Turn {
    round_robin: usize,
    start: usize,
}

/// Upstream never looks for fewer feasible nodes than this (`minFeasibleNodesToFind`).
const MIN_FEASIBLE_NODES: usize = 100;
/// …nor for a smaller share of the nodes, in percent (`minFeasibleNodesPercentageToFind`).
const MIN_FEASIBLE_PERCENT: usize = 5;

/// How many feasible nodes the default policy looks for before it scores them: upstream's
/// `numFeasibleNodesToFind` with the adaptive `percentageOfNodesToScore` (50 % less one point
/// per 125 nodes, at least 5 %, at least 100 nodes): all of 100 nodes, 420 of 1,000, 500 of
/// 5,000.
pub fn feasible_to_find(nodes: usize) -> usize {
    if nodes < MIN_FEASIBLE_NODES {
        return nodes;
    }
    let percent = 50usize
        .saturating_sub(nodes / 125)
        .max(MIN_FEASIBLE_PERCENT);
    (nodes * percent / 100).max(MIN_FEASIBLE_NODES)
}

/// Chooses a node for a pod among `nodes` with a policy; `Err` explains why none fits.
pub fn pick(
    pod: &Pod,
    nodes: &[NodeInfo],
    policy: Policy,
    turn: &mut Turn,
) -> Result<usize, String> {
    pick_for(pod, nodes, policy, turn, &[])
}

/// [`pick`] for a pod whose bound volumes admit only the nodes of each of `volumes`
/// (their node affinity).
pub fn pick_for(
    pod: &Pod,
    nodes: &[NodeInfo],
    policy: Policy,
    turn: &mut Turn,
    volumes: &[NodeSelector],
) -> Result<usize, String> {
    let requests = pod_requests(pod);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut feasible: Vec<usize> = Vec::new();
    // The default policy stops at enough feasible nodes, as upstream's does, searching on
    // from where the last search stopped; a pod spread by topology is weighed against every
    // node (its domains' counts need them all).
    let spread_by_topology = pod
        .spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_ref())
        .is_some_and(|c| !c.is_empty());
    let (wanted, start) = if policy == Policy::LeastAllocated && !spread_by_topology {
        (feasible_to_find(nodes.len()), turn.start)
    } else {
        (nodes.len(), 0)
    };
    let mut processed = 0;
    for k in 0..nodes.len() {
        if feasible.len() >= wanted {
            break;
        }
        processed += 1;
        let i = (start + k) % nodes.len();
        let n = &nodes[i];
        let volumes_ok = volumes.iter().all(|sel| selector_matches(sel, &n.node));
        let verdict = filter(pod, &requests, n).and_then(|()| {
            volumes_ok
                .then_some(())
                .ok_or_else(|| "node(s) had volume node affinity conflict".to_owned())
        });
        match verdict {
            Ok(()) => feasible.push(i),
            Err(r) => *reasons.entry(r).or_default() += 1,
        }
    }
    if wanted < nodes.len() {
        turn.start = (start + processed) % nodes.len();
    }
    if feasible.is_empty() {
        return Err(unschedulable_message(nodes.len(), &reasons));
    }
    // Topology spread (upstream's PodTopologySpread): a DoNotSchedule constraint filters,
    // and every constraint scores (fewer matching pods in the node's domain is better).
    let spread = Spread::of(pod, nodes, &feasible);
    feasible.retain(|i| {
        let ok = spread.allows(*i);
        if !ok {
            *reasons
                .entry("node(s) didn't match pod topology spread constraints".into())
                .or_default() += 1;
        }
        ok
    });
    if feasible.is_empty() {
        return Err(unschedulable_message(nodes.len(), &reasons));
    }
    let least_allocated = |i: &usize| {
        let n = &nodes[*i];
        let frac = |res: &str, r: Quantity| {
            let a = n.allocatable(res).millis();
            if a <= 0 {
                return 0;
            }
            ((n.free(res) - r).millis() * 1_000_000 / a) as i64
        };
        let score = frac("cpu", requests.get("cpu").copied().unwrap_or_default())
            + frac(
                "memory",
                requests.get("memory").copied().unwrap_or_default(),
            );
        // Spread first, then the freest; ties go to the node with fewer pods, then by name.
        (
            -spread.matching(*i),
            score,
            -n.pods,
            std::cmp::Reverse(n.name()),
        )
    };
    let chosen = match policy {
        Policy::LeastAllocated => feasible.iter().copied().max_by_key(least_allocated),
        Policy::RoundRobin => {
            feasible.sort_by(|a, b| nodes[*a].name().cmp(nodes[*b].name()));
            let i = feasible[turn.round_robin % feasible.len()];
            turn.round_robin += 1;
            Some(i)
        }
        Policy::ResourceBased => feasible.iter().copied().max_by_key(|i| {
            let n = &nodes[*i];
            (n.free("cpu"), n.free("memory"), std::cmp::Reverse(n.name()))
        }),
        Policy::Affinity => match pod.labels().get(NODE_LABEL) {
            Some(want) => match feasible.iter().copied().find(|i| nodes[*i].name() == want) {
                Some(i) => Some(i),
                None => {
                    return Err(format!(
                        "0/{} nodes are available: the node {want:?} named by the pod's {NODE_LABEL} label is not feasible.",
                        nodes.len()
                    ));
                }
            },
            None => feasible.iter().copied().max_by_key(least_allocated),
        },
    };
    chosen.ok_or_else(|| unschedulable_message(nodes.len(), &reasons))
}

/// A pod assumed on a node until the informer shows it bound (or deleted).
struct Assumed {
    node: String,
    pod: Arc<Pod>,
    at: Instant,
    /// Whether the informer has shown the pod (unbound) since it was assumed.
    seen: bool,
}

/// How long an assumed pod the informer has never shown is kept (the informer may lag the
/// scheduler's own watch for a pod just created); one it showed and no longer has was deleted.
const ASSUME_UNSEEN: Duration = Duration::from_secs(30);

/// A preemption decided: the node, the pods to delete there, and the lower-priority pods
/// nominated there that lose their nomination.
struct Preempting {
    node: String,
    victims: Vec<Arc<Pod>>,
    demoted: Vec<Arc<Pod>>,
}

/// A pending pod that preempted pods on `node` and waits for them to go: pods of lower
/// priority do not take the room it made (upstream's nominated node).
#[derive(Clone)]
struct Nominated {
    node: String,
    pod: Arc<Pod>,
}

struct State {
    nodes: Vec<NodeInfo>,
    built: Option<Instant>,
    /// How long the last rebuild took.
    rebuild_took: Duration,
    /// A rebuild is wanted before its time (a binding failed: an assumption was dropped).
    stale: bool,
    assumed: HashMap<String, Assumed>,
    /// Nominations by pod uid.
    nominated: HashMap<String, Nominated>,
    turn: Turn,
}

/// A pod's priority (`spec.priority`, which the Priority admission sets; 0 without).
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Upstream's `MoreImportantPod`: higher priority first, then the one started earlier.
fn more_important(a: &Pod, b: &Pod) -> std::cmp::Ordering {
    let start = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or_else(|| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    priority(b)
        .cmp(&priority(a))
        .then_with(|| start(a).cmp(&start(b)))
}

/// Preemption, as upstream's DefaultPreemption plugin in outline (without
/// PodDisruptionBudgets): on each node where `pod` would fit if every pod of lower priority
/// went, those pods are the candidates, and the most important of them are given back while
/// the pod still fits; the rest are the victims. The node chosen has the lowest highest
/// victim priority, then the lowest sum of victim priorities, then the fewest victims.
/// `None`: preempting does not help (or the pod never preempts).
pub fn preemption(
    pod: &Pod,
    nodes: &[NodeInfo],
    volumes: &[NodeSelector],
) -> Option<(usize, Vec<Arc<Pod>>)> {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.preemption_policy.as_deref())
        == Some("Never")
    {
        return None;
    }
    let p = priority(pod);
    let requests = pod_requests(pod);
    // (the ranking key, the node's index, its victims)
    type Candidate = ((i32, i64, usize), usize, Vec<Arc<Pod>>);
    let mut best: Option<Candidate> = None;
    for (i, n) in nodes.iter().enumerate() {
        if !volumes.iter().all(|sel| selector_matches(sel, &n.node)) {
            continue;
        }
        let (mut lower, mut kept): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) =
            n.members.iter().partition(|m| priority(m) < p);
        if lower.is_empty()
            || filter(
                pod,
                &requests,
                &NodeInfo::with_members(&n.node, kept.clone()),
            )
            .is_err()
        {
            continue;
        }
        lower.sort_by(|a, b| more_important(a, b));
        let mut victims = Vec::new();
        for v in lower {
            kept.push(v);
            let trial = NodeInfo::with_members(&n.node, kept.clone());
            if filter(pod, &requests, &trial).is_err() {
                kept.pop();
                victims.push(v.clone());
            }
        }
        if victims.is_empty() {
            // It fits as things are (the caller's view changed meanwhile).
            continue;
        }
        let key = (
            victims.iter().map(|v| priority(v)).max().unwrap_or(0),
            victims.iter().map(|v| i64::from(priority(v))).sum::<i64>(),
            victims.len(),
        );
        if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
            best = Some((key, i, victims));
        }
    }
    best.map(|(_, i, victims)| (i, victims))
}

impl State {
    /// The node view `pod` is decided on when pods of at least its priority are nominated
    /// to nodes: those pods counted there (upstream runs the filters with them added).
    /// `None`: no such nomination, the plain view applies.
    fn with_nominated(&self, pod: &Pod) -> Option<Vec<NodeInfo>> {
        let uid = pod.uid().unwrap_or_default();
        let p = priority(pod);
        let mut extra = self
            .nominated
            .iter()
            .filter(|(u, n)| **u != uid && priority(&n.pod) >= p)
            .peekable();
        extra.peek()?;
        let mut view = self.nodes.clone();
        for (_, n) in extra {
            if let Some(info) = view.iter_mut().find(|i| i.name() == n.node) {
                info.place(&n.pod);
            }
        }
        Some(view)
    }
}

/// The stores volume binding reads.
pub struct VolumeStores {
    /// PersistentVolumeClaims.
    pub claims: Store<PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub volumes: Store<PersistentVolume>,
    /// StorageClasses.
    pub classes: Store<StorageClass>,
}

/// What a pod's claims ask of its node (upstream's VolumeBinding plugin, in outline).
#[derive(Debug, Default, PartialEq)]
pub struct VolumeNeeds {
    /// The node affinity of each bound volume.
    pub nodes: Vec<NodeSelector>,
    /// Unbound claims of a `WaitForFirstConsumer` class with no node chosen yet: they learn
    /// the chosen node (`volume.kubernetes.io/selected-node`) and the pod waits for them.
    pub delayed: Vec<String>,
    /// Unbound claims that already know their node: the pod waits for them to bind.
    pub waiting: bool,
}

/// What `pod`'s PersistentVolumeClaim volumes need; `Err`: why it cannot be scheduled.
pub fn volume_needs(pod: &Pod, v: &VolumeStores) -> Result<VolumeNeeds, String> {
    let ns = pod.namespace().unwrap_or_default();
    let mut needs = VolumeNeeds::default();
    for vol in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(src) = &vol.persistent_volume_claim else {
            continue;
        };
        let name = &src.claim_name;
        let claim = v
            .claims
            .state()
            .into_iter()
            .find(|c| c.namespace().as_deref() == Some(ns.as_str()) && c.name_any() == *name)
            .ok_or_else(|| format!("persistentvolumeclaim \"{name}\" not found"))?;
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        let bound = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|n| !n.is_empty());
        if let Some(pv) = bound {
            let volume = v
                .volumes
                .state()
                .into_iter()
                .find(|x| x.name_any() == pv)
                .ok_or_else(|| format!("persistentvolume \"{pv}\" not found"))?;
            if let Some(req) = volume
                .spec
                .as_ref()
                .and_then(|s| s.node_affinity.as_ref())
                .and_then(|a| a.required.clone())
            {
                needs.nodes.push(req);
            }
            continue;
        }
        let class_name = crate::volumebinding::claim_class(&claim);
        let (class, delayed) = crate::volumebinding::class_of(&claim, &v.classes);
        if !class_name.is_empty() && class.is_none() {
            return Err(format!(
                "persistentvolumeclaim \"{name}\" cannot be provisioned: storageclass.storage.k8s.io \"{class_name}\" not found"
            ));
        }
        if !delayed {
            return Err("pod has unbound immediate PersistentVolumeClaims".into());
        }
        if claim.annotations().contains_key(SELECTED_NODE) {
            needs.waiting = true;
        } else {
            needs.delayed.push(name.clone());
        }
    }
    Ok(needs)
}

/// The scheduler's shared state: informers and the serialised decision state.
pub struct Scheduler {
    client: Client,
    nodes: Store<Node>,
    pods: Store<Pod>,
    volumes: Option<VolumeStores>,
    state: Mutex<State>,
    /// The turn to decide: the workers wait for it without holding a thread (a decision
    /// that rebuilds the node view reads every pod, and a worker blocked on `state`
    /// meanwhile would hold one of the runtime's few threads).
    deciding: tokio::sync::Mutex<()>,
    /// A worker is rebuilding the node view.
    rebuilding: std::sync::atomic::AtomicBool,
    recorder: Recorder,
}

/// The node view as the informers show it, read without the scheduler's locks; merged with
/// the assumptions and nominations under them ([`Scheduler::install`]).
struct View {
    nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    /// The pods assumed or nominated when it was read; `bound` and `unbound` are of these.
    watched: HashSet<String>,
    bound: HashSet<String>,
    unbound: HashSet<String>,
    nominated: Vec<Arc<Pod>>,
}

impl Scheduler {
    /// A scheduler deciding from these node and pod stores.
    pub fn new(client: Client, nodes: Store<Node>, pods: Store<Pod>) -> Scheduler {
        let recorder = Recorder::new(client.clone(), "default-scheduler", None);
        Scheduler {
            client,
            nodes,
            pods,
            volumes: None,
            state: Mutex::new(State {
                nodes: Vec::new(),
                built: None,
                rebuild_took: Duration::ZERO,
                stale: false,
                assumed: HashMap::new(),
                nominated: HashMap::new(),
                turn: Turn::default(),
            }),
            deciding: tokio::sync::Mutex::new(()),
            rebuilding: std::sync::atomic::AtomicBool::new(false),
            recorder,
        }
    }

    /// Also places pods by their PersistentVolumeClaims (volume binding).
    pub fn with_volumes(mut self, stores: VolumeStores) -> Scheduler {
        self.volumes = Some(stores);
        self
    }

    /// Rebuilds the node view from the informers (plus pods assumed but not yet seen bound).
    fn rebuild(&self, st: &mut State) {
        let began = Instant::now();
        let view = self.read_view(Self::watched(st));
        Self::install(st, view);
        st.rebuild_took = began.elapsed();
    }

    /// The pods whose assumption or nomination a view read now judges: those made later are
    /// newer than it and kept as they are.
    fn watched(st: &State) -> HashSet<String> {
        st.assumed
            .keys()
            .chain(st.nominated.keys())
            .cloned()
            .collect()
    }

    /// Reads the node view from the informers: every node and every pod (150,000 of them at
    /// the largest size measured), so it runs without the scheduler's locks; of the
    /// `watched` pods it notes which are bound.
    fn read_view(&self, watched: HashSet<String>) -> View {
        let mut infos: Vec<NodeInfo> = self.nodes.state().into_iter().map(NodeInfo::new).collect();
        let index: HashMap<String, usize> = infos
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name().to_owned(), i))
            .collect();
        let mut bound: HashSet<String> = HashSet::new();
        let mut unbound: HashSet<String> = HashSet::new();
        let mut nominated: Vec<Arc<Pod>> = Vec::new();
        for p in self.pods.state() {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
                if watched.contains(uid) {
                    unbound.insert(uid.to_owned());
                }
                if p.metadata.deletion_timestamp.is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.nominated_node_name.as_deref())
                        .is_some_and(|n| !n.is_empty())
                {
                    nominated.push(p);
                }
                continue;
            };
            if watched.contains(uid) {
                bound.insert(uid.to_owned());
            }
            if util::is_terminal(&p) {
                continue;
            }
            if let Some(i) = index.get(node) {
                infos[*i].place(&p);
            }
        }
        View {
            nodes: infos,
            index,
            watched,
            bound,
            unbound,
            nominated,
        }
    }

    /// Makes `view` the node view, with the pods assumed and nominated since it was read.
    fn install(st: &mut State, view: View) {
        let View {
            nodes: mut infos,
            index,
            watched,
            bound,
            unbound,
            nominated,
        } = view;
        // An assumption ends when the informer shows the pod bound, or no longer has a pod
        // it had (deleted before a rebuild saw it bound: its resources are free again). One
        // made after the view was read is newer than it.
        st.assumed.retain(|uid, a| {
            if !watched.contains(uid) {
                return true;
            }
            a.seen |= unbound.contains(uid);
            !bound.contains(uid)
                && (unbound.contains(uid) || !a.seen && a.at.elapsed() < ASSUME_UNSEEN)
        });
        for a in st.assumed.values() {
            if let Some(i) = index.get(&a.node) {
                infos[*i].place(&a.pod);
            }
        }
        // A nomination lasts while its pod is pending; one the scheduler did not make here
        // (before a restart) is learned from the pod's status.
        st.nominated
            .retain(|uid, _| !watched.contains(uid) || unbound.contains(uid));
        for p in nominated {
            let uid = p.uid().unwrap_or_default();
            if let Some(node) = p
                .status
                .as_ref()
                .and_then(|s| s.nominated_node_name.clone())
            {
                st.nominated
                    .entry(uid)
                    .or_insert(Nominated { node, pod: p });
            }
        }
        st.nodes = infos;
        st.built = Some(Instant::now());
        st.stale = false;
    }

    /// Whether the node view is due to be read again: every second, or less often when
    /// reading it takes long, so that it takes at most a twentieth of the time; sooner when
    /// an assumption was dropped. Between rebuilds the pods placed here count as assumed.
    fn rebuild_due(&self) -> bool {
        let st = self.state.lock().expect("scheduler state");
        let every = Duration::from_secs(1).max(st.rebuild_took * 20);
        st.stale || st.built.is_some_and(|b| b.elapsed() > every)
    }

    /// Rebuilds the node view when due, reading it on a blocking thread while the decisions
    /// go on with the old one; one worker at a time does so.
    async fn refresh(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if !self.rebuild_due() || self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let began = Instant::now();
        let s = self.clone();
        let watched = Self::watched(&self.state.lock().expect("scheduler state"));
        match tokio::task::spawn_blocking(move || s.read_view(watched)).await {
            Ok(view) => {
                let mut st = self.state.lock().expect("scheduler state");
                Self::install(&mut st, view);
                st.rebuild_took = began.elapsed();
                if st.rebuild_took > Duration::from_millis(500) {
                    tracing::debug!(took = ?st.rebuild_took, nodes = st.nodes.len(), "node view rebuilt");
                }
            }
            Err(e) => tracing::warn!(error = %e, "rebuilding the node view failed"),
        }
        self.rebuilding.store(false, Ordering::Release);
    }

    /// Decides (and assumes) a node for a pod.
    fn decide(
        &self,
        pod: &Arc<Pod>,
        policy: Policy,
        volumes: &[NodeSelector],
        assume: bool,
    ) -> Result<String, String> {
        let mut st = self.state.lock().expect("scheduler state");
        // Built here the first time; after that, [`Scheduler::refresh`] rebuilds it beside
        // the decisions.
        if st.built.is_none() {
            self.rebuild(&mut st);
        }
        let view = st.with_nominated(pod);
        let State { nodes, turn, .. } = &mut *st;
        let i = pick_for(pod, view.as_deref().unwrap_or(nodes), policy, turn, volumes)?;
        let name = nodes[i].name().to_owned();
        if !assume {
            return Ok(name);
        }
        nodes[i].place(pod);
        st.nominated.remove(&pod.uid().unwrap_or_default());
        let seen = self
            .pods
            .get(&ObjectRef::from_obj(pod.as_ref()))
            .is_some_and(|p| p.uid() == pod.uid());
        st.assumed.insert(
            pod.uid().unwrap_or_default(),
            Assumed {
                node: name.clone(),
                pod: pod.clone(),
                at: Instant::now(),
                seen,
            },
        );
        Ok(name)
    }

    /// Preempts for a pod that fits nowhere: the node and the victims to delete, after
    /// nominating the pod there. `None` when preemption does not help, or when the pod
    /// already preempted and its victims are still terminating (upstream's
    /// `PodEligibleToPreemptOthers`). The lower-priority pods nominated to that node lose
    /// their nomination.
    fn preempt(&self, pod: &Arc<Pod>, volumes: &[NodeSelector]) -> Option<Preempting> {
        let mut st = self.state.lock().expect("scheduler state");
        let uid = pod.uid().unwrap_or_default();
        let p = priority(pod);
        if let Some(n) = st.nominated.get(&uid)
            && st.nodes.iter().filter(|i| i.name() == n.node).any(|i| {
                i.members
                    .iter()
                    .any(|m| m.metadata.deletion_timestamp.is_some() && priority(m) < p)
            })
        {
            return None;
        }
        let view = st.with_nominated(pod);
        let (i, victims) = preemption(pod, view.as_deref().unwrap_or(&st.nodes), volumes)?;
        let node = st.nodes[i].name().to_owned();
        let demoted: Vec<Arc<Pod>> = st
            .nominated
            .iter()
            .filter(|(u, n)| **u != uid && n.node == node && priority(&n.pod) < p)
            .map(|(_, n)| n.pod.clone())
            .collect();
        for d in &demoted {
            st.nominated.remove(&d.uid().unwrap_or_default());
        }
        st.nominated.insert(
            uid,
            Nominated {
                node: node.clone(),
                pod: pod.clone(),
            },
        );
        Some(Preempting {
            node,
            victims,
            demoted,
        })
    }

    fn forget(&self, pod: &Pod) {
        let mut st = self.state.lock().expect("scheduler state");
        st.assumed.remove(&pod.uid().unwrap_or_default());
        st.stale = true;
    }
}

async fn reconcile(pod: Arc<Pod>, s: Arc<Scheduler>) -> Result<Action> {
    let spec = pod.spec.as_ref();
    if spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
        || pod.metadata.deletion_timestamp.is_some()
    {
        return Ok(Action::await_change());
    }
    let Some(policy) = Policy::for_scheduler(spec.and_then(|s| s.scheduler_name.as_deref())) else {
        return Ok(Action::await_change());
    };
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(s.client.clone(), &ns);
    let needs = match &s.volumes {
        Some(v) => volume_needs(&pod, v),
        None => Ok(VolumeNeeds::default()),
    };
    if needs.as_ref().is_ok_and(|n| n.waiting) {
        // A claim's volume is being made on the node chosen for it; bind once it is.
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let volume_nodes = needs.as_ref().ok().map(|n| n.nodes.clone());
    let attempt = Instant::now();
    let m = metrics::get();
    s.refresh().await;
    let turn = s.deciding.lock().await;
    let deciding = Instant::now();
    let decided = needs.and_then(|n| {
        let assume = n.delayed.is_empty();
        s.decide(&pod, policy, &n.nodes, assume)
            .map(|node| (node, n.delayed))
    });
    m.decided(deciding.elapsed());
    drop(turn);
    match decided {
        Ok((node, delayed)) if !delayed.is_empty() => {
            // Claims waiting for their first consumer learn the node; their volumes are made
            // there and the pod is bound on a later pass.
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(s.client.clone(), &ns);
            for c in &delayed {
                let patch = json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
                claims
                    .patch(c, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            tracing::debug!(pod = %util::key(pod.as_ref()), %node, "claims wait for volumes on the chosen node");
            Ok(Action::requeue(Duration::from_millis(500)))
        }
        Ok((node, _)) => {
            let binding = Binding {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    ..Default::default()
                },
                target: ObjectReference {
                    kind: Some("Node".into()),
                    api_version: Some("v1".into()),
                    name: Some(node.clone()),
                    ..Default::default()
                },
            };
            let body = serde_json::to_value(&binding)?;
            let sent = Instant::now();
            let bound = api
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    &name,
                    &PostParams::default(),
                    &body,
                )
                .await;
            m.bound(bound.is_ok(), sent.elapsed());
            let outcome = if bound.is_ok() {
                Outcome::Scheduled
            } else {
                Outcome::Error
            };
            m.attempted(outcome, attempt.elapsed());
            match bound {
                Ok(_) => {
                    tracing::debug!(pod = %util::key(pod.as_ref()), %node, "bound");
                    s.recorder.normal(
                        &pod.object_ref(&()),
                        "Scheduled",
                        format!("Successfully assigned {ns}/{name} to {node}"),
                    );
                    Ok(Action::await_change())
                }
                Err(e) => {
                    s.forget(&pod);
                    Err(e.into())
                }
            }
        }
        Err(message) => {
            m.attempted(Outcome::Unschedulable, attempt.elapsed());
            let preempted = match &volume_nodes {
                Some(volumes) => s.preempt(&pod, volumes),
                None => None,
            };
            if let Some(p) = preempted {
                preempt(&s, &pod, &p).await?;
            }
            let nominated = s
                .state
                .lock()
                .expect("scheduler state")
                .nominated
                .contains_key(&pod.uid().unwrap_or_default());
            let already = pod
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
                .is_some_and(|c| c.status == "False" && c.message.as_deref() == Some(&message));
            tracing::debug!(pod = %util::key(pod.as_ref()), %message, nominated, "unschedulable");
            if !already {
                let patch = json!({"status": {"conditions": [{
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastTransitionTime": util::rfc3339(jiff::Timestamp::now()),
                }]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await?;
                s.recorder
                    .warning(&pod.object_ref(&()), "FailedScheduling", message.clone());
            }
            // A nominated pod waits only for its victims to go.
            Ok(Action::requeue(Duration::from_secs(if nominated {
                1
            } else {
                5
            })))
        }
    }
}

/// Carries out a preemption: the pod is nominated to `node` (`status.nominatedNodeName`),
/// lower-priority pods nominated there lose their nomination, and each victim is marked
/// with the `DisruptionTarget` condition, deleted with its grace period and told why
/// (upstream's `Preempted` event).
async fn preempt(s: &Scheduler, pod: &Pod, p: &Preempting) -> Result<()> {
    let Preempting {
        node,
        victims,
        demoted,
    } = p;
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let set = |n: Option<&str>| json!({"status": {"nominatedNodeName": n}});
    Api::<Pod>::namespaced(s.client.clone(), &ns)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(set(Some(node))),
        )
        .await?;
    for d in demoted {
        let api: Api<Pod> = Api::namespaced(s.client.clone(), &d.namespace().unwrap_or_default());
        if let Err(e) = api
            .patch_status(
                &d.name_any(),
                &PatchParams::default(),
                &Patch::Merge(set(None)),
            )
            .await
        {
            tracing::debug!(pod = %util::key(d.as_ref()), error = %e, "clearing a nomination failed");
        }
    }
    for v in victims {
        let api: Api<Pod> = Api::namespaced(s.client.clone(), &v.namespace().unwrap_or_default());
        // Upstream marks the victim first, so its controller (a Job's pod failure policy)
        // can tell a preemption from a failure.
        let scheduler = v
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.clone())
            .unwrap_or_else(|| "default-scheduler".into());
        let condition = json!({"status": {"conditions": [{"type": "DisruptionTarget",
            "status": "True", "reason": "PreemptionByScheduler",
            "message": format!("{scheduler}: preempting to accommodate a higher priority pod"),
            "lastTransitionTime": util::rfc3339(jiff::Timestamp::now())}]}});
        match api
            .patch_status(
                &v.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(condition),
            )
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(e.into()),
        }
        match api.delete(&v.name_any(), &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        }
        tracing::info!(victim = %util::key(v.as_ref()), preemptor = %util::key(pod), %node, "preempted");
        s.recorder.normal(
            &v.object_ref(&()),
            "Preempted",
            format!("Preempted by {ns}/{name} on node {node}"),
        );
    }
    Ok(())
}

/// Pods the scheduler works on at once: one decides while the others' bindings are sent.
const SCHEDULER_WORKERS: u16 = 16;

/// Runs the scheduler until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let nodes = informers.all::<Node>().await;
    let pods = informers.all::<Pod>().await;
    let volumes = VolumeStores {
        claims: informers.all::<PersistentVolumeClaim>().await,
        volumes: informers.all::<PersistentVolume>().await,
        classes: informers.all::<StorageClass>().await,
    };
    let s = Arc::new(Scheduler::new(client.clone(), nodes, pods).with_volumes(volumes));
    // Only the changes of pods waiting for a node wake the scheduler (upstream's scheduling
    // queue holds those alone): the status writes of thousands of bound pods do not queue
    // before them, and the periodic pass goes over the pending pods, not every pod.
    // Decisions are made one at a time; bindings in flight are bounded, as upstream's client
    // bounds them (kube-scheduler's burst of 100 at 50 QPS).
    Driver::<Pod>::only("scheduler", &informers, |p: &Pod| {
        p.metadata.deletion_timestamp.is_none()
            && p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_none_or(str::is_empty)
    })
    .await
    .workers(SCHEDULER_WORKERS)
    .run(reconcile, s, shutdown)
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, NodeCondition, NodeSpec, NodeStatus, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn node(name: &str, cpu: &str) -> NodeInfo {
        NodeInfo::new(Arc::new(Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some([("kubernetes.io/hostname".to_owned(), name.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu".to_owned(), Q(cpu.into())),
                        ("memory".to_owned(), Q("8Gi".into())),
                        ("pods".to_owned(), Q("110".into())),
                    ]
                    .into(),
                ),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }))
    }

    fn pod(cpu: &str) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some([("cpu".to_owned(), Q(cpu.into()))].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn prioritized(name: &str, cpu: &str, priority: i32) -> Arc<Pod> {
        let mut p = pod(cpu);
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(name.into());
        p.spec.as_mut().unwrap().priority = Some(priority);
        Arc::new(p)
    }

    #[test]
    fn preemption_evicts_the_fewest_least_important_pods() {
        // Upstream's "runs ReplicaSets to verify preemption running path": 950 of 1000 in
        // use by priorities 1, 2 and 3; a priority-4 pod asking 500 evicts 1 and 2 only.
        let mut n = node("a", "1000");
        for (name, cpu, prio) in [("p1", "200", 1), ("p2", "300", 2), ("p3", "450", 3)] {
            n.place(&prioritized(name, cpu, prio));
        }
        let nodes = vec![n];
        let preemptor = prioritized("p4", "500", 4);
        assert!(
            pick(
                &preemptor,
                &nodes,
                Policy::LeastAllocated,
                &mut Turn::default()
            )
            .is_err()
        );
        let (i, victims) = preemption(&preemptor, &nodes, &[]).expect("preempts");
        assert_eq!(i, 0);
        let mut names: Vec<_> = victims.iter().map(|v| v.name_any()).collect();
        names.sort();
        assert_eq!(names, ["p1", "p2"]);
        // A pod of no higher priority than any victim preempts nothing, and neither does one
        // whose policy is Never.
        assert!(preemption(&prioritized("low", "500", 1), &nodes, &[]).is_none());
        let mut never = (*preemptor).clone();
        never.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
        assert!(preemption(&never, &nodes, &[]).is_none());
    }

    #[test]
    fn a_nominated_pod_keeps_its_room_from_lower_priorities() {
        let mut n = node("a", "1000");
        n.place(&prioritized("p3", "450", 3));
        let mut st = State {
            nodes: vec![n],
            built: None,
            rebuild_took: Duration::ZERO,
            stale: false,
            assumed: HashMap::new(),
            nominated: HashMap::new(),
            turn: Turn::default(),
        };
        st.nominated.insert(
            "p4".into(),
            Nominated {
                node: "a".into(),
                pod: prioritized("p4", "500", 4),
            },
        );
        // A replacement of a victim (priority 1) sees the nominated pod's 500 taken.
        let replacement = prioritized("p1-new", "200", 1);
        let view = st
            .with_nominated(&replacement)
            .expect("a nomination applies");
        assert!(
            pick(
                &replacement,
                &view,
                Policy::LeastAllocated,
                &mut Turn::default()
            )
            .is_err()
        );
        // The nominated pod itself does not count against itself, and one of higher
        // priority ignores it.
        assert!(st.with_nominated(&prioritized("p4", "500", 4)).is_none());
        let higher = prioritized("p9", "500", 9);
        assert!(st.with_nominated(&higher).is_none());
        assert_eq!(
            pick(
                &higher,
                &st.nodes,
                Policy::LeastAllocated,
                &mut Turn::default()
            ),
            Ok(0)
        );
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node() {
        let mut a = node("a", "4");
        let b = node("b", "4");
        a.add(&Arc::new(pod("2")), &pod_requests(&pod("2")));
        let nodes = vec![a, b];
        assert_eq!(
            pick(
                &pod("1"),
                &nodes,
                Policy::LeastAllocated,
                &mut Turn::default()
            ),
            Ok(1)
        );
    }

    #[test]
    fn large_clusters_look_for_upstreams_share_of_feasible_nodes() {
        // numFeasibleNodesToFind with the adaptive percentage.
        for (nodes, want) in [(0, 0), (50, 50), (100, 100), (199, 100), (1000, 420)] {
            assert_eq!(feasible_to_find(nodes), want, "{nodes} nodes");
        }
        assert_eq!(feasible_to_find(5000), 500);
        assert_eq!(feasible_to_find(10_000), 500, "5 % at the least");

        // 1,000 nodes: each search stops at 420 feasible ones and the next goes on from
        // there; the emptiest of those searched is chosen.
        let mut nodes: Vec<NodeInfo> = (0..1000).map(|i| node(&format!("n{i:04}"), "4")).collect();
        for n in nodes.iter_mut().take(700) {
            n.add(&Arc::new(pod("1")), &pod_requests(&pod("1")));
        }
        let mut turn = Turn::default();
        // n0000–n0419, all holding a pod: the first of them.
        assert_eq!(
            pick(&pod("1"), &nodes, Policy::LeastAllocated, &mut turn),
            Ok(0)
        );
        assert_eq!(turn.start, 420);
        // n0420–n0839 reach the empty n0700.
        assert_eq!(
            pick(&pod("1"), &nodes, Policy::LeastAllocated, &mut turn),
            Ok(700)
        );
        assert_eq!(turn.start, 840);
        // Only feasible nodes count: with 300 left that fit (n0700–n0999), the search goes
        // round every node and ends where it began.
        for n in nodes.iter_mut().take(900) {
            n.add(&Arc::new(pod("3")), &pod_requests(&pod("3")));
        }
        assert_eq!(
            pick(&pod("1"), &nodes, Policy::LeastAllocated, &mut turn),
            Ok(900)
        );
        assert_eq!(turn.start, 840);
        for (i, n) in nodes.iter_mut().enumerate().skip(700) {
            let p = Arc::new(if i < 900 { pod("1") } else { pod("4") });
            n.add(&p, &pod_requests(&p));
        }
        assert_eq!(
            pick(&pod("1"), &nodes, Policy::LeastAllocated, &mut turn),
            Err("0/1000 nodes are available: 1000 Insufficient cpu.".into())
        );
    }

    /// A pod labelled `app=web` that spreads over host names (`hard`: DoNotSchedule).
    fn spread_pod(hard: bool) -> Pod {
        let mut p = pod("0");
        p.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        p.spec.as_mut().unwrap().topology_spread_constraints = Some(vec![
            serde_json::from_value(serde_json::json!({
                "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": if hard { "DoNotSchedule" } else { "ScheduleAnyway" },
                "labelSelector": {"matchLabels": {"app": "web"}},
            }))
            .unwrap(),
        ]);
        p
    }

    #[test]
    fn topology_spread_prefers_the_domain_with_fewer_matching_pods_and_filters_hard_skew() {
        // a has an unrelated pod (fewer pods would otherwise pick b), b has one of ours.
        let mut a = node("a", "4");
        let mut b = node("b", "4");
        a.add(&Arc::new(pod("0")), &BTreeMap::new());
        a.add(&Arc::new(pod("0")), &BTreeMap::new());
        b.add(&Arc::new(spread_pod(false)), &BTreeMap::new());
        let nodes = vec![a, b];
        assert_eq!(
            pick(
                &spread_pod(false),
                &nodes,
                Policy::LeastAllocated,
                &mut Turn::default()
            ),
            Ok(0)
        );
        // DoNotSchedule: b at 2 and a at 0 would be a skew of 2 > 1 on b.
        let mut b = nodes[1].clone();
        b.add(&Arc::new(spread_pod(true)), &BTreeMap::new());
        let only_b = vec![nodes[0].clone(), b];
        assert_eq!(
            pick(
                &spread_pod(true),
                &only_b,
                Policy::LeastAllocated,
                &mut Turn::default()
            ),
            Ok(0)
        );
        let mut full_a = only_b.clone();
        full_a[0].add(&Arc::new(spread_pod(true)), &BTreeMap::new());
        full_a[0].add(&Arc::new(spread_pod(true)), &BTreeMap::new());
        full_a[0].add(&Arc::new(spread_pod(true)), &BTreeMap::new());
        full_a[1].add(&Arc::new(spread_pod(true)), &BTreeMap::new());
        // a 3, b 3: both within skew; the tie goes to fewer pods overall (b).
        assert_eq!(
            pick(
                &spread_pod(true),
                &full_a,
                Policy::LeastAllocated,
                &mut Turn::default()
            ),
            Ok(1)
        );
        let mut skewed = only_b;
        skewed[1].add(&Arc::new(spread_pod(true)), &BTreeMap::new());
        // a 0, b 3: b is refused, a chosen.
        assert_eq!(
            pick(
                &spread_pod(true),
                &skewed,
                Policy::LeastAllocated,
                &mut Turn::default()
            ),
            Ok(0)
        );
    }

    #[test]
    fn resource_based_prefers_the_most_free_cpu() {
        let nodes = vec![node("a", "2"), node("b", "8")];
        assert_eq!(
            pick(
                &pod("1"),
                &nodes,
                Policy::ResourceBased,
                &mut Turn::default()
            ),
            Ok(1)
        );
    }

    #[test]
    fn round_robin_rotates() {
        let nodes = vec![node("b", "4"), node("a", "4")];
        let mut turn = Turn::default();
        let picks: Vec<usize> = (0..4)
            .map(|_| pick(&pod("1"), &nodes, Policy::RoundRobin, &mut turn).unwrap())
            .collect();
        assert_eq!(picks, [1, 0, 1, 0], "a, b, a, b by name");
    }

    #[test]
    fn affinity_follows_the_pod_label() {
        let nodes = vec![node("a", "4"), node("b", "4")];
        let mut p = pod("1");
        p.metadata.labels = Some([(NODE_LABEL.to_owned(), "b".to_owned())].into());
        assert_eq!(
            pick(&p, &nodes, Policy::Affinity, &mut Turn::default()),
            Ok(1)
        );
        p.metadata.labels = Some([(NODE_LABEL.to_owned(), "zz".to_owned())].into());
        assert!(pick(&p, &nodes, Policy::Affinity, &mut Turn::default()).is_err());
    }

    #[test]
    fn a_pod_larger_than_any_node_explains_why() {
        let nodes = vec![node("a", "2"), node("b", "2")];
        assert_eq!(
            pick(
                &pod("3"),
                &nodes,
                Policy::LeastAllocated,
                &mut Turn::default()
            ),
            Err("0/2 nodes are available: 2 Insufficient cpu.".into())
        );
    }

    #[test]
    fn taints_selectors_and_anti_affinity_filter() {
        let mut tainted = node("t", "4");
        Arc::make_mut(&mut tainted.node).spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let p = pod("1");
        assert!(
            filter(&p, &pod_requests(&p), &tainted)
                .unwrap_err()
                .contains("untolerated taint")
        );
        let mut tolerant = pod("1");
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("gpu".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        assert!(filter(&tolerant, &pod_requests(&tolerant), &tainted).is_ok());

        let mut selective = pod("1");
        selective.spec.as_mut().unwrap().node_selector =
            Some([("disk".to_owned(), "ssd".to_owned())].into());
        assert!(filter(&selective, &pod_requests(&selective), &node("a", "4")).is_err());

        let mut occupied = node("a", "4");
        let mut web = pod("1");
        web.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        occupied.add(&Arc::new(web.clone()), &pod_requests(&web));
        let mut anti = web.clone();
        anti.spec.as_mut().unwrap().affinity = Some(serde_json::from_value(json!({
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "web"}}}
            ]}
        })).unwrap());
        assert!(
            filter(&anti, &pod_requests(&anti), &occupied)
                .unwrap_err()
                .contains("anti-affinity")
        );
        assert!(filter(&anti, &pod_requests(&anti), &node("b", "4")).is_ok());
    }

    #[test]
    fn reconcile_binds_a_fitting_pod_and_reports_one_that_fits_nowhere_on_a_mock_api() {
        let node = |name: &str| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                    "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "10"}}}))
            .unwrap()
        };
        let pod = |name: &str, cpu: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "default", "uid": name},
                "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}}))
            .unwrap()
        };
        let m = crate::testing::mock(crate::testing::echo);
        let s = Arc::new(Scheduler::new(
            m.client.clone(),
            crate::testing::store(vec![node("n1"), node("n2")]),
            crate::testing::store(Vec::<Pod>::new()),
        ));
        m.run(reconcile(Arc::new(pod("small", "500m")), s.clone()))
            .unwrap();
        let bound = crate::testing::matching(&m.calls, "POST", "/pods/small/binding");
        assert_eq!(bound.len(), 1);
        let target = bound[0].body["target"]["name"].as_str().unwrap();
        assert!(target == "n1" || target == "n2", "{target}");

        m.run(reconcile(Arc::new(pod("huge", "8")), s)).unwrap();
        assert!(crate::testing::matching(&m.calls, "POST", "/pods/huge/binding").is_empty());
        let status = crate::testing::matching(&m.calls, "PATCH", "/pods/huge/status");
        let cond = &status[0].body["status"]["conditions"][0];
        assert_eq!(
            (cond["type"].as_str(), cond["status"].as_str()),
            (Some("PodScheduled"), Some("False"))
        );
        assert!(
            cond["message"]
                .as_str()
                .unwrap()
                .contains("Insufficient cpu"),
            "{cond}"
        );
        m.settle();
        let events = crate::testing::matching(&m.calls, "POST", "/events");
        let said: Vec<(&str, &str)> = events
            .iter()
            .map(|e| {
                (
                    e.body["reason"].as_str().unwrap_or_default(),
                    e.body["involvedObject"]["name"]
                        .as_str()
                        .unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(said, [("Scheduled", "small"), ("FailedScheduling", "huge")]);
        assert_eq!(
            events[0].body["message"],
            format!("Successfully assigned default/small to {target}")
        );
    }

    /// A Ready node of `cpu` cores, room for 10 pods.
    fn ready_node(name: &str, cpu: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "10"}}}))
        .unwrap()
    }

    /// A pod asking for one core, its uid its name.
    fn one_cpu_pod(name: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}]}}))
        .unwrap()
    }

    #[test]
    fn an_assumed_pod_deleted_before_a_rebuild_saw_it_bound_frees_its_node() {
        let n = ready_node("n1", "1");
        let pod = one_cpu_pod;
        let (pods, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod("first")));
        let m = crate::testing::mock(crate::testing::echo);
        let s = Scheduler::new(m.client.clone(), crate::testing::store(vec![n]), pods);
        let first = Arc::new(pod("first"));
        assert_eq!(
            s.decide(&first, Policy::LeastAllocated, &[], true).unwrap(),
            "n1"
        );
        let second = Arc::new(pod("second"));
        // The node is full while the first pod is assumed on it.
        s.state.lock().unwrap().built = None;
        assert!(
            s.decide(&second, Policy::LeastAllocated, &[], true)
                .is_err()
        );
        // The first pod is deleted before any rebuild saw it bound.
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Delete(pod("first")));
        s.state.lock().unwrap().built = None;
        assert_eq!(
            s.decide(&second, Policy::LeastAllocated, &[], true)
                .unwrap(),
            "n1"
        );
    }

    #[test]
    fn a_view_read_beside_the_decisions_keeps_the_pods_assumed_meanwhile() {
        let n = ready_node("n1", "2");
        let pod = one_cpu_pod;
        let (pods, mut writer) = kube::runtime::reflector::store();
        for name in ["first", "second", "third"] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod(name)));
        }
        let m = crate::testing::mock(crate::testing::echo);
        let s = Scheduler::new(m.client.clone(), crate::testing::store(vec![n]), pods);
        let decide = |name: &str| s.decide(&Arc::new(pod(name)), Policy::LeastAllocated, &[], true);
        assert_eq!(decide("first").unwrap(), "n1");
        // The view is read (no pod bound in it yet) while the second pod is decided.
        let view = s.read_view(Scheduler::watched(&s.state.lock().unwrap()));
        assert_eq!(decide("second").unwrap(), "n1");
        Scheduler::install(&mut s.state.lock().unwrap(), view);
        assert!(!s.rebuild_due());
        // Both assumed pods still take their cpu: the third fits nowhere.
        assert!(decide("third").is_err());
        // A dropped assumption (a failed binding) makes a rebuild due at once.
        s.forget(&pod("second"));
        assert!(s.rebuild_due());
    }

    #[test]
    fn host_ports_collide_by_ip_protocol_and_port_as_upstream() {
        let p = |ip: &str, proto: &str, port| (ip.to_owned(), proto.to_owned(), port);
        assert!(ports_collide(
            &p("0.0.0.0", "TCP", 54321),
            &p("127.0.0.1", "TCP", 54321)
        ));
        assert!(!ports_collide(
            &p("127.0.0.1", "TCP", 54321),
            &p("192.0.2.2", "TCP", 54321)
        ));
        assert!(!ports_collide(
            &p("192.0.2.2", "TCP", 54321),
            &p("192.0.2.2", "UDP", 54321)
        ));
        assert!(ports_collide(
            &p("192.0.2.2", "UDP", 54321),
            &p("192.0.2.2", "UDP", 54321)
        ));
    }
}

//! The node lifecycle controller: a node whose kubelet stops heartbeating (its Lease in
//! `kube-node-lease` and its Ready condition both unchanged for the grace period, 40 s by
//! default) gets `Ready=Unknown` (all its conditions, reason `NodeStatusUnknown`) and the
//! `node.kubernetes.io/unreachable` taints (NoSchedule and NoExecute); a node reporting
//! `Ready=False` gets the `not-ready` ones. Taints go when the node is Ready again. Pods on a
//! node with a NoExecute taint are evicted (deleted) once their toleration runs out
//! (`tolerationSeconds`, counted from the taint's `timeAdded`); pods that do not tolerate
//! it go at once, and their Ready condition is set to False while the node is unreachable.
//! A node annotated `node.minik8s.io/autonomy: "true"` (an edge node, which runs its pods on
//! its own while the cloud cannot reach it) is tainted the same, but its pods stay.
//!
//! Heartbeats are timed on this controller's clock (when it saw a change), as upstream does,
//! so clock skew between machines does not matter.

use crate::driver::Driver;
use crate::util;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Taint key of nodes whose kubelet stopped heartbeating.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint key of nodes that report Ready=False.
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The annotation of a node whose pods are not evicted while it is unreachable (`"true"`:
/// an edge node, which keeps running them on its own).
pub const AUTONOMY_ANNOTATION: &str = "node.minik8s.io/autonomy";

/// Timing of the controller.
#[derive(Clone, Debug)]
pub struct Config {
    /// How long a node may go without a heartbeat (upstream `--node-monitor-grace-period`).
    pub grace: Duration,
    /// How often nodes and pods are checked.
    pub period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grace: Duration::from_secs(40),
            period: Duration::from_secs(1),
        }
    }
}

/// What a node's health calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Heartbeats and Ready=True, or no Ready condition yet.
    Ready,
    /// Heartbeats, but not Ready=True (the kubelet says so).
    NotReady,
    /// No heartbeat within the grace period.
    Unreachable,
}

/// The node's Ready condition, if it has one.
fn ready_condition(node: &Node) -> Option<&k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The node's Ready condition status ("True", "False", "Unknown"), if it has one.
fn ready_status(node: &Node) -> Option<&str> {
    ready_condition(node).map(|c| c.status.as_str())
}

/// Decides a node's health from whether it heartbeat within the grace period.
pub fn health(node: &Node, fresh: bool) -> Health {
    match (fresh, ready_status(node)) {
        (false, _) => Health::Unreachable,
        (true, Some("True")) => Health::Ready,
        // A node whose status says it cannot tell (a virtual node whose backend does not
        // answer) is unreachable, as upstream taints a Ready=Unknown node.
        (true, Some("Unknown")) => Health::Unreachable,
        // Heartbeating but not yet reporting: the kubelet will say.
        (true, None) if has_taint(node, UNREACHABLE) => Health::Unreachable,
        // A node that never reported a Ready condition gets no taint for it, as upstream's
        // (which taints by the condition's status): a kubelet registers, then reports.
        (true, None) => Health::Ready,
        (true, _) => Health::NotReady,
    }
}

fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The node's taints for its health: ours replaced, everyone else's kept.
pub fn wanted_taints(node: &Node, health: Health, now: jiff::Timestamp) -> Vec<Taint> {
    let ours = match health {
        Health::Ready => None,
        Health::NotReady => Some(NOT_READY),
        Health::Unreachable => Some(UNREACHABLE),
    };
    let mut out: Vec<Taint> = taints(node)
        .iter()
        .filter(|t| (t.key != UNREACHABLE && t.key != NOT_READY) || Some(t.key.as_str()) == ours)
        .cloned()
        .collect();
    if let Some(key) = ours {
        for effect in ["NoSchedule", "NoExecute"] {
            if !out.iter().any(|t| t.key == key && t.effect == effect) {
                out.push(Taint {
                    key: key.into(),
                    effect: effect.into(),
                    time_added: (effect == "NoExecute")
                        .then_some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                    value: None,
                });
            }
        }
    }
    out
}

/// Whether a toleration covers a taint.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = t.key.as_deref().unwrap_or("");
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => effect_ok && (key.is_empty() || key == taint.key),
        _ => {
            effect_ok
                && key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// When a pod on a node with these taints is to be evicted: `None` if it tolerates every
/// NoExecute taint forever, otherwise the earliest time a toleration runs out.
pub fn eviction_time(pod: &Pod, taints: &[Taint], now: jiff::Timestamp) -> Option<jiff::Timestamp> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let mut at: Option<jiff::Timestamp> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let added = taint.time_added.as_ref().map_or(now, |t| t.0);
        let covering: Vec<&Toleration> =
            tolerations.iter().filter(|t| tolerates(t, taint)).collect();
        let until = if covering.is_empty() {
            Some(added)
        } else if covering.iter().any(|t| t.toleration_seconds.is_none()) {
            None
        } else {
            let secs = covering
                .iter()
                .filter_map(|t| t.toleration_seconds)
                .min()
                .unwrap_or(0)
                .max(0);
            Some(added + jiff::SignedDuration::from_secs(secs))
        };
        if let Some(u) = until {
            at = Some(at.map_or(u, |a| a.min(u)));
        }
    }
    at
}

/// A node's heartbeat marks: its Lease's renewTime and its Ready condition's heartbeat.
type Beat = (Option<String>, Option<String>);

/// Heartbeats last seen per node, and when they changed.
#[derive(Default)]
struct Heartbeats {
    seen: HashMap<String, (Beat, Instant)>,
}

impl Heartbeats {
    /// Records what the node shows now; whether it changed within `grace`, and how long
    /// until `grace` runs out.
    fn fresh(&mut self, node: &Node, lease: Option<&Lease>, grace: Duration) -> (bool, Duration) {
        let renew = lease
            .and_then(|l| l.spec.as_ref())
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string());
        let ready = ready_condition(node)
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| t.0.to_string());
        let record = (renew, ready);
        let entry = self
            .seen
            .entry(node.name_any())
            .or_insert_with(|| (record.clone(), Instant::now()));
        if entry.0 != record {
            *entry = (record, Instant::now());
        }
        (
            entry.1.elapsed() < grace,
            grace.saturating_sub(entry.1.elapsed()),
        )
    }
}

struct Ctx {
    client: Client,
    cfg: Config,
    leases: Store<Lease>,
    pods: Store<Pod>,
    beats: Mutex<Heartbeats>,
}

/// Runs the node lifecycle controller until `shutdown`: a node is looked at when it, its
/// Lease or a pod on it changes, and again when its heartbeat would run out or a pod's
/// toleration of its taints ends.
pub async fn run(
    client: Client,
    cfg: Config,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Ctx {
        client,
        cfg,
        leases: informers.all::<Lease>().await,
        pods: informers.all::<Pod>().await,
        beats: Mutex::default(),
    });
    Driver::<Node>::new("nodelifecycle", &informers)
        .await
        // Upstream's node update workers (nodeUpdateWorkerSize).
        .workers(8)
        .watches::<Lease, _>(|l| {
            (l.namespace().as_deref() == Some(LEASE_NAMESPACE))
                .then(|| ObjectRef::new(&l.name_any()))
        })
        .watches::<Pod, _>(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .map(ObjectRef::new)
        })
        .run(sync, ctx, shutdown)
        .await;
}

/// Where nodes' Leases are.
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// One look at a node and, when it has NoExecute taints, at the pods on it.
async fn sync(node: Arc<Node>, ctx: Arc<Ctx>) -> crate::Result<Action> {
    let (client, cfg) = (&ctx.client, &ctx.cfg);
    let node_api: Api<Node> = Api::all(client.clone());
    let now = jiff::Timestamp::now();
    let name = node.name_any();
    let lease = ctx
        .leases
        .get(&ObjectRef::new(&name).within(LEASE_NAMESPACE));
    let (fresh, left) =
        ctx.beats
            .lock()
            .expect("heartbeats")
            .fresh(&node, lease.as_deref(), cfg.grace);
    let h = health(&node, fresh);
    let wanted = wanted_taints(&node, h, now);
    if wanted
        .iter()
        .map(|t| (&t.key, &t.effect))
        .collect::<Vec<_>>()
        != taints(&node)
            .iter()
            .map(|t| (&t.key, &t.effect))
            .collect::<Vec<_>>()
    {
        tracing::info!(node = %name, health = ?h, "node taints change");
        node_api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": if wanted.is_empty() { None } else { Some(&wanted) }}})),
            )
            .await?;
    }
    if h == Health::Unreachable {
        mark_unknown(&node_api, &node, now).await?;
    }
    // Look again when the heartbeat would run out.
    let mut next = fresh.then_some(left);
    let no_execute: Vec<Taint> = wanted
        .into_iter()
        .filter(|t| t.effect == "NoExecute")
        .collect();
    if no_execute.is_empty() {
        return Ok(next.map_or(Action::await_change(), |d| {
            Action::requeue(d.max(cfg.period))
        }));
    }
    // Edge autonomy: the pods of a node that runs them on its own while unreachable (an edge
    // node) stay; only their Ready condition says the cloud cannot see them.
    let autonomous = node
        .annotations()
        .get(AUTONOMY_ANNOTATION)
        .is_some_and(|v| v == "true");
    for pod in ctx.pods.state() {
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(name.as_str())
            || pod.metadata.deletion_timestamp.is_some()
            || util::is_terminal(&pod)
        {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        if h == Health::Unreachable && util::is_ready(&pod) {
            let cond = json!({"type": "Ready", "status": "False", "reason": "NodeNotReady",
                "message": "", "lastTransitionTime": util::rfc3339(now)});
            let _ = api
                .patch_status(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Strategic(json!({"status": {"conditions": [cond]}})),
                )
                .await;
        }
        if autonomous {
            continue;
        }
        match eviction_time(&pod, &no_execute, now) {
            Some(t) if t <= now => {
                tracing::info!(pod = %util::key(pod.as_ref()), node = %name, "evicting pod from tainted node");
                match api.delete(&pod.name_any(), &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Some(t) => {
                // Look again when this pod's toleration runs out.
                let wait = Duration::from_secs((t - now).get_seconds().max(0) as u64);
                next = Some(next.map_or(wait, |n| n.min(wait)));
            }
            None => {}
        }
    }
    Ok(next.map_or(Action::await_change(), |d| {
        Action::requeue(d.max(cfg.period))
    }))
}

/// Sets every condition of an unreachable node to Unknown (once).
async fn mark_unknown(api: &Api<Node>, node: &Node, now: jiff::Timestamp) -> crate::Result<()> {
    let Some(conds) = node.status.as_ref().and_then(|s| s.conditions.as_ref()) else {
        return Ok(());
    };
    if conds.iter().all(|c| c.status == "Unknown") {
        return Ok(());
    }
    let updated: Vec<serde_json::Value> = conds
        .iter()
        .map(|c| {
            let mut v = serde_json::to_value(c).unwrap_or_default();
            if c.status != "Unknown" {
                v["status"] = json!("Unknown");
                v["reason"] = json!("NodeStatusUnknown");
                v["message"] = json!("Kubelet stopped posting node status.");
                v["lastTransitionTime"] = json!(util::rfc3339(now));
            }
            v
        })
        .collect();
    api.patch_status(
        &node.name_any(),
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": updated}})),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str, taints: serde_json::Value) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": "n"}, "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}),
        )
        .unwrap()
    }

    #[test]
    fn health_and_taints_follow_heartbeats_and_readiness() {
        let now = jiff::Timestamp::now();
        let n = node(
            "True",
            json!([{"key": "dedicated", "effect": "NoSchedule"}]),
        );
        assert_eq!(health(&n, true), Health::Ready);
        assert_eq!(health(&n, false), Health::Unreachable);
        let t = wanted_taints(&n, Health::Unreachable, now);
        let keys: Vec<(&str, &str)> = t
            .iter()
            .map(|t| (t.key.as_str(), t.effect.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("dedicated", "NoSchedule"),
                (UNREACHABLE, "NoSchedule"),
                (UNREACHABLE, "NoExecute")
            ]
        );
        // Back to Ready: our taints go, others stay.
        let tainted = Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(t),
                ..Default::default()
            }),
            ..n
        };
        assert_eq!(wanted_taints(&tainted, Health::Ready, now).len(), 1);
        assert_eq!(health(&node("False", json!([])), true), Health::NotReady);
        let unreported: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(health(&unreported, true), Health::Ready);
        // A node saying it cannot tell (a virtual node whose backend is gone) is unreachable.
        assert_eq!(
            health(&node("Unknown", json!([])), true),
            Health::Unreachable
        );
    }

    #[test]
    fn eviction_waits_for_the_shortest_toleration_and_never_for_unbounded_ones() {
        let added = jiff::Timestamp::now();
        let taint = Taint {
            key: UNREACHABLE.into(),
            effect: "NoExecute".into(),
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(added)),
            value: None,
        };
        let pod = |tolerations: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [], "tolerations": tolerations}})).unwrap()
        };
        assert_eq!(
            eviction_time(&pod(json!([])), std::slice::from_ref(&taint), added),
            Some(added)
        );
        let five = pod(
            json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]),
        );
        assert_eq!(
            eviction_time(&five, std::slice::from_ref(&taint), added),
            Some(added + jiff::SignedDuration::from_secs(5))
        );
        let forever = pod(json!([{"operator": "Exists"}]));
        assert_eq!(eviction_time(&forever, &[taint], added), None);
    }
}

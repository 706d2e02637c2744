//! The disruption controller (upstream's): keeps each PodDisruptionBudget's status — the
//! pods it expects, how many are healthy, how many must be, and so how many disruptions it
//! allows now — which the eviction subresource enforces (429 when a disruption would break
//! the budget). Pods the apiserver evicted stay in `disruptedPods` (and do not count as
//! healthy) until they are gone, or for two minutes.

use crate::driver::Driver;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long an evicted pod counts as disrupted if it is not deleted (upstream: 2 minutes).
pub const DELETION_TIMEOUT_SECONDS: i64 = 120;

/// What a budget says now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Pods the budget expects (the controllers' scale, or the pods it selects).
    pub expected: i32,
    /// Healthy pods it needs.
    pub desired: i32,
    /// Healthy pods it has (Ready, not being deleted, not disrupted).
    pub healthy: i32,
    /// Disruptions it allows now.
    pub allowed: i32,
}

/// `value` of an int-or-percent against `total`, rounding a percentage up (as upstream's
/// `GetScaledValueFromIntOrPercent(…, true)`).
fn scaled(value: &IntOrString, total: i32) -> i32 {
    match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            ((pct * i64::from(total) + 99) / 100) as i32
        }
    }
}

/// The budget for a spec, given the healthy pods, the selected pods, and the scale of their
/// controllers (`None` when a pod has no scalable controller).
pub fn budget(
    min_available: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    healthy: i32,
    pods: i32,
    scale: Option<i32>,
) -> Budget {
    let (expected, desired) = match (min_available, max_unavailable) {
        (_, Some(max)) => {
            let expected = scale.unwrap_or(pods);
            (expected, (expected - scaled(max, expected)).max(0))
        }
        (Some(IntOrString::Int(n)), None) => (pods, *n),
        (Some(min), None) => {
            let expected = scale.unwrap_or(pods);
            (expected, scaled(min, expected))
        }
        // Neither: upstream's default is minAvailable 1.
        (None, None) => (pods, 1),
    };
    Budget {
        expected,
        desired,
        healthy,
        allowed: (healthy - desired).max(0),
    }
}

fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

struct Ctx {
    client: Client,
    pods: Store<Pod>,
    replicasets: Store<ReplicaSet>,
    statefulsets: Store<StatefulSet>,
}

/// Runs the controller until `shutdown`: a budget is looked at again when it, a pod or a
/// workload's scale in its namespace changes.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Ctx {
        client,
        pods: informers.all::<Pod>().await,
        replicasets: informers.all::<ReplicaSet>().await,
        statefulsets: informers.all::<StatefulSet>().await,
    });
    let driver = Driver::<PodDisruptionBudget>::new("disruption", &informers).await;
    let pdbs = driver.store();
    let in_namespace = move |ns: Option<String>| {
        pdbs.state()
            .iter()
            .filter(|p| p.namespace() == ns)
            .map(|p| ObjectRef::from(p.as_ref()))
            .collect::<Vec<_>>()
    };
    let (a, b, c) = (in_namespace.clone(), in_namespace.clone(), in_namespace);
    driver
        .watches::<Pod, _>(move |p| a(p.namespace()))
        .watches::<ReplicaSet, _>(move |r| b(r.namespace()))
        .watches::<StatefulSet, _>(move |s| c(s.namespace()))
        .run(sync, ctx, shutdown)
        .await;
}

/// Brings one budget's status up to date.
async fn sync(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Ctx>) -> crate::Result<Action> {
    let client = &ctx.client;
    let now = jiff::Timestamp::now();
    let all_pods = ctx.pods.state();
    let rs_scale: HashMap<String, i32> = ctx
        .replicasets
        .state()
        .iter()
        .filter_map(|r| Some((r.uid()?, r.spec.as_ref()?.replicas.unwrap_or(1))))
        .collect();
    let sts_scale: HashMap<String, i32> = ctx
        .statefulsets
        .state()
        .iter()
        .filter_map(|s| Some((s.uid()?, s.spec.as_ref()?.replicas.unwrap_or(1))))
        .collect();
    let ns = pdb.namespace().unwrap_or_default();
    let spec = pdb.spec.clone().unwrap_or_default();
    let Some(selector) = spec.selector.as_ref() else {
        return Ok(Action::await_change());
    };
    let selector = crate::util::Selector::new(selector);
    let selected: Vec<&std::sync::Arc<Pod>> = all_pods
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| selector.matches(p.metadata.labels.as_ref()))
        .collect();
    // Evicted pods that are not gone yet (and not too old) stay disrupted.
    let before: BTreeMap<String, k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> = pdb
        .status
        .as_ref()
        .and_then(|s| s.disrupted_pods.clone())
        .unwrap_or_default();
    let disrupted: BTreeMap<String, String> = before
        .into_iter()
        .filter(|(name, at)| {
            let live = selected
                .iter()
                .any(|p| &p.name_any() == name && p.metadata.deletion_timestamp.is_none());
            live && (now - at.0).get_seconds() < DELETION_TIMEOUT_SECONDS
        })
        .map(|(name, at)| (name, crate::util::rfc3339(at.0)))
        .collect();
    // An evicted pod that is not deleted stops counting as disrupted after the timeout.
    let next = match disrupted
        .values()
        .filter_map(|at| at.parse::<jiff::Timestamp>().ok())
        .map(|at| DELETION_TIMEOUT_SECONDS - (now - at).get_seconds())
        .min()
    {
        Some(secs) => Action::requeue(Duration::from_secs(
            secs.clamp(1, DELETION_TIMEOUT_SECONDS) as u64
        )),
        None => Action::await_change(),
    };
    let healthy = selected
        .iter()
        .filter(|p| ready(p) && !disrupted.contains_key(&p.name_any()))
        .count() as i32;
    // The scale of the selected pods' controllers, counted once each.
    let mut owners: HashMap<String, i32> = HashMap::new();
    let mut unscaled = false;
    for p in &selected {
        match crate::util::controller_of(&p.metadata).and_then(|o| {
            rs_scale
                .get(&o.uid)
                .or(sts_scale.get(&o.uid))
                .map(|s| (o.uid.clone(), *s))
        }) {
            Some((uid, s)) => {
                owners.insert(uid, s);
            }
            None => unscaled = true,
        }
    }
    let scale = (!unscaled).then(|| owners.values().sum());
    let b = budget(
        spec.min_available.as_ref(),
        spec.max_unavailable.as_ref(),
        healthy,
        selected.len() as i32,
        scale,
    );
    let generation = pdb.metadata.generation.unwrap_or(0);
    let (status, reason) = if b.allowed > 0 {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let old = pdb.status.clone().unwrap_or_default();
    let old_condition = old
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "DisruptionAllowed"));
    let unchanged = old.observed_generation == Some(generation)
        && old.expected_pods == b.expected
        && old.desired_healthy == b.desired
        && old.current_healthy == b.healthy
        && old.disruptions_allowed == b.allowed
        && old_condition.is_some_and(|c| c.status == status)
        && old.disrupted_pods.as_ref().map_or(0, |d| d.len()) == disrupted.len();
    if unchanged {
        return Ok(next);
    }
    let transition = match old_condition {
        Some(c) if c.status == status => serde_json::to_value(&c.last_transition_time)?,
        _ => json!(crate::util::rfc3339(now)),
    };
    let patch = json!({
        "metadata": {"resourceVersion": pdb.resource_version()},
        "status": {
            "observedGeneration": generation,
            "expectedPods": b.expected,
            "desiredHealthy": b.desired,
            "currentHealthy": b.healthy,
            "disruptionsAllowed": b.allowed,
            "disruptedPods": if disrupted.is_empty() { serde_json::Value::Null } else { json!(disrupted) },
            "conditions": [{"type": "DisruptionAllowed", "status": status, "reason": reason,
                            "message": "", "observedGeneration": generation,
                            "lastTransitionTime": transition}],
        },
    });
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    match api
        .patch_status(
            &pdb.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(next),
        // The budget changed meanwhile: its new version comes through the watch.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            Ok(Action::requeue(Duration::from_millis(500)))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(n: i32) -> IntOrString {
        IntOrString::Int(n)
    }

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    #[test]
    fn budgets_follow_upstreams_arithmetic() {
        // minAvailable 2 over 3 healthy pods: one disruption.
        assert_eq!(
            budget(Some(&int(2)), None, 3, 3, Some(3)),
            Budget {
                expected: 3,
                desired: 2,
                healthy: 3,
                allowed: 1
            }
        );
        // With one pod already gone, none.
        assert_eq!(budget(Some(&int(2)), None, 2, 3, Some(3)).allowed, 0);
        // Percentages round up against the controllers' scale.
        assert_eq!(budget(Some(&pct("50%")), None, 5, 5, Some(5)).desired, 3);
        // maxUnavailable: the scale less the budget.
        assert_eq!(
            budget(None, Some(&int(1)), 4, 4, Some(4)),
            Budget {
                expected: 4,
                desired: 3,
                healthy: 4,
                allowed: 1
            }
        );
        assert_eq!(budget(None, Some(&pct("25%")), 3, 4, Some(4)).allowed, 0);
        // Never negative.
        assert_eq!(budget(Some(&int(5)), None, 2, 2, None).allowed, 0);
    }
}

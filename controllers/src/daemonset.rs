//! The DaemonSet controller (upstream's, in outline): one pod per eligible node, pinned to it
//! by required node affinity on `metadata.name` (the scheduler binds it), with the automatic
//! tolerations upstream adds (`not-ready`/`unreachable` NoExecute, pressure and
//! `unschedulable` NoSchedule). A node is eligible when it matches the template's node
//! selector and required node affinity and the pod tolerates its NoSchedule/NoExecute taints.
//! Each template is a ControllerRevision (`<name>-<hash>`, its `revision` the newest for the
//! template in use), so `kubectl rollout history|undo daemonset` work; pods carry the
//! `controller-revision-hash` label. `RollingUpdate` replaces old pods at most `maxUnavailable`
//! at a time, or with `maxSurge` starts the new pod next to the old one on at most that many
//! nodes at a time and removes the old one once the new one is ready; `OnDelete` waits for
//! the user to delete them.

use crate::driver::Driver;
use crate::expectations::Expectations;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod, Toleration};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub use crate::history::HASH_LABEL;

/// The tolerations every daemon pod gets (upstream's `AddOrUpdateDaemonPodTolerations`).
pub fn automatic_tolerations() -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    };
    vec![
        t("node.kubernetes.io/not-ready", "NoExecute"),
        t("node.kubernetes.io/unreachable", "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]
}

/// Whether a daemon pod of `template` should run on `node`: the scheduler's placement rules
/// with the automatic tolerations added. Readiness and cordons do not matter (the automatic
/// tolerations cover the taints that come with them).
pub fn eligible(template: &Pod, node: &Node) -> bool {
    let mut tolerations = template
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    tolerations.extend(automatic_tolerations());
    crate::scheduler::placement(template, &tolerations, node).is_ok()
}

/// Whether a daemon pod already on `node` may stay there: as [`eligible`], except that
/// untolerated `NoSchedule` taints only keep new pods away (upstream's
/// `shouldContinueRunning`); `NoExecute` ones still evict.
pub fn may_stay(template: &Pod, node: &Node) -> bool {
    let mut t = template.clone();
    let spec = t.spec.get_or_insert_with(Default::default);
    spec.tolerations
        .get_or_insert_with(Vec::new)
        .push(Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        });
    eligible(&t, node)
}

/// The node a daemon pod is for: its binding, or its node affinity.
fn node_of(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = &spec.node_name {
        return Some(n.clone());
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .first()?
        .match_fields
        .as_ref()?
        .iter()
        .find(|f| f.key == "metadata.name")?
        .values
        .as_ref()?
        .first()
        .cloned()
}

/// Runs the controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Ctx {
        recorder: minik8s_events::Recorder::new(client.clone(), "daemonset-controller", None),
        client,
        pods: informers.all::<Pod>().await,
        nodes: informers.all::<Node>().await,
        revisions: informers.all::<ControllerRevision>().await,
        expectations: Expectations::default(),
    });
    Driver::<DaemonSet>::new("daemonset", &informers)
        .await
        // Upstream's --concurrent-daemonset-syncs.
        .workers(2)
        .owns::<Pod>()
        // Revisions are read, not watched, as upstream's controller: a client's change to
        // one is taken at the next sync, not raced.
        .watches_all::<Node>()
        .run(sync, ctx, shutdown)
        .await;
}

struct Ctx {
    client: Client,
    recorder: minik8s_events::Recorder,
    pods: Store<Pod>,
    nodes: Store<Node>,
    revisions: Store<ControllerRevision>,
    expectations: Expectations,
}

/// One DaemonSet's sync; while it has not converged (pods to start, become available or
/// roll), it is looked at again shortly, as time alone moves it (`minReadySeconds`).
async fn sync(ds: Arc<DaemonSet>, ctx: Arc<Ctx>) -> crate::Result<Action> {
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    reconcile(&ctx, &ds).await?;
    let settled = ds.status.as_ref().is_some_and(|s| {
        s.observed_generation == ds.metadata.generation
            && s.number_misscheduled == 0
            && [
                s.current_number_scheduled,
                s.number_ready,
                s.updated_number_scheduled.unwrap_or(0),
                s.number_available.unwrap_or(0),
            ]
            .iter()
            .all(|n| *n == s.desired_number_scheduled)
    });
    Ok(crate::driver::until_settled(settled))
}

async fn reconcile(ctx: &Ctx, ds: &DaemonSet) -> crate::Result<()> {
    let (client, recorder, pods, nodes) = (&ctx.client, &ctx.recorder, &ctx.pods, &ctx.nodes);
    let (revisions, exp) = (&ctx.revisions, &ctx.expectations);
    let ns = ds.namespace().unwrap_or_default();
    let uid = ds.uid().unwrap_or_default();
    let spec = ds.spec.clone().unwrap_or_default();
    let template = spec.template.clone();
    let hash = crate::util::hash_of(&template);
    let limit = spec.revision_history_limit.unwrap_or(10);
    crate::history::ensure(client, ds, &template, &hash, limit, revisions).await?;
    let template_pod = Pod {
        metadata: template.metadata.clone().unwrap_or_default(),
        spec: template.spec.clone(),
        status: None,
    };
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mine: Vec<Arc<Pod>> = pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| crate::util::controller_of(&p.metadata).is_some_and(|o| o.uid == uid))
        .collect();
    // Until the pods it created and deleted show in the cache, the cache is behind this
    // controller's own writes: acting on it could start a second pod on a node.
    let seen: BTreeMap<String, bool> = mine
        .iter()
        .map(|p| (p.name_any(), p.metadata.deletion_timestamp.is_some()))
        .collect();
    let observed = |n: &str| match n.strip_prefix('-') {
        Some(gone) => seen.get(gone).is_none_or(|deleting| *deleting),
        None => seen.contains_key(n),
    };
    if !exp.satisfied(&uid, observed) {
        return Ok(());
    }
    let mut by_node: BTreeMap<String, Vec<Arc<Pod>>> = BTreeMap::new();
    for p in &mine {
        if let Some(n) = node_of(p) {
            by_node.entry(n).or_default().push(p.clone());
        }
    }
    let all_nodes = nodes.state();
    let (mut desired, mut current, mut misscheduled) = (0, 0, 0);
    let (mut ready_n, mut updated, mut unavailable) = (0, 0, 0);
    let mut old_ready: Vec<(String, Arc<Pod>)> = Vec::new();
    // Surge is on when `maxSurge` is not zero (its size, a share of the nodes, is known once
    // they are counted below).
    let surge_on = is_rolling(&spec) && rolling_param(&spec, |r| r.max_surge.clone(), 1, 0) > 0;
    let mut surging = 0;
    for node in &all_nodes {
        let name = node.name_any();
        let on_node: Vec<Arc<Pod>> = by_node
            .remove(&name)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let wanted =
            eligible(&template_pod, node) || (!on_node.is_empty() && may_stay(&template_pod, node));
        if !wanted {
            misscheduled += on_node
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .count();
            for p in on_node {
                delete(&pod_api, recorder, exp, ds, &p).await?;
            }
            continue;
        }
        desired += 1;
        // Failed pods are replaced; extra pods go.
        let (failed, mut live): (Vec<_>, Vec<_>) = on_node
            .into_iter()
            .partition(|p| crate::util::phase(p) == "Failed");
        for p in failed {
            recorder.warning(
                &ds.object_ref(&()),
                "FailedDaemonPod",
                format!(
                    "Found failed daemon pod {ns}/{} on node {name}, will try to kill it",
                    p.name_any()
                ),
            );
            delete(&pod_api, recorder, exp, ds, &p).await?;
        }
        live.sort_by_key(|p| {
            (
                p.labels().get(HASH_LABEL) != Some(&hash),
                p.metadata.creation_timestamp.clone(),
            )
        });
        // With surge, a node may briefly hold its old pod and its new one: the old goes once
        // the new is ready (or at once if it is not ready itself).
        let newest = live
            .first()
            .filter(|p| p.labels().get(HASH_LABEL) == Some(&hash));
        let surge_pair = surge_on
            && newest.is_some()
            && live.len() > 1
            && !crate::util::is_ready(newest.expect("checked"))
            && crate::util::is_ready(&live[1]);
        let keep = if surge_pair { 2 } else { 1 };
        for extra in live.iter().skip(keep) {
            delete(&pod_api, recorder, exp, ds, extra).await?;
        }
        if surge_pair {
            surging += 1;
            current += 1;
            updated += 1;
            ready_n += 1;
            continue;
        }
        match live.first() {
            None => {
                unavailable += 1;
                create(&pod_api, recorder, exp, ds, &template, &hash, &name).await?;
            }
            Some(p) => {
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                    current += 1;
                }
                let is_new = p.labels().get(HASH_LABEL) == Some(&hash);
                if is_new {
                    updated += 1;
                }
                if crate::util::is_ready(p) {
                    ready_n += 1;
                    if !is_new {
                        old_ready.push((name.clone(), p.clone()));
                    }
                } else {
                    unavailable += 1;
                    if !is_new && is_rolling(&spec) {
                        // An old pod that is not ready anyway goes first.
                        delete(&pod_api, recorder, exp, ds, p).await?;
                    }
                }
            }
        }
    }
    // Pods on nodes that are gone.
    for p in by_node.into_values().flatten() {
        delete(&pod_api, recorder, exp, ds, &p).await?;
    }
    if surge_on {
        // Surge: start new pods next to ready old ones, `maxSurge` nodes at a time.
        let surge = rolling_param(&spec, |r| r.max_surge.clone(), desired, 0);
        let budget = (surge - surging).max(0) as usize;
        for (node, _) in old_ready.iter().take(budget) {
            create(&pod_api, recorder, exp, ds, &template, &hash, node).await?;
        }
    } else if is_rolling(&spec) {
        let max = rolling_param(&spec, |r| r.max_unavailable.clone(), desired, 1).max(1);
        let budget = (max - unavailable).max(0) as usize;
        for (_, p) in old_ready.iter().take(budget) {
            delete(&pod_api, recorder, exp, ds, p).await?;
        }
    }
    let generation = ds.metadata.generation.unwrap_or(0);
    let status = json!({
        "observedGeneration": generation,
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": current,
        "numberMisscheduled": misscheduled,
        "numberReady": ready_n,
        "numberAvailable": ready_n,
        "numberUnavailable": (desired - ready_n).max(0),
        "updatedNumberScheduled": updated,
    });
    let old = serde_json::to_value(ds.status.clone().unwrap_or_default())?;
    let changed = status
        .as_object()
        .expect("an object")
        .iter()
        .any(|(k, v)| old.get(k).unwrap_or(&json!(0)) != v);
    if changed {
        Api::<DaemonSet>::namespaced(client.clone(), &ns)
            .patch_status(
                &ds.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await?;
    }
    Ok(())
}

/// A rolling-update parameter (`maxSurge`, `maxUnavailable`) as a number of nodes out of
/// `total` (percentages round up, as upstream's), `default` when unset.
fn rolling_param(
    spec: &k8s_openapi::api::apps::v1::DaemonSetSpec,
    field: impl Fn(&k8s_openapi::api::apps::v1::RollingUpdateDaemonSet) -> Option<IntOrString>,
    total: i32,
    default: i32,
) -> i32 {
    spec.update_strategy
        .as_ref()
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(field)
        .map_or(default, |m| match m {
            IntOrString::Int(n) => n,
            IntOrString::String(s) => {
                let pct: i32 = s.trim_end_matches('%').parse().unwrap_or(0);
                (pct * total + 99) / 100
            }
        })
        .max(0)
}

fn is_rolling(spec: &k8s_openapi::api::apps::v1::DaemonSetSpec) -> bool {
    spec.update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

/// Deletes one of the set's pods, saying so as upstream's `SuccessfulDelete`.
async fn delete(
    api: &Api<Pod>,
    recorder: &minik8s_events::Recorder,
    exp: &Expectations,
    ds: &DaemonSet,
    pod: &Pod,
) -> crate::Result<()> {
    let (uid, gone) = (ds.uid().unwrap_or_default(), format!("-{}", pod.name_any()));
    exp.expect(&uid, [gone.clone()]);
    if let Err(e) = crate::util::delete_pod(api, pod).await {
        exp.forget(&uid, &gone);
        return Err(e);
    }
    recorder.normal(
        &ds.object_ref(&()),
        "SuccessfulDelete",
        format!("Deleted pod: {}", pod.name_any()),
    );
    Ok(())
}

async fn create(
    api: &Api<Pod>,
    recorder: &minik8s_events::Recorder,
    exp: &Expectations,
    ds: &DaemonSet,
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    hash: &str,
    node: &str,
) -> crate::Result<()> {
    let mut spec = serde_json::to_value(template.spec.clone().unwrap_or_default())?;
    let mut tolerations: Vec<serde_json::Value> = spec
        .get("tolerations")
        .and_then(|t| t.as_array())
        .cloned()
        .unwrap_or_default();
    for t in automatic_tolerations() {
        let t = serde_json::to_value(t)?;
        if !tolerations.contains(&t) {
            tolerations.push(t);
        }
    }
    spec["tolerations"] = json!(tolerations);
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}],
    });
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    labels.insert(
        "pod-template-generation".into(),
        ds.metadata.generation.unwrap_or(1).to_string(),
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{}-{}", ds.name_any(), crate::util::random_suffix()),
            "labels": labels,
            "annotations": template.metadata.as_ref().and_then(|m| m.annotations.clone()),
            "ownerReferences": [crate::util::owner_ref(ds)],
        },
        "spec": spec,
    }))?;
    let (uid, name) = (ds.uid().unwrap_or_default(), pod.name_any());
    exp.expect(&uid, [name.clone()]);
    let created = api.create(&PostParams::default(), &pod).await;
    if created.is_err() {
        exp.forget(&uid, &name);
    }
    match created {
        Ok(created) => {
            recorder.normal(
                &ds.object_ref(&()),
                "SuccessfulCreate",
                format!("Created pod: {}", created.name_any()),
            );
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => {
            recorder.warning(
                &ds.object_ref(&()),
                "FailedCreate",
                format!("Error creating: {}", crate::util::api_message(&e)),
            );
            Err(e.into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(spec: serde_json::Value, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": labels},
            "spec": spec,
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "False"}]},
        }))
        .unwrap()
    }

    fn template(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"spec": spec})).unwrap()
    }

    #[test]
    fn eligibility_follows_selectors_and_taints_but_not_cordons_or_readiness() {
        let plain = template(json!({"containers": [{"name": "c"}]}));
        // Not ready and cordoned: still a daemon's node.
        assert!(eligible(
            &plain,
            &node(json!({"unschedulable": true}), json!({}))
        ));
        let tainted = node(
            json!({"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}),
            json!({}),
        );
        assert!(!eligible(&plain, &tainted));
        // A pod already there stays on NoSchedule, not on NoExecute.
        assert!(may_stay(&plain, &tainted));
        let evicting = node(
            json!({"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]}),
            json!({}),
        );
        assert!(!may_stay(&plain, &evicting));
        let tolerant = template(json!({"containers": [{"name": "c"}],
            "tolerations": [{"key": "dedicated", "operator": "Exists"}]}));
        assert!(eligible(&tolerant, &tainted));
        let picky =
            template(json!({"containers": [{"name": "c"}], "nodeSelector": {"disk": "ssd"}}));
        assert!(!eligible(&picky, &node(json!({}), json!({}))));
        assert!(eligible(&picky, &node(json!({}), json!({"disk": "ssd"}))));
    }
}

//! The StatefulSet controller (upstream's `stateful_set_control`, in outline): pods with
//! stable names `<set>-<ordinal>` and host names (`spec.hostname`, and `spec.subdomain` from
//! `serviceName`, so `web-0.web.<ns>.svc` resolves through the headless Service), and one
//! PersistentVolumeClaim per `volumeClaimTemplates` entry and ordinal,
//! `<template>-<set>-<ordinal>`, made before the pod and kept across its restarts.
//!
//! `OrderedReady` creates pods one at a time in ordinal order, each after the one before is
//! Running and Ready, and removes surplus ones from the highest ordinal down, one at a time;
//! `Parallel` does both at once. Each template is a ControllerRevision (see [`history`]);
//! pods carry its name in `controller-revision-hash`. `RollingUpdate` replaces, from the
//! highest ordinal down to `partition`, one pod at a time whose revision is not the newest,
//! once all pods are Running and Ready; ordinals below the partition keep (and are recreated
//! at) the current revision. `OnDelete` replaces pods only when the user deletes them.
//! `persistentVolumeClaimRetentionPolicy`: `whenDeleted: Delete` makes the set own its
//! claims (the garbage collector removes them with it); `whenScaled: Delete` makes a
//! condemned pod own its claims before it is deleted.
//!
//! [`history`]: crate::history

use crate::driver::Driver;
use crate::history::{self, HASH_LABEL};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The label naming a StatefulSet pod.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// The label holding a StatefulSet pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// The ordinal of `pod` if it is named as a pod of `set`.
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    let rest = pod.strip_prefix(set)?.strip_prefix('-')?;
    if rest.is_empty() || (rest.len() > 1 && rest.starts_with('0')) {
        return None;
    }
    rest.parse().ok()
}

/// The claim of volume template `template` for ordinal `ord` of `set`.
pub fn claim_name(template: &str, set: &str, ord: i32) -> String {
    format!("{template}-{set}-{ord}")
}

fn running_and_ready(p: &Pod) -> bool {
    crate::util::phase(p) == "Running" && crate::util::is_ready(p)
}

fn terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

fn revision_of(p: &Pod) -> Option<&str> {
    p.labels().get(HASH_LABEL).map(String::as_str)
}

/// What one pass decided to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Ordinals to create, with whether they get the update revision (else the current one).
    pub create: Vec<(i32, bool)>,
    /// Pods to delete, by ordinal (failed, surplus, or replaced by a rolling update).
    pub delete: Vec<i32>,
    /// Surplus ordinals among `delete` (their claims follow `whenScaled`).
    pub condemned: Vec<i32>,
}

/// Decides one pass: which ordinals to create and which pods to delete, given the pods by
/// ordinal. `update` is the newest revision's name.
pub fn plan(spec: &StatefulSetSpec, pods: &BTreeMap<i32, Arc<Pod>>, update: &str) -> Plan {
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let start = spec
        .ordinals
        .as_ref()
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0);
    let end = start + replicas;
    let ordered = spec.pod_management_policy.as_deref() != Some("Parallel");
    let strategy = spec.update_strategy.as_ref();
    let rolling = strategy
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    let partition = strategy
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
        .max(0);
    let mut out = Plan::default();
    // Pods in range: create missing ones, replace failed ones; in order, wait for each.
    let mut all_healthy = true;
    for ord in start..end {
        let healthy = match pods.get(&ord) {
            None => {
                let to_update = !rolling || ord >= start + partition;
                out.create.push((ord, to_update));
                false
            }
            Some(p) if terminating(p) => false,
            Some(p) if crate::util::is_terminal(p) => {
                out.delete.push(ord);
                false
            }
            Some(p) => running_and_ready(p),
        };
        if !healthy {
            all_healthy = false;
            if ordered {
                break;
            }
        }
    }
    // Surplus pods, from the highest ordinal down.
    let condemned: Vec<(&i32, &Arc<Pod>)> = pods
        .iter()
        .rev()
        .filter(|(o, _)| **o < start || **o >= end)
        .collect();
    if ordered && !all_healthy {
        return out;
    }
    // Upstream's firstUnhealthyPod: the lowest unhealthy pod, in range first, then condemned.
    // In order, an unhealthy condemned pod is deleted only when it is that one, so a scale
    // down halts while pods are unhealthy.
    let healthy = |p: &Pod| running_and_ready(p) && !terminating(p);
    let first_unhealthy = pods
        .iter()
        .filter(|(o, _)| **o >= start && **o < end)
        .chain(pods.iter().filter(|(o, _)| **o < start || **o >= end))
        .find(|(_, p)| !healthy(p))
        .map(|(o, _)| *o);
    for (ord, p) in &condemned {
        if terminating(p) {
            if ordered {
                return out;
            }
            continue;
        }
        if ordered && !running_and_ready(p) && first_unhealthy != Some(**ord) {
            return out;
        }
        out.delete.push(**ord);
        out.condemned.push(**ord);
        if ordered {
            return out;
        }
    }
    if !condemned.is_empty() || !all_healthy || !rolling {
        return out;
    }
    // Rolling update: the highest ordinal not at the update revision, one at a time.
    for ord in (start + partition..end).rev() {
        let Some(p) = pods.get(&ord) else { return out };
        if revision_of(p) != Some(update) && !terminating(p) {
            out.delete.push(ord);
            return out;
        }
        if !running_and_ready(p) {
            return out;
        }
    }
    out
}

/// Runs the controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Ctx {
        recorder: minik8s_events::Recorder::new(client.clone(), "statefulset-controller", None),
        client,
        pods: informers.all::<Pod>().await,
        claims: informers.all::<PersistentVolumeClaim>().await,
        revisions: informers.all::<ControllerRevision>().await,
    });
    Driver::<StatefulSet>::new("statefulset", &informers)
        .await
        // Upstream's --concurrent-statefulset-syncs.
        .workers(5)
        .owns::<Pod>()
        // Revisions are read, not watched, as upstream's controller: a client's change to
        // one is taken at the next sync, not raced.
        .run(sync, ctx, shutdown)
        .await;
}

struct Ctx {
    client: Client,
    recorder: minik8s_events::Recorder,
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    revisions: Store<ControllerRevision>,
}

/// One StatefulSet's sync; while it has not converged (pods to create, become ready or
/// roll), it is looked at again shortly, as time alone moves it (`minReadySeconds`).
async fn sync(set: Arc<StatefulSet>, ctx: Arc<Ctx>) -> crate::Result<Action> {
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    reconcile(
        &ctx.client,
        &ctx.recorder,
        &set,
        &ctx.pods,
        &ctx.claims,
        &ctx.revisions,
    )
    .await?;
    let want = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let settled = set.status.as_ref().is_some_and(|s| {
        s.observed_generation == set.metadata.generation
            && s.current_revision == s.update_revision
            && [
                s.replicas,
                s.ready_replicas.unwrap_or(0),
                s.current_replicas.unwrap_or(0),
                s.updated_replicas.unwrap_or(0),
                s.available_replicas.unwrap_or(0),
            ]
            .iter()
            .all(|n| *n == want)
    });
    Ok(crate::driver::until_settled(settled))
}

async fn reconcile(
    client: &Client,
    recorder: &minik8s_events::Recorder,
    set: &StatefulSet,
    pods: &Store<Pod>,
    claims: &Store<PersistentVolumeClaim>,
    revisions: &Store<ControllerRevision>,
) -> crate::Result<()> {
    let ns = set.namespace().unwrap_or_default();
    let name = set.name_any();
    let uid = set.uid().unwrap_or_default();
    let spec = set.spec.clone().unwrap_or_default();
    let hash = crate::util::hash_of(&spec.template);
    let limit = spec.revision_history_limit.unwrap_or(10);
    history::ensure(client, set, &spec.template, &hash, limit, revisions).await?;
    let update = history::name(&name, &hash);
    let status = set.status.clone().unwrap_or_default();
    let current = status
        .current_revision
        .clone()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| update.clone());
    let current_template = history::of(set, revisions)
        .iter()
        .find(|r| r.name_any() == current)
        .and_then(|r| history::template(r))
        .unwrap_or_else(|| spec.template.clone());

    let mine: BTreeMap<i32, Arc<Pod>> = pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| crate::util::controller_of(&p.metadata).is_some_and(|o| o.uid == uid))
        .filter_map(|p| ordinal_of(&name, &p.name_any()).map(|o| (o, p)))
        .collect();
    let decided = plan(&spec, &mine, &update);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for ord in &decided.delete {
        if let Some(p) = mine.get(ord) {
            if decided.condemned.contains(ord) && retention(&spec, "whenScaled") {
                own_claims(client, set, *ord, p, claims).await?;
            }
            crate::util::delete_pod(&pod_api, p).await?;
            // upstream's recordPodEvent wording.
            recorder.normal(
                &set.object_ref(&()),
                "SuccessfulDelete",
                format!(
                    "delete Pod {} in StatefulSet {name} successful",
                    p.name_any()
                ),
            );
        }
    }
    for (ord, to_update) in &decided.create {
        let (template, revision) = if *to_update {
            (&spec.template, &update)
        } else {
            (&current_template, &current)
        };
        if !ensure_claims(client, set, *ord, claims).await? {
            continue;
        }
        let pod_name = format!("{name}-{ord}");
        match create(&pod_api, set, template, revision, *ord).await {
            Ok(true) => recorder.normal(
                &set.object_ref(&()),
                "SuccessfulCreate",
                format!("create Pod {pod_name} in StatefulSet {name} successful"),
            ),
            Ok(false) => {}
            Err(e) => {
                recorder.warning(
                    &set.object_ref(&()),
                    "FailedCreate",
                    format!("create Pod {pod_name} in StatefulSet {name} failed error: {e}"),
                );
                return Err(e);
            }
        }
    }

    // Status, from the pods as they are (the next pass sees this pass's changes).
    let replicas = spec.replicas.unwrap_or(1);
    let count = |f: &dyn Fn(&Pod) -> bool| mine.values().filter(|p| f(p)).count() as i32;
    let ready = count(&|p| crate::util::is_ready(p) && !terminating(p));
    let updated = count(&|p| revision_of(p) == Some(update.as_str()) && !terminating(p));
    let at_current = count(&|p| revision_of(p) == Some(current.as_str()) && !terminating(p));
    let rolling = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    // A finished rolling update makes the update revision the current one.
    let (current, at_current) =
        if current != update && rolling && updated == replicas && ready == replicas {
            (update.clone(), updated)
        } else {
            (current, at_current)
        };
    let new_status = json!({
        "observedGeneration": set.metadata.generation.unwrap_or(0),
        "replicas": count(&|p| !terminating(p)),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": at_current,
        "updatedReplicas": updated,
        "currentRevision": current,
        "updateRevision": update,
        "collisionCount": 0,
    });
    let old = serde_json::to_value(&status)?;
    let changed = new_status
        .as_object()
        .expect("an object")
        .iter()
        .any(|(k, v)| old.get(k).unwrap_or(&json!(0)) != v);
    if changed {
        Api::<StatefulSet>::namespaced(client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": new_status})),
            )
            .await?;
    }
    Ok(())
}

/// Whether the retention policy says `Delete` for `when` (`whenDeleted`, `whenScaled`).
fn retention(spec: &StatefulSetSpec, when: &str) -> bool {
    let p = spec.persistent_volume_claim_retention_policy.as_ref();
    let v = match when {
        "whenDeleted" => p.and_then(|p| p.when_deleted.as_deref()),
        _ => p.and_then(|p| p.when_scaled.as_deref()),
    };
    v == Some("Delete")
}

/// Creates ordinal `ord`'s missing claims; `false` while one of them is being deleted.
async fn ensure_claims(
    client: &Client,
    set: &StatefulSet,
    ord: i32,
    claims: &Store<PersistentVolumeClaim>,
) -> crate::Result<bool> {
    let ns = set.namespace().unwrap_or_default();
    let spec = set.spec.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let selector_labels = spec.selector.match_labels.clone().unwrap_or_default();
    for t in spec.volume_claim_templates.iter().flatten() {
        let name = claim_name(&t.name_any(), &set.name_any(), ord);
        let existing = claims
            .state()
            .into_iter()
            .find(|c| c.namespace().as_deref() == Some(ns.as_str()) && c.name_any() == name);
        match existing {
            Some(c) if c.metadata.deletion_timestamp.is_some() => return Ok(false),
            Some(_) => continue,
            None => {}
        }
        let mut labels = t.metadata.labels.clone().unwrap_or_default();
        labels.extend(selector_labels.clone());
        let mut claim = json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels,
                         "annotations": t.metadata.annotations},
            "spec": t.spec,
        });
        if retention(&spec, "whenDeleted") {
            let mut owner = crate::util::owner_ref(set);
            owner.controller = None;
            claim["metadata"]["ownerReferences"] = json!([owner]);
        }
        let claim: PersistentVolumeClaim = serde_json::from_value(claim)?;
        match api.create(&PostParams::default(), &claim).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Makes the condemned pod own its claims, so they go with it (`whenScaled: Delete`).
async fn own_claims(
    client: &Client,
    set: &StatefulSet,
    ord: i32,
    pod: &Pod,
    claims: &Store<PersistentVolumeClaim>,
) -> crate::Result<()> {
    let ns = set.namespace().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let mut owner = crate::util::owner_ref(pod);
    owner.controller = None;
    for t in set
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_ref())
        .into_iter()
        .flatten()
    {
        let name = claim_name(&t.name_any(), &set.name_any(), ord);
        let Some(c) = claims
            .state()
            .into_iter()
            .find(|c| c.namespace().as_deref() == Some(ns.as_str()) && c.name_any() == name)
        else {
            continue;
        };
        let mut owners = c.metadata.owner_references.clone().unwrap_or_default();
        if owners.iter().any(|o| o.uid == owner.uid) {
            continue;
        }
        owners.push(owner.clone());
        let patch = json!({"metadata": {"ownerReferences": owners}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// The pod of ordinal `ord` from `template` at `revision`.
pub fn pod_for(
    set: &StatefulSet,
    template: &PodTemplateSpec,
    revision: &str,
    ord: i32,
) -> crate::Result<Pod> {
    let set_name = set.name_any();
    let name = format!("{set_name}-{ord}");
    let spec = set.spec.clone().unwrap_or_default();
    let mut pod_spec = serde_json::to_value(template.spec.clone().unwrap_or_default())?;
    pod_spec["hostname"] = json!(name);
    if !spec.service_name.as_deref().unwrap_or("").is_empty() {
        pod_spec["subdomain"] = json!(spec.service_name);
    }
    let mut volumes: Vec<serde_json::Value> = pod_spec
        .get("volumes")
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default();
    for t in spec.volume_claim_templates.iter().flatten() {
        let vname = t.name_any();
        volumes.retain(|v| v.get("name").and_then(|n| n.as_str()) != Some(vname.as_str()));
        volumes.push(json!({"name": vname,
            "persistentVolumeClaim": {"claimName": claim_name(&vname, &set_name, ord)}}));
    }
    if !volumes.is_empty() {
        pod_spec["volumes"] = json!(volumes);
    }
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), revision.into());
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ord.to_string());
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": template.metadata.as_ref().and_then(|m| m.annotations.clone()),
            "ownerReferences": [crate::util::owner_ref(set)],
        },
        "spec": pod_spec,
    }))?)
}

async fn create(
    api: &Api<Pod>,
    set: &StatefulSet,
    template: &PodTemplateSpec,
    revision: &str,
    ord: i32,
) -> crate::Result<bool> {
    let pod = pod_for(set, template, revision, ord)?;
    match api.create(&PostParams::default(), &pod).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(kube::Error::Api(e)) => Err(crate::Error::Invalid(e.message)),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: serde_json::Value) -> StatefulSetSpec {
        let mut s = json!({"replicas": 3, "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c"}]}}});
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        serde_json::from_value(s).unwrap()
    }

    fn pod(ord: i32, rev: &str, ready: bool) -> (i32, Arc<Pod>) {
        let cond = if ready { "True" } else { "False" };
        (
            ord,
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": format!("web-{ord}"), "labels": {HASH_LABEL: rev}},
                    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": cond}]},
                }))
                .unwrap(),
            ),
        )
    }

    #[test]
    fn ordinals_parse_only_from_the_sets_own_names() {
        assert_eq!(ordinal_of("web", "web-0"), Some(0));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-01"), None);
        assert_eq!(ordinal_of("web", "webby-1"), None);
        assert_eq!(ordinal_of("web", "web-"), None);
    }

    #[test]
    fn ordered_ready_creates_one_at_a_time_after_the_one_before_is_ready() {
        let s = spec(json!({}));
        assert_eq!(plan(&s, &BTreeMap::new(), "r1").create, vec![(0, true)]);
        let one_unready = BTreeMap::from([pod(0, "r1", false)]);
        assert_eq!(plan(&s, &one_unready, "r1"), Plan::default());
        let one_ready = BTreeMap::from([pod(0, "r1", true)]);
        assert_eq!(plan(&s, &one_ready, "r1").create, vec![(1, true)]);
        let parallel = spec(json!({"podManagementPolicy": "Parallel"}));
        assert_eq!(
            plan(&parallel, &BTreeMap::new(), "r1").create,
            vec![(0, true), (1, true), (2, true)]
        );
    }

    #[test]
    fn scale_down_halts_while_condemned_pods_are_unhealthy() {
        // Upstream's "Scaling should happen in predictable order and halt if any stateful pod
        // is unhealthy": all three unready, scaled to 0: nothing is deleted, because web-2 is
        // not the first unhealthy pod.
        let s = spec(json!({"replicas": 0}));
        let unready = BTreeMap::from([
            pod(0, "r1", false),
            pod(1, "r1", false),
            pod(2, "r1", false),
        ]);
        assert_eq!(plan(&s, &unready, "r1"), Plan::default());
        // Once web-2 is the first unhealthy one (the others ready), it goes.
        let last = BTreeMap::from([pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", false)]);
        assert_eq!(plan(&s, &last, "r1").delete, vec![2]);
        // In parallel, unhealthy pods go regardless.
        let parallel = spec(json!({"replicas": 0, "podManagementPolicy": "Parallel"}));
        assert_eq!(plan(&parallel, &unready, "r1").delete, vec![2, 1, 0]);
    }

    #[test]
    fn scale_down_removes_the_highest_ordinal_first() {
        let s = spec(json!({"replicas": 1}));
        let pods = BTreeMap::from([pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", true)]);
        let p = plan(&s, &pods, "r1");
        assert_eq!(p.delete, vec![2]);
        assert_eq!(p.condemned, vec![2]);
    }

    #[test]
    fn rolling_update_goes_down_to_the_partition_one_pod_at_a_time() {
        let s = spec(
            json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}}),
        );
        let pods = BTreeMap::from([pod(0, "r1", true), pod(1, "r1", true), pod(2, "r1", true)]);
        assert_eq!(plan(&s, &pods, "r2").delete, vec![2]);
        let two_done = BTreeMap::from([pod(0, "r1", true), pod(1, "r1", true), pod(2, "r2", true)]);
        assert_eq!(plan(&s, &two_done, "r2").delete, vec![1]);
        let done = BTreeMap::from([pod(0, "r1", true), pod(1, "r2", true), pod(2, "r2", true)]);
        assert_eq!(plan(&s, &done, "r2"), Plan::default());
        // A pod below the partition comes back at the current revision.
        let missing = BTreeMap::from([pod(1, "r2", true), pod(2, "r2", true)]);
        assert_eq!(plan(&s, &missing, "r2").create, vec![(0, false)]);
        // OnDelete replaces nothing by itself.
        let on_delete = spec(json!({"updateStrategy": {"type": "OnDelete"}}));
        assert_eq!(plan(&on_delete, &pods, "r2"), Plan::default());
    }

    #[test]
    fn pods_get_stable_identity_and_their_claims() {
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {"replicas": 1, "serviceName": "web",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]},
        }))
        .unwrap();
        let spec = set.spec.clone().unwrap();
        let p = pod_for(&set, &spec.template, "web-abc", 2).unwrap();
        assert_eq!(p.name_any(), "web-2");
        let ps = p.spec.unwrap();
        assert_eq!(ps.hostname.as_deref(), Some("web-2"));
        assert_eq!(ps.subdomain.as_deref(), Some("web"));
        let v = &ps.volumes.unwrap()[0];
        assert_eq!(
            v.persistent_volume_claim.as_ref().unwrap().claim_name,
            "data-web-2"
        );
        assert_eq!(p.metadata.labels.unwrap()[POD_INDEX_LABEL], "2");
    }
}

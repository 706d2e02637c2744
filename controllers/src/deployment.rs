//! The Deployment controller: one ReplicaSet per pod template (named
//! `<deployment>-<pod-template-hash>`), rolled by RollingUpdate (maxSurge/maxUnavailable)
//! or Recreate, with upstream's revision annotations (so `kubectl rollout history`,
//! `undo`, `status`, `pause`/`resume` work), proportional scaling of the active
//! ReplicaSets when replicas change mid-rollout, `revisionHistoryLimit` clean-up and the
//! Available/Progressing conditions (including `ProgressDeadlineExceeded`).

use crate::driver::Driver;
use crate::util::{self, owner_ref};
use crate::{Error, Result};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Label that ties a ReplicaSet and its pods to one template.
pub const HASH_LABEL: &str = "pod-template-hash";
/// Revision annotation on Deployments and ReplicaSets.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
const MAX: &str = "deployment.kubernetes.io/max-replicas";
const CHANGE_CAUSE: &str = "kubernetes.io/change-cause";

/// A template without the hash label (what two templates are compared by).
fn bare(t: &PodTemplateSpec) -> PodTemplateSpec {
    let mut t = t.clone();
    if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        l.remove(HASH_LABEL);
    }
    t
}

/// The pod-template-hash of a Deployment's template.
pub fn template_hash(t: &PodTemplateSpec) -> String {
    util::hash_of(&bare(t))
}

/// Resolves maxSurge/maxUnavailable against replicas (surge rounds up, unavailable
/// down; both zero means one unavailable), as upstream.
pub fn surge_and_unavailable(
    replicas: i32,
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
) -> (i32, i32) {
    let resolve = |v: Option<&IntOrString>, up: bool| -> i32 {
        match v
            .cloned()
            .unwrap_or_else(|| IntOrString::String("25%".into()))
        {
            IntOrString::Int(i) => i,
            IntOrString::String(s) => {
                let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
                let x = pct * i64::from(replicas);
                (if up { (x + 99) / 100 } else { x / 100 }) as i32
            }
        }
    };
    let s = resolve(surge, true);
    let u = resolve(unavailable, false);
    if s == 0 && u == 0 { (0, 1) } else { (s, u) }
}

/// One ReplicaSet as the rollout sees it: desired replicas and available pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetCounts {
    /// `spec.replicas`.
    pub replicas: i32,
    /// `status.availableReplicas`.
    pub available: i32,
}

/// One RollingUpdate step: the new set's target and each old set's target (old sets
/// oldest first).
pub fn rolling_step(
    replicas: i32,
    surge: i32,
    unavailable: i32,
    new: SetCounts,
    old: &[SetCounts],
) -> (i32, Vec<i32>) {
    let total: i32 = new.replicas + old.iter().map(|o| o.replicas).sum::<i32>();
    // Scale the new set up within the surge budget.
    let new_target = if new.replicas >= replicas {
        replicas
    } else {
        let room = (replicas + surge - total).max(0);
        new.replicas + room.min(replicas - new.replicas)
    };
    let mut old_targets: Vec<i32> = old.iter().map(|o| o.replicas).collect();
    let old_total: i32 = old_targets.iter().sum();
    if old_total == 0 {
        return (new_target, old_targets);
    }
    let min_available = replicas - unavailable;
    let all = new_target + old_total;
    let new_unavailable = (new.replicas - new.available).max(0);
    let mut budget = all - min_available - new_unavailable;
    if budget <= 0 {
        return (new_target, old_targets);
    }
    // First the old sets' unavailable pods, then available ones down to min_available.
    for (t, o) in old_targets.iter_mut().zip(old) {
        let unhealthy = (o.replicas - o.available).max(0).min(budget);
        *t -= unhealthy;
        budget -= unhealthy;
    }
    let available: i32 = new.available
        + old
            .iter()
            .zip(&old_targets)
            .map(|(o, t)| o.available.min(*t))
            .sum::<i32>();
    let mut down = (available - min_available).max(0);
    for t in old_targets.iter_mut() {
        let d = (*t).min(down);
        *t -= d;
        down -= d;
    }
    (new_target, old_targets)
}

/// One active ReplicaSet as proportional scaling sees it.
#[derive(Clone, Copy, Debug)]
pub struct Active {
    /// Its `spec.replicas`.
    pub size: i32,
    /// Its `deployment.kubernetes.io/max-replicas` annotation (the Deployment's size plus
    /// surge when it was last scaled), if any.
    pub max_replicas: Option<i32>,
    /// Its creation time (ns), to break ties between sets of one size.
    pub created: i64,
}

/// Upstream's proportional scaling (`scale` in sync.go): the replicas a Deployment gains or
/// loses mid-rollout are shared among its active sets in proportion to each set's size against
/// the size it was scaled for (`max-replicas`), largest sets first (newer first when scaling
/// up, older first when scaling down), with any leftover going to the first. Returns the new
/// sizes in the order given.
pub fn proportional(replicas: i32, surge: i32, status_replicas: i32, sets: &[Active]) -> Vec<i32> {
    let allowed = if replicas > 0 { replicas + surge } else { 0 };
    let total: i32 = sets.iter().map(|s| s.size).sum();
    let to_add = allowed - total;
    let mut out: Vec<i32> = sets.iter().map(|s| s.size).collect();
    if to_add == 0 || sets.is_empty() {
        return out;
    }
    let mut order: Vec<usize> = (0..sets.len()).collect();
    order.sort_by(|a, b| {
        let (a, b) = (&sets[*a], &sets[*b]);
        b.size.cmp(&a.size).then(if to_add > 0 {
            b.created.cmp(&a.created)
        } else {
            a.created.cmp(&b.created)
        })
    });
    let mut added = 0;
    for &i in &order {
        let set = &sets[i];
        let proportion = if set.size == 0 || to_add == added {
            0
        } else {
            let fraction = if replicas == 0 {
                -set.size
            } else {
                let annotated = set.max_replicas.unwrap_or(status_replicas).max(1);
                let scaled =
                    f64::from(set.size) * f64::from(replicas + surge) / f64::from(annotated);
                scaled.round() as i32 - set.size
            };
            let left = to_add - added;
            if to_add > 0 {
                fraction.min(left)
            } else {
                fraction.max(left)
            }
        };
        out[i] = set.size + proportion;
        added += proportion;
    }
    let first = order[0];
    out[first] = (out[first] + to_add - added).max(0);
    out
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn spec_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

struct Ctx {
    client: Client,
    sets: crate::informer::Namespaced<ReplicaSet>,
    recorder: minik8s_events::Recorder,
}

fn now() -> String {
    util::rfc3339(jiff::Timestamp::now())
}

/// Sets a ReplicaSet's replicas (and the Deployment's annotations on it).
async fn scale(
    ctx: &Ctx,
    api: &Api<ReplicaSet>,
    rs: &ReplicaSet,
    replicas: i32,
    d: &Deployment,
    surge: i32,
) -> Result<()> {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ann = rs.annotations();
    if spec_replicas(rs) == replicas
        && ann.get(DESIRED) == Some(&want.to_string())
        && ann.get(MAX) == Some(&(want + surge).to_string())
    {
        return Ok(());
    }
    let patch = json!({
        "metadata": {"annotations": {DESIRED: want.to_string(), MAX: (want + surge).to_string()}},
        "spec": {"replicas": replicas},
    });
    api.patch(
        &rs.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    let was = spec_replicas(rs);
    if was != replicas {
        let way = if was < replicas { "up" } else { "down" };
        ctx.recorder.normal(
            &d.object_ref(&()),
            "ScalingReplicaSet",
            format!(
                "Scaled {way} replica set {} from {was} to {replicas}",
                rs.name_any()
            ),
        );
    }
    Ok(())
}

async fn reconcile(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action> {
    if d.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = d.namespace().unwrap_or_default();
    let spec = d
        .spec
        .as_ref()
        .ok_or_else(|| Error::Invalid("no spec".into()))?;
    let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
    // Adopt orphan ReplicaSets the selector matches, release those it no longer does
    // (upstream's ClaimReplicaSets), of its own and the namespace's orphans.
    let in_ns: Vec<Arc<ReplicaSet>> = ctx
        .sets
        .controlled_by_or_orphans(&ns, &d.uid().unwrap_or_default());
    let selector = util::Selector::new(&spec.selector);
    let mut sets: Vec<Arc<ReplicaSet>> =
        util::claim(&api, in_ns, &selector, owner_ref(d.as_ref()), |_| true)
            .await?
            .into_iter()
            .filter(|rs| rs.metadata.deletion_timestamp.is_none())
            .collect();
    sets.sort_by_key(|rs| {
        (
            revision(rs),
            rs.metadata.creation_timestamp.as_ref().map(|t| t.0),
        )
    });
    let replicas = spec.replicas.unwrap_or(1);
    let strategy = spec.strategy.as_ref();
    let recreate = strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate");
    let ru = strategy.and_then(|s| s.rolling_update.as_ref());
    let (surge, unavailable) = if recreate {
        (0, replicas)
    } else {
        surge_and_unavailable(
            replicas,
            ru.and_then(|r| r.max_surge.as_ref()),
            ru.and_then(|r| r.max_unavailable.as_ref()),
        )
    };
    let wanted = bare(&spec.template);
    let hash = template_hash(&spec.template);
    let new_pos = sets.iter().position(|rs| {
        rs.spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .map(bare)
            .as_ref()
            == Some(&wanted)
    });
    let max_revision = sets.iter().map(|rs| revision(rs)).max().unwrap_or(0);
    let paused = spec.paused == Some(true);
    let mut progressed = false;

    // The new ReplicaSet: found (and given the newest revision), or created.
    let new: Option<Arc<ReplicaSet>> = match new_pos {
        Some(i) => {
            let rs = sets.remove(i);
            let cause = d.annotations().get(CHANGE_CAUSE);
            if revision(&rs) < max_revision
                || (cause.is_some() && rs.annotations().get(CHANGE_CAUSE) != cause)
            {
                let mut ann = json!({REVISION: (max_revision + 1).max(revision(&rs)).to_string()});
                if let Some(c) = cause {
                    ann[CHANGE_CAUSE] = json!(c);
                }
                api.patch(
                    &rs.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": ann}})),
                )
                .await?;
                progressed = true;
            }
            Some(rs)
        }
        None if paused => None,
        None => {
            let mut template = spec.template.clone();
            template
                .metadata
                .get_or_insert_with(Default::default)
                .labels
                .get_or_insert_with(Default::default)
                .insert(HASH_LABEL.into(), hash.clone());
            let mut selector = spec.selector.clone();
            selector
                .match_labels
                .get_or_insert_with(Default::default)
                .insert(HASH_LABEL.into(), hash.clone());
            let old_total: i32 = sets.iter().map(|rs| spec_replicas(rs)).sum();
            let initial = if recreate {
                0
            } else {
                (replicas + surge - old_total).clamp(0, replicas)
            };
            let mut ann = serde_json::Map::new();
            ann.insert(REVISION.into(), json!((max_revision + 1).to_string()));
            ann.insert(DESIRED.into(), json!(replicas.to_string()));
            ann.insert(MAX.into(), json!((replicas + surge).to_string()));
            if let Some(c) = d.annotations().get(CHANGE_CAUSE) {
                ann.insert(CHANGE_CAUSE.into(), json!(c));
            }
            let rs: ReplicaSet = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {
                    "name": format!("{}-{hash}", d.name_any()),
                    "namespace": ns,
                    "labels": template.metadata.as_ref().and_then(|m| m.labels.clone()),
                    "annotations": ann,
                    "ownerReferences": [owner_ref(d.as_ref())],
                },
                "spec": {"replicas": initial, "selector": selector, "template": template,
                         "minReadySeconds": spec.min_ready_seconds.unwrap_or(0)},
            }))?;
            let created = match api.create(&PostParams::default(), &rs).await {
                Ok(rs) => rs,
                // Our informer has not seen it yet: look again soon.
                Err(kube::Error::Api(s)) if matches!(s.code, 409) => {
                    return Ok(Action::requeue(Duration::from_millis(200)));
                }
                Err(e) => return Err(e.into()),
            };
            progressed = true;
            if initial > 0 {
                ctx.recorder.normal(
                    &d.object_ref(&()),
                    "ScalingReplicaSet",
                    format!(
                        "Scaled up replica set {} from 0 to {initial}",
                        created.name_any()
                    ),
                );
            }
            Some(Arc::new(created))
        }
    };
    let old = sets;

    // Scaling: proportional when replicas changed mid-rollout, else the strategy's step.
    let active: Vec<&Arc<ReplicaSet>> = new
        .iter()
        .chain(old.iter())
        .filter(|rs| spec_replicas(rs) > 0)
        .collect();
    let scaled = active.len() > 1
        && active.iter().any(|rs| {
            rs.annotations()
                .get(DESIRED)
                .is_some_and(|v| *v != replicas.to_string())
        });
    if scaled {
        let sets: Vec<Active> = active
            .iter()
            .map(|rs| Active {
                size: spec_replicas(rs),
                max_replicas: rs.annotations().get(MAX).and_then(|v| v.parse().ok()),
                created: rs
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_nanosecond() as i64),
            })
            .collect();
        let status_replicas = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let targets = proportional(replicas, surge, status_replicas, &sets);
        for (rs, target) in active.iter().zip(targets) {
            scale(&ctx, &api, rs, target, &d, surge).await?;
        }
        progressed = true;
    } else if paused {
        if let Some(n) = &new
            && old.iter().all(|rs| spec_replicas(rs) == 0)
        {
            scale(&ctx, &api, n, replicas, &d, surge).await?;
        }
    } else if recreate {
        for rs in old.iter().filter(|rs| spec_replicas(rs) > 0) {
            scale(&ctx, &api, rs, 0, &d, surge).await?;
            progressed = true;
        }
        let old_running: i32 = old
            .iter()
            .map(|rs| rs.status.as_ref().map_or(0, |s| s.replicas))
            .sum();
        if let Some(n) = &new
            && old_running == 0
            && old.iter().all(|rs| spec_replicas(rs) == 0)
        {
            if spec_replicas(n) != replicas {
                progressed = true;
            }
            scale(&ctx, &api, n, replicas, &d, surge).await?;
        }
    } else if let Some(n) = &new {
        let counts = |rs: &ReplicaSet| SetCounts {
            replicas: spec_replicas(rs),
            available: available(rs),
        };
        let old_counts: Vec<SetCounts> = old.iter().map(|rs| counts(rs)).collect();
        let (new_target, old_targets) =
            rolling_step(replicas, surge, unavailable, counts(n), &old_counts);
        if new_target != spec_replicas(n) {
            progressed = true;
        }
        scale(&ctx, &api, n, new_target, &d, surge).await?;
        for (rs, t) in old.iter().zip(old_targets) {
            if t != spec_replicas(rs) {
                progressed = true;
                scale(&ctx, &api, rs, t, &d, surge).await?;
            }
        }
    }

    // History: drop the oldest empty sets beyond revisionHistoryLimit.
    let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
    let empty: Vec<&Arc<ReplicaSet>> = old
        .iter()
        .filter(|rs| spec_replicas(rs) == 0 && rs.status.as_ref().is_none_or(|s| s.replicas == 0))
        .collect();
    if empty.len() > limit {
        for rs in &empty[..empty.len() - limit] {
            match api
                .delete(&rs.name_any(), &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if matches!(s.code, 404) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    write_status(
        &ctx,
        &d,
        new.as_deref(),
        &old,
        replicas,
        unavailable,
        progressed,
    )
    .await
}

async fn write_status(
    ctx: &Ctx,
    d: &Deployment,
    new: Option<&ReplicaSet>,
    old: &[Arc<ReplicaSet>],
    replicas: i32,
    unavailable: i32,
    progressed: bool,
) -> Result<Action> {
    let all: Vec<&ReplicaSet> = new
        .into_iter()
        .chain(old.iter().map(AsRef::as_ref))
        .collect();
    let sum = |f: fn(&ReplicaSet) -> i32| all.iter().map(|rs| f(rs)).sum::<i32>();
    let total = sum(|rs| rs.status.as_ref().map_or(0, |s| s.replicas));
    let ready = sum(|rs| {
        rs.status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0)
    });
    let avail = sum(available);
    let updated = new
        .and_then(|n| n.status.as_ref())
        .map_or(0, |s| s.replicas);
    let new_name = new.map(|n| n.name_any()).unwrap_or_default();
    let spec = d.spec.as_ref();
    let conditions = d
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let prev = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let condition = |t: &str, status: &str, reason: &str, message: String, touch: bool| {
        let p = prev(t);
        let same = p.is_some_and(|c| c.status == status);
        let transition = match p {
            Some(c) if same => c
                .last_transition_time
                .as_ref()
                .map(|t| util::rfc3339(t.0))
                .unwrap_or_else(now),
            _ => now(),
        };
        let update = match p {
            Some(c) if same && c.reason.as_deref() == Some(reason) && !touch => c
                .last_update_time
                .as_ref()
                .map(|t| util::rfc3339(t.0))
                .unwrap_or_else(now),
            _ => now(),
        };
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": transition, "lastUpdateTime": update})
    };
    let available_cond = if avail >= replicas - unavailable {
        condition(
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.".into(),
            false,
        )
    } else {
        condition(
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.".into(),
            false,
        )
    };
    let complete = updated == replicas && avail == replicas && total == updated && new.is_some();
    let deadline = spec
        .and_then(|s| s.progress_deadline_seconds)
        .unwrap_or(600);
    let last_progress = prev("Progressing")
        .and_then(|c| c.last_update_time.as_ref())
        .map(|t| t.0);
    let mut requeue = None;
    let progressing_cond = if spec.and_then(|s| s.paused) == Some(true) {
        condition(
            "Progressing",
            "Unknown",
            "DeploymentPaused",
            "Deployment is paused".into(),
            false,
        )
    } else if complete {
        condition(
            "Progressing",
            "True",
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{new_name}\" has successfully progressed."),
            false,
        )
    } else if progressed
        || prev("Progressing").is_none_or(|c| c.reason.as_deref() == Some("NewReplicaSetAvailable"))
    {
        requeue = Some(Duration::from_secs(deadline.max(1) as u64));
        condition(
            "Progressing",
            "True",
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{new_name}\" is progressing."),
            true,
        )
    } else if last_progress
        .is_some_and(|t| jiff::Timestamp::now().duration_since(t).as_secs() > i64::from(deadline))
    {
        condition(
            "Progressing",
            "False",
            "ProgressDeadlineExceeded",
            format!("ReplicaSet \"{new_name}\" has timed out progressing."),
            false,
        )
    } else {
        let p = prev("Progressing").expect("checked above");
        let left = last_progress.map_or(deadline as i64, |t| {
            i64::from(deadline) - jiff::Timestamp::now().duration_since(t).as_secs()
        });
        requeue = Some(Duration::from_secs(left.max(1) as u64));
        serde_json::to_value(p)?
    };
    let status = json!({
        "observedGeneration": d.metadata.generation,
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": avail,
        "unavailableReplicas": (replicas - avail).max(0),
        "conditions": [available_cond, progressing_cond],
    });
    let mut patch = json!({"status": status});
    let current = d
        .status
        .as_ref()
        .map(serde_json::to_value)
        .transpose()?
        .unwrap_or_default();
    let same_counts = [
        "observedGeneration",
        "replicas",
        "updatedReplicas",
        "readyReplicas",
        "availableReplicas",
        "unavailableReplicas",
    ]
    .iter()
    .all(|k| current.get(k).cloned().unwrap_or(json!(0)) == patch["status"][k]);
    let same_conditions = serde_json::to_value(&conditions)?
        .as_array()
        .is_some_and(|c| {
            c.iter().all(|c| {
                patch["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|n| {
                        n["type"] == c["type"]
                            && n["status"] == c["status"]
                            && n["reason"] == c["reason"]
                            && n["lastUpdateTime"] == c["lastUpdateTime"]
                    })
            }) && c.len() == 2
        });
    let api: Api<Deployment> =
        Api::namespaced(ctx.client.clone(), &d.namespace().unwrap_or_default());
    if !(same_counts && same_conditions) {
        if let Some(n) = new {
            let rev = revision(n).to_string();
            if d.annotations().get(REVISION) != Some(&rev) {
                api.patch(
                    &d.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {REVISION: rev}}})),
                )
                .await?;
            }
        }
        patch["status"]["conditions"] = patch["status"]["conditions"].take();
        match api
            .patch_status(&d.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if matches!(s.code, 404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The ReplicaSet informer may lag the event that triggered this reconcile: while a
    // rollout is incomplete, look again soon (the deadline check rides on it too).
    Ok(match requeue {
        Some(after) if !complete => Action::requeue(after.min(Duration::from_secs(1))),
        _ if !complete => Action::requeue(Duration::from_secs(1)),
        _ => Action::await_change(),
    })
}

/// Runs the Deployment controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let sets = informers.namespaced::<ReplicaSet>().await;
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        sets,
        recorder: minik8s_events::Recorder::new(client.clone(), "deployment-controller", None),
    });
    let driver = Driver::<Deployment>::new("deployment", &informers).await;
    let deployments = driver.store();
    driver
        // Upstream's --concurrent-deployment-syncs.
        .workers(5)
        .owns::<ReplicaSet>()
        .watches::<ReplicaSet, _>(util::orphan_owners(deployments, |d: &Deployment| {
            d.spec.as_ref().map(|s| s.selector.clone())
        }))
        .run(reconcile, ctx, shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(replicas: i32, available: i32) -> SetCounts {
        SetCounts {
            replicas,
            available,
        }
    }

    #[test]
    fn surge_rounds_up_and_unavailable_down() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(surge_and_unavailable(3, None, None), (1, 0));
        assert_eq!(
            surge_and_unavailable(10, Some(&pct("25%")), Some(&pct("25%"))),
            (3, 2)
        );
        assert_eq!(
            surge_and_unavailable(3, Some(&IntOrString::Int(0)), Some(&IntOrString::Int(0))),
            (0, 1)
        );
    }

    #[test]
    fn a_rolling_update_surges_then_retires_old_pods_as_new_ones_become_available() {
        // 3 replicas, surge 1, unavailable 0: start with the old set full.
        let (n, o) = rolling_step(3, 1, 0, c(0, 0), &[c(3, 3)]);
        assert_eq!((n, o), (1, vec![3]), "one surge pod, nothing retired yet");
        let (n, o) = rolling_step(3, 1, 0, c(1, 1), &[c(3, 3)]);
        assert_eq!(
            (n, o),
            (1, vec![2]),
            "the new pod is available: one old pod goes"
        );
        let (n, o) = rolling_step(3, 1, 0, c(1, 1), &[c(2, 2)]);
        assert_eq!((n, o), (2, vec![2]));
        let (n, o) = rolling_step(3, 1, 0, c(3, 3), &[c(1, 1)]);
        assert_eq!((n, o), (3, vec![0]));
    }

    #[test]
    fn unavailable_old_pods_are_retired_first() {
        // 4 replicas, one may be unavailable: of the old set's two unhealthy pods only one
        // fits the budget (all 4 - minAvailable 3), as upstream's cleanupUnhealthyReplicas.
        let (_, o) = rolling_step(4, 0, 1, c(0, 0), &[c(4, 2)]);
        assert_eq!(o, vec![3]);
        let (_, o) = rolling_step(4, 1, 2, c(0, 0), &[c(4, 2)]);
        assert_eq!(
            o,
            vec![2],
            "with two unavailable allowed, both unhealthy pods go"
        );
    }

    #[test]
    fn proportional_scaling_keeps_ratios_and_the_total() {
        let set = |size, max, created| Active {
            size,
            max_replicas: Some(max),
            created,
        };
        // Upstream's spec: 10 replicas (surge 3) mid-rollout as 8 old + 5 new, scaled to 30:
        // the old set gets 20 and the new one 13.
        assert_eq!(
            proportional(30, 3, 13, &[set(5, 13, 2), set(8, 13, 1)]),
            vec![13, 20]
        );
        // Scaling down takes from the larger (then older) set first and never below zero.
        let down = proportional(2, 1, 13, &[set(5, 13, 2), set(8, 13, 1)]);
        assert_eq!(down.iter().sum::<i32>(), 3);
        assert!(down.iter().all(|n| *n >= 0));
        // To zero, every set goes.
        assert_eq!(
            proportional(0, 3, 13, &[set(5, 13, 2), set(8, 13, 1)]),
            vec![0, 0]
        );
    }

    #[test]
    fn template_hashes_ignore_the_hash_label() {
        let t: PodTemplateSpec = serde_json::from_value(json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}})).unwrap();
        let mut labelled = t.clone();
        labelled
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert(HASH_LABEL.into(), "zzz".into());
        assert_eq!(template_hash(&t), template_hash(&labelled));
    }

    #[test]
    fn reconcile_creates_the_first_replicaset_with_revision_1_on_a_mock_api() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "d1", "generation": 1},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}))
        .unwrap();
        let m = crate::testing::mock(crate::testing::echo);
        let calls = m.calls.clone();
        let ctx = Arc::new(Ctx {
            client: m.client.clone(),
            sets: crate::testing::namespaced(Vec::<ReplicaSet>::new()),
            recorder: minik8s_events::Recorder::new(
                m.client.clone(),
                "deployment-controller",
                None,
            ),
        });
        m.run(reconcile(Arc::new(d), ctx)).unwrap();
        let created = crate::testing::matching(&calls, "POST", "/namespaces/default/replicasets");
        assert_eq!(created.len(), 1);
        let rs = &created[0].body;
        assert_eq!(rs["metadata"]["annotations"][REVISION], "1");
        let hash = rs["metadata"]["labels"][HASH_LABEL].as_str().unwrap();
        assert!(rs["metadata"]["name"].as_str().unwrap().ends_with(hash));
        assert_eq!(rs["spec"]["selector"]["matchLabels"][HASH_LABEL], hash);
    }
}

//! The ReplicaSet controller: keeps `replicas` active pods matching the selector, owned
//! through a controller ownerReference. It adopts matching orphans and releases owned pods
//! that stop matching, creates in slow-start batches (1, 2, 4, …), deletes the least
//! valuable pods first (unscheduled < pending < not ready < ready; newer before older),
//! and writes status (replicas, fullyLabeledReplicas, readyReplicas, availableReplicas,
//! observedGeneration). Expectations keep it from acting twice on creations or deletions
//! its informer has not seen yet.

use crate::driver::Driver;
pub use crate::expectations::Expectations;
use crate::util::{self, owner_ref};
use crate::{Error, Result};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Largest number of pods created per reconcile (upstream's burst).
const BURST: usize = 500;

/// How much a pod is worth keeping (lower goes first when scaling down).
pub fn value(pod: &Pod) -> (u8, u8, std::cmp::Reverse<String>) {
    let scheduled = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let rank = match (scheduled, util::phase(pod), util::is_ready(pod)) {
        (false, _, _) => 0,
        (true, "Pending", _) => 1,
        (true, _, false) => 2,
        (true, _, true) => 3,
    };
    let restarts: i32 = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
    // Among equals, pods that restarted more, then newer pods, go first.
    let created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    (rank, u8::from(restarts == 0), std::cmp::Reverse(created))
}

/// What a reconcile should do about the pod count.
#[derive(Debug, PartialEq, Eq)]
pub enum Scale {
    /// Create this many pods.
    Create(usize),
    /// Delete these pods (by name).
    Delete(Vec<String>),
    /// Nothing.
    Steady,
}

/// Decides creations or deletions from the desired count and the active owned pods.
pub fn plan(replicas: usize, active: &[&Pod]) -> Scale {
    use std::cmp::Ordering;
    match active.len().cmp(&replicas) {
        Ordering::Less => Scale::Create((replicas - active.len()).min(BURST)),
        Ordering::Greater => {
            let mut sorted: Vec<&&Pod> = active.iter().collect();
            sorted.sort_by_key(|p| value(p));
            Scale::Delete(
                sorted
                    .iter()
                    .take(active.len() - replicas)
                    .map(|p| p.name_any())
                    .collect(),
            )
        }
        Ordering::Equal => Scale::Steady,
    }
}

/// The pod a ReplicaSet creates from its template.
pub fn pod_from_template(rs: &ReplicaSet) -> Result<Pod> {
    pod_for(rs, SetKind::ReplicaSet)
}

fn pod_for(rs: &ReplicaSet, kind: SetKind) -> Result<Pod> {
    let template = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.as_ref())
        .ok_or_else(|| Error::Invalid("replicaset has no template".into()))?;
    let mut meta = template.metadata.clone().unwrap_or_default();
    meta.name = None;
    meta.generate_name = Some(format!("{}-", rs.name_any()));
    meta.namespace = rs.namespace();
    meta.owner_references = Some(vec![kind.owner_ref(rs)]);
    Ok(Pod {
        metadata: meta,
        spec: template.spec.clone(),
        status: None,
    })
}

struct Ctx {
    client: Client,
    pods: crate::informer::Namespaced<Pod>,
    expectations: Expectations,
    recorder: minik8s_events::Recorder,
    /// What the sets really are: ReplicaSets, or ReplicationControllers seen as ones.
    kind: SetKind,
}

/// The kind a reconciled set is: the ReplicaSet controller's own, or a `v1`
/// ReplicationController (upstream's replication manager is the ReplicaSet controller on
/// ReplicationControllers converted to ReplicaSets, as here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetKind {
    ReplicaSet,
    ReplicationController,
}

impl SetKind {
    fn api_resource(self) -> kube::api::ApiResource {
        match self {
            SetKind::ReplicaSet => kube::api::ApiResource::erase::<ReplicaSet>(&()),
            SetKind::ReplicationController => kube::api::ApiResource::erase::<
                k8s_openapi::api::core::v1::ReplicationController,
            >(&()),
        }
    }

    /// The controller ownerReference naming set `rs` as its real kind.
    fn owner_ref(
        self,
        rs: &ReplicaSet,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        let ar = self.api_resource();
        let mut o = owner_ref(rs);
        o.api_version = ar.api_version;
        o.kind = ar.kind;
        o
    }

    /// The reference events name set `rs` by.
    fn object_ref(self, rs: &ReplicaSet) -> k8s_openapi::api::core::v1::ObjectReference {
        let ar = self.api_resource();
        let mut r = rs.object_ref(&());
        r.api_version = Some(ar.api_version);
        r.kind = Some(ar.kind);
        r
    }
}

/// A ReplicationController as the ReplicaSet it is equivalent to: its selector map becomes
/// `matchLabels` (the template's labels when empty, as upstream defaults it).
fn as_replica_set(rc: &k8s_openapi::api::core::v1::ReplicationController) -> Result<ReplicaSet> {
    let mut v = serde_json::to_value(rc)?;
    v["apiVersion"] = json!("apps/v1");
    v["kind"] = json!("ReplicaSet");
    let template_labels = v
        .pointer("/spec/template/metadata/labels")
        .cloned()
        .unwrap_or(json!({}));
    let selector = match v.pointer("/spec/selector") {
        Some(Value::Object(m)) if !m.is_empty() => Value::Object(m.clone()),
        _ => template_labels,
    };
    if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("selector".into(), json!({"matchLabels": selector}));
    }
    Ok(serde_json::from_value(v)?)
}

/// A pod's name, borrowed.
fn pod_name(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

async fn reconcile(rs: Arc<ReplicaSet>, ctx: Arc<Ctx>) -> Result<Action> {
    if rs.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = rs.namespace().unwrap_or_default();
    let uid = rs.uid().unwrap_or_default();
    let spec = rs
        .spec
        .as_ref()
        .ok_or_else(|| Error::Invalid("no spec".into()))?;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    // Its own pods and the namespace's orphans (upstream reads the same index), not the
    // namespace's every pod: at 3,000 pods a namespace each reconcile walked them all.
    let pods: Vec<Arc<Pod>> = ctx.pods.controlled_by_or_orphans(&ns, &uid);
    // Adopt orphans that match; release owned pods that no longer do.
    let selector = util::Selector::new(&spec.selector);
    let owned = util::claim_pods(&api, pods, &selector, ctx.kind.owner_ref(rs.as_ref())).await?;
    let active: Vec<&Pod> = owned
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| util::is_active(p))
        .collect();
    let known: HashSet<&str> = owned.iter().map(|p| pod_name(p)).collect();
    let deleting: HashSet<&str> = owned
        .iter()
        .filter(|p| !util::is_active(p))
        .map(|p| pod_name(p))
        .collect();
    // A creation (by name) is observed when the pod shows up; a deletion ("-name") when
    // it is gone or going (pod names never start with '-').
    let settled = ctx
        .expectations
        .satisfied(&uid, |n| match n.strip_prefix('-') {
            Some(d) => !known.contains(d) || deleting.contains(d),
            None => known.contains(n),
        });
    let replicas = spec.replicas.unwrap_or(1).max(0) as usize;
    // A failure to create or delete is reported in the ReplicaFailure condition, as
    // upstream's `calculateStatus`, then retried.
    let mut failure: Option<(&str, Error)> = None;
    if settled {
        match plan(replicas, &active) {
            Scale::Create(n) => {
                if let Err(e) = create(&ctx, &rs, &api, &uid, n).await {
                    failure = Some(("FailedCreate", e));
                }
            }
            Scale::Delete(names) => {
                ctx.expectations
                    .expect(&uid, names.iter().map(|n| format!("-{n}")));
                for n in names {
                    match api.delete(&n, &DeleteParams::background()).await {
                        Ok(_) => ctx.recorder.normal(
                            &ctx.kind.object_ref(&rs),
                            "SuccessfulDelete",
                            format!("Deleted pod: {n}"),
                        ),
                        Err(kube::Error::Api(s)) if matches!(s.code, 404) => {}
                        Err(e) => {
                            ctx.expectations.forget(&uid, &format!("-{n}"));
                            failure = Some(("FailedDelete", e.into()));
                            break;
                        }
                    }
                }
            }
            Scale::Steady => {}
        }
    }
    let condition = failure.as_ref().map(|(reason, e)| {
        let message = match e {
            Error::Kube(k) => util::api_message(k),
            other => other.to_string(),
        };
        (*reason, message)
    });
    write_status(&ctx, &rs, &owned, condition).await?;
    if let Some((_, e)) = failure {
        return Err(e);
    }
    if !settled {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // The pod informer may lag the event that triggered this reconcile: until the set is
    // full and ready, look again soon.
    if active.len() != replicas || active.iter().any(|p| !util::is_ready(p)) {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // Availability depends on time (minReadySeconds): look again when it may change.
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    if min_ready > 0 && active.iter().any(|p| util::is_ready(p)) {
        return Ok(Action::requeue(Duration::from_secs(min_ready as u64)));
    }
    Ok(Action::await_change())
}

/// Creates `n` pods in slow-start batches, stopping at the first failure.
async fn create(ctx: &Ctx, rs: &ReplicaSet, api: &Api<Pod>, uid: &str, n: usize) -> Result<()> {
    let template = pod_for(rs, ctx.kind)?;
    let mut left = n;
    let mut batch = 1;
    while left > 0 {
        let size = batch.min(left);
        let results = futures::future::join_all((0..size).map(|_| {
            let mut pod = template.clone();
            let name = format!("{}-{}", rs.name_any(), util::random_suffix());
            pod.metadata.generate_name = None;
            pod.metadata.name = Some(name.clone());
            ctx.expectations.expect(uid, [name.clone()]);
            async move {
                let r = api.create(&PostParams::default(), &pod).await;
                (name, r)
            }
        }))
        .await;
        let mut failed = None;
        for (name, r) in results {
            match r {
                Ok(_) => ctx.recorder.normal(
                    &ctx.kind.object_ref(rs),
                    "SuccessfulCreate",
                    format!("Created pod: {name}"),
                ),
                // A random name that is taken (rare): the next reconcile makes another.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    ctx.expectations.forget(uid, &name);
                }
                Err(e) => {
                    ctx.expectations.forget(uid, &name);
                    ctx.recorder.warning(
                        &ctx.kind.object_ref(rs),
                        "FailedCreate",
                        format!("Error creating: {}", util::api_message(&e)),
                    );
                    failed = Some(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        left -= size;
        batch *= 2;
    }
    Ok(())
}

async fn write_status(
    ctx: &Ctx,
    rs: &ReplicaSet,
    owned: &[Arc<Pod>],
    failure: Option<(&str, String)>,
) -> Result<()> {
    let spec = rs.spec.as_ref();
    let template_labels = spec
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = spec.and_then(|s| s.min_ready_seconds).unwrap_or(0);
    let now = jiff::Timestamp::now();
    let active: Vec<&Arc<Pod>> = owned.iter().filter(|p| util::is_active(p)).collect();
    let fully = active
        .iter()
        .filter(|p| {
            template_labels
                .iter()
                .all(|(k, v)| p.labels().get(k) == Some(v))
        })
        .count();
    let ready = active.iter().filter(|p| util::is_ready(p)).count();
    let available = active
        .iter()
        .filter(|p| util::is_available(p, min_ready, now))
        .count();
    let current = rs.status.as_ref().map(serde_json::to_value).transpose()?;
    // The ReplicaFailure condition is set on the first failure and removed once managing
    // the replicas succeeds again.
    let conditions: Vec<Value> = current
        .as_ref()
        .and_then(|c| c.get("conditions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let had = conditions.iter().any(|c| c["type"] == "ReplicaFailure");
    let conditions: Vec<Value> = match (failure, had) {
        (Some((reason, message)), false) => {
            let mut cs = conditions;
            cs.push(
                json!({"type": "ReplicaFailure", "status": "True", "reason": reason,
                "message": message, "lastTransitionTime": util::rfc3339(now)}),
            );
            cs
        }
        (None, true) => conditions
            .into_iter()
            .filter(|c| c["type"] != "ReplicaFailure")
            .collect(),
        _ => conditions,
    };
    let status = json!({
        "replicas": active.len(),
        "fullyLabeledReplicas": fully,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": rs.metadata.generation,
        "conditions": if conditions.is_empty() { Value::Null } else { json!(conditions) },
    });
    let unchanged = current.as_ref().is_some_and(|c| {
        [
            "replicas",
            "fullyLabeledReplicas",
            "readyReplicas",
            "availableReplicas",
            "observedGeneration",
        ]
        .iter()
        .all(|k| c.get(k).cloned().unwrap_or(json!(0)) == status[k])
            && c.get("conditions").cloned().unwrap_or(Value::Null) == status["conditions"]
    });
    if unchanged {
        return Ok(());
    }
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &rs.namespace().unwrap_or_default(),
        &ctx.kind.api_resource(),
    );
    match api
        .patch_status(
            &rs.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if matches!(s.code, 404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Runs the ReplicaSet controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    drive::<ReplicaSet, _, _>(client, informers, shutdown, SetKind::ReplicaSet, reconcile).await;
}

/// Runs the ReplicationController controller (upstream's replication manager) until
/// `shutdown`: each RC is reconciled as the ReplicaSet it is equivalent to.
pub async fn run_replication(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    use k8s_openapi::api::core::v1::ReplicationController;
    drive::<ReplicationController, _, _>(
        client,
        informers,
        shutdown,
        SetKind::ReplicationController,
        |rc: Arc<ReplicationController>, ctx: Arc<Ctx>| async move {
            reconcile(Arc::new(as_replica_set(&rc)?), ctx).await
        },
    )
    .await;
}

/// Drives the sets of kind `K` (owning their pods) through `reconcile` until `shutdown`.
async fn drive<K, F, Fut>(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
    kind: SetKind,
    reconcile: F,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action>> + Send + 'static,
{
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let selector_of = move |set: &K| -> Option<LabelSelector> {
        let v = serde_json::to_value(set).ok()?;
        match kind {
            SetKind::ReplicaSet => {
                serde_json::from_value(v.pointer("/spec/selector")?.clone()).ok()
            }
            // An RC's selector is a label map.
            SetKind::ReplicationController => Some(LabelSelector {
                match_labels: serde_json::from_value(v.pointer("/spec/selector")?.clone()).ok(),
                ..Default::default()
            }),
        }
    };
    let (name, component) = match kind {
        SetKind::ReplicaSet => ("replicaset", "replicaset-controller"),
        SetKind::ReplicationController => ("replicationcontroller", "replication-controller"),
    };
    let pods = informers.namespaced::<Pod>().await;
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        pods,
        expectations: Expectations::default(),
        recorder: minik8s_events::Recorder::new(client.clone(), component, None),
        kind,
    });
    let driver = Driver::<K>::new(name, &informers).await;
    let sets = driver.store();
    driver
        // Upstream's --concurrent-replicaset-syncs (and -rc-syncs).
        .workers(5)
        .owns::<Pod>()
        .watches::<Pod, _>(util::orphan_owners(sets, selector_of))
        .run(reconcile, ctx, shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};

    fn pod(name: &str, node: Option<&str>, phase: &str, ready: bool) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn scale_down_removes_the_least_valuable_pods_first() {
        let ready = pod("ready", Some("n"), "Running", true);
        let unready = pod("unready", Some("n"), "Running", false);
        let pending = pod("pending", Some("n"), "Pending", false);
        let unscheduled = pod("unscheduled", None, "Pending", false);
        let all = [&ready, &unready, &pending, &unscheduled];
        assert_eq!(
            plan(1, &all),
            Scale::Delete(vec![
                "unscheduled".into(),
                "pending".into(),
                "unready".into()
            ])
        );
        assert_eq!(plan(4, &all), Scale::Steady);
        assert_eq!(plan(6, &all), Scale::Create(2));
        assert_eq!(plan(10_000, &[]), Scale::Create(BURST));
    }

    #[test]
    fn replication_controllers_are_reconciled_as_replica_sets() {
        let rc: k8s_openapi::api::core::v1::ReplicationController = serde_json::from_value(json!({
                "metadata": {"name": "rc", "namespace": "default", "uid": "u1"},
                "spec": {"replicas": 2, "selector": {"app": "web"},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}))
        .unwrap();
        let rs = as_replica_set(&rc).unwrap();
        let spec = rs.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(
            spec.selector
                .match_labels
                .as_ref()
                .unwrap()
                .get("app")
                .map(String::as_str),
            Some("web")
        );
        let pod = pod_for(&rs, SetKind::ReplicationController).unwrap();
        let owner = &pod.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.uid.as_str()
            ),
            ("v1", "ReplicationController", "u1")
        );
    }

    #[test]
    fn template_pods_are_owned_and_named_after_the_set() {
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "web-abc", "namespace": "ns", "uid": "u1"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
        }))
        .unwrap();
        let p = pod_from_template(&rs).unwrap();
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-abc-"));
        let o = &p.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.uid.as_str(), o.controller),
            ("ReplicaSet", "u1", Some(true))
        );
    }

    #[test]
    fn reconcile_creates_the_missing_pods_in_slow_start_batches_on_a_mock_api() {
        let rs: ReplicaSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "rs1", "generation": 1},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}))
        .unwrap();
        let m = crate::testing::mock(crate::testing::echo);
        let calls = m.calls.clone();
        let ctx = Arc::new(Ctx {
            client: m.client.clone(),
            pods: crate::testing::namespaced(Vec::<Pod>::new()),
            expectations: Expectations::default(),
            recorder: minik8s_events::Recorder::new(
                m.client.clone(),
                "replicaset-controller",
                None,
            ),
            kind: SetKind::ReplicaSet,
        });
        m.run(reconcile(Arc::new(rs), ctx.clone())).unwrap();
        let created = crate::testing::matching(&calls, "POST", "/namespaces/default/pods");
        assert_eq!(created.len(), 3);
        for c in &created {
            assert_eq!(c.body["metadata"]["labels"]["app"], "web");
            assert_eq!(c.body["metadata"]["ownerReferences"][0]["controller"], true);
        }
        // Until the informer shows them, a second reconcile creates nothing more.
        let rs2: ReplicaSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "rs1"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                "template": {"spec": {"containers": []}}}}))
        .unwrap();
        m.run(reconcile(Arc::new(rs2), ctx)).unwrap();
        assert_eq!(
            crate::testing::matching(&calls, "POST", "/pods").len(),
            3,
            "expectations hold back duplicates"
        );
    }
}

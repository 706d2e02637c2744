//! The namespace controller: a namespace being deleted (`Terminating`) has everything in
//! it deleted — every namespaced resource the API serves, found by discovery, pods first
//! (upstream's ordered namespace deletion) — and once nothing is left its `kubernetes`
//! finalizer is removed through the `finalize` subresource, which lets the apiserver remove
//! it. Meanwhile the namespace's deletion conditions say what remains and why.

use crate::Result;
use crate::driver::Driver;
use crate::gc::{Served, served};
use crate::informer::Informers;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Ctx {
    client: Client,
}

/// What is left in a namespace after a deletion pass.
#[derive(Default, Debug, PartialEq, Eq)]
struct Remaining {
    /// Objects left per resource (`pods.`, `deployments.apps`).
    by_resource: BTreeMap<String, usize>,
    /// Objects left per finalizer they carry.
    by_finalizer: BTreeMap<String, usize>,
    /// Resources whose objects remain with nothing to wait for (upstream's content failure).
    failures: Vec<String>,
}

impl Remaining {
    fn total(&self) -> usize {
        self.by_resource.values().sum()
    }
}

/// Deletes what is left of one resource in a namespace and counts what remains.
async fn drain_one(client: &Client, ns: &str, s: &Served, left: &mut Remaining) -> Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &s.ar);
    let list = match api.list_metadata(&ListParams::default()).await {
        Ok(l) => l,
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 405) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if list.items.is_empty() {
        return Ok(());
    }
    if list
        .items
        .iter()
        .any(|o| o.metadata.deletion_timestamp.is_none())
    {
        let r = api
            .delete_collection(&DeleteParams::background(), &ListParams::default())
            .await;
        if let Err(e) = r {
            // Some resources refuse deletecollection: delete one by one.
            tracing::debug!(resource = %s.ar.plural, error = %e, "deletecollection failed");
            for o in &list.items {
                let _ = api.delete(&o.name_any(), &DeleteParams::background()).await;
            }
        }
    }
    let remaining = match api.list_metadata(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(_) => list.items,
    };
    if remaining.is_empty() {
        return Ok(());
    }
    let key = format!("{}.{}", s.ar.plural, s.ar.group);
    *left.by_resource.entry(key).or_default() += remaining.len();
    let mut waited = false;
    for o in &remaining {
        for f in o.metadata.finalizers.iter().flatten() {
            *left.by_finalizer.entry(f.clone()).or_default() += 1;
            waited = true;
        }
        // Graceful deletion (a pod's grace period) is also something to wait for.
        waited |= o
            .metadata
            .deletion_grace_period_seconds
            .is_some_and(|g| g > 0);
    }
    if !waited {
        left.failures.push(format!(
            "unexpected items still remain in namespace: {ns} for gvr: {}/{}, Resource={}",
            s.ar.group, s.ar.version, s.ar.plural
        ));
    }
    Ok(())
}

/// Deletes a namespace's content, pods first as upstream's ordered namespace deletion:
/// nothing else is deleted while a pod remains (its volumes, secrets and services may still
/// serve it).
async fn drain(client: &Client, ns: &str, resources: &[Served]) -> Result<Remaining> {
    let mut left = Remaining::default();
    let is_pods = |s: &Served| s.ar.group.is_empty() && s.ar.plural == "pods";
    for s in resources.iter().filter(|s| s.namespaced && is_pods(s)) {
        drain_one(client, ns, s, &mut left).await?;
    }
    if left.total() > 0 {
        return Ok(left);
    }
    for s in resources.iter().filter(|s| s.namespaced && !is_pods(s)) {
        drain_one(client, ns, s, &mut left).await?;
    }
    Ok(left)
}

/// Upstream's deletion conditions of a namespace for what remains: each of its five types,
/// True with the reason when it applies, else False with its "ok" reason.
fn conditions(left: &Remaining) -> Vec<(&'static str, &'static str, String, bool)> {
    let list = |m: &BTreeMap<String, usize>, f: &dyn Fn(&String, &usize) -> String| {
        m.iter()
            .map(|(k, v)| f(k, v))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut failures = left.failures.clone();
    failures.sort();
    vec![
        (
            "NamespaceDeletionDiscoveryFailure",
            "ResourcesDiscovered",
            "All resources successfully discovered".into(),
            false,
        ),
        (
            "NamespaceDeletionGroupVersionParsingFailure",
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed".into(),
            false,
        ),
        match failures.is_empty() {
            true => (
                "NamespaceDeletionContentFailure",
                "ContentDeleted",
                "All content successfully deleted, may be waiting on finalization".into(),
                false,
            ),
            false => (
                "NamespaceDeletionContentFailure",
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    failures.len(),
                    failures.join(", ")
                ),
                true,
            ),
        },
        match left.by_resource.is_empty() {
            true => (
                "NamespaceContentRemaining",
                "ContentRemoved",
                "All content successfully removed".into(),
                false,
            ),
            false => (
                "NamespaceContentRemaining",
                "SomeResourcesRemain",
                format!(
                    "Some resources are remaining: {}",
                    list(&left.by_resource, &|k, v| format!(
                        "{k} has {v} resource instances"
                    ))
                ),
                true,
            ),
        },
        match left.by_finalizer.is_empty() {
            true => (
                "NamespaceFinalizersRemaining",
                "ContentHasNoFinalizers",
                "All content-preserving finalizers finished".into(),
                false,
            ),
            false => (
                "NamespaceFinalizersRemaining",
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    list(&left.by_finalizer, &|k, v| format!(
                        "{k} in {v} resource instances"
                    ))
                ),
                true,
            ),
        },
    ]
}

/// Writes the deletion conditions into the namespace's status when they changed.
async fn report(client: &Client, ns: &Namespace, left: &Remaining) -> Result<()> {
    let old = ns
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = crate::util::rfc3339(jiff::Timestamp::now());
    let mut changed = false;
    let fresh: Vec<serde_json::Value> = conditions(left)
        .into_iter()
        .map(|(ty, reason, message, on)| {
            let status = if on { "True" } else { "False" };
            let before = old.iter().find(|c| c.type_ == ty);
            let same = before.is_some_and(|c| {
                c.status == status
                    && c.reason.as_deref() == Some(reason)
                    && c.message.as_deref() == Some(message.as_str())
            });
            changed |= !same;
            let time = match before {
                Some(c) if c.status == status => c
                    .last_transition_time
                    .as_ref()
                    .map(|t| crate::util::rfc3339(t.0))
                    .unwrap_or_else(|| now.clone()),
                _ => now.clone(),
            };
            serde_json::json!({"type": ty, "status": status, "reason": reason,
                "message": message, "lastTransitionTime": time})
        })
        .collect();
    if !changed {
        return Ok(());
    }
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = serde_json::json!({"status": {"conditions": fresh}});
    match api
        .patch_status(
            &ns.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action> {
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let has_finalizer = ns
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .is_some_and(|f| f.iter().any(|f| f == "kubernetes"));
    if !has_finalizer {
        return Ok(Action::await_change());
    }
    let name = ns.name_any();
    let resources = served(&ctx.client).await?;
    let left = drain(&ctx.client, &name, &resources).await?;
    report(&ctx.client, &ns, &left).await?;
    if left.total() > 0 {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let mut done = (*ns).clone();
    if let Some(spec) = done.spec.as_mut() {
        spec.finalizers = Some(
            spec.finalizers
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != "kubernetes")
                .collect(),
        );
    }
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    match api
        .replace_subresource("finalize", &name, &PostParams::default(), &done)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {
            return Ok(Action::requeue(Duration::from_millis(200)));
        }
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Runs the namespace controller until `shutdown`.
pub async fn run(client: Client, informers: Informers, shutdown: CancellationToken) {
    Driver::<Namespace>::new("namespace", &informers)
        .await
        // Upstream's --concurrent-namespace-syncs.
        .workers(10)
        .run(reconcile, Arc::new(Ctx { client }), shutdown)
        .await;
}

//! Storage object in-use protection (upstream's `pvc-protection` and `pv-protection`
//! controllers): admission gives every claim and volume a finalizer; these controllers take
//! it off a claim being deleted once no pod uses the claim, and off a volume being deleted
//! once no claim is bound to it. Until then `kubectl get` shows them Terminating, and the
//! data under a running pod stays.
//!
//! A pod uses a claim when it is scheduled, not finished (`Succeeded`/`Failed`) and names the
//! claim in a `persistentVolumeClaim` volume (or owns it as a generic ephemeral volume,
//! `<pod>-<volume>`); a pod being deleted still uses it until it is gone, as its containers
//! may still run.

use crate::driver::Driver;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_types::finalizers;
use minik8s_types::storage::{PV_PROTECTION, PVC_PROTECTION};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Whether `pod` holds claim `claim` (in the pod's namespace).
pub fn pod_uses_claim(pod: &Pod, claim: &str) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let scheduled = spec.node_name.as_deref().is_some_and(|n| !n.is_empty());
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    if !scheduled || finished {
        return false;
    }
    spec.volumes.iter().flatten().any(|v| {
        v.persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == claim)
            || (v.ephemeral.is_some() && format!("{}-{}", pod.name_any(), v.name) == claim)
    })
}

/// Whether `v` is still bound to a claim.
pub fn volume_in_use(v: &PersistentVolume) -> bool {
    v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// The patch taking `finalizer` off a deleted object `o` that holds it, when `in_use` says
/// it may go (guarded by the resourceVersion read).
fn release<K: Resource>(o: &K, finalizer: &str, in_use: bool) -> Option<serde_json::Value> {
    let m = o.meta();
    if m.deletion_timestamp.is_none() || in_use {
        return None;
    }
    let held = m.finalizers.as_deref().unwrap_or_default();
    finalizers::removal(held, finalizer, m.resource_version.as_deref())
}

/// Applies a release; a vanished object is done, and a conflict (the cache was behind) looks
/// again shortly.
async fn patch_finalizers<K>(api: Api<K>, o: &K, patch: serde_json::Value) -> crate::Result<Action>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(
            &o.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(object = %crate::util::key(o), "no longer in use; protection released");
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            Ok(Action::requeue(Duration::from_millis(500)))
        }
        Err(e) => Err(e.into()),
    }
}

struct Claims {
    client: Client,
    pods: Store<Pod>,
}

/// Releases a claim being deleted once no pod uses it.
async fn release_claim(c: Arc<PersistentVolumeClaim>, ctx: Arc<Claims>) -> crate::Result<Action> {
    if c.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let ns = c.namespace().unwrap_or_default();
    let name = c.name_any();
    let used = ctx
        .pods
        .state()
        .iter()
        .any(|p| p.namespace().as_deref() == Some(&ns) && pod_uses_claim(p, &name));
    if release(c.as_ref(), PVC_PROTECTION, used).is_none() {
        return Ok(Action::await_change());
    }
    // The cache may not have a pod scheduled just now yet: ask the apiserver too, as
    // upstream does, before the claim may go.
    let live = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&Default::default())
        .await?;
    let used = live.items.iter().any(|p| pod_uses_claim(p, &name));
    match release(c.as_ref(), PVC_PROTECTION, used) {
        Some(patch) => {
            patch_finalizers(Api::namespaced(ctx.client.clone(), &ns), c.as_ref(), patch).await
        }
        None => Ok(Action::await_change()),
    }
}

/// The claims a pod names (a pod that stops using one wakes it).
fn claims_of(pod: Arc<Pod>) -> Vec<ObjectRef<PersistentVolumeClaim>> {
    let ns = pod.namespace().unwrap_or_default();
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    volumes
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(format!("{}-{}", pod.name_any(), v.name)),
            (None, None) => None,
        })
        .map(|claim| ObjectRef::new(&claim).within(&ns))
        .collect()
}

/// Releases a volume being deleted once no claim is bound to it.
async fn release_volume(v: Arc<PersistentVolume>, client: Arc<Client>) -> crate::Result<Action> {
    match release(v.as_ref(), PV_PROTECTION, volume_in_use(&v)) {
        Some(patch) => patch_finalizers(Api::all(client.as_ref().clone()), v.as_ref(), patch).await,
        None => Ok(Action::await_change()),
    }
}

/// Runs the `pvc-protection` controller until `shutdown`.
pub async fn run_claims(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Claims {
        client,
        pods: informers.all::<Pod>().await,
    });
    Driver::<PersistentVolumeClaim>::new("pvc-protection", &informers)
        .await
        .watches::<Pod, _>(claims_of)
        .run(release_claim, ctx, shutdown)
        .await;
}

/// Runs the `pv-protection` controller until `shutdown`.
pub async fn run_volumes(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    Driver::<PersistentVolume>::new("pv-protection", &informers)
        .await
        .run(release_volume, Arc::new(client), shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn pod(node: Option<&str>, phase: &str, claims: &[&str]) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "d"},
            "spec": {"nodeName": node, "containers": [{"name": "c"}],
                     "volumes": claims.iter().map(|c| json!({"name": format!("v-{c}"),
                        "persistentVolumeClaim": {"claimName": c}})).collect::<Vec<_>>()},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_is_in_use_by_scheduled_unfinished_pods_naming_it() {
        assert!(pod_uses_claim(
            &pod(Some("n"), "Running", &["data"]),
            "data"
        ));
        assert!(pod_uses_claim(
            &pod(Some("n"), "Pending", &["data"]),
            "data"
        ));
        assert!(!pod_uses_claim(
            &pod(Some("n"), "Running", &["other"]),
            "data"
        ));
        assert!(!pod_uses_claim(&pod(None, "Pending", &["data"]), "data"));
        assert!(!pod_uses_claim(
            &pod(Some("n"), "Succeeded", &["data"]),
            "data"
        ));
        assert!(!pod_uses_claim(
            &pod(Some("n"), "Failed", &["data"]),
            "data"
        ));
        let ephemeral: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "d"},
            "spec": {"nodeName": "n", "containers": [{"name": "c"}],
                     "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate":
                        {"spec": {"accessModes": ["ReadWriteOnce"]}}}}]},
        }))
        .unwrap();
        assert!(pod_uses_claim(&ephemeral, "p-scratch"));
    }

    #[test]
    fn the_finalizer_goes_only_from_a_deleted_unused_object() {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.finalizers = Some(vec!["x".into(), PVC_PROTECTION.into()]);
        assert_eq!(release(&c, PVC_PROTECTION, false), None, "not deleted");
        c.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        c.metadata.resource_version = Some("7".into());
        assert_eq!(release(&c, PVC_PROTECTION, true), None, "in use");
        assert_eq!(
            release(&c, PVC_PROTECTION, false),
            Some(json!({"metadata": {"finalizers": ["x"], "resourceVersion": "7"}}))
        );
        c.metadata.finalizers = Some(vec!["x".into()]);
        assert_eq!(release(&c, PVC_PROTECTION, false), None, "not held");
    }
}

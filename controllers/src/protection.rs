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

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_types::finalizers;
use minik8s_types::storage::{PV_PROTECTION, PVC_PROTECTION};
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

/// Applies a release; a conflict or a vanished object waits for the next pass.
async fn patch_finalizers<K>(api: Api<K>, o: &K, patch: serde_json::Value) -> crate::Result<()>
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
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn claims_pass(
    client: &Client,
    claims: &Store<PersistentVolumeClaim>,
    pods: &Store<Pod>,
) -> crate::Result<()> {
    for c in claims.state() {
        if c.metadata.deletion_timestamp.is_none() {
            continue;
        }
        let ns = c.namespace().unwrap_or_default();
        let name = c.name_any();
        let used = pods
            .state()
            .iter()
            .any(|p| p.namespace().as_deref() == Some(&ns) && pod_uses_claim(p, &name));
        if release(c.as_ref(), PVC_PROTECTION, used).is_none() {
            continue;
        }
        // The cache may not have a pod scheduled just now yet: ask the apiserver too, as
        // upstream does, before the claim may go.
        let live = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&Default::default())
            .await?;
        let used = live.items.iter().any(|p| pod_uses_claim(p, &name));
        if let Some(patch) = release(c.as_ref(), PVC_PROTECTION, used) {
            patch_finalizers(Api::namespaced(client.clone(), &ns), c.as_ref(), patch).await?;
        }
    }
    Ok(())
}

async fn volumes_pass(client: &Client, volumes: &Store<PersistentVolume>) -> crate::Result<()> {
    for v in volumes.state() {
        if let Some(patch) = release(v.as_ref(), PV_PROTECTION, volume_in_use(&v)) {
            patch_finalizers(Api::all(client.clone()), v.as_ref(), patch).await?;
        }
    }
    Ok(())
}

/// Runs the `pvc-protection` controller until `shutdown`.
pub async fn run_claims(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let claims = informers.all::<PersistentVolumeClaim>().await;
    let pods = informers.all::<Pod>().await;
    loop {
        crate::util::run_pass("pvc-protection", None, claims_pass(&client, &claims, &pods)).await;
        if !crate::util::next_pass(&shutdown, Duration::from_millis(500)).await {
            return;
        }
    }
}

/// Runs the `pv-protection` controller until `shutdown`.
pub async fn run_volumes(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let volumes = informers.all::<PersistentVolume>().await;
    loop {
        crate::util::run_pass("pv-protection", None, volumes_pass(&client, &volumes)).await;
        if !crate::util::next_pass(&shutdown, Duration::from_millis(500)).await {
            return;
        }
    }
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

//! The node's local-path provisioner (k3s bundles one as a DaemonSet; here every kubelet runs
//! it for its own node): a claim of a class whose provisioner is
//! [`LOCAL_PATH_PROVISIONER`], once the scheduler has chosen this node for its first consumer
//! (`volume.kubernetes.io/selected-node`), gets a folder under the node's data folder,
//! `<root>/volumes/pvc-<uid>_<namespace>_<name>`, and a PersistentVolume `pvc-<uid>` for it:
//! a `local` volume with node affinity to this node, pre-bound to the claim, with the class's
//! reclaim policy. A released volume of this provisioner on this node whose policy is
//! `Delete` loses its folder and then its PersistentVolume; `Retain` keeps both. Such a volume
//! carries upstream's provisioner finalizer, taken off once the folder is gone, so a volume
//! deleted by hand does not leave its folder behind.

use crate::error::{Error, Result, io};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_events::Recorder;
use minik8s_types::finalizers;
use minik8s_types::storage::{
    LOCAL_PATH_PROVISIONER, PROVISIONED_BY, PROVISIONER_FINALIZER, SELECTED_NODE,
    STORAGE_PROVISIONER,
};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The folder a claim's volume lives in on its node.
pub fn volume_dir(root: &Path, claim: &PersistentVolumeClaim) -> PathBuf {
    root.join("volumes").join(format!(
        "pvc-{}_{}_{}",
        claim.uid().unwrap_or_default(),
        claim.namespace().unwrap_or_default(),
        claim.name_any()
    ))
}

/// Whether this node should make a volume for `claim` now.
pub fn wants(claim: &PersistentVolumeClaim, node: &str) -> bool {
    let a = claim.annotations();
    claim.metadata.deletion_timestamp.is_none()
        && a.get(SELECTED_NODE).map(String::as_str) == Some(node)
        && a.get(STORAGE_PROVISIONER).map(String::as_str) == Some(LOCAL_PATH_PROVISIONER)
        && claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
}

/// The PersistentVolume for `claim` at `path` on `node`.
pub fn volume_for(
    claim: &PersistentVolumeClaim,
    node: &str,
    path: &Path,
    reclaim: &str,
) -> Result<PersistentVolume> {
    let spec = claim.spec.clone().unwrap_or_default();
    let storage = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned();
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("pvc-{}", claim.uid().unwrap_or_default()),
            "annotations": {PROVISIONED_BY: LOCAL_PATH_PROVISIONER},
            "finalizers": if reclaim == "Delete" { vec![PROVISIONER_FINALIZER] } else { vec![] },
        },
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": spec.access_modes,
            "volumeMode": spec.volume_mode.unwrap_or_else(|| "Filesystem".into()),
            "storageClassName": spec.storage_class_name,
            "persistentVolumeReclaimPolicy": reclaim,
            "claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": claim.namespace(), "name": claim.name_any(), "uid": claim.uid(),
            },
            "local": {"path": path.display().to_string()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
        },
    }))
    .map_err(|e| Error::Pod(format!("volume for a claim: {e}")))
}

/// The node a local volume's affinity names.
fn node_of(v: &PersistentVolume) -> Option<&str> {
    v.spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .first()?
        .match_expressions
        .as_ref()?
        .iter()
        .find(|e| e.key == "kubernetes.io/hostname")?
        .values
        .as_ref()?
        .first()
        .map(String::as_str)
}

/// Whether `v` is this provisioner's volume on `node` under `root` due for deletion (policy
/// `Delete`, and released, or deleted by hand while no claim is bound); its folder if so.
pub fn reclaimable(v: &PersistentVolume, node: &str, root: &Path) -> Option<PathBuf> {
    if node_of(v) != Some(node) {
        return None;
    }
    let spec = v.spec.as_ref()?;
    let ours =
        v.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(LOCAL_PATH_PROVISIONER);
    let phase = v.status.as_ref().and_then(|s| s.phase.as_deref());
    let due = phase == Some("Released")
        || (v.metadata.deletion_timestamp.is_some() && phase != Some("Bound"));
    let delete = spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete");
    let path = PathBuf::from(&spec.local.as_ref()?.path);
    (ours && due && delete && path.starts_with(root.join("volumes"))).then_some(path)
}

fn reflect<K>(api: Api<K>) -> (Store<K>, impl futures::Future<Output = ()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .for_each(|_| async {});
    (reader, stream)
}

/// Runs the provisioner for `node` (volumes under `root`) until `shutdown`.
pub async fn run(client: Client, node: String, root: PathBuf, shutdown: CancellationToken) {
    let (claims, claims_watch) = reflect(Api::<PersistentVolumeClaim>::all(client.clone()));
    let (volumes, volumes_watch) = reflect(Api::<PersistentVolume>::all(client.clone()));
    let recorder = Recorder::new(
        client.clone(),
        &format!("{LOCAL_PATH_PROVISIONER}_{node}"),
        None,
    );
    let work = async {
        let _ = claims.wait_until_ready().await;
        let _ = volumes.wait_until_ready().await;
        loop {
            if let Err(e) = pass(&client, &node, &root, &claims, &volumes, &recorder).await {
                tracing::warn!(error = %e, "local-path provisioner pass");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = claims_watch => {}
        _ = volumes_watch => {}
        _ = work => {}
    }
}

async fn pass(
    client: &Client,
    node: &str,
    root: &Path,
    claims: &Store<PersistentVolumeClaim>,
    volumes: &Store<PersistentVolume>,
    recorder: &Recorder,
) -> Result<()> {
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    let existing = volumes.state();
    for claim in claims.state() {
        if !wants(&claim, node) {
            continue;
        }
        let name = format!("pvc-{}", claim.uid().unwrap_or_default());
        if existing.iter().any(|v| v.name_any() == name) {
            continue;
        }
        let class = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_default();
        let reclaim = match Api::<StorageClass>::all(client.clone())
            .get_opt(&class)
            .await
        {
            Ok(Some(c)) => c.reclaim_policy.unwrap_or_else(|| "Delete".into()),
            Ok(None) => continue,
            Err(e) => return Err(e.into()),
        };
        let dir = volume_dir(root, &claim);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        // Any container user may write, as local-path-provisioner makes its folders.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).map_err(io(&dir))?;
        let pv = volume_for(&claim, node, &dir, &reclaim)?;
        let made = match pv_api.create(&PostParams::default(), &pv).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 409 => false,
            Err(e) => return Err(e.into()),
        };
        if made {
            tracing::info!(claim = %claim.name_any(), volume = %name, path = %dir.display(), "provisioned");
            recorder.normal(
                &claim.object_ref(&()),
                "ProvisioningSucceeded",
                format!("Successfully provisioned volume {name}"),
            );
        }
    }
    for v in existing {
        let Some(path) = reclaimable(&v, node, root) else {
            continue;
        };
        if path.exists() {
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        }
        if v.metadata.deletion_timestamp.is_none() {
            match pv_api.delete(&v.name_any(), &DeleteParams::default()).await {
                Ok(_) => tracing::info!(volume = %v.name_any(), "reclaimed (Delete)"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            continue; // the finalizer comes off on a later pass, from the deleted volume
        }
        let rv = v.resource_version();
        if let Some(patch) =
            finalizers::removal(v.finalizers(), PROVISIONER_FINALIZER, rv.as_deref())
        {
            match pv_api
                .patch(
                    &v.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(annotations: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data-web-0", "namespace": "default", "uid": "u1",
                         "annotations": annotations},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_is_made_on_the_node_chosen_for_it() {
        let c = claim(json!({SELECTED_NODE: "n1", STORAGE_PROVISIONER: LOCAL_PATH_PROVISIONER}));
        assert!(wants(&c, "n1"));
        assert!(!wants(&c, "n2"));
        assert!(!wants(&claim(json!({SELECTED_NODE: "n1"})), "n1"));
        let dir = volume_dir(Path::new("/data"), &c);
        assert_eq!(dir, Path::new("/data/volumes/pvc-u1_default_data-web-0"));
        let v = volume_for(&c, "n1", &dir, "Delete").unwrap();
        assert_eq!(v.name_any(), "pvc-u1");
        let spec = v.spec.as_ref().unwrap();
        assert_eq!(spec.claim_ref.as_ref().unwrap().uid.as_deref(), Some("u1"));
        assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi");
        assert_eq!(spec.local.as_ref().unwrap().path, dir.display().to_string());
        // Released with Delete: reclaimed; bound or retained: kept.
        let mut released = v.clone();
        released.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        assert_eq!(
            reclaimable(&released, "n1", Path::new("/data")),
            Some(dir.clone())
        );
        assert_eq!(reclaimable(&released, "n1", Path::new("/other")), None);
        assert_eq!(reclaimable(&released, "n2", Path::new("/data")), None);
        assert_eq!(reclaimable(&v, "n1", Path::new("/data")), None);
        assert_eq!(v.finalizers(), [PROVISIONER_FINALIZER]);
        // Deleted by hand: reclaimed unless still bound.
        let mut deleted = v.clone();
        deleted.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert_eq!(
            reclaimable(&deleted, "n1", Path::new("/data")),
            Some(dir.clone())
        );
        deleted.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        assert_eq!(reclaimable(&deleted, "n1", Path::new("/data")), None);
        let retained = volume_for(&c, "n1", &dir, "Retain").map(|mut r| {
            r.status = released.status.clone();
            r
        });
        let retained = retained.unwrap();
        assert!(retained.finalizers().is_empty());
        assert_eq!(reclaimable(&retained, "n1", Path::new("/data")), None);
    }
}

//! ServiceAccount admission: a pod runs as an existing ServiceAccount and, unless it or its
//! account opts out, gets the projected `kube-api-access-*` volume (bound token, cluster CA,
//! namespace) mounted where client libraries look for it.

use crate::Api;
use crate::error::{ApiError, ApiResult};
use crate::object::meta_str;
use minik8s_storage::Store;
use serde_json::{Value, json};

/// Where in-cluster clients read the token, CA and namespace.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// ConfigMap holding the cluster CA in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

fn is_mirror(pod: &Value) -> bool {
    pod.pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
}

/// Sets the pod's ServiceAccount (checking it exists) and mounts its token.
pub async fn admit(api: &Api, ns: &str, pod: &mut Value) -> ApiResult<()> {
    if is_mirror(pod) {
        return Ok(());
    }
    let spec = &mut pod["spec"];
    let name = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_owned();
    spec["serviceAccountName"] = json!(name);
    spec["serviceAccount"] = json!(name);
    let sa = api
        .store
        .get(&format!("/registry/core/serviceaccounts/{ns}/{name}"))
        .await?;
    let Some(sa) = sa else {
        let pod_name = meta_str(pod, "name").unwrap_or_default();
        return Err(ApiError::forbidden(format!(
            "pods \"{pod_name}\" is forbidden: error looking up service account {ns}/{name}: serviceaccount \"{name}\" not found"
        )));
    };
    let sa = crate::object::from_store(&sa)?;
    let automount = spec
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            sa.get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true);
    if automount {
        mount_token(spec);
    }
    Ok(())
}

/// Adds the projected token volume and mounts it in every container that has nothing at
/// [`MOUNT_PATH`] yet.
fn mount_token(spec: &mut Value) {
    let mounted_by_user = ["containers", "initContainers"].iter().any(|k| {
        spec.get(*k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(has_mount)
    });
    if mounted_by_user {
        return;
    }
    let volume = format!("kube-api-access-{}", crate::object::random_suffix());
    let volumes = &mut spec["volumes"];
    if !volumes.is_array() {
        *volumes = json!([]);
    }
    if let Some(v) = volumes.as_array_mut() {
        v.push(json!({
            "name": volume,
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ],
            },
        }));
    }
    for k in ["containers", "initContainers"] {
        let Some(cs) = spec.get_mut(k).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs {
            let mounts = &mut c["volumeMounts"];
            if !mounts.is_array() {
                *mounts = json!([]);
            }
            if let Some(m) = mounts.as_array_mut() {
                m.push(json!({"name": volume, "mountPath": MOUNT_PATH, "readOnly": true}));
            }
        }
    }
}

fn has_mount(c: &Value) -> bool {
    c.get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(MOUNT_PATH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_volume_is_mounted_in_every_container() {
        let mut spec = json!({"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]});
        mount_token(&mut spec);
        let vol = spec["volumes"][0]["name"].as_str().unwrap().to_owned();
        assert!(vol.starts_with("kube-api-access-"));
        for p in ["/containers/0", "/initContainers/0"] {
            let m = &spec.pointer(p).unwrap()["volumeMounts"][0];
            assert_eq!(m["name"], json!(vol));
            assert_eq!(m["mountPath"], json!(MOUNT_PATH));
        }
    }

    #[test]
    fn a_user_mount_at_the_path_wins() {
        let mut spec = json!({"containers": [{"name": "a", "volumeMounts": [{"name": "x", "mountPath": MOUNT_PATH}]}]});
        mount_token(&mut spec);
        assert!(spec.get("volumes").is_none());
    }
}

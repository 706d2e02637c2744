//! StorageObjectInUseProtection: every new PersistentVolumeClaim gets the
//! `kubernetes.io/pvc-protection` finalizer and every new PersistentVolume
//! `kubernetes.io/pv-protection`, so deleting one that is still in use leaves it Terminating
//! until the `pvc-protection` / `pv-protection` controllers find it unused.

use minik8s_types::storage::{PV_PROTECTION, PVC_PROTECTION};
use serde_json::{Value, json};

/// Adds the protection finalizer of a core `kind` (claims and volumes; others are left alone).
pub fn admit(kind: &str, obj: &mut Value) {
    let finalizer = match kind {
        "PersistentVolumeClaim" => PVC_PROTECTION,
        "PersistentVolume" => PV_PROTECTION,
        _ => return,
    };
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    if let Some(list) = list.as_array_mut()
        && !list.iter().any(|f| f == finalizer)
    {
        list.push(json!(finalizer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_and_volumes_get_their_finalizer_once() {
        let mut claim = json!({"metadata": {"name": "c"}});
        admit("PersistentVolumeClaim", &mut claim);
        admit("PersistentVolumeClaim", &mut claim);
        assert_eq!(claim["metadata"]["finalizers"], json!([PVC_PROTECTION]));
        let mut volume = json!({"metadata": {"name": "v", "finalizers": ["other"]}});
        admit("PersistentVolume", &mut volume);
        assert_eq!(
            volume["metadata"]["finalizers"],
            json!(["other", PV_PROTECTION])
        );
        let mut pod = json!({"metadata": {"name": "p"}});
        admit("Pod", &mut pod);
        assert!(pod["metadata"].get("finalizers").is_none());
    }
}

//! StorageObjectInUseProtection: every new PersistentVolumeClaim gets the
//! `kubernetes.io/pvc-protection` finalizer and every new PersistentVolume
//! `kubernetes.io/pv-protection`, so deleting one that is still in use leaves it Terminating
//! until the `pvc-protection` / `pv-protection` controllers find it unused.

use serde_json::{Value, json};

/// Adds a protection `finalizer` (claims' and volumes' strategies name theirs) unless the
/// object has it.
pub fn admit(finalizer: &str, obj: &mut Value) {
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
    use minik8s_types::storage::{PV_PROTECTION, PVC_PROTECTION};

    use crate::registry::kinds::{Admit, Strategy, pod, storage};

    /// What the admission chain does: each protection step the kind's strategy lists.
    fn admit_as(strategy: &dyn Strategy, obj: &mut Value) {
        for step in strategy.admission() {
            if let Admit::Protection(finalizer) = step {
                admit(finalizer, obj);
            }
        }
    }

    #[test]
    fn claims_and_volumes_get_their_finalizer_once() {
        let mut claim = json!({"metadata": {"name": "c"}});
        admit_as(&storage::PersistentVolumeClaim, &mut claim);
        admit_as(&storage::PersistentVolumeClaim, &mut claim);
        assert_eq!(claim["metadata"]["finalizers"], json!([PVC_PROTECTION]));
        let mut volume = json!({"metadata": {"name": "v", "finalizers": ["other"]}});
        admit_as(&storage::PersistentVolume, &mut volume);
        assert_eq!(
            volume["metadata"]["finalizers"],
            json!(["other", PV_PROTECTION])
        );
        let mut pod = json!({"metadata": {"name": "p"}});
        admit_as(&pod::Pod, &mut pod);
        assert!(pod["metadata"].get("finalizers").is_none());
    }
}

//! PersistentVolumes, PersistentVolumeClaims and StorageClasses (upstream's
//! `pkg/registry/core/{persistentvolume,persistentvolumeclaim}` and
//! `pkg/registry/storage/storageclass`).

use super::{Admit, Row, Strategy, immutable, list, or, or_none, s};
use crate::error::Cause;
use crate::object::meta;
use crate::registry::ResourceInfo;
use crate::registry::defaults::{child, set_default};
use crate::registry::validation::specs;
use minik8s_types::storage::{PV_PROTECTION, PVC_PROTECTION};
use serde_json::{Value, json};

/// `core/v1` PersistentVolume.
pub struct PersistentVolume;

impl Strategy for PersistentVolume {
    fn admission(&self) -> &'static [Admit] {
        &[Admit::Protection(PV_PROTECTION)]
    }

    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        set_default(spec, "volumeMode", json!("Filesystem"));
        set_default(child(obj, "status"), "phase", json!("Pending"));
    }

    fn initial_status(&self, obj: &mut Value) {
        obj["status"] = json!({"phase": "Pending"});
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::volume(obj.get("spec"), causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Capacity", "string", 0, || s(o, "/spec/capacity/storage"));
        row.col("Access Modes", "string", 0, || {
            access_modes(o, "/spec/accessModes")
        });
        row.col("Reclaim Policy", "string", 0, || {
            s(o, "/spec/persistentVolumeReclaimPolicy")
        });
        row.col("Status", "string", 0, || phase_or_terminating(o));
        row.col("Claim", "string", 0, || {
            if s(o, "/spec/claimRef/name").is_empty() {
                String::new()
            } else {
                format!(
                    "{}/{}",
                    s(o, "/spec/claimRef/namespace"),
                    s(o, "/spec/claimRef/name")
                )
            }
        });
        row.col("StorageClass", "string", 0, || {
            s(o, "/spec/storageClassName")
        });
        row.age(o);
    }
}

/// `core/v1` PersistentVolumeClaim.
pub struct PersistentVolumeClaim;

impl Strategy for PersistentVolumeClaim {
    fn admission(&self) -> &'static [Admit] {
        &[
            Admit::DefaultStorageClass,
            Admit::Protection(PVC_PROTECTION),
        ]
    }

    fn default(&self, obj: &mut Value) {
        set_default(child(obj, "spec"), "volumeMode", json!("Filesystem"));
        set_default(child(obj, "status"), "phase", json!("Pending"));
    }

    fn initial_status(&self, obj: &mut Value) {
        obj["status"] = json!({"phase": "Pending"});
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::claim(obj.get("spec"), causes);
    }

    /// Only the storage request may change, and the binder sets `volumeName` once.
    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        let rest = |v: &Value, volume: bool| -> Value {
            let mut spec = v.get("spec").cloned().unwrap_or(Value::Null);
            if let Some(m) = spec.as_object_mut() {
                if let Some(r) = m.get_mut("resources").and_then(Value::as_object_mut) {
                    r.remove("requests");
                }
                if volume {
                    m.remove("volumeName");
                }
            }
            spec
        };
        let unset = old
            .pointer("/spec/volumeName")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        if rest(new, unset) != rest(old, unset) {
            causes.push(Cause::forbidden(
                "spec",
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
            ));
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Status", "string", 0, || phase_or_terminating(o));
        row.col("Volume", "string", 0, || s(o, "/spec/volumeName"));
        row.col("Capacity", "string", 0, || s(o, "/status/capacity/storage"));
        row.col("Access Modes", "string", 0, || {
            access_modes(o, "/status/accessModes")
        });
        row.col("StorageClass", "string", 0, || {
            or_none(s(o, "/spec/storageClassName"))
        });
        row.age(o);
    }
}

/// `storage.k8s.io/v1` StorageClass.
pub struct StorageClass;

impl Strategy for StorageClass {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "reclaimPolicy", json!("Delete"));
        set_default(obj, "volumeBindingMode", json!("Immediate"));
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::one_of(
            Some(obj),
            "reclaimPolicy",
            "",
            &["Delete", "Retain"],
            causes,
        );
        specs::one_of(
            Some(obj),
            "volumeBindingMode",
            "",
            &["Immediate", "WaitForFirstConsumer"],
            causes,
        );
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(
            new,
            old,
            &[
                ("/provisioner", "provisioner"),
                ("/parameters", "parameters"),
                ("/reclaimPolicy", "reclaimPolicy"),
                ("/volumeBindingMode", "volumeBindingMode"),
            ],
            causes,
        );
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        // The default StorageClass says so in its name cell, as upstream prints it.
        row.name_with(0, || {
            let mut name = s(o, "/metadata/name");
            if meta(o)
                .get("annotations")
                .and_then(|a| a.get(crate::admission::storageclass::DEFAULT_CLASS))
                .and_then(Value::as_str)
                == Some("true")
            {
                name.push_str(" (default)");
            }
            name
        });
        row.col("Provisioner", "string", 0, || s(o, "/provisioner"));
        row.col("ReclaimPolicy", "string", 0, || {
            or(s(o, "/reclaimPolicy"), "Delete")
        });
        row.col("VolumeBindingMode", "string", 0, || {
            or(s(o, "/volumeBindingMode"), "Immediate")
        });
        row.col("AllowVolumeExpansion", "string", 0, || {
            o.pointer("/allowVolumeExpansion") == Some(&json!(true))
        });
        row.age(o);
    }
}

/// A claim's or volume's STATUS column: its phase, or Terminating once deleted (as upstream's
/// printers).
fn phase_or_terminating(o: &Value) -> String {
    if meta(o).get("deletionTimestamp").is_some() {
        "Terminating".into()
    } else {
        s(o, "/status/phase")
    }
}

/// ACCESS MODES as kubectl abbreviates them (RWO, ROX, RWX, RWOP).
fn access_modes(o: &Value, p: &str) -> String {
    list(o, p)
        .iter()
        .filter_map(Value::as_str)
        .map(|m| match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(",")
}

//! DefaultStorageClass: a new PersistentVolumeClaim that names no class (the field absent,
//! not `""`) gets the default StorageClass, the one annotated
//! `storageclass.kubernetes.io/is-default-class: "true"` (the newest when several are).

use crate::Api;
use crate::error::ApiResult;
use minik8s_storage::{RangeRequest, Store};
use serde_json::{Value, json};

/// The annotation marking the default StorageClass.
pub const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// The default class among `classes`: annotated, newest first, then by name (as upstream).
pub fn default_class(classes: &[Value]) -> Option<&str> {
    classes
        .iter()
        .filter(|c| {
            c.pointer("/metadata/annotations")
                .and_then(|a| a.get(DEFAULT_CLASS))
                .and_then(Value::as_str)
                == Some("true")
        })
        .max_by(|a, b| {
            let key = |c: &Value| {
                (
                    c.pointer("/metadata/creationTimestamp")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    c.pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                )
            };
            let (ta, na) = key(a);
            let (tb, nb) = key(b);
            ta.cmp(&tb).then(nb.cmp(&na))
        })
        .and_then(|c| c.pointer("/metadata/name").and_then(Value::as_str))
}

/// Sets `spec.storageClassName` of a claim that has none to the default class, if any.
pub async fn admit(api: &Api, claim: &mut Value) -> ApiResult<()> {
    if claim
        .pointer("/spec/storageClassName")
        .is_some_and(|c| !c.is_null())
    {
        return Ok(());
    }
    let listed = api
        .store
        .range(RangeRequest::prefix(
            "/registry/storage.k8s.io/storageclasses/".to_owned(),
        ))
        .await?;
    let classes: Vec<Value> = listed
        .kvs
        .iter()
        .map(crate::object::from_store)
        .collect::<ApiResult<_>>()?;
    if let Some(name) = default_class(&classes)
        && let Some(spec) = claim.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert("storageClassName".into(), json!(name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_annotated_class_is_the_default() {
        let class = |name: &str, at: &str, default: bool| {
            json!({"metadata": {"name": name, "creationTimestamp": at,
                "annotations": {DEFAULT_CLASS: if default { "true" } else { "false" }}}})
        };
        assert_eq!(
            default_class(&[class("a", "2026-01-01T00:00:00Z", false)]),
            None
        );
        assert_eq!(
            default_class(&[
                class("old", "2026-01-01T00:00:00Z", true),
                class("new", "2026-02-01T00:00:00Z", true),
                class("other", "2026-03-01T00:00:00Z", false),
            ]),
            Some("new")
        );
    }
}

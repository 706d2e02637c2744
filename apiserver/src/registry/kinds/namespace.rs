//! Namespaces (upstream's `pkg/registry/core/namespace`): the name label, the `kubernetes`
//! finalizer in `spec`, changed only through `finalize`, Active → Terminating, and the
//! objects every namespace starts with.

use super::{Row, Strategy, list, s};
use crate::Api;
use crate::error::ApiResult;
use crate::object::{meta, meta_mut};
use crate::registry::ResourceInfo;
use crate::registry::defaults::{child, set_default};
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// `core/v1` Namespace.
pub struct Namespace;

impl Strategy for Namespace {
    fn is_namespace(&self) -> bool {
        true
    }

    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "finalizers", json!(["kubernetes"]));
        // Upstream labels every namespace with its own name (namespaceSelectors use it).
        if let Some(name) = obj.pointer("/metadata/name").cloned() {
            let labels = child(child(obj, "metadata"), "labels");
            labels["kubernetes.io/metadata.name"] = name;
        }
    }

    /// `spec.finalizers` changes only through `finalize`, and `finalize` changes nothing
    /// else (upstream's namespaceStrategy and namespaceFinalizeStrategy).
    fn prepare_for_update(&self, new: &mut Value, old: &Value, subresource: Option<&str>) {
        let old_finalizers = old.pointer("/spec/finalizers").cloned();
        if subresource == Some("finalize") {
            let finalizers = new.pointer("/spec/finalizers").cloned();
            let mut merged = old.clone();
            if let Some(rv) = meta(new).get("resourceVersion").cloned() {
                meta_mut(&mut merged).insert("resourceVersion".into(), rv);
            } else {
                meta_mut(&mut merged).remove("resourceVersion");
            }
            match finalizers {
                Some(f) => merged["spec"]["finalizers"] = f,
                None => {
                    if let Some(s) = merged.get_mut("spec").and_then(Value::as_object_mut) {
                        s.remove("finalizers");
                    }
                }
            }
            *new = merged;
        } else if let Some(f) = old_finalizers {
            if !new.get("spec").is_some_and(Value::is_object) {
                new["spec"] = json!({});
            }
            new["spec"]["finalizers"] = f;
        }
    }

    fn initial_status(&self, obj: &mut Value) {
        obj["status"] = json!({"phase": "Active"});
    }

    /// The namespace's own finalizers (`spec.finalizers`) hold it in Terminating.
    fn held_by_spec(&self, obj: &Value) -> bool {
        !list(obj, "/spec/finalizers").is_empty()
    }

    fn begin_deletion(&self, obj: &mut Value) {
        obj["status"]["phase"] = json!("Terminating");
    }

    /// The default ServiceAccount and `kube-root-ca.crt`, as upstream's service account and
    /// root CA publisher controllers make them.
    fn after_create<'a>(&'a self, api: &'a Api, obj: &'a Value) -> BoxFuture<'a, ApiResult<()>> {
        Box::pin(async move {
            let name = crate::object::meta_str(obj, "name").unwrap_or_default();
            crate::cluster::bootstrap::namespace_defaults(api, name).await
        })
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Status", "string", 0, || s(o, "/status/phase"));
        row.age(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_labelled_with_their_name() {
        let mut ns = json!({"metadata": {"name": "team", "labels": {"kubernetes.io/metadata.name": "other"}}});
        Namespace.default(&mut ns);
        assert_eq!(
            ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "team"
        );
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    }
}

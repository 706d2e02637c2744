//! Per-kind update strategies, as upstream's registry strategies (`pkg/registry/*`): what an
//! update of the main resource or of a subresource may change, carried over from the stored
//! object or refused with upstream's field causes.

use crate::error::Cause;
use crate::object::meta;
use crate::registry::ResourceInfo;
use serde_json::{Value, json};

/// Carries over what this kind's update may not change through the given subresource
/// (`None`: the main resource). Runs before defaulting and validation.
pub fn prepare_update(res: &ResourceInfo, new: &mut Value, old: &Value, subresource: Option<&str>) {
    if res.group.is_empty() && res.kind == "Namespace" {
        // `spec.finalizers` changes only through `finalize`, and `finalize` changes nothing
        // else (upstream's namespaceStrategy and namespaceFinalizeStrategy).
        let old_finalizers = old.pointer("/spec/finalizers").cloned();
        if subresource == Some("finalize") {
            let finalizers = new.pointer("/spec/finalizers").cloned();
            let mut merged = old.clone();
            if let Some(rv) = meta(new).get("resourceVersion").cloned() {
                crate::object::meta_mut(&mut merged).insert("resourceVersion".into(), rv);
            } else {
                crate::object::meta_mut(&mut merged).remove("resourceVersion");
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
}

/// Sets what the server owns on a new object of this kind (a CSR's requestor: upstream's
/// `csrStrategy.PrepareForCreate` fills `spec.username`, `uid`, `groups` and `extra` from
/// the user who creates it, whatever the client sent).
pub fn prepare_create(res: &ResourceInfo, obj: &mut Value, user: &crate::auth::User) {
    if is_csr(res) {
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let spec = obj["spec"].as_object_mut().expect("spec is an object");
        spec.insert("username".into(), json!(user.name));
        spec.insert("groups".into(), json!(user.groups));
        spec.remove("uid");
        spec.remove("extra");
    }
}

fn is_csr(res: &ResourceInfo) -> bool {
    res.group == "certificates.k8s.io" && res.kind == "CertificateSigningRequest"
}

fn conditions_where(obj: &Value, keep: impl Fn(&str) -> bool) -> Vec<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter(|c| keep(c.get("type").and_then(Value::as_str).unwrap_or("")))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Narrows a status-like update (`merged`: the stored object with the new status) to what the
/// subresource may change: a CSR's `status` keeps its Approved and Denied conditions, and its
/// `approval` changes the conditions only (upstream's csrStatusStrategy and
/// csrApprovalStrategy).
pub fn prepare_status(res: &ResourceInfo, merged: &mut Value, old: &Value, sub: Option<&str>) {
    if !is_csr(res) {
        return;
    }
    let decision = |t: &str| t == "Approved" || t == "Denied";
    let conditions = match sub {
        Some("approval") => {
            let certificate = old.pointer("/status/certificate").cloned();
            if !merged.get("status").is_some_and(Value::is_object) {
                merged["status"] = json!({});
            }
            let status = merged["status"].as_object_mut().expect("status object");
            match certificate {
                Some(c) => status.insert("certificate".into(), c),
                None => status.remove("certificate"),
            };
            return;
        }
        _ => {
            let mut keep = conditions_where(merged, |t| !decision(t));
            let mut decided = conditions_where(old, decision);
            decided.append(&mut keep);
            decided
        }
    };
    if !merged.get("status").is_some_and(Value::is_object) {
        merged["status"] = json!({});
    }
    if conditions.is_empty() {
        merged["status"]
            .as_object_mut()
            .expect("status object")
            .remove("conditions");
    } else {
        merged["status"]["conditions"] = json!(conditions);
    }
}

/// Whether an object being deleted may now go: no finalizers left in `metadata` nor in a
/// namespace's `spec`, as upstream's `ShouldDeleteDuringUpdate`.
pub fn finalized(res: &ResourceInfo, obj: &Value) -> bool {
    no_items(meta(obj).get("finalizers")) && !held_by_spec(res, obj)
}

/// Whether a namespace's own finalizers (`spec.finalizers`) still hold it in Terminating.
pub fn held_by_spec(res: &ResourceInfo, obj: &Value) -> bool {
    res.group.is_empty() && res.kind == "Namespace" && !no_items(obj.pointer("/spec/finalizers"))
}

fn no_items(list: Option<&Value>) -> bool {
    list.and_then(Value::as_array).is_none_or(|f| f.is_empty())
}

/// What an update may not change, as upstream's `ValidateUpdate` of each kind.
pub fn validate_update(res: &ResourceInfo, new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    no_new_finalizers(new, old, &mut causes);
    let fields: &[(&str, &str)] = match (res.group.as_str(), res.kind.as_str()) {
        ("apps", _) | ("batch", "Job") => &[("/spec/selector", "spec.selector")],
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            &[("/roleRef", "roleRef")]
        }
        ("networking.k8s.io", "IngressClass") => &[("/spec/controller", "spec.controller")],
        ("certificates.k8s.io", "CertificateSigningRequest") => &[("/spec", "spec")],
        ("storage.k8s.io", "StorageClass") => &[
            ("/provisioner", "provisioner"),
            ("/parameters", "parameters"),
            ("/reclaimPolicy", "reclaimPolicy"),
            ("/volumeBindingMode", "volumeBindingMode"),
        ],
        _ => &[],
    };
    for (ptr, field) in fields {
        if new.pointer(ptr) != old.pointer(ptr) {
            causes.push(Cause::immutable(field));
        }
    }
    match (res.group.as_str(), res.kind.as_str()) {
        ("", "ConfigMap" | "Secret") if old.get("immutable") == Some(&json!(true)) => {
            for f in ["data", "binaryData", "stringData"] {
                if new.get(f) != old.get(f) {
                    causes.push(Cause::forbidden(
                        f,
                        "field is immutable when `immutable` is set",
                    ));
                }
            }
            if new.get("immutable") != Some(&json!(true)) {
                causes.push(Cause::forbidden(
                    "immutable",
                    "field is immutable when `immutable` is set",
                ));
            }
        }
        ("", "Secret") if new.get("type") != old.get("type") => {
            causes.push(Cause::immutable("type"));
        }
        ("", "Pod") => pod_update(new, old, &mut causes),
        ("scheduling.k8s.io", "PriorityClass") => {
            if new.get("value") != old.get("value") {
                causes.push(Cause::forbidden(
                    "value",
                    "may not be changed in an update.",
                ));
            }
            if new.get("preemptionPolicy") != old.get("preemptionPolicy") {
                causes.push(Cause::immutable("preemptionPolicy"));
            }
        }
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            // A decision stands: Approved and Denied may not be removed, nor both be given.
            for t in ["Approved", "Denied"] {
                let had = !conditions_where(old, |x| x == t).is_empty();
                if had && conditions_where(new, |x| x == t).is_empty() {
                    causes.push(Cause::forbidden(
                        "status.conditions",
                        &format!("updates may not remove a condition of type {t:?}"),
                    ));
                }
            }
        }
        ("batch", "Job") => {
            // The pod template is fixed once a Job may have started pods (upstream lets a
            // suspended Job's template change).
            let suspended = old.pointer("/spec/suspend") == Some(&json!(true));
            if !suspended && new.pointer("/spec/template") != old.pointer("/spec/template") {
                causes.push(Cause::immutable("spec.template"));
            }
            if new.pointer("/spec/completionMode") != old.pointer("/spec/completionMode") {
                causes.push(Cause::immutable("spec.completionMode"));
            }
        }
        ("apps", "StatefulSet") => {
            const MUTABLE: [&str; 7] = [
                "replicas",
                "ordinals",
                "template",
                "updateStrategy",
                "revisionHistoryLimit",
                "persistentVolumeClaimRetentionPolicy",
                "minReadySeconds",
            ];
            let rest = |v: &Value| -> Vec<(String, Value)> {
                v.get("spec")
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .filter(|(k, _)| !MUTABLE.contains(&k.as_str()))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            if rest(new) != rest(old) {
                causes.push(Cause::forbidden(
                    "spec",
                    "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
                ));
            }
        }
        ("", "PersistentVolumeClaim") => {
            // Only the storage request may change, and the binder sets `volumeName` once.
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
        _ => {}
    }
    causes
}

/// Finalizers cannot be added once an object is being deleted.
fn no_new_finalizers(new: &Value, old: &Value, causes: &mut Vec<Cause>) {
    if meta(old).get("deletionTimestamp").is_none() {
        return;
    }
    let list = |o: &Value| -> Vec<String> { crate::object::strings_at(o, "/metadata/finalizers") };
    let before = list(old);
    let extra: Vec<String> = list(new)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if !extra.is_empty() {
        let shown: Vec<String> = extra.iter().map(|f| format!("{f:?}")).collect();
        causes.push(Cause::forbidden(
            "metadata.finalizers",
            &format!(
                "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                shown.join(", ")
            ),
        ));
    }
}

const POD_UPDATE_MSG: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// A pod's spec is fixed once created but for images, a shorter deadline, more
/// tolerations and a few others (upstream's `ValidatePodUpdate`).
fn pod_update(new: &Value, old: &Value, causes: &mut Vec<Cause>) {
    let (Some(new_spec), Some(old_spec)) = (new.get("spec"), old.get("spec")) else {
        return;
    };
    // Compare with what the update may change taken back to the stored values.
    let mut masked = new_spec.clone();
    for key in ["containers", "initContainers"] {
        let olds = old_spec.get(key).and_then(Value::as_array);
        if let (Some(news), Some(olds)) = (masked.get_mut(key).and_then(Value::as_array_mut), olds)
            && news.len() == olds.len()
        {
            for (n, o) in news.iter_mut().zip(olds) {
                if let (Some(n), Some(image)) = (n.as_object_mut(), o.get("image")) {
                    n.insert("image".into(), image.clone());
                }
            }
        }
    }
    let deadline = |s: &Value| s.get("activeDeadlineSeconds").and_then(Value::as_i64);
    match (deadline(old_spec), deadline(new_spec)) {
        (Some(_), None) => causes.push(Cause::invalid(
            "spec.activeDeadlineSeconds",
            "null",
            "must not update from a positive integer to nil value",
        )),
        (Some(o), Some(n)) if n > o => causes.push(Cause::invalid(
            "spec.activeDeadlineSeconds",
            &n.to_string(),
            "must be less than or equal to previous value",
        )),
        _ => {}
    }
    set_or_remove(&mut masked, "activeDeadlineSeconds", old_spec);
    let tolerations = |s: &Value| s.get("tolerations").and_then(Value::as_array).cloned();
    let old_t = tolerations(old_spec).unwrap_or_default();
    let new_t = tolerations(new_spec).unwrap_or_default();
    if old_t.iter().all(|t| new_t.contains(t)) {
        set_or_remove(&mut masked, "tolerations", old_spec);
    }
    let grace = |s: &Value| {
        s.get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
    };
    if grace(old_spec).is_some_and(|g| g < 0) && grace(new_spec) == Some(1) {
        set_or_remove(&mut masked, "terminationGracePeriodSeconds", old_spec);
    }
    // Scheduling gates may only be removed.
    let gates = |s: &Value| s.get("schedulingGates").and_then(Value::as_array).cloned();
    let new_g = gates(new_spec).unwrap_or_default();
    if new_g
        .iter()
        .all(|g| gates(old_spec).unwrap_or_default().contains(g))
    {
        set_or_remove(&mut masked, "schedulingGates", old_spec);
    }
    if &masked != old_spec {
        causes.push(Cause::forbidden("spec", POD_UPDATE_MSG));
    }
}

/// Sets `key` of `obj` to `from`'s value, or removes it where `from` has none.
fn set_or_remove(obj: &mut Value, key: &str, from: &Value) {
    let Some(m) = obj.as_object_mut() else {
        return;
    };
    match from.get(key) {
        Some(v) => {
            m.insert(key.into(), v.clone());
        }
        None => {
            m.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn pod_updates_may_change_images_tolerations_and_a_shorter_deadline_only() {
        let old = pod(
            json!({"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Always",
            "activeDeadlineSeconds": 60, "tolerations": [{"key": "x", "operator": "Exists"}]}),
        );
        let ok = pod(
            json!({"containers": [{"name": "c", "image": "b"}], "restartPolicy": "Always",
            "activeDeadlineSeconds": 30,
            "tolerations": [{"key": "x", "operator": "Exists"}, {"key": "y", "operator": "Exists"}]}),
        );
        let mut causes = vec![];
        pod_update(&ok, &old, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");

        let restart = pod(
            json!({"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Never",
            "activeDeadlineSeconds": 60, "tolerations": [{"key": "x", "operator": "Exists"}]}),
        );
        let mut causes = vec![];
        pod_update(&restart, &old, &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec");
        assert_eq!(causes[0].reason, "FieldValueForbidden");

        let removed = pod(
            json!({"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Always",
            "activeDeadlineSeconds": 90}),
        );
        let mut causes = vec![];
        pod_update(&removed, &old, &mut causes);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["spec.activeDeadlineSeconds", "spec"]);
    }

    #[test]
    fn no_finalizer_may_be_added_to_an_object_being_deleted() {
        let old = json!({"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a"]}});
        let new = json!({"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a", "b"]}});
        let mut causes = vec![];
        no_new_finalizers(&new, &old, &mut causes);
        assert_eq!(causes[0].field, "metadata.finalizers");
        assert!(causes[0].message.contains("\"b\""), "{}", causes[0].message);
        let mut causes = vec![];
        no_new_finalizers(&old, &new, &mut causes);
        assert!(causes.is_empty());
    }
}

//! Priority: a new pod's `spec.priority` (and `preemptionPolicy`) come from its
//! PriorityClass, or from the global default class, as upstream's `Priority` admission
//! plugin (`plugin/pkg/admission/priority`). It also keeps PriorityClasses to one global
//! default.

use crate::error::{ApiError, ApiResult};
use crate::{Api, object};
use minik8s_storage::{RangeRequest, Store};
use serde_json::{Value, json};

/// Where PriorityClasses are stored.
const PREFIX: &str = "/registry/scheduling.k8s.io/priorityclasses/";

/// The built-in classes the apiserver creates (upstream's `SystemPriorityClasses`).
pub fn system_classes() -> [Value; 2] {
    let class = |name: &str, value: i64, description: &str| {
        json!({"kind": "PriorityClass", "apiVersion": "scheduling.k8s.io/v1",
            "metadata": {"name": name}, "value": value, "globalDefault": false,
            "preemptionPolicy": "PreemptLowerPriority", "description": description})
    };
    [
        class(
            "system-node-critical",
            2_000_001_000,
            "Used for system critical pods that must not be moved from their current node.",
        ),
        class(
            "system-cluster-critical",
            2_000_000_000,
            "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
        ),
    ]
}

async fn classes(api: &Api) -> ApiResult<Vec<Value>> {
    let listed = api
        .store
        .range(RangeRequest::prefix(PREFIX.to_owned()))
        .await?;
    listed.kvs.iter().map(object::from_store).collect()
}

/// The global default among `classes`: the one with the highest value (upstream's
/// `getDefaultPriorityClass`).
fn global_default(classes: &[Value]) -> Option<&Value> {
    classes
        .iter()
        .filter(|c| c.get("globalDefault") == Some(&json!(true)))
        .max_by_key(|c| c.get("value").and_then(Value::as_i64).unwrap_or(0))
}

/// Sets a new pod's priority from its class; 403 for a class that does not exist or for a
/// priority given in the spec that differs from the class's.
pub async fn admit_pod(api: &Api, pod: &mut Value) -> ApiResult<()> {
    let name = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let pod_name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let forbidden = |why: String| ApiError::forbidden_object("", "pods", &pod_name, &why);
    let (class_name, value, policy) = if name.is_empty() {
        let all = classes(api).await?;
        match global_default(&all) {
            Some(c) => (
                c.pointer("/metadata/name").cloned(),
                c.get("value").and_then(Value::as_i64).unwrap_or(0),
                c.get("preemptionPolicy").cloned(),
            ),
            None => (None, 0, None),
        }
    } else {
        let Some(kv) = api.store.get(&format!("{PREFIX}{name}")).await? else {
            return Err(forbidden(format!(
                "no PriorityClass with name {name} was found"
            )));
        };
        let c = object::from_store(&kv)?;
        (
            None,
            c.get("value").and_then(Value::as_i64).unwrap_or(0),
            c.get("preemptionPolicy").cloned(),
        )
    };
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    if let Some(given) = spec.get("priority").and_then(Value::as_i64)
        && given != value
    {
        return Err(forbidden(format!(
            "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {value} from the given PriorityClass name"
        )));
    }
    if let Some(class_name) = class_name {
        spec.insert("priorityClassName".into(), class_name);
    }
    spec.insert("priority".into(), json!(value));
    if let Some(policy) = policy.filter(|p| !p.is_null()) {
        if let Some(given) = spec.get("preemptionPolicy").filter(|g| !g.is_null())
            && *given != policy
        {
            return Err(forbidden(format!(
                "the string value of PreemptionPolicy ({}) must not be provided in pod spec; priority admission controller computed {} from the given PriorityClass name",
                given.as_str().unwrap_or_default(),
                policy.as_str().unwrap_or_default()
            )));
        }
        spec.insert("preemptionPolicy".into(), policy);
    }
    Ok(())
}

/// A PriorityClass marked `globalDefault` may not join another (403, upstream's message).
pub async fn admit_class(api: &Api, class: &Value) -> ApiResult<()> {
    if class.get("globalDefault") != Some(&json!(true)) {
        return Ok(());
    }
    let name = class
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let all = classes(api).await?;
    if let Some(other) = all.iter().find(|c| {
        c.get("globalDefault") == Some(&json!(true))
            && c.pointer("/metadata/name").and_then(Value::as_str) != Some(name)
    }) {
        let other = other
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return Err(ApiError::forbidden_object(
            "scheduling.k8s.io",
            "priorityclasses",
            name,
            &format!(
                "PriorityClass {other} is already marked as default. Only one default can exist"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_global_default_wins() {
        let c = |name: &str, value: i64, default: bool| json!({"metadata": {"name": name}, "value": value, "globalDefault": default});
        let all = [c("a", 10, true), c("b", 20, false), c("c", 5, true)];
        assert_eq!(global_default(&all).unwrap()["metadata"]["name"], "a");
        assert!(global_default(&[c("b", 1, false)]).is_none());
        assert_eq!(system_classes()[1]["value"], 2_000_000_000);
    }
}

//! RuntimeClass: a new pod that names a RuntimeClass takes the class's `overhead` and its
//! scheduling constraints (node selector, tolerations), and is refused when the class does
//! not exist, as upstream's `RuntimeClass` admission plugin
//! (`plugin/pkg/admission/runtimeclass`).

use crate::error::{ApiError, ApiResult};
use crate::{Api, object};
use minik8s_storage::Store;
use minik8s_types::Quantity;
use serde_json::{Map, Value, json};

/// Where RuntimeClasses are stored.
const PREFIX: &str = "/registry/node.k8s.io/runtimeclasses/";

/// Whether two resource lists hold the same quantities (`10m` and `0.01` are equal).
fn same_resources(a: &Value, b: &Value) -> bool {
    let parse = |v: &Value| -> Option<Vec<(String, Quantity)>> {
        let mut list: Vec<(String, Quantity)> = v
            .as_object()?
            .iter()
            .map(|(k, q)| Some((k.clone(), Quantity::parse(q.as_str()?).ok()?)))
            .collect::<Option<_>>()?;
        list.sort_by(|x, y| x.0.cmp(&y.0));
        Some(list)
    };
    parse(a).is_some() && parse(a) == parse(b)
}

/// Admits a new pod against its RuntimeClass; 403 when the class does not exist, when the
/// pod sets an overhead the class does not define, or when the class's node selector
/// contradicts the pod's.
pub async fn admit_pod(api: &Api, pod: &mut Value) -> ApiResult<()> {
    let Some(class_name) = pod
        .pointer("/spec/runtimeClassName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
    else {
        return Ok(());
    };
    let pod_name = object::meta_str(pod, "name").unwrap_or_default().to_owned();
    let forbidden = |why: String| ApiError::forbidden_object("", "pods", &pod_name, &why);
    let Some(kv) = api.store.get(&format!("{PREFIX}{class_name}")).await? else {
        return Err(forbidden(format!(
            "pod rejected: RuntimeClass \"{class_name}\" not found"
        )));
    };
    let class = object::from_store(&kv)?;
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let fixed = class.pointer("/overhead/podFixed").filter(|o| !o.is_null());
    let given = spec.get("overhead").filter(|o| !o.is_null()).cloned();
    match (fixed, given) {
        (Some(fixed), None) => {
            spec.insert("overhead".into(), fixed.clone());
        }
        (Some(fixed), Some(given)) if !same_resources(fixed, &given) => {
            return Err(forbidden(
                "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(forbidden(
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
                    .into(),
            ));
        }
        _ => {}
    }
    let scheduling = class.get("scheduling").cloned().unwrap_or_default();
    if let Some(wanted) = scheduling.get("nodeSelector").and_then(Value::as_object) {
        let selector = spec
            .entry("nodeSelector")
            .or_insert_with(|| Value::Object(Map::new()));
        if selector.is_null() {
            *selector = json!({});
        }
        if let Some(selector) = selector.as_object_mut() {
            for (k, v) in wanted {
                match selector.get(k) {
                    Some(have) if have != v => {
                        return Err(forbidden(format!(
                            "conflict: runtimeClass.scheduling.nodeSelector[{k}] = {}; pod.spec.nodeSelector[{k}] = {}",
                            v.as_str().unwrap_or_default(),
                            have.as_str().unwrap_or_default()
                        )));
                    }
                    _ => {
                        selector.insert(k.clone(), v.clone());
                    }
                }
            }
        }
    }
    if let Some(extra) = scheduling.get("tolerations").and_then(Value::as_array) {
        let list = spec
            .entry("tolerations")
            .or_insert_with(|| Value::Array(Vec::new()));
        if list.is_null() {
            *list = json!([]);
        }
        if let Some(list) = list.as_array_mut() {
            for t in extra {
                if !list.contains(t) {
                    list.push(t.clone());
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_compare_by_value() {
        assert!(same_resources(
            &json!({"cpu": "10m", "memory": "1Mi"}),
            &json!({"memory": "1048576", "cpu": "0.01"})
        ));
        assert!(!same_resources(
            &json!({"cpu": "10m"}),
            &json!({"cpu": "20m"})
        ));
        assert!(!same_resources(
            &json!({"cpu": "10m"}),
            &json!({"cpu": "10m", "memory": "1Mi"})
        ));
    }
}

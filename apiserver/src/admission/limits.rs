//! LimitRanger: a namespace's LimitRanges default containers' requests and limits, and
//! reject pods outside their `min`, `max` and `maxLimitRequestRatio` (per Container and per
//! Pod), as upstream's LimitRanger plugin does on pod create.

use crate::Api;
use crate::error::{ApiError, ApiResult};
use crate::object::meta_str;
use k8s_openapi::Resource;
use k8s_openapi::api::core::v1::Pod;
use minik8s_storage::{RangeRequest, Store};
use minik8s_types::Quantity;
use serde_json::{Map, Value, json};

/// Reads the LimitRanges of a namespace.
pub async fn ranges(api: &Api, ns: &str) -> ApiResult<Vec<Value>> {
    if ns.is_empty() {
        return Ok(Vec::new());
    }
    let listed = api
        .store
        .range(RangeRequest::prefix(format!(
            "/registry/core/limitranges/{ns}/"
        )))
        .await?;
    listed.kvs.iter().map(crate::object::from_store).collect()
}

/// The `limits` items of the given type (`Container`, `Pod`).
fn items<'a>(ranges: &'a [Value], ty: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    ranges
        .iter()
        .filter_map(|r| r.pointer("/spec/limits").and_then(Value::as_array))
        .flatten()
        .filter(move |i| i.get("type").and_then(Value::as_str) == Some(ty))
}

fn containers_mut(pod: &mut Value) -> Vec<&mut Value> {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    spec.iter_mut()
        .filter(|(k, _)| *k == "containers" || *k == "initContainers")
        .filter_map(|(_, v)| v.as_array_mut())
        .flatten()
        .collect()
}

fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    ["containers", "initContainers"]
        .into_iter()
        .filter_map(|k| pod.pointer(&format!("/spec/{k}")).and_then(Value::as_array))
        .flatten()
}

/// Fills missing container requests and limits from the Container items' `defaultRequest`
/// and `default`, and notes what was set in the `kubernetes.io/limit-ranger` annotation.
pub fn default_pod(ranges: &[Value], pod: &mut Value) {
    let mut notes = Vec::new();
    let defaults: Vec<(&str, Map<String, Value>)> = items(ranges, "Container")
        .flat_map(|i| {
            [("limits", "default"), ("requests", "defaultRequest")]
                .into_iter()
                .filter_map(move |(to, from)| {
                    i.get(from)
                        .and_then(Value::as_object)
                        .map(|m| (to, m.clone()))
                })
        })
        .collect();
    if defaults.is_empty() {
        return;
    }
    for c in containers_mut(pod) {
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        for (to, values) in &defaults {
            for (res, q) in values {
                let resources = &mut c["resources"];
                if !resources.is_object() {
                    *resources = json!({});
                }
                let target = &mut resources[*to];
                if !target.is_object() {
                    *target = json!({});
                }
                if target.get(res).is_none() {
                    target[res] = q.clone();
                    let what = if *to == "limits" { "limit" } else { "request" };
                    notes.push(format!("{res} {what} for container {name}"));
                }
            }
        }
    }
    if !notes.is_empty() {
        let m = crate::object::meta_mut(pod);
        let ann = m.entry("annotations").or_insert_with(|| json!({}));
        ann["kubernetes.io/limit-ranger"] =
            json!(format!("LimitRanger plugin set: {}", notes.join("; ")));
    }
}

fn quantity(v: Option<&Value>) -> Option<Quantity> {
    v.and_then(Value::as_str)
        .and_then(|s| Quantity::parse(s).ok())
        .or_else(|| v.and_then(Value::as_i64).map(Quantity::from_units))
}

/// The requests and limits of one container, or the sums over a pod, for a resource.
struct Usage {
    request: Option<Quantity>,
    limit: Option<Quantity>,
}

fn container_usage(c: &Value, res: &str) -> Usage {
    Usage {
        request: quantity(c.pointer(&format!("/resources/requests/{res}"))),
        limit: quantity(c.pointer(&format!("/resources/limits/{res}"))),
    }
}

/// Pod usage as upstream's LimitRanger sums it: a missing value in any container makes
/// the pod's value missing.
fn pod_usage(pod: &Value, res: &str) -> Usage {
    let all: Vec<Usage> = containers(pod).map(|c| container_usage(c, res)).collect();
    let sum = |f: fn(&Usage) -> Option<Quantity>| -> Option<Quantity> {
        all.iter().map(f).sum::<Option<Quantity>>()
    };
    Usage {
        request: sum(|u| u.request),
        limit: sum(|u| u.limit),
    }
}

fn check(item: &Value, ty: &str, usage: impl Fn(&str) -> Usage, errors: &mut Vec<String>) {
    let entries = |key: &str| -> Vec<(String, Quantity)> {
        item.get(key)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| quantity(Some(v)).map(|q| (k.clone(), q)))
                    .collect()
            })
            .unwrap_or_default()
    };
    // One error per constraint, the first that fails, as upstream.
    for (res, min) in entries("min") {
        let u = usage(&res);
        let err = match (u.request, u.limit) {
            (None, _) => Some(format!(
                "minimum {res} usage per {ty} is {min}.  No request is specified"
            )),
            (Some(r), _) if r < min => Some(format!(
                "minimum {res} usage per {ty} is {min}, but request is {r}"
            )),
            (_, Some(l)) if l < min => Some(format!(
                "minimum {res} usage per {ty} is {min}, but limit is {l}"
            )),
            _ => None,
        };
        errors.extend(err);
    }
    for (res, max) in entries("max") {
        let u = usage(&res);
        let err = match (u.request, u.limit) {
            (_, None) => Some(format!(
                "maximum {res} usage per {ty} is {max}.  No limit is specified"
            )),
            (_, Some(l)) if l > max => Some(format!(
                "maximum {res} usage per {ty} is {max}, but limit is {l}"
            )),
            (Some(r), _) if r > max => Some(format!(
                "maximum {res} usage per {ty} is {max}, but request is {r}"
            )),
            _ => None,
        };
        errors.extend(err);
    }
    for (res, ratio) in entries("maxLimitRequestRatio") {
        let u = usage(&res);
        match (u.request, u.limit) {
            // limit / request ≤ ratio, in exact integers.
            (Some(r), Some(l))
                if r.millis() > 0 && l.millis() * 1000 > ratio.millis() * r.millis() =>
            {
                let actual = l.millis() * 1000 / r.millis();
                errors.push(format!(
                    "{res} max limit to request ratio per {ty} is {ratio}, but provided ratio is {}",
                    Quantity(actual)
                ));
            }
            (_, None) => errors.push(format!(
                "{res} max limit to request ratio per {ty} is {ratio}, but no limit is specified"
            )),
            _ => {}
        }
    }
}

/// Rejects a pod outside the namespace's limits (403, upstream's message).
pub fn check_pod(ranges: &[Value], pod: &Value) -> ApiResult<()> {
    let mut errors = Vec::new();
    for item in items(ranges, "Container") {
        for c in containers(pod) {
            check(item, "Container", |r| container_usage(c, r), &mut errors);
        }
    }
    for item in items(ranges, Pod::KIND) {
        check(item, Pod::KIND, |r| pod_usage(pod, r), &mut errors);
    }
    if errors.is_empty() {
        return Ok(());
    }
    let name = meta_str(pod, "name").unwrap_or_default();
    let joined = match errors.len() {
        1 => errors.remove(0),
        _ => format!("[{}]", errors.join(", ")),
    };
    Err(ApiError::forbidden(format!(
        "pods \"{name}\" is forbidden: {joined}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range() -> Value {
        json!({"spec": {"limits": [{
            "type": "Container",
            "default": {"cpu": "500m", "memory": "128Mi"},
            "defaultRequest": {"cpu": "250m"},
            "max": {"cpu": "1"},
            "min": {"cpu": "100m"},
        }]}})
    }

    #[test]
    fn defaults_fill_only_what_is_missing() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a"},
            {"name": "b", "resources": {"limits": {"cpu": "200m"}, "requests": {"cpu": "200m"}}},
        ]}});
        default_pod(&[range()], &mut pod);
        assert_eq!(
            pod.pointer("/spec/containers/0/resources/limits/cpu"),
            Some(&json!("500m"))
        );
        assert_eq!(
            pod.pointer("/spec/containers/0/resources/requests/cpu"),
            Some(&json!("250m"))
        );
        assert_eq!(
            pod.pointer("/spec/containers/1/resources/limits/cpu"),
            Some(&json!("200m"))
        );
        assert_eq!(
            pod.pointer("/spec/containers/1/resources/requests/cpu"),
            Some(&json!("200m"))
        );
        assert!(
            meta_str(&pod, "annotations").is_none()
                && pod
                    .pointer("/metadata/annotations/kubernetes.io~1limit-ranger")
                    .is_some()
        );
        check_pod(&[range()], &pod).unwrap();
    }

    #[test]
    fn limits_outside_the_range_are_forbidden() {
        let pod = json!({"metadata": {"name": "big"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "50m"}}},
        ]}});
        let e = check_pod(&[range()], &pod).unwrap_err();
        assert_eq!(e.code, 403);
        assert!(
            e.message
                .contains("maximum cpu usage per Container is 1, but limit is 2")
                && e.message
                    .contains("minimum cpu usage per Container is 100m, but request is 50m"),
            "{}",
            e.message
        );
    }
}

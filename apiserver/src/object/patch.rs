//! Patch application: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge
//! patch with the upstream merge keys of built-in kinds and its `$patch`,
//! `$setElementOrder`, `$retainKeys` and `$deleteFromPrimitiveList` directives.

use crate::error::{ApiError, ApiResult};
use crate::registry::lists::{ListType, Lists};
use serde_json::{Map, Value};

/// The kinds of patch a PATCH request may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// The patch type of a content type, if it is one.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Applies a JSON patch.
pub fn json_patch(target: &mut Value, patch: &Value) -> ApiResult<()> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    json_patch::patch(target, &p).map_err(|e| {
        ApiError::new_unprocessable(format!(
            "the server rejected our request due to an error in our request: {e}"
        ))
    })
}

/// Applies a JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// The identity of a map-list element: its key fields (absent ones as null).
pub fn element_id(item: &Value, keys: &[String]) -> Map<String, Value> {
    keys.iter()
        .map(|k| {
            let v = match item.get(k) {
                Some(v) => v.clone(),
                // A port's protocol defaults to TCP, so a port given without one is the TCP
                // port (upstream defaults the key before it merges).
                None if k == "protocol" => Value::String("TCP".into()),
                None => Value::Null,
            };
            (k.clone(), v)
        })
        .collect()
}

/// Removes directive keys from a value that is inserted as a whole.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

/// Applies a strategic merge patch to an object whose lists are typed by `lists`.
pub fn strategic_merge(lists: Lists, target: &mut Value, patch: &Value) -> ApiResult<()> {
    let Value::Object(p) = patch else {
        return Err(ApiError::bad_request(
            "a strategic merge patch must be a JSON object",
        ));
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    merge_map(
        lists,
        target.as_object_mut().expect("object"),
        p,
        &mut Vec::new(),
    );
    Ok(())
}

fn merge_map(
    lists: Lists,
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip(&Value::Object(patch.clone()))
            .as_object()
            .cloned()
            .unwrap_or_default();
        return;
    }
    for (k, pv) in patch {
        if k.starts_with('$') {
            continue;
        }
        path.push(k.clone());
        match pv {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(pm) if pm.get("$patch").and_then(Value::as_str) == Some("delete") => {
                target.remove(k);
            }
            Value::Object(pm) => match target.get_mut(k) {
                Some(Value::Object(tm)) => merge_map(lists, tm, pm, path),
                _ => {
                    let mut fresh = Map::new();
                    merge_map(lists, &mut fresh, pm, path);
                    target.insert(k.clone(), Value::Object(fresh));
                }
            },
            Value::Array(items) => {
                // A strategic merge patch orders merged lists as upstream's; server-side
                // apply (which merges through here too) keeps live items first.
                let strategic = matches!(lists, Lists::Builtin(_));
                let merged = match (lists.of(path), target.get(k)) {
                    (ListType::Map(keys), Some(Value::Array(existing))) => {
                        let merged = merge_list(lists, existing.clone(), items, &keys, path);
                        match strategic {
                            true => upstream_order(merged, items, existing, |v| {
                                Value::Object(element_id(v, &keys))
                            }),
                            false => merged,
                        }
                    }
                    (ListType::Map(keys), _) => merge_list(lists, Vec::new(), items, &keys, path),
                    (ListType::Set, Some(Value::Array(existing))) => {
                        let mut out = existing.clone();
                        for i in items {
                            if !out.contains(i) {
                                out.push(i.clone());
                            }
                        }
                        match strategic {
                            true => upstream_order(out, items, existing, Value::clone),
                            false => out,
                        }
                    }
                    _ => items.iter().map(strip).collect(),
                };
                target.insert(k.clone(), Value::Array(merged));
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
        path.pop();
    }
    // Directives that refer to sibling fields.
    for (k, pv) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (target.get_mut(field), pv.as_array())
            {
                list.retain(|v| !remove.contains(v));
            }
        } else if let Some(field) = k.strip_prefix("$setElementOrder/") {
            path.push(field.to_owned());
            let ty = lists.of(path);
            path.pop();
            if let (Some(Value::Array(list)), Some(order)) = (target.get_mut(field), pv.as_array())
            {
                let ident = |v: &Value| match &ty {
                    ListType::Map(keys) => Value::Object(element_id(v, keys)),
                    _ => v.clone(),
                };
                let wanted: Vec<Value> = order.iter().map(ident).collect();
                let mut ordered: Vec<Value> = Vec::with_capacity(list.len());
                for w in &wanted {
                    if let Some(pos) = list.iter().position(|v| ident(v) == *w) {
                        ordered.push(list.remove(pos));
                    }
                }
                ordered.append(list);
                *list = ordered;
            }
        } else if k == "$retainKeys"
            && let Some(keep) = pv.as_array()
        {
            let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
            target.retain(|k, _| keep.contains(&k.as_str()));
        }
    }
}

/// Upstream's order of a merged list (`normalizeElementOrder`): the items the patch names,
/// in the patch's order, interleaved with the items only the server has, each of which
/// keeps its place before the patch items it preceded in `original`; an item new to the
/// list goes before the server-only items after it.
fn upstream_order(
    merged: Vec<Value>,
    patch: &[Value],
    original: &[Value],
    id: impl Fn(&Value) -> Value,
) -> Vec<Value> {
    let patch_ids: Vec<Value> = patch.iter().map(&id).collect();
    let original_ids: Vec<Value> = original.iter().map(&id).collect();
    let (mut named, server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|v| patch_ids.contains(&id(v)));
    let place = |ids: &[Value], v: &Value| ids.iter().position(|i| *i == id(v));
    named.sort_by_key(|v| place(&patch_ids, v).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(named.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        named.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (place(&original_ids, l), place(&original_ids, r)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    out
}

fn merge_list(
    lists: Lists,
    mut existing: Vec<Value>,
    patch: &[Value],
    keys: &[String],
    path: &mut Vec<String>,
) -> Vec<Value> {
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .map(strip)
            .collect();
    }
    for item in patch {
        if keys.is_empty() || keys.iter().all(|k| item.get(k).is_none()) {
            existing.push(strip(item));
            continue;
        }
        let id = element_id(item, keys);
        let pos = existing.iter().position(|e| element_id(e, keys) == id);
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(pos) = pos {
                existing.remove(pos);
            }
            continue;
        }
        match (pos, item.as_object()) {
            (Some(pos), Some(pm)) => {
                if let Some(tm) = existing[pos].as_object_mut() {
                    merge_map(lists, tm, pm, path);
                }
            }
            _ => existing.push(strip(item)),
        }
    }
    existing
}

impl ApiError {
    /// 422 for a patch that cannot be applied.
    pub fn new_unprocessable(message: String) -> Self {
        ApiError {
            code: 422,
            reason: "Invalid",
            message,
            details: None,
            retry_after: None,
            list_continue: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "x:1", "env": [{"name": "A", "value": "1"}]},
            {"name": "b", "image": "y:1"}
        ]}});
        let patch = json!({"spec": {"containers": [
            {"name": "a", "image": "x:2", "env": [{"name": "B", "value": "2"}]}
        ]}});
        strategic_merge(
            Lists::Builtin(&crate::registry::kinds::pod::Pod),
            &mut pod,
            &patch,
        )
        .unwrap();
        assert_eq!(pod["spec"]["containers"][0]["image"], "x:2");
        assert_eq!(
            pod["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(pod["spec"]["containers"][1]["name"], "b");
    }

    #[test]
    fn merged_lists_take_upstreams_order() {
        let names = |v: &Value| -> Vec<String> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|c| c.get("name").unwrap_or(c).as_str().unwrap().to_owned())
                .collect()
        };
        // A container new to the list goes before the ones only the server has (v1.34's
        // ReplicaSet "Replace and Patch" spec reads containers[0]).
        let mut rs = json!({"spec": {"template": {"spec": {"containers": [{"name": "httpd", "image": "h"}]}}}});
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "test-rs", "image": "pause"}]}}}});
        strategic_merge(
            Lists::Builtin(&crate::registry::kinds::apps::ReplicaSet),
            &mut rs,
            &patch,
        )
        .unwrap();
        assert_eq!(
            names(&rs["spec"]["template"]["spec"]["containers"]),
            ["test-rs", "httpd"]
        );
        // Server-only items keep their place before the named items they preceded.
        let mut pod =
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let patch = json!({"spec": {"containers": [{"name": "b", "image": "x"}, {"name": "d"}]}});
        strategic_merge(
            Lists::Builtin(&crate::registry::kinds::pod::Pod),
            &mut pod,
            &patch,
        )
        .unwrap();
        assert_eq!(names(&pod["spec"]["containers"]), ["a", "b", "d", "c"]);
        // Merged scalar lists too.
        let mut obj = json!({"metadata": {"finalizers": ["a"]}});
        let patch = json!({"metadata": {"finalizers": ["b"]}});
        strategic_merge(
            Lists::Builtin(&crate::registry::kinds::config::ConfigMap),
            &mut obj,
            &patch,
        )
        .unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["b", "a"]));
    }

    #[test]
    fn directives_delete_replace_and_order() {
        let mut pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "tolerations": [{"key": "k"}]}});
        let patch = json!({
            "metadata": {"labels": {"a": null}, "finalizers": ["y"]},
            "spec": {
                "containers": [{"name": "a", "$patch": "delete"}, {"name": "c"}],
                "$setElementOrder/containers": [{"name": "c"}, {"name": "b"}],
                "tolerations": [{"key": "z"}]
            }
        });
        strategic_merge(
            Lists::Builtin(&crate::registry::kinds::pod::Pod),
            &mut pod,
            &patch,
        )
        .unwrap();
        assert_eq!(pod["metadata"]["labels"], json!({"b": "2"}));
        // Upstream's order: an item new to a merged list goes before the server-only ones.
        assert_eq!(pod["metadata"]["finalizers"], json!(["y", "x"]));
        assert_eq!(
            pod["spec"]["containers"],
            json!([{"name": "c"}, {"name": "b"}])
        );
        assert_eq!(pod["spec"]["tolerations"], json!([{"key": "z"}]));
    }

    #[test]
    fn service_ports_merge_by_port_and_json_patch_fails_cleanly() {
        let mut svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}]}});
        strategic_merge(
            Lists::Builtin(&crate::registry::kinds::service::Service),
            &mut svc,
            &json!({"spec": {"ports": [{"port": 443}]}}),
        )
        .unwrap();
        assert_eq!(svc["spec"]["ports"].as_array().unwrap().len(), 2);
        let err = json_patch(&mut svc, &json!([{"op": "remove", "path": "/nope"}])).unwrap_err();
        assert_eq!(err.code, 422);
    }
}

//! Custom resources against their CRD's structural OpenAPI v3 schema: defaulting, pruning of
//! unknown fields and validation (types, required, enum, pattern, bounds, items,
//! `x-kubernetes-int-or-string`, `x-kubernetes-preserve-unknown-fields`, and the CEL rules of
//! `x-kubernetes-validations` through [`crate::registry::rules`]), as upstream does.

use crate::error::Cause;
use serde_json::{Map, Value};

/// What checking an object against a schema found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Paths of fields dropped because the schema does not know them.
    pub pruned: Vec<String>,
    /// Validation failures (422).
    pub causes: Vec<Cause>,
}

fn is_true(s: &Value, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether a schema sets a `default` anywhere.
pub fn has_defaults(schema: &Value) -> bool {
    let Some(m) = schema.as_object() else {
        return false;
    };
    m.contains_key("default")
        || m.get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| p.values().any(has_defaults))
        || m.get("items").is_some_and(has_defaults)
        || m.get("additionalProperties").is_some_and(has_defaults)
}

/// Sets the schema's defaults of fields `obj` lacks, without pruning or validating (what
/// upstream applies to objects read from storage).
pub fn default(schema: &Value, obj: &mut Value) {
    match obj {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, s) in props {
                    match map.get_mut(k) {
                        Some(v) => default(s, v),
                        None => {
                            if let Some(d) = s.get("default") {
                                let mut d = d.clone();
                                default(s, &mut d);
                                map.insert(k.clone(), d);
                            }
                        }
                    }
                }
            } else if let Some(add) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for v in map.values_mut() {
                    default(add, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for v in items {
                    default(s, v);
                }
            }
        }
        _ => {}
    }
}

/// Defaults, prunes and validates `obj` (a whole custom resource) in place.
pub fn apply(schema: &Value, obj: &mut Value) -> Outcome {
    let mut out = Outcome::default();
    let Some(map) = obj.as_object_mut() else {
        out.causes.push(Cause::invalid("", "", "must be an object"));
        return out;
    };
    // apiVersion, kind and metadata are the server's, whatever the schema says.
    let props = schema.get("properties").and_then(Value::as_object);
    let keys: Vec<String> = map.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match props.and_then(|p| p.get(&k)) {
            Some(s) => walk(s, map.get_mut(&k).expect("key"), &k, &mut out),
            None if is_true(schema, "x-kubernetes-preserve-unknown-fields") => {}
            None => {
                map.remove(&k);
                out.pruned.push(k);
            }
        }
    }
    if let Some(props) = props {
        for (k, s) in props {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") || map.contains_key(k) {
                continue;
            }
            if let Some(d) = s.get("default") {
                let mut d = d.clone();
                walk(s, &mut d, k, &mut out);
                map.insert(k.clone(), d);
            }
        }
    }
    required(schema, map, "", &mut out);
    if out.causes.is_empty() {
        out.causes
            .extend(crate::registry::rules::causes(schema, obj, "<nil>"));
    }
    out
}

fn required(schema: &Value, map: &Map<String, Value>, path: &str, out: &mut Outcome) {
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = r.as_str()
            && !map.contains_key(r)
        {
            let field = if path.is_empty() {
                r.to_owned()
            } else {
                format!("{path}.{r}")
            };
            out.causes.push(Cause::required(&field, ""));
        }
    }
}

/// Checks one value against its schema node, then the node's validation rules (only when
/// the value itself passed: rules assume well-typed input).
fn walk(s: &Value, v: &mut Value, path: &str, out: &mut Outcome) {
    let before = out.causes.len();
    walk_value(s, v, path, out);
    if out.causes.len() == before && !v.is_null() {
        out.causes
            .extend(crate::registry::rules::causes(s, v, path));
    }
}

fn walk_value(s: &Value, v: &mut Value, path: &str, out: &mut Outcome) {
    if v.is_null() {
        if !is_true(s, "nullable") {
            // Upstream drops nulls for non-nullable fields when defaulting; treat as absent.
        }
        return;
    }
    if is_true(s, "x-kubernetes-int-or-string") {
        if !matches!(v, Value::String(_)) && type_name(v) != "integer" {
            out.causes.push(Cause::invalid(
                path,
                &shown(v),
                &format!(
                    "{path} in body must be of type integer-or-string: \"{}\"",
                    type_name(v)
                ),
            ));
        }
        return;
    }
    let want = s.get("type").and_then(Value::as_str).unwrap_or("");
    let got = type_name(v);
    let type_ok = match want {
        "" => true,
        "number" => matches!(got, "number" | "integer"),
        w => w == got,
    };
    if !type_ok {
        out.causes.push(Cause::invalid(
            path,
            &shown(v),
            &format!("{path} in body must be of type {want}: \"{got}\""),
        ));
        return;
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(shown).collect();
        let refs: Vec<&str> = list.iter().map(String::as_str).collect();
        out.causes
            .push(Cause::not_supported(path, &shown(v), &refs));
    }
    match v {
        Value::String(text) => {
            let len = text.chars().count() as u64;
            if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                out.causes.push(Cause {
                    reason: "FieldValueTooLong".into(),
                    message: format!("Too long: may not be more than {max} bytes"),
                    field: path.into(),
                });
            }
            if let Some(min) = s.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                out.causes.push(Cause::invalid(
                    path,
                    text,
                    &format!("{path} in body should be at least {min} chars long"),
                ));
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str)
                && let Ok(re) = regex::Regex::new(p)
                && !re.is_match(text)
            {
                out.causes.push(Cause::invalid(
                    path,
                    text,
                    &format!("{path} in body should match '{p}'"),
                ));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
                let excl = is_true(s, "exclusiveMinimum");
                if x < min || (excl && x == min) {
                    out.causes.push(Cause::invalid(
                        path,
                        &n.to_string(),
                        &format!("{path} in body should be greater than or equal to {min}"),
                    ));
                }
            }
            if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
                let excl = is_true(s, "exclusiveMaximum");
                if x > max || (excl && x == max) {
                    out.causes.push(Cause::invalid(
                        path,
                        &n.to_string(),
                        &format!("{path} in body should be less than or equal to {max}"),
                    ));
                }
            }
        }
        Value::Array(items) => {
            if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                out.causes.push(Cause {
                    reason: "FieldValueTooMany".into(),
                    message: format!("Too many: {}: must have at most {max} items", items.len()),
                    field: path.into(),
                });
            }
            if let Some(min) = s.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                out.causes.push(Cause::invalid(
                    path,
                    &items.len().to_string(),
                    &format!("{path} in body should have at least {min} items"),
                ));
            }
            // List types: a map's keys and a set's items appear once (upstream reports the
            // later one as `Duplicate value`).
            let list_type = s.get("x-kubernetes-list-type").and_then(Value::as_str);
            if matches!(list_type, Some("map") | Some("set")) {
                let keys: Vec<&str> = s
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let mut seen = std::collections::HashSet::new();
                for (i, item) in items.iter().enumerate() {
                    let identity = if list_type == Some("map") {
                        let mut m = serde_json::Map::new();
                        for k in &keys {
                            if let Some(v) = item.get(*k) {
                                m.insert((*k).to_owned(), v.clone());
                            }
                        }
                        Value::Object(m)
                    } else {
                        item.clone()
                    };
                    if !seen.insert(identity.to_string()) {
                        out.causes.push(Cause {
                            reason: "FieldValueDuplicate".into(),
                            message: format!("Duplicate value: {identity}"),
                            field: format!("{path}[{i}]"),
                        });
                    }
                }
            }
            if let Some(item_schema) = s.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(map) => {
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties").filter(|a| a.is_object());
            let preserve = is_true(s, "x-kubernetes-preserve-unknown-fields")
                || s.get("additionalProperties") == Some(&Value::Bool(true));
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let child = format!("{path}.{k}");
                match (props.and_then(|p| p.get(&k)), additional) {
                    (Some(cs), _) | (None, Some(cs)) => {
                        walk(cs, map.get_mut(&k).expect("key"), &child, out)
                    }
                    (None, None) if preserve => {}
                    (None, None) => {
                        map.remove(&k);
                        out.pruned.push(child);
                    }
                }
            }
            if let Some(props) = props {
                for (k, cs) in props {
                    if !map.contains_key(k)
                        && let Some(d) = cs.get("default")
                    {
                        let mut d = d.clone();
                        walk(cs, &mut d, &format!("{path}.{k}"), out);
                        map.insert(k.clone(), d);
                    }
                }
            }
            required(s, map, path, out);
        }
        _ => {}
    }
}

/// Reasons a CRD schema is not structural (every node typed, or marked int-or-string /
/// preserve-unknown-fields), with the field path of each.
pub fn structural_errors(schema: &Value, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    check(schema, path, &mut causes, true);
    causes
}

fn check(s: &Value, path: &str, causes: &mut Vec<Cause>, root: bool) {
    for (i, r) in s
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = format!("{path}.x-kubernetes-validations[{i}].rule");
        match r.get("rule").and_then(Value::as_str) {
            None | Some("") => causes.push(Cause::required(&field, "")),
            Some(rule) => {
                if let Err(e) = crate::registry::rules::compile(rule) {
                    causes.push(Cause::invalid(&field, rule, &e.to_string()));
                }
            }
        }
    }
    let typed = s.get("type").and_then(Value::as_str).is_some();
    let exempt = is_true(s, "x-kubernetes-int-or-string")
        || is_true(s, "x-kubernetes-preserve-unknown-fields");
    if !typed && !exempt {
        causes.push(Cause::required(
            &format!("{path}.type"),
            "must not be empty for specified object fields",
        ));
    }
    if root
        && s.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "object")
    {
        causes.push(Cause::invalid(
            &format!("{path}.type"),
            s["type"].as_str().unwrap_or(""),
            "must be object at the root",
        ));
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            if root && k == "metadata" {
                continue;
            }
            check(v, &format!("{path}.properties[{k}]"), causes, false);
        }
    }
    if let Some(items) = s.get("items") {
        check(items, &format!("{path}.items"), causes, false);
    }
    if let Some(add) = s.get("additionalProperties").filter(|a| a.is_object()) {
        check(add, &format!("{path}.additionalProperties"), causes, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["image"], "properties": {
                "image": {"type": "string", "pattern": "^[a-z]+(:[0-9]+)?$"},
                "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "port": {"x-kubernetes-int-or-string": true},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 3}},
                "env": {"type": "object", "additionalProperties": {"type": "string"}}
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
        }})
    }

    #[test]
    fn defaults_are_filled_and_unknown_fields_pruned() {
        let mut o = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
            "spec": {"image": "web:1", "bogus": 1, "extra": {"anything": true}, "env": {"A": "1"}}, "top": 1});
        let r = apply(&schema(), &mut o);
        assert!(r.causes.is_empty(), "{:?}", r.causes);
        assert_eq!(r.pruned, ["spec.bogus", "top"]);
        assert_eq!(o["spec"]["replicas"], 1);
        assert_eq!(o["spec"]["extra"]["anything"], true);
        assert_eq!(o["metadata"]["name"], "a");
    }

    #[test]
    fn wrong_values_are_field_causes() {
        let mut o = json!({"spec": {"replicas": "three", "mode": "c", "port": 1.5, "tags": ["a", "b", "long"], "image": "Web"}});
        let r = apply(&schema(), &mut o);
        let fields: Vec<&str> = r.causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.image",
                "spec.mode",
                "spec.port",
                "spec.replicas",
                "spec.tags",
                "spec.tags[2]"
            ]
        );
        let mut missing = json!({"spec": {}});
        assert_eq!(apply(&schema(), &mut missing).causes[0].field, "spec.image");
    }

    #[test]
    fn list_map_keys_and_set_items_appear_once() {
        let schema = json!({"type": "object", "properties": {
            "paths": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["path"],
                      "items": {"type": "object", "properties": {"path": {"type": "string"}, "port": {"type": "integer"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}});
        let mut o = json!({"paths": [{"path": "/a", "port": 1}, {"path": "/b", "port": 1}, {"path": "/a", "port": 2}],
                           "tags": ["x", "y", "x"]});
        let r = apply(&schema, &mut o);
        let got: Vec<(String, String)> = r
            .causes
            .iter()
            .map(|c| (c.field.clone(), c.message.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "paths[2]".to_owned(),
                    r#"Duplicate value: {"path":"/a"}"#.to_owned()
                ),
                ("tags[2]".to_owned(), r#"Duplicate value: "x""#.to_owned()),
            ]
        );
    }

    #[test]
    fn untyped_nodes_are_not_structural() {
        assert!(structural_errors(&schema(), "schema.openAPIV3Schema").is_empty());
        let bad = json!({"type": "object", "properties": {"spec": {"properties": {}}}});
        assert_eq!(
            structural_errors(&bad, "s")[0].field,
            "s.properties[spec].type"
        );
    }
}

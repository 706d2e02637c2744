//! The OpenAPI v2 document as protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`),
//! gnostic's `openapi_v2.Document`, which kubectl up to 1.26 asks for (its validation and
//! `explain` read the definitions and their `x-kubernetes-group-version-kind`). The encoding
//! follows gnostic's OpenAPIv2.proto field numbers; values of `default`, `enum`, `example`
//! and vendor extensions are gnostic `Any`s carrying YAML (JSON text is YAML).
//!
//! Only what clients read is encoded: swagger, info, the definitions, and each path's PATCH
//! operation (its parameters and group/version/kind).

use serde_json::Value;

/// A protobuf writer.
#[derive(Default)]
struct Pb(Vec<u8>);

impl Pb {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn string(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }
    fn message(&mut self, field: u32, m: Pb) {
        self.bytes(field, &m.0);
    }
    fn boolean(&mut self, field: u32, b: bool) {
        if b {
            self.key(field, 0);
            self.varint(1);
        }
    }
    fn int64(&mut self, field: u32, v: i64) {
        if v != 0 {
            self.key(field, 0);
            self.varint(v as u64);
        }
    }
    fn double(&mut self, field: u32, v: f64) {
        if v != 0.0 {
            self.key(field, 1);
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// gnostic `Any` holding a value as YAML.
fn any(v: &Value) -> Pb {
    let mut a = Pb::default();
    a.string(2, &v.to_string());
    a
}

/// `NamedAny` for a vendor extension.
fn named_any(name: &str, v: &Value) -> Pb {
    let mut n = Pb::default();
    n.string(1, name);
    n.message(2, any(v));
    n
}

/// A JSON schema as gnostic's `Schema`.
fn schema(s: &Value) -> Pb {
    let mut p = Pb::default();
    let Some(m) = s.as_object() else {
        return p;
    };
    let text = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or_default();
    let num = |k: &str| m.get(k).and_then(Value::as_f64).unwrap_or_default();
    let int = |k: &str| m.get(k).and_then(Value::as_i64).unwrap_or_default();
    let flag = |k: &str| m.get(k).and_then(Value::as_bool).unwrap_or_default();
    p.string(1, text("$ref"));
    p.string(2, text("format"));
    p.string(3, text("title"));
    p.string(4, text("description"));
    if let Some(d) = m.get("default") {
        p.message(5, any(d));
    }
    p.double(6, num("multipleOf"));
    p.double(7, num("maximum"));
    p.boolean(8, flag("exclusiveMaximum"));
    p.double(9, num("minimum"));
    p.boolean(10, flag("exclusiveMinimum"));
    p.int64(11, int("maxLength"));
    p.int64(12, int("minLength"));
    p.string(13, text("pattern"));
    p.int64(14, int("maxItems"));
    p.int64(15, int("minItems"));
    p.boolean(16, flag("uniqueItems"));
    p.int64(17, int("maxProperties"));
    p.int64(18, int("minProperties"));
    for r in m
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        p.string(19, r.as_str().unwrap_or_default());
    }
    for e in m
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        p.message(20, any(e));
    }
    match m.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut item = Pb::default();
            item.key(2, 0);
            item.varint(*b as u64);
            p.message(21, item);
        }
        Some(v @ Value::Object(_)) => {
            let mut item = Pb::default();
            item.message(1, schema(v));
            p.message(21, item);
        }
        _ => {}
    }
    let types: Vec<&str> = match m.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() {
        let mut t = Pb::default();
        for ty in types {
            t.string(1, ty);
        }
        p.message(22, t);
    }
    match m.get("items") {
        Some(v @ Value::Object(_)) => {
            let mut items = Pb::default();
            items.message(1, schema(v));
            p.message(23, items);
        }
        Some(Value::Array(vs)) => {
            let mut items = Pb::default();
            for v in vs {
                items.message(1, schema(v));
            }
            p.message(23, items);
        }
        _ => {}
    }
    for s in m
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        p.message(24, schema(s));
    }
    if let Some(props) = m.get("properties").and_then(Value::as_object) {
        let mut all = Pb::default();
        for (name, s) in props {
            let mut named = Pb::default();
            named.string(1, name);
            named.message(2, schema(s));
            all.message(1, named);
        }
        p.message(25, all);
    }
    p.string(26, text("discriminator"));
    p.boolean(27, flag("readOnly"));
    if let Some(e) = m.get("example") {
        p.message(30, any(e));
    }
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        p.message(31, named_any(k, v));
    }
    p
}

/// `Paths`: each path's PATCH operation with its query parameters and vendor extensions.
fn paths(paths: &Value) -> Pb {
    let mut out = Pb::default();
    for (path, item) in paths.as_object().into_iter().flatten() {
        let Some(patch) = item.get("patch") else {
            continue;
        };
        let mut op = Pb::default();
        for p in patch["parameters"].as_array().into_iter().flatten() {
            // QueryParameterSubSchema in NonBodyParameter in Parameter in ParametersItem.
            let mut q = Pb::default();
            q.string(2, p["in"].as_str().unwrap_or("query"));
            q.string(4, p["name"].as_str().unwrap_or_default());
            q.string(6, p["type"].as_str().unwrap_or_default());
            q.boolean(20, p["uniqueItems"] == Value::Bool(true));
            let mut non_body = Pb::default();
            non_body.message(3, q);
            let mut param = Pb::default();
            param.message(2, non_body);
            let mut item = Pb::default();
            item.message(1, param);
            op.message(8, item);
        }
        for (k, v) in patch.as_object().into_iter().flatten() {
            if k.starts_with("x-") {
                op.message(13, named_any(k, v));
            }
        }
        let mut path_item = Pb::default();
        path_item.message(8, op);
        let mut named = Pb::default();
        named.string(1, path);
        named.message(2, path_item);
        out.message(2, named);
    }
    out
}

/// The v2 document (JSON) as gnostic's `Document`.
pub fn encode(doc: &Value) -> Vec<u8> {
    let mut d = Pb::default();
    d.string(1, doc["swagger"].as_str().unwrap_or("2.0"));
    let mut info = Pb::default();
    info.string(1, doc["info"]["title"].as_str().unwrap_or("Kubernetes"));
    info.string(2, doc["info"]["version"].as_str().unwrap_or_default());
    d.message(2, info);
    d.message(8, paths(&doc["paths"]));
    let mut defs = Pb::default();
    for (name, s) in doc["definitions"].as_object().into_iter().flatten() {
        let mut named = Pb::default();
        named.string(1, name);
        named.message(2, schema(s));
        defs.message(1, named);
    }
    d.message(9, defs);
    d.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields_encode_as_protobuf() {
        let mut p = Pb::default();
        p.varint(300);
        assert_eq!(p.0, [0xac, 0x02]);
        let s = schema(&serde_json::json!({"type": "string", "description": "d"}));
        // description (4, "d"), then type (22: TypeItem{value: "string"}).
        assert_eq!(
            s.0,
            [
                0x22, 1, b'd', 0xb2, 0x01, 8, 0x0a, 6, b's', b't', b'r', b'i', b'n', b'g'
            ]
        );
    }
}

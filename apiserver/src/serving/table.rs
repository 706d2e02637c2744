//! Server-side printing: `meta.k8s.io/v1` Table output. Each kind's strategy (`kinds/`)
//! gives its columns with their cells (what `kubectl get` shows), with the formatting they
//! share (`kinds::age`, `kinds::json_path`); this file renders them.
//!
//! A page is written straight into the response body, row by row: the cells a strategy gives
//! and the row's object (by default its metadata, as a PartialObjectMetadata) are serialized
//! from the decoded object in place, with no per-row JSON tree and no copy of the metadata.

use crate::registry::ResourceInfo;
use crate::registry::kinds::Row;
use serde_json::Value;

/// Renders objects of one resource as a Table value (for tests; responses use [`write`]).
#[cfg(test)]
pub fn table(
    res: &ResourceInfo,
    objects: &[Value],
    include_object: Option<&str>,
    list_meta: Option<Value>,
    with_columns: bool,
) -> Value {
    let mut out = Vec::new();
    let meta = list_meta.unwrap_or_else(|| Value::Object(Default::default()));
    write(&mut out, res, objects, include_object, &meta, with_columns);
    serde_json::from_slice(&out).expect("a Table is JSON")
}

/// Writes objects of one resource as a Table into `out`; `include_object` is `None`,
/// `Metadata` (the default) or `Object`.
pub fn write(
    out: &mut Vec<u8>,
    res: &ResourceInfo,
    objects: &[Value],
    include_object: Option<&str>,
    list_meta: &Value,
    with_columns: bool,
) {
    let json = |out: &mut Vec<u8>, v: &Value| serde_json::to_writer(out, v).expect("JSON");
    out.reserve(256 + objects.len() * 640);
    out.extend_from_slice(br#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":"#);
    json(out, list_meta);
    out.extend_from_slice(br#","columnDefinitions":["#);
    if with_columns {
        let mut header = Row::header();
        res.strategy.table(res, &Value::Null, &mut header);
        comma_separated(out, &header.finish());
    }
    out.extend_from_slice(br#"],"rows":["#);
    let include = include_object.unwrap_or("Metadata");
    for (i, o) in objects.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let mut cells = Row::cells();
        res.strategy.table(res, o, &mut cells);
        out.extend_from_slice(br#"{"cells":["#);
        comma_separated(out, &cells.finish());
        out.push(b']');
        match include {
            "None" => {}
            "Object" => {
                out.extend_from_slice(br#","object":"#);
                json(out, o);
            }
            _ => {
                out.extend_from_slice(
                    br#","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#,
                );
                json(out, crate::object::meta(o));
                out.push(b'}');
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

fn comma_separated(out: &mut Vec<u8>, values: &[Value]) {
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, v).expect("JSON");
    }
}

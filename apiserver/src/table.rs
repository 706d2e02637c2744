//! Server-side printing: `meta.k8s.io/v1` Table output. Each kind's strategy (`kinds/`)
//! gives its columns with their cells (what `kubectl get` shows); this file renders them and
//! holds the formatting every kind shares.

use crate::kinds::Row;
use crate::registry::ResourceInfo;
use serde_json::{Value, json};

/// kubectl's human-readable age (`duration.HumanDuration`).
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        if secs % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", secs % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if d / 365 < 8 {
        format!("{}y{}d", d / 365, d % 365)
    } else {
        format!("{}y", d / 365)
    }
}

/// The age of a timestamp, as kubectl prints it (`<unknown>` if absent).
pub fn age(ts: &str) -> String {
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration((jiff::Timestamp::now() - t).get_seconds()),
        Err(_) => "<unknown>".into(),
    }
}

/// Evaluates the JSONPath of a printer column: fields (`.spec.replicas`), indexes
/// (`.status.conditions[0]`) and filters on a field's value
/// (`.status.conditions[?(@.type=="Ready")].status`, the first match), as upstream's columns use.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    let mut rest = path.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let name = &r[..end];
            if !name.is_empty() {
                cur = cur.get(name)?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("[?(") {
            let end = r.find(")]")?;
            let (field, want) = r[..end].split_once("==")?;
            let field = field.trim().strip_prefix('@')?;
            let want = want.trim().trim_matches(['"', '\'']);
            cur = cur.as_array()?.iter().find(|item| {
                json_path(item, field).is_some_and(|v| match v {
                    Value::String(s) => s == want,
                    Value::Number(n) => want.parse::<f64>().ok() == n.as_f64(),
                    Value::Bool(b) => want.parse::<bool>().ok() == Some(*b),
                    _ => false,
                })
            })?;
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix("[*]") {
            // Every element: the first with a result, as upstream's table convertor prints
            // the first of a JSONPath's results.
            return cur.as_array()?.iter().find_map(|item| json_path(item, r));
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            cur = cur.get(r[..end].trim().parse::<usize>().ok()?)?;
            rest = &r[end + 1..];
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            cur = cur.get(&rest[..end])?;
            rest = &rest[end..];
        }
    }
    Some(cur)
}

/// Renders objects of one resource as a Table; `include_object` is `None`, `Metadata`
/// (the default) or `Object`.
pub fn table(
    res: &ResourceInfo,
    objects: &[Value],
    include_object: Option<&str>,
    list_meta: Option<Value>,
    with_columns: bool,
) -> Value {
    let defs = if with_columns {
        let mut header = Row::header();
        res.strategy.table(res, &Value::Null, &mut header);
        header.finish()
    } else {
        vec![]
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = Row::cells();
            res.strategy.table(res, o, &mut cells);
            let mut row = json!({"cells": cells.finish()});
            if let Some(obj) = partial_object(o, include_object) {
                row["object"] = obj;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.unwrap_or_else(|| json!({})),
        "columnDefinitions": defs,
        "rows": rows,
    })
}

fn partial_object(o: &Value, include_object: Option<&str>) -> Option<Value> {
    match include_object.unwrap_or("Metadata") {
        "None" => None,
        "Object" => Some(o.clone()),
        _ => Some(crate::object::partial_metadata(o)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_paths_index_and_filter() {
        let obj = json!({"status": {"replicas": 2, "conditions": [
            {"type": "SourceReady", "status": "True"}, {"type": "Ready", "status": "False"}]}});
        assert_eq!(json_path(&obj, ".status.replicas"), Some(&json!(2)));
        assert_eq!(
            json_path(&obj, ".status.conditions[0].type"),
            Some(&json!("SourceReady"))
        );
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(&json!("False"))
        );
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Gone")].status"#),
            None
        );
        assert_eq!(json_path(&obj, ".spec.x"), None);
        let dns = json!({"spec": {"subpaths": [{"path": "/a"}, {"path": "/b"}]}});
        assert_eq!(
            json_path(&dns, ".spec.subpaths[*].path"),
            Some(&json!("/a"))
        );
        assert_eq!(
            json_path(&json!({"spec": {"subpaths": []}}), ".spec.subpaths[*].path"),
            None
        );
    }

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(30 * 86400), "30d");
    }
}

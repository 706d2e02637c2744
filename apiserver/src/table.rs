//! Server-side printing: `meta.k8s.io/v1` Table output. Each kind's strategy (`kinds/`)
//! gives its columns with their cells (what `kubectl get` shows), with the formatting they
//! share (`kinds::age`, `kinds::json_path`); this file renders them.

use crate::kinds::Row;
use crate::registry::ResourceInfo;
use serde_json::{Value, json};

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

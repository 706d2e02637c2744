//! CustomResourceDefinitions and the custom resources they serve (upstream's
//! `apiextensions-apiserver/pkg/registry/customresourcedefinition` and
//! `…/customresource`).

use super::{CreatedAt, Row, Strategy};
use super::{age, json_path};
use crate::auth::User;
use crate::error::Cause;
use crate::registry::{PrinterColumn, ResourceInfo};
use serde_json::{Value, json};

/// `apiextensions.k8s.io/v1` CustomResourceDefinition.
pub struct CustomResourceDefinition;

impl Strategy for CustomResourceDefinition {
    /// Its names are accepted and it is Established at once (upstream's naming and
    /// establishing controllers).
    fn prepare_for_create(&self, obj: &mut Value, _user: &User) {
        set_status(obj);
    }

    fn prepare_for_update(&self, new: &mut Value, _old: &Value, _subresource: Option<&str>) {
        set_status(new);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        causes.extend(validate(obj));
    }

    fn table(&self, res: &ResourceInfo, o: &Value, row: &mut Row) {
        CreatedAt.table(res, o, row);
    }
}

/// Every custom resource: a status update changes neither labels nor annotations, and the
/// table has the CRD's `additionalPrinterColumns` (AGE when it has none).
pub struct CustomResource;

impl Strategy for CustomResource {
    fn status_keeps_metadata(&self) -> (bool, bool) {
        (false, false)
    }

    fn table(&self, res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.column(
            "Name",
            "string",
            "name",
            "Name must be unique within a namespace.",
            0,
            || crate::object::meta_str(o, "name").unwrap_or("").to_owned(),
        );
        for c in &res.printer_columns {
            row.column(&c.name, &c.type_, "", &c.description, c.priority, || {
                cell(c, o)
            });
        }
    }
}

/// A printer column's cell: its JSONPath's value, an age for dates, `<none>` when absent.
fn cell(col: &PrinterColumn, obj: &Value) -> Value {
    let v = json_path(obj, &col.json_path)
        .cloned()
        .unwrap_or(Value::Null);
    match (col.type_.as_str(), &v) {
        ("date", Value::String(ts)) => json!(age(ts)),
        (_, Value::Null) => json!("<none>"),
        (_, Value::String(_) | Value::Number(_) | Value::Bool(_)) => v,
        _ => json!(v.to_string()),
    }
}

/// A string field, "" when absent.
fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// Upstream's checks of a CRD that users meet: names, versions, and structural schemas.
fn validate(crd: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let group = s(crd, "/spec/group");
    let plural = s(crd, "/spec/names/plural");
    if group.is_empty() {
        causes.push(Cause::required("spec.group", ""));
    } else if !group.contains('.') {
        causes.push(Cause::invalid(
            "spec.group",
            group,
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural", ""));
    }
    if s(crd, "/spec/names/kind").is_empty() {
        causes.push(Cause::required("spec.names.kind", ""));
    }
    let name = s(crd, "/metadata/name");
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if !matches!(s(crd, "/spec/scope"), "Namespaced" | "Cluster") {
        causes.push(Cause::not_supported(
            "spec.scope",
            s(crd, "/spec/scope"),
            &["Cluster", "Namespaced"],
        ));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::required(
            "spec.versions",
            "must have at least one version",
        ));
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage") == Some(&json!(true)))
        .count();
    if !versions.is_empty() && storage != 1 {
        causes.push(Cause::invalid(
            "spec.versions",
            &storage.to_string(),
            "must have exactly one version marked as storage version",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        match v.pointer("/schema/openAPIV3Schema") {
            Some(schema) => causes.extend(crate::registry::structural::structural_errors(
                schema,
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
            )),
            None => causes.push(Cause::required(
                &format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "schemas are required",
            )),
        }
    }
    causes
}

/// Sets the status a CRD has once accepted: names, `NamesAccepted` and `Established`.
fn set_status(crd: &mut Value) {
    let now = crate::object::now();
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage") == Some(&json!(true)))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let mut stored = crd
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in storage {
        if !stored.contains(&v) {
            stored.push(v);
        }
    }
    crd["status"] = json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": stored,
    });
}

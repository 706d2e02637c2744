//! CustomResourceDefinitions and the custom resources they serve (upstream's
//! `apiextensions-apiserver/pkg/registry/customresourcedefinition` and
//! `…/customresource`).

use super::{CreatedAt, Row, Strategy};
use crate::auth::User;
use crate::error::Cause;
use crate::registry::{PrinterColumn, ResourceInfo};
use crate::table::{age, json_path};
use serde_json::{Value, json};

/// `apiextensions.k8s.io/v1` CustomResourceDefinition.
pub struct CustomResourceDefinition;

impl Strategy for CustomResourceDefinition {
    /// Its names are accepted and it is Established at once (upstream's naming and
    /// establishing controllers).
    fn prepare_for_create(&self, obj: &mut Value, _user: &User) {
        crate::crd::set_status(obj);
    }

    fn prepare_for_update(&self, new: &mut Value, _old: &Value, _subresource: Option<&str>) {
        crate::crd::set_status(new);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        causes.extend(crate::crd::validate(obj));
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

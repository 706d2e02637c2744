//! PriorityClasses and RuntimeClasses (upstream's `pkg/registry/scheduling/priorityclass`
//! and `pkg/registry/node/runtimeclass`).

use super::{Admit, Row, Strategy, i, or, s};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::defaults::set_default;
use crate::registry::validation::{LABEL_MSG, is_label, specs};
use serde_json::{Value, json};

/// `scheduling.k8s.io/v1` PriorityClass.
pub struct PriorityClass;

impl Strategy for PriorityClass {
    fn admission(&self) -> &'static [Admit] {
        &[Admit::PriorityClass]
    }

    fn default(&self, obj: &mut Value) {
        set_default(obj, "preemptionPolicy", json!("PreemptLowerPriority"));
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::priority_class(obj, causes);
    }

    /// The value and the preemption policy are fixed.
    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        if new.get("value") != old.get("value") {
            causes.push(Cause::forbidden(
                "value",
                "may not be changed in an update.",
            ));
        }
        if new.get("preemptionPolicy") != old.get("preemptionPolicy") {
            causes.push(Cause::immutable("preemptionPolicy"));
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Value", "integer", 0, || i(o, "/value"));
        row.col("Global-Default", "boolean", 0, || {
            o.pointer("/globalDefault") == Some(&json!(true))
        });
        row.age(o);
        row.col("PreemptionPolicy", "string", 0, || {
            or(s(o, "/preemptionPolicy"), "PreemptLowerPriority")
        });
    }
}

/// `node.k8s.io/v1` RuntimeClass: names the node's runtime handler (runc only here).
pub struct RuntimeClass;

impl Strategy for RuntimeClass {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        match obj.get("handler").and_then(Value::as_str) {
            None | Some("") => causes.push(Cause::required("handler", "")),
            Some(h) if !is_label(h) => causes.push(Cause::invalid("handler", h, LABEL_MSG)),
            Some(_) => {}
        }
    }
}

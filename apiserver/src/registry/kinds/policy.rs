//! PodDisruptionBudgets (upstream's `pkg/registry/policy/poddisruptionbudget`).

use super::{Row, Strategy, i, or, s};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::validation::specs;
use serde_json::Value;

/// `policy/v1` PodDisruptionBudget.
pub struct PodDisruptionBudget;

impl Strategy for PodDisruptionBudget {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::pdb(obj.get("spec"), causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Min Available", "string", 0, || {
            or(s(o, "/spec/minAvailable"), "N/A")
        });
        row.col("Max Unavailable", "string", 0, || {
            or(s(o, "/spec/maxUnavailable"), "N/A")
        });
        row.col("Allowed Disruptions", "integer", 0, || {
            i(o, "/status/disruptionsAllowed")
        });
        row.age(o);
    }
}

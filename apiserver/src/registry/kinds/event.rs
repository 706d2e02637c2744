//! Events (`core/v1`; upstream's `pkg/registry/core/event` and its printer): the table
//! upstream prints, with the name last and only with `-o wide`.

use super::{Row, Strategy, age_of, i, s};
use crate::registry::ResourceInfo;
use serde_json::Value;

/// `core/v1` Event.
pub struct Event;

impl Strategy for Event {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.col("Last Seen", "string", 0, || {
            let last = [
                s(o, "/lastTimestamp"),
                s(o, "/eventTime"),
                s(o, "/metadata/creationTimestamp"),
            ]
            .into_iter()
            .find(|t| !t.is_empty())
            .unwrap_or_default();
            age_of(&last)
        });
        row.col("Type", "string", 0, || s(o, "/type"));
        row.col("Reason", "string", 0, || s(o, "/reason"));
        row.col("Object", "string", 0, || {
            format!(
                "{}/{}",
                s(o, "/involvedObject/kind").to_lowercase(),
                s(o, "/involvedObject/name")
            )
        });
        row.col("Subobject", "string", 1, || {
            s(o, "/involvedObject/fieldPath")
        });
        row.col("Source", "string", 1, || {
            [s(o, "/source/component"), s(o, "/reportingComponent")]
                .into_iter()
                .find(|t| !t.is_empty())
                .unwrap_or_default()
        });
        row.col("Message", "string", 0, || s(o, "/message"));
        row.col("First Seen", "string", 1, || {
            age_of(&s(o, "/firstTimestamp"))
        });
        row.col("Count", "string", 1, || i(o, "/count").max(1).to_string());
        row.name_with(1, || s(o, "/metadata/name"));
    }
}

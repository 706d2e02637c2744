//! HorizontalPodAutoscalers (`autoscaling/v1` and `v2`; upstream's
//! `pkg/registry/autoscaling/horizontalpodautoscaler` and its printer).

use super::{Row, Strategy, i, list, s};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::validation::specs;
use serde_json::Value;

/// `autoscaling/v1` and `autoscaling/v2` HorizontalPodAutoscaler.
pub struct HorizontalPodAutoscaler;

impl Strategy for HorizontalPodAutoscaler {
    fn default(&self, obj: &mut Value) {
        crate::registry::defaults::hpa(obj);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::hpa(obj.get("spec"), causes);
    }

    fn table(&self, res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Reference", "string", 0, || {
            format!(
                "{}/{}",
                s(o, "/spec/scaleTargetRef/kind"),
                s(o, "/spec/scaleTargetRef/name")
            )
        });
        row.col("Targets", "string", 0, || {
            if res.version == "v1" {
                hpa_targets(&crate::registry::versions::convert(
                    o.clone(),
                    "autoscaling/v2",
                ))
            } else {
                hpa_targets(o)
            }
        });
        row.col("MinPods", "string", 0, || {
            o.pointer("/spec/minReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
                .to_string()
        });
        row.col("MaxPods", "integer", 0, || i(o, "/spec/maxReplicas"));
        row.col("Replicas", "integer", 0, || i(o, "/status/currentReplicas"));
        row.age(o);
    }
}

/// An HPA's TARGETS cell, as upstream's `formatHPAMetrics`: each metric's current value and
/// target (`cpu: 37%/50%`, `memory: 12Mi/100Mi`, `<unknown>` before the first reading), at
/// most two, then `+ N more...`.
fn hpa_targets(o: &Value) -> String {
    let specs = list(o, "/spec/metrics");
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses = list(o, "/status/currentMetrics");
    let text = |v: Option<&Value>| -> Option<String> {
        match v? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    };
    let mut list = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let status = statuses.get(i);
        let current = |source: &str, field: &str| {
            text(status.and_then(|st| st.pointer(&format!("/{source}/current/{field}"))))
                .unwrap_or_else(|| "<unknown>".into())
        };
        let target =
            |source: &str, field: &str| text(spec.pointer(&format!("/{source}/target/{field}")));
        let kind = spec.get("type").and_then(Value::as_str).unwrap_or_default();
        let entry = match kind {
            "External" | "Object" => {
                let source = if kind == "External" {
                    "external"
                } else {
                    "object"
                };
                match target(source, "averageValue") {
                    Some(t) => format!("{}/{t} (avg)", current(source, "averageValue")),
                    None => format!(
                        "{}/{}",
                        current(source, "value"),
                        target(source, "value").unwrap_or_default()
                    ),
                }
            }
            "Pods" => format!(
                "{}/{}",
                current("pods", "averageValue"),
                target("pods", "averageValue").unwrap_or_default()
            ),
            "Resource" | "ContainerResource" => {
                let source = if kind == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let name = s(spec, &format!("/{source}/name"));
                match target(source, "averageValue") {
                    Some(t) => format!("{name}: {}/{t}", current(source, "averageValue")),
                    None => {
                        let cur = text(status.and_then(|st| {
                            st.pointer(&format!("/{source}/current/averageUtilization"))
                        }))
                        .map_or_else(|| "<unknown>".into(), |v| format!("{v}%"));
                        let t = target(source, "averageUtilization")
                            .map_or_else(|| "<auto>".into(), |v| format!("{v}%"));
                        format!("{name}: {cur}/{t}")
                    }
                }
            }
            _ => "<unknown type>".into(),
        };
        list.push(entry);
    }
    let count = list.len();
    if count > 2 {
        list.truncate(2);
        return format!("{} + {} more...", list.join(", "), count - 2);
    }
    list.join(", ")
}

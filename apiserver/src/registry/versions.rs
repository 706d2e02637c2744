//! Conversion between the versions of a resource that upstream stores as one: HPA
//! `autoscaling/v1` ↔ `autoscaling/v2` (stored as v2) and `events.k8s.io/v1` ↔ core `v1`
//! Events (stored as core v1).

use serde_json::{Map, Value, json};

fn rename(obj: &mut Value, pairs: &[(&str, &str)]) {
    if let Some(m) = obj.as_object_mut() {
        for (from, to) in pairs {
            if let Some(v) = m.remove(*from) {
                m.insert((*to).to_owned(), v);
            }
        }
    }
}

const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn cpu_utilization(metrics: Option<&Value>, field: &str) -> Option<Value> {
    metrics?.as_array()?.iter().find_map(|m| {
        (m.get("type") == Some(&json!("Resource"))
            && m.pointer("/resource/name") == Some(&json!("cpu")))
        .then(|| {
            m.pointer(&format!("/resource/{field}/averageUtilization"))
                .cloned()
        })
        .flatten()
    })
}

/// Converts an object to `to` (an apiVersion) if it is one of the known pairs; otherwise only
/// its `apiVersion` changes.
pub fn convert(mut obj: Value, to: &str) -> Value {
    let from = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if from == to {
        return obj;
    }
    match (kind.as_str(), from.as_str(), to) {
        ("HorizontalPodAutoscaler", "autoscaling/v1", "autoscaling/v2") => {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut)
                && let Some(t) = spec.remove("targetCPUUtilizationPercentage")
            {
                spec.insert("metrics".into(), json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": t}}}]));
            }
            if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut)
                && let Some(c) = status.remove("currentCPUUtilizationPercentage")
            {
                status.insert("currentMetrics".into(), json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": c}}}]));
            }
        }
        ("HorizontalPodAutoscaler", "autoscaling/v2", "autoscaling/v1") => {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                let t = cpu_utilization(spec.get("metrics"), "target");
                spec.remove("metrics");
                spec.remove("behavior");
                if let Some(t) = t {
                    spec.insert("targetCPUUtilizationPercentage".into(), t);
                }
            }
            if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
                let c = cpu_utilization(status.get("currentMetrics"), "current");
                status.remove("currentMetrics");
                status.remove("conditions");
                if let Some(c) = c {
                    status.insert("currentCPUUtilizationPercentage".into(), c);
                }
            }
        }
        ("Event", "events.k8s.io/v1", "v1") => rename(&mut obj, EVENT_FIELDS),
        ("Event", "v1", "events.k8s.io/v1") => {
            let reversed: Vec<(&str, &str)> = EVENT_FIELDS.iter().map(|(a, b)| (*b, *a)).collect();
            rename(&mut obj, &reversed);
        }
        _ => {}
    }
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(to.to_owned()));
    } else {
        obj = Value::Object(Map::new());
    }
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpa_versions_round_trip_the_cpu_target() {
        let v1 = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "spec": {"maxReplicas": 5, "targetCPUUtilizationPercentage": 60, "scaleTargetRef": {"kind": "Deployment", "name": "web"}},
            "status": {"currentReplicas": 2, "currentCPUUtilizationPercentage": 40}});
        let v2 = convert(v1.clone(), "autoscaling/v2");
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            60
        );
        assert_eq!(
            v2["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"],
            40
        );
        assert_eq!(convert(v2, "autoscaling/v1"), v1);
    }

    #[test]
    fn event_versions_rename_their_fields() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "involvedObject": {"name": "p"}, "message": "hi", "count": 2});
        let ev = convert(core.clone(), "events.k8s.io/v1");
        assert_eq!(ev["regarding"]["name"], "p");
        assert_eq!(ev["note"], "hi");
        assert_eq!(ev["deprecatedCount"], 2);
        assert_eq!(convert(ev, "v1"), core);
    }
}

//! API priority and fairness (flowcontrol.apiserver.k8s.io/v1): FlowSchemas and
//! PriorityLevelConfigurations with upstream's defaults, and the mandatory objects its
//! apiserver keeps (`exempt` and `catch-all`). They are served as upstream's API; this
//! server limits requests by its in-flight cap, not by them.

use super::Strategy;
use crate::registry::defaults::{child, set_default};
use serde_json::{Value, json};

/// `FlowSchema` (`SetDefaults_FlowSchemaSpec`).
pub struct FlowSchema;

impl Strategy for FlowSchema {
    fn default(&self, obj: &mut Value) {
        set_default(child(obj, "spec"), "matchingPrecedence", json!(1000));
    }
}

/// `PriorityLevelConfiguration` (`SetDefaults_PriorityLevelConfiguration`).
pub struct PriorityLevelConfiguration;

impl Strategy for PriorityLevelConfiguration {
    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        if let Some(limited) = spec.get_mut("limited").filter(|l| l.is_object()) {
            set_default(limited, "nominalConcurrencyShares", json!(30));
            set_default(limited, "lendablePercent", json!(0));
            let response = child(limited, "limitResponse");
            if response.get("type").and_then(Value::as_str) == Some("Queue") {
                let q = child(response, "queuing");
                set_default(q, "queues", json!(64));
                set_default(q, "handSize", json!(8));
                set_default(q, "queueLengthLimit", json!(50));
            }
        }
        if let Some(exempt) = spec.get_mut("exempt").filter(|e| e.is_object()) {
            set_default(exempt, "nominalConcurrencyShares", json!(0));
            set_default(exempt, "lendablePercent", json!(0));
        }
    }
}

/// Upstream's mandatory configuration (`apis/flowcontrol/bootstrap`), as (plural, object).
pub fn mandatory() -> Vec<(&'static str, Value)> {
    let meta = |name: &str| {
        json!({"name": name, "generation": 1,
            "annotations": {"apf.kubernetes.io/autoupdate-spec": "true"}})
    };
    let everything = |subjects: Value| {
        json!([{"subjects": subjects,
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                "clusterScope": true, "namespaces": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}])
    };
    let group = |name: &str| json!({"kind": "Group", "group": {"name": name}});
    let object = |kind: &str, name: &str, spec: Value| {
        json!({"kind": kind, "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "metadata": meta(name), "spec": spec, "status": {}})
    };
    vec![
        (
            "prioritylevelconfigurations",
            object(
                "PriorityLevelConfiguration",
                "exempt",
                json!({"type": "Exempt", "exempt": {"nominalConcurrencyShares": 0, "lendablePercent": 0}}),
            ),
        ),
        (
            "prioritylevelconfigurations",
            object(
                "PriorityLevelConfiguration",
                "catch-all",
                json!({"type": "Limited", "limited": {"nominalConcurrencyShares": 5,
                    "lendablePercent": 0, "limitResponse": {"type": "Reject"}}}),
            ),
        ),
        (
            "flowschemas",
            object(
                "FlowSchema",
                "exempt",
                json!({"matchingPrecedence": 1,
                    "priorityLevelConfiguration": {"name": "exempt"},
                    "rules": everything(json!([group("system:masters")]))}),
            ),
        ),
        (
            "flowschemas",
            object(
                "FlowSchema",
                "catch-all",
                json!({"matchingPrecedence": 10000,
                    "priorityLevelConfiguration": {"name": "catch-all"},
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": everything(json!([group("system:unauthenticated"), group("system:authenticated")]))}),
            ),
        ),
    ]
}

//! The workloads (upstream's `pkg/registry/apps/*` and `core/replicationcontroller`):
//! Deployments, ReplicaSets, ReplicationControllers, StatefulSets, DaemonSets and
//! ControllerRevisions. Their selectors are fixed once created.

use super::{Row, Strategy, i, immutable, map_text, or_none, s, selector_text, template_columns};
use crate::error::Cause;
use crate::object::meta;
use crate::registry::ResourceInfo;
use crate::registry::defaults::{child, set_default, template};
use crate::registry::validation::specs;
use serde_json::{Value, json};

const SELECTOR: &[(&str, &str)] = &[("/spec/selector", "spec.selector")];

/// The SELECTOR wide column.
fn selector_column(o: &Value, row: &mut Row) {
    row.col("Selector", "string", 1, || {
        selector_text(o.pointer("/spec/selector").unwrap_or(&Value::Null))
    });
}

/// `apps/v1` Deployment.
pub struct Deployment;

impl Strategy for Deployment {
    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "replicas", json!(1));
        set_default(spec, "revisionHistoryLimit", json!(10));
        set_default(spec, "progressDeadlineSeconds", json!(600));
        let strategy = child(spec, "strategy");
        set_default(strategy, "type", json!("RollingUpdate"));
        if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            let ru = child(strategy, "rollingUpdate");
            set_default(ru, "maxSurge", json!("25%"));
            set_default(ru, "maxUnavailable", json!("25%"));
        }
        template(obj);
    }

    /// A status update keeps the request's annotations, not its labels (upstream's
    /// deploymentStatusStrategy).
    fn status_keeps_metadata(&self) -> (bool, bool) {
        (false, true)
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::workload("Deployment", obj.get("spec"), causes);
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, SELECTOR, causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Ready", "string", 0, || {
            format!(
                "{}/{}",
                i(o, "/status/readyReplicas"),
                i(o, "/spec/replicas")
            )
        });
        row.col("Up-to-date", "integer", 0, || {
            i(o, "/status/updatedReplicas")
        });
        row.col("Available", "integer", 0, || {
            i(o, "/status/availableReplicas")
        });
        row.age(o);
        template_columns(o, row);
        selector_column(o, row);
    }
}

/// `apps/v1` ReplicaSet.
pub struct ReplicaSet;

impl Strategy for ReplicaSet {
    fn default(&self, obj: &mut Value) {
        set_default(child(obj, "spec"), "replicas", json!(1));
        template(obj);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::workload("ReplicaSet", obj.get("spec"), causes);
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, SELECTOR, causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        replicas_table(o, row);
    }
}

/// `core/v1` ReplicationController: a ReplicaSet with a plain map selector.
pub struct ReplicationController;

impl Strategy for ReplicationController {
    /// Upstream: an empty selector and the RC's labels default to the template's.
    fn default(&self, obj: &mut Value) {
        let labels = obj.pointer("/spec/template/metadata/labels").cloned();
        let spec = child(obj, "spec");
        set_default(spec, "replicas", json!(1));
        if let Some(l) = &labels
            && spec
                .get("selector")
                .is_none_or(|s| s.as_object().is_none_or(|m| m.is_empty()))
        {
            spec["selector"] = l.clone();
        }
        if let Some(l) = labels {
            let meta = child(obj, "metadata");
            if meta
                .get("labels")
                .is_none_or(|m| m.as_object().is_none_or(|m| m.is_empty()))
            {
                meta["labels"] = l;
            }
        }
        template(obj);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        let spec = obj.get("spec");
        specs::replicas(spec, causes);
        specs::pod_spec(
            spec.and_then(|s| s.pointer("/template/spec")),
            "spec.template.spec",
            causes,
        );
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        replicas_table(o, row);
    }
}

/// The table of ReplicaSets and ReplicationControllers.
fn replicas_table(o: &Value, row: &mut Row) {
    row.name(o);
    row.col("Desired", "integer", 0, || i(o, "/spec/replicas"));
    row.col("Current", "integer", 0, || i(o, "/status/replicas"));
    row.col("Ready", "integer", 0, || i(o, "/status/readyReplicas"));
    row.age(o);
    template_columns(o, row);
    row.col("Selector", "string", 1, || {
        match o.pointer("/spec/selector") {
            Some(sel)
                if sel.get("matchLabels").is_some() || sel.get("matchExpressions").is_some() =>
            {
                selector_text(sel)
            }
            Some(m @ Value::Object(_)) => map_text(Some(m)),
            _ => "<none>".into(),
        }
    });
}

/// `apps/v1` StatefulSet.
pub struct StatefulSet;

impl Strategy for StatefulSet {
    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "replicas", json!(1));
        set_default(spec, "podManagementPolicy", json!("OrderedReady"));
        set_default(spec, "revisionHistoryLimit", json!(10));
        set_default(
            spec,
            "updateStrategy",
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
        );
        template(obj);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::workload("StatefulSet", obj.get("spec"), causes);
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, SELECTOR, causes);
        const MUTABLE: [&str; 7] = [
            "replicas",
            "ordinals",
            "template",
            "updateStrategy",
            "revisionHistoryLimit",
            "persistentVolumeClaimRetentionPolicy",
            "minReadySeconds",
        ];
        let rest = |v: &Value| -> Vec<(String, Value)> {
            v.get("spec")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| !MUTABLE.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        if rest(new) != rest(old) {
            causes.push(Cause::forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
            ));
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Ready", "string", 0, || {
            format!(
                "{}/{}",
                i(o, "/status/readyReplicas"),
                i(o, "/spec/replicas")
            )
        });
        row.age(o);
        template_columns(o, row);
    }
}

/// `apps/v1` DaemonSet.
pub struct DaemonSet;

impl Strategy for DaemonSet {
    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "revisionHistoryLimit", json!(10));
        set_default(
            spec,
            "updateStrategy",
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}),
        );
        template(obj);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::workload("DaemonSet", obj.get("spec"), causes);
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, SELECTOR, causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Desired", "integer", 0, || {
            i(o, "/status/desiredNumberScheduled")
        });
        row.col("Current", "integer", 0, || {
            i(o, "/status/currentNumberScheduled")
        });
        row.col("Ready", "integer", 0, || i(o, "/status/numberReady"));
        row.col("Up-to-date", "integer", 0, || {
            i(o, "/status/updatedNumberScheduled")
        });
        row.col("Available", "integer", 0, || {
            i(o, "/status/numberAvailable")
        });
        row.col("Node Selector", "string", 0, || {
            or_none(map_text(o.pointer("/spec/template/spec/nodeSelector")))
        });
        row.age(o);
        template_columns(o, row);
        selector_column(o, row);
    }
}

/// `apps/v1` ControllerRevision.
pub struct ControllerRevision;

impl Strategy for ControllerRevision {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Controller", "string", 0, || {
            meta(o)
                .get("ownerReferences")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .map(|r| format!("{}/{}", s(r, "/kind").to_lowercase(), s(r, "/name")))
                .unwrap_or_else(|| "<none>".into())
        });
        row.col("Revision", "integer", 0, || i(o, "/revision"));
        row.age(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployments_get_upstream_defaults() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 80}]}]}}}});
        Deployment.default(&mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["imagePullPolicy"], "Always");
        assert_eq!(c["ports"][0]["protocol"], "TCP");
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
    }
}

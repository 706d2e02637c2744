//! The validators of built-in kinds' specs, following upstream's `pkg/apis/*/validation`:
//! the rules users meet (ranges, enums, required references, cross-field constraints), each
//! reported with upstream's field path and message.

mod apps;
mod autoscaling;
mod batch;
mod certificates;
mod core;
mod networking;
mod policy;

use super::{LABEL_MSG, is_label, is_subdomain, label_selector, labels};
use crate::error::Cause;
use minik8s_types::{LabelSelector, Quantity};
use serde_json::Value;
use std::collections::HashSet;

pub(crate) use self::{
    apps::*, autoscaling::*, batch::*, certificates::*, core::*, networking::*, policy::*,
};

pub(crate) fn int(v: Option<&Value>, key: &str) -> Option<i64> {
    v.and_then(|v| v.get(key)).and_then(Value::as_i64)
}

/// The elements of the array at `key` of `v`, numbered (none if absent or not an array).
pub(crate) fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = (usize, &'a Value)> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
}

pub(crate) fn str_at<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a str> {
    v.and_then(|v| v.get(key)).and_then(Value::as_str)
}

/// `key` of `v` is a non-empty string, else a Required cause at `path.key`.
pub(crate) fn require(
    v: Option<&Value>,
    key: &str,
    path: &str,
    detail: &str,
    causes: &mut Vec<Cause>,
) {
    if str_at(v, key).is_none_or(str::is_empty) {
        causes.push(Cause::required(&format!("{path}.{key}"), detail));
    }
}

/// `key` of `v`, when set, is at least `min`.
pub(crate) fn at_least(
    v: Option<&Value>,
    key: &str,
    path: &str,
    min: i64,
    causes: &mut Vec<Cause>,
) {
    if let Some(n) = int(v, key)
        && n < min
    {
        let msg = match min {
            0 => "must be greater than or equal to 0".to_owned(),
            1 => "must be greater than or equal to 1".to_owned(),
            m => format!("must be greater than or equal to {m}"),
        };
        causes.push(Cause::invalid(
            &format!("{path}.{key}"),
            &n.to_string(),
            &msg,
        ));
    }
}

/// Upstream's `ValidatePriorityClass`: `system-` names are the built-in classes only, and
/// a user's class is at most 1000000000.
pub(crate) fn priority_class(obj: &Value, causes: &mut Vec<Cause>) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let value = obj.get("value").and_then(Value::as_i64).unwrap_or(0);
    if name.starts_with("system-") {
        let known = crate::admission::priority::system_classes()
            .iter()
            .find(|c| c["metadata"]["name"] == name)
            .map(|c| c["value"].as_i64().unwrap_or(0));
        let why = match known {
            None => Some(format!("{name:?} is not a known system priority class")),
            Some(v) if v != value => Some(format!("value of {name:?} PriorityClass must be {v}")),
            Some(_) if obj.get("globalDefault") == Some(&Value::Bool(true)) => Some(format!(
                "globalDefault of {name:?} PriorityClass must be false"
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            causes.push(Cause::forbidden(
                "metadata.name",
                &format!("priority class names with 'system-' prefix are reserved for system use only. error: {why}"),
            ));
        }
    } else if value > 1_000_000_000 {
        causes.push(Cause::forbidden(
            "value",
            "maximum allowed value of a user defined priority is 1000000000",
        ));
    }
    one_of(
        Some(obj),
        "preemptionPolicy",
        "",
        &["PreemptLowerPriority", "Never"],
        causes,
    );
}

pub(crate) fn one_of(
    v: Option<&Value>,
    key: &str,
    path: &str,
    allowed: &[&str],
    causes: &mut Vec<Cause>,
) {
    if let Some(s) = str_at(v, key)
        && !allowed.contains(&s)
    {
        let field = if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        };
        causes.push(Cause::not_supported(&field, s, allowed));
    }
}

pub(crate) fn replicas(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    at_least(spec, "replicas", "spec", 0, causes);
}

pub(crate) fn data_keys(map: Option<&Value>, field: &str, causes: &mut Vec<Cause>) {
    let Some(m) = map.and_then(Value::as_object) else {
        return;
    };
    for k in m.keys() {
        let ok = !k.is_empty()
            && k.len() <= 253
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            causes.push(Cause::invalid(field, k, "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
        }
    }
}

/// Every value of a resource list is a non-negative quantity.
pub(crate) fn quantities(
    list: Option<&Value>,
    path: &str,
    causes: &mut Vec<Cause>,
) -> Vec<(String, Quantity)> {
    let mut out = Vec::new();
    let Some(m) = list.and_then(Value::as_object) else {
        return out;
    };
    for (name, v) in m {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => other.to_string(),
        };
        let field = format!("{path}.{name}");
        match Quantity::parse(&text) {
            Ok(q) if q.0 < 0 => causes.push(Cause::invalid(
                &field,
                &text,
                "must be greater than or equal to 0",
            )),
            Ok(q) => out.push((name.clone(), q)),
            Err(e) => causes.push(Cause::invalid(&field, &text, &e.to_string())),
        }
    }
    out
}

/// An int-or-percent value: its number, or its percentage (`Err` when malformed).
pub(crate) fn int_or_percent(v: &Value) -> Result<(i64, bool), String> {
    match v {
        Value::Number(n) => n.as_i64().map(|n| (n, false)).ok_or_else(|| n.to_string()),
        Value::String(s) => match s.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) => Ok((p, true)),
            _ => Err(s.clone()),
        },
        other => Err(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn causes(group: &str, kind: &str, obj: Value) -> Vec<String> {
        let mut out = Vec::new();
        crate::registry::kinds::builtin(group, kind).validate(&obj, &mut out);
        out.iter().map(Cause::line).collect()
    }

    #[test]
    fn claims_and_volumes_need_modes_sizes_and_one_source() {
        assert_eq!(
            causes("", "PersistentVolumeClaim", json!({"spec": {}})),
            [
                "spec.accessModes: Required value",
                "spec.resources[storage]: Required value"
            ]
        );
        assert_eq!(
            causes(
                "",
                "PersistentVolumeClaim",
                json!({"spec": {"accessModes": ["ReadWriteSometimes"],
                    "resources": {"requests": {"storage": "0"}}}})
            ),
            [
                "spec.accessModes[0]: Unsupported value: \"ReadWriteSometimes\": supported values: \"ReadWriteOnce\", \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOncePod\"",
                "spec.resources[storage]: Invalid value: \"0\": must be greater than zero"
            ]
        );
        assert_eq!(
            causes(
                "",
                "PersistentVolume",
                json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                    "local": {"path": "/x"}}})
            ),
            ["spec.nodeAffinity: Required value: Local volume requires node affinity"]
        );
        assert_eq!(
            causes(
                "",
                "PersistentVolume",
                json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}})
            ),
            ["spec: Required value: must specify a volume type"]
        );
    }

    #[test]
    fn ingress_hosts_paths_and_path_types_follow_upstream() {
        let bad = json!({"spec": {"rules": [
            {"host": "Bad_Host", "http": {"paths": [{"path": "api", "pathType": "Prefix"}, {"path": "/x"}]}},
            {"host": "10.0.0.1"},
            {"host": "*.example.com", "http": {"paths": [{"path": "/", "pathType": "Whatever"}]}}]}});
        let got = causes("networking.k8s.io", "Ingress", bad);
        assert_eq!(got.len(), 5, "{got:#?}");
        assert!(got[0].starts_with(
            "spec.rules[0].host: Invalid value: \"Bad_Host\": a lowercase RFC 1123 subdomain"
        ));
        assert_eq!(
            got[1],
            "spec.rules[0].http.paths[0].path: Invalid value: \"api\": must be an absolute path"
        );
        assert_eq!(
            got[2],
            "spec.rules[0].http.paths[1].pathType: Required value: pathType must be specified"
        );
        assert_eq!(
            got[3],
            "spec.rules[1].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address"
        );
        assert!(
            got[4].starts_with(
                "spec.rules[2].http.paths[0].pathType: Unsupported value: \"Whatever\""
            ),
            "{}",
            got[4]
        );
        let good = json!({"spec": {"rules": [{"host": "*.a.example", "http": {"paths": [{"path": "/", "pathType": "Prefix"}]}}]}});
        assert!(causes("networking.k8s.io", "Ingress", good).is_empty());
    }

    #[test]
    fn hpa_replica_bounds_follow_upstream() {
        let bad = json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 5, "maxReplicas": 2}});
        assert_eq!(
            causes("autoscaling", "HorizontalPodAutoscaler", bad),
            [
                "spec.maxReplicas: Invalid value: \"2\": must be greater than or equal to `minReplicas`"
            ]
        );
        let zero = json!({"spec": {"scaleTargetRef": {"name": "web"}, "minReplicas": 0, "maxReplicas": 0}});
        let got = causes("autoscaling", "HorizontalPodAutoscaler", zero);
        assert!(
            got.iter()
                .any(|c| c.starts_with("spec.scaleTargetRef.kind: Required")),
            "{got:?}"
        );
        assert!(
            got.iter().any(|c| c.starts_with("spec.minReplicas")),
            "{got:?}"
        );
        assert!(
            got.iter().any(|c| c.contains("must be greater than 0")),
            "{got:?}"
        );
        let metric = json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}],
            "behavior": {"scaleDown": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 4000}]}}}});
        let got = causes("autoscaling", "HorizontalPodAutoscaler", metric);
        assert_eq!(got.len(), 3, "{got:?}");
    }

    #[test]
    fn pod_specs_check_enums_ports_mounts_and_requests_against_limits() {
        let pod = json!({"spec": {"restartPolicy": "Sometimes", "containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 70000}], "volumeMounts": [{"name": "nope", "mountPath": "/x"}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]}});
        let got = causes("", "Pod", pod);
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got[0].starts_with("spec.restartPolicy: Unsupported value: \"Sometimes\""));
        assert!(
            got.iter()
                .any(|c| c == "spec.containers[0].volumeMounts[0].name: Not found: \"nope\"")
        );
        assert!(
            got.iter()
                .any(|c| c.ends_with("must be less than or equal to cpu limit"))
        );
    }

    #[test]
    fn invalid_sysctl_names_are_refused_and_others_left_to_the_node() {
        let pod = json!({"spec": {"containers": [{"name": "c", "image": "i"}],
            "securityContext": {"sysctls": [{"name": "foo-", "value": "bar"},
                {"name": "kernel.shmmax", "value": "1"}, {"name": "safe-and-unsafe", "value": "1"},
                {"name": "bar..", "value": "42"}, {"name": "net/ipv4/ip_forward", "value": "1"}]}}});
        let got = causes("", "Pod", pod);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("spec.securityContext.sysctls[0].name: Invalid value: \"foo-\": must have at most 253 characters"));
        assert!(
            got[1].starts_with("spec.securityContext.sysctls[3].name: Invalid value: \"bar..\"")
        );
    }

    #[test]
    fn services_jobs_deployments_and_budgets_are_checked() {
        let svc =
            json!({"spec": {"type": "Weird", "ports": [{"port": 80}, {"port": 80, "name": "b"}]}});
        assert_eq!(causes("", "Service", svc).len(), 3);
        let job = json!({"spec": {"parallelism": -1, "template": {"spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "i"}]}}}});
        assert_eq!(causes("batch", "Job", job).len(), 2);
        let d = json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        assert_eq!(
            causes("apps", "Deployment", d),
            [
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: \"0\": may not be 0 when `maxSurge` is 0"
            ]
        );
        let pdb = json!({"spec": {"minAvailable": 1, "maxUnavailable": "10%"}});
        assert_eq!(causes("policy", "PodDisruptionBudget", pdb).len(), 1);
        let cj = json!({"spec": {"schedule": "every minute", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}}});
        assert_eq!(causes("batch", "CronJob", cj).len(), 1);
    }
}

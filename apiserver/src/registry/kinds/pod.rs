//! Pods and PodTemplates (upstream's `pkg/registry/core/pod/strategy.go` and its printers).

use super::{Admit, Row, Strategy, i, len, list, or_none, s, set_or_remove};
use crate::error::Cause;
use crate::object::meta;
use crate::registry::ResourceInfo;
use crate::registry::defaults::{child, pod_spec, requests_from_limits, set_default};
use crate::registry::validation::specs;
use serde_json::{Value, json};

/// `core/v1` Pod.
pub struct Pod;

impl Strategy for Pod {
    fn admission(&self) -> &'static [Admit] {
        &[Admit::NewPod]
    }

    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        pod_spec(spec);
        set_default(spec, "serviceAccountName", json!("default"));
        set_default(spec, "enableServiceLinks", json!(true));
        requests_from_limits(spec);
    }

    fn initial_status(&self, obj: &mut Value) {
        obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(obj)});
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::pod_spec(obj.get("spec"), "spec", causes);
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        pod_update(new, old, causes);
    }

    fn validate_subresource_update(
        &self,
        subresource: &str,
        new: &Value,
        old: &Value,
        causes: &mut Vec<Cause>,
    ) {
        match subresource {
            "ephemeralcontainers" => ephemeral_update(new, old, causes),
            _ => pod_update(new, old, causes),
        }
    }

    /// A pod on a node stops gracefully: the requested grace, else its
    /// `terminationGracePeriodSeconds` (30). Pods that never ran on a node, or already ended,
    /// go at once.
    fn deletion_grace(&self, obj: &Value, requested: Option<i64>) -> i64 {
        let node = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let phase = obj
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let default = obj
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30);
        if node && !matches!(phase, "Succeeded" | "Failed") {
            requested.unwrap_or(default)
        } else {
            0
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        let (status, restarts, ready, total) = pod_status(o);
        row.name(o);
        row.col("Ready", "string", 0, || format!("{ready}/{total}"));
        row.col("Status", "string", 0, || status);
        row.col("Restarts", "string", 0, || restarts.to_string());
        row.age(o);
        row.col("IP", "string", 1, || or_none(s(o, "/status/podIP")));
        row.col("Node", "string", 1, || or_none(s(o, "/spec/nodeName")));
        row.col("Nominated Node", "string", 1, || {
            or_none(s(o, "/status/nominatedNodeName"))
        });
        row.col("Readiness Gates", "string", 1, || {
            match len(o, "/spec/readinessGates") {
                0 => "<none>".to_owned(),
                gates => format!("0/{gates}"),
            }
        });
    }
}

/// `core/v1` PodTemplate.
pub struct PodTemplate;

impl Strategy for PodTemplate {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::pod_spec(obj.pointer("/template/spec"), "template.spec", causes);
    }
}

/// A pod's QoS class from its containers' requests and limits.
fn qos_class(pod: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for c in list(pod, "/spec/containers") {
        let limits = c.pointer("/resources/limits").and_then(Value::as_object);
        let requests = c.pointer("/resources/requests").and_then(Value::as_object);
        if limits.is_some_and(|l| !l.is_empty()) || requests.is_some_and(|r| !r.is_empty()) {
            any = true;
        }
        for r in ["cpu", "memory"] {
            let l = limits.and_then(|l| l.get(r));
            let q = requests.and_then(|q| q.get(r)).or(l);
            if l.is_none() || q != l {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

const POD_UPDATE_MSG: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// A pod's spec is fixed once created but for images, a shorter deadline, more
/// tolerations and a few others (upstream's `ValidatePodUpdate`).
/// An update through `pods/ephemeralcontainers` (upstream's
/// `ValidatePodEphemeralContainersUpdate`): ephemeral containers may be added, never removed or
/// changed, and not to static pods; a new one is named uniquely, has an image, and none of what
/// an ephemeral container may not have.
fn ephemeral_update(new: &Value, old: &Value, causes: &mut Vec<Cause>) {
    if old
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        causes.push(Cause::forbidden(
            "",
            "static pods do not support ephemeral containers",
        ));
        return;
    }
    let list = |pod: &Value, key: &str| -> Vec<Value> {
        pod.pointer(&format!("/spec/{key}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let name = |c: &Value| {
        c.get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let new_ephemeral = list(new, "ephemeralContainers");
    for o in list(old, "ephemeralContainers") {
        match new_ephemeral.iter().find(|n| name(n) == name(&o)) {
            None => causes.push(Cause::forbidden(
                "spec.ephemeralContainers",
                &format!(
                    "existing ephemeral containers \"{}\" may not be removed\n",
                    name(&o)
                ),
            )),
            Some(n) if n != &o => causes.push(Cause::forbidden(
                "spec.ephemeralContainers",
                &format!(
                    "existing ephemeral containers \"{}\" may not be changed\n",
                    name(&o)
                ),
            )),
            Some(_) => {}
        }
    }
    let regular: Vec<String> = list(new, "containers")
        .iter()
        .chain(list(new, "initContainers").iter())
        .map(name)
        .collect();
    let mut seen: Vec<String> = Vec::new();
    for (i, c) in new_ephemeral.iter().enumerate() {
        let at = format!("spec.ephemeralContainers[{i}]");
        let n = name(c);
        if n.is_empty() {
            causes.push(Cause::required(&format!("{at}.name"), ""));
        } else if regular.contains(&n) || seen.contains(&n) {
            causes.push(Cause::duplicate(&format!("{at}.name"), &n));
        }
        seen.push(n);
        if c.get("image")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(Cause::required(&format!("{at}.image"), ""));
        }
        for field in [
            "ports",
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
            "lifecycle",
        ] {
            if c.get(field).is_some_and(|v| !v.is_null()) {
                causes.push(Cause::forbidden(
                    &format!("{at}.{field}"),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
        if let Some(target) = c.get("targetContainerName").and_then(Value::as_str)
            && !regular.iter().any(|r| r == target)
        {
            causes.push(Cause {
                reason: "FieldValueNotFound".into(),
                message: format!("Not found: \"{target}\""),
                field: format!("{at}.targetContainerName"),
            });
        }
    }
}

fn pod_update(new: &Value, old: &Value, causes: &mut Vec<Cause>) {
    let (Some(new_spec), Some(old_spec)) = (new.get("spec"), old.get("spec")) else {
        return;
    };
    // Compare with what the update may change taken back to the stored values.
    let mut masked = new_spec.clone();
    for key in ["containers", "initContainers"] {
        let olds = old_spec.get(key).and_then(Value::as_array);
        if let (Some(news), Some(olds)) = (masked.get_mut(key).and_then(Value::as_array_mut), olds)
            && news.len() == olds.len()
        {
            for (n, o) in news.iter_mut().zip(olds) {
                if let (Some(n), Some(image)) = (n.as_object_mut(), o.get("image")) {
                    n.insert("image".into(), image.clone());
                }
            }
        }
    }
    let deadline = |s: &Value| s.get("activeDeadlineSeconds").and_then(Value::as_i64);
    match (deadline(old_spec), deadline(new_spec)) {
        (Some(_), None) => causes.push(Cause::invalid(
            "spec.activeDeadlineSeconds",
            "null",
            "must not update from a positive integer to nil value",
        )),
        (Some(o), Some(n)) if n > o => causes.push(Cause::invalid(
            "spec.activeDeadlineSeconds",
            &n.to_string(),
            "must be less than or equal to previous value",
        )),
        _ => {}
    }
    set_or_remove(&mut masked, "activeDeadlineSeconds", old_spec);
    let tolerations = |s: &Value| s.get("tolerations").and_then(Value::as_array).cloned();
    let old_t = tolerations(old_spec).unwrap_or_default();
    let new_t = tolerations(new_spec).unwrap_or_default();
    if old_t.iter().all(|t| new_t.contains(t)) {
        set_or_remove(&mut masked, "tolerations", old_spec);
    }
    let grace = |s: &Value| {
        s.get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
    };
    if grace(old_spec).is_some_and(|g| g < 0) && grace(new_spec) == Some(1) {
        set_or_remove(&mut masked, "terminationGracePeriodSeconds", old_spec);
    }
    // Scheduling gates may only be removed.
    let gates = |s: &Value| s.get("schedulingGates").and_then(Value::as_array).cloned();
    let new_g = gates(new_spec).unwrap_or_default();
    if new_g
        .iter()
        .all(|g| gates(old_spec).unwrap_or_default().contains(g))
    {
        set_or_remove(&mut masked, "schedulingGates", old_spec);
    }
    if &masked != old_spec {
        causes.push(Cause::forbidden("spec", POD_UPDATE_MSG));
    }
}

/// The STATUS, RESTARTS and READY of a pod as kubectl prints them (upstream's `printPod`):
/// (reason, restarts, ready containers, containers).
fn pod_status(pod: &Value) -> (String, i64, usize, usize) {
    let mut reason = s(pod, "/status/phase");
    if !s(pod, "/status/reason").is_empty() {
        reason = s(pod, "/status/reason");
    }
    let statuses = list(pod, "/status/containerStatuses");
    let total = len(pod, "/spec/containers");
    let mut ready = 0;
    let mut restarts = 0;
    let inits = list(pod, "/status/initContainerStatuses");
    let init_total = len(pod, "/spec/initContainers");
    let mut initializing = false;
    for (n, c) in inits.iter().enumerate() {
        restarts += i(c, "/restartCount");
        let term = c.pointer("/state/terminated");
        if term.is_some_and(|t| i(t, "/exitCode") == 0) {
            continue;
        }
        initializing = true;
        reason = if let Some(t) = term {
            let r = s(t, "/reason");
            if r.is_empty() {
                format!("Init:ExitCode:{}", i(t, "/exitCode"))
            } else {
                format!("Init:{r}")
            }
        } else if let Some(w) = c
            .pointer("/state/waiting")
            .filter(|w| !s(w, "/reason").is_empty() && s(w, "/reason") != "PodInitializing")
        {
            format!("Init:{}", s(w, "/reason"))
        } else {
            format!("Init:{n}/{init_total}")
        };
        break;
    }
    if !initializing {
        let mut has_running = false;
        for c in statuses.iter().rev() {
            restarts += i(c, "/restartCount");
            if let Some(w) = c
                .pointer("/state/waiting")
                .filter(|w| !s(w, "/reason").is_empty())
            {
                reason = s(w, "/reason");
            } else if let Some(t) = c.pointer("/state/terminated") {
                reason = if !s(t, "/reason").is_empty() {
                    s(t, "/reason")
                } else if i(t, "/signal") != 0 {
                    format!("Signal:{}", i(t, "/signal"))
                } else {
                    format!("ExitCode:{}", i(t, "/exitCode"))
                };
            } else if c.pointer("/ready") == Some(&json!(true))
                && c.pointer("/state/running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    } else {
        restarts += statuses.iter().map(|c| i(c, "/restartCount")).sum::<i64>();
    }
    if meta(pod).get("deletionTimestamp").is_some() {
        reason = if s(pod, "/status/reason") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    (reason, restarts, ready, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn pod_updates_may_change_images_tolerations_and_a_shorter_deadline_only() {
        let old = pod(
            json!({"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Always",
            "activeDeadlineSeconds": 60, "tolerations": [{"key": "x", "operator": "Exists"}]}),
        );
        let ok = pod(
            json!({"containers": [{"name": "c", "image": "b"}], "restartPolicy": "Always",
            "activeDeadlineSeconds": 30,
            "tolerations": [{"key": "x", "operator": "Exists"}, {"key": "y", "operator": "Exists"}]}),
        );
        let mut causes = vec![];
        pod_update(&ok, &old, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");

        let restart = pod(
            json!({"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Never",
            "activeDeadlineSeconds": 60, "tolerations": [{"key": "x", "operator": "Exists"}]}),
        );
        let mut causes = vec![];
        pod_update(&restart, &old, &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec");
        assert_eq!(causes[0].reason, "FieldValueForbidden");

        let removed = pod(
            json!({"containers": [{"name": "c", "image": "a"}], "restartPolicy": "Always",
            "activeDeadlineSeconds": 90}),
        );
        let mut causes = vec![];
        pod_update(&removed, &old, &mut causes);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["spec.activeDeadlineSeconds", "spec"]);
    }

    #[test]
    fn qos_classes_follow_requests_and_limits() {
        let be = json!({"spec": {"containers": [{"name": "a"}]}});
        let g = json!({"spec": {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}});
        let b = json!({"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}});
        assert_eq!(qos_class(&be), "BestEffort");
        assert_eq!(qos_class(&g), "Guaranteed");
        assert_eq!(qos_class(&b), "Burstable");
    }

    #[test]
    fn pod_rows_show_ready_status_and_restarts() {
        let r = crate::registry::Registry::with_builtins();
        let pods = r.get("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 1, "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        let t = crate::serving::table::table(&pods, &[pod], None, None, true);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "p");
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[2], "CrashLoopBackOff");
        assert_eq!(cells[3], "3");
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
    }
}

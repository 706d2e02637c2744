//! The defaulting helpers of built-in kinds, as upstream's `SetDefaults_*` (the values a user
//! sees in `kubectl get -o yaml` without having written them). Each kind's strategy
//! (`kinds/`) applies them; the pod spec's defaults here serve pods and every template.

use serde_json::{Value, json};

/// Sets `key` unless it has a value.
pub(crate) fn set_default(obj: &mut Value, key: &str, value: Value) {
    if let Some(m) = obj.as_object_mut()
        && m.get(key).is_none_or(Value::is_null)
    {
        m.insert(key.to_owned(), value);
    }
}

/// The object at `key`, made an empty object first if unset.
pub(crate) fn child<'a>(obj: &'a mut Value, key: &str) -> &'a mut Value {
    set_default(obj, key, json!({}));
    &mut obj[key]
}

pub(crate) fn image_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    let tag = if last.contains('@') {
        None
    } else {
        last.split_once(':').map(|(_, t)| t)
    };
    match tag {
        None | Some("latest") if !last.contains('@') => "Always",
        _ => "IfNotPresent",
    }
}

/// Defaults of a pod spec (also inside templates).
pub fn pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    set_default(spec, "restartPolicy", json!("Always"));
    set_default(spec, "terminationGracePeriodSeconds", json!(30));
    set_default(spec, "dnsPolicy", json!("ClusterFirst"));
    set_default(spec, "securityContext", json!({}));
    set_default(spec, "schedulerName", json!("default-scheduler"));
    for key in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(cs) = spec.get_mut(key).and_then(Value::as_array_mut) {
            for c in cs {
                let image = c
                    .get("image")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                set_default(c, "imagePullPolicy", json!(image_pull_policy(&image)));
                set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
                set_default(c, "terminationMessagePolicy", json!("File"));
                if key != "ephemeralContainers" {
                    set_default(c, "resources", json!({}));
                }
                if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
                    for p in ports {
                        set_default(p, "protocol", json!("TCP"));
                    }
                }
                for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                    if let Some(p) = c.get_mut(probe).filter(|p| p.is_object()) {
                        set_default(p, "timeoutSeconds", json!(1));
                        set_default(p, "periodSeconds", json!(10));
                        set_default(p, "successThreshold", json!(1));
                        set_default(p, "failureThreshold", json!(3));
                        http_get(p);
                    }
                }
                for hook in ["postStart", "preStop"] {
                    if let Some(h) = c.pointer_mut(&format!("/lifecycle/{hook}")) {
                        http_get(h);
                    }
                }
                for e in c
                    .get_mut("env")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    if let Some(f) = e.pointer_mut("/valueFrom/fieldRef") {
                        set_default(f, "apiVersion", json!("v1"));
                    }
                }
            }
        }
    }
    for v in spec
        .get_mut("volumes")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        volume(v);
    }
}

/// SetDefaults_HTTPGetAction: path `/`, scheme HTTP.
pub(crate) fn http_get(handler: &mut Value) {
    if let Some(h) = handler.get_mut("httpGet").filter(|h| h.is_object()) {
        set_default(h, "path", json!("/"));
        set_default(h, "scheme", json!("HTTP"));
    }
}

/// The sources a volume may have (a volume with none is an emptyDir, as upstream defaults).
const VOLUME_SOURCES: &[&str] = &[
    "hostPath",
    "emptyDir",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "configMap",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "csi",
    "ephemeral",
    "image",
];

/// A volume's defaults: file modes 0644 for secret, configMap, downwardAPI and projected;
/// fieldRef apiVersion v1; token expiry 3600 s; hostPath type ""; no source is an emptyDir.
pub(crate) fn volume(v: &mut Value) {
    if !v.is_object() {
        return;
    }
    if !VOLUME_SOURCES
        .iter()
        .any(|s| v.get(*s).is_some_and(|x| !x.is_null()))
    {
        set_default(v, "emptyDir", json!({}));
    }
    for source in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = v.get_mut(source).filter(|s| s.is_object()) {
            set_default(s, "defaultMode", json!(420));
        }
    }
    if let Some(h) = v.get_mut("hostPath").filter(|h| h.is_object()) {
        set_default(h, "type", json!(""));
    }
    let field_refs = |items: &mut Value| {
        for i in items.as_array_mut().into_iter().flatten() {
            if let Some(f) = i.get_mut("fieldRef") {
                set_default(f, "apiVersion", json!("v1"));
            }
        }
    };
    if let Some(items) = v.pointer_mut("/downwardAPI/items") {
        field_refs(items);
    }
    for s in v
        .pointer_mut("/projected/sources")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(t) = s.get_mut("serviceAccountToken").filter(|t| t.is_object()) {
            set_default(t, "expirationSeconds", json!(3600));
        }
        if let Some(items) = s.pointer_mut("/downwardAPI/items") {
            field_refs(items);
        }
    }
}

/// A pod's container with a limit but no request for a resource requests its limit.
pub(crate) fn requests_from_limits(spec: &mut Value) {
    for key in ["containers", "initContainers"] {
        let Some(cs) = spec.get_mut(key).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs {
            let Some(limits) = c
                .pointer("/resources/limits")
                .and_then(Value::as_object)
                .cloned()
            else {
                continue;
            };
            let requests = child(child(c, "resources"), "requests");
            for (res, q) in limits {
                set_default(requests, &res, q);
            }
        }
    }
}

pub(crate) fn template(obj: &mut Value) {
    if let Some(spec) = obj.pointer_mut("/spec/template/spec") {
        pod_spec(spec);
    }
}

/// HPA defaults as upstream's: one replica at least; in v2 a CPU target of 80 % when no metric
/// is given, and, when `behavior` is given, its missing rules from the defaults (scale up: no
/// stabilization, 4 pods or 100 % per 15 s, the larger; scale down: 100 % per 15 s, its window
/// left to the controller's 300 s).
pub(crate) fn hpa(obj: &mut Value) {
    let v2 = obj.get("apiVersion") == Some(&json!("autoscaling/v2"));
    let spec = child(obj, "spec");
    set_default(spec, "minReplicas", json!(1));
    if !v2 {
        return;
    }
    if spec
        .get("metrics")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        spec["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 80}}}]);
    }
    let Some(behavior) = spec.get_mut("behavior").filter(|b| b.is_object()) else {
        return;
    };
    let up = child(behavior, "scaleUp");
    set_default(up, "stabilizationWindowSeconds", json!(0));
    set_default(up, "selectPolicy", json!("Max"));
    if up
        .get("policies")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        up["policies"] = json!([{"type": "Pods", "value": 4, "periodSeconds": 15},
                                {"type": "Percent", "value": 100, "periodSeconds": 15}]);
    }
    let down = child(behavior, "scaleDown");
    set_default(down, "selectPolicy", json!("Max"));
    if down
        .get("policies")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
    {
        down["policies"] = json!([{"type": "Percent", "value": 100, "periodSeconds": 15}]);
    }
}

/// A Secret's `stringData` is write-only: its entries are merged into `data` (base64, taking
/// precedence over `data`'s own) and the field is never stored or returned.
pub(crate) fn string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(Value::Object(plain)) = obj.as_object_mut().and_then(|m| m.remove("stringData"))
    else {
        return;
    };
    let data = child(obj, "data");
    for (k, v) in plain {
        let text = v.as_str().unwrap_or_default();
        data[k.as_str()] = json!(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

/// A Job without `manualSelector` selects its pods by its uid, and its template carries the
/// labels upstream puts there (`batch.kubernetes.io/controller-uid`, `job-name`, and the
/// legacy unprefixed pair).
pub(crate) fn job_selector(obj: &mut Value) {
    if obj.pointer("/spec/manualSelector") == Some(&json!(true)) {
        return;
    }
    let uid = obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
    let name = obj
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::Null);
    if uid.is_null() {
        return;
    }
    let spec = child(obj, "spec");
    set_default(
        spec,
        "selector",
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}),
    );
    let labels = child(child(child(spec, "template"), "metadata"), "labels");
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &uid),
        ("job-name", &name),
    ] {
        set_default(labels, k, v.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(group: &str, kind: &str, obj: &mut Value) {
        crate::registry::kinds::builtin(group, kind).default(obj);
    }

    #[test]
    fn pod_probes_volumes_and_field_refs_get_upstream_defaults() {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "busybox",
            "readinessProbe": {"httpGet": {"port": 80}, "timeoutSeconds": 0},
            "livenessProbe": {"exec": {"command": ["true"]}},
            "lifecycle": {"preStop": {"httpGet": {"port": 80}}},
            "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}],
            "volumes": [{"name": "a"}, {"name": "b", "configMap": {"name": "x"}},
                {"name": "c", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}});
        apply("", "Pod", &mut pod);
        let c = &pod["spec"]["containers"][0];
        // An explicit 0 stays (validation refuses it); unset fields get upstream's values.
        assert_eq!(c["readinessProbe"]["timeoutSeconds"], 0);
        assert_eq!(c["readinessProbe"]["periodSeconds"], 10);
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/");
        assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTP");
        assert_eq!(c["livenessProbe"]["timeoutSeconds"], 1);
        assert_eq!(c["livenessProbe"]["successThreshold"], 1);
        assert_eq!(c["livenessProbe"]["failureThreshold"], 3);
        assert_eq!(c["lifecycle"]["preStop"]["httpGet"]["scheme"], "HTTP");
        assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"], "v1");
        let v = &pod["spec"]["volumes"];
        assert_eq!(v[0]["emptyDir"], json!({}));
        assert_eq!(v[1]["configMap"]["defaultMode"], 420);
        assert_eq!(v[2]["projected"]["defaultMode"], 420);
        assert_eq!(
            v[2]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            3600
        );
    }

    #[test]
    fn image_pull_policy_follows_the_tag() {
        assert_eq!(image_pull_policy("busybox"), "Always");
        assert_eq!(image_pull_policy("busybox:latest"), "Always");
        assert_eq!(image_pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(image_pull_policy("localhost:5000/web"), "Always");
        assert_eq!(image_pull_policy("localhost:5000/web:v2"), "IfNotPresent");
        assert_eq!(image_pull_policy("x@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn hpas_get_upstream_defaults() {
        let mut h = json!({"apiVersion": "autoscaling/v2", "spec": {"maxReplicas": 3,
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}}});
        apply("autoscaling", "HorizontalPodAutoscaler", &mut h);
        assert_eq!(h["spec"]["minReplicas"], 1);
        assert_eq!(
            h["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        let b = &h["spec"]["behavior"];
        assert_eq!(b["scaleUp"]["stabilizationWindowSeconds"], 0);
        assert_eq!(b["scaleUp"]["policies"].as_array().unwrap().len(), 2);
        assert_eq!(b["scaleDown"]["stabilizationWindowSeconds"], 30);
        assert_eq!(b["scaleDown"]["policies"][0]["type"], "Percent");
        // No behavior stays no behavior (the controller's legacy rules apply).
        let mut bare = json!({"apiVersion": "autoscaling/v2", "spec": {"maxReplicas": 3}});
        apply("autoscaling", "HorizontalPodAutoscaler", &mut bare);
        assert!(bare["spec"].get("behavior").is_none());
    }
}

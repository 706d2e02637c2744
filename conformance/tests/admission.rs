//! Admission with the stock kubectl: webhooks (mutating, validating, selectors, failure
//! policy), LimitRanger, ResourceQuota and ServiceAccount token injection; and custom
//! resource conversion webhooks, which share the webhook client.

use minik8s_conformance::Cluster;
use serde_json::{Value, json};

/// Adds the label `injected=yes` to every object it is shown.
fn inject(request: &Value) -> Value {
    use base64::Engine;
    let has_labels = request.pointer("/object/metadata/labels").is_some();
    let patch = if has_labels {
        json!([{"op": "add", "path": "/metadata/labels/injected", "value": "yes"}])
    } else {
        json!([{"op": "add", "path": "/metadata/labels", "value": {"injected": "yes"}}])
    };
    json!({
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
    })
}

/// Denies ConfigMaps with a `forbidden` key.
fn deny_forbidden(request: &Value) -> Value {
    if request.pointer("/object/data/forbidden").is_some() {
        return json!({"allowed": false, "status": {"code": 403, "reason": "Forbidden", "message": "the key forbidden is not allowed"}});
    }
    json!({"allowed": true})
}

fn webhook_config(kind: &str, name: &str, url: &str, ca: &str, extra: Value) -> String {
    let mut hook = json!({
        "name": name,
        "clientConfig": {"url": url, "caBundle": ca},
        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "namespaceSelector": {"matchLabels": {"webhooks": "on"}},
        "timeoutSeconds": 5,
    });
    for (k, v) in extra.as_object().unwrap() {
        hook[k] = v.clone();
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook],
    })
    .to_string()
}

#[test]
fn webhooks_mutate_and_validate_with_selectors_and_failure_policy() {
    let c = Cluster::start();
    let ca = c.ca_bundle();
    c.ok(&["create", "namespace", "hooked"]);
    c.ok(&["label", "namespace", "hooked", "webhooks=on"]);
    c.ok(&["create", "namespace", "plain"]);
    let mutating = c.webhook(inject);
    let validating = c.webhook(deny_forbidden);
    let m = webhook_config(
        "MutatingWebhookConfiguration",
        "inject.minik8s.test",
        &mutating,
        &ca,
        json!({"objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]}}),
    );
    let v = webhook_config(
        "ValidatingWebhookConfiguration",
        "deny.minik8s.test",
        &validating,
        &ca,
        json!({}),
    );
    apply(&c, &["apply"], &m);
    apply(&c, &["apply"], &v);
    // The configurations are read by a watch: wait until they take effect.
    let mut labelled = String::new();
    for i in 0..50 {
        let name = format!("probe{i}");
        c.ok(&[
            "create",
            "configmap",
            &name,
            "-n",
            "hooked",
            "--from-literal=x=1",
        ]);
        labelled = c.ok(&[
            "get",
            "cm",
            &name,
            "-n",
            "hooked",
            "-o",
            "jsonpath={.metadata.labels.injected}",
        ]);
        if labelled == "yes" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        labelled, "yes",
        "the mutating webhook labels new ConfigMaps"
    );

    // The object selector excludes objects labelled skip.
    let skipped = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"skipped","namespace":"hooked","labels":{"skip":"1"}}}"#;
    apply(&c, &["create"], skipped);
    let labels = c.ok(&[
        "get",
        "cm",
        "skipped",
        "-n",
        "hooked",
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    assert!(!labels.contains("injected"), "{labels}");

    // The validating webhook denies, on create and on update, with its message and code.
    let err = c.fails(&[
        "create",
        "configmap",
        "bad",
        "-n",
        "hooked",
        "--from-literal=forbidden=1",
    ]);
    assert!(
        err.contains("admission webhook \"deny.minik8s.test\" denied the request: the key forbidden is not allowed"),
        "{err}"
    );
    let err = c.fails(&[
        "patch",
        "configmap",
        "probe0",
        "-n",
        "hooked",
        "-p",
        r#"{"data":{"forbidden":"1"}}"#,
    ]);
    assert!(err.contains("denied the request"), "{err}");
    assert!(
        !c.ok(&["get", "cm", "probe0", "-n", "hooked", "-o", "json"])
            .contains("forbidden")
    );

    // The namespace selector leaves other namespaces alone.
    c.ok(&[
        "create",
        "configmap",
        "bad",
        "-n",
        "plain",
        "--from-literal=forbidden=1",
    ]);
    let labels = c.ok(&[
        "get",
        "cm",
        "bad",
        "-n",
        "plain",
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    assert!(!labels.contains("injected"), "{labels}");

    // An unreachable webhook fails closed by default and open with Ignore.
    let dead = |policy: &str| {
        let mut cfg: Value = serde_json::from_str(&webhook_config(
            "ValidatingWebhookConfiguration",
            "dead.minik8s.test",
            "https://127.0.0.1:1/",
            &ca,
            json!({"failurePolicy": policy}),
        ))
        .unwrap();
        cfg["webhooks"][0]["rules"][0]["resources"] = json!(["secrets"]);
        cfg.to_string()
    };
    assert!(c.with_manifest(&["apply"], &dead("Fail")).ok);
    let mut err = String::new();
    for i in 0..50 {
        let r = c.kubectl(&[
            "create",
            "secret",
            "generic",
            &format!("s{i}"),
            "-n",
            "hooked",
        ]);
        if !r.ok {
            err = r.stderr;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        err.contains("failed calling webhook \"dead.minik8s.test\""),
        "{err}"
    );
    // A failing webhook on webhook configurations is never called for them (upstream exempts
    // admissionregistration.k8s.io), so the configurations can still be changed and removed.
    let mut guard: Value = serde_json::from_str(&webhook_config(
        "ValidatingWebhookConfiguration",
        "guard.minik8s.test",
        "https://127.0.0.1:1/",
        &ca,
        json!({"failurePolicy": "Fail"}),
    ))
    .unwrap();
    guard["webhooks"][0]["rules"][0] = json!({"operations": ["*"],
        "apiGroups": ["admissionregistration.k8s.io"], "apiVersions": ["*"], "resources": ["*"]});
    apply(&c, &["apply"], &guard.to_string());
    assert!(c.with_manifest(&["apply"], &dead("Ignore")).ok);
    let mut created = false;
    for i in 0..50 {
        if c.kubectl(&[
            "create",
            "secret",
            "generic",
            &format!("t{i}"),
            "-n",
            "hooked",
        ])
        .ok
        {
            created = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(created, "failurePolicy Ignore lets the request through");
    // Deleting the configurations turns the webhooks off.
    c.ok(&[
        "delete",
        "validatingwebhookconfiguration",
        "deny.minik8s.test",
        "dead.minik8s.test",
        "guard.minik8s.test",
    ]);
    let mut allowed = false;
    for i in 0..50 {
        if c.kubectl(&[
            "create",
            "configmap",
            &format!("ok{i}"),
            "-n",
            "hooked",
            "--from-literal=forbidden=1",
        ])
        .ok
        {
            allowed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(allowed);
}

/// Runs kubectl with a manifest on stdin, failing the test with kubectl's error.
fn apply(c: &Cluster, verb: &[&str], manifest: &str) {
    let r = c.with_manifest(verb, manifest);
    assert!(r.ok, "kubectl {verb:?}: {}", r.stderr);
}

fn pod_json(c: &Cluster, ns: &str, name: &str) -> Value {
    serde_json::from_str(&c.ok(&["get", "pod", name, "-n", ns, "-o", "json"])).unwrap()
}

#[test]
fn limit_ranges_default_and_bound_pods_and_quotas_cap_namespaces() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "limited"]);
    let range = r#"{"apiVersion":"v1","kind":"LimitRange","metadata":{"name":"lr","namespace":"limited"},
      "spec":{"limits":[{"type":"Container","default":{"cpu":"500m","memory":"128Mi"},
        "defaultRequest":{"cpu":"250m","memory":"64Mi"},"max":{"cpu":"1"}}]}}"#;
    apply(&c, &["create"], range);
    c.ok(&[
        "run",
        "p1",
        "--image=busybox",
        "--restart=Never",
        "-n",
        "limited",
    ]);
    let p1 = pod_json(&c, "limited", "p1");
    let res = &p1["spec"]["containers"][0]["resources"];
    assert_eq!(res["limits"]["cpu"], json!("500m"), "{res}");
    assert_eq!(res["requests"]["cpu"], json!("250m"), "{res}");
    assert_eq!(res["requests"]["memory"], json!("64Mi"), "{res}");
    assert!(
        p1.pointer("/metadata/annotations/kubernetes.io~1limit-ranger")
            .is_some(),
        "{p1}"
    );
    assert_eq!(p1["status"]["qosClass"], json!("Burstable"));

    // ServiceAccount admission: the default account and its projected token volume.
    assert_eq!(p1["spec"]["serviceAccountName"], json!("default"));
    let vol = &p1["spec"]["volumes"][0];
    assert!(
        vol["name"]
            .as_str()
            .unwrap()
            .starts_with("kube-api-access-"),
        "{vol}"
    );
    assert!(vol.to_string().contains("serviceAccountToken"));
    assert_eq!(
        p1["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        json!("/var/run/secrets/kubernetes.io/serviceaccount")
    );
    assert!(
        c.ok(&[
            "get",
            "configmap",
            "kube-root-ca.crt",
            "-n",
            "limited",
            "-o",
            "jsonpath={.data.ca\\.crt}"
        ])
        .contains("BEGIN CERTIFICATE")
    );
    let err = c.fails(&[
        "run",
        "nosa",
        "--image=busybox",
        "-n",
        "limited",
        "--overrides",
        r#"{"spec":{"serviceAccountName":"ghost"}}"#,
    ]);
    assert!(err.contains("serviceaccount \"ghost\" not found"), "{err}");

    // Above the range's max: forbidden with upstream's message.
    let big = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"big","namespace":"limited"},
      "spec":{"containers":[{"name":"c","image":"busybox","resources":{"limits":{"cpu":"2"}}}]}}"#;
    let r = c.with_manifest(&["create"], big);
    assert!(!r.ok);
    assert!(
        r.stderr.contains(
            "pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
        ),
        "{}",
        r.stderr
    );

    // A quota of two pods and one CPU of requests.
    let quota = r#"{"apiVersion":"v1","kind":"ResourceQuota","metadata":{"name":"q","namespace":"limited"},
      "spec":{"hard":{"pods":"2","requests.cpu":"1","count/configmaps":"5"}}}"#;
    apply(&c, &["create"], quota);
    let used = c.ok(&[
        "get",
        "quota",
        "q",
        "-n",
        "limited",
        "-o",
        "jsonpath={.status.used.pods}",
    ]);
    assert_eq!(used, "1", "status.used counts the existing pod");
    c.ok(&[
        "run",
        "p2",
        "--image=busybox",
        "--restart=Never",
        "-n",
        "limited",
    ]);
    let err = c.fails(&[
        "run",
        "p3",
        "--image=busybox",
        "--restart=Never",
        "-n",
        "limited",
    ]);
    assert!(
        err.contains("pods \"p3\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"),
        "{err}"
    );
    let described = c.ok(&["describe", "quota", "q", "-n", "limited"]);
    assert!(
        described.contains("requests.cpu") && described.contains("500m"),
        "{described}"
    );
    // Freeing a pod frees its share.
    c.ok(&["delete", "pod", "p1", "-n", "limited", "--wait=false"]);
    assert_eq!(
        c.ok(&[
            "get",
            "quota",
            "q",
            "-n",
            "limited",
            "-o",
            "jsonpath={.status.used.pods}"
        ]),
        "1"
    );
    c.ok(&[
        "run",
        "p3",
        "--image=busybox",
        "--restart=Never",
        "-n",
        "limited",
    ]);
    // Object counts: kube-root-ca.crt is one of the five ConfigMaps.
    for i in 0..4 {
        c.ok(&["create", "configmap", &format!("cm{i}"), "-n", "limited"]);
    }
    let err = c.fails(&["create", "configmap", "cm4", "-n", "limited"]);
    assert!(err.contains("exceeded quota: q, requested: count/configmaps=1, used: count/configmaps=5, limited: count/configmaps=5"), "{err}");

    // Extended resources (names with a `/`) are counted too (upstream's quota spec).
    c.ok(&["create", "namespace", "dongles"]);
    let quota = r#"{"apiVersion":"v1","kind":"ResourceQuota","metadata":{"name":"d","namespace":"dongles"},
      "spec":{"hard":{"requests.example.com/dongle":"3"}}}"#;
    apply(&c, &["create"], quota);
    let pod = |name: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"dongles"}},
              "spec":{{"containers":[{{"name":"c","image":"busybox","resources":{{
                "requests":{{"example.com/dongle":"2"}},"limits":{{"example.com/dongle":"2"}}}}}}]}}}}"#
        )
    };
    apply(&c, &["create"], &pod("d1"));
    c.eventually(
        &[
            "get",
            "quota",
            "d",
            "-n",
            "dongles",
            "-o",
            r"jsonpath={.status.used.requests\.example\.com/dongle}",
        ],
        |s| s == "2",
    );
    // Scoped quotas count only the pods their scopes name (BestEffort / NotBestEffort).
    for (name, scope) in [("be", "BestEffort"), ("notbe", "NotBestEffort")] {
        let q = format!(
            r#"{{"apiVersion":"v1","kind":"ResourceQuota","metadata":{{"name":"{name}","namespace":"dongles"}},
              "spec":{{"hard":{{"pods":"5"}},"scopes":["{scope}"]}}}}"#
        );
        apply(&c, &["create"], &q);
    }
    // (QoS looks at CPU and memory only: the dongle pod is best effort too.)
    c.ok(&["run", "plain", "--image=busybox", "-n", "dongles"]);
    apply(
        &c,
        &["create"],
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"burstable","namespace":"dongles"},
          "spec":{"containers":[{"name":"c","image":"busybox","resources":{"requests":{"cpu":"10m"}}}]}}"#,
    );
    let used = |q: &str| {
        c.ok(&[
            "get",
            "quota",
            q,
            "-n",
            "dongles",
            "-o",
            "jsonpath={.status.used.pods}",
        ])
    };
    c.eventually(
        &[
            "get",
            "quota",
            "be",
            "-n",
            "dongles",
            "-o",
            "jsonpath={.status.used.pods}",
        ],
        |s| s == "2",
    );
    assert_eq!(used("notbe"), "1", "only the pod with a CPU request");
    let r = c.with_manifest(&["create"], &pod("d2"));
    assert!(!r.ok);
    assert!(
        r.stderr.contains("exceeded quota: d, requested: requests.example.com/dongle=2, used: requests.example.com/dongle=2, limited: requests.example.com/dongle=3"),
        "{}",
        r.stderr
    );
}

/// A conversion webhook between `v1` (`hostPort: "h:p"`) and `v2` (`host`, `port`), as
/// upstream's e2e crd-conversion-webhook converts.
fn convert_host_port(request: &Value) -> Value {
    let to = request["desiredAPIVersion"].as_str().unwrap_or_default();
    let converted: Vec<Value> = request["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let mut o = o.clone();
            let m = o.as_object_mut().unwrap();
            if to.ends_with("/v2") {
                if let Some(hp) = m.remove("hostPort") {
                    let (h, p) = hp.as_str().unwrap().split_once(':').unwrap();
                    m.insert("host".into(), json!(h));
                    m.insert("port".into(), json!(p));
                }
            } else if let (Some(h), Some(p)) = (m.remove("host"), m.remove("port")) {
                let hp = format!("{}:{}", h.as_str().unwrap(), p.as_str().unwrap());
                m.insert("hostPort".into(), json!(hp));
            }
            m.insert("apiVersion".into(), json!(to));
            o
        })
        .collect();
    json!({"convertedObjects": converted, "result": {"status": "Success"}})
}

/// A CRD with `strategy: Webhook` (upstream's CustomResourceConversionWebhook specs): an
/// object written in v1 reads in v2 through the webhook, a list of objects stored in both
/// versions reads whole in either, and a webhook that fails makes the read a 500.
#[test]
fn custom_resources_convert_through_a_conversion_webhook() {
    let c = Cluster::start();
    let url = c.webhook(convert_host_port);
    let version = |name: &str, storage: bool, fields: &[&str]| {
        let props: serde_json::Map<String, Value> = fields
            .iter()
            .map(|f| (f.to_string(), json!({"type": "string"})))
            .collect();
        json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": {
            "type": "object", "properties": props}}})
    };
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.conv.minik8s.test"},
        "spec": {"group": "conv.minik8s.test", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [version("v1", true, &["hostPort"]), version("v2", false, &["host", "port"])],
            "conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1", "v1beta1"],
                "clientConfig": {"url": url, "caBundle": c.ca_bundle()}}}},
    });
    assert!(c.with_manifest(&["create"], &crd.to_string()).ok);
    c.eventually(
        &[
            "get",
            "crd",
            "widgets.conv.minik8s.test",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ],
        |o| o == "True",
    );
    let v1 = r#"{"apiVersion": "conv.minik8s.test/v1", "kind": "Widget", "metadata": {"name": "one", "labels": {"l": "1"}}, "hostPort": "localhost:8080"}"#;
    let r = c.with_manifest(&["create"], v1);
    assert!(r.ok, "{}", r.stderr);
    let two = c.ok(&["get", "widgets.v2.conv.minik8s.test", "one", "-o", "json"]);
    let two: Value = serde_json::from_str(&two).unwrap();
    assert_eq!(two["apiVersion"], "conv.minik8s.test/v2");
    assert_eq!(
        (two["host"].as_str(), two["port"].as_str()),
        (Some("localhost"), Some("8080"))
    );
    assert!(two.get("hostPort").is_none(), "{two}");
    assert_eq!(two["metadata"]["labels"]["l"], "1");
    // Written in v2 (stored as v1 through the webhook), read back in v1.
    let v2 = r#"{"apiVersion": "conv.minik8s.test/v2", "kind": "Widget", "metadata": {"name": "two"}, "host": "example.com", "port": "443"}"#;
    let r = c.with_manifest(&["create"], v2);
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(
        c.ok(&[
            "get",
            "widgets.v1.conv.minik8s.test",
            "two",
            "-o",
            "jsonpath={.hostPort}"
        ]),
        "example.com:443"
    );
    // A non-homogeneous list reads whole in both versions.
    assert_eq!(
        c.ok(&[
            "get",
            "widgets.v2.conv.minik8s.test",
            "-o",
            "jsonpath={.items[*].host}"
        ]),
        "localhost example.com"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "widgets.v1.conv.minik8s.test",
            "-o",
            "jsonpath={.items[*].hostPort}"
        ]),
        "localhost:8080 example.com:443"
    );
    // A webhook that cannot be reached fails the read with a clear 500, and loses nothing.
    let broken = json!({"spec": {"conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
        "clientConfig": {"url": "https://127.0.0.1:1/", "caBundle": c.ca_bundle()}}}}});
    c.ok(&[
        "patch",
        "crd",
        "widgets.conv.minik8s.test",
        "--type=merge",
        "-p",
        &broken.to_string(),
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let failed = loop {
        let r = c.kubectl(&["get", "widgets.v2.conv.minik8s.test", "one"]);
        if !r.ok || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        !failed.ok
            && failed.stderr.contains("InternalError")
            && failed
                .stderr
                .contains("conversion webhook for conv.minik8s.test/v2, Kind=Widget failed"),
        "{}",
        failed.stderr
    );
    assert_eq!(
        c.ok(&[
            "get",
            "widgets.v1.conv.minik8s.test",
            "one",
            "-o",
            "jsonpath={.hostPort}"
        ]),
        "localhost:8080"
    );
}

/// Denies a CONNECT to `pods/exec` that would run `forbidden`, explained by `reason` only
/// (as upstream's e2e webhook explains some denials).
fn deny_forbidden_exec(request: &Value) -> Value {
    let ok = request["operation"] == "CONNECT"
        && request["kind"]["kind"] == "PodExecOptions"
        && request["subResource"] == "exec"
        && request["object"]["kind"] == "PodExecOptions";
    let forbidden = request["object"]["command"]
        .as_array()
        .is_some_and(|c| c.iter().any(|a| a == "forbidden"));
    if ok && forbidden {
        return json!({"allowed": false, "status": {"reason": "exec of forbidden is not allowed"}});
    }
    json!({"allowed": ok})
}

/// A validating webhook on CONNECT sees `kubectl exec`'s PodExecOptions and can deny it
/// before any connection is made (upstream's "should be able to deny attaching pod").
#[test]
fn webhooks_see_and_deny_connect_operations() {
    let c = Cluster::start();
    let url = c.webhook(deny_forbidden_exec);
    let mut config: Value = serde_json::from_str(&webhook_config(
        "ValidatingWebhookConfiguration",
        "exec.minik8s.test",
        &url,
        &c.ca_bundle(),
        json!({"rules": [{"operations": ["CONNECT"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/exec"]}],
               "namespaceSelector": {}}),
    ))
    .unwrap();
    config["webhooks"][0]["failurePolicy"] = json!("Fail");
    assert!(c.with_manifest(&["create"], &config.to_string()).ok);
    c.ok(&[
        "run",
        "p",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sleep",
        "1d",
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let denied = loop {
        let r = c.kubectl(&["exec", "p", "--", "forbidden"]);
        if r.stderr.contains("denied the request") || std::time::Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        !denied.ok
            && denied.stderr.contains(
                "admission webhook \"exec.minik8s.test\" denied the request: exec of forbidden is not allowed"
            ),
        "{}",
        denied.stderr
    );
    // Allowed connects go on to the node (this cluster has none to reach).
    let r = c.kubectl(&["exec", "p", "--", "true"]);
    assert!(!r.stderr.contains("denied the request"), "{}", r.stderr);
}

#[test]
fn webhook_match_conditions_choose_what_a_webhook_sees() {
    let c = Cluster::start();
    let ca = c.ca_bundle();
    c.ok(&["create", "namespace", "hooked"]);
    c.ok(&["label", "namespace", "hooked", "webhooks=on"]);
    let url = c.webhook(inject);
    // An expression that does not compile is refused with upstream's words.
    let bad = webhook_config(
        "MutatingWebhookConfiguration",
        "bad.minik8s.test",
        &url,
        &ca,
        json!({"matchConditions": [{"name": "invalid-expression-1", "expression": "... [] bad expression"}]}),
    );
    let r = c.with_manifest(&["apply"], &bad);
    assert!(!r.ok, "{r:?}");
    assert!(
        r.stderr.contains("webhooks[0].matchConditions[0].expression: Invalid value: \"... [] bad expression\": compilation failed"),
        "{}",
        r.stderr
    );
    let m = webhook_config(
        "MutatingWebhookConfiguration",
        "inject.minik8s.test",
        &url,
        &ca,
        json!({"matchConditions": [{"name": "skip-me", "expression": "object.metadata.name != 'skip-me'"}]}),
    );
    apply(&c, &["apply"], &m);
    apply(&c, &["apply"], &m);
    let label = |name: &str| {
        c.ok(&[
            "get",
            "cm",
            name,
            "-n",
            "hooked",
            "-o",
            "jsonpath={.metadata.labels.injected}",
        ])
    };
    let mut injected = String::new();
    for i in 0..50 {
        let name = format!("probe{i}");
        c.ok(&["create", "configmap", &name, "-n", "hooked"]);
        injected = label(&name);
        if injected == "yes" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        injected, "yes",
        "the webhook is called when its conditions hold"
    );
    c.ok(&["create", "configmap", "skip-me", "-n", "hooked"]);
    assert_eq!(label("skip-me"), "", "a false condition skips the webhook");
}

#[test]
fn validating_admission_policies_deny_warn_and_read_variables() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "guarded"]);
    c.ok(&["label", "namespace", "guarded", "policies=on"]);
    c.ok(&["create", "namespace", "free"]);
    let policy = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: replicas.minik8s.test}
spec:
  matchConstraints:
    resourceRules:
    # scope is written out: upstream defaults it to "*", and kubectl's patch of an atomic
    # list would otherwise differ on the second apply (as against upstream).
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments], scope: "*"}
  variables:
  - {name: replicas, expression: object.spec.replicas}
  validations:
  - expression: variables.replicas > 1
    messageExpression: "'wants more than one replica, got ' + string(variables.replicas)"
  - expression: "namespaceObject.metadata.name == 'guarded'"
    message: only the guarded namespace is bound
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: replicas-binding}
spec:
  policyName: replicas.minik8s.test
  validationActions: [Deny]
  matchResources:
    namespaceSelector: {matchLabels: {policies: "on"}}
"#;
    let r = c.with_manifest(&["apply"], policy);
    assert!(r.ok, "{r:?}");
    let r = c.with_manifest(&["apply"], policy);
    assert!(r.ok && r.stdout.matches("unchanged").count() == 2, "{r:?}");
    assert_eq!(
        c.ok(&[
            "get",
            "validatingadmissionpolicy",
            "replicas.minik8s.test",
            "-o",
            "jsonpath={.spec.failurePolicy}/{.metadata.generation}"
        ]),
        "Fail/1"
    );
    let deployment = |ns: &str, name: &str, replicas: u32| {
        format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"{name}","namespace":"{ns}"}},
            "spec":{{"replicas":{replicas},"selector":{{"matchLabels":{{"app":"{name}"}}}},
            "template":{{"metadata":{{"labels":{{"app":"{name}"}}}},"spec":{{"containers":[{{"name":"c","image":"busybox"}}]}}}}}}}}"#
        )
    };
    // The policy is read by a watch: wait until it denies.
    let mut denied = String::new();
    for i in 0..50 {
        let r = c.with_manifest(&["create"], &deployment("guarded", &format!("one{i}"), 1));
        if !r.ok {
            denied = r.stderr;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Upstream's Status: the validation's reason (Invalid by default) with the message as
    // its one cause, which kubectl prints as an invalid object.
    assert!(
        denied.contains("The deployments \"one")
            && denied.contains("is invalid: : ValidatingAdmissionPolicy 'replicas.minik8s.test' with binding 'replicas-binding' denied request: wants more than one replica, got 1"),
        "{denied}"
    );
    // Two replicas pass; a namespace the binding does not select is not checked.
    apply(&c, &["create"], &deployment("guarded", "two", 2));
    apply(&c, &["create"], &deployment("free", "one", 1));
    // An update is checked too.
    let err = c.fails(&[
        "patch",
        "deployment",
        "two",
        "-n",
        "guarded",
        "-p",
        r#"{"spec":{"replicas":1}}"#,
    ]);
    assert!(err.contains("wants more than one replica, got 1"), "{err}");
    // Warn: the request passes and kubectl prints the warning.
    c.ok(&[
        "patch",
        "validatingadmissionpolicybinding",
        "replicas-binding",
        "--type=merge",
        "-p",
        r#"{"spec":{"validationActions":["Warn"]}}"#,
    ]);
    let mut warned = String::new();
    for i in 0..50 {
        let r = c.with_manifest(
            &["create"],
            &deployment("guarded", &format!("warned{i}"), 1),
        );
        if r.ok && r.stderr.contains("Warning:") {
            warned = r.stderr;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        warned.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'replicas.minik8s.test' with binding 'replicas-binding': wants more than one replica, got 1"),
        "{warned}"
    );
    // Deny and Warn together are refused.
    let err = c.fails(&[
        "patch",
        "validatingadmissionpolicybinding",
        "replicas-binding",
        "--type=merge",
        "-p",
        r#"{"spec":{"validationActions":["Deny","Warn"]}}"#,
    ]);
    assert!(err.contains("must not contain both Deny and Warn"), "{err}");
    let described = c.ok(&[
        "describe",
        "validatingadmissionpolicy",
        "replicas.minik8s.test",
    ]);
    assert!(described.contains("variables.replicas > 1"), "{described}");
}

#[test]
fn a_quota_status_written_by_hand_is_put_right() {
    let c = Cluster::start();
    c.ok(&["create", "quota", "compute", "--hard=cpu=1,memory=1Gi"]);
    let status = |c: &Cluster| {
        c.ok(&[
            "get",
            "quota",
            "compute",
            "-o",
            "jsonpath={.status.hard.cpu}/{.status.hard.memory}",
        ])
    };
    c.eventually(
        &[
            "get",
            "quota",
            "compute",
            "-o",
            "jsonpath={.status.hard.cpu}",
        ],
        |o| o == "1",
    );
    c.ok(&[
        "patch",
        "quota",
        "compute",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"hard":{"cpu":"2","memory":"2Gi"}}}"#,
    ]);
    // The status write stands until the periodic recount (2 s in tests, a minute by
    // default) puts the spec's limits back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while status(&c) != "1/1Gi" {
        assert!(
            std::time::Instant::now() < deadline,
            "never reset: {}",
            status(&c)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Many watchers of a custom resource read in a version its conversion webhook makes (with
/// field selectors on that version's selectable fields, as v1.34's
/// CustomResourceFieldSelectors spec): each event is converted while the others wait for
/// it, and the server must go on serving the webhook call meanwhile (it once stalled).
#[test]
fn many_watches_of_converted_custom_resources_do_not_stall_the_server() {
    let c = Cluster::start();
    let url = c.webhook(convert_host_port);
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "routes.conv.minik8s.test"},
        "spec": {"group": "conv.minik8s.test", "scope": "Namespaced",
            "names": {"plural": "routes", "singular": "route", "kind": "Route"},
            "versions": [
                {"name": "v1", "served": true, "storage": true, "selectableFields": [{"jsonPath": ".hostPort"}],
                 "schema": {"openAPIV3Schema": {"type": "object", "properties": {"hostPort": {"type": "string"}}}}},
                {"name": "v2", "served": true, "storage": false,
                 "selectableFields": [{"jsonPath": ".host"}, {"jsonPath": ".port"}],
                 "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                     "host": {"type": "string"}, "port": {"type": "string"}}}}}],
            "conversion": {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": c.ca_bundle()}}}},
    });
    assert!(c.with_manifest(&["create"], &crd.to_string()).ok);
    c.eventually(
        &[
            "get",
            "crd",
            "routes.conv.minik8s.test",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
        ],
        |o| o == "True",
    );
    // Eight watches in v2 with a field selector (more than the server's threads).
    let kubeconfig = c.dir().join("admin.kubeconfig");
    let watchers: Vec<std::process::Child> = (0..8)
        .map(|_| {
            std::process::Command::new("kubectl")
                .env("KUBECONFIG", &kubeconfig)
                .args([
                    "get",
                    "routes.v2.conv.minik8s.test",
                    "--field-selector=host=host1",
                    "-w",
                    "-o",
                    "name",
                    "--request-timeout=0",
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("kubectl")
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_secs(2));
    for i in 0..5 {
        let r = format!(
            r#"{{"apiVersion": "conv.minik8s.test/v1", "kind": "Route", "metadata": {{"name": "r{i}"}}, "hostPort": "host{}:80"}}"#,
            i % 2 + 1
        );
        assert!(c.with_manifest(&["create"], &r).ok);
    }
    // The server still answers at once, and a list through the selector is right.
    let started = std::time::Instant::now();
    let listed = c.ok(&[
        "get",
        "routes.v2.conv.minik8s.test",
        "--field-selector=host=host1",
        "-o",
        "name",
        "--request-timeout=10s",
    ]);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(listed.lines().count(), 3, "{listed}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    for mut w in watchers {
        let _ = w.kill();
        let out = w.wait_with_output().unwrap();
        let seen = String::from_utf8_lossy(&out.stdout).lines().count();
        assert_eq!(seen, 3, "each watch saw the three routes of host1");
    }
}

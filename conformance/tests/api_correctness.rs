//! Upstream API behaviours that stock kubectl users meet, each checked the way a user hits
//! it: namespaces that hold their contents until finalized, custom resources applied twice,
//! no-op patches, Secret `stringData`, namespace labels, pod and finalizer update rules,
//! validation of kinds no controller reads, scope of paths, health checks and discovery order.

use minik8s_conformance::Cluster;

const CRD: &str = include_str!("crontab-crd.yaml");

fn json(c: &Cluster, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&c.ok(&a)).expect("kubectl prints JSON")
}

#[test]
fn a_deleted_namespace_terminates_until_its_contents_are_gone_and_a_new_one_starts_empty() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "team"]);
    c.ok(&[
        "create",
        "configmap",
        "cm",
        "-n",
        "team",
        "--from-literal=a=b",
    ]);
    c.ok(&[
        "create",
        "secret",
        "generic",
        "s",
        "-n",
        "team",
        "--from-literal=p=q",
    ]);
    c.ok(&["create", "deployment", "d", "-n", "team", "--image=busybox"]);
    c.ok(&["delete", "namespace", "team", "--wait=false"]);
    // No namespace controller yet: the namespace stays, Terminating, with its contents.
    let ns = json(&c, &["get", "namespace", "team"]);
    assert_eq!(ns["status"]["phase"], "Terminating", "{ns}");
    assert!(ns["metadata"]["deletionTimestamp"].is_string(), "{ns}");
    assert_eq!(ns["spec"]["finalizers"], serde_json::json!(["kubernetes"]));
    assert!(
        c.ok(&["get", "configmap", "cm", "-n", "team", "-o", "name"])
            .contains("cm")
    );
    let refused = c.fails(&["create", "configmap", "late", "-n", "team"]);
    assert!(refused.contains("is being terminated"), "{refused}");
    // The namespace controller empties it, then finalizes it.
    c.run_controllers(0);
    c.eventually(&["get", "namespaces", "-o", "name"], |o| {
        !o.contains("namespace/team")
    });
    c.ok(&["create", "namespace", "team"]);
    for kind in ["configmaps", "secrets", "deployments"] {
        let left = c.ok(&["get", kind, "-n", "team", "-o", "name"]);
        let user: Vec<&str> = left
            .lines()
            .filter(|l| !l.contains("kube-root-ca.crt"))
            .collect();
        assert!(
            user.is_empty(),
            "{kind} inherited by the new namespace: {left}"
        );
    }
    // Every namespace carries its name as a label.
    assert_eq!(
        c.ok(&[
            "get",
            "namespace",
            "team",
            "-o",
            "jsonpath={.metadata.labels.kubernetes\\.io/metadata\\.name}"
        ]),
        "team"
    );
}

#[test]
fn a_custom_resource_applies_again_after_an_edit() {
    let c = Cluster::start();
    let r = c.with_manifest(&["apply"], CRD);
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &["get", "crd", "crontabs.stable.example.com", "-o", "name"],
        |o| !o.is_empty(),
    );
    let cr = |spec: &str| {
        format!(
            "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: tab\nspec:\n  cronSpec: \"{spec}\"\n  image: img\n"
        )
    };
    let r = c.with_manifest(&["apply"], &cr("* * * * */5"));
    assert!(r.ok, "{}", r.stderr);
    let r = c.with_manifest(&["apply"], &cr("* * * * */10"));
    assert!(r.ok, "second apply: {}", r.stderr);
    assert!(r.stdout.contains("configured"), "{}", r.stdout);
    assert_eq!(
        c.ok(&["get", "crontab", "tab", "-o", "jsonpath={.spec.cronSpec}"]),
        "* * * * */10"
    );
}

#[test]
fn patches_that_change_nothing_write_nothing() {
    let c = Cluster::start();
    c.ok(&["create", "configmap", "x", "--from-literal=a=1"]);
    let before = c.ok(&[
        "get",
        "cm",
        "x",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    let out = c.ok(&["patch", "cm", "x", "-p", r#"{"data":{"a":"1"}}"#]);
    assert!(out.contains("patched (no change)"), "{out}");
    let out = c.ok(&["label", "cm", "x", "k=v"]);
    assert!(out.contains("labeled"), "{out}");
    let labelled = c.ok(&[
        "get",
        "cm",
        "x",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    assert_ne!(before, labelled);
    let out = c.ok(&[
        "patch",
        "cm",
        "x",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"k":"v"}}}"#,
    ]);
    assert!(out.contains("patched (no change)"), "{out}");
    assert_eq!(
        labelled,
        c.ok(&[
            "get",
            "cm",
            "x",
            "-o",
            "jsonpath={.metadata.resourceVersion}"
        ])
    );
}

#[test]
fn secrets_merge_string_data_into_data_and_never_return_it() {
    let c = Cluster::start();
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ndata:\n  a: eA==\nstringData:\n  user: admin\n",
    );
    assert!(r.ok, "{}", r.stderr);
    let s = json(&c, &["get", "secret", "creds"]);
    assert!(s.get("stringData").is_none(), "{s}");
    assert_eq!(s["data"]["user"], "YWRtaW4=");
    assert_eq!(s["data"]["a"], "eA==");
    c.ok(&[
        "patch",
        "secret",
        "creds",
        "-p",
        r#"{"stringData":{"user":"root"}}"#,
    ]);
    let s = json(&c, &["get", "secret", "creds"]);
    assert!(s.get("stringData").is_none(), "{s}");
    assert_eq!(s["data"]["user"], "cm9vdA==");
}

#[test]
fn pod_specs_and_finalizers_of_deleting_objects_cannot_change() {
    let c = Cluster::start();
    c.ok(&["run", "p", "--image=busybox", "--", "sleep", "3600"]);
    let err = c.fails(&[
        "patch",
        "pod",
        "p",
        "--type=merge",
        "-p",
        r#"{"spec":{"restartPolicy":"Never"}}"#,
    ]);
    assert!(
        err.contains("spec: Forbidden: pod updates may not change fields"),
        "{err}"
    );
    c.ok(&["set", "image", "pod/p", "p=busybox:1.36"]);
    c.ok(&[
        "patch",
        "pod",
        "p",
        "--type=merge",
        "-p",
        r#"{"spec":{"activeDeadlineSeconds":100}}"#,
    ]);
    let err = c.fails(&[
        "patch",
        "pod",
        "p",
        "--type=merge",
        "-p",
        r#"{"spec":{"activeDeadlineSeconds":200}}"#,
    ]);
    assert!(err.contains("spec.activeDeadlineSeconds"), "{err}");

    c.ok(&["create", "configmap", "held"]);
    c.ok(&[
        "patch",
        "cm",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/a"]}}"#,
    ]);
    c.ok(&["delete", "cm", "held", "--wait=false"]);
    let err = c.fails(&[
        "patch",
        "cm",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/a","example.com/b"]}}"#,
    ]);
    assert!(err.contains("metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"), "{err}");
    c.ok(&[
        "patch",
        "cm",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    let gone = c.fails(&["get", "cm", "held"]);
    assert!(gone.contains("NotFound"), "{gone}");
}

#[test]
fn kinds_no_controller_reads_are_still_validated() {
    let c = Cluster::start();
    let cases = [
        (
            "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: h}\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}\n  minReplicas: 5\n  maxReplicas: 2\n",
            "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`",
        ),
        (
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: b}\nspec: {minAvailable: 1, maxUnavailable: 1}\n",
            "minAvailable and maxUnavailable cannot be both set",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  ports: [{port: 70000}]\n",
            "spec.ports[0].port",
        ),
        (
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n    spec:\n      restartPolicy: Always\n      containers: [{name: c, image: busybox}]\n",
            "spec.template.spec.restartPolicy: Unsupported value",
        ),
    ];
    for (manifest, expected) in cases {
        let r = c.with_manifest(&["create"], manifest);
        assert!(!r.ok, "accepted:\n{manifest}");
        let err = r.stderr.replace('"', "");
        assert!(
            err.contains(&expected.replace('"', "")),
            "{manifest}\n{err}"
        );
    }
}

#[test]
fn paths_health_checks_and_discovery_order_match_upstream() {
    let c = Cluster::start();
    let err = c.fails(&["get", "--raw", "/api/v1/namespaces/default/namespaces"]);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    let err = c.fails(&["get", "--raw", "/api/v1/namespaces/default/nodes"]);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    for endpoint in ["readyz", "livez", "healthz"] {
        let out = c.ok(&["get", "--raw", &format!("/{endpoint}?verbose")]);
        assert!(out.contains("[+]ping ok"), "{out}");
        assert!(out.contains("[+]etcd ok"), "{out}");
        assert!(
            out.trim_end()
                .ends_with(&format!("{endpoint} check passed")),
            "{out}"
        );
        assert_eq!(c.ok(&["get", "--raw", &format!("/{endpoint}")]), "ok");
    }
    let out = c.ok(&["get", "--raw", "/readyz?verbose&exclude=etcd"]);
    assert!(out.contains("[+]etcd excluded: ok"), "{out}");
    assert_eq!(c.ok(&["get", "--raw", "/readyz/ping"]), "ok");

    for sort in [&[][..], &["--sort-by=name"][..]] {
        let mut args = vec!["api-resources", "--no-headers"];
        args.extend_from_slice(sort);
        let resources = c.ok(&args);
        let pods: Vec<&str> = resources
            .lines()
            .filter(|l| l.split_whitespace().next() == Some("pods"))
            .collect();
        assert!(pods.len() >= 2, "{resources}");
        assert!(pods[0].contains(" v1 "), "core pods first: {pods:?}");
    }
    let resources = c.ok(&["api-resources", "--no-headers"]);
    let first = resources.lines().next().unwrap_or_default();
    assert!(first.contains(" v1 "), "core group first: {first}");

    // A malformed exec is a 400 naming what is missing, never a 500.
    c.ok(&["run", "p", "--image=busybox", "--", "sleep", "3600"]);
    let err = c.fails(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/pods/p/exec?command=ls&stdout=False",
    ]);
    assert!(
        err.contains("you must specify at least 1 of stdin, stdout, stderr"),
        "{err}"
    );
    let err = c.fails(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/pods/p/exec?command=ls&stdout=maybe",
    ]);
    assert!(
        err.contains("BadRequest") || err.contains("invalid value for stdout"),
        "{err}"
    );
}

/// API correctness round 2 (issue 33), as kubectl and raw requests meet it.
#[test]
fn field_selectors_status_bodies_scope_and_terminating_namespaces_match_upstream() {
    let c = Cluster::start();
    // Upstream's field sets format unset booleans as "false": the e2e suite's first request.
    c.with_manifest(
        &["create"],
        "apiVersion: v1\nkind: Node\nmetadata: {name: plain}\n",
    );
    c.with_manifest(
        &["create"],
        "apiVersion: v1\nkind: Node\nmetadata: {name: cordoned}\nspec: {unschedulable: true}\n",
    );
    let schedulable = c.ok(&[
        "get",
        "nodes",
        "--field-selector",
        "spec.unschedulable=false",
        "-o",
        "name",
    ]);
    assert_eq!(schedulable.trim(), "node/plain", "{schedulable}");
    let cordoned = c.ok(&[
        "get",
        "nodes",
        "--field-selector",
        "spec.unschedulable=true",
        "-o",
        "name",
    ]);
    assert_eq!(cordoned.trim(), "node/cordoned", "{cordoned}");
    let unassigned = c.ok(&["get", "pods", "-A", "--field-selector", "spec.nodeName="]);
    assert!(!unassigned.contains("Error"), "{unassigned}");

    // Status bodies byte for byte as upstream encodes them.
    c.ok(&["create", "configmap", "dup"]);
    let client = c.client();
    let body = c.block_on(async {
        let req = http::Request::post("/api/v1/namespaces/default/configmaps")
            .header("Content-Type", "application/json")
            .body(br#"{"metadata":{"name":"dup"}}"#.to_vec())
            .unwrap();
        client.request_text(req).await.unwrap_err()
    });
    match body {
        kube::Error::Api(s) => {
            assert_eq!(
                (s.code, s.reason.as_str(), s.message.as_str()),
                (409, "AlreadyExists", r#"configmaps "dup" already exists"#)
            );
        }
        other => panic!("{other}"),
    }
    let raw = c.block_on(async {
        let req = http::Request::post("/api/v1/namespaces/default/configmaps")
            .header("Content-Type", "application/json")
            .body(br#"{"metadata":{"name":"dup"}}"#.to_vec())
            .unwrap();
        let resp = client
            .send(req.map(kube::client::Body::from))
            .await
            .unwrap();
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    });
    assert_eq!(
        raw,
        "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"configmaps \\\"dup\\\" already exists\",\"reason\":\"AlreadyExists\",\"details\":{\"name\":\"dup\",\"kind\":\"configmaps\"},\"code\":409}\n"
    );

    // A namespaced kind is created only under /namespaces/{ns}/.
    let r = c.kubectl_stdin(
        &["create", "--raw", "/api/v1/configmaps", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"nowhere","namespace":"default"}}"#),
    );
    assert!(!r.ok, "{}", r.stdout);
    assert!(r.stderr.contains("MethodNotAllowed"), "{}", r.stderr);
    assert!(
        c.kubectl(&["get", "configmap", "nowhere"])
            .stderr
            .contains("NotFound"),
        "the refused create wrote nothing"
    );

    // Label selectors are validated wherever they appear (upstream's ValidateLabelSelector).
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: pdb}\nspec:\n  minAvailable: 1\n  selector:\n    matchExpressions: [{key: app, operator: In}]\n"),
    );
    assert!(!r.ok, "{}", r.stdout);
    assert!(
        r.stderr.contains("spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"),
        "{}",
        r.stderr
    );
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np}\nspec:\n  podSelector:\n    matchExpressions: [{key: app, operator: Exists, values: [x]}]\n"),
    );
    assert!(
        !r.ok && r.stderr.contains("Forbidden: may not be specified"),
        "{}",
        r.stderr
    );

    // Go clients send an unset targetPort as 0: it defaults to the port, as upstream.
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"zero"},"spec":{"ports":[{"port":80,"targetPort":0}]}}"#),
    );
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(
        c.ok(&[
            "get",
            "service",
            "zero",
            "-o",
            "jsonpath={.spec.ports[0].targetPort}"
        ]),
        "80"
    );
    // Names are subdomains of up to 253 characters, without a limit per part.
    let long = format!("pod-{}", "a".repeat(70));
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {long}}}\nspec: {{containers: [{{name: c, image: busybox}}]}}\n"
        )),
    );
    assert!(r.ok, "{}", r.stderr);

    // An events.k8s.io event is selected by its reporting controller, also as core's source
    // (upstream's Events API spec).
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {name: event-test}\neventTime: \"2017-09-19T13:49:16.000000Z\"\nreportingController: test-controller\nreportingInstance: test-node\naction: Do\nreason: Test\ntype: Normal\nnote: This is event-test\nregarding: {namespace: default}\n"),
    );
    assert!(r.ok, "{}", r.stderr);
    let core = c.ok(&[
        "get",
        "events",
        "--field-selector",
        "source=test-controller",
        "-o",
        "name",
    ]);
    assert_eq!(core.trim(), "event/event-test", "{core}");
    let v1 = c.ok(&[
        "get",
        "--raw",
        "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=reportingController%3Dtest-controller",
    ]);
    assert!(v1.contains("\"name\":\"event-test\""), "{v1}");

    // A Service changed to ExternalName releases its address and node ports; changed back
    // to NodePort it gets new ones (upstream's type-change specs).
    c.ok(&["create", "service", "nodeport", "flip", "--tcp=80:80"]);
    let mut svc = json(&c, &["get", "service", "flip"]);
    svc["spec"]["type"] = serde_json::json!("ExternalName");
    svc["spec"]["externalName"] = serde_json::json!("flip.example.com");
    svc["spec"]["clusterIP"] = serde_json::json!("");
    svc["spec"]["clusterIPs"] = serde_json::Value::Null;
    let r = c.kubectl_stdin(&["replace", "-f", "-"], Some(&svc.to_string()));
    assert!(r.ok, "{}", r.stderr);
    let spec = json(&c, &["get", "service", "flip"])["spec"].clone();
    assert!(
        spec.get("clusterIP").is_none() && spec.get("ipFamilies").is_none(),
        "{spec}"
    );
    assert!(spec["ports"][0].get("nodePort").is_none(), "{spec}");
    let mut svc = json(&c, &["get", "service", "flip"]);
    svc["spec"]["type"] = serde_json::json!("NodePort");
    svc["spec"].as_object_mut().unwrap().remove("externalName");
    let r = c.kubectl_stdin(&["replace", "-f", "-"], Some(&svc.to_string()));
    assert!(r.ok, "{}", r.stderr);
    let spec = json(&c, &["get", "service", "flip"])["spec"].clone();
    // Allocated again, anywhere in the service range 10.96.0.0/12 (at random above its
    // static band, as upstream's allocator).
    assert!(
        spec["clusterIP"]
            .as_str()
            .and_then(|ip| ip.parse::<std::net::Ipv4Addr>().ok())
            .is_some_and(|ip| u32::from(ip) & 0xfff0_0000 == u32::from_be_bytes([10, 96, 0, 0])),
        "{spec}"
    );
    assert!(
        spec["ports"][0]["nodePort"]
            .as_u64()
            .is_some_and(|p| p >= 30000),
        "{spec}"
    );

    // A status update keeps the new object's annotations; a Deployment's keeps its old
    // labels (upstream's deployment status strategy), a Service's takes the new ones.
    c.ok(&["create", "configmap", "unused"]);
    c.ok(&["create", "deployment", "statused", "--image=busybox"]);
    c.ok(&[
        "patch",
        "deployment",
        "statused",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"metadata":{"annotations":{"patched-status":"yes"},"labels":{"test-deployment":"patched-status"}},"spec":{"replicas":7},"status":{"observedGeneration":1}}"#,
    ]);
    let d = json(&c, &["get", "deployment", "statused"]);
    assert_eq!(d["metadata"]["annotations"]["patched-status"], "yes", "{d}");
    assert_eq!(d["spec"]["replicas"], 1, "the spec stays: {d}");
    assert!(
        d["metadata"]["labels"].get("test-deployment").is_none(),
        "a Deployment's status update keeps its labels: {d}"
    );
    c.ok(&["create", "service", "clusterip", "statused", "--tcp=80"]);
    c.ok(&[
        "patch",
        "service",
        "statused",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"via":"status"}}}"#,
    ]);
    let svc = json(&c, &["get", "service", "statused"]);
    assert_eq!(svc["metadata"]["labels"]["via"], "status", "{svc}");

    // Table output of a backend without metadata (a review) is 406, as upstream.
    let code = c.block_on(async {
        let req = http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
            .header("Content-Type", "application/json")
            .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
            .body(kube::client::Body::from(
                br#"{"spec":{"nonResourceAttributes":{"path":"/","verb":"get"}}}"#.to_vec(),
            ))
            .unwrap();
        client.send(req).await.unwrap().status().as_u16()
    });
    assert_eq!(code, 406);

    // /version's gitCommit is a commit id (upstream's `kubectl version` spec checks its form).
    let version: serde_json::Value =
        serde_json::from_str(&c.ok(&["get", "--raw", "/version"])).unwrap();
    let commit = version["gitCommit"].as_str().unwrap_or_default();
    assert!(
        commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "{version}"
    );

    // node.k8s.io/v1 RuntimeClass is served (upstream's RuntimeClass API spec).
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: runc}\nhandler: runc\n"),
    );
    assert!(r.ok, "{}", r.stderr);
    assert!(
        c.ok(&["get", "runtimeclasses", "-o", "name"])
            .contains("runtimeclass.node.k8s.io/runc")
    );
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: bad}\nhandler: Not_A_Label\n"),
    );
    assert!(
        !r.ok && r.stderr.contains("handler: Invalid value"),
        "{}",
        r.stderr
    );

    // Creating in a terminating namespace: upstream's Forbidden, naming the object.
    c.ok(&["create", "namespace", "leaving"]);
    c.ok(&["create", "configmap", "keep", "-n", "leaving"]);
    c.ok(&["delete", "namespace", "leaving", "--wait=false"]);
    let r = c.kubectl_stdin(
        &["create", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: leaving}\n"),
    );
    assert!(!r.ok, "{}", r.stdout);
    let refused = r.stderr;
    assert!(
        refused.contains(
            r#"Error from server (Forbidden): error when creating "STDIN": configmaps "x" is forbidden: unable to create new content in namespace leaving because it is being terminated"#
        ),
        "{refused}"
    );
}

/// kubectl up to 1.26 validates and explains from the OpenAPI v2 document in gnostic's
/// protobuf; v2 writes references as `$ref` beside their description.
#[test]
fn openapi_v2_is_served_as_protobuf_with_direct_references() {
    let c = Cluster::start();
    let client = c.client();
    let (ctype, body) = c.block_on(async {
        let req = http::Request::get("/openapi/v2")
            .header(
                "Accept",
                "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
            )
            .body(kube::client::Body::empty())
            .unwrap();
        let resp = client.send(req).await.unwrap();
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_owned();
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (ctype, bytes.to_vec())
    });
    assert_eq!(ctype, "application/octet-stream");
    // Document.swagger (field 1) = "2.0".
    assert_eq!(&body[..5], b"\x0a\x032.0");
    let text = String::from_utf8_lossy(&body);
    for want in [
        "io.k8s.api.apps.v1.Deployment",
        "x-kubernetes-group-version-kind",
        "#/definitions/io.k8s.api.apps.v1.DeploymentSpec",
    ] {
        assert!(text.contains(want), "{want} missing");
    }
    let v2: serde_json::Value =
        serde_json::from_str(&c.ok(&["get", "--raw", "/openapi/v2"])).unwrap();
    let spec = &v2["definitions"]["io.k8s.api.apps.v1.Deployment"]["properties"]["spec"];
    assert_eq!(
        spec["$ref"], "#/definitions/io.k8s.api.apps.v1.DeploymentSpec",
        "{spec}"
    );
    // Each kind's PATCH names its group/version/kind and takes dryRun: kubectl 1.20's
    // dry-run verifier refuses `--dry-run=server` for a kind whose PATCH lacks it.
    let patch = &v2["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        serde_json::json!({"group": "", "kind": "Pod", "version": "v1"}),
        "{patch}"
    );
    assert!(
        patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "dryRun" && p["in"] == "query"),
        "{patch}"
    );
    assert!(text.contains("/apis/apps/v1/namespaces/{namespace}/deployments/{name}"));
    assert!(text.contains("dryRun"));
}

/// A CRD's defaults apply to objects read from storage too: a default added to the schema
/// after an object was written shows on read (upstream's CR defaulting spec).
#[test]
fn crd_defaults_apply_on_requests_and_on_read_from_storage() {
    let c = Cluster::start();
    let crd = |defaults: serde_json::Value| {
        serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.defaults.example.com"},
            "spec": {"group": "defaults.example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": defaults}}}}}]}})
        .to_string()
    };
    let r = c.with_manifest(
        &["apply"],
        &crd(serde_json::json!({"a": {"type": "string", "default": "A"}})),
    );
    assert!(r.ok, "{}", r.stderr);
    let cr = r#"{"apiVersion":"defaults.example.com/v1","kind":"Widget","metadata":{"name":"w"},"spec":{}}"#;
    let created = c.eventually(&["get", "crd", "widgets.defaults.example.com"], |_| true);
    assert!(created.contains("widgets"), "{created}");
    let mut ok = false;
    for _ in 0..50 {
        if c.with_manifest(&["create"], cr).ok {
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ok, "the CR is created once the CRD is served");
    assert_eq!(
        c.ok(&["get", "widget", "w", "-o", "jsonpath={.spec.a}"]),
        "A",
        "defaulted on the request"
    );
    let r = c.with_manifest(
        &["apply"],
        &crd(serde_json::json!({"a": {"type": "string", "default": "A"},
            "b": {"type": "string", "default": "B"}})),
    );
    assert!(r.ok, "{}", r.stderr);
    c.eventually(&["get", "widget", "w", "-o", "jsonpath={.spec.b}"], |s| {
        s == "B"
    });
    // Lists show it too.
    let list = c.ok(&["get", "widgets", "-o", "jsonpath={.items[0].spec.b}"]);
    assert_eq!(list, "B");
}

/// The `kubernetes` Service has an EndpointSlice as well as Endpoints, both at the
/// apiserver's advertised address: kube-proxy reads the slice, and without it pods could not
/// reach the API through the Service (upstream's sample-apiserver spec).
#[test]
fn the_kubernetes_service_has_endpoints_and_an_endpointslice() {
    let c = Cluster::start();
    let ep = c.ok(&[
        "get",
        "endpoints",
        "kubernetes",
        "-o",
        "jsonpath={.subsets[0].addresses[0].ip}:{.subsets[0].ports[0].port}",
    ]);
    let slice = c.ok(&[
        "get",
        "endpointslices",
        "-n",
        "default",
        "-l",
        "kubernetes.io/service-name=kubernetes",
        "-o",
        "jsonpath={.items[0].endpoints[0].addresses[0]}:{.items[0].ports[0].port}",
    ]);
    assert_eq!(slice, ep);
    assert!(ep.starts_with("127.0.0.1:"), "{ep}");
}

/// A kubelet's watch of its node's pods (`fieldSelector=spec.nodeName=<node>`, indexed in
/// the store: `store::watchindex`) sees every change of its node's pods, pods bound to it
/// included, and nothing of other nodes'; the watch of unscheduled pods (`spec.nodeName=`)
/// sees a pod leave when it is bound. A kubelet's LIST of its node's pods (read from the same
/// index at the latest revision) hands over its pods in every namespace and only them, in
/// pages. On the embedded store (indexed) and on etcd (not).
#[test]
fn a_watch_and_a_list_of_one_nodes_pods_see_its_pods_and_only_them() {
    for c in [Cluster::start(), Cluster::start_etcd()] {
        node_watch_sees_its_pods(&c);
        node_list_reads_its_pods(&c);
    }
}

fn node_list_reads_its_pods(c: &Cluster) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
    use serde_json::json;

    c.ok(&["create", "namespace", "node-list"]);
    let client = c.client();
    let create = |ns: &str, name: &str, node: &str| {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let p: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}))
        .unwrap();
        async move { pods.create(&PostParams::default(), &p).await.unwrap() }
    };
    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.unwrap(),
                    p.metadata.name.unwrap()
                )
            })
            .collect()
    };
    c.block_on(async {
        create("default", "l1", "ln1").await;
        create("node-list", "l2", "ln1").await;
        create("node-list", "l3", "ln2").await;
        let all: Api<Pod> = Api::all(client.clone());
        let on_ln1 = ListParams::default().fields("spec.nodeName=ln1");
        assert_eq!(
            names(all.list(&on_ln1).await.unwrap()),
            ["default/l1", "node-list/l2"]
        );
        // As kube-runtime's watcher lists: resourceVersion=0, in pages.
        let first = all
            .list(&ListParams {
                resource_version: Some("0".into()),
                ..on_ln1.clone().limit(1)
            })
            .await
            .unwrap();
        let mut token = first.metadata.continue_.clone().expect("a second page");
        let mut pages = vec![names(first)];
        // Then read at the first page's revision; as upstream's, a page may end with a
        // token while keys remain after it, matching or not.
        while !token.is_empty() {
            let page = all
                .list(&on_ln1.clone().limit(1).continue_token(&token))
                .await
                .unwrap();
            token = page.metadata.continue_.clone().unwrap_or_default();
            pages.push(names(page));
        }
        pages.retain(|p| !p.is_empty());
        assert_eq!(pages, [["default/l1"], ["node-list/l2"]]);
        let in_ns: Api<Pod> = Api::namespaced(client.clone(), "node-list");
        assert_eq!(names(in_ns.list(&on_ln1).await.unwrap()), ["node-list/l2"]);
        // A pod's status changes and it is deleted: the LIST follows.
        in_ns
            .patch_status(
                "l2",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running"}})),
            )
            .await
            .unwrap();
        let l2 = all.list(&on_ln1).await.unwrap();
        assert_eq!(
            l2.items[1].status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Running")
        );
        let dp = DeleteParams::default().grace_period(0);
        Api::<Pod>::namespaced(client.clone(), "default")
            .delete("l1", &dp)
            .await
            .unwrap();
        assert_eq!(names(all.list(&on_ln1).await.unwrap()), ["node-list/l2"]);
        // Also when another field is asked for as well.
        let both = ListParams::default().fields("spec.nodeName=ln1,metadata.name=l3");
        assert!(all.list(&both).await.unwrap().items.is_empty());
        for p in ["l2", "l3"] {
            in_ns.delete(p, &dp).await.unwrap();
        }
    });
}

fn node_watch_sees_its_pods(c: &Cluster) {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
    use serde_json::json;

    let client = c.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, node: Option<&str>| -> Pod {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        serde_json::from_value(p).unwrap()
    };
    c.block_on(async {
        let pending = pods
            .create(&PostParams::default(), &pod("pending", None))
            .await
            .unwrap();
        let from = pending.metadata.resource_version.unwrap();
        let watch = |selector: &str| {
            let wp = WatchParams::default().fields(selector).timeout(20);
            let pods = pods.clone();
            let from = from.clone();
            async move { pods.watch(&wp, &from).await.unwrap().boxed() }
        };
        let mut n1 = watch("spec.nodeName=n1").await;
        let mut unscheduled = watch("spec.nodeName=").await;
        // A node none of the pods is on: its watch ends after 4 s with a bookmark.
        let mut quiet = {
            let mut wp = WatchParams::default().fields("spec.nodeName=n9").timeout(4);
            wp.bookmarks = true;
            pods.watch(&wp, &from).await.unwrap().boxed()
        };

        pods.create(&PostParams::default(), &pod("a", Some("n1")))
            .await
            .unwrap();
        pods.create(&PostParams::default(), &pod("b", Some("n2")))
            .await
            .unwrap();
        // Bound as the scheduler binds: onto n1, off the unscheduled pods.
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "pending"},
            "target": {"kind": "Node", "name": "n1"}});
        let req = http::Request::post("/api/v1/namespaces/default/pods/pending/binding")
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&binding).unwrap())
            .unwrap();
        client.request_text(req).await.unwrap();
        pods.patch_status(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
        let a_running = pods
            .patch_status(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running"}})),
            )
            .await
            .unwrap();
        let a_running: u64 = a_running
            .metadata
            .resource_version
            .unwrap()
            .parse()
            .unwrap();
        pods.delete("a", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();

        let mut seen = Vec::new();
        while seen.len() < 4 {
            let ev = tokio::time::timeout(std::time::Duration::from_secs(10), n1.try_next())
                .await
                .expect("n1's watch hands over its pods' changes")
                .unwrap()
                .expect("the watch goes on");
            match ev {
                WatchEvent::Added(p) => seen.push(format!("ADDED {}", p.metadata.name.unwrap())),
                WatchEvent::Modified(p) => {
                    seen.push(format!("MODIFIED {}", p.metadata.name.unwrap()))
                }
                WatchEvent::Deleted(p) => {
                    seen.push(format!("DELETED {}", p.metadata.name.unwrap()))
                }
                WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(
            seen,
            ["ADDED a", "ADDED pending", "MODIFIED a", "DELETED a"],
            "n1's watch: its pods' changes in order, none of n2's"
        );
        let left = tokio::time::timeout(std::time::Duration::from_secs(5), unscheduled.next())
            .await
            .expect("the unscheduled pods' watch sees the bound pod leave")
            .unwrap()
            .unwrap();
        match left {
            WatchEvent::Deleted(p) => assert_eq!(p.metadata.name.as_deref(), Some("pending")),
            other => panic!("expected the bound pod to leave the unscheduled pods: {other:?}"),
        }
        // The quiet watch's last word is a bookmark at least as recent as the changes made
        // while it watched (indexed, it was handed none of them: the store told it its
        // progress), so a client starting again from it is not sent back to list.
        let mut last = None;
        while let Some(ev) = tokio::time::timeout(std::time::Duration::from_secs(10), quiet.next())
            .await
            .expect("the watch ends at its timeout")
        {
            last = Some(ev.unwrap());
        }
        match last {
            Some(WatchEvent::Bookmark(b)) => {
                let rv: u64 = b.metadata.resource_version.parse().unwrap();
                assert!(rv >= a_running, "bookmark {rv} older than {a_running}");
            }
            other => panic!("expected a last bookmark: {other:?}"),
        }
        pods.delete("b", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        pods.delete("pending", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    });
}

//! The stock kubectl against a freshly started minik8s apiserver: discovery, OpenAPI, the
//! everyday verbs, output formats, Table columns, watches and the error cases.

use minik8s_conformance::Cluster;
use std::time::Duration;

#[test]
fn discovery_lists_resources_versions_and_explains_fields() {
    let c = Cluster::start();
    let v = c.ok(&["version", "-o", "json"]);
    assert!(v.contains("\"minor\": \"33\""), "{v}");
    let resources = c.ok(&["api-resources"]);
    for line in [
        "deployments",
        "deploy",
        "apps/v1",
        "pods",
        "po",
        "customresourcedefinitions",
        "crd,crds",
        "leases",
    ] {
        assert!(resources.contains(line), "{line} missing:\n{resources}");
    }
    let versions = c.ok(&["api-versions"]);
    for gv in [
        "apps/v1",
        "batch/v1",
        "autoscaling/v2",
        "rbac.authorization.k8s.io/v1",
        "v1",
    ] {
        assert!(
            versions.lines().any(|l| l == gv),
            "{gv} missing:\n{versions}"
        );
    }
    let explain = c.ok(&["explain", "pods.spec.containers"]);
    assert!(
        explain.contains("FIELD: containers <[]Container>"),
        "{explain}"
    );
    assert!(c.ok(&["get", "all"]).contains("service/kubernetes"));
    assert!(c.ok(&["get", "ns"]).contains("kube-system"));
}

#[test]
fn every_kind_with_a_create_verb_can_be_created_read_described_and_deleted() {
    let c = Cluster::start();
    let cases: &[(&[&str], &str)] = &[
        (
            &["create", "configmap", "cm1", "--from-literal=a=b"],
            "configmap/cm1",
        ),
        (
            &["create", "secret", "generic", "s1", "--from-literal=p=q"],
            "secret/s1",
        ),
        (&["create", "namespace", "team"], "namespace/team"),
        (&["create", "serviceaccount", "bot"], "serviceaccount/bot"),
        (
            &[
                "create",
                "deployment",
                "web",
                "--image=busybox",
                "--replicas=3",
            ],
            "deployment.apps/web",
        ),
        (
            &["create", "service", "clusterip", "svc1", "--tcp=80:8080"],
            "service/svc1",
        ),
        (
            &["create", "service", "nodeport", "svc2", "--tcp=80:8080"],
            "service/svc2",
        ),
        (&["create", "job", "j1", "--image=busybox"], "job.batch/j1"),
        (
            &[
                "create",
                "cronjob",
                "cj1",
                "--image=busybox",
                "--schedule=*/5 * * * *",
            ],
            "cronjob.batch/cj1",
        ),
        (
            &["create", "role", "r1", "--verb=get", "--resource=pods"],
            "role.rbac.authorization.k8s.io/r1",
        ),
        (
            &["create", "rolebinding", "rb1", "--role=r1", "--user=alice"],
            "rolebinding.rbac.authorization.k8s.io/rb1",
        ),
        (
            &[
                "create",
                "clusterrole",
                "cr1",
                "--verb=list",
                "--resource=nodes",
            ],
            "clusterrole.rbac.authorization.k8s.io/cr1",
        ),
        (
            &[
                "create",
                "clusterrolebinding",
                "crb1",
                "--clusterrole=cr1",
                "--group=devs",
            ],
            "clusterrolebinding.rbac.authorization.k8s.io/crb1",
        ),
        (
            &["create", "quota", "q1", "--hard=pods=10"],
            "resourcequota/q1",
        ),
        (
            &["create", "priorityclass", "pc1", "--value=1000"],
            "priorityclass.scheduling.k8s.io/pc1",
        ),
        (
            &[
                "create",
                "poddisruptionbudget",
                "pdb1",
                "--selector=app=web",
                "--min-available=1",
            ],
            "poddisruptionbudget.policy/pdb1",
        ),
        (
            &["create", "ingress", "ing1", "--rule=example.com/=svc1:80"],
            "ingress.networking.k8s.io/ing1",
        ),
        (
            &["run", "p1", "--image=busybox", "--restart=Never"],
            "pod/p1",
        ),
    ];
    for (create, name) in cases {
        let out = c.ok(create);
        assert!(
            out.contains(&format!("{name} created")),
            "{create:?}: {out}"
        );
        let got = c.ok(&["get", name]);
        let short = name.split('/').nth(1).unwrap();
        assert!(
            got.lines().nth(1).is_some_and(|l| l.starts_with(short)),
            "{name}: {got}"
        );
        let described = c.ok(&["describe", name]);
        assert!(described.contains(short), "{name}: {described}");
    }
    for (_, name) in cases.iter().rev() {
        let out = c.ok(&["delete", name, "--wait=false"]);
        assert!(out.contains("deleted"), "{name}: {out}");
        if name.starts_with("namespace/") {
            // As upstream, a namespace terminates until the namespace controller has
            // emptied and finalized it.
            c.run_controllers(0);
            c.eventually(&["get", "namespaces", "-o", "name"], |o| !o.contains(name));
            continue;
        }
        let gone = c.fails(&["get", name]);
        assert!(gone.contains("NotFound"), "{name}: {gone}");
    }
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
  labels: {tier: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      containers:
      - name: c
        image: busybox:1
        env: [{name: A, value: "1"}]
"#;

#[test]
fn apply_then_edit_and_apply_again_lands_the_change_and_updates_last_applied() {
    let c = Cluster::start();
    let r = c.with_manifest(&["apply"], DEPLOYMENT);
    assert!(
        r.ok && r.stdout.contains("deployment.apps/app created"),
        "{r:?}"
    );
    let edited = DEPLOYMENT
        .replace("replicas: 2", "replicas: 4")
        .replace("busybox:1", "busybox:2");
    let r = c.with_manifest(&["diff"], &edited);
    assert!(
        r.stdout.contains("busybox:2"),
        "diff shows the change: {r:?}"
    );
    let r = c.with_manifest(&["apply"], &edited);
    assert!(r.ok && r.stdout.contains("configured"), "{r:?}");
    let got = c.ok(&[
        "get",
        "deploy",
        "app",
        "-o",
        "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(got, "4 busybox:2");
    let last = c.ok(&[
        "get",
        "deploy",
        "app",
        "-o",
        "jsonpath={.metadata.annotations.kubectl\\.kubernetes\\.io/last-applied-configuration}",
    ]);
    assert!(
        last.contains("busybox:2") && last.contains("\"replicas\":4"),
        "{last}"
    );
    // Server-side dry run changes nothing.
    let dry = edited.replace("replicas: 4", "replicas: 9");
    let r = c.with_manifest(&["apply", "--dry-run=server"], &dry);
    assert!(r.ok && r.stdout.contains("(server dry run)"), "{r:?}");
    assert_eq!(
        c.ok(&["get", "deploy", "app", "-o", "jsonpath={.spec.replicas}"]),
        "4"
    );
    // create -f of an existing object is 409, replace -f works.
    let r = c.with_manifest(&["create"], &edited);
    assert!(!r.ok && r.stderr.contains("AlreadyExists"), "{r:?}");
    let r = c.with_manifest(&["replace"], &edited);
    assert!(r.ok && r.stdout.contains("replaced"), "{r:?}");
}

#[test]
fn patch_label_annotate_scale_set_image_and_rollout_restart_work() {
    let c = Cluster::start();
    c.ok(&["create", "configmap", "cm", "--from-literal=a=1"]);
    c.ok(&[
        "patch",
        "cm",
        "cm",
        "--type=merge",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ]);
    c.ok(&[
        "patch",
        "cm",
        "cm",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/data/c","value":"3"}]"#,
    ]);
    assert_eq!(
        c.ok(&["get", "cm", "cm", "-o", "jsonpath={.data}"]),
        r#"{"a":"1","b":"2","c":"3"}"#
    );
    c.with_manifest(&["apply"], DEPLOYMENT);
    c.ok(&[
        "patch",
        "deploy",
        "app",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"busybox:3"}]}}}}"#,
    ]);
    // Strategic merge: the container merged by name, its env kept.
    assert_eq!(
        c.ok(&["get", "deploy", "app", "-o", "jsonpath={.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].env[0].name}"]),
        "busybox:3 A"
    );
    c.ok(&["label", "cm", "cm", "team=x"]);
    c.ok(&["annotate", "cm", "cm", "note=hello"]);
    assert_eq!(
        c.ok(&["get", "cm", "-l", "team=x", "-o", "name"]).trim(),
        "configmap/cm"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "cm",
            "cm",
            "-o",
            "jsonpath={.metadata.annotations.note}"
        ]),
        "hello"
    );
    c.ok(&["scale", "deploy", "app", "--replicas=5"]);
    assert_eq!(
        c.ok(&["get", "deploy", "app", "-o", "jsonpath={.spec.replicas}"]),
        "5"
    );
    c.ok(&["set", "image", "deploy/app", "c=busybox:4"]);
    assert_eq!(
        c.ok(&[
            "get",
            "deploy",
            "app",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}"
        ]),
        "busybox:4"
    );
    let gen_before: u64 = c
        .ok(&[
            "get",
            "deploy",
            "app",
            "-o",
            "jsonpath={.metadata.generation}",
        ])
        .parse()
        .unwrap();
    c.ok(&["rollout", "restart", "deploy/app"]);
    let restarted = c.ok(&[
        "get",
        "deploy",
        "app",
        "-o",
        "jsonpath={.spec.template.metadata.annotations.kubectl\\.kubernetes\\.io/restartedAt}",
    ]);
    assert!(!restarted.is_empty(), "the template annotation is set");
    let gen_after: u64 = c
        .ok(&[
            "get",
            "deploy",
            "app",
            "-o",
            "jsonpath={.metadata.generation}",
        ])
        .parse()
        .unwrap();
    assert_eq!(
        gen_after,
        gen_before + 1,
        "a template change bumps generation"
    );
    // Labels do not bump generation.
    c.ok(&["label", "deploy", "app", "x=y"]);
    assert_eq!(
        c.ok(&[
            "get",
            "deploy",
            "app",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        gen_after.to_string()
    );
}

#[test]
fn output_formats_and_default_table_columns_match_upstream() {
    let c = Cluster::start();
    c.ok(&[
        "create",
        "configmap",
        "cm",
        "--from-literal=a=1",
        "--from-literal=b=2",
    ]);
    c.ok(&["create", "secret", "generic", "s", "--from-literal=p=q"]);
    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=3",
    ]);
    c.ok(&["create", "service", "nodeport", "np", "--tcp=80:8080"]);
    c.ok(&["run", "p", "--image=busybox", "--restart=Never"]);
    let header = |args: &[&str]| {
        c.ok(args)
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(header(&["get", "pods"]), "NAME READY STATUS RESTARTS AGE");
    assert_eq!(
        header(&["get", "pods", "-o", "wide"]),
        "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES"
    );
    assert_eq!(
        header(&["get", "deploy"]),
        "NAME READY UP-TO-DATE AVAILABLE AGE"
    );
    assert_eq!(
        header(&["get", "svc"]),
        "NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE"
    );
    assert_eq!(header(&["get", "cm"]), "NAME DATA AGE");
    assert_eq!(header(&["get", "secrets"]), "NAME TYPE DATA AGE");
    assert_eq!(header(&["get", "ns"]), "NAME STATUS AGE");
    let pods = c.ok(&["get", "pods"]);
    assert!(pods.contains("0/1") && pods.contains("Pending"), "{pods}");
    let svc = c.ok(&["get", "svc", "np"]);
    assert!(svc.contains("NodePort") && svc.contains("80:3"), "{svc}");
    assert!(
        c.ok(&["get", "cm", "cm"])
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .nth(1)
            == Some("2")
    );
    let json: serde_json::Value =
        serde_json::from_str(&c.ok(&["get", "cm", "cm", "-o", "json"])).unwrap();
    assert_eq!(json["data"]["b"], "2");
    assert!(
        c.ok(&["get", "cm", "cm", "-o", "yaml"])
            .contains("kind: ConfigMap")
    );
    assert_eq!(
        c.ok(&["get", "cm", "cm", "-o", "name"]).trim(),
        "configmap/cm"
    );
    assert_eq!(
        c.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "3"
    );
    let cc = c.ok(&[
        "get",
        "cm",
        "-o",
        "custom-columns=N:.metadata.name,A:.data.a",
    ]);
    assert!(
        cc.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["cm", "1"]),
        "{cc}"
    );
    // Selectors, set-based and field.
    c.ok(&["label", "cm", "cm", "env=prod"]);
    assert!(
        c.ok(&["get", "cm", "-l", "env in (prod,dev)", "-o", "name"])
            .contains("configmap/cm")
    );
    assert!(
        !c.ok(&["get", "cm", "-l", "env!=prod", "-o", "name"])
            .contains("configmap/cm")
    );
    assert_eq!(
        c.ok(&[
            "get",
            "cm",
            "--field-selector",
            "metadata.name=cm",
            "-o",
            "name"
        ])
        .trim(),
        "configmap/cm"
    );
    assert!(
        c.ok(&[
            "get",
            "pods",
            "--field-selector",
            "status.phase=Pending",
            "-o",
            "name"
        ])
        .contains("pod/p")
    );
    assert!(
        c.fails(&["get", "pods", "--field-selector", "spec.bogus=x"])
            .contains("field label not supported")
    );
    // Pagination through kubectl's chunking.
    for i in 0..7 {
        c.ok(&["create", "configmap", &format!("page-{i}")]);
    }
    let paged = c.ok(&["get", "cm", "--chunk-size=2", "-o", "name"]);
    assert_eq!(
        paged.lines().filter(|l| l.contains("page-")).count(),
        7,
        "{paged}"
    );
}

#[test]
fn get_watch_prints_a_change() {
    let c = Cluster::start();
    c.ok(&["create", "configmap", "w", "--from-literal=a=1"]);
    let mut child = std::process::Command::new("kubectl")
        .args([
            "get",
            "cm",
            "w",
            "-w",
            "-o",
            "jsonpath={.data.a}{\"\\n\"}",
            "--request-timeout=10s",
        ])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    c.ok(&[
        "patch",
        "cm",
        "w",
        "--type=merge",
        "-p",
        r#"{"data":{"a":"2"}}"#,
    ]);
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().collect::<Vec<_>>(), ["1", "2"], "{text}");
}

#[test]
fn error_cases_return_upstream_statuses() {
    let c = Cluster::start();
    assert!(
        c.fails(&["get", "cm", "nope"])
            .contains("Error from server (NotFound): configmaps \"nope\" not found")
    );
    c.ok(&["create", "configmap", "dup"]);
    assert!(
        c.fails(&["create", "configmap", "dup"])
            .contains("configmaps \"dup\" already exists")
    );
    // A stale resourceVersion is a 409 Conflict.
    let stale = c.ok(&["get", "cm", "dup", "-o", "json"]);
    c.ok(&["label", "cm", "dup", "x=1"]);
    let r = c.with_manifest(&["replace"], &stale);
    assert!(
        !r.ok && r.stderr.contains("Conflict") && r.stderr.contains("the object has been modified"),
        "{r:?}"
    );
    let bad = c.fails(&["create", "configmap", "Bad_Name"]);
    assert!(
        bad.contains("is invalid") && bad.contains("metadata.name"),
        "{bad}"
    );
    let r = c.with_manifest(
        &["create"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nspec: {x: 1}\n",
    );
    assert!(
        !r.ok
            && r.stderr
                .contains("strict decoding error: unknown field \"spec\""),
        "{r:?}"
    );
    // Without credentials: 401.
    let out = std::process::Command::new("kubectl")
        .args([
            "get",
            "ns",
            "--server",
            &c.url,
            "--insecure-skip-tls-verify",
            "--token=wrong",
        ])
        .env("HOME", c.dir())
        .env("KUBECONFIG", "/dev/null")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Unauthorized"),
        "{err}"
    );
}

#[test]
fn versions_of_one_resource_share_their_objects() {
    let c = Cluster::start();
    c.ok(&["create", "deployment", "web", "--image=busybox"]);
    c.ok(&["autoscale", "deploy", "web", "--max=5", "--cpu-percent=60"]);
    assert_eq!(
        c.ok(&[
            "get",
            "horizontalpodautoscalers.v1.autoscaling",
            "web",
            "-o",
            "jsonpath={.spec.targetCPUUtilizationPercentage}"
        ]),
        "60"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "horizontalpodautoscalers.v2.autoscaling",
            "web",
            "-o",
            "jsonpath={.spec.metrics[0].resource.target.averageUtilization}"
        ]),
        "60"
    );
    let event = r#"
apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: e1}
eventTime: "2026-01-01T00:00:00.000000Z"
reportingController: test/controller
reportingInstance: test-1
action: Testing
reason: Checked
type: Normal
note: hello from events.k8s.io
regarding: {kind: Deployment, name: web, namespace: default}
"#;
    let r = c.with_manifest(&["create"], event);
    assert!(r.ok, "{r:?}");
    assert_eq!(
        c.ok(&[
            "get",
            "events.v1.",
            "e1",
            "-o",
            "jsonpath={.message} {.involvedObject.name}"
        ]),
        "hello from events.k8s.io web"
    );
    let listed = c.ok(&["get", "events"]);
    assert!(
        listed.contains("Checked") && listed.contains("deployment/web"),
        "{listed}"
    );
}

#[test]
fn a_crd_serves_its_resource_with_schema_columns_subresources_and_cleanup() {
    let c = Cluster::start();
    let r = c.with_manifest(&["apply"], include_str!("crontab-crd.yaml"));
    assert!(r.ok, "{r:?}");
    assert_eq!(
        c.ok(&[
            "get",
            "crd",
            "crontabs.stable.example.com",
            "-o",
            "jsonpath={.status.conditions[*].type}"
        ]),
        "NamesAccepted Established"
    );
    // Served within a second of the CRD's creation.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while !c.kubectl(&["get", "crontabs"]).ok {
        assert!(
            std::time::Instant::now() < deadline,
            "crontabs not served within 1 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let cr = "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata: {name: c1}\nspec: {cronSpec: \"* * * * */5\", image: my-cron}\n";
    assert!(c.with_manifest(&["apply"], cr).ok);
    let header = c.ok(&["get", "crontabs"]);
    assert!(
        header
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            == ["NAME", "SPEC", "REPLICAS", "AGE"],
        "{header}"
    );
    assert!(header.contains("* * * * */5"), "{header}");
    assert_eq!(
        c.ok(&["get", "ct", "c1", "-o", "jsonpath={.spec.replicas}"]),
        "1",
        "the schema default is filled"
    );
    assert!(c.ok(&["explain", "crontab.spec"]).contains("the schedule"));
    // A custom resource's metadata is described as upstream's (its CRD publish spec reads
    // "Standard object's metadata" from `kubectl explain <crd>.metadata`).
    let meta = c.ok(&["explain", "crontab.metadata"]);
    assert!(
        meta.contains("Standard object's metadata") && meta.contains("creationTimestamp"),
        "{meta}"
    );
    // A wrong type is 422; an unknown field is pruned when validation is off, rejected when strict.
    let wrong = "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata: {name: c2}\nspec: {cronSpec: 5}\n";
    let r = c.with_manifest(&["apply"], wrong);
    assert!(
        !r.ok && r.stderr.contains("is invalid") && r.stderr.contains("must be of type string"),
        "{r:?}"
    );
    let unknown = "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata: {name: c3}\nspec: {cronSpec: x, bogus: 1}\n";
    let r = c.with_manifest(&["apply"], unknown);
    assert!(
        !r.ok && r.stderr.contains("unknown field \"spec.bogus\""),
        "{r:?}"
    );
    assert!(c.with_manifest(&["apply", "--validate=false"], unknown).ok);
    assert_eq!(
        c.ok(&["get", "ct", "c3", "-o", "jsonpath={.spec}"]),
        r#"{"cronSpec":"x","replicas":1}"#
    );
    // scale and status subresources.
    c.ok(&["scale", "ct", "c1", "--replicas=3"]);
    assert_eq!(
        c.ok(&["get", "ct", "c1", "-o", "jsonpath={.spec.replicas}"]),
        "3"
    );
    // The scale subresource records its writer in managedFields.
    let scaled = c.ok(&[
        "get",
        "ct",
        "c1",
        "--show-managed-fields",
        "-o",
        r#"jsonpath={range .metadata.managedFields[?(@.subresource=="scale")]}{.operation} {.fieldsV1}{end}"#,
    ]);
    assert_eq!(scaled, r#"Update {"f:spec":{"f:replicas":{}}}"#);
    c.ok(&[
        "patch",
        "ct",
        "c1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":3}}"#,
    ]);
    assert_eq!(
        c.ok(&["get", "ct", "c1", "-o", "jsonpath={.status.replicas}"]),
        "3"
    );
    // The main resource ignores status changes.
    c.ok(&[
        "patch",
        "ct",
        "c1",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":9}}"#,
    ]);
    assert_eq!(
        c.ok(&["get", "ct", "c1", "-o", "jsonpath={.status.replicas}"]),
        "3"
    );
    assert!(
        c.ok(&["get", "all"])
            .contains("crontab.stable.example.com/c1")
    );
    // Deleting the CRD removes the resource and its objects.
    c.ok(&["delete", "crd", "crontabs.stable.example.com"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!c.kubectl(&["get", "crontabs"]).ok);
    assert!(
        c.with_manifest(&["apply"], include_str!("crontab-crd.yaml"))
            .ok
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        c.ok(&["get", "crontabs", "-o", "name"]).trim().is_empty(),
        "no objects survive the CRD"
    );
}

#[test]
fn rbac_forbids_unbound_users_and_a_rolebinding_grants_view_in_one_namespace() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "team"]);
    let alice = c.user_kubeconfig("alice", &["dev"]);
    let r = c.kubectl_as(&alice, &["get", "pods", "-n", "team"]);
    assert!(!r.ok && r.stderr.contains("Error from server (Forbidden): pods is forbidden: User \"alice\" cannot list resource \"pods\" in API group \"\" in the namespace \"team\""), "{r:?}");
    let whoami = c.kubectl_as(&alice, &["auth", "whoami"]);
    assert!(
        whoami.ok && whoami.stdout.contains("alice") && whoami.stdout.contains("dev"),
        "{whoami:?}"
    );
    c.ok(&[
        "create",
        "rolebinding",
        "alice-view",
        "--clusterrole=view",
        "--user=alice",
        "-n",
        "team",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    let yes = c.kubectl_as(&alice, &["auth", "can-i", "list", "pods", "-n", "team"]);
    assert_eq!(yes.stdout.trim(), "yes", "{yes:?}");
    let no = c.kubectl_as(&alice, &["auth", "can-i", "create", "pods", "-n", "team"]);
    assert_eq!(no.stdout.trim(), "no", "{no:?}");
    let other = c.kubectl_as(&alice, &["auth", "can-i", "list", "pods", "-n", "default"]);
    assert_eq!(other.stdout.trim(), "no", "{other:?}");
    assert!(c.kubectl_as(&alice, &["get", "pods", "-n", "team"]).ok);
    assert!(!c.kubectl_as(&alice, &["get", "secrets", "-n", "team"]).ok);
    // The admin (system:masters) can do anything, including impersonating alice; alice cannot impersonate.
    assert_eq!(c.ok(&["auth", "can-i", "delete", "nodes"]).trim(), "yes");
    let as_alice = c.kubectl(&[
        "auth",
        "can-i",
        "create",
        "pods",
        "-n",
        "team",
        "--as=alice",
    ]);
    assert_eq!(as_alice.stdout.trim(), "no");
    assert!(
        c.ok(&["auth", "whoami", "--as=bob", "--as-group=devs"])
            .contains("bob")
    );
    let r = c.kubectl_as(&alice, &["get", "pods", "-n", "team", "--as=bob"]);
    assert!(
        !r.ok && r.stderr.contains("cannot impersonate resource \"users\""),
        "{r:?}"
    );
    // A role limited to one ConfigMap by name allows listing (and watching) it through a
    // field selector on its name, and nothing wider (upstream's extension apiservers read
    // kube-system/extension-apiserver-authentication this way).
    c.ok(&["create", "configmap", "one", "-n", "team"]);
    c.ok(&["create", "configmap", "other", "-n", "team"]);
    c.ok(&[
        "create",
        "role",
        "one-reader",
        "--verb=get,list,watch",
        "--resource=configmaps",
        "--resource-name=one",
        "-n",
        "team",
    ]);
    c.ok(&[
        "create",
        "rolebinding",
        "bob-one",
        "--role=one-reader",
        "--user=bob",
        "-n",
        "team",
    ]);
    let bob = c.user_kubeconfig("bob", &[]);
    std::thread::sleep(Duration::from_millis(300));
    let one = c.kubectl_as(
        &bob,
        &[
            "get",
            "configmaps",
            "-n",
            "team",
            "--field-selector",
            "metadata.name=one",
            "-o",
            "name",
        ],
    );
    assert_eq!(one.stdout.trim(), "configmap/one", "{one:?}");
    let all = c.kubectl_as(&bob, &["get", "configmaps", "-n", "team"]);
    assert!(!all.ok && all.stderr.contains("Forbidden"), "{all:?}");
    let other = c.kubectl_as(
        &bob,
        &[
            "get",
            "configmaps",
            "-n",
            "team",
            "--field-selector",
            "metadata.name=other",
        ],
    );
    assert!(!other.ok && other.stderr.contains("Forbidden"), "{other:?}");
}

#[test]
fn the_audit_log_records_every_request() {
    let c = Cluster::start();
    c.ok(&["create", "configmap", "audited", "--from-literal=a=1"]);
    c.ok(&["get", "configmap", "audited"]);
    let _ = c.kubectl(&["get", "configmap", "missing"]);
    c.ok(&["delete", "configmap", "audited"]);
    std::thread::sleep(Duration::from_millis(300));
    let events = c.audit_events();
    let find = |verb: &str, name: &str, code: u64| {
        events.iter().any(|e| {
            e["verb"] == verb
                && e["objectRef"]["name"] == name
                && e["responseStatus"]["code"] == code
                && e["user"]["username"] == "minik8s-admin"
        })
    };
    assert!(
        events.iter().any(|e| e["verb"] == "create"
            && e["objectRef"]["resource"] == "configmaps"
            && e["responseStatus"]["code"] == 201),
        "create missing"
    );
    assert!(find("get", "audited", 200), "get missing");
    assert!(find("get", "missing", 404), "404 missing");
    assert!(find("delete", "audited", 200), "delete missing");
    // Discovery requests are audited too.
    assert!(events.iter().any(|e| {
        e["requestURI"]
            .as_str()
            .is_some_and(|u| u.starts_with("/api"))
    }));
}

#[test]
fn service_account_tokens_authenticate_until_they_expire() {
    let c = Cluster::start();
    c.ok(&["create", "namespace", "apps"]);
    assert!(
        c.ok(&["get", "serviceaccounts", "-n", "apps"])
            .contains("default"),
        "each namespace gets a default ServiceAccount"
    );
    let token = c
        .ok(&["create", "token", "default", "--duration=3s"])
        .trim()
        .to_owned();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let bad = c.with_manifest(
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/default/serviceaccounts/default/token",
        ],
        "[1, 2, 3]",
    );
    assert!(
        !bad.ok && bad.stderr.contains("BadRequest"),
        "a TokenRequest that is not an object is refused: {}",
        bad.stderr
    );
    let whoami = |token: &str| {
        std::process::Command::new("kubectl")
            .args([
                "auth",
                "whoami",
                "--server",
                &c.url,
                "--insecure-skip-tls-verify",
                "--token",
                token,
            ])
            .env("HOME", c.dir())
            .env("KUBECONFIG", "/dev/null")
            .output()
            .unwrap()
    };
    let out = whoami(&token);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.contains("system:serviceaccount:default:default")
            && text.contains("system:serviceaccounts:default"),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A TokenReview (what webhook token authenticators send) says who the token is.
    let review = |token: &str| {
        let r = c.with_manifest(
            &["create", "-o", "json"],
            &format!(
                "{{\"apiVersion\": \"authentication.k8s.io/v1\", \"kind\": \"TokenReview\", \"spec\": {{\"token\": \"{token}\"}}}}"
            ),
        );
        assert!(r.ok, "{r:?}");
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap()["status"].clone()
    };
    // (a token of its own: the 3-second one may be near its end by now)
    let live = c.ok(&["create", "token", "default"]).trim().to_owned();
    let status = review(&live);
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(
        status["user"]["username"], "system:serviceaccount:default:default",
        "{status}"
    );
    assert!(status.get("error").is_none(), "{status}");
    // The token's id, as upstream's authenticator reports it.
    let ids = &status["user"]["extra"]["authentication.kubernetes.io/credential-id"];
    assert!(
        ids.as_array().is_some_and(|a| a.len() == 1
            && a[0].as_str().is_some_and(|id| id.starts_with("JTI="))),
        "{status}"
    );
    // A token bound to a pod carries the pod and the node it runs on (upstream's
    // ServiceAccountTokenPodNodeInfo), and the review says so.
    c.with_manifest(
        &["create"],
        "apiVersion: v1\nkind: Node\nmetadata: {name: bound-node}\n",
    );
    c.with_manifest(
        &["create"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: bound}\nspec:\n  nodeName: bound-node\n  containers: [{name: c, image: busybox}]\n",
    );
    let bound = c
        .ok(&[
            "create",
            "token",
            "default",
            "--bound-object-kind=Pod",
            "--bound-object-name=bound",
        ])
        .trim()
        .to_owned();
    let extra = review(&bound)["user"]["extra"].clone();
    let one = |k: &str| extra[format!("authentication.kubernetes.io/{k}")][0].clone();
    let uid = |what: &[&str]| {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend(["-o", "jsonpath={.metadata.uid}"]);
        c.ok(&args)
    };
    assert_eq!(one("pod-name"), "bound", "{extra}");
    assert_eq!(one("pod-uid"), uid(&["pod", "bound"]).as_str(), "{extra}");
    assert_eq!(one("node-name"), "bound-node", "{extra}");
    assert_eq!(
        one("node-uid"),
        uid(&["node", "bound-node"]).as_str(),
        "{extra}"
    );
    // A token bound to a Secret works until the Secret is gone.
    c.ok(&["create", "secret", "generic", "binder"]);
    let to_secret = c
        .ok(&[
            "create",
            "token",
            "default",
            "--bound-object-kind=Secret",
            "--bound-object-name=binder",
        ])
        .trim()
        .to_owned();
    assert!(whoami(&to_secret).status.success());
    c.ok(&["delete", "secret", "binder"]);
    assert!(!whoami(&to_secret).status.success());
    let stale = c.kubectl(&[
        "create",
        "token",
        "default",
        "--bound-object-kind=Pod",
        "--bound-object-name=bound",
        "--bound-object-uid=0e5d2c8a-0000-4000-8000-000000000000",
    ]);
    assert!(
        !stale.ok
            && stale
                .stderr
                .contains("does not match the UID in record. The object might have been deleted and then recreated"),
        "{stale:?}"
    );
    std::thread::sleep(Duration::from_secs(4));
    let out = whoami(&token);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Unauthorized"),
        "an expired token is refused"
    );
    let status = review(&token);
    assert!(
        status.get("authenticated").is_none_or(|a| a == false)
            && status["error"].as_str().is_some_and(|e| !e.is_empty()),
        "an expired token reviews as not authenticated: {status}"
    );
    // A token for a ServiceAccount that is deleted stops working too.
    c.ok(&["create", "serviceaccount", "bot"]);
    let bot = c.ok(&["create", "token", "bot"]).trim().to_owned();
    assert!(whoami(&bot).status.success());
    c.ok(&["delete", "serviceaccount", "bot"]);
    assert!(!whoami(&bot).status.success());
}

#[test]
fn server_side_apply_reports_conflicts_and_force_takes_ownership() {
    let c = Cluster::start();
    let first = DEPLOYMENT.replace("name: app\n", "name: ssa\n");
    let r = c.with_manifest(&["apply", "--server-side", "--field-manager=alpha"], &first);
    assert!(r.ok && r.stdout.contains("serverside-applied"), "{r:?}");
    let second = first.replace("replicas: 2", "replicas: 5");
    let r = c.with_manifest(&["apply", "--server-side", "--field-manager=beta"], &second);
    assert!(
        !r.ok
            && r.stderr
                .contains("Apply failed with 1 conflict: conflict with \"alpha\": .spec.replicas"),
        "{r:?}"
    );
    assert_eq!(
        c.ok(&["get", "deploy", "ssa", "-o", "jsonpath={.spec.replicas}"]),
        "2"
    );
    let r = c.with_manifest(
        &[
            "apply",
            "--server-side",
            "--field-manager=beta",
            "--force-conflicts",
        ],
        &second,
    );
    assert!(r.ok, "{r:?}");
    assert_eq!(
        c.ok(&["get", "deploy", "ssa", "-o", "jsonpath={.spec.replicas}"]),
        "5"
    );
    let managers = c.ok(&[
        "get",
        "deploy",
        "ssa",
        "--show-managed-fields",
        "-o",
        "jsonpath={range .metadata.managedFields[*]}{.manager}={.operation} {end}",
    ]);
    assert_eq!(managers.trim(), "alpha=Apply beta=Apply");
    // alpha no longer owns replicas; it may drop fields it stopped applying without touching beta's.
    let fields = c.ok(&[
        "get",
        "deploy",
        "ssa",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[0].fieldsV1}",
    ]);
    assert!(!fields.contains("f:replicas"), "{fields}");
}

#[test]
fn server_side_apply_merges_custom_lists_by_their_schema_list_types() {
    let c = Cluster::start();
    assert!(
        c.with_manifest(&["apply"], include_str!("crontab-crd.yaml"))
            .ok
    );
    c.eventually(&["get", "crontabs"], |_| true);
    let cr = |ports: &str, tags: &str| {
        format!(
            "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata: {{name: lists}}\nspec: {{ports: {ports}, tags: {tags}}}\n"
        )
    };
    // Two managers each apply their own element of a map list keyed by (port, protocol), and
    // their own value of a set: both survive, each owned by its manager.
    let alpha = cr("[{port: 80, protocol: TCP, name: web}]", "[a]");
    let beta = cr("[{port: 80, protocol: UDP, name: dns}]", "[b]");
    for (manager, manifest) in [("alpha", &alpha), ("beta", &beta)] {
        let r = c.with_manifest(
            &[
                "apply",
                "--server-side",
                &format!("--field-manager={manager}"),
            ],
            manifest,
        );
        assert!(r.ok, "{r:?}");
    }
    let ports = || {
        c.ok(&[
            "get",
            "ct",
            "lists",
            "-o",
            "jsonpath={range .spec.ports[*]}{.name}/{.protocol} {end}{.spec.tags}",
        ])
    };
    assert_eq!(ports(), r#"web/TCP dns/UDP ["a","b"]"#);
    let owned = c.ok(&[
        "get",
        "ct",
        "lists",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[1].fieldsV1}",
    ]);
    assert!(
        owned.contains(r#"k:{\"port\":80,\"protocol\":\"UDP\"}"#) && owned.contains(r#"v:\"b\""#),
        "{owned}"
    );
    // Changing a field of alpha's element conflicts on exactly that field.
    let r = c.with_manifest(
        &["apply", "--server-side", "--field-manager=beta"],
        &cr("[{port: 80, protocol: TCP, name: other}]", "[b]"),
    );
    assert!(
        !r.ok
            && r.stderr
                .contains(r#".spec.ports[port=80,protocol="TCP"].name"#),
        "{r:?}"
    );
    // alpha stops applying its element and value: only those go.
    let r = c.with_manifest(
        &["apply", "--server-side", "--field-manager=alpha"],
        &cr("[]", "[]"),
    );
    assert!(r.ok, "{r:?}");
    assert_eq!(ports(), r#"dns/UDP ["b"]"#);
}

#[test]
fn components_get_their_own_narrow_permissions() {
    let c = Cluster::start();
    let can = |kc: &std::path::Path, args: &[&str]| {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        c.kubectl_as(kc, &a).stdout.trim().to_owned()
    };
    let scheduler = c.user_kubeconfig("system:kube-scheduler", &[]);
    assert_eq!(
        can(&scheduler, &["create", "pods", "--subresource=binding"]),
        "yes"
    );
    assert_eq!(can(&scheduler, &["watch", "nodes"]), "yes");
    assert_eq!(can(&scheduler, &["delete", "deployments"]), "no");
    let node = c.user_kubeconfig("system:node:n1", &["system:nodes"]);
    assert_eq!(
        can(&node, &["update", "nodes", "--subresource=status"]),
        "yes"
    );
    assert_eq!(can(&node, &["create", "deployments"]), "no");
    let proxy = c.user_kubeconfig("system:kube-proxy", &[]);
    assert_eq!(
        can(&proxy, &["list", "endpointslices.discovery.k8s.io"]),
        "yes"
    );
    assert_eq!(can(&proxy, &["get", "secrets"]), "no");
    let cm = c.user_kubeconfig("system:kube-controller-manager", &[]);
    assert_eq!(can(&cm, &["create", "replicasets.apps"]), "yes");
}

#[test]
fn csi_objects_are_served_as_upstreams_storage_api() {
    let c = Cluster::start();
    let manifest = r#"apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: csi.example.com}
spec: {attachRequired: true, podInfoOnMount: false}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: n1}
spec:
  drivers:
  - {name: csi.example.com, nodeID: n1-id, topologyKeys: [zone]}
---
apiVersion: storage.k8s.io/v1
kind: CSIStorageCapacity
metadata: {name: cap1, namespace: default}
storageClassName: fast
capacity: 10Gi
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {name: va1}
spec:
  attacher: csi.example.com
  nodeName: n1
  source: {persistentVolumeName: pv1}
"#;
    let r = c.with_manifest(&["apply"], manifest);
    assert!(r.ok, "{r:?}");
    for created in [
        "csidriver.storage.k8s.io/csi.example.com created",
        "csinode.storage.k8s.io/n1 created",
        "csistoragecapacity.storage.k8s.io/cap1 created",
        "volumeattachment.storage.k8s.io/va1 created",
    ] {
        assert!(r.stdout.contains(created), "{created}: {}", r.stdout);
    }
    let r = c.with_manifest(&["apply"], manifest);
    assert!(r.ok && r.stdout.matches("unchanged").count() == 4, "{r:?}");
    assert_eq!(
        c.ok(&[
            "get",
            "csinode",
            "n1",
            "-o",
            "jsonpath={.spec.drivers[0].nodeID}"
        ]),
        "n1-id"
    );
    // The attacher reports through the status subresource; a main update keeps status.
    c.ok(&[
        "patch",
        "volumeattachment",
        "va1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status": {"attached": true}}"#,
    ]);
    assert_eq!(
        c.ok(&[
            "get",
            "volumeattachment",
            "va1",
            "-o",
            "jsonpath={.status.attached}"
        ]),
        "true"
    );
    c.ok(&["delete", "csidriver,csinode,volumeattachment", "--all"]);
    c.ok(&["delete", "csistoragecapacity", "cap1"]);
    assert!(
        c.ok(&["get", "csinodes,csidrivers,volumeattachments", "-o", "name"])
            .is_empty()
    );
}

#[test]
fn apis_since_1_20_are_served_with_upstreams_objects_and_rules() {
    let c = Cluster::start();
    // API priority and fairness: the mandatory objects, and new ones defaulted.
    let fs = c.ok(&["get", "flowschemas", "-o", "name"]);
    assert!(
        fs.contains("flowschema.flowcontrol.apiserver.k8s.io/exempt") && fs.contains("/catch-all"),
        "{fs}"
    );
    let plc = c.ok(&[
        "get",
        "prioritylevelconfigurations",
        "catch-all",
        "-o",
        "jsonpath={.spec.type}",
    ]);
    assert_eq!(plc, "Limited");
    let manifest = r#"apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata: {name: batch}
spec:
  type: Limited
  limited: {limitResponse: {type: Queue}}
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: batch}
spec:
  priorityLevelConfiguration: {name: batch}
  rules:
  - subjects: [{kind: User, user: {name: batch-user}}]
    nonResourceRules: [{verbs: ["*"], nonResourceURLs: ["*"]}]
"#;
    let r = c.with_manifest(&["apply"], manifest);
    assert!(r.ok, "{r:?}");
    let r = c.with_manifest(&["apply"], manifest);
    assert!(r.ok && r.stdout.matches("unchanged").count() == 2, "{r:?}");
    assert_eq!(
        c.ok(&[
            "get",
            "prioritylevelconfiguration",
            "batch",
            "-o",
            "jsonpath={.spec.limited.nominalConcurrencyShares}/{.spec.limited.limitResponse.queuing.queues}"
        ]),
        "30/64"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "flowschema",
            "batch",
            "-o",
            "jsonpath={.spec.matchingPrecedence}"
        ]),
        "1000"
    );
    c.ok(&[
        "patch",
        "flowschema",
        "batch",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Dangling","status":"False","reason":"Found"}]}}"#,
    ]);

    // The default ServiceCIDR, Ready; IPAddresses are named by their canonical address.
    assert_eq!(
        c.ok(&[
            "get",
            "servicecidr",
            "kubernetes",
            "-o",
            "jsonpath={.spec.cidrs[0]} {.status.conditions[0].type}={.status.conditions[0].status}"
        ]),
        "10.96.0.0/12 Ready=True"
    );
    let ip = |name: &str| {
        format!(
            r#"{{"apiVersion":"networking.k8s.io/v1","kind":"IPAddress","metadata":{{"name":"{name}"}},
            "spec":{{"parentRef":{{"group":"mygroup","resource":"myresources","namespace":"foo","name":"bar"}}}}}}"#
        )
    };
    let r = c.with_manifest(&["create"], &ip("fe80::42:1dff:fe84:f9e2"));
    assert!(r.ok, "{r:?}");
    let r = c.with_manifest(&["create"], &ip("fe80:0::1"));
    assert!(
        !r.ok && r.stderr.contains("metadata.name: Invalid value: \"fe80:0::1\": must be in canonical form (\"fe80::1\")"),
        "{r:?}"
    );
    assert_eq!(
        c.ok(&["get", "ip", "-o", "name"]).trim(),
        "ipaddress.networking.k8s.io/fe80::42:1dff:fe84:f9e2"
    );

    // RuntimeClass admission: a missing class is refused, a class's overhead is set.
    let pod = |name: &str, class: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}"}},
            "spec":{{"runtimeClassName":"{class}","containers":[{{"name":"c","image":"busybox"}}]}}}}"#
        )
    };
    let r = c.with_manifest(&["create", "--dry-run=server"], &pod("p1", "missing"));
    assert!(
        !r.ok
            && r.stderr.contains("(Forbidden)")
            && r.stderr
                .contains("pod rejected: RuntimeClass \"missing\" not found"),
        "{r:?}"
    );
    let class = r#"apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: padded}
handler: runc
overhead: {podFixed: {cpu: 10m, memory: 1Mi}}
scheduling: {nodeSelector: {sandbox: "yes"}}
"#;
    let r = c.with_manifest(&["apply"], class);
    assert!(r.ok, "{r:?}");
    let r = c.with_manifest(&["create"], &pod("p2", "padded"));
    assert!(r.ok, "{r:?}");
    assert_eq!(
        c.ok(&[
            "get",
            "pod",
            "p2",
            "-o",
            "jsonpath={.spec.overhead.cpu} {.spec.overhead.memory} {.spec.nodeSelector.sandbox}"
        ]),
        "10m 1Mi yes"
    );

    // Sysctl names are validated; unsafe but well-formed ones are the node's to refuse.
    let sysctls = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"sysctls"},
        "spec":{"securityContext":{"sysctls":[{"name":"foo-","value":"bar"},{"name":"kernel.shmmax","value":"1"},
        {"name":"safe-and-unsafe","value":"1"},{"name":"bar..","value":"42"}]},
        "containers":[{"name":"c","image":"busybox"}]}}"#;
    let r = c.with_manifest(&["create"], sysctls);
    assert!(!r.ok, "{r:?}");
    assert!(
        r.stderr.contains("Invalid value: \"foo-\"")
            && r.stderr.contains("Invalid value: \"bar..\""),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("kernel.shmmax") && !r.stderr.contains("safe-and-unsafe"),
        "{}",
        r.stderr
    );

    // PersistentVolumes of any upstream source are stored; a CSI one needs its driver.
    let pv = |name: &str, csi: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"PersistentVolume","metadata":{{"name":"{name}"}},
            "spec":{{"capacity":{{"storage":"1Gi"}},"accessModes":["ReadWriteOnce"],"csi":{csi}}}}}"#
        )
    };
    let r = c.with_manifest(
        &["create"],
        &pv(
            "csi-pv",
            r#"{"driver":"csi.example.com","volumeHandle":"h1"}"#,
        ),
    );
    assert!(r.ok, "{r:?}");
    let r = c.with_manifest(&["create"], &pv("bad-pv", r#"{"volumeHandle":"h1"}"#));
    assert!(
        !r.ok && r.stderr.contains("spec.csi.driver: Required value"),
        "{r:?}"
    );

    // A Service condition without lastTransitionTime (Go's zero time, sent as null) is
    // taken and shown as null, as upstream.
    c.ok(&["create", "service", "clusterip", "web", "--tcp=80"]);
    c.ok(&[
        "patch",
        "service",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"StatusUpdate","status":"True","reason":"E2E","message":"Set from a test","lastTransitionTime":null}]}}"#,
    ]);
    let svc: serde_json::Value =
        serde_json::from_str(&c.ok(&["get", "service", "web", "-o", "json"])).unwrap();
    let condition = &svc["status"]["conditions"][0];
    assert_eq!(condition["type"], "StatusUpdate");
    assert!(condition["lastTransitionTime"].is_null(), "{condition}");

    // A strategic merge patch puts a container new to the list first, as upstream's.
    c.ok(&["create", "deployment", "web", "--image=httpd"]);
    c.ok(&[
        "patch",
        "deployment",
        "web",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"pause"}]}}}}"#,
    ]);
    assert_eq!(
        c.ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[*].name}"
        ]),
        "sidecar httpd"
    );
}

/// Answers every HTTP request on a local port with its method, until the test ends.
fn method_echo() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            let method = request.split(' ').next().unwrap_or_default().to_owned();
            let body = format!("{{\"method\":\"{method}\"}}");
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                if method == "HEAD" { 0 } else { body.len() },
                if method == "HEAD" { "" } else { &body }
            );
        }
    });
    port
}

#[test]
fn service_proxy_passes_every_method_on_and_redirects_to_the_slash() {
    let c = Cluster::start();
    let port = method_echo();
    let manifest = format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: echo}}
spec: {{ports: [{{port: 80, targetPort: {port}}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: echo-1, labels: {{kubernetes.io/service-name: echo}}}}
addressType: IPv4
endpoints: [{{addresses: [127.0.0.1], conditions: {{ready: true}}}}]
ports: [{{name: "", port: {port}, protocol: TCP}}]
"#
    );
    let r = c.with_manifest(&["apply"], &manifest);
    assert!(r.ok, "{r:?}");
    let client = c.client();
    let send = |method: &str, path: &str| {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .body(kube::client::Body::empty())
            .unwrap();
        c.block_on(async {
            let resp = client.send(req).await.unwrap();
            let status = resp.status().as_u16();
            let location = resp
                .headers()
                .get("location")
                .map(|l| l.to_str().unwrap().to_owned());
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            (
                status,
                location,
                String::from_utf8_lossy(&body).into_owned(),
            )
        })
    };
    let base = "/api/v1/namespaces/default/services/echo/proxy";
    for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
        let (status, _, body) = send(method, &format!("{base}/?method={method}"));
        assert_eq!(status, 200, "{method}: {body}");
        assert_eq!(body, format!("{{\"method\":\"{method}\"}}"));
    }
    let (status, _, _) = send("HEAD", &format!("{base}/"));
    assert_eq!(status, 200);
    // The proxy itself, without a slash: 301 to it with one, as upstream.
    for method in ["GET", "HEAD"] {
        let (status, location, _) = send(method, &format!("{base}?method={method}"));
        assert_eq!(status, 301, "{method}");
        assert_eq!(
            location.as_deref(),
            Some(format!("{base}/?method={method}").as_str())
        );
    }
}

#[test]
fn custom_resources_are_selected_by_their_selectable_fields() {
    let c = Cluster::start();
    let crd = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    selectableFields: [{jsonPath: .spec.color}]
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {color: {type: string}, size: {type: string}}}
"#;
    assert!(c.with_manifest(&["apply"], crd).ok);
    c.ok(&[
        "wait",
        "--for=condition=established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
    let widget = |name: &str, color: &str| {
        format!(
            "{{\"apiVersion\":\"example.com/v1\",\"kind\":\"Widget\",\"metadata\":{{\"name\":\"{name}\"}},\"spec\":{{\"color\":\"{color}\",\"size\":\"s\"}}}}"
        )
    };
    let mut created = false;
    for _ in 0..50 {
        if c.with_manifest(&["create"], &widget("a", "red")).ok {
            created = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(created);
    assert!(c.with_manifest(&["create"], &widget("b", "blue")).ok);
    assert!(c.with_manifest(&["create"], &widget("c", "red")).ok);
    let red = c.ok(&[
        "get",
        "widgets",
        "--field-selector",
        "spec.color=red",
        "-o",
        "name",
    ]);
    assert_eq!(
        red.lines().collect::<Vec<_>>(),
        ["widget.example.com/a", "widget.example.com/c"]
    );
    let not_red = c.ok(&[
        "get",
        "widgets",
        "--field-selector",
        "spec.color!=red",
        "-o",
        "name",
    ]);
    assert_eq!(not_red.trim(), "widget.example.com/b");
    // A field the CRD does not make selectable is refused, as upstream.
    let err = c.fails(&["get", "widgets", "--field-selector", "spec.size=s"]);
    assert!(
        err.contains("field label not supported: spec.size"),
        "{err}"
    );
    // Server-side apply under strict validation names an undeclared field as upstream's.
    let unknown = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: d}\nunknownField: x\nspec: {color: red}\n";
    let r = c.with_manifest(&["apply", "--server-side", "--validate=strict"], unknown);
    assert!(
        !r.ok
            && r.stderr
                .contains(".unknownField: field not declared in schema"),
        "{r:?}"
    );
}

#[test]
fn service_account_issuer_discovery_verifies_the_clusters_tokens() {
    use base64::Engine;
    let c = Cluster::start();
    let config: serde_json::Value =
        serde_json::from_str(&c.ok(&["get", "--raw", "/.well-known/openid-configuration"]))
            .unwrap();
    assert_eq!(
        config["issuer"],
        "https://kubernetes.default.svc.cluster.local"
    );
    assert_eq!(
        config["jwks_uri"],
        "https://kubernetes.default.svc.cluster.local/openid/v1/jwks"
    );
    assert_eq!(config["id_token_signing_alg_values_supported"][0], "ES256");
    let jwks: serde_json::Value =
        serde_json::from_str(&c.ok(&["get", "--raw", "/openid/v1/jwks"])).unwrap();
    let key = &jwks["keys"][0];
    // A token of the cluster's verifies with the published key.
    let token = c.ok(&["create", "token", "default", "--audience=oidc-test"]);
    let parts: Vec<&str> = token.trim().split('.').collect();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: serde_json::Value = serde_json::from_slice(&b64.decode(parts[0]).unwrap()).unwrap();
    assert_eq!(header["kid"], key["kid"]);
    let mut point = vec![4u8];
    point.extend(b64.decode(key["x"].as_str().unwrap()).unwrap());
    point.extend(b64.decode(key["y"].as_str().unwrap()).unwrap());
    let public =
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, point);
    let signed = format!("{}.{}", parts[0], parts[1]);
    public
        .verify(signed.as_bytes(), &b64.decode(parts[2]).unwrap())
        .expect("the token verifies with the JWKS");
    // Service accounts may read the documents (upstream's default binding); others may not.
    let sa = c.kubectl(&[
        "get",
        "--raw",
        "/openid/v1/jwks",
        "--as=system:serviceaccount:default:default",
        "--as-group=system:serviceaccounts",
    ]);
    assert!(sa.ok, "{sa:?}");
    let alice = c.kubectl(&["get", "--raw", "/openid/v1/jwks", "--as=alice"]);
    assert!(!alice.ok && alice.stderr.contains("Forbidden"), "{alice:?}");
}

#[test]
fn strict_field_validation_names_unknown_and_duplicate_fields() {
    let c = Cluster::start();
    let body = r#"{"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "my-dep", "labels": {"app": "nginx"}},
        "spec": {"unknownField": "foo", "replicas": 2, "replicas": 3,
            "selector": {"matchLabels": {"app": "nginx"}},
            "template": {"metadata": {"labels": {"app": "nginx"}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:latest"}]}}}}"#;
    let file = c.dir().join("dup.json");
    std::fs::write(&file, body).unwrap();
    let file = file.to_str().unwrap();
    let path = "/apis/apps/v1/namespaces/default/deployments";
    let r = c.kubectl(&[
        "create",
        "--raw",
        &format!("{path}?fieldValidation=Strict"),
        "-f",
        file,
    ]);
    assert!(
        !r.ok
            && r.stderr.contains(
                r#"strict decoding error: unknown field "spec.unknownField", duplicate field "spec.replicas""#
            ),
        "{r:?}"
    );
    // Warn (kubectl's default): created, the last value kept, both named in warnings.
    let r = c.kubectl(&[
        "create",
        "--raw",
        &format!("{path}?fieldValidation=Warn"),
        "-f",
        file,
    ]);
    assert!(r.ok, "{r:?}");
    assert!(
        r.stderr.contains("duplicate field \"spec.replicas\""),
        "{r:?}"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "deployment",
            "my-dep",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "3"
    );
    // Server-side apply of YAML naming a key twice, as client-go sends it: refused under
    // Strict with go-yaml's words and line, applied with a warning under Warn.
    let client = c.client();
    let apply = |validation: &str| {
        let yaml = "\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: twice\ndata:\n  a: one\n  a: two\n";
        let req = http::Request::patch(format!(
            "/api/v1/namespaces/default/configmaps/twice?fieldManager=test&fieldValidation={validation}"
        ))
        .header("Content-Type", "application/apply-patch+yaml")
        .body(yaml.as_bytes().to_vec())
        .unwrap();
        c.block_on(client.send(req.map(kube::client::Body::from)))
            .unwrap()
    };
    let refused = apply("Strict");
    assert_eq!(refused.status(), 400);
    let body = c.block_on(http_body_util::BodyExt::collect(refused.into_body()));
    let status: serde_json::Value = serde_json::from_slice(&body.unwrap().to_bytes()).unwrap();
    assert_eq!(
        status["message"],
        "error strict decoding YAML: error converting YAML to JSON: yaml: unmarshal errors:\n  line 8: key \"a\" already set in map"
    );
    assert!(
        c.kubectl(&["get", "configmap", "twice"])
            .stderr
            .contains("NotFound")
    );
    let warned = apply("Warn");
    assert_eq!(warned.status(), 201);
    let warning = warned.headers()["warning"].to_str().unwrap().to_owned();
    assert!(
        warning.contains("line 8: key \\\"a\\\" already set in map"),
        "{warning}"
    );
    assert_eq!(
        c.ok(&["get", "configmap", "twice", "-o", "jsonpath={.data.a}"]),
        "two"
    );
}

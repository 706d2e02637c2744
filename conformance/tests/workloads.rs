//! What users bring on a real cluster (`minik8s init` plus one joined machine, real
//! containers): a StatefulSet with per-pod volumes from the default `local-path` class comes
//! up in order, keeps each pod's volume across deletion and scaling, rolls with a partition
//! and rolls back; a claim of the default class binds to its first consumer and outlives it;
//! a DaemonSet covers every node but a tainted one until it tolerates it; `kubectl drain`
//! respects a PodDisruptionBudget; a claim that cannot be provisioned leaves its pod Pending
//! with an Event saying why.

use minik8s_conformance::machines::InitCluster;
use minik8s_conformance::node::free_port;
use std::time::Duration;

const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: web
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "hostname >> /data/names; exec sleep 3600"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 64Mi}}
"#;

const NOPE: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: nope}
spec:
  serviceName: nope
  replicas: 1
  selector: {matchLabels: {app: nope}}
  template:
    metadata: {labels: {app: nope}}
    spec:
      containers:
      - {name: c, image: busybox, imagePullPolicy: IfNotPresent, command: ["sleep", "3600"]}
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      storageClassName: missing-class
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Mi}}
"#;

const CLAIM: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: notes}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 16Mi}}
"#;

fn writer(name: &str, command: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
  - name: c
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "{command}"]
    volumeMounts: [{{name: notes, mountPath: /notes}}]
  volumes:
  - name: notes
    persistentVolumeClaim: {{claimName: notes}}
"#
    )
}

const AGENT: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {name: a, image: busybox, imagePullPolicy: IfNotPresent, command: ["sleep", "3600"]}
"#;

const BUDGETED: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: api}
spec:
  replicas: 3
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {name: a, image: busybox, imagePullPolicy: IfNotPresent, command: ["sleep", "3600"]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: api}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: api}}
"#;

fn apply(c: &InitCluster, manifest: &str) {
    let r = c.kubectl_stdin(&["apply", "-f", "-"], manifest);
    assert!(r.ok, "{}", r.stderr);
}

fn exec(c: &InitCluster, pod: &str, cmd: &str) -> String {
    c.eventually(
        Duration::from_secs(30),
        &["exec", pod, "--", "sh", "-c", cmd],
        |_| true,
    )
}

/// `name=value` of a jsonpath over the pods matching `selector`, one per line, sorted.
fn pods(c: &InitCluster, selector: &str, field: &str) -> Vec<String> {
    let mut v: Vec<String> = c
        .ok(&[
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            &format!("jsonpath={{range .items[*]}}{{.metadata.name}}={field}{{\"\\n\"}}{{end}}"),
        ])
        .lines()
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

#[test]
fn statefulsets_volumes_daemonsets_and_budgets_on_a_real_cluster() {
    let c = InitCluster::start(free_port());
    let _w1 = c.join_machine("w1", 2);
    // The scheduler's node view is rebuilt at most once a second.
    std::thread::sleep(Duration::from_secs(2));

    // The default class exists and is the default.
    let classes = c.ok(&["get", "storageclass"]);
    assert!(
        classes.contains("local-path (default)")
            && classes.contains("minik8s.io/local-path")
            && classes.contains("WaitForFirstConsumer"),
        "{classes}"
    );

    // A StatefulSet comes up in order, each pod with its own bound volume.
    apply(&c, WEB);
    c.ok(&["rollout", "status", "statefulset/web", "--timeout=180s"]);
    // The StatefulSet controller says what it did, in upstream's words.
    let described = c.eventually(
        Duration::from_secs(30),
        &["describe", "statefulset", "web"],
        |s: &str| s.contains("create Pod web-2 in StatefulSet web successful"),
    );
    assert!(described.contains("SuccessfulCreate"), "{described}");
    let created = |pod: &str| {
        c.ok(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.metadata.creationTimestamp}",
        ])
    };
    let ready_at = |pod: &str| {
        c.ok(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].lastTransitionTime}",
        ])
    };
    assert!(
        created("web-1") >= ready_at("web-0"),
        "web-1 after web-0 was ready"
    );
    assert!(
        created("web-2") >= ready_at("web-1"),
        "web-2 after web-1 was ready"
    );
    let claims = c.ok(&[
        "get",
        "pvc",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.storageClassName}{\"\\n\"}{end}",
    ]);
    for i in 0..3 {
        assert!(
            claims.contains(&format!("data-web-{i} Bound local-path")),
            "{claims}"
        );
    }
    for i in 0..3 {
        let pod = format!("web-{i}");
        assert_eq!(exec(&c, &pod, "cat /data/names").trim(), pod);
    }
    // The headless Service names each pod.
    let resolved = exec(&c, "web-1", "nslookup web-0.web.default.svc.cluster.local");
    let ip0 = c.ok(&["get", "pod", "web-0", "-o", "jsonpath={.status.podIP}"]);
    assert!(resolved.contains(&ip0), "{resolved}");

    // Deleting a pod brings it back, on the same node, with its volume.
    let node1 = c.ok(&["get", "pod", "web-1", "-o", "jsonpath={.spec.nodeName}"]);
    let uid1 = c.ok(&["get", "pod", "web-1", "-o", "jsonpath={.metadata.uid}"]);
    c.ok(&["delete", "pod", "web-1", "--wait=false"]);
    c.eventually(
        Duration::from_secs(90),
        &[
            "get",
            "pod",
            "web-1",
            "-o",
            "jsonpath={.metadata.uid} {.status.phase}",
        ],
        |s| !s.starts_with(&uid1) && s.ends_with("Running"),
    );
    assert_eq!(
        c.ok(&["get", "pod", "web-1", "-o", "jsonpath={.spec.nodeName}"]),
        node1
    );
    assert_eq!(exec(&c, "web-1", "cat /data/names").trim(), "web-1\nweb-1");

    // Scale down (highest ordinal first; the claims stay) and up again.
    c.ok(&["scale", "statefulset", "web", "--replicas=1"]);
    c.eventually(
        Duration::from_secs(60),
        &["get", "pods", "-l", "app=web", "-o", "name"],
        |s| s.trim() == "pod/web-0",
    );
    let remaining = c.ok(&["get", "pvc", "-o", "name"]);
    assert!(remaining.contains("data-web-2"), "{remaining}");
    c.ok(&["scale", "statefulset", "web", "--replicas=3"]);
    c.ok(&["rollout", "status", "statefulset/web", "--timeout=120s"]);
    assert_eq!(
        exec(&c, "web-1", "cat /data/names").trim(),
        "web-1\nweb-1\nweb-1"
    );

    // A rolling update with a partition updates only the ordinals at or above it.
    let before = pods(&c, "app=web", "{.metadata.labels.controller-revision-hash}");
    c.ok(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}"#,
    ]);
    c.ok(&["set", "env", "statefulset/web", "COLOR=blue"]);
    let status = c.ok(&["rollout", "status", "statefulset/web", "--timeout=120s"]);
    assert!(status.contains("partitioned roll out complete"), "{status}");
    let update = c.ok(&[
        "get",
        "sts",
        "web",
        "-o",
        "jsonpath={.status.currentRevision} {.status.updateRevision}",
    ]);
    let (current, update) = update.split_once(' ').unwrap();
    assert_ne!(current, update);
    let after = pods(&c, "app=web", "{.metadata.labels.controller-revision-hash}");
    assert_eq!(
        after,
        vec![
            format!("web-0={current}"),
            format!("web-1={current}"),
            format!("web-2={update}"),
        ],
        "before: {before:?}"
    );
    assert_eq!(exec(&c, "web-2", "echo $COLOR").trim(), "blue");

    // Undo: the previous template again, on the updated pod too.
    let history = c.ok(&["rollout", "history", "statefulset/web"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");
    c.ok(&["rollout", "undo", "statefulset/web"]);
    c.eventually(
        Duration::from_secs(90),
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.labels.controller-revision-hash}",
        ],
        |s| s.split_whitespace().collect::<Vec<_>>() == [current; 3],
    );
    c.ok(&["rollout", "status", "statefulset/web", "--timeout=120s"]);
    assert_eq!(exec(&c, "web-2", "echo ${COLOR:-none}").trim(), "none");

    // A claim of the default class waits for its first consumer, binds on its node and
    // outlives it; deleting it deletes its volume (reclaim policy Delete).
    apply(&c, CLAIM);
    assert_eq!(
        c.ok(&[
            "get",
            "pvc",
            "notes",
            "-o",
            "jsonpath={.spec.storageClassName}"
        ]),
        "local-path"
    );
    c.eventually(
        Duration::from_secs(10),
        &[
            "get",
            "events",
            "--field-selector=involvedObject.name=notes",
        ],
        |s| s.contains("WaitForFirstConsumer"),
    );
    apply(&c, &writer("first", "echo kept > /notes/n"));
    c.eventually(
        Duration::from_secs(90),
        &["get", "pod", "first", "-o", "jsonpath={.status.phase}"],
        |s| s == "Succeeded",
    );
    let volume = c.ok(&[
        "get",
        "pvc",
        "notes",
        "-o",
        "jsonpath={.status.phase} {.spec.volumeName}",
    ]);
    let volume = volume.strip_prefix("Bound ").expect("bound").to_owned();
    c.ok(&["delete", "pod", "first"]);
    apply(&c, &writer("second", "cat /notes/n"));
    c.eventually(
        Duration::from_secs(90),
        &["get", "pod", "second", "-o", "jsonpath={.status.phase}"],
        |s| s == "Succeeded",
    );
    assert_eq!(c.ok(&["logs", "second"]).trim(), "kept");
    c.ok(&["delete", "pod", "second"]);
    let path = c.ok(&["get", "pv", &volume, "-o", "jsonpath={.spec.local.path}"]);
    assert!(std::path::Path::new(&path).is_dir(), "{path}");

    // A claim in use is protected (upstream's kubernetes.io/pvc-protection): deleted while a
    // pod runs on it, it stays Terminating with its volume and data until the pod is gone;
    // then the claim goes, and its volume with it (reclaim policy Delete).
    assert_eq!(
        c.ok(&[
            "get",
            "pvc",
            "notes",
            "-o",
            "jsonpath={.metadata.finalizers}"
        ]),
        r#"["kubernetes.io/pvc-protection"]"#
    );
    assert_eq!(
        c.ok(&[
            "get",
            "pv",
            &volume,
            "-o",
            "jsonpath={.metadata.finalizers}"
        ]),
        r#"["external-provisioner.volume.kubernetes.io/finalizer","kubernetes.io/pv-protection"]"#
    );
    apply(&c, &writer("holder", "sleep 3600"));
    c.eventually(
        Duration::from_secs(90),
        &["get", "pod", "holder", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    c.ok(&["delete", "pvc", "notes", "--wait=false"]);
    // The same volume refuses deletion while bound, too.
    c.ok(&["delete", "pv", &volume, "--wait=false"]);
    std::thread::sleep(Duration::from_secs(2));
    let row = c.ok(&["get", "pvc", "notes", "--no-headers"]);
    assert_eq!(row.split_whitespace().nth(1), Some("Terminating"), "{row}");
    let row = c.ok(&["get", "pv", &volume, "--no-headers"]);
    assert_eq!(row.split_whitespace().nth(4), Some("Terminating"), "{row}");
    assert_eq!(exec(&c, "holder", "cat /notes/n").trim(), "kept");
    c.ok(&["delete", "pod", "holder"]);
    c.eventually(
        Duration::from_secs(30),
        &["get", "pvc,pv", "-o", "name"],
        |s| !s.contains("persistentvolumeclaim/notes") && !s.contains(&volume),
    );
    assert!(!std::path::Path::new(&path).exists(), "{path} removed");

    // A claim that cannot be provisioned: the pod stays Pending, and says why.
    apply(&c, NOPE);
    c.eventually(
        Duration::from_secs(30),
        &[
            "get",
            "events",
            "--field-selector=involvedObject.name=nope-0",
        ],
        |s| {
            s.contains("FailedScheduling")
                && s.contains("storageclass.storage.k8s.io \"missing-class\" not found")
        },
    );
    assert_eq!(
        c.ok(&["get", "pod", "nope-0", "-o", "jsonpath={.status.phase}"]),
        "Pending"
    );
    c.ok(&["delete", "statefulset", "nope"]);

    // A DaemonSet: every node but a tainted one, until it tolerates the taint.
    c.ok(&["taint", "nodes", "w1", "dedicated=infra:NoSchedule"]);
    apply(&c, AGENT);
    c.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    assert_eq!(
        pods(&c, "app=agent", "{.spec.nodeName}")
            .iter()
            .map(|l| l.split_once('=').unwrap().1.to_owned())
            .collect::<Vec<_>>(),
        ["cp"]
    );
    c.ok(&[
        "patch",
        "ds",
        "agent",
        "-p",
        r#"{"spec":{"template":{"spec":{"tolerations":[{"key":"dedicated","operator":"Exists"}]}}}}"#,
    ]);
    c.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    c.eventually(
        Duration::from_secs(60),
        &[
            "get",
            "pods",
            "-l",
            "app=agent",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        |s| {
            let mut n: Vec<&str> = s.split_whitespace().collect();
            n.sort();
            n == ["cp", "w1"]
        },
    );
    c.ok(&["taint", "nodes", "w1", "dedicated-"]);

    // Drain with a budget of 2 of 3: the pods leave w1 one at a time.
    c.ok(&["cordon", "cp"]);
    apply(&c, BUDGETED);
    c.ok(&["rollout", "status", "deployment/api", "--timeout=90s"]);
    c.ok(&["uncordon", "cp"]);
    c.eventually(
        Duration::from_secs(20),
        &[
            "get",
            "pdb",
            "api",
            "-o",
            "jsonpath={.status.currentHealthy} {.status.disruptionsAllowed}",
        ],
        |s| s == "3 1",
    );
    std::thread::sleep(Duration::from_secs(2));
    let drained = c.kubectl(&[
        "drain",
        "w1",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=150s",
    ]);
    assert!(drained.ok, "{}\n{}", drained.stdout, drained.stderr);
    assert!(
        drained
            .stderr
            .contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "drain waited for the budget:\n{}",
        drained.stderr
    );
    c.eventually(
        Duration::from_secs(60),
        &[
            "get",
            "pods",
            "-l",
            "app=api",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        |s| s.split_whitespace().collect::<Vec<_>>() == ["cp", "cp", "cp"],
    );
}

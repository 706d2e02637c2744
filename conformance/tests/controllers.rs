//! Controllers with the stock kubectl, on two simulated nodes: Deployments and their
//! ReplicaSets and pods, rollouts, garbage collection, namespaces, endpoints, scheduling.

use minik8s_conformance::Cluster;

fn count(out: &str) -> usize {
    out.split_whitespace().count()
}

#[test]
fn deployments_scale_roll_out_undo_and_cascade() {
    let c = Cluster::start();
    c.run_controllers(2);
    c.eventually(&["get", "nodes", "-o", "name"], |o| count(o) == 2);
    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=3",
    ]);
    c.eventually(&["get", "rs", "-l", "app=web", "-o", "name"], |o| {
        count(o) == 1
    });
    let running = |n: usize| {
        move |o: &str| {
            o.lines().filter(|l| l.contains("Running")).count() == n && o.lines().count() == n
        }
    };
    let pods = [
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{\"\\n\"}{end}",
    ];
    let out = c.eventually(&pods, running(3));
    assert!(
        out.lines().all(|l| l.contains(" sim-")),
        "bound to simulated nodes: {out}"
    );

    c.ok(&["scale", "deployment", "web", "--replicas=5"]);
    c.eventually(&pods, running(5));
    c.ok(&["scale", "deployment", "web", "--replicas=1"]);
    c.eventually(&pods, running(1));
    c.ok(&["scale", "deployment", "web", "--replicas=3"]);
    c.eventually(&pods, running(3));

    // A new image rolls a new ReplicaSet; rollout status waits for it.
    c.ok(&["set", "image", "deployment/web", "busybox=busybox:1.36"]);
    let status = c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert!(status.contains("successfully rolled out"), "{status}");
    c.eventually(&["get", "rs", "-l", "app=web", "-o", "name"], |o| {
        count(o) == 2
    });
    let images = c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].spec.containers[0].image}",
        ],
        |o| o.split_whitespace().count() == 3 && o.split_whitespace().all(|i| i == "busybox:1.36"),
    );
    assert!(images.contains("busybox:1.36"));
    let history = c.ok(&["rollout", "history", "deployment/web"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");

    // Undo goes back to the first template as revision 3.
    c.ok(&["rollout", "undo", "deployment/web"]);
    c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].spec.containers[0].image}",
        ],
        |o| o.split_whitespace().count() == 3 && o.split_whitespace().all(|i| i == "busybox"),
    );
    let rev = c.ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "jsonpath={.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
    ]);
    assert_eq!(rev, "3");

    // Background cascade: the ReplicaSets and pods go with the Deployment.
    c.ok(&["delete", "deployment", "web"]);
    c.eventually(&["get", "rs,pods", "-l", "app=web", "-o", "name"], |o| {
        count(o) == 0
    });

    // Orphan cascade: they stay, without an owner.
    c.ok(&[
        "create",
        "deployment",
        "keep",
        "--image=busybox",
        "--replicas=2",
    ]);
    c.eventually(&["get", "pods", "-l", "app=keep", "-o", "name"], |o| {
        count(o) == 2
    });
    c.ok(&["delete", "deployment", "keep", "--cascade=orphan"]);
    c.eventually(&["get", "deployment", "-o", "name"], |o| {
        !o.contains("keep")
    });
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(
        count(&c.ok(&["get", "rs", "-l", "app=keep", "-o", "name"])),
        1
    );
    assert_eq!(
        count(&c.ok(&["get", "pods", "-l", "app=keep", "-o", "name"])),
        2
    );
    let owners = c.ok(&[
        "get",
        "rs",
        "-l",
        "app=keep",
        "-o",
        "jsonpath={.items[0].metadata.ownerReferences}",
    ]);
    assert!(owners.is_empty(), "{owners}");
}

#[test]
fn namespaces_endpoints_and_scheduling() {
    let c = Cluster::start();
    c.run_controllers(2);
    c.eventually(&["get", "nodes", "-o", "name"], |o| count(o) == 2);

    // Deleting a namespace deletes what is in it, then the namespace.
    c.ok(&["create", "namespace", "doomed"]);
    c.ok(&[
        "create",
        "deployment",
        "d",
        "--image=busybox",
        "--replicas=2",
        "-n",
        "doomed",
    ]);
    c.ok(&["create", "configmap", "cm", "-n", "doomed"]);
    c.eventually(&["get", "pods", "-n", "doomed", "-o", "name"], |o| {
        count(o) == 2
    });
    c.ok(&["delete", "namespace", "doomed", "--wait=false"]);
    c.eventually(&["get", "namespaces", "-o", "name"], |o| {
        !o.contains("namespace/doomed")
    });

    // A Service's EndpointSlice lists exactly its ready pods.
    c.ok(&[
        "create",
        "deployment",
        "api",
        "--image=busybox",
        "--replicas=2",
        "--port=80",
    ]);
    c.ok(&["expose", "deployment", "api", "--port=80"]);
    let addrs = c.eventually(
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=api",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[0]}",
        ],
        |o| count(o) == 2,
    );
    let ips = c.ok(&[
        "get",
        "pods",
        "-l",
        "app=api",
        "-o",
        "jsonpath={.items[*].status.podIP}",
    ]);
    let mut a: Vec<&str> = addrs.split_whitespace().collect();
    let mut b: Vec<&str> = ips.split_whitespace().collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    c.eventually(
        &[
            "get",
            "endpoints",
            "api",
            "-o",
            "jsonpath={.subsets[0].addresses[*].ip}",
        ],
        |o| count(o) == 2,
    );

    // Too big for any node: Pending, with a FailedScheduling event.
    let big = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"huge"},
      "spec":{"containers":[{"name":"c","image":"busybox","resources":{"requests":{"cpu":"64"}}}]}}"#;
    assert!(c.with_manifest(&["create"], big).ok);
    c.eventually(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=huge",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
        |o| o.contains("FailedScheduling"),
    );
    let cond = c.ok(&[
        "get",
        "pod",
        "huge",
        "-o",
        "jsonpath={.status.conditions[0].message}",
    ]);
    assert!(
        cond.contains("0/2 nodes are available: 2 Insufficient cpu."),
        "{cond}"
    );
    assert_eq!(
        c.ok(&["get", "pod", "huge", "-o", "jsonpath={.spec.nodeName}"]),
        ""
    );

    // The seed's policies, chosen by schedulerName.
    let pod = |name: &str, scheduler: &str, label: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","labels":{{{label}}}}},
              "spec":{{"schedulerName":"{scheduler}","containers":[{{"name":"c","image":"busybox"}}]}}}}"#
        )
    };
    for i in 0..4 {
        assert!(
            c.with_manifest(
                &["create"],
                &pod(&format!("rr{i}"), "round-robin", "\"policy\":\"rr\"")
            )
            .ok
        );
        // One at a time, so the rotation is observable.
        c.eventually(
            &[
                "get",
                "pod",
                &format!("rr{i}"),
                "-o",
                "jsonpath={.spec.nodeName}",
            ],
            |o| !o.is_empty(),
        );
    }
    let nodes = c.ok(&[
        "get",
        "pods",
        "-l",
        "policy=rr",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]);
    let on0 = nodes.split_whitespace().filter(|n| *n == "sim-0").count();
    assert_eq!(on0, 2, "round-robin alternates: {nodes}");
    assert!(
        c.with_manifest(
            &["create"],
            &pod("pinned", "affinity", "\"minik8s.io/node\":\"sim-1\"")
        )
        .ok
    );
    c.eventually(
        &["get", "pod", "pinned", "-o", "jsonpath={.spec.nodeName}"],
        |o| o == "sim-1",
    );
    assert!(
        c.with_manifest(
            &["create"],
            &pod("roomy", "resource-based", "\"policy\":\"rb\"")
        )
        .ok
    );
    c.eventually(
        &["get", "pod", "roomy", "-o", "jsonpath={.spec.nodeName}"],
        |o| o.starts_with("sim-"),
    );
}

const JOB: &str = "apiVersion: batch/v1
kind: Job
metadata: {name: NAME}
spec:
  completions: 3
  parallelism: 2
  backoffLimit: BACKOFF
  TTL
  template:
    metadata: {annotations: {minik8s.io/sim-exit-code: \"EXIT\"}}
    spec:
      restartPolicy: Never
      containers: [{name: work, image: busybox, command: [\"true\"]}]
";

fn job(name: &str, backoff: u32, exit: u32, ttl: Option<u32>) -> String {
    JOB.replace("NAME", name)
        .replace("BACKOFF", &backoff.to_string())
        .replace("EXIT", &exit.to_string())
        .replace(
            "TTL",
            &ttl.map(|t| format!("ttlSecondsAfterFinished: {t}"))
                .unwrap_or_default(),
        )
}

#[test]
fn jobs_complete_fail_expire_and_cronjobs_run_on_schedule() {
    let c = Cluster::start();
    c.run_controllers(2);
    c.eventually(&["get", "nodes", "-o", "name"], |o| count(o) == 2);
    // A CronJob every minute: started first, it fires while the Jobs run.
    c.ok(&[
        "create",
        "cronjob",
        "tick",
        "--image=busybox",
        "--schedule=* * * * *",
        "--",
        "true",
    ]);

    // completions 3, parallelism 2: never more than two pods at once, then Complete.
    assert!(c.with_manifest(&["apply"], &job("three", 6, 0, None)).ok);
    let phases = [
        "get",
        "pods",
        "-l",
        "job-name=three",
        "-o",
        "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = c.ok(&phases);
        let running = out
            .lines()
            .filter(|l| *l == "Running" || *l == "Pending")
            .count();
        assert!(running <= 2, "more than parallelism pods active: {out}");
        if out.lines().filter(|l| *l == "Succeeded").count() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job never finished: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let r = c.kubectl(&[
        "wait",
        "--for=condition=complete",
        "job/three",
        "--timeout=30s",
    ]);
    assert!(r.ok, "{r:?}");
    assert_eq!(
        c.ok(&["get", "job", "three", "-o", "jsonpath={.status.succeeded}"]),
        "3"
    );
    let table = c.ok(&["get", "job", "three"]);
    assert!(
        table.contains("Complete") && table.contains("3/3"),
        "{table}"
    );
    assert_eq!(c.ok(&phases).lines().count(), 3, "exactly three pods ran");

    // Failing pods beyond backoffLimit fail the Job.
    assert!(c.with_manifest(&["apply"], &job("broken", 1, 3, None)).ok);
    let r = c.kubectl(&[
        "wait",
        "--for=condition=failed",
        "job/broken",
        "--timeout=60s",
    ]);
    assert!(r.ok, "{r:?}");
    assert_eq!(
        c.ok(&[
            "get",
            "job",
            "broken",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Failed\")].reason}"
        ]),
        "BackoffLimitExceeded"
    );

    // ttlSecondsAfterFinished: the finished Job and its pods are deleted.
    assert!(c.with_manifest(&["apply"], &job("brief", 6, 0, Some(1))).ok);
    c.eventually(&["get", "jobs", "-o", "name"], |o| {
        !o.contains("job.batch/brief")
    });
    c.eventually(
        &["get", "pods", "-l", "job-name=brief", "-o", "name"],
        |o| o.trim().is_empty(),
    );

    // The CronJob created a Job for its minute, and it completed.
    let out = c.eventually_within(
        std::time::Duration::from_secs(90),
        &[
            "get",
            "cronjob",
            "tick",
            "-o",
            "jsonpath={.status.lastSuccessfulTime}",
        ],
        |o| !o.trim().is_empty(),
    );
    assert!(out.ends_with('Z'), "{out}");
    let jobs = c.ok(&["get", "jobs", "-o", "name"]);
    assert!(jobs.contains("job.batch/tick-"), "{jobs}");
    // The CronJob controller says what it did, as upstream's.
    let described = c.ok(&["describe", "cronjob", "tick"]);
    assert!(
        described.contains("SuccessfulCreate") && described.contains("Created job tick-"),
        "{described}"
    );
}

/// `v1` ReplicationControllers (still GA upstream) are run by the replication controller:
/// pods created and owned, scaled by `kubectl scale`, matching orphans adopted, pods that stop
/// matching released, status counted, and their pods deleted with them.
#[test]
fn replication_controllers_create_scale_adopt_release_and_cascade() {
    let c = Cluster::start();
    c.run_controllers(2);
    c.eventually(&["get", "nodes", "-o", "name"], |o| count(o) == 2);
    // An orphan that matches is adopted instead of a new pod being made.
    c.ok(&["run", "orphan", "--image=busybox", "--labels=name=rcweb"]);
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: v1
kind: ReplicationController
metadata: {name: rcweb}
spec:
  replicas: 3
  template:
    metadata: {labels: {name: rcweb}}
    spec: {containers: [{name: c, image: busybox}]}
",
    );
    assert!(r.ok, "{}", r.stderr);
    // The selector defaulted to the template's labels, as upstream.
    assert_eq!(
        c.ok(&["get", "rc", "rcweb", "-o", "jsonpath={.spec.selector.name}"]),
        "rcweb"
    );
    let owned = [
        "get",
        "pods",
        "-l",
        "name=rcweb",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.ownerReferences[0].kind} {.status.phase}{\"\\n\"}{end}",
    ];
    let out = c.eventually(&owned, |o| {
        o.lines().count() == 3
            && o.lines()
                .all(|l| l.ends_with("ReplicationController Running"))
    });
    assert!(out.contains("orphan "), "the orphan was adopted: {out}");
    c.eventually(
        &[
            "get",
            "rc",
            "rcweb",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
        |r| r == "3",
    );
    c.ok(&["scale", "rc", "rcweb", "--replicas=1"]);
    c.eventually(&owned, |o| o.lines().count() == 1);
    // A pod relabelled out of the selector is released (no owner) and replaced.
    let kept = c.ok(&[
        "get",
        "pods",
        "-l",
        "name=rcweb",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    c.ok(&["label", "pod", &kept, "name=gone", "--overwrite"]);
    c.eventually(
        &[
            "get",
            "pod",
            &kept,
            "-o",
            "jsonpath={.metadata.ownerReferences}",
        ],
        |o| o.is_empty() || o == "[]",
    );
    c.eventually(&owned, |o| o.lines().count() == 1 && !o.contains(&kept));
    // Deleting the RC deletes its pods (the garbage collector follows its ownerReferences).
    c.ok(&["delete", "rc", "rcweb"]);
    c.eventually(&["get", "pods", "-l", "name=rcweb", "-o", "name"], |o| {
        o.trim().is_empty()
    });
    assert!(c.ok(&["get", "pod", &kept, "-o", "name"]).contains(&kept));

    // A quota that refuses its pods shows as the ReplicaFailure condition, until it fits.
    c.ok(&["create", "namespace", "quoted"]);
    c.ok(&[
        "create",
        "quota",
        "condition-test",
        "--hard=pods=2",
        "-n",
        "quoted",
    ]);
    let r = c.with_manifest(
        &["apply", "-n", "quoted"],
        "apiVersion: v1
kind: ReplicationController
metadata: {name: condition-test}
spec:
  replicas: 3
  template:
    metadata: {labels: {name: condition-test}}
    spec: {containers: [{name: c, image: busybox}]}
",
    );
    assert!(r.ok, "{}", r.stderr);
    let cond = [
        "get",
        "rc",
        "condition-test",
        "-n",
        "quoted",
        "-o",
        "jsonpath={range .status.conditions[*]}{.type} {.status} {.reason}: {.message}{end}",
    ];
    let got = c.eventually(&cond, |o| o.starts_with("ReplicaFailure True FailedCreate"));
    assert!(got.contains("exceeded quota: condition-test"), "{got}");
    c.ok(&[
        "scale",
        "rc",
        "condition-test",
        "--replicas=2",
        "-n",
        "quoted",
    ]);
    c.eventually(&cond, |o| o.is_empty());
}

/// The garbage collector deletes in the foreground through a cycle of blocking owner
/// references (upstream's "not be blocked by dependency circle" spec): cm1 is owned by cm3,
/// cm2 by cm1 and cm3 by cm2, and deleting cm1 in the foreground removes all three.
#[test]
fn foreground_deletion_is_not_blocked_by_a_dependency_circle() {
    let c = Cluster::start();
    c.run_named_controllers(&["garbagecollector"], c.shutdown_token());
    for n in ["cm1", "cm2", "cm3"] {
        c.ok(&["create", "configmap", n]);
    }
    let uid = |n: &str| c.ok(&["get", "configmap", n, "-o", "jsonpath={.metadata.uid}"]);
    for (dependent, owner) in [("cm1", "cm3"), ("cm2", "cm1"), ("cm3", "cm2")] {
        let patch = serde_json::json!({"metadata": {"ownerReferences": [{"apiVersion": "v1",
            "kind": "ConfigMap", "name": owner, "uid": uid(owner), "controller": true,
            "blockOwnerDeletion": true}]}});
        c.ok(&[
            "patch",
            "configmap",
            dependent,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ]);
    }
    c.ok(&[
        "delete",
        "configmap",
        "cm1",
        "--cascade=foreground",
        "--wait=false",
    ]);
    c.eventually_within(
        std::time::Duration::from_secs(60),
        &["get", "configmaps", "-o", "name"],
        |o| !o.contains("configmap/cm"),
    );
}

/// A Job adopts matching orphans and releases pods that stop matching (upstream's Job spec
/// "should adopt matching orphans and release non-matching pods").
#[test]
fn jobs_adopt_matching_orphans_and_release_non_matching_pods() {
    let c = Cluster::start();
    // No nodes: the pods stay Pending (active), where a simulated node would finish them
    // within a second.
    c.run_controllers(0);
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: batch/v1
kind: Job
metadata: {name: adopt-release}
spec:
  parallelism: 2
  completions: 4
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox, command: [sleep, '3600']}]
",
    );
    assert!(r.ok, "{}", r.stderr);
    let pods = [
        "get",
        "pods",
        "-l",
        "job-name=adopt-release",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.ownerReferences[0].name}{\"\\n\"}{end}",
    ];
    let out = c.eventually(&pods, |o| o.lines().count() == 2);
    let orphan = out
        .lines()
        .next()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    c.ok(&[
        "patch",
        "pod",
        &orphan,
        "--type=merge",
        "-p",
        r#"{"metadata":{"ownerReferences":null}}"#,
    ]);
    let owner = [
        "get",
        "pod",
        &orphan,
        "-o",
        "jsonpath={.metadata.ownerReferences}",
    ];
    c.eventually(&owner, |o| o.contains("\"name\":\"adopt-release\""));
    c.ok(&[
        "label",
        "pod",
        &orphan,
        "job-name-",
        "batch.kubernetes.io/controller-uid-",
        "controller-uid-",
    ]);
    c.eventually(&owner, |o| o.is_empty());
}

/// Scaling a Deployment mid-rollout spreads the change over its ReplicaSets in proportion, as
/// upstream's `scale` (its "proportional scaling" spec): 10 available replicas (surge 3,
/// unavailable 2) roll to a template whose pods never become available (minReadySeconds of an
/// hour), which stalls at 8 old + 5 new; scaled to 30, the old set gets 20 and the new one 13.
#[test]
fn deployments_scale_proportionally_mid_rollout() {
    let c = Cluster::start();
    c.run_controllers(2);
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: apps/v1
kind: Deployment
metadata: {name: prop}
spec:
  replicas: 10
  selector: {matchLabels: {app: prop}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 3, maxUnavailable: 2}}
  template:
    metadata: {labels: {app: prop}}
    spec: {containers: [{name: c, image: busybox}]}
",
    );
    assert!(r.ok, "{}", r.stderr);
    c.ok(&["rollout", "status", "deployment/prop", "--timeout=60s"]);
    let sizes = [
        "get",
        "rs",
        "-l",
        "app=prop",
        "--sort-by=.metadata.creationTimestamp",
        "-o",
        "jsonpath={range .items[*]}{.spec.replicas} {end}",
    ];
    c.ok(&[
        "patch",
        "deployment",
        "prop",
        "-p",
        r#"{"spec":{"minReadySeconds":3600,"progressDeadlineSeconds":7200,"template":{"spec":{"containers":[{"name":"c","image":"busybox:2"}]}}}}"#,
    ]);
    c.eventually(&sizes, |o| o.trim() == "8 5");
    c.ok(&["scale", "deployment", "prop", "--replicas=30"]);
    c.eventually(&sizes, |o| o.trim() == "20 13");
}

/// A Deployment adopts an orphan ReplicaSet its selector matches, rolls it over, and numbers
/// its new ReplicaSet after the adopted one's revision (upstream's "RollingUpdateDeployment
/// should delete old pods and create new ones" spec).
#[test]
fn deployments_adopt_orphan_replicasets_and_continue_their_revisions() {
    let c = Cluster::start();
    c.run_controllers(1);
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: test-rolling-update-controller
  labels: {name: sample-pod, pod: httpd}
  annotations: {deployment.kubernetes.io/revision: '3546343826724305832'}
spec:
  replicas: 1
  selector: {matchLabels: {name: sample-pod, pod: httpd}}
  template:
    metadata: {labels: {name: sample-pod, pod: httpd}}
    spec: {containers: [{name: httpd, image: busybox}]}
",
    );
    assert!(r.ok, "{}", r.stderr);
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: apps/v1
kind: Deployment
metadata: {name: test-rolling-update-deployment}
spec:
  replicas: 1
  selector: {matchLabels: {name: sample-pod}}
  template:
    metadata: {labels: {name: sample-pod}}
    spec: {containers: [{name: agnhost, image: busybox:2}]}
",
    );
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &[
            "get",
            "deployment",
            "test-rolling-update-deployment",
            "-o",
            r"jsonpath={.metadata.annotations.deployment\.kubernetes\.io/revision}",
        ],
        |s| s == "3546343826724305833",
    );
    let old = [
        "get",
        "rs",
        "test-rolling-update-controller",
        "-o",
        "jsonpath={.metadata.ownerReferences[0].name} {.spec.replicas}",
    ];
    c.eventually(&old, |s| s == "test-rolling-update-deployment 0");
}

/// Pod priority and preemption, as upstream's SchedulerPreemption specs drive them: the
/// Priority admission fills `spec.priority` from the class (and refuses a class that does not
/// exist), a class's value is immutable, and a pod that fits nowhere preempts a pod of lower
/// priority, which is deleted with a `Preempted` event, then takes its place.
#[test]
fn pods_of_higher_priority_preempt_lower_ones() {
    let c = Cluster::start();
    c.run_controllers(2);
    c.eventually(&["get", "nodes", "-o", "name"], |o| count(o) == 2);
    // The built-in classes exist; a user's class value may not change.
    c.ok(&[
        "get",
        "priorityclass",
        "system-cluster-critical",
        "system-node-critical",
    ]);
    c.ok(&["create", "priorityclass", "low", "--value=1"]);
    c.ok(&["create", "priorityclass", "high", "--value=1000"]);
    let err = c.fails(&["patch", "priorityclass", "high", "-p", r#"{"value": 5}"#]);
    assert!(
        err.contains("value: Forbidden: may not be changed in an update."),
        "{err}"
    );
    let err = c.fails(&["create", "priorityclass", "system-mine", "--value=1"]);
    assert!(err.contains("reserved for system use only"), "{err}");

    // Only sim-0 has the extended resource, 3 of it.
    let foo = r#"{"status": {"capacity": {"example.com/foo": "3"}, "allocatable": {"example.com/foo": "3"}}}"#;
    c.ok(&["patch", "node", "sim-0", "--subresource=status", "-p", foo]);
    let pod = |name: &str, class: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  priorityClassName: {class}\n  containers:\n  - name: c\n    image: busybox\n    resources:\n      requests: {{example.com/foo: 2}}\n      limits: {{example.com/foo: 2}}\n"
        )
    };
    let r = c.with_manifest(&["create"], &pod("missing-class", "nope"));
    assert!(
        !r.ok
            && r.stderr
                .contains("no PriorityClass with name nope was found"),
        "{}",
        r.stderr
    );
    // The victim holds a finalizer, so that what preemption writes on it can be read.
    let victim = pod("victim", "low").replace(
        "metadata: {name: victim}",
        "metadata: {name: victim, finalizers: [example.com/keep]}",
    );
    assert!(c.with_manifest(&["create"], &victim).ok);
    c.eventually(
        &["get", "pod", "victim", "-o", "jsonpath={.spec.nodeName}"],
        |o| o == "sim-0",
    );
    assert_eq!(
        c.ok(&["get", "pod", "victim", "-o", "jsonpath={.spec.priority}"]),
        "1"
    );
    assert!(c.with_manifest(&["create"], &pod("preemptor", "high")).ok);
    // Marked as upstream's scheduler marks a victim, then deleted.
    c.eventually(
        &[
            "get",
            "pod",
            "victim",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"DisruptionTarget\")].reason}",
        ],
        |o| o == "PreemptionByScheduler",
    );
    c.eventually(
        &[
            "get",
            "pod",
            "victim",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ],
        |o| !o.is_empty(),
    );
    c.ok(&[
        "patch",
        "pod",
        "victim",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    c.eventually(
        &["get", "pod", "preemptor", "-o", "jsonpath={.spec.nodeName}"],
        |o| o == "sim-0",
    );
    let pods = c.ok(&["get", "pods", "-o", "name"]);
    assert!(!pods.contains("pod/victim"), "{pods}");
    c.eventually(
        &[
            "get",
            "events",
            "--field-selector",
            "reason=Preempted",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        |o| o.contains("Preempted by default/preemptor on node sim-0"),
    );
}

#[test]
fn indexed_jobs_track_indexes_fail_per_index_and_end_by_their_policies() {
    let c = Cluster::start();
    c.run_controllers(1);
    c.eventually(&["get", "nodes", "-o", "name"], |o| count(o) == 1);
    let job = |name: &str, codes: &str, extra: &str| {
        format!(
            "apiVersion: batch/v1
kind: Job
metadata: {{name: {name}}}
spec:
  completions: 4
  parallelism: 2
  completionMode: Indexed
{extra}
  template:
    metadata: {{annotations: {{minik8s.io/sim-exit-code: \"{codes}\"}}}}
    spec:
      restartPolicy: Never
      containers: [{{name: work, image: busybox, command: [\"true\"]}}]
"
        )
    };
    let field =
        |name: &str, path: &str| c.ok(&["get", "job", name, "-o", &format!("jsonpath={{{path}}}")]);
    let wait = |name: &str, condition: &str| {
        let r = c.kubectl(&[
            "wait",
            &format!("--for=condition={condition}"),
            &format!("job/{name}"),
            "--timeout=60s",
        ]);
        assert!(r.ok, "{name}: {r:?}");
    };

    // Odd indexes fail; each may fail twice (backoffLimitPerIndex 1), even ones succeed.
    let per_index = job("per-index", "0,1,0,1", "  backoffLimitPerIndex: 1");
    assert!(c.with_manifest(&["apply"], &per_index).ok);
    let r = c.with_manifest(&["apply"], &per_index);
    assert!(r.ok && r.stdout.contains("unchanged"), "{r:?}");
    wait("per-index", "failed");
    assert_eq!(
        field(
            "per-index",
            ".status.failedIndexes}/{.status.completedIndexes}/{.status.failed}/{.status.succeeded"
        ),
        "1,3/0,2/4/2"
    );
    assert_eq!(
        field(
            "per-index",
            ".status.conditions[?(@.type==\"Failed\")].reason"
        ),
        "FailedIndexes"
    );
    // Every pod carries its index as annotation, label and hostname.
    let pods = c.ok(&[
        "get",
        "pods",
        "-l",
        "job-name=per-index",
        "-o",
        "jsonpath={range .items[*]}{.metadata.labels.batch\\.kubernetes\\.io/job-completion-index}:{.spec.hostname}:{.metadata.annotations.batch\\.kubernetes\\.io/job-index-failure-count}{\"\\n\"}{end}",
    ]);
    let mut lines: Vec<&str> = pods.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "0:per-index-0:0",
            "1:per-index-1:0",
            "1:per-index-1:1",
            "2:per-index-2:0",
            "3:per-index-3:0",
            "3:per-index-3:1"
        ]
    );

    // A success policy ends the Job once index 0 succeeded; the rest are not run to the end.
    let policy = job(
        "early",
        "0,1,1,1",
        "  successPolicy: {rules: [{succeededIndexes: \"0\"}]}\n  backoffLimit: 100",
    );
    assert!(c.with_manifest(&["apply"], &policy).ok);
    wait("early", "complete");
    assert_eq!(
        field(
            "early",
            ".status.conditions[?(@.type==\"Complete\")].reason}/{.status.completedIndexes"
        ),
        "SuccessPolicy/0"
    );

    // A FailJob rule of the pod failure policy fails the Job at the first matching exit code.
    let fail_job = job(
        "fail-fast",
        "0,3,0,0",
        "  podFailurePolicy: {rules: [{action: FailJob, onExitCodes: {operator: In, values: [3]}}]}",
    );
    assert!(c.with_manifest(&["apply"], &fail_job).ok);
    wait("fail-fast", "failed");
    let message = field(
        "fail-fast",
        ".status.conditions[?(@.type==\"Failed\")].message",
    );
    assert!(
        message.starts_with("Container work for pod default/fail-fast-1-")
            && message.ends_with("failed with exit code 3 matching FailJob rule at index 0"),
        "{message}"
    );
    let described = c.ok(&["describe", "job", "fail-fast"]);
    assert!(
        described.contains("Indexed") && described.contains("0 Active"),
        "{described}"
    );
}

#[test]
fn every_namespace_keeps_its_root_ca_config_map() {
    let c = Cluster::start();
    c.run_named_controllers(&["root-ca-cert-publisher"], c.shutdown_token());
    c.ok(&["create", "namespace", "team"]);
    let ca = |c: &Cluster| {
        c.kubectl(&[
            "get",
            "configmap",
            "kube-root-ca.crt",
            "-n",
            "team",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ])
        .stdout
    };
    let want = std::fs::read_to_string(c.ca_path()).unwrap();
    c.eventually(&["get", "configmap", "-n", "team", "-o", "name"], |o| {
        o.contains("configmap/kube-root-ca.crt")
    });
    // Deleted, it is put back.
    c.ok(&["delete", "configmap", "kube-root-ca.crt", "-n", "team"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ca(&c).trim() != want.trim() {
        assert!(
            std::time::Instant::now() < deadline,
            "never published again"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Emptied, it is restored.
    c.ok(&[
        "patch",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "team",
        "--type=merge",
        "-p",
        r#"{"data":{"ca.crt":""}}"#,
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ca(&c).trim() != want.trim() {
        assert!(std::time::Instant::now() < deadline, "never restored");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn custom_endpoints_are_mirrored_and_a_services_endpoints_go_with_it() {
    let c = Cluster::start();
    c.run_named_controllers(
        &["endpoints", "endpointslice-mirroring", "garbagecollector"],
        c.shutdown_token(),
    );
    let slices = |c: &Cluster, svc: &str| {
        c.ok(&[
            "get",
            "endpointslices",
            "-l",
            &format!("kubernetes.io/service-name={svc}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.labels.endpointslice\\.kubernetes\\.io/managed-by} {.endpoints[*].addresses[0]} {.ports[0].port}{\"\\n\"}{end}",
        ])
    };
    // A Service without a selector and Endpoints written by hand: mirrored into a slice.
    let manifest = r#"apiVersion: v1
kind: Service
metadata: {name: external}
spec: {ports: [{name: example, port: 80, protocol: TCP}]}
---
apiVersion: v1
kind: Endpoints
metadata: {name: external}
subsets:
- addresses: [{ip: 10.1.2.3}]
  ports: [{name: example, port: 80, protocol: TCP}]
"#;
    assert!(c.with_manifest(&["apply"], manifest).ok);
    c.eventually(&["get", "endpointslices", "-o", "name"], |o| {
        o.contains("endpointslice.discovery.k8s.io/external-")
    });
    assert_eq!(
        slices(&c, "external").trim(),
        "endpointslicemirroring-controller.k8s.io 10.1.2.3 80"
    );
    // An update is mirrored.
    c.ok(&[
        "patch",
        "endpoints",
        "external",
        "--type=merge",
        "-p",
        r#"{"subsets":[{"addresses":[{"ip":"10.2.3.4"}],"ports":[{"name":"example","port":80,"protocol":"TCP"}]}]}"#,
    ]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !slices(&c, "external").contains("10.2.3.4") {
        assert!(
            std::time::Instant::now() < deadline,
            "update never mirrored"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Deleting the Endpoints removes the mirrored slice.
    c.ok(&["delete", "endpoints", "external"]);
    c.eventually(
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=external",
            "-o",
            "name",
        ],
        |o| o.trim().is_empty(),
    );

    // A Service with a selector: its Endpoints (not mirrored) go when it is deleted.
    c.ok(&["create", "service", "clusterip", "web", "--tcp=80"]);
    c.eventually(&["get", "endpoints", "-o", "name"], |o| {
        o.contains("endpoints/web")
    });
    assert_eq!(
        c.ok(&[
            "get",
            "endpoints",
            "web",
            "-o",
            "jsonpath={.metadata.labels.endpointslice\\.kubernetes\\.io/skip-mirror}"
        ]),
        "true"
    );
    c.eventually(
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "jsonpath={.items[*].metadata.labels.endpointslice\\.kubernetes\\.io/managed-by}",
        ],
        |o| o.trim() == "endpointslice-controller.k8s.io",
    );
    c.ok(&["delete", "service", "web"]);
    c.eventually(&["get", "endpoints", "-o", "name"], |o| {
        !o.contains("endpoints/web")
    });
}

#[test]
fn namespace_deletion_removes_pods_first_and_says_what_remains() {
    let c = Cluster::start();
    c.run_named_controllers(&["namespace"], c.shutdown_token());
    c.ok(&["create", "namespace", "doomed"]);
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"held","namespace":"doomed",
        "finalizers":["e2e.example.com/finalizer"]},
        "spec":{"containers":[{"name":"c","image":"pause"}]}}"#;
    assert!(c.with_manifest(&["create"], pod).ok);
    c.ok(&[
        "create",
        "configmap",
        "kept",
        "-n",
        "doomed",
        "--from-literal=k=v",
    ]);
    c.ok(&["delete", "namespace", "doomed", "--wait=false"]);
    // While the pod waits for its finalizer, nothing else is deleted, and the namespace's
    // conditions say why.
    let conditions = c.eventually(
        &[
            "get",
            "namespace",
            "doomed",
            "-o",
            "jsonpath={range .status.conditions[*]}{.type}={.status}:{.message}{\"\\n\"}{end}",
        ],
        |o| o.contains("NamespaceFinalizersRemaining=True"),
    );
    assert!(
        conditions.contains("NamespaceContentRemaining=True:Some resources are remaining: pods. has 1 resource instances"),
        "{conditions}"
    );
    assert!(
        conditions.contains("NamespaceFinalizersRemaining=True:Some content in the namespace has finalizers remaining: e2e.example.com/finalizer in 1 resource instances"),
        "{conditions}"
    );
    assert!(
        conditions.contains("NamespaceDeletionContentFailure=False"),
        "{conditions}"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        c.ok(&["get", "configmap", "-n", "doomed", "-o", "name"])
            .contains("configmap/kept")
    );
    assert!(
        !c.ok(&[
            "get",
            "pod",
            "held",
            "-n",
            "doomed",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}"
        ])
        .is_empty()
    );
    // Once the pod goes, the rest goes and so does the namespace.
    c.ok(&[
        "patch",
        "pod",
        "held",
        "-n",
        "doomed",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    c.eventually(&["get", "namespaces", "-o", "name"], |o| {
        !o.contains("namespace/doomed")
    });
}

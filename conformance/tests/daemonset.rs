//! DaemonSets: one pod per eligible node (a tainted node only when tolerated, a cordoned one
//! still), a template change rolls through the nodes, and `kubectl rollout history|undo`
//! work from the ControllerRevisions; with `maxSurge` the new pod starts next to the old one.

use minik8s_conformance::Cluster;
use std::collections::BTreeSet;
use std::time::Duration;

const AGENT: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers: [{name: agent, image: busybox, command: [sleep, "3600"]}]
"#;

fn nodes_of(c: &Cluster) -> BTreeSet<String> {
    c.ok(&[
        "get",
        "pods",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={range .items[?(@.status.phase==\"Running\")]}{.spec.nodeName} {end}",
    ])
    .split_whitespace()
    .map(str::to_owned)
    .collect()
}

#[test]
fn a_daemonset_runs_on_every_eligible_node_rolls_and_rolls_back() {
    let c = Cluster::start();
    c.run_controllers(3);
    c.eventually(&["get", "nodes", "-o", "name"], |s| s.lines().count() == 3);
    c.ok(&["taint", "nodes", "sim-2", "dedicated=gpu:NoSchedule"]);
    c.ok(&["cordon", "sim-1"]);
    let r = c.with_manifest(&["apply"], AGENT);
    assert!(r.ok, "{}", r.stderr);
    c.ok(&["rollout", "status", "daemonset/agent", "--timeout=60s"]);
    c.eventually(
        &[
            "get",
            "ds",
            "agent",
            "-o",
            "jsonpath={.status.desiredNumberScheduled} {.status.numberReady} {.status.updatedNumberScheduled}",
        ],
        |s| s == "2 2 2",
    );
    let want: BTreeSet<String> = ["sim-0", "sim-1"].iter().map(|s| s.to_string()).collect();
    assert_eq!(
        nodes_of(&c),
        want,
        "not on the tainted node; still on the cordoned one"
    );
    // The revision holds the template as Go's encoding writes it (upstream's daemon.Match
    // compares it byte for byte): containers' resources even when empty, and, since 1.33's
    // omitzero, no creationTimestamp in the template's metadata.
    let rev: serde_json::Value = serde_json::from_str(&c.ok(&[
        "get",
        "controllerrevisions",
        "-l",
        "app=agent",
        "-o",
        "json",
    ]))
    .unwrap();
    let template = &rev["items"][0]["data"]["spec"]["template"];
    assert!(
        template["metadata"]
            .as_object()
            .is_some_and(|m| !m.contains_key("creationTimestamp")),
        "{template}"
    );
    assert!(
        template["spec"]["containers"][0]["resources"].is_object(),
        "{template}"
    );
    assert_eq!(template["$patch"], "replace");
    // The DaemonSet controller says what it did, as upstream's.
    let described = c.eventually(&["describe", "daemonset", "agent"], |s| {
        s.contains("SuccessfulCreate")
    });
    assert!(described.contains("Created pod: agent-"), "{described}");
    let pod_tolerations = c.ok(&[
        "get",
        "pods",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={.items[0].spec.tolerations[*].key}",
    ]);
    assert!(
        pod_tolerations.contains("node.kubernetes.io/unreachable")
            && pod_tolerations.contains("node.kubernetes.io/unschedulable"),
        "{pod_tolerations}"
    );

    // Tolerating the taint rolls the DaemonSet onto all three nodes.
    c.ok(&[
        "patch",
        "ds",
        "agent",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"tolerations":[{"key":"dedicated","operator":"Exists"}]}}}}"#,
    ]);
    c.ok(&["rollout", "status", "daemonset/agent", "--timeout=60s"]);
    c.eventually(
        &[
            "get",
            "ds",
            "agent",
            "-o",
            "jsonpath={.status.desiredNumberScheduled} {.status.updatedNumberScheduled} {.status.numberReady}",
        ],
        |s| s == "3 3 3",
    );
    c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "app=agent",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        |s| {
            let mut n: Vec<&str> = s.split_whitespace().collect();
            n.sort();
            n == ["sim-0", "sim-1", "sim-2"]
        },
    );
    let history = c.ok(&["rollout", "history", "daemonset/agent"]);
    assert!(
        history.lines().any(|l| l.trim_start().starts_with('1'))
            && history.lines().any(|l| l.trim_start().starts_with('2')),
        "{history}"
    );

    // Undo: back to the first template, off the tainted node.
    c.ok(&["rollout", "undo", "daemonset/agent"]);
    c.ok(&["rollout", "status", "daemonset/agent", "--timeout=60s"]);
    c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "app=agent",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        |s| {
            let mut n: Vec<&str> = s.split_whitespace().collect();
            n.sort();
            n == ["sim-0", "sim-1"]
        },
    );
    assert!(
        c.ok(&[
            "get",
            "ds",
            "agent",
            "-o",
            "jsonpath={.spec.template.spec.tolerations}"
        ])
        .is_empty()
    );

    // maxSurge: the new pod starts next to the old one, which goes once the new is ready
    // (one node at a time), so the pods never fall below one per node. A watch sees every
    // step of the rollout, however fast it goes.
    let most = live_pods_high_water_mark(&c);
    c.ok(&[
        "patch",
        "ds",
        "agent",
        "--type=merge",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"maxSurge":1,"maxUnavailable":0}},"template":{"metadata":{"annotations":{"rev":"surge"}}}}}"#,
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pods = c.ok(&["get", "pods", "-l", "app=agent", "-o", "jsonpath={range .items[*]}{.metadata.annotations.rev},{.status.conditions[?(@.type==\"Ready\")].status},{.metadata.deletionTimestamp}{\"\\n\"}{end}"]);
        // Live pods (not being deleted): `rev,ready,`.
        let lines: Vec<&str> = pods.lines().filter(|l| l.ends_with(',')).collect();
        if lines.len() == 2 && lines.iter().all(|l| l.starts_with("surge,True")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "surge rollout: {pods}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        most.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "one surge pod at a time"
    );
}

/// Watches the agent pods from now on; the returned count is the most pods alive (not
/// being deleted) at once.
fn live_pods_high_water_mark(c: &Cluster) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let most = std::sync::Arc::new(AtomicUsize::new(0));
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::default_namespaced(c.client());
    let (seen, out) = (std::sync::Arc::new(AtomicUsize::new(0)), most.clone());
    let started = seen.clone();
    c.spawn(async move {
        let mut live = std::collections::BTreeSet::new();
        let events = watcher(pods, watcher::Config::default().labels("app=agent"));
        futures::pin_mut!(events);
        while let Some(Ok(ev)) = events.next().await {
            match ev {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    if p.metadata.deletion_timestamp.is_none() {
                        live.insert(name);
                    } else {
                        live.remove(&name);
                    }
                }
                watcher::Event::Delete(p) => {
                    live.remove(&p.metadata.name.clone().unwrap_or_default());
                }
                watcher::Event::InitDone => {
                    started.store(1, Ordering::SeqCst);
                }
                watcher::Event::Init => {}
            }
            out.fetch_max(live.len(), Ordering::SeqCst);
        }
    });
    while seen.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    most.store(0, Ordering::SeqCst);
    most
}

#[test]
fn a_revision_made_by_a_client_with_the_same_data_becomes_the_current_one() {
    let c = Cluster::start();
    c.run_controllers(1);
    let r = c.with_manifest(&["apply"], AGENT);
    assert!(r.ok, "{}", r.stderr);
    let revisions = |c: &Cluster| {
        c.ok(&[
            "get",
            "controllerrevisions",
            "-l",
            "app=agent",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.revision}{\"\\n\"}{end}",
        ])
    };
    c.eventually(
        &[
            "get",
            "controllerrevisions",
            "-l",
            "app=agent",
            "-o",
            "name",
        ],
        |o| o.lines().count() == 1,
    );
    // A client copies the revision under another name with a higher number, then deletes
    // the original (as v1.34's ControllerRevision lifecycle spec does). Revisions are not
    // watched (as upstream's): the controller does not race the client for the original.
    let first: serde_json::Value = serde_json::from_str(&c.ok(&[
        "get",
        "controllerrevisions",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={.items[0]}",
    ]))
    .unwrap();
    let copy = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": "agent-copy", "labels": first["metadata"]["labels"],
            "ownerReferences": first["metadata"]["ownerReferences"]},
        "data": first["data"], "revision": first["revision"].as_i64().unwrap() + 1,
    });
    assert!(c.with_manifest(&["create"], &copy.to_string()).ok);
    let original = first["metadata"]["name"].as_str().unwrap().to_owned();
    std::thread::sleep(Duration::from_secs(1));
    c.ok(&["delete", "controllerrevision", &original]);
    // A template change makes a second revision.
    c.ok(&[
        "patch",
        "daemonset",
        "agent",
        "-p",
        r#"{"spec":{"template":{"spec":{"terminationGracePeriodSeconds":1}}}}"#,
    ]);
    // A sync (the template's change) keeps the copy and adds the new template's revision.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = revisions(&c);
        if now.lines().count() == 2 && now.contains("agent-copy=") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{now}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

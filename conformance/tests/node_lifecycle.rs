//! The node lifecycle controller against a real apiserver: a node whose heartbeats stop
//! becomes Ready=Unknown with the unreachable taints; its pods are evicted when their
//! toleration runs out (at once without one, never with an unbounded one); a node that
//! heartbeats and reports Ready again loses the taints.

use minik8s_conformance::Cluster;
use std::time::Duration;

const NODE: &str = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "quiet"},
  "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
    "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    "capacity": {"cpu": "2", "memory": "2Gi", "pods": "10"},
    "allocatable": {"cpu": "2", "memory": "2Gi", "pods": "10"}}}"#;

fn pod(name: &str, tolerations: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}"}},
  "spec": {{"nodeName": "quiet", "containers": [{{"name": "c", "image": "busybox"}}],
    "tolerations": {tolerations}}}}}"#
    )
}

#[test]
fn silent_nodes_are_tainted_and_their_pods_evicted_after_their_tolerations() {
    let c = Cluster::start();
    let cfg = minik8s_controllers::nodelifecycle::Config {
        grace: Duration::from_secs(3),
        period: Duration::from_millis(500),
    };
    let (client, shutdown) = (c.client(), c.shutdown_token());
    let informers = minik8s_controllers::informer::Informers::new(
        client.clone(),
        tokio_util::task::TaskTracker::new(),
        shutdown.clone(),
    );
    c.spawn(minik8s_controllers::nodelifecycle::run(
        client, cfg, informers, shutdown,
    ));
    assert!(c.with_manifest(&["create"], NODE).ok);
    // No toleration of our own: the apiserver adds the 300 s defaults.
    assert!(c.with_manifest(&["create"], &pod("defaulted", "[]")).ok);
    assert_eq!(
        c.ok(&[
            "get",
            "pod",
            "defaulted",
            "-o",
            "jsonpath={.spec.tolerations[?(@.key==\"node.kubernetes.io/unreachable\")].tolerationSeconds}"
        ]),
        "300"
    );
    let brief = r#"[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}]"#;
    assert!(c.with_manifest(&["create"], &pod("brief", brief)).ok);
    assert!(
        c.with_manifest(&["create"], &pod("stubborn", r#"[{"operator": "Exists"}]"#))
            .ok
    );

    // Nothing heartbeats for "quiet": after the grace period it is Unknown and tainted.
    c.eventually(
        &[
            "get",
            "node",
            "quiet",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        |o| o == "Unknown",
    );
    let taints = c.eventually(
        &[
            "get",
            "node",
            "quiet",
            "-o",
            "jsonpath={range .spec.taints[*]}{.key}:{.effect} {end}",
        ],
        |o| o.contains("NoExecute"),
    );
    assert_eq!(
        taints.trim(),
        "node.kubernetes.io/unreachable:NoSchedule node.kubernetes.io/unreachable:NoExecute"
    );
    // The 2 s toleration runs out and the pod is deleted (it stays Terminating, as upstream,
    // until a kubelet confirms); the others stay (300 s, and forever).
    let deleting = [
        "get",
        "pods",
        "-o",
        "jsonpath={range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name} {end}",
    ];
    c.eventually(&deleting, |o| o.trim() == "brief");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.ok(&deleting).trim(), "brief");

    // The kubelet comes back: a Lease renewal and Ready=True remove the taints.
    let stamp = jiff_now();
    let lease = format!(
        r#"{{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {{"name": "quiet", "namespace": "kube-node-lease"}},
  "spec": {{"holderIdentity": "quiet", "leaseDurationSeconds": 40, "renewTime": "{stamp}"}}}}"#
    );
    assert!(c.with_manifest(&["create"], &lease).ok);
    c.ok(&[
        "patch",
        "node",
        "quiet",
        "--subresource=status",
        "--type=strategic",
        "-p",
        &format!(r#"{{"status": {{"conditions": [{{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "{stamp}"}}]}}}}"#),
    ]);
    c.eventually(
        &["get", "node", "quiet", "-o", "jsonpath={.spec.taints}"],
        |o| o.trim().is_empty(),
    );
}

fn jiff_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // RFC 3339 with microseconds, as MicroTime wants, via `date`.
    let out = std::process::Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{secs}"),
            "+%Y-%m-%dT%H:%M:%S.000000Z",
        ])
        .output()
        .expect("date");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

//! PodDisruptionBudgets: the disruption controller keeps their status, the eviction
//! subresource refuses an eviction that would break one (429 with upstream's message and
//! cause), and `kubectl drain` therefore moves a guarded Deployment one pod at a time.

use minik8s_conformance::Cluster;
use std::time::Duration;

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: busybox}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
"#;

#[test]
fn a_budget_limits_evictions_and_drain_moves_pods_one_at_a_time() {
    let c = Cluster::start();
    c.run_controllers(2);
    c.eventually(&["get", "nodes", "-o", "name"], |s| s.lines().count() == 2);
    // Everything starts on sim-0.
    c.ok(&["cordon", "sim-1"]);
    let r = c.with_manifest(&["apply"], WEB);
    assert!(r.ok, "{}", r.stderr);
    c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let status = c.eventually(
        &[
            "get",
            "pdb",
            "web",
            "-o",
            "jsonpath={.status.expectedPods} {.status.desiredHealthy} {.status.currentHealthy} {.status.disruptionsAllowed} {.status.conditions[0].reason}",
        ],
        |s| s == "3 2 3 1 SufficientPods",
    );
    assert_eq!(status, "3 2 3 1 SufficientPods");
    let table = c.ok(&["get", "pdb", "web"]);
    assert!(
        table.contains("MIN AVAILABLE")
            && table
                .lines()
                .nth(1)
                .is_some_and(|l| l.split_whitespace().nth(3) == Some("1")),
        "{table}"
    );

    // The eviction API: one pod may go; the next one is refused while the first cannot be
    // replaced (both nodes cordoned).
    c.ok(&["cordon", "sim-0"]);
    // Give the scheduler's node cache a moment to see the cordon.
    std::thread::sleep(Duration::from_secs(1));
    let pods: Vec<String> = c
        .ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    // kubectl create --raw posts the Eviction as `kubectl drain` does (kube-rs would retry a
    // 429 with back-off for minutes).
    let evict = |pod: &str| {
        let body = format!(
            "{{\"apiVersion\": \"policy/v1\", \"kind\": \"Eviction\", \"metadata\": {{\"name\": \"{pod}\", \"namespace\": \"default\"}}}}"
        );
        c.kubectl_stdin(
            &[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
                "-f",
                "-",
            ],
            Some(&body),
        )
    };
    let first = evict(&pods[0]);
    assert!(first.ok, "the first eviction is allowed: {}", first.stderr);
    let second = evict(&pods[1]);
    assert!(
        !second.ok
            && second.stderr.contains(
                "Error from server (TooManyRequests): Cannot evict pod as it would violate the pod's disruption budget."
            ),
        "the second eviction breaks the budget: {}",
        second.stderr
    );
    // The eviction itself lowers disruptionsAllowed (as upstream's does); currentHealthy follows
    // when the controller next counts the pods, so wait for both.
    let status = c.eventually_within(
        Duration::from_secs(10),
        &[
            "get",
            "pdb",
            "web",
            "-o",
            "jsonpath={.status.currentHealthy} {.status.disruptionsAllowed}",
        ],
        |s| s == "2 0",
    );
    assert_eq!(status, "2 0", "the budget allows no more");

    // Drain: with sim-1 open again, the pods move one at a time, drain retrying on 429.
    c.ok(&["uncordon", "sim-1"]);
    let drained = c.kubectl(&[
        "drain",
        "sim-0",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=90s",
    ]);
    assert!(drained.ok, "{}\n{}", drained.stdout, drained.stderr);
    assert!(
        drained.stderr.contains(
            "(will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget."
        ),
        "drain met the budget:\n{}",
        drained.stderr
    );
    c.eventually_within(
        Duration::from_secs(30),
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
        |s| s.split_whitespace().collect::<Vec<_>>() == ["sim-1", "sim-1", "sim-1"],
    );

    // A budget with a bad selector is refused.
    let bad = c.with_manifest(
        &["apply"],
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: bad}\nspec:\n  minAvailable: 1\n  selector: {matchExpressions: [{key: app, operator: Bogus}]}\n",
    );
    assert!(
        !bad.ok && bad.stderr.contains("spec.selector"),
        "{}",
        bad.stderr
    );
}

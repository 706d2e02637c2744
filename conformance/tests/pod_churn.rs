//! Pod networking under churn. In a full v1.20 parallel run a new pod's address was
//! unreachable from its node (`No route to host`) for minutes. Here pods are created and
//! deleted in overlapping batches on one node until its /24 has been handed out more than
//! once, so addresses are reused, and every new pod must answer from the node and from
//! another pod within a second of being seen Running.
//!
//! `CHURN_PODS` sets how many pods are made (default 300: past one full turn of the node's
//! addresses); the docs record a run of thousands. This binary holds one test, so its node
//! meets no other test's.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use minik8s_conformance::Cluster;
use minik8s_conformance::node::http_get;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

const BATCH: usize = 10;

fn pod(name: &str, round: usize) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "churn", "round": round.to_string()}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "web", "image": "busybox",
                "command": ["sh", "-c", "hostname > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"]}]
        }
    }))
    .expect("a pod")
}

/// GETs `ip:8080` until it answers `name` or `budget` has passed; how long it took.
fn reachable_within(ip: &str, name: &str, budget: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < budget {
        if http_get(&format!("{ip}:8080")).as_deref() == Some(name) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn every_new_pod_answers_within_a_second_of_running_while_addresses_are_reused() {
    let total: usize = std::env::var("CHURN_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let c = Cluster::start();
    c.run_controllers(0);
    let _node = c.run_node("churn1", 44);
    c.ok(&[
        "run",
        "client",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sleep",
        "36000",
    ]);
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=120s",
    ]);
    let pods: Api<Pod> = Api::namespaced(c.client(), "default");
    let started = Instant::now();
    let mut addresses: BTreeMap<String, usize> = BTreeMap::new();
    let mut slowest = Duration::ZERO;
    let mut made = 0;
    let mut round = 0;
    while made < total {
        let n = BATCH.min(total - made);
        let names: Vec<String> = (0..n).map(|i| format!("churn-{round}-{i}")).collect();
        for name in &names {
            c.block_on(pods.create(&PostParams::default(), &pod(name, round)))
                .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        }
        // Each pod, once seen Running: from the node, then from the client pod.
        let mut pending: HashSet<String> = names.iter().cloned().collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut running: Vec<(String, String)> = Vec::new();
        while !pending.is_empty() {
            assert!(
                Instant::now() < deadline,
                "round {round}: not Running in 120 s: {pending:?}"
            );
            let list = c
                .block_on(pods.list(&ListParams::default().labels(&format!("round={round}"))))
                .expect("listing the round's pods");
            for p in list.items {
                let name = p.metadata.name.clone().unwrap_or_default();
                let status = p.status.unwrap_or_default();
                if !pending.contains(&name) || status.phase.as_deref() != Some("Running") {
                    continue;
                }
                let ip = status.pod_ip.expect("a Running pod has an address");
                pending.remove(&name);
                let took = reachable_within(&ip, &name, Duration::from_secs(1))
                    .unwrap_or_else(|| {
                        let neigh = std::process::Command::new("ip")
                            .args(["neigh", "show", &ip])
                            .output()
                            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                            .unwrap_or_default();
                        let route = std::process::Command::new("ip")
                            .args(["route", "get", &ip])
                            .output()
                            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                            .unwrap_or_default();
                        panic!(
                            "pod {name} ({ip}, pod {} of {total}) did not answer the node within 1 s of Running; neighbour: {neigh:?}; route: {route:?}",
                            made + 1
                        )
                    });
                slowest = slowest.max(took);
                *addresses.entry(ip.clone()).or_default() += 1;
                running.push((name, ip));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // From another pod: one exec reaching each of the batch's pods with a 1 s timeout.
        let script: String = running
            .iter()
            .map(|(name, ip)| {
                format!(
                    "b=$(wget -q -T 1 -O- http://{ip}:8080/ 2>&1); [ \"$b\" = {name} ] || echo \"{name} {ip}: $b\"; "
                )
            })
            .collect();
        let out = c.ok(&["exec", "client", "--", "sh", "-c", &script]);
        assert!(
            out.trim().is_empty(),
            "round {round}: pods the client pod could not reach: {out}"
        );
        made += n;
        // Delete the batch while the next one starts: addresses freed and handed out again.
        for (name, _) in &running {
            c.block_on(pods.delete(name, &DeleteParams::default().grace_period(0)))
                .unwrap_or_else(|e| panic!("deleting {name}: {e}"));
        }
        round += 1;
    }
    let reused = addresses.values().filter(|n| **n > 1).count();
    println!(
        "{total} pods in {:.0?}: {} addresses, {reused} of them handed out more than once; slowest first answer {slowest:.0?}",
        started.elapsed(),
        addresses.len()
    );
    assert!(
        total < 260 || reused > 0,
        "the node's /24 must have been reused: {addresses:?}"
    );
}

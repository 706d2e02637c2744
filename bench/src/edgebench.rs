//! The edge benchmark behind `edge-bench`: a control plane made with `minik8s init`, one edge
//! machine (a network namespace running the real `edgelet`, joined with `edgectl`) and one
//! normal machine (`minik8s join`), side by side:
//!
//! - the edgelet's idle RSS (and its containerd's, apart);
//! - the cloud–edge link's bytes per minute while idle (the veth's counters: watch
//!   keep-alives, pings, HTTP/2 and TLS);
//! - pod create → Running on the edge and on the normal node;
//! - the reconcile after an outage: `changed` pods changed in the cloud while the link is
//!   down (half deleted, half created), and the time from the link's return until the cloud
//!   sees every deleted pod gone and every new pod Running.

use crate::bench::{percentiles, rss_mib};
use minik8s_conformance::machines::{InitCluster, Machine};
use minik8s_conformance::node::free_port;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct Args {
    /// Pods started one after another on each node.
    pub pods: usize,
    /// How long the link is down.
    pub outage: Duration,
    /// Pods changed during the outage (half deleted, half created).
    pub changed: usize,
}

fn join(c: &InitCluster, m: &Machine) -> anyhow::Result<()> {
    let r = m.edgectl(&[
        "join",
        &c.edge_registry(),
        "--token",
        c.token(),
        "--discovery-token-ca-cert-hash",
        c.ca_hash(),
    ]);
    anyhow::ensure!(r.ok, "edgectl join: {}", r.stderr);
    Ok(())
}

fn link_bytes(m: &Machine) -> u64 {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/mk8sv-{}/statistics/{f}", m.name))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    read("rx_bytes") + read("tx_bytes")
}

fn pods_yaml(prefix: &str, from: usize, to: usize, node: &str) -> String {
    (from..to)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {prefix}-{i}, labels: {{bench: {prefix}}}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  nodeSelector: {{kubernetes.io/hostname: {node}}}\n  tolerations: [{{key: virtual-kubelet.io/provider, operator: Exists}}]\n  containers: [{{name: c, image: busybox, imagePullPolicy: IfNotPresent, command: [sleep, '3600']}}]\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn running(c: &InitCluster, label: &str) -> usize {
    c.ok(&[
        "get",
        "pods",
        "-l",
        &format!("bench={label}"),
        "-o",
        "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
    ])
    .lines()
    .filter(|l| *l == "Running")
    .count()
}

fn wait_running(
    c: &InitCluster,
    label: &str,
    n: usize,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    while running(c, label) < n {
        anyhow::ensure!(
            t.elapsed() < limit,
            "{n} {label} pods not Running in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(t.elapsed())
}

/// Runs the benchmark; its figures.
pub fn run(args: &Args) -> anyhow::Result<Value> {
    let c = InitCluster::start(free_port());
    let edge = c.edge_machine("edge-a", 31, &[]);
    join(&c, &edge)?;
    c.node_condition("edge-a", "Ready", "True", Duration::from_secs(120));
    let normal = c.join_machine("node-b", 32);
    // Idle: joined, no pods.
    std::thread::sleep(Duration::from_secs(30));
    let pid = edge
        .pid()
        .ok_or_else(|| anyhow::anyhow!("the edgelet is not running"))?;
    let edgelet_rss = rss_mib(pid);
    let containerd_pid: u32 =
        std::fs::read_to_string(c.dir().join("edge-a/edge/node/containerd/containerd.pid"))?
            .trim()
            .parse()?;
    let containerd_rss = rss_mib(containerd_pid);
    let before = link_bytes(&edge);
    std::thread::sleep(Duration::from_secs(60));
    let link_per_minute = link_bytes(&edge) - before;

    // Pod starts, the edge beside the normal node.
    let rt = tokio::runtime::Runtime::new()?;
    let client = rt.block_on(minik8s_kubeconfig::client(&c.kubeconfig))?;
    let mut on_edge = rt.block_on(async {
        crate::nodebench::pod_starts_on(client.clone(), 1, Some("edge-a")).await?;
        crate::nodebench::pod_starts_on(client.clone(), args.pods, Some("edge-a")).await
    })?;
    let mut on_node = rt.block_on(async {
        crate::nodebench::pod_starts_on(client.clone(), 1, Some(&normal.name)).await?;
        crate::nodebench::pod_starts_on(client.clone(), args.pods, Some(&normal.name)).await
    })?;

    // Reconcile after an outage with `changed` pods changed in the cloud.
    let half = args.changed / 2;
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &pods_yaml("edge-old", 0, half, "edge-a"),
    );
    let old_running = wait_running(&c, "edge-old", half, Duration::from_secs(600))?;
    edge.link(false);
    let cut = Instant::now();
    c.node_condition("edge-a", "Ready", "Unknown", Duration::from_secs(120));
    c.ok(&["delete", "pods", "-l", "bench=edge-old", "--wait=false"]);
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &pods_yaml("edge-new", 0, half, "edge-a"),
    );
    while cut.elapsed() < args.outage {
        std::thread::sleep(Duration::from_secs(1));
    }
    let back = Instant::now();
    edge.link(true);
    loop {
        let old = c.ok(&["get", "pods", "-l", "bench=edge-old", "-o", "name"]);
        if old.trim().is_empty() && running(&c, "edge-new") == half {
            break;
        }
        anyhow::ensure!(
            back.elapsed() < Duration::from_secs(900),
            "no reconcile in 15 min"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let reconcile = back.elapsed();
    let evicted = c
        .ok(&["get", "pods", "-l", "bench=edge-new", "-o", "name"])
        .lines()
        .count();
    c.ok(&["delete", "pods", "-l", "bench=edge-new", "--wait=false"]);
    drop(normal);
    Ok(json!({
        "edgelet_idle_rss_mib": (edgelet_rss * 10.0).round() / 10.0,
        "edge_containerd_idle_rss_mib": (containerd_rss * 10.0).round() / 10.0,
        "link_bytes_per_minute_idle": link_per_minute,
        "pod_start_edge": percentiles(&mut on_edge),
        "pod_start_normal_node": percentiles(&mut on_node),
        "outage": {
            "seconds": args.outage.as_secs(),
            "pods_changed": 2 * half,
            "first_pods_running_s": old_running.as_secs_f64(),
            "reconcile_after_link_returns_s": (reconcile.as_secs_f64() * 100.0).round() / 100.0,
            "new_pods_present": evicted,
        },
    }))
}

//! The edge benchmark behind `edge-bench`: a control plane made with `minik8s init`, one edge
//! machine (a network namespace running the real `edgelet`, joined with `edgectl`) and one
//! normal machine (`minik8s join`), side by side:
//!
//! - the edgelet's idle RSS (and its containerd's, apart);
//! - the cloud–edge link's bytes per minute while idle (the veth's counters: watch
//!   keep-alives, pings, HTTP/2 and TLS);
//! - pod create → Running on the edge and on the normal node;
//! - streams over the edge link beside the normal node's: exec round trip (kube-rs's exec of
//!   `true`, call to exit status) and port-forward throughput (`kubectl port-forward`, a
//!   file read from the pod's httpd);
//! - the reconcile after an outage: `changed` pods changed in the cloud while the link is
//!   down (half deleted, half created), and the time from the link's return until the cloud
//!   sees every deleted pod gone and every new pod Running (skipped with `changed` 0).

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
    /// Exec round trips timed on each node.
    pub execs: usize,
    /// MiB read through each port-forward (three times).
    pub forward_mib: usize,
}

fn join(c: &InitCluster, m: &Machine) -> anyhow::Result<()> {
    let r = c.edge_join(m, &[]);
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

/// A pod on `node` serving a `mib` MiB file (`/big`) with httpd on 8080.
fn file_server(name: &str, node: &str, mib: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{bench: streams}}}}\nspec:\n  terminationGracePeriodSeconds: 0\n  nodeSelector: {{kubernetes.io/hostname: {node}}}\n  tolerations: [{{key: virtual-kubelet.io/provider, operator: Exists}}]\n  containers: [{{name: web, image: busybox, imagePullPolicy: IfNotPresent, command: [sh, -c, 'mkdir -p /www && head -c {bytes} /dev/zero > /www/big && exec httpd -f -p 8080 -h /www']}}]\n",
        bytes = mib << 20
    )
}

/// `execs` kube-rs execs of `true` in pod `name`: call → exit status, each.
async fn exec_round_trips(
    client: kube::Client,
    name: &str,
    execs: usize,
) -> anyhow::Result<Vec<Duration>> {
    use kube::api::{Api, AttachParams};
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::default_namespaced(client);
    let mut out = Vec::with_capacity(execs);
    for _ in 0..execs {
        let t = Instant::now();
        let mut p = pods
            .exec(
                name,
                ["true"],
                &AttachParams::default().stdout(true).stderr(false),
            )
            .await?;
        let status = p
            .take_status()
            .ok_or_else(|| anyhow::anyhow!("no status channel"))?
            .await;
        anyhow::ensure!(
            status.as_ref().and_then(|s| s.status.as_deref()) == Some("Success"),
            "exec in {name}: {status:?}"
        );
        out.push(t.elapsed());
        p.join().await?;
    }
    Ok(out)
}

/// MiB/s reading `/big` (`mib` MiB) through `kubectl port-forward` to pod `name`: the best
/// and the slowest of three reads.
fn forward_throughput(c: &InitCluster, name: &str, mib: usize) -> anyhow::Result<(f64, f64)> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = std::process::Command::new("kubectl")
        .args(["port-forward", &format!("pod/{name}"), ":8080"])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line)?;
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let port: u16 = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("port-forward printed {line:?}"))?;
    let mut rates = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.write_all(b"GET /big HTTP/1.0\r\n\r\n")?;
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0usize;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n;
        }
        anyhow::ensure!(total >= mib << 20, "read {total} bytes of {} MiB", mib);
        rates.push(total as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
    }
    let _ = child.kill();
    let _ = child.wait();
    let best = rates.iter().cloned().fold(0.0, f64::max);
    let worst = rates.iter().cloned().fold(f64::INFINITY, f64::min);
    Ok(((best * 10.0).round() / 10.0, (worst * 10.0).round() / 10.0))
}

/// Exec round trips and port-forward throughput on the edge and on the normal node.
fn streams(c: &InitCluster, normal: &str, args: &Args) -> anyhow::Result<Value> {
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &(file_server("files-edge", "edge-a", args.forward_mib)
            + "---\n"
            + &file_server("files-node", normal, args.forward_mib)),
    );
    wait_running(c, "streams", 2, Duration::from_secs(120))?;
    // The file is written before httpd starts; wait until it serves.
    std::thread::sleep(Duration::from_secs(3));
    let rt = tokio::runtime::Runtime::new()?;
    let client = rt.block_on(minik8s_kubeconfig::client(&c.kubeconfig))?;
    let mut figures = serde_json::Map::new();
    for (label, pod) in [("edge", "files-edge"), ("normal_node", "files-node")] {
        rt.block_on(exec_round_trips(client.clone(), pod, 2))?;
        let mut rtt = rt.block_on(exec_round_trips(client.clone(), pod, args.execs))?;
        let (best, worst) = forward_throughput(c, pod, args.forward_mib)?;
        figures.insert(
            label.to_owned(),
            json!({
                "exec_round_trip": percentiles(&mut rtt),
                "port_forward_mib_per_s": {"best": best, "slowest": worst},
            }),
        );
    }
    c.ok(&["delete", "pods", "-l", "bench=streams", "--wait=false"]);
    Ok(Value::Object(figures))
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

    let streams = streams(&c, &normal.name, args)?;

    let mut figures = json!({
        "edgelet_idle_rss_mib": (edgelet_rss * 10.0).round() / 10.0,
        "edge_containerd_idle_rss_mib": (containerd_rss * 10.0).round() / 10.0,
        "link_bytes_per_minute_idle": link_per_minute,
        "pod_start_edge": percentiles(&mut on_edge),
        "pod_start_normal_node": percentiles(&mut on_node),
        "streams": streams,
    });

    // Reconcile after an outage with `changed` pods changed in the cloud.
    let half = args.changed / 2;
    if half == 0 {
        return Ok(figures);
    }
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
    figures["outage"] = json!({
        "seconds": args.outage.as_secs(),
        "pods_changed": 2 * half,
        "first_pods_running_s": old_running.as_secs_f64(),
        "reconcile_after_link_returns_s": (reconcile.as_secs_f64() * 100.0).round() / 100.0,
        "new_pods_present": evicted,
    });
    Ok(figures)
}

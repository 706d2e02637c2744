//! The cluster DNS benchmark: an apiserver with `services` Services, one node's DNS server
//! (the proxy's, in this process) on a loopback port, and Debian's `dnsperf` against it — once
//! with cluster names, once with external names already in the forwarder's cache. Reports
//! queries per second, latency percentiles (from dnsperf's per-query output) and the server
//! process's CPU per query.

use minik8s_conformance::Cluster;
use serde::Serialize;
use std::process::Command;
use std::time::Duration;

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Services created (and queried by name).
    pub services: usize,
    /// Seconds each dnsperf run lasts.
    pub seconds: u64,
    /// dnsperf's outstanding queries (`-q`).
    pub outstanding: usize,
    /// dnsperf's clients (`-c`, distinct source ports).
    pub clients: usize,
}

/// One dnsperf run.
#[derive(Debug, Serialize)]
pub struct Run {
    /// What was asked.
    pub names: String,
    /// Queries answered.
    pub answered: usize,
    /// Queries lost (timed out).
    pub lost: u64,
    /// Queries per second (dnsperf's figure).
    pub qps: f64,
    /// Latency percentiles in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// This process's CPU time per query (µs): the DNS server, plus an idle apiserver.
    pub cpu_us_per_query: f64,
}

/// The whole result.
#[derive(Debug, Serialize)]
pub struct Result {
    /// Services in the zone.
    pub services: usize,
    /// dnsperf's outstanding queries.
    pub outstanding: usize,
    /// Each run.
    pub runs: Vec<Run>,
}

fn dnsperf(
    server: &str,
    port: u16,
    file: &std::path::Path,
    plan: &Plan,
    names: &str,
) -> anyhow::Result<Run> {
    let me = std::process::id();
    let cpu = crate::bench::cpu_seconds(me);
    let out = Command::new("dnsperf")
        .args(["-s", server, "-p", &port.to_string(), "-d"])
        .arg(file)
        .args(["-l", &plan.seconds.to_string()])
        .args(["-c", &plan.clients.to_string(), "-T", "1"])
        .args(["-q", &plan.outstanding.to_string(), "-t", "2", "-v"])
        .output()
        .map_err(|e| anyhow::anyhow!("running dnsperf (apt install dnsperf): {e}"))?;
    let cpu = crate::bench::cpu_seconds(me) - cpu;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut latencies: Vec<Duration> = text
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .collect();
    let field = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let answered = latencies.len();
    let mut ms = |q: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        crate::bench::percentile(&mut latencies, q).as_secs_f64() * 1e3
    };
    let (p50_ms, p99_ms, max_ms) = (ms(0.5), ms(0.99), ms(1.0));
    Ok(Run {
        names: names.to_owned(),
        answered,
        lost: field("Queries lost:") as u64,
        qps: field("Queries per second:"),
        p50_ms,
        p99_ms,
        max_ms,
        cpu_us_per_query: cpu * 1e6 / answered.max(1) as f64,
    })
}

/// Runs the benchmark.
pub fn run(plan: Plan) -> anyhow::Result<Result> {
    let c = Cluster::start();
    let client = c.client();
    // The Services, in a handful of namespaces.
    let namespaces = 4;
    for n in 0..namespaces {
        c.ok(&["create", "namespace", &format!("bench-{n}")]);
    }
    let mut names = String::new();
    for i in 0..plan.services {
        let ns = format!("bench-{}", i % namespaces);
        let name = format!("svc-{i}");
        c.ok(&[
            "create",
            "service",
            "clusterip",
            &name,
            "--tcp=80:8080",
            "-n",
            &ns,
        ]);
        names.push_str(&format!("{name}.{ns}.svc.cluster.local A\n"));
    }
    let port = 10053;
    let cfg = minik8s_proxy::dns::Config {
        listen: ([127, 0, 0, 1], port).into(),
        domain: "cluster.local".into(),
        debounce: Duration::from_millis(100),
    };
    let stop = c.shutdown_token().child_token();
    {
        let (client, stop) = (client.clone(), stop.clone());
        c.spawn(async move {
            let (_hosts, routed) = tokio::sync::watch::channel((Vec::new(), None));
            if let Err(e) = minik8s_proxy::dns::run(client, "bench".into(), cfg, routed, stop).await
            {
                eprintln!("dns: {e}");
            }
        });
    }
    // Wait until the last Service answers.
    let last = format!(
        "svc-{}.bench-{}.svc.cluster.local",
        plan.services - 1,
        (plan.services - 1) % namespaces
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("busybox")
            .args(["nslookup", &last, &format!("127.0.0.1:{port}")])
            .output()?;
        if out.status.success() {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the DNS server never answered {last}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let dir = c.dir().to_path_buf();
    let cluster_file = dir.join("cluster-names.txt");
    std::fs::write(&cluster_file, names)?;
    // External names: the package registries this machine reaches, kept when they resolve
    // (each lookup fills the forwarder's cache).
    let mut external = String::new();
    for name in [
        "deb.debian.org",
        "security.debian.org",
        "crates.io",
        "index.crates.io",
        "static.crates.io",
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
    ] {
        let out = Command::new("busybox")
            .args(["nslookup", "-type=a", name, &format!("127.0.0.1:{port}")])
            .output()?;
        if out.status.success() {
            external.push_str(&format!("{name} A\n"));
        }
    }
    let mut runs = vec![dnsperf("127.0.0.1", port, &cluster_file, &plan, "cluster")?];
    if !external.is_empty() {
        let external_file = dir.join("external-names.txt");
        std::fs::write(&external_file, external)?;
        runs.push(dnsperf(
            "127.0.0.1",
            port,
            &external_file,
            &plan,
            "external (cached)",
        )?);
    }
    stop.cancel();
    Ok(Result {
        services: plan.services,
        outstanding: plan.outstanding,
        runs,
    })
}

//! `scale-bench`: ClusterLoader2's load on N simulated nodes, against `minik8s up` started
//! here or against a control plane started elsewhere (`--kubeconfig`, as `bench/scale` does
//! for upstream's); prints one JSON report (SLOs, latencies, pod start-up, memory, CPU).
//! Exits 1 when an SLO was broken.

use clap::Parser;
use minik8s_bench::scale::{External, Options, Plane};
use std::time::Duration;

/// jemalloc, as in `minik8s`: the simulated nodes share the server's two cores, and with
/// glibc's malloc they used about a fifth of them.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Scale harness: ClusterLoader2's load against a control plane, measured against the
/// scalability SLOs.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start (apiserver and controller-manager in one process).
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Simulated nodes.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// Pods of the load.
    #[arg(long, default_value_t = 2000)]
    pods: usize,
    /// Seconds each phase may take to settle.
    #[arg(long, default_value_t = 600)]
    limit: u64,
    /// ConfigMaps created at the peak to measure memory per stored ConfigMap.
    #[arg(long, default_value_t = 10000)]
    configmaps: usize,
    /// SIGKILL `minik8s up` at the peak and count what comes back.
    #[arg(long)]
    kill: bool,
    /// Pods per second the load creates at most (upstream's 5,000-node job runs
    /// ClusterLoader2's load at 50).
    #[arg(long, default_value_t = 50.0)]
    pod_rate: f64,
    /// One more flag for `minik8s up` (repeated; e.g. `--up-arg=--store-history-age=60s`).
    #[arg(long = "up-arg", allow_hyphen_values = true)]
    up_args: Vec<String>,
    /// Load a control plane started elsewhere, through this admin kubeconfig.
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,
    /// Its name in the report.
    #[arg(long, default_value = "upstream")]
    name: String,
    /// Its components' processes, as NAME=PID (repeated).
    #[arg(long = "pid")]
    pids: Vec<String>,
    /// The cgroup its processes run in.
    #[arg(long)]
    cgroup: Option<std::path::PathBuf>,
    /// Its store's folder.
    #[arg(long)]
    data: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    // The simulated nodes' warnings (late Lease renewals, refused status) reach stderr.
    minik8s_kubeconfig::process::init_tracing();
    let plane = match a.kubeconfig {
        Some(kubeconfig) => Plane::External(External {
            name: a.name,
            kubeconfig,
            pids: a
                .pids
                .iter()
                .map(|p| {
                    let (name, pid) = p
                        .split_once('=')
                        .ok_or_else(|| anyhow::anyhow!("--pid {p}: NAME=PID"))?;
                    Ok((name.to_owned(), pid.parse()?))
                })
                .collect::<anyhow::Result<_>>()?,
            cgroup: a.cgroup,
            data: a.data,
        }),
        None => Plane::Minik8s {
            binary: a.minik8s,
            args: a.up_args,
        },
    };
    let opts = Options {
        nodes: a.nodes,
        pods: a.pods,
        limit: Duration::from_secs(a.limit),
        configmaps: a.configmaps,
        kill: a.kill,
        pod_rate: a.pod_rate,
    };
    let report = minik8s_bench::scale::run(plane, opts).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    let broken = report["slo_violations"]
        .as_array()
        .is_some_and(|v| !v.is_empty());
    std::process::exit(i32::from(broken));
}

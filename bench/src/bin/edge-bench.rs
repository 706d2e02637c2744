//! `edge-bench`: an edge node next to a normal node (idle RSS, link bytes, pod start, exec
//! round trip and port-forward throughput) and the reconcile after an outage (none with
//! `--changed 0`); prints one JSON object. Run as root (it starts machines); the
//! `minik8s`, `edgelet` and `edgectl` binaries beside it are used.

use clap::Parser;

/// Edge benchmark.
#[derive(Parser, Debug)]
struct Args {
    /// Pods started one after another on each node.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// How long the link is down, in seconds.
    #[arg(long, default_value_t = 300)]
    outage: u64,
    /// Pods changed in the cloud during the outage (half deleted, half created).
    #[arg(long, default_value_t = 100)]
    changed: usize,
    /// Exec round trips timed on each node.
    #[arg(long, default_value_t = 50)]
    execs: usize,
    /// MiB read through each node's port-forward (three times).
    #[arg(long, default_value_t = 64)]
    forward_mib: usize,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let figures = minik8s_bench::edgebench::run(&minik8s_bench::edgebench::Args {
        pods: a.pods,
        outage: std::time::Duration::from_secs(a.outage),
        changed: a.changed,
        execs: a.execs,
        forward_mib: a.forward_mib,
    })?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}

//! `edge-bench`: an edge node next to a normal node (idle RSS, link bytes, pod start) and the
//! reconcile after an outage; prints one JSON object. Run as root (it starts machines); the
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
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let figures = minik8s_bench::edgebench::run(&minik8s_bench::edgebench::Args {
        pods: a.pods,
        outage: std::time::Duration::from_secs(a.outage),
        changed: a.changed,
    })?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}

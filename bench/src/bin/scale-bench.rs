//! `scale-bench`: 100 simulated nodes and a 5,000-pod Deployment against `minik8s up`; prints
//! one JSON object (times to bound and Running, scheduler pods/s, the server's peak RSS).

use clap::Parser;
use std::time::Duration;

/// jemalloc, as in `minik8s`: the 100 simulated nodes share the server's two cores, and with
/// glibc's malloc they used about a fifth of them.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Scale benchmark: how fast a large Deployment is scheduled and Running, and at what memory.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start (apiserver and controller-manager in one process).
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Pods in the Deployment.
    #[arg(long, default_value_t = 5000)]
    pods: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    limit: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let report = minik8s_bench::scale::run(
        &args.minik8s,
        args.nodes,
        args.pods,
        Duration::from_secs(args.limit),
    )
    .await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

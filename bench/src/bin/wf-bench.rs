//! `wf-bench`: concurrent runs of a three-step chain of warm no-op functions through
//! `minik8s up` with its node; prints one JSON object. Run as root (it starts a node).

use clap::Parser;

/// Workflow benchmark.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start.
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Runs started at once.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Pods of the no-op function.
    #[arg(long, default_value_t = 4)]
    pods: i32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let images = minik8s_conformance::node::images();
    let plan = minik8s_bench::wfbench::Plan {
        runs: args.runs,
        pods: args.pods,
    };
    let result = minik8s_bench::wfbench::run(&args.minik8s, &images, plan).await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

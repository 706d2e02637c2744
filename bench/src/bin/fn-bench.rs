//! `fn-bench`: function cold starts, the gateway's warm overhead and sustained load through
//! `minik8s up` with its node; prints one JSON object. Run as root (it starts a node).

use clap::Parser;

/// Function benchmark.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start.
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Cold starts to measure.
    #[arg(long, default_value_t = 20)]
    cold_starts: usize,
    /// Warm calls through the gateway and straight to the pod.
    #[arg(long, default_value_t = 500)]
    warm_calls: usize,
    /// Clients of the sustained load.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds of sustained load.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Module functions rolled out at once.
    #[arg(long, default_value_t = 100)]
    modules: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let images = minik8s_conformance::node::images();
    let plan = minik8s_bench::fnbench::Plan {
        cold_starts: args.cold_starts,
        warm_calls: args.warm_calls,
        clients: args.clients,
        load_for: std::time::Duration::from_secs(args.seconds),
        modules: args.modules,
    };
    let result = minik8s_bench::fnbench::run(&args.minik8s, &images, plan).await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

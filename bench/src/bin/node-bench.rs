//! `node-bench`: pod start latency through `minik8s up` next to the CRI floor, and the proxy's
//! full rule sync; prints one JSON object. Run as root (it starts a node).

use clap::Parser;

/// Node benchmark: pod start latency and iptables rule sync time.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start.
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Pods to start, one after another.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Services for the rule-sync benchmark.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Endpoints per Service.
    #[arg(long, default_value_t = 2)]
    endpoints: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let images = minik8s_conformance::node::images();
    let pods = minik8s_bench::nodebench::pods(&args.minik8s, &images, args.pods).await?;
    let rules = minik8s_bench::nodebench::rules(args.services, args.endpoints).await?;
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::json!({"pod_start": pods, "rule_sync": rules}))?
    );
    Ok(())
}

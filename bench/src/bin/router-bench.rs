//! `router-bench`: GETs straight to a Service's ClusterIP and through the node's router (a
//! `DNS` object's host and path), through `minik8s up` with its node; prints one JSON object.
//! Run as root (it starts a node and binds port 80).

use clap::Parser;

/// Router benchmark.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start.
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Timed requests on each path.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Clients of the sustained run.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds of the sustained run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let images = minik8s_conformance::node::images();
    let result = minik8s_bench::routerbench::run(
        &args.minik8s,
        &images,
        args.requests,
        args.clients,
        args.seconds,
    )
    .await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

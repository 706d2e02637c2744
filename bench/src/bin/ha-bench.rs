//! `ha-bench`: three apiservers on a 3-member etcd against one apiserver on one member, in one
//! run, and the failover times on the three; prints one JSON object.

use clap::Parser;

/// HA benchmark: API figures of both setups and failover times.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start.
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Objects in the sequential phase.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Concurrent clients (and writers in the failover).
    #[arg(long, default_value_t = 16)]
    clients: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let report = minik8s_bench::habench::run(&args.minik8s, args.objects, args.clients).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

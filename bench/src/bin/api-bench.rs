//! `api-bench`: measures the apiserver (`minik8s up` on the embedded store) and prints one JSON object.

use clap::Parser;

/// API benchmark: creates, gets, updates, lists, watches and deletes ConfigMaps.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start.
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Objects in the sequential phases (and the LIST size).
    #[arg(long, default_value_t = 2000)]
    objects: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// After the load, keeps sampling the server's memory every 30 s for this many seconds
    /// (what the load leaves behind over time: caches, the store's history until compaction).
    #[arg(long, default_value_t = 0)]
    linger: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let report =
        minik8s_bench::bench::run(&args.minik8s, args.objects, args.clients, args.linger).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

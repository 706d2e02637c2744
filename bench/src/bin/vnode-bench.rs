//! `vnode-bench`: N virtual nodes of the fake provider in one process against `minik8s up`;
//! prints one JSON object (the host's RSS, the apiserver's watchers, Lease renewals per second,
//! pod create → Running through the virtual nodes).

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Virtual-node benchmark.
#[derive(Parser, Debug)]
struct Args {
    /// The minik8s binary to start (apiserver and controllers, no node).
    #[arg(long, default_value = "target/release/minik8s", env = "MINIK8S_BIN")]
    minik8s: std::path::PathBuf,
    /// Virtual nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Pods created through them.
    #[arg(long, default_value_t = 2000)]
    pods: usize,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The process that hosts the virtual nodes (started by the benchmark).
    Host {
        /// The admin kubeconfig.
        #[arg(long)]
        kubeconfig: std::path::PathBuf,
        /// Virtual nodes.
        #[arg(long)]
        nodes: usize,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Host { kubeconfig, nodes }) = args.command {
        return minik8s_bench::vnodebench::host(&kubeconfig, nodes).await;
    }
    let me = std::env::current_exe()?;
    let report = minik8s_bench::vnodebench::run(&args.minik8s, &me, args.nodes, args.pods).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

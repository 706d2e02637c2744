//! `sim-nodes`: registers simulated nodes for scale and controller tests (never for kubelet
//! tests): pods bound to them become Running without containers.

use clap::Parser;
use minik8s_controllers::simnodes::{SimConfig, run};

/// Simulated nodes.
#[derive(Parser)]
struct Args {
    /// Kubeconfig to use.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: std::path::PathBuf,
    /// How many nodes.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Node name prefix.
    #[arg(long, default_value = "sim")]
    prefix: String,
    /// Allocatable cpu per node.
    #[arg(long, default_value = "4")]
    cpu: String,
    /// Allocatable memory per node.
    #[arg(long, default_value = "8Gi")]
    memory: String,
    /// Allocatable pods per node.
    #[arg(long, default_value_t = 110)]
    pods: u32,
    /// Seconds between each node's status reports (Leases are renewed every 10 s).
    #[arg(long, default_value_t = 60)]
    status_every: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    minik8s_kubeconfig::process::init_tracing();
    let a = Args::parse();
    let client = minik8s_kubeconfig::client(&a.kubeconfig).await?;
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    let cfg = SimConfig {
        prefix: a.prefix,
        count: a.nodes,
        cpu: a.cpu,
        memory: a.memory,
        pods: a.pods,
        status_every: std::time::Duration::from_secs(a.status_every),
    };
    run(client, cfg, shutdown).await?;
    Ok(())
}

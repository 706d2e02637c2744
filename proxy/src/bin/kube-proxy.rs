//! `kube-proxy`: programs this machine's iptables for Services from an apiserver, or removes
//! its rules (`--cleanup`).

use clap::Parser;

/// Runs the service proxy of a node.
#[derive(Parser)]
struct Args {
    /// Kubeconfig of the proxy's identity (`system:kube-proxy`).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// This node's name (its endpoints are local for `externalTrafficPolicy: Local`).
    #[arg(long, default_value = "minik8s-node")]
    node_name: String,
    /// The cluster's pod range.
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// Serve the cluster DNS on this address (port 53; the node's pod gateway, such as
    /// 10.244.1.1) and publish it as this node's `kube-dns` endpoint.
    #[arg(long)]
    dns_listen: Option<std::net::IpAddr>,
    /// Where `/metrics` is served over plain HTTP (empty: nowhere).
    #[arg(long, default_value = "127.0.0.1:10249")]
    metrics_bind_address: String,
    /// Remove the proxy's chains and rules, then exit.
    #[arg(long)]
    cleanup: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    minik8s_kubeconfig::process::init_tracing();
    let a = Args::parse();
    if a.cleanup {
        minik8s_proxy::iptables::cleanup().await?;
        return Ok(());
    }
    let kubeconfig = a
        .kubeconfig
        .ok_or_else(|| anyhow::anyhow!("--kubeconfig (or KUBECONFIG) is required"))?;
    let client = minik8s_kubeconfig::client(&kubeconfig).await?;
    let mut cfg = minik8s_proxy::Config::new(&a.node_name);
    cfg.pod_cidr = a.cluster_cidr;
    cfg.dns = a.dns_listen.map(minik8s_proxy::dns::Config::on);
    cfg.metrics_bind = if a.metrics_bind_address.is_empty() {
        None
    } else {
        Some(a.metrics_bind_address.parse()?)
    };
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    minik8s_proxy::run(client, cfg, shutdown).await?;
    Ok(())
}

//! `kubelet`: runs this machine's node (a private containerd, its pods, the kubelet server)
//! against an apiserver, e.g. a second node joining a `minik8s up` cluster.

use clap::Parser;
use std::path::PathBuf;

/// Runs a node's kubelet.
#[derive(Parser)]
struct Args {
    /// Kubeconfig of the node's identity (`system:node:<name>` in `system:nodes`).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// The node's name.
    #[arg(long)]
    node_name: String,
    /// The node's folder (runtime, pods, logs).
    #[arg(long, default_value = "/var/lib/minik8s-node")]
    root_dir: PathBuf,
    /// The node's pod subnet (distinct per node).
    #[arg(long, default_value = "10.244.0.0/24")]
    pod_cidr: String,
    /// The CNI bridge (distinct per node on one machine; `mk8s` prefix for the proxy).
    #[arg(long, default_value = "mk8s0")]
    bridge: String,
    /// Parent cgroup of the node's pods (default `/minik8s/<node>`).
    #[arg(long)]
    cgroup_root: Option<String>,
    /// The node's InternalIP (default: the address of the default route).
    #[arg(long)]
    node_ip: Option<String>,
    /// Where the kubelet server listens.
    #[arg(long, default_value = "0.0.0.0:10250")]
    listen: std::net::SocketAddr,
    /// The cluster CA the apiserver's client certificate chains to (enables the server:
    /// logs, exec, port-forward, stats).
    #[arg(long)]
    client_ca: Option<PathBuf>,
    /// The static pod manifest folder.
    #[arg(long)]
    pod_manifest_path: Option<PathBuf>,
    /// A loopback registry that `docker.io` and `registry.k8s.io` pulls go to.
    #[arg(long)]
    registry_mirror: Option<String>,
    /// Image archives to import into the runtime at start.
    #[arg(long = "image", value_delimiter = ',')]
    images: Vec<PathBuf>,
    /// The cluster DNS servers pods use (comma-separated; empty: the node's resolvers).
    #[arg(long, value_delimiter = ',', default_value = "10.96.0.10")]
    cluster_dns: Vec<String>,
    /// The cluster domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    minik8s_kubeconfig::process::init_tracing();
    let a = Args::parse();
    let mut cfg = minik8s_kubelet::Config::new(&a.node_name, &a.root_dir);
    cfg.runtime.pod_cidr = a.pod_cidr;
    cfg.runtime.bridge = a.bridge;
    cfg.runtime.registry_mirror = a.registry_mirror;
    if let Some(root) = a.cgroup_root {
        cfg.cgroup_root = root;
    }
    cfg.node_ip = a.node_ip;
    cfg.listen = a.listen;
    cfg.client_ca = a.client_ca;
    cfg.manifests = a.pod_manifest_path;
    cfg.images = a.images;
    cfg.cluster_dns = a
        .cluster_dns
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    cfg.cluster_domain = a.cluster_domain;
    let client = minik8s_kubeconfig::client(&a.kubeconfig).await?;
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    minik8s_kubelet::run(client, cfg, shutdown).await?;
    Ok(())
}

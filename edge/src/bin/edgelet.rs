//! `edgelet`: the edge agent. Runs the pods the cloud gives it on this machine's containerd
//! (or Docker, `--runtime docker`), keeps them running when the link drops, and answers
//! `edgectl` on loopback.

use clap::{Parser, Subcommand};
use minik8s_edge::agent::{self, Config};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "edgelet", version = minik8s_edge::VERSION, about = "The minik8s edge agent")]
struct Args {
    /// Where everything lives: the store (pods, volumes, certificates, configuration), the
    /// runtime, the pods' folders.
    #[arg(long, default_value = "/var/lib/minik8s-edge")]
    data_dir: PathBuf,
    /// Where the cloud calls it (mutual TLS, once joined).
    #[arg(long, default_value = "0.0.0.0:10350")]
    listen: SocketAddr,
    /// Where `edgectl` calls it (loopback only).
    #[arg(long, default_value = minik8s_edge::ADMIN_ADDRESS)]
    admin_address: SocketAddr,
    /// The node's name (default: the host name; fixed once joined).
    #[arg(long)]
    node_name: Option<String>,
    /// The node's address (default: the default route's source).
    #[arg(long)]
    node_ip: Option<String>,
    /// The pods' subnet on this machine.
    #[arg(long, default_value = "10.88.0.0/24")]
    pod_cidr: String,
    /// The pods' bridge.
    #[arg(long, default_value = "mk8sedge0")]
    bridge: String,
    /// Image archives to import at start (comma-separated).
    #[arg(long, value_delimiter = ',')]
    image: Vec<PathBuf>,
    /// The path whose file system's use is reported (default: the data folder).
    #[arg(long)]
    disk_path: Option<PathBuf>,
    /// Memory pressure above this use, in percent.
    #[arg(long, default_value_t = 90)]
    memory_pressure_threshold: u32,
    /// Disk pressure above this use, in percent.
    #[arg(long, default_value_t = 80)]
    disk_pressure_threshold: u32,
    /// DNS servers for the pods (default: the edge's own, at the pods' gateway address, which
    /// answers the cluster names of the Services shipped here and forwards the rest to the
    /// machine's resolvers).
    #[arg(long, value_delimiter = ',')]
    cluster_dns: Vec<String>,
    /// The pods' parent cgroup (default: /minik8s/NODE).
    #[arg(long)]
    cgroup_root: Option<String>,
    /// The container runtime: `containerd` (a private one the edgelet starts) or `docker`
    /// (the machine's Docker Engine at `--docker-socket`).
    #[arg(long, default_value = "containerd", value_parser = ["containerd", "docker"])]
    runtime: String,
    /// Docker's API socket (with `--runtime docker`).
    #[arg(long, default_value = "/var/run/docker.sock")]
    docker_socket: String,
    /// The Docker user network the pods join (with `--runtime docker`; created over the pod
    /// subnet when missing).
    #[arg(long, default_value = "minik8s")]
    docker_network: String,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Stops the runtime and removes the pods, their folders and network, and the Service
    /// rules (the store stays).
    Down,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    minik8s_kubeconfig::process::init_tracing();
    let mut cfg = Config::new(&args.data_dir);
    cfg.listen = args.listen;
    cfg.admin = args.admin_address;
    cfg.node_name = args.node_name.clone();
    cfg.node_ip = args.node_ip.clone();
    cfg.pod_cidr = args.pod_cidr.clone();
    cfg.bridge = args.bridge.clone();
    cfg.images = args.image.clone();
    cfg.disk_path = args.disk_path.clone();
    cfg.memory_threshold = args.memory_pressure_threshold;
    cfg.disk_threshold = args.disk_pressure_threshold;
    cfg.cluster_dns = args.cluster_dns.clone();
    cfg.cgroup_root = args.cgroup_root.clone();
    if args.runtime == "docker" {
        cfg.runtime = agent::Runtime::Docker {
            socket: args.docker_socket.clone(),
            network: args.docker_network.clone(),
        };
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let next = rt.block_on(async move {
        if let Some(Command::Down) = args.command {
            let store = minik8s_edge::store::Store::open(&cfg.data_dir.join("store"))?;
            let node = agent::node_name(&cfg, &store);
            match cfg.docker(&node) {
                None => minik8s_kubelet::down::down(&cfg.kubelet(&node)).await?,
                Some(docker) => {
                    let removed = match minik8s_dockershim::Shim::connect(docker).await {
                        Ok(shim) => shim.down().await,
                        Err(e) => Err(e),
                    };
                    // The node's hold on the forwarding guard goes whether or not Docker
                    // answers (the kubelet's down does this for containerd).
                    minik8s_kubelet::netguard::release(&node).await?;
                    let removed = removed?;
                    tracing::info!(
                        removed,
                        "the pods' docker containers and network are removed"
                    );
                }
            }
            // The edge's Service rules too.
            minik8s_proxy::iptables::cleanup().await?;
            return Ok::<_, anyhow::Error>(None);
        }
        let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
        Ok(agent::run(cfg, shutdown).await?)
    })?;
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    if let Some(binary) = next {
        // An upgrade: this process becomes the new binary, with the same arguments and pid.
        use std::os::unix::process::CommandExt;
        let err = std::process::Command::new(&binary)
            .args(std::env::args_os().skip(1))
            .exec();
        anyhow::bail!("running the upgraded edgelet {}: {err}", binary.display());
    }
    Ok(())
}

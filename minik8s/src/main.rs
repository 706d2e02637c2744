//! `minik8s`: the all-in-one binary. `minik8s up` runs a single-node cluster in the
//! foreground; `minik8s pki init` writes the cluster CA, certificates and kubeconfigs.

use clap::{Parser, Subcommand};
use minik8s::UpConfig;
use std::net::IpAddr;
use std::path::PathBuf;

/// jemalloc instead of glibc's malloc: the apiserver and controllers allocate and free many
/// small JSON values per request, and glibc's free lists (consolidation, unlinking) cost
/// about a fifth of the process's CPU under load (README, "Benchmarks → Scale").
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A small, real Kubernetes.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs a single-node cluster in the foreground until SIGINT/SIGTERM.
    Up(UpArgs),
    /// Stops the cluster running on DATA_DIR and removes its pods, runtime, bridge, cgroups,
    /// mounts and iptables rules (the store and PKI stay).
    Down(UpArgs),
    /// Certificates and kubeconfigs.
    Pki {
        #[command(subcommand)]
        command: PkiCommand,
    },
}

#[derive(Subcommand, Debug)]
enum PkiCommand {
    /// Creates the cluster CA (once), the apiserver's serving certificate, and a client
    /// certificate plus kubeconfig for the admin and each component.
    Init(UpArgs),
    /// Issues the identity of another node NAME (a kubelet kubeconfig, `system:node:NAME`)
    /// and prints how to start its `kubelet` and `kube-proxy` against this cluster.
    Node {
        /// The joining node's name.
        name: String,
        #[command(flatten)]
        args: UpArgs,
    },
}

/// Options of `up` (and `pki init`, which uses the same names and addresses).
#[derive(clap::Args, Debug)]
struct UpArgs {
    /// The cluster's data folder (PKI, store, admin kubeconfig).
    #[arg(long, env = "MINIK8S_DATA_DIR", default_value = "/var/lib/minik8s")]
    data_dir: PathBuf,
    /// `embedded` (default, under DATA_DIR/store) or `etcd://HOST:PORT[,HOST:PORT…]`.
    #[arg(long, env = "MINIK8S_STORAGE", default_value = "embedded")]
    storage: String,
    /// Address the apiserver listens on.
    #[arg(long, env = "MINIK8S_BIND", default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Port the apiserver listens on.
    #[arg(long, env = "MINIK8S_PORT", default_value_t = 6443)]
    port: u16,
    /// Extra DNS names for the serving certificate.
    #[arg(long = "host", env = "MINIK8S_HOSTS", value_delimiter = ',')]
    hosts: Vec<String>,
    /// Extra IP addresses for the serving certificate.
    #[arg(long = "ip", env = "MINIK8S_IPS", value_delimiter = ',')]
    ips: Vec<IpAddr>,
    /// This machine's node name.
    #[arg(long, env = "MINIK8S_NODE_NAME", default_value = "minik8s-node")]
    node_name: String,
    /// Audit log level (None, Metadata, Request); the log is DATA_DIR/audit.log.
    #[arg(long, env = "MINIK8S_AUDIT_LEVEL", default_value = "Metadata")]
    audit_level: minik8s_apiserver::audit::Level,
    /// Run the control plane only, without this machine's node (kubelet and containerd).
    #[arg(long, env = "MINIK8S_NO_NODE")]
    no_node: bool,
    /// Image archives for the node, pushed to its registry (default: DATA_DIR/images/*.tar).
    #[arg(long = "image", env = "MINIK8S_IMAGES", value_delimiter = ',')]
    images: Vec<PathBuf>,
    /// Where the node's local image registry listens (loopback only).
    #[arg(long, env = "MINIK8S_REGISTRY", default_value = "127.0.0.1:5000")]
    registry: std::net::SocketAddr,
    /// Run no local registry: the image archives are imported into the runtime instead.
    #[arg(long, env = "MINIK8S_NO_REGISTRY")]
    no_registry: bool,
    /// Where the function gateway listens (a host port; Functions' URLs name it).
    #[arg(long, env = "MINIK8S_GATEWAY", default_value = "0.0.0.0:8181")]
    gateway: std::net::SocketAddr,
    /// Run no function gateway or Function controller.
    #[arg(long, env = "MINIK8S_NO_FUNCTIONS")]
    no_functions: bool,
    /// Where the node's HTTP router (the `DNS` kind, Ingresses) listens.
    #[arg(long, env = "MINIK8S_ROUTER", default_value = "0.0.0.0:80")]
    router: std::net::SocketAddr,
    /// Run no HTTP router.
    #[arg(long, env = "MINIK8S_NO_ROUTER")]
    no_router: bool,
}

impl TryFrom<UpArgs> for UpConfig {
    type Error = anyhow::Error;

    fn try_from(a: UpArgs) -> anyhow::Result<Self> {
        let storage = match a.storage.as_str() {
            "embedded" => None,
            other => Some(other.parse()?),
        };
        Ok(UpConfig {
            storage,
            bind: a.bind,
            port: a.port,
            hosts: a.hosts,
            ips: a.ips,
            node_name: a.node_name,
            audit_level: a.audit_level,
            run_node: !a.no_node,
            registry: (!a.no_registry).then_some(a.registry),
            gateway: (!a.no_functions).then_some(a.gateway),
            router: (!a.no_router).then_some(a.router),
            images: if a.images.is_empty() {
                archives(&a.data_dir.join("images"))
            } else {
                a.images
            },
            data_dir: a.data_dir,
        })
    }
}

/// The `.tar` archives in `dir`, sorted (none if it does not exist).
fn archives(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "tar"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn main() -> anyhow::Result<()> {
    minik8s_kubeconfig::process::init_tracing();
    match Cli::parse().command {
        Command::Pki {
            command: PkiCommand::Init(args),
        } => {
            let cfg = UpConfig::try_from(args)?;
            let (_, admin) = minik8s::init_pki(&cfg)?;
            let link = cfg.data_dir.join("admin.kubeconfig");
            std::fs::copy(&admin, &link)?;
            println!("export KUBECONFIG={}", link.display());
            Ok(())
        }
        Command::Pki {
            command: PkiCommand::Node { name, args },
        } => {
            let cfg = UpConfig::try_from(args)?;
            let (pki, _) = minik8s::init_pki(&cfg)?;
            let kubelet = pki.ensure_identity(&minik8s_kubeconfig::Identity::new(
                &format!("kubelet-{name}"),
                &format!("system:node:{name}"),
                &["system:nodes"],
            ))?;
            let proxy = pki.ensure_identity(&minik8s_kubeconfig::Identity::new(
                "proxy",
                "system:kube-proxy",
                &[],
            ))?;
            println!("Copy these to node {name}, then run there (as root):");
            println!(
                "kubelet --kubeconfig {} --node-name {name} --client-ca {} --pod-cidr 10.244.N.0/24 --bridge mk8sN",
                kubelet.display(),
                pki.ca_path().display()
            );
            println!(
                "kube-proxy --kubeconfig {} --node-name {name}",
                proxy.display()
            );
            Ok(())
        }
        Command::Down(args) => {
            let cfg = UpConfig::try_from(args)?;
            tokio::runtime::Runtime::new()?.block_on(minik8s::down(&cfg))?;
            println!("minik8s is down; its node left nothing behind");
            Ok(())
        }
        Command::Up(args) => {
            let cfg = UpConfig::try_from(args)?;
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async move {
                let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
                minik8s::up(cfg, shutdown, |kubeconfig| {
                    println!("minik8s is up. Point kubectl at it with:");
                    println!("export KUBECONFIG={}", kubeconfig.display());
                    println!("kubectl get namespaces");
                })
                .await
            })?;
            Ok(())
        }
    }
}

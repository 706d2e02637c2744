//! `minik8s`: the all-in-one binary. `minik8s pki init` writes the cluster CA, certificates and
//! kubeconfigs; `minik8s up` (with the apiserver) runs a single-node cluster in one process.

use clap::{Parser, Subcommand};
use minik8s_kubeconfig::{Identity, Pki, PkiOptions};
use std::net::IpAddr;
use std::path::PathBuf;

/// A small, real Kubernetes.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
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
    Init(PkiArgs),
}

/// Where the PKI lives and how the apiserver is reached.
#[derive(clap::Args, Debug)]
struct PkiArgs {
    /// The cluster's data folder (certificates go to DIR/pki).
    #[arg(long, env = "MINIK8S_DATA_DIR", default_value = "/var/lib/minik8s")]
    data_dir: PathBuf,
    /// The apiserver URL written into the kubeconfigs.
    #[arg(long, env = "MINIK8S_SERVER", default_value = "https://127.0.0.1:6443")]
    server: String,
    /// Extra DNS names for the serving certificate.
    #[arg(long = "host", env = "MINIK8S_HOSTS", value_delimiter = ',')]
    hosts: Vec<String>,
    /// Extra IP addresses for the serving certificate.
    #[arg(long = "ip", env = "MINIK8S_IPS", value_delimiter = ',')]
    ips: Vec<IpAddr>,
    /// The node name of this machine's kubelet identity.
    #[arg(long, env = "MINIK8S_NODE_NAME", default_value = "minik8s-node")]
    node_name: String,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Pki {
            command: PkiCommand::Init(args),
        } => pki_init(args),
    }
}

fn pki_init(args: PkiArgs) -> anyhow::Result<()> {
    let pki = Pki::init(PkiOptions {
        dir: args.data_dir.join("pki"),
        cluster_name: "minik8s".into(),
        server: args.server,
        hostnames: args.hosts,
        ips: args.ips,
    })?;
    pki.issue_serving_cert()?;
    for id in Identity::components(&args.node_name) {
        pki.ensure_identity(&id)?;
    }
    let admin = pki.ensure_identity(&Identity::admin())?;
    let link = args.data_dir.join("admin.kubeconfig");
    std::fs::copy(&admin, &link)?;
    println!("export KUBECONFIG={}", link.display());
    Ok(())
}

//! `edgectl`: drives the edgelet on this machine — join a cluster, leave it, upgrade the
//! edgelet, show versions and status. The edgelet address used last is remembered in
//! `~/.config/minik8s/edgectl.json`.

use clap::{Parser, Subcommand};
use minik8s_edge::hello;
use minik8s_edge::proto::edge_admin_client::EdgeAdminClient;
use minik8s_edge::proto::*;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "edgectl", version = minik8s_edge::VERSION, about = "Drives the minik8s edgelet")]
struct Args {
    /// The edgelet's admin address (default: the one used last, else 127.0.0.1:10351).
    #[arg(long, global = true)]
    edgelet_address: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Joins the cluster whose edge registry is REGISTRY (host:port), as `kubeadm join`.
    Join {
        /// The edge registry (the control plane's address, port 10360).
        registry: String,
        /// A bootstrap token (`minik8s token create`).
        #[arg(long)]
        token: String,
        /// The CA's public-key pin, `sha256:<hex>` (repeatable).
        #[arg(long = "discovery-token-ca-cert-hash", required = true)]
        ca_cert_hash: Vec<String>,
        /// The node's name (default: the edgelet's).
        #[arg(long)]
        node_name: Option<String>,
        /// The address the cloud reaches the edgelet at (default: its own address and port).
        #[arg(long)]
        advertise_address: Option<String>,
    },
    /// Leaves the cluster (the Node goes); the pods keep running on this machine.
    Reset,
    /// Shows this tool's, the edgelet's and the cloud's versions.
    Version,
    /// Replaces a component's binary atomically and restarts it; the pods keep running.
    Upgrade {
        /// The component (`edgelet`).
        #[arg(long)]
        component: String,
        /// The new binary.
        #[arg(long)]
        from: PathBuf,
    },
    /// Shows the node, its link to the cloud and its pods.
    Status,
}

fn config_file() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("minik8s").join("edgectl.json")
}

fn address(given: Option<String>) -> String {
    let file = config_file();
    match given {
        Some(a) => {
            let _ = std::fs::create_dir_all(file.parent().unwrap_or(&file));
            let _ = std::fs::write(&file, serde_json::json!({"edgeletAddress": a}).to_string());
            a
        }
        None => std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["edgeletAddress"].as_str().map(str::to_owned))
            .unwrap_or_else(|| minik8s_edge::ADMIN_ADDRESS.to_owned()),
    }
}

fn human(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let addr = address(args.edgelet_address.clone());
    if let Err(e) = run(args.command, &addr).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(command: Command, addr: &str) -> anyhow::Result<()> {
    if matches!(command, Command::Version) {
        println!(
            "edgectl: {} (edge protocol v{})",
            minik8s_edge::VERSION,
            minik8s_edge::PROTOCOL
        );
    }
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(std::time::Duration::from_secs(5));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the edgelet at {addr}: {e}"))?;
    let mut c = EdgeAdminClient::new(channel).max_decoding_message_size(minik8s_edge::MAX_MESSAGE);
    let h = || hello("");
    let status = |s: tonic::Status| anyhow::anyhow!("{}", s.message());
    match command {
        Command::Join {
            registry,
            token,
            ca_cert_hash,
            node_name,
            advertise_address,
        } => {
            let r = c
                .join(JoinRequest {
                    hello: h(),
                    registry,
                    token,
                    ca_cert_hashes: ca_cert_hash,
                    node_name: node_name.unwrap_or_default(),
                    advertise_address: advertise_address.unwrap_or_default(),
                })
                .await
                .map_err(status)?
                .into_inner();
            println!("{}", r.message);
        }
        Command::Reset => {
            let r = c.reset(ResetRequest { hello: h() }).await.map_err(status)?;
            println!("{}", r.into_inner().message);
        }
        Command::Version => {
            let v = c
                .version(VersionRequest { hello: h() })
                .await
                .map_err(status)?
                .into_inner();
            println!(
                "edgelet: {} (edge protocol v{}) at {addr}",
                v.version, v.protocol
            );
            if v.peer.is_empty() {
                println!("cloud:   not joined");
            } else {
                println!("cloud:   {}", v.peer);
            }
        }
        Command::Upgrade { component, from } => {
            let from = std::fs::canonicalize(&from)
                .map_err(|e| anyhow::anyhow!("{}: {e}", from.display()))?;
            let r = c
                .upgrade(UpgradeRequest {
                    hello: h(),
                    component,
                    from: from.display().to_string(),
                })
                .await
                .map_err(status)?;
            println!("{}", r.into_inner().message);
        }
        Command::Status => {
            let s = c
                .status(StatusRequest { hello: h() })
                .await
                .map_err(status)?
                .into_inner();
            println!("Node:          {}", s.node);
            if s.joined {
                println!("Registry:      {}", s.registry);
                println!(
                    "Cloud link:    {} (last contact {})",
                    if s.connected {
                        "connected"
                    } else {
                        "disconnected"
                    },
                    if s.last_contact.is_empty() {
                        "never"
                    } else {
                        &s.last_contact
                    }
                );
            } else {
                println!("Registry:      not joined");
            }
            println!("Pods:          {} ({} running)", s.pods, s.running);
            if let Some(n) = s.node_status {
                println!("Address:       {}", n.ip);
                println!("Kernel:        {}", n.kernel);
                println!("Runtime:       {}", n.runtime_version);
                println!(
                    "Memory:        {} of {} used{}",
                    human(n.memory_used_bytes),
                    human(n.memory_total_bytes),
                    if n.memory_pressure { " (pressure)" } else { "" }
                );
                println!(
                    "Disk:          {} of {} used on {}{}",
                    human(n.disk_used_bytes),
                    human(n.disk_total_bytes),
                    n.disk_path,
                    if n.disk_pressure { " (pressure)" } else { "" }
                );
            }
        }
    }
    Ok(())
}

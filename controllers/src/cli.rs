//! The controller manager's command line (upstream's flags), shared by the
//! `controller-manager` binary and `minik8s controller-manager`.

use crate::leader;
use std::time::Duration;

/// Runs the scheduler and the workload controllers.
#[derive(clap::Parser, Debug)]
pub struct Args {
    /// Kubeconfig of the controller-manager's identity.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: std::path::PathBuf,
    /// Controllers to run (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    controllers: Vec<String>,
    /// Run only while holding the `kube-system/kube-controller-manager` Lease, so that
    /// several replicas can run and one leads.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Seconds a Lease stays valid without renewal.
    #[arg(long, default_value_t = 10)]
    leader_elect_lease_duration: u64,
    /// Seconds a leader keeps trying to renew before it stops leading.
    #[arg(long, default_value_t = 7)]
    leader_elect_renew_deadline: u64,
    /// This replica's identity in the Lease (default: `<host>_<random>`).
    #[arg(long)]
    leader_elect_identity: Option<String>,
    /// Seconds between attempts to acquire or renew.
    #[arg(long, default_value_t = 2)]
    leader_elect_retry_period: u64,
    /// How often every HorizontalPodAutoscaler is reconciled (a Go duration).
    #[arg(long, default_value = "15s", value_parser = duration)]
    horizontal_pod_autoscaler_sync_period: Duration,
    /// The scale-down stabilization window of HPAs whose `behavior` sets none.
    #[arg(long, default_value = "5m0s", value_parser = duration)]
    horizontal_pod_autoscaler_downscale_stabilization: Duration,
    /// How long a node may go without a heartbeat before it is NotReady (unreachable).
    #[arg(long, default_value = "40s", value_parser = duration)]
    node_monitor_grace_period: Duration,
    /// The cluster's pod CIDR, split into one block per node by the node IPAM controller.
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// The prefix length of each node's block.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
    /// The CA certificate the CSR signer issues certificates with.
    #[arg(long, requires = "cluster_signing_key_file")]
    cluster_signing_cert_file: Option<std::path::PathBuf>,
    /// The CA key the CSR signer issues certificates with.
    #[arg(long, requires = "cluster_signing_cert_file")]
    cluster_signing_key_file: Option<std::path::PathBuf>,
    /// The cluster CA published in every namespace as `kube-root-ca.crt`.
    #[arg(long)]
    root_ca_file: Option<std::path::PathBuf>,
    /// The HTTPS port of `/metrics` and `/healthz` (0: none). Needs `--client-ca-file`.
    #[arg(long, default_value_t = 10257)]
    secure_port: u16,
    /// The address the secure port listens on.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: std::net::IpAddr,
    /// Clients of the secure port present a certificate from this CA; each request is then
    /// authorised by a SubjectAccessReview (upstream's delegated authorisation).
    #[arg(long)]
    client_ca_file: Option<std::path::PathBuf>,
    /// The longest validity of an issued certificate.
    #[arg(long, default_value = "8760h0m0s", value_parser = duration)]
    cluster_signing_duration: Duration,
}

fn duration(s: &str) -> Result<Duration, String> {
    crate::util::go_duration(s).ok_or_else(|| format!("{s:?} is not a duration (like 15s or 5m0s)"))
}

/// Runs the controller manager with `args` until SIGINT/SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let client = minik8s_kubeconfig::client(&args.kubeconfig).await?;
    let names: Vec<String> = if args.controllers.is_empty() {
        crate::manager::ALL.iter().map(|s| s.to_string()).collect()
    } else {
        args.controllers
    };
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    crate::manager::check(&names)?;
    let election = args.leader_elect.then(|| {
        let mut cfg = leader::Config::new(
            "kube-controller-manager",
            args.leader_elect_identity
                .clone()
                .unwrap_or_else(leader::identity),
        );
        cfg.lease_duration = Duration::from_secs(args.leader_elect_lease_duration);
        cfg.renew_deadline = Duration::from_secs(args.leader_elect_renew_deadline);
        cfg.retry_period = Duration::from_secs(args.leader_elect_retry_period);
        cfg
    });
    // The metrics server stops with the controllers and is waited for.
    let metrics = match &args.client_ca_file {
        Some(ca) if args.secure_port != 0 => {
            serve_metrics(
                client.clone(),
                std::net::SocketAddr::new(args.bind_address, args.secure_port),
                ca,
                shutdown.clone(),
            )
            .await
        }
        _ => None,
    };
    let settings =
        crate::manager::Settings {
            hpa: crate::hpa::controller::Config {
                sync_period: args.horizontal_pod_autoscaler_sync_period,
                downscale_stabilization: args.horizontal_pod_autoscaler_downscale_stabilization,
            },
            node_lifecycle: crate::nodelifecycle::Config {
                grace: args.node_monitor_grace_period,
                ..Default::default()
            },
            node_ipam: crate::nodeipam::Config::parse(&args.cluster_cidr, args.node_cidr_mask_size)
                .map_err(anyhow::Error::msg)?,
            root_ca: match &args.root_ca_file {
                Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                    anyhow::anyhow!("reading --root-ca-file {}: {e}", path.display())
                })?),
                None => None,
            },
            signing: args
                .cluster_signing_cert_file
                .zip(args.cluster_signing_key_file)
                .map(|(cert, key)| crate::certificates::SigningConfig {
                    cert,
                    key,
                    duration: args.cluster_signing_duration,
                }),
        };
    let result =
        crate::manager::run_elected(client, election, names, settings, shutdown.clone()).await;
    shutdown.cancel();
    if let Some(server) = metrics {
        let _ = server.await;
    }
    result
}

/// Serves `/metrics` (the controller manager's series) and `/healthz` over HTTPS on `addr`,
/// as upstream's secure port; a port that cannot be bound is reported and skipped.
async fn serve_metrics(
    client: kube::Client,
    addr: std::net::SocketAddr,
    client_ca: &std::path::Path,
    shutdown: tokio_util::sync::CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    use minik8s_metrics::serving;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    let tls = match serving::self_signed_tls(client_ca, &[host, "localhost".into()]) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "secure port: not serving metrics");
            return None;
        }
    };
    let (bound, listener) = match serving::bind(addr).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "secure port: not serving metrics");
            return None;
        }
    };
    // The series exist (at zero) before the first item is processed.
    let _ = minik8s_metrics::workqueue();
    tracing::info!(%bound, "serving /metrics");
    Some(minik8s_task::spawn(
        "metrics-server",
        serving::serve_tls(
            listener,
            tls,
            serving::metrics_router(&["controller-manager"]),
            serving::Access::Review(client),
            shutdown,
        ),
    ))
}

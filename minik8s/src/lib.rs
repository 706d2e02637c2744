//! The all-in-one minik8s: `up` runs a single-node cluster in one process (for now the
//! apiserver on the embedded store) after writing its PKI and kubeconfigs.

use minik8s_kubeconfig::{Identity, Pki, PkiOptions};
use minik8s_storage::Endpoint;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// What `minik8s up` runs.
#[derive(Clone, Debug)]
pub struct UpConfig {
    /// Data folder: `pki/`, `store/`, `admin.kubeconfig`.
    pub data_dir: PathBuf,
    /// Storage; `None` is the embedded store under `data_dir/store`.
    pub storage: Option<Endpoint>,
    /// Address to listen on.
    pub bind: IpAddr,
    /// Port to listen on.
    pub port: u16,
    /// Extra DNS names for the serving certificate.
    pub hosts: Vec<String>,
    /// Extra IPs for the serving certificate.
    pub ips: Vec<IpAddr>,
    /// This node's name.
    pub node_name: String,
    /// Audit log level (`None`, `Metadata`, `Request`); the log is `data_dir/audit.log`.
    pub audit_level: minik8s_apiserver::audit::Level,
}

/// Why `up` failed.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// Certificates or kubeconfigs.
    #[error(transparent)]
    Pki(#[from] minik8s_kubeconfig::Error),
    /// The apiserver.
    #[error(transparent)]
    Apiserver(#[from] minik8s_apiserver::Error),
    /// The controllers' client.
    #[error("connecting the controllers")]
    Controllers(#[from] minik8s_kubeconfig::ClientError),
    /// Copying the admin kubeconfig.
    #[error("writing {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Writes the PKI (CA kept across runs) and returns the admin kubeconfig's path.
pub fn init_pki(cfg: &UpConfig) -> Result<(Pki, PathBuf), UpError> {
    let host = if cfg.bind.is_unspecified() {
        "127.0.0.1".to_owned()
    } else {
        cfg.bind.to_string()
    };
    let mut ips = cfg.ips.clone();
    if !cfg.bind.is_unspecified() {
        ips.push(cfg.bind);
    }
    let pki = Pki::init(PkiOptions {
        dir: cfg.data_dir.join("pki"),
        cluster_name: "minik8s".into(),
        server: format!("https://{host}:{}", cfg.port),
        hostnames: cfg.hosts.clone(),
        ips,
    })?;
    pki.issue_serving_cert()?;
    for id in Identity::components(&cfg.node_name) {
        pki.ensure_identity(&id)?;
    }
    let admin = pki.ensure_identity(&Identity::admin())?;
    Ok((pki, admin))
}

/// Runs the cluster until `shutdown`; `ready` is called with the admin kubeconfig's path once
/// the apiserver answers.
pub async fn up(
    cfg: UpConfig,
    shutdown: CancellationToken,
    ready: impl FnOnce(&std::path::Path),
) -> Result<(), UpError> {
    let (pki, admin) = init_pki(&cfg)?;
    let storage = cfg
        .storage
        .clone()
        .unwrap_or_else(|| Endpoint::Embedded(cfg.data_dir.join("store")));
    let dir = cfg.data_dir.join("pki");
    let server = minik8s_apiserver::start(
        minik8s_apiserver::Config {
            storage,
            listen: SocketAddr::new(cfg.bind, cfg.port),
            advertise: None,
            tls_cert: dir.join("apiserver.crt"),
            tls_key: dir.join("apiserver.key"),
            client_ca: pki.ca_path(),
            token_file: None,
            service_cidr: "10.96.0.0/12".into(),
            node_ports: 30000..=32767,
            audit: Some((cfg.data_dir.join("audit.log"), cfg.audit_level)),
            service_account_key: Some((pki.service_account_key()?, 600)),
            max_inflight: 400,
            request_timeout: std::time::Duration::from_secs(60),
            default_toleration_seconds: 300,
        },
        shutdown.clone(),
    )
    .await?;
    let link = cfg.data_dir.join("admin.kubeconfig");
    std::fs::copy(&admin, &link).map_err(|source| UpError::Io {
        path: link.clone(),
        source,
    })?;
    // The controllers, as the controller-manager identity, stopping with the cluster.
    let manager = Identity::components(&cfg.node_name)
        .into_iter()
        .find(|i| i.file == "controller-manager")
        .expect("the controller-manager identity");
    let client = minik8s_kubeconfig::client(&pki.kubeconfig_path(&manager)).await?;
    let names: Vec<String> = minik8s_controllers::manager::ALL
        .iter()
        .map(|s| s.to_string())
        .collect();
    let controllers = tokio::spawn(async move {
        if let Err(e) = minik8s_controllers::manager::run(client, &names, shutdown).await {
            tracing::error!(error = %e, "controllers stopped");
        }
    });
    ready(&link);
    let _ = controllers.await;
    server.wait().await;
    Ok(())
}

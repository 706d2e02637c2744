//! The all-in-one minik8s: `up` runs a single-node cluster in one process (apiserver on the
//! embedded store, controllers, kubelet on a private containerd) after writing its PKI and
//! kubeconfigs; `down` stops it and removes everything its node made.

mod components;
pub mod control_plane;
pub mod join;
pub mod static_plane;
pub mod tokens;

pub use components::start_node;
use components::{COMPONENTS, Connect, Start};
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
    /// This node's InternalIP (`None`: the source address of the default route).
    pub node_ip: Option<String>,
    /// Audit log level (`None`, `Metadata`, `Request`); the log is `data_dir/audit.log`.
    pub audit_level: minik8s_apiserver::serving::audit::Level,
    /// Whether this process also runs the node (kubelet on containerd); off for a control
    /// plane alone (the benchmarks).
    pub run_node: bool,
    /// Image archives for the node (the local pause and busybox): pushed to the local
    /// registry, or imported into the runtime when there is none.
    pub images: Vec<PathBuf>,
    /// Where the node's local registry listens (`None`: no registry, images are imported).
    pub registry: Option<SocketAddr>,
    /// Where the function gateway listens (`None`: no gateway nor Function controller).
    pub gateway: Option<SocketAddr>,
    /// Where the node's HTTP router (`DNS` objects, Ingresses) listens (`None`: no router).
    pub router: Option<SocketAddr>,
    /// Where the edge registry listens for edges (`None`: no edge registry).
    pub edge_registry: Option<SocketAddr>,
    /// Run the apiserver and the controller manager as static pods of this node (`None`:
    /// in this process).
    pub static_control_plane: Option<static_plane::StaticPlane>,
    /// How long a node may go without a heartbeat before the node lifecycle controller marks
    /// it unreachable (`--node-monitor-grace-period`).
    pub node_monitor_grace: std::time::Duration,
    /// The longest validity of certificates the CSR signer issues (`--cluster-signing-duration`).
    pub signing_duration: std::time::Duration,
    /// How often the apiserver compacts the store's history (`--etcd-compaction-interval`).
    pub compaction_interval: std::time::Duration,
    /// The embedded store's page cache in MiB (`--store-cache-mib`).
    pub store_cache_mib: usize,
    /// How long the embedded store keeps its history at least (`--store-history-age`).
    pub store_history_age: std::time::Duration,
    /// The pod address space the node IPAM controller splits into one block per node
    /// (`--cluster-cidr`, `--node-cidr-mask-size`).
    pub node_ipam: minik8s_controllers::nodeipam::Config,
}

impl UpConfig {
    /// The node's kubelet configuration (everything under `data_dir/node`).
    pub fn kubelet(&self) -> minik8s_kubelet::Config {
        let mut cfg = minik8s_kubelet::Config::new(&self.node_name, self.data_dir.join("node"));
        cfg.images = self.images.clone();
        cfg.manifests = Some(self.data_dir.join("manifests"));
        cfg.node_ip = self.node_ip.clone();
        cfg
    }

    /// The local registry's folder.
    pub fn registry_dir(&self) -> PathBuf {
        self.data_dir.join("registry")
    }

    /// The file holding the running `up`'s process id.
    pub fn pid_file(&self) -> PathBuf {
        self.data_dir.join("minik8s.pid")
    }
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
    /// The node.
    #[error(transparent)]
    Kubelet(#[from] minik8s_kubelet::Error),
    /// Installing the built-in CRDs (Functions, …).
    #[error("installing the built-in CRDs")]
    Crds(#[source] kube::Error),
    /// Installing the cluster DNS's Service.
    #[error("installing the kube-dns Service")]
    Dns(#[source] minik8s_proxy::Error),
    /// Installing the router's kind, IngressClass and role.
    #[error("installing the router's DNS kind and IngressClass")]
    Router(#[source] minik8s_proxy::Error),
    /// Installing the edge registry's role.
    #[error("installing the edge registry's role")]
    Edge(#[source] kube::Error),
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
    let pki = open_pki(cfg)?;
    pki.issue_serving_cert()?;
    for id in Identity::components(&cfg.node_name) {
        pki.ensure_identity(&id)?;
    }
    let admin = pki.ensure_identity(&Identity::admin())?;
    Ok((pki, admin))
}

/// The data folder's CA (created when missing), issuing nothing else.
pub fn open_pki(cfg: &UpConfig) -> Result<Pki, UpError> {
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
    Ok(pki)
}

/// TLS to etcd when the PKI folder has the apiserver's etcd client certificate (written by
/// `minik8s pki etcd`, which `hack/etcd-cluster.sh` runs), else `None` (plain HTTP).
fn etcd_tls(dir: &std::path::Path) -> Result<Option<minik8s_storage::EtcdTls>, UpError> {
    let (cert, key) = (
        dir.join("apiserver-etcd-client.crt"),
        dir.join("apiserver-etcd-client.key"),
    );
    if !cert.exists() {
        return Ok(None);
    }
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|source| UpError::Io { path, source })
    };
    Ok(Some(minik8s_storage::EtcdTls {
        ca_pem: read(dir.join("ca.crt"))?,
        cert_pem: read(cert)?,
        key_pem: read(key)?,
    }))
}

/// The apiserver's configuration for this data folder.
pub fn apiserver_config(cfg: &UpConfig, pki: &Pki) -> Result<minik8s_apiserver::Config, UpError> {
    let storage = cfg
        .storage
        .clone()
        .unwrap_or_else(|| Endpoint::Embedded(cfg.data_dir.join("store")));
    let dir = cfg.data_dir.join("pki");
    let etcd_tls = match &storage {
        Endpoint::Etcd(_) => etcd_tls(&dir)?,
        Endpoint::Embedded(_) => None,
    };
    Ok(minik8s_apiserver::Config {
        storage,
        etcd_tls,
        store_cache_bytes: cfg.store_cache_mib << 20,
        store_history_age: cfg.store_history_age,
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
        quota_resync: minik8s_apiserver::admission::quota::RESYNC,
        kubelet_client: Some((
            dir.join("apiserver-kubelet-client.crt"),
            dir.join("apiserver-kubelet-client.key"),
        )),
        metric_resolution: minik8s_apiserver::apis::metrics::DEFAULT_RESOLUTION,
        front_proxy: Some(pki.front_proxy()?),
        compaction_interval: cfg.compaction_interval,
    })
}

/// Runs the apiserver alone until `shutdown` (the static control plane's `kube-apiserver`
/// pod runs this).
pub async fn apiserver(cfg: UpConfig, shutdown: CancellationToken) -> Result<(), UpError> {
    let (pki, _) = init_pki(&cfg)?;
    let server = minik8s_apiserver::start(apiserver_config(&cfg, &pki)?, shutdown).await?;
    server.wait().await;
    Ok(())
}

/// Waits until the apiserver answers the admin (a static control plane starting).
async fn wait_for_apiserver(
    admin: &std::path::Path,
    shutdown: &CancellationToken,
) -> Result<bool, UpError> {
    let started = std::time::Instant::now();
    let client = minik8s_kubeconfig::client(admin).await?;
    loop {
        if client.apiserver_version().await.is_ok() {
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "the static apiserver answers"
            );
            return Ok(true);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
        }
    }
}

/// Runs the cluster until `shutdown`; `ready` is called with the admin kubeconfig's path once
/// the apiserver answers.
pub async fn up(
    mut cfg: UpConfig,
    shutdown: CancellationToken,
    ready: impl FnOnce(&std::path::Path),
) -> Result<(), UpError> {
    // Bound to every address, the apiserver is advertised (the `kubernetes` Service's
    // endpoint, and its certificate) at this machine's node address, so pods reach it.
    let advertise = if cfg.bind.is_unspecified() {
        let ip = match &cfg.node_ip {
            Some(ip) => ip.clone(),
            None => minik8s_kubelet::node::default_ip().await,
        };
        if let Ok(parsed) = ip.parse() {
            cfg.ips.push(parsed);
        }
        Some(format!("{ip}:{}", cfg.port))
    } else {
        None
    };
    let (pki, admin) = init_pki(&cfg)?;
    let tasks = tokio_util::task::TaskTracker::new();
    let Some(server) = serve_api(&cfg, &pki, &admin, advertise, &tasks, &shutdown).await? else {
        tasks.close();
        tasks.wait().await;
        return Ok(());
    };
    let link = cfg.data_dir.join("admin.kubeconfig");
    std::fs::copy(&admin, &link).map_err(|source| UpError::Io {
        path: link.clone(),
        source,
    })?;
    let connect = Connect {
        server: server.as_ref(),
        pki: &pki,
    };
    let admin_client = connect.client(&Identity::admin()).await?;
    if !install_kinds_patiently(&admin_client, &shutdown).await? {
        tasks.close();
        tasks.wait().await;
        return Ok(());
    }
    let start = Start {
        cfg: &cfg,
        connect: &connect,
        admin: &admin_client,
        tasks: &tasks,
        shutdown: &shutdown,
    };
    for c in COMPONENTS.iter().filter(|c| (c.wanted)(&cfg)) {
        tracing::debug!(component = c.name, "starting");
        (c.start)(&start).await?;
    }
    let pid = cfg.pid_file();
    std::fs::write(&pid, std::process::id().to_string()).map_err(|source| UpError::Io {
        path: pid.clone(),
        source,
    })?;
    ready(&link);
    tasks.close();
    tasks.wait().await;
    if let Some(server) = server {
        server.wait().await;
    }
    let _ = std::fs::remove_file(&pid);
    Ok(())
}

/// Starts the apiserver in this process, or, with a static control plane, writes its
/// manifests, starts this machine's node (whose kubelet runs them) and waits until the
/// apiserver answers. `None` when `shutdown` came first; `Some(None)` for a static apiserver.
async fn serve_api(
    cfg: &UpConfig,
    pki: &Pki,
    admin: &std::path::Path,
    advertise: Option<String>,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: &CancellationToken,
) -> Result<Option<Option<minik8s_apiserver::Server>>, UpError> {
    let Some(plane) = &cfg.static_control_plane else {
        let mut config = apiserver_config(cfg, pki)?;
        if advertise.is_some() {
            config.advertise = advertise;
        }
        return Ok(Some(Some(
            minik8s_apiserver::start(config, shutdown.clone()).await?,
        )));
    };
    static_plane::write_manifests(cfg, plane)?;
    let connect = Connect { server: None, pki };
    components::local_node(cfg, &connect, tasks, shutdown.clone()).await?;
    Ok(wait_for_apiserver(admin, shutdown).await?.then_some(None))
}

/// The kinds every cluster has beyond upstream's, applied as the admin: the serverless kinds,
/// the GPUJob kind and its controller's roles, the cluster DNS's Service (each node's proxy
/// serves it), and the router's kind, IngressClass and role.
async fn install_kinds(admin: &kube::Client) -> Result<(), UpError> {
    minik8s_serverless::install(admin.clone())
        .await
        .map_err(UpError::Crds)?;
    minik8s_gpu::install(admin.clone())
        .await
        .map_err(UpError::Crds)?;
    minik8s_proxy::dns::install(admin.clone())
        .await
        .map_err(UpError::Dns)?;
    minik8s_proxy::router::install(admin.clone())
        .await
        .map_err(UpError::Router)
}

/// [`install_kinds`], again while the store is briefly unavailable (an etcd election, a
/// member restarting, the apiserver's own start): only a refusal ends `up`. `false` when
/// `shutdown` came first.
async fn install_kinds_patiently(
    admin: &kube::Client,
    shutdown: &CancellationToken,
) -> Result<bool, UpError> {
    let mut wait = std::time::Duration::from_millis(200);
    loop {
        let error = match install_kinds(admin).await {
            Ok(()) => return Ok(true),
            Err(e) if transient(&e) => e,
            Err(e) => return Err(e),
        };
        tracing::warn!(
            error = %anyhow::Error::from(error).chain().map(ToString::to_string).collect::<Vec<_>>().join(": "),
            retry_in = ?wait,
            "the built-in kinds are not installed yet"
        );
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(5));
    }
}

/// Whether `error` came from a request the server could not serve for now (5xx, 429, a time
/// out or a broken connection) rather than one it refused.
fn transient(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(kube) = e.downcast_ref::<kube::Error>() {
            return match kube {
                kube::Error::Api(status) => status.code >= 500 || status.code == 429,
                kube::Error::HyperError(_) | kube::Error::Service(_) => true,
                _ => false,
            };
        }
        cause = e.source();
    }
    false
}

/// Stops a running `up` on this data folder (SIGTERM, waiting up to 30 s), then removes every
/// pod, the runtime, bridge, cgroups, mounts and guard rules of its node. Harmless when
/// nothing runs.
pub async fn down(cfg: &UpConfig) -> Result<(), UpError> {
    let pid_file = cfg.pid_file();
    if let Some(pid) = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
    {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        if proc_dir.exists() {
            let _ = tokio::process::Command::new("kill")
                .arg(pid.to_string())
                .status()
                .await;
            for _ in 0..300 {
                if !proc_dir.exists() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        let _ = std::fs::remove_file(&pid_file);
    }
    if let Err(e) = minik8s_proxy::iptables::cleanup().await {
        tracing::warn!(error = %e, "removing the proxy's rules");
    }
    if let Err(e) = minik8s_proxy::router::remove_hosts_block(std::path::Path::new("/etc/hosts")) {
        tracing::warn!(error = %e, "removing the router's /etc/hosts block");
    }
    minik8s_kubelet::down::down(&cfg.kubelet()).await?;
    minik8s_kubelet::registry::stop_in(&cfg.registry_dir()).await;
    Ok(())
}

//! The all-in-one minik8s: `up` runs a single-node cluster in one process (apiserver on the
//! embedded store, controllers, kubelet on a private containerd) after writing its PKI and
//! kubeconfigs; `down` stops it and removes everything its node made.

pub mod control_plane;
pub mod join;
pub mod startup_code;
pub mod static_plane;
pub mod tokens;

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
    pub audit_level: minik8s_apiserver::audit::Level,
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

/// How this process's components reach the apiserver: straight into its router when it runs
/// in this process (no socket, TLS or HTTP framing; see `minik8s_apiserver::local`), else over
/// HTTPS with their kubeconfigs (a static control plane runs it as a pod).
struct Connect<'a> {
    server: Option<&'a minik8s_apiserver::Server>,
    pki: &'a Pki,
}

impl Connect<'_> {
    /// A client as `identity`, whose certificate and kubeconfig are written either way (for
    /// the user, and for the components that run outside this process).
    async fn client(&self, identity: &Identity) -> Result<kube::Client, UpError> {
        let kubeconfig = self.pki.ensure_identity(identity)?;
        Ok(match self.server {
            Some(server) => {
                let user = minik8s_apiserver::auth::User::new(
                    identity.user.clone(),
                    identity.groups.clone(),
                );
                kube::Client::new(server.local(user), "default")
            }
            None => minik8s_kubeconfig::client(&kubeconfig).await?,
        })
    }

    /// A client as this machine's component `file` (`kubelet`, `proxy`, ...).
    async fn component(&self, node: &str, file: &str) -> Result<kube::Client, UpError> {
        let identity = Identity::components(node)
            .into_iter()
            .find(|i| i.file == file)
            .expect("a component identity");
        self.client(&identity).await
    }
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
        metric_resolution: minik8s_apiserver::metrics::DEFAULT_RESOLUTION,
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
    let dir = cfg.data_dir.join("pki");
    let tasks = tokio_util::task::TaskTracker::new();
    let server = match &cfg.static_control_plane {
        None => {
            let mut config = apiserver_config(&cfg, &pki)?;
            if advertise.is_some() {
                config.advertise = advertise;
            }
            Some(minik8s_apiserver::start(config, shutdown.clone()).await?)
        }
        Some(plane) => {
            // The kubelet runs the apiserver and the controller manager from their
            // manifests; the node comes first.
            static_plane::write_manifests(&cfg, plane)?;
            let connect = Connect {
                server: None,
                pki: &pki,
            };
            start_local_node(&cfg, &connect, &tasks, shutdown.clone()).await?;
            if !wait_for_apiserver(&admin, &shutdown).await? {
                tasks.close();
                tasks.wait().await;
                return Ok(());
            }
            None
        }
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
    // The built-in CRDs (the serverless kinds), applied as the admin.
    minik8s_serverless::install(admin_client.clone())
        .await
        .map_err(UpError::Crds)?;
    // The GPUJob kind and its controller's roles.
    minik8s_gpu::install(admin_client.clone())
        .await
        .map_err(UpError::Crds)?;
    // The cluster DNS's Service (each node's proxy serves it), and the router's kind,
    // IngressClass and role.
    minik8s_proxy::dns::install(admin_client.clone())
        .await
        .map_err(UpError::Dns)?;
    minik8s_proxy::router::install(admin_client.clone())
        .await
        .map_err(UpError::Router)?;
    if cfg.static_control_plane.is_none() {
        // The controllers, as the controller-manager identity, stopping with the cluster.
        let client = connect
            .component(&cfg.node_name, "controller-manager")
            .await?;
        let names: Vec<String> = minik8s_controllers::manager::ALL
            .iter()
            .map(|s| s.to_string())
            .collect();
        let settings = minik8s_controllers::manager::Settings {
            root_ca: Some(pki.ca_pem().to_owned()),
            signing: Some(minik8s_controllers::certificates::SigningConfig {
                cert: pki.ca_path(),
                key: dir.join("ca.key"),
                duration: cfg.signing_duration,
            }),
            node_lifecycle: minik8s_controllers::nodelifecycle::Config {
                grace: cfg.node_monitor_grace,
                ..Default::default()
            },
            // This machine's node takes its own block: a machine joining before it
            // registers must not be given the same one.
            node_ipam: minik8s_controllers::nodeipam::Config {
                reserved: cfg
                    .run_node
                    .then(|| cfg.kubelet().runtime.pod_cidr)
                    .into_iter()
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        };
        // On etcd, other machines' control planes may share the cluster: the controllers
        // run only while this process holds the `kube-controller-manager` Lease, as
        // upstream's. The embedded store has one process by construction.
        let election = matches!(cfg.storage, Some(Endpoint::Etcd(_))).then(|| {
            minik8s_controllers::leader::Config::new(
                "kube-controller-manager",
                minik8s_controllers::leader::identity(),
            )
        });
        {
            let shutdown = shutdown.clone();
            minik8s_task::spawn_on(&tasks, "controller-manager", async move {
                if let Err(e) = minik8s_controllers::manager::run_elected(
                    client, election, names, settings, shutdown,
                )
                .await
                {
                    tracing::error!(error = %e, "controllers stopped");
                }
            });
        }
    }
    if cfg.static_control_plane.is_none() {
        // GPUJobs: the controller, as its own user; SSH key files under the data folder.
        let client = connect
            .client(&Identity::new("gpujobs", minik8s_gpu::USER, &[]))
            .await?;
        let dir = cfg.data_dir.join("gpu");
        let shutdown = shutdown.clone();
        minik8s_task::spawn_on(
            &tasks,
            "gpujob-controller",
            minik8s_gpu::controller::run(client, dir, shutdown),
        );
    }
    if let Some(listen) = cfg.gateway {
        // Functions: the gateway and the Function controller, as their own user.
        let client = connect
            .client(&Identity::new("functions", minik8s_serverless::USER, &[]))
            .await?;
        let public_host = match &cfg.kubelet().node_ip {
            Some(ip) => ip.clone(),
            None => minik8s_kubelet::node::default_ip().await,
        };
        // Function modules: the bases as virtual nodes (one replica here; more run as
        // `minik8s function-modules`), as their own user.
        let identity = Identity::new("function-modules", minik8s_serverless::modules::USER, &[]);
        let modules_client = connect.client(&identity).await?;
        let mut mcfg =
            minik8s_serverless::modules::Config::new(&minik8s_controllers::leader::identity());
        mcfg.address = public_host.clone();
        mcfg.client_ca = Some(pki.ca_path());
        {
            let shutdown = shutdown.clone();
            minik8s_task::spawn_on(&tasks, "function-modules", async move {
                if let Err(e) =
                    minik8s_serverless::modules::run(modules_client, mcfg, shutdown).await
                {
                    tracing::error!(error = %e, "the function-module controller stopped");
                }
            });
        }
        let shutdown = shutdown.clone();
        minik8s_task::spawn_on(&tasks, "functions", async move {
            let fcfg = minik8s_serverless::Config {
                listen,
                public_host,
                bases: 2,
            };
            if let Err(e) = minik8s_serverless::serve(client, fcfg, shutdown).await {
                tracing::error!(error = %e, "the function gateway stopped");
            }
        });
    }
    if let Some(listen) = cfg.edge_registry
        && cfg.static_control_plane.is_none()
    {
        start_edge_registry(
            &cfg,
            &connect,
            admin_client,
            listen,
            &tasks,
            shutdown.clone(),
        )
        .await?;
    }
    if cfg.run_node && cfg.static_control_plane.is_none() {
        start_local_node(&cfg, &connect, &tasks, shutdown.clone()).await?;
    }
    let pid = cfg.pid_file();
    std::fs::write(&pid, std::process::id().to_string()).map_err(|source| UpError::Io {
        path: pid.clone(),
        source,
    })?;
    ready(&link);
    {
        // Start-up is over once the components have listed what they watch: its code is
        // given back (`startup_code`), and again every `startup_code::AGAIN`, which sheds
        // what rarely run paths faulted in meanwhile.
        let shutdown = shutdown.clone();
        minik8s_task::spawn_on(&tasks, "start-up-code", async move {
            let mut wait = startup_code::SETTLE;
            let mut first = true;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                // Said before, so that saying it is not code that runs after.
                let released = startup_code::plan().and_then(|plan| {
                    let (mib, rss_kib) = (plan.bytes() >> 20, plan.rss_kib);
                    if first {
                        tracing::info!(mib, rss_kib, "giving start-up's code back");
                    } else {
                        tracing::debug!(mib, rss_kib, "giving cold code back");
                    }
                    plan.release()
                });
                if let Err(e) = released {
                    tracing::warn!(error = %e, "could not give start-up's code back");
                    return;
                }
                first = false;
                wait = startup_code::AGAIN;
            }
        });
    }
    tasks.close();
    tasks.wait().await;
    if let Some(server) = server {
        server.wait().await;
    }
    let _ = std::fs::remove_file(&pid);
    Ok(())
}

/// Starts the edge registry (its role installed as the admin, then running as its own
/// user): edges join through it and run as virtual nodes of this process.
async fn start_edge_registry(
    cfg: &UpConfig,
    connect: &Connect<'_>,
    admin: kube::Client,
    listen: SocketAddr,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
) -> Result<(), UpError> {
    minik8s_edge::cloud::install(admin)
        .await
        .map_err(UpError::Edge)?;
    let pki = connect.pki;
    let identity = Identity::new("edge-registry", minik8s_edge::cloud::USER, &[]);
    let client = connect.client(&identity).await?;
    let dir = cfg.data_dir.join("pki");
    let read = |file: &str| {
        let path = dir.join(file);
        std::fs::read_to_string(&path).map_err(|source| UpError::Io { path, source })
    };
    let host = if cfg.bind.is_unspecified() {
        "127.0.0.1".to_owned()
    } else {
        cfg.bind.to_string()
    };
    let mut vnode =
        minik8s_edge::cloud::RegistryConfig::vnode_config(&minik8s_controllers::leader::identity());
    vnode.address = match &cfg.node_ip {
        Some(ip) => ip.clone(),
        None => minik8s_kubelet::node::default_ip().await,
    };
    vnode.client_ca = Some(pki.ca_path());
    let rcfg = minik8s_edge::cloud::RegistryConfig {
        listen,
        apiserver: format!("https://{host}:{}", cfg.port),
        ca_pem: pki.ca_pem().to_owned(),
        serving: (read("apiserver.crt")?, read("apiserver.key")?),
        client: (read("edge-registry.crt")?, read("edge-registry.key")?),
        heartbeat: std::time::Duration::from_secs(10),
        vnode,
    };
    minik8s_task::spawn_on(tasks, "edge-registry", async move {
        if let Err(e) = minik8s_edge::cloud::run(client, rcfg, shutdown).await {
            tracing::error!(error = %e, "the edge registry stopped");
        }
    });
    Ok(())
}

/// Starts this machine's node (kubelet with the local registry when it has one, proxy).
async fn start_local_node(
    cfg: &UpConfig,
    connect: &Connect<'_>,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
) -> Result<(), UpError> {
    let kubelet_client = connect.component(&cfg.node_name, "kubelet").await?;
    let proxy_client = connect.component(&cfg.node_name, "proxy").await?;
    let mut node = cfg.kubelet();
    node.client_ca = Some(connect.pki.ca_path());
    if let Some(plane) = &cfg.static_control_plane {
        node.images.push(plane.archive.clone());
    }
    if let Some(addr) = cfg.registry {
        match minik8s_kubelet::registry::publish(&cfg.registry_dir(), addr, &node.images).await {
            Ok((registry, rest)) => {
                tracing::info!(addr = %registry.addr(), "local registry serving the node's images");
                node.runtime.registry_mirror = Some(registry.addr().to_string());
                node.images = rest;
            }
            Err(e) => {
                tracing::warn!(error = %e, "no local registry; importing the images instead")
            }
        }
    }
    // The proxy's series are on this process's apiserver `/metrics`.
    start_node(
        tasks,
        kubelet_client,
        proxy_client,
        node,
        cfg.router,
        None,
        shutdown,
    )
    .await;
    Ok(())
}

/// Starts a node's kubelet and proxy (with the cluster DNS on its pod gateway, given
/// `router` its HTTP router, given `proxy_metrics` its `/metrics` there) on `tasks`; a kubelet that stops on an error stops everything.
pub async fn start_node(
    tasks: &tokio_util::task::TaskTracker,
    kubelet_client: kube::Client,
    proxy_client: kube::Client,
    node: minik8s_kubelet::Config,
    router: Option<SocketAddr>,
    proxy_metrics: Option<SocketAddr>,
    shutdown: CancellationToken,
) {
    let node_ip = match &node.node_ip {
        Some(ip) => ip.clone(),
        None => minik8s_kubelet::node::default_ip().await,
    };
    let mut proxy = minik8s_proxy::Config::new(&node.node_name);
    proxy.metrics_bind = proxy_metrics;
    if let Some(listen) = router {
        proxy.router = node_ip
            .parse()
            .ok()
            .map(|ip| minik8s_proxy::router::Config {
                listen,
                listen_tls: Some(SocketAddr::new(listen.ip(), 443)),
                node_ip: ip,
                hosts_file: Some("/etc/hosts".into()),
            });
    }
    proxy.dns = minik8s_proxy::dns::Config::gateway_of(&node.runtime.pod_cidr)
        .map(minik8s_proxy::dns::Config::on);
    {
        let shutdown = shutdown.clone();
        minik8s_task::spawn_on(tasks, "kubelet", async move {
            if let Err(e) = minik8s_kubelet::run(kubelet_client, node, shutdown.clone()).await {
                tracing::error!(error = %e, "the kubelet stopped");
                shutdown.cancel();
            }
        });
    }
    minik8s_task::spawn_on(tasks, "proxy", async move {
        if let Err(e) = minik8s_proxy::run(proxy_client, proxy, shutdown).await {
            tracing::error!(error = %e, "the proxy stopped");
        }
    });
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

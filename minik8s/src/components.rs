//! The components `minik8s up` runs in its process, as data ([`COMPONENTS`]): each says when
//! a configuration wants it and how it starts; each runs as named tasks on the cluster's
//! tracker and stops with its shutdown token. `up` (and `init`, and a control plane's `join`,
//! which run `up`) starts them in order once the apiserver answers and the built-in kinds are
//! installed; a joining worker starts only [`start_node`].

use crate::{UpConfig, UpError};
use futures::future::BoxFuture;
use minik8s_kubeconfig::{Identity, Pki};
use minik8s_storage::Endpoint;
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How this process's components reach the apiserver: straight into its router when it runs
/// in this process (no socket, TLS or HTTP framing; see `minik8s_apiserver::serving::local`), else over
/// HTTPS with their kubeconfigs (a static control plane runs it as a pod).
pub(crate) struct Connect<'a> {
    pub(crate) server: Option<&'a minik8s_apiserver::Server>,
    pub(crate) pki: &'a Pki,
}

impl Connect<'_> {
    /// A client as `identity`, whose certificate and kubeconfig are written either way (for
    /// the user, and for the components that run outside this process).
    pub(crate) async fn client(&self, identity: &Identity) -> Result<kube::Client, UpError> {
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
    pub(crate) async fn component(&self, node: &str, file: &str) -> Result<kube::Client, UpError> {
        let identity = Identity::components(node)
            .into_iter()
            .find(|i| i.file == file)
            .expect("a component identity");
        self.client(&identity).await
    }
}

/// What a component is started with.
pub(crate) struct Start<'a> {
    /// The cluster's configuration.
    pub(crate) cfg: &'a UpConfig,
    /// How it reaches the apiserver.
    pub(crate) connect: &'a Connect<'a>,
    /// The admin's client (for a component that installs its roles first).
    pub(crate) admin: &'a kube::Client,
    /// The tracker its tasks run on.
    pub(crate) tasks: &'a TaskTracker,
    /// Cancelled when the cluster stops.
    pub(crate) shutdown: &'a CancellationToken,
}

/// One component `up` runs.
pub(crate) struct Component {
    /// Its name (its main task's).
    pub(crate) name: &'static str,
    /// Whether this configuration runs it here.
    pub(crate) wanted: fn(&UpConfig) -> bool,
    /// Starts it.
    pub(crate) start: for<'a> fn(&'a Start<'a>) -> BoxFuture<'a, Result<(), UpError>>,
}

/// What `up` runs after the apiserver, in order. With a static control plane the kubelet
/// runs the apiserver and the controller manager from their manifests, so only what is not
/// in a manifest runs here.
pub(crate) const COMPONENTS: &[Component] = &[
    Component {
        name: "controller-manager",
        wanted: |c| c.static_control_plane.is_none(),
        start: |s| Box::pin(controller_manager(s)),
    },
    Component {
        name: "gpujob-controller",
        wanted: |c| c.static_control_plane.is_none(),
        start: |s| Box::pin(gpujob_controller(s)),
    },
    Component {
        name: "functions",
        wanted: |c| c.gateway.is_some(),
        start: |s| Box::pin(functions(s)),
    },
    Component {
        name: "edge-registry",
        wanted: |c| c.edge_registry.is_some() && c.static_control_plane.is_none(),
        start: |s| Box::pin(edge_registry(s)),
    },
    Component {
        name: "node",
        wanted: |c| c.run_node && c.static_control_plane.is_none(),
        start: |s| Box::pin(local_node(s.cfg, s.connect, s.tasks, s.shutdown.clone())),
    },
];

/// The controllers, as the controller-manager identity; on etcd only while this process
/// holds the `kube-controller-manager` Lease.
async fn controller_manager(s: &Start<'_>) -> Result<(), UpError> {
    let cfg = s.cfg;
    let client = s
        .connect
        .component(&cfg.node_name, "controller-manager")
        .await?;
    let names: Vec<String> = minik8s_controllers::manager::ALL
        .iter()
        .map(|s| s.to_string())
        .collect();
    let settings = minik8s_controllers::manager::Settings {
        root_ca: Some(s.connect.pki.ca_pem().to_owned()),
        signing: Some(minik8s_controllers::certificates::SigningConfig {
            cert: s.connect.pki.ca_path(),
            key: cfg.data_dir.join("pki").join("ca.key"),
            duration: cfg.signing_duration,
        }),
        node_lifecycle: minik8s_controllers::nodelifecycle::Config {
            grace: cfg.node_monitor_grace,
            ..Default::default()
        },
        // This machine's node takes its own block: a machine joining before it registers
        // must not be given the same one.
        node_ipam: minik8s_controllers::nodeipam::Config {
            reserved: cfg
                .run_node
                .then(|| cfg.kubelet().runtime.pod_cidr)
                .into_iter()
                .collect(),
            ..cfg.node_ipam.clone()
        },
        ..Default::default()
    };
    // On etcd, other machines' control planes may share the cluster: the controllers run
    // only while this process holds the Lease, as upstream's. The embedded store has one
    // process by construction.
    let election = matches!(cfg.storage, Some(Endpoint::Etcd(_))).then(|| {
        minik8s_controllers::leader::Config::new(
            "kube-controller-manager",
            minik8s_controllers::leader::identity(),
        )
    });
    let shutdown = s.shutdown.clone();
    minik8s_task::spawn_on(s.tasks, "controller-manager", async move {
        if let Err(e) =
            minik8s_controllers::manager::run_elected(client, election, names, settings, shutdown)
                .await
        {
            tracing::error!(error = %e, "controllers stopped");
        }
    });
    Ok(())
}

/// GPUJobs: the controller, as its own user; SSH key files under the data folder.
async fn gpujob_controller(s: &Start<'_>) -> Result<(), UpError> {
    let client = s
        .connect
        .client(&Identity::new("gpujobs", minik8s_gpu::USER, &[]))
        .await?;
    let dir = s.cfg.data_dir.join("gpu");
    minik8s_task::spawn_on(
        s.tasks,
        "gpujob-controller",
        minik8s_gpu::controller::run(client, dir, s.shutdown.clone()),
    );
    Ok(())
}

/// Functions: the gateway and the Function controller, as their own user, and function
/// modules (the bases as virtual nodes; one replica here, more run as
/// `minik8s function-modules`), as theirs.
async fn functions(s: &Start<'_>) -> Result<(), UpError> {
    let Some(listen) = s.cfg.gateway else {
        return Ok(());
    };
    let client = s
        .connect
        .client(&Identity::new("functions", minik8s_serverless::USER, &[]))
        .await?;
    let public_host = match &s.cfg.kubelet().node_ip {
        Some(ip) => ip.clone(),
        None => minik8s_kubelet::node::default_ip().await,
    };
    let identity = Identity::new("function-modules", minik8s_serverless::modules::USER, &[]);
    let modules_client = s.connect.client(&identity).await?;
    let mut mcfg =
        minik8s_serverless::modules::Config::new(&minik8s_controllers::leader::identity());
    mcfg.address = public_host.clone();
    mcfg.client_ca = Some(s.connect.pki.ca_path());
    let shutdown = s.shutdown.clone();
    minik8s_task::spawn_on(s.tasks, "function-modules", async move {
        if let Err(e) = minik8s_serverless::modules::run(modules_client, mcfg, shutdown).await {
            tracing::error!(error = %e, "the function-module controller stopped");
        }
    });
    let shutdown = s.shutdown.clone();
    minik8s_task::spawn_on(s.tasks, "functions", async move {
        let fcfg = minik8s_serverless::Config {
            listen,
            public_host,
            bases: 2,
        };
        if let Err(e) = minik8s_serverless::serve(client, fcfg, shutdown).await {
            tracing::error!(error = %e, "the function gateway stopped");
        }
    });
    Ok(())
}

/// Starts the edge registry (its role installed as the admin, then running as its own
/// user): edges join through it and run as virtual nodes of this process.
async fn edge_registry(s: &Start<'_>) -> Result<(), UpError> {
    let Start {
        cfg,
        connect,
        tasks,
        ..
    } = *s;
    let shutdown = s.shutdown.clone();
    let Some(listen) = cfg.edge_registry else {
        return Ok(());
    };
    minik8s_edge::cloud::install(s.admin.clone())
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
pub(crate) async fn local_node(
    cfg: &UpConfig,
    connect: &Connect<'_>,
    tasks: &TaskTracker,
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
    tasks: &TaskTracker,
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

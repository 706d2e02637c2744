//! minik8s apiserver: Kubernetes REST and watch semantics over HTTPS on the storage layer.
//!
//! One generic pipeline serves every resource (`handlers`): the request is parsed into a
//! [`serving::request::RequestInfo`], its resource looked up in the [`registry::Registry`], the user
//! authenticated and authorized (`auth`), and the verb's handler runs against the
//! [`minik8s_storage::Store`]. Discovery, OpenAPI and Table output are generated from the
//! same registry rows.

pub mod admission;
pub mod aggregation;
pub mod apis;
pub mod auth;
pub mod cluster;
pub mod context;
mod discovery;
pub mod error;
mod handlers;
pub mod object;
pub mod registry;
pub mod serving;
pub mod store;

pub use discovery::set_git_commit;

use axum::Router;
use minik8s_storage::{Endpoint, Storage};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Everything the apiserver needs to start.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the store is.
    pub storage: Endpoint,
    /// TLS to etcd (`None`: plain, or the embedded store).
    pub etcd_tls: Option<minik8s_storage::EtcdTls>,
    /// The embedded store's page cache in bytes.
    pub store_cache_bytes: usize,
    /// How long the embedded store keeps its history at least.
    pub store_history_age: std::time::Duration,
    /// Address to listen on (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Address clients reach the server at (for the `kubernetes` Service's Endpoints).
    pub advertise: Option<String>,
    /// Serving certificate (PEM).
    pub tls_cert: PathBuf,
    /// Serving key (PEM).
    pub tls_key: PathBuf,
    /// CA that signs client certificates (PEM).
    pub client_ca: PathBuf,
    /// Static bearer tokens (`token,user,uid,"groups"`), if any.
    pub token_file: Option<PathBuf>,
    /// ClusterIP range.
    pub service_cidr: String,
    /// NodePort range.
    pub node_ports: RangeInclusive<u16>,
    /// The audit log file, if any, and how much it records.
    pub audit: Option<(PathBuf, serving::audit::Level)>,
    /// The key that signs ServiceAccount tokens, and the shortest expiry (seconds) allowed.
    pub service_account_key: Option<(PathBuf, i64)>,
    /// Most requests served at once (watches excluded); more get 429. Heartbeats (Leases,
    /// single Nodes) have a quarter as many seats again of their own.
    pub max_inflight: usize,
    /// Longest time a non-watch request may take (504 after).
    pub request_timeout: std::time::Duration,
    /// Seconds pods tolerate `node.kubernetes.io/not-ready` and `unreachable` (NoExecute)
    /// unless they say otherwise (upstream's DefaultTolerationSeconds, 300).
    pub default_toleration_seconds: i64,
    /// How often every quota's status is recounted whatever changed (upstream's
    /// controller: 5 minutes; see [`admission::quota::resync`]).
    pub quota_resync: std::time::Duration,
    /// Client certificate and key for calling kubelets (`pods/log`, …); none: those fail.
    pub kubelet_client: Option<(PathBuf, PathBuf)>,
    /// How often node and pod metrics are sampled (the CPU rate's window).
    pub metric_resolution: std::time::Duration,
    /// The aggregation layer's front-proxy CA and client certificate; none: APIServices
    /// backed by a Service cannot be reached.
    pub front_proxy: Option<minik8s_kubeconfig::FrontProxy>,
    /// How often the store's history is compacted (`--etcd-compaction-interval`; zero: never,
    /// the embedded store then only keeps its last revisions).
    pub compaction_interval: std::time::Duration,
}

/// Why the apiserver could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store could not be opened.
    #[error("opening the store")]
    Storage(#[from] minik8s_storage::Error),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] serving::server::TlsError),
    /// The listen address could not be bound.
    #[error("listening on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The token file could not be read.
    #[error(transparent)]
    Tokens(#[from] auth::TokenFileError),
    /// The service ranges are invalid.
    #[error(transparent)]
    Range(#[from] registry::alloc::RangeError),
    /// The ServiceAccount signing key could not be loaded.
    #[error(transparent)]
    ServiceAccountKey(#[from] auth::tokens::KeyError),
    /// The audit log could not be opened.
    #[error(transparent)]
    Audit(#[from] serving::audit::AuditError),
    /// The front-proxy client certificate could not be loaded.
    #[error(transparent)]
    FrontProxy(#[from] aggregation::FrontProxyError),
    /// Writing the built-in objects failed.
    #[error("creating built-in objects: {0}")]
    Bootstrap(error::ApiError),
}

/// The shared state of a running apiserver.
pub struct Api {
    /// The store.
    pub store: Storage,
    /// Served resources.
    pub registry: registry::Registry,
    /// Request authentication.
    pub authn: auth::Authenticator,
    /// ClusterIP and NodePort allocation.
    pub alloc: registry::alloc::Allocator,
    /// RBAC authorization.
    pub rbac: auth::rbac::Rbac,
    /// Admission webhooks.
    pub webhooks: admission::webhook::Webhooks,
    /// ValidatingAdmissionPolicies with their bindings.
    pub policies: admission::policy::Policies,
    /// APIServices served by Services (the aggregation layer).
    pub aggregator: aggregation::Aggregator,
    /// The front-proxy CA (PEM) extension apiservers trust, if any.
    pub front_proxy_ca: Option<String>,
    /// The cluster CA (PEM), published to every namespace as `kube-root-ca.crt`.
    pub root_ca: Option<String>,
    /// The audit log.
    pub audit: serving::audit::Auditor,
    /// ServiceAccount token signing and verification.
    pub tokens: Option<auth::tokens::Issuer>,
    /// Seats for requests in flight.
    pub inflight: serving::inflight::InFlight,
    /// Longest time a non-watch request may take.
    pub request_timeout: std::time::Duration,
    /// Default tolerations' seconds for not-ready/unreachable nodes.
    pub default_toleration_seconds: i64,
    /// How often quotas are recounted whatever changed.
    pub quota_resync: std::time::Duration,
    /// The client for kubelets.
    pub kubelet: Option<aggregation::kubelet::KubeletClient>,
    /// `metrics.k8s.io`'s samples.
    pub metrics: apis::metrics::Metrics,
    /// `host:port` clients use.
    pub advertise: String,
    /// Cancelled when the server stops (ends watches).
    pub shutdown: CancellationToken,
    /// Long-lived request tasks (watches, connections).
    pub tasks: TaskTracker,
    /// Watch events decoded once for all watchers.
    pub watch_cache: store::watchcache::WatchCache,
    /// OpenAPI documents with the registry generation they were built at.
    pub openapi: std::sync::Mutex<Option<(u64, Arc<discovery::openapi::Docs>)>>,
}

/// The HTTP application: every request goes through the one dispatcher.
pub fn app(api: Arc<Api>) -> Router {
    Router::new().fallback(handlers::dispatch).with_state(api)
}

/// A started apiserver.
pub struct Server {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// Its state.
    pub api: Arc<Api>,
    done: tokio::task::JoinHandle<()>,
}

impl Server {
    /// A transport into this server for a component of the same process, as `user`
    /// ([`serving::local::LocalService`]).
    pub fn local(&self, user: auth::User) -> serving::local::LocalService {
        serving::local::LocalService::new(app(self.api.clone()), user)
    }

    /// Waits until the server has stopped (after its shutdown token is cancelled), then
    /// closes the store.
    pub async fn wait(self) {
        let _ = self.done.await;
        self.api.tasks.close();
        self.api.tasks.wait().await;
        if let Err(e) = self.api.store.close().await {
            tracing::warn!(error = %e, "closing the store");
        }
    }
}

/// Opens the store, writes the built-in objects, binds and starts serving; returns once ready.
pub async fn start(config: Config, shutdown: CancellationToken) -> Result<Server, Error> {
    let store = Storage::open_with(
        &config.storage,
        config.etcd_tls.as_ref(),
        config.store_cache_bytes,
        config.store_history_age,
    )
    .await?;
    let tls = serving::server::tls_config(&config.tls_cert, &config.tls_key, &config.client_ca)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: config.listen,
        source,
    })?;
    let advertise = config.advertise.clone().unwrap_or_else(|| {
        let ip = if addr.ip().is_unspecified() {
            "127.0.0.1".to_owned()
        } else {
            addr.ip().to_string()
        };
        format!("{ip}:{}", addr.port())
    });
    let api = Arc::new(Api {
        store,
        registry: registry::Registry::with_builtins(),
        authn: auth::Authenticator::new(config.token_file.as_deref())?,
        alloc: registry::alloc::Allocator::new(&config.service_cidr, config.node_ports.clone())?,
        advertise,
        rbac: auth::rbac::Rbac::default(),
        webhooks: admission::webhook::Webhooks::default(),
        policies: admission::policy::Policies::default(),
        aggregator: aggregation::Aggregator::new(config.front_proxy.as_ref())?,
        front_proxy_ca: config
            .front_proxy
            .as_ref()
            .and_then(|fp| std::fs::read_to_string(&fp.ca).ok()),
        root_ca: std::fs::read_to_string(&config.client_ca).ok(),
        inflight: serving::inflight::InFlight::new(config.max_inflight),
        request_timeout: config.request_timeout,
        default_toleration_seconds: config.default_toleration_seconds,
        quota_resync: config.quota_resync,
        kubelet: match &config.kubelet_client {
            Some((cert, key)) => Some(aggregation::kubelet::KubeletClient::load(cert, key)?),
            None => None,
        },
        metrics: apis::metrics::Metrics::new(config.metric_resolution),
        tokens: match &config.service_account_key {
            Some((path, min)) => Some(auth::tokens::Issuer::load(path, *min)?),
            None => None,
        },
        audit: match &config.audit {
            Some((path, level)) => serving::audit::Auditor::open(path, *level)?,
            None => serving::audit::Auditor::disabled(),
        },
        shutdown: shutdown.clone(),
        tasks: TaskTracker::new(),
        watch_cache: store::watchcache::WatchCache::default(),
        openapi: std::sync::Mutex::new(None),
    });
    store::watchindex::register(&api)?;
    cluster::bootstrap::run(&api)
        .await
        .map_err(Error::Bootstrap)?;
    auth::rbac::load(&api).await.map_err(Error::Bootstrap)?;
    minik8s_task::spawn_on(&api.tasks, "rbac-sync", auth::rbac::sync(api.clone()));
    minik8s_task::spawn_on(
        &api.tasks,
        "endpoint-reconciler",
        cluster::endpoints::run(api.clone()),
    );
    minik8s_task::spawn_on(
        &api.tasks,
        "webhook-sync",
        store::follow::follow(api.clone(), admission::webhook::PREFIX, |api, kvs| {
            api.webhooks.load(kvs);
            api.policies.load(kvs);
        }),
    );
    minik8s_task::spawn_on(&api.tasks, "service-allocations", {
        let api = api.clone();
        async move { api.alloc.follow(&api.store, &api.shutdown).await }
    });
    minik8s_task::spawn_on(&api.tasks, "crd-sync", registry::crd::sync(api.clone()));
    minik8s_task::spawn_on(
        &api.tasks,
        "quota-resync",
        admission::quota::resync(api.clone()),
    );
    minik8s_task::spawn_on(
        &api.tasks,
        "apiservice-sync",
        store::follow::follow(api.clone(), aggregation::PREFIX, |api, kvs| {
            api.aggregator.load(kvs)
        }),
    );
    minik8s_task::spawn_on(&api.tasks, "aggregator", aggregation::run(api.clone()));
    minik8s_task::spawn_on(
        &api.tasks,
        "compactor",
        store::compactor::run(
            api.store.clone(),
            config.compaction_interval,
            api.shutdown.clone(),
        ),
    );
    if api.kubelet.is_some() {
        minik8s_task::spawn_on(
            &api.tasks,
            "resource-metrics",
            apis::metrics::run(api.clone()),
        );
    }
    let router = app(api.clone());
    let tasks = api.tasks.clone();
    let done = minik8s_task::spawn(
        "apiserver",
        serving::server::serve(listener, tls, router, shutdown, tasks),
    );
    tracing::info!(%addr, "apiserver ready");
    if let Some(mode) = crate::store::broken::mode() {
        tracing::warn!(
            variable = crate::store::broken::VARIABLE,
            mode,
            "serving some reads wrong on purpose (the linearizability checker's broken mode)"
        );
    }
    Ok(Server { addr, api, done })
}

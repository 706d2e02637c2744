//! The minik8s service proxy: watches Services and EndpointSlices, renders the full rule set
//! from a pure model ([`model::render`]) and loads it into iptables in one transaction, after
//! a short debounce and on a resync timer. The rules stay when it stops (or the apiserver is
//! down); [`iptables::cleanup`] removes them.

pub mod dns;
pub mod error;
pub mod iptables;
pub mod metrics;
pub mod model;
pub mod router;

pub use error::{Error, Result};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use model::{Endpoint, Protocol, ServicePort};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A store of every `K`, and the task that keeps it current and wakes `changed` after each
/// event (the proxy's, the DNS server's and the router's informers).
pub(crate) fn mirror<K>(
    client: &Client,
    config: watcher::Config,
    changed: &Arc<Notify>,
) -> (
    Store<K>,
    impl std::future::Future<Output = ()> + Send + use<K>,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let changed = changed.clone();
    let feed = reflector::reflector(writer, watcher(Api::<K>::all(client.clone()), config))
        .default_backoff()
        .for_each(move |_| {
            changed.notify_one();
            futures::future::ready(())
        });
    (store, feed)
}

/// How the proxy runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// This node's name (endpoints on it are local).
    pub node_name: String,
    /// The cluster's pod range.
    pub pod_cidr: String,
    /// Prefix of the node bridges (localhost NodePorts need `route_localnet` on them).
    pub bridge_prefix: String,
    /// Full resync period.
    pub resync: Duration,
    /// How long a burst of changes is collected before one sync.
    pub debounce: Duration,
    /// The node's cluster DNS server, if it runs one.
    pub dns: Option<dns::Config>,
    /// The node's HTTP router (`DNS` objects and Ingresses), if it runs one.
    pub router: Option<router::Config>,
    /// Where `/metrics` is served over plain HTTP (upstream's 127.0.0.1:10249), if anywhere.
    pub metrics_bind: Option<std::net::SocketAddr>,
}

impl Config {
    /// The defaults for node `node_name`.
    pub fn new(node_name: &str) -> Self {
        Config {
            node_name: node_name.to_owned(),
            pod_cidr: "10.244.0.0/16".into(),
            bridge_prefix: "mk8s".into(),
            resync: Duration::from_secs(30),
            debounce: Duration::from_millis(50),
            dns: None,
            router: None,
            metrics_bind: None,
        }
    }
}

/// The model from the Services and EndpointSlices (the informers' stores, or an edge's).
pub fn service_ports(
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
    node: &str,
) -> Vec<ServicePort> {
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let cluster_ip = spec
            .cluster_ip
            .clone()
            .filter(|ip| !ip.is_empty() && ip != "None");
        if cluster_ip.is_none() || spec.type_.as_deref() == Some("ExternalName") {
            continue;
        }
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .unwrap_or(10800) as u32
        });
        let mine: Vec<&Arc<EndpointSlice>> = slices
            .iter()
            .filter(|s| {
                s.namespace().as_deref() == Some(ns.as_str())
                    && s.labels().get("kubernetes.io/service-name") == Some(&name)
            })
            .collect();
        for port in spec.ports.iter().flatten() {
            let protocol = Protocol::parse(port.protocol.as_deref());
            let port_name = port.name.clone().unwrap_or_default();
            let mut endpoints = Vec::new();
            for slice in &mine {
                let Some(target) = slice.ports.iter().flatten().find(|p| {
                    p.name.clone().unwrap_or_default() == port_name
                        && Protocol::parse(p.protocol.as_deref()) == protocol
                }) else {
                    continue;
                };
                let Some(target_port) = target.port else {
                    continue;
                };
                for ep in &slice.endpoints {
                    if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                        continue;
                    }
                    if let Some(ip) = ep.addresses.first() {
                        endpoints.push(Endpoint {
                            ip: ip.clone(),
                            port: target_port as u16,
                            local: ep.node_name.as_deref() == Some(node),
                        });
                    }
                }
            }
            endpoints.sort();
            endpoints.dedup();
            out.push(ServicePort {
                service: format!("{ns}/{name}"),
                port_name,
                cluster_ip: cluster_ip.clone(),
                port: port.port as u16,
                protocol,
                node_port: port.node_port.map(|p| p as u16),
                affinity_seconds: affinity,
                external_local: spec.external_traffic_policy.as_deref() == Some("Local"),
                internal_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
                endpoints,
            });
        }
    }
    out
}

/// Sets a sysctl under /proc/sys (best effort; logged when it fails).
fn sysctl(path: &str, value: &str) {
    let file = format!("/proc/sys/{path}");
    if std::fs::read_to_string(&file).is_ok_and(|v| v.trim() != value)
        && let Err(e) = std::fs::write(&file, value)
    {
        tracing::warn!(%file, error = %e, "setting a sysctl");
    }
}

/// Kernel settings the rules rely on: bridged traffic through iptables, forwarding, and
/// `route_localnet` on the node bridges for NodePorts on 127.0.0.1.
fn kernel_settings(bridge_prefix: &str) {
    sysctl("net/bridge/bridge-nf-call-iptables", "1");
    sysctl("net/ipv4/ip_forward", "1");
    if let Ok(ifaces) = std::fs::read_dir("/proc/sys/net/ipv4/conf") {
        for i in ifaces.flatten() {
            let name = i.file_name().to_string_lossy().into_owned();
            if name.starts_with(bridge_prefix) {
                sysctl(&format!("net/ipv4/conf/{name}/route_localnet"), "1");
            }
        }
    }
}

/// Renders and loads the rules unless they equal `last`; returns what is loaded now.
pub async fn sync(cfg: &Config, ports: &[ServicePort], last: &str) -> Result<String> {
    kernel_settings(&cfg.bridge_prefix);
    let cluster = model::Cluster {
        pod_cidr: cfg.pod_cidr.clone(),
    };
    let wanted = model::render(&cluster, ports, &[]);
    if wanted == last {
        metrics::get().synced(None, &wanted);
        return Ok(wanted);
    }
    let keep = model::service_chains(&wanted);
    let stale: Vec<(String, String)> = iptables::present_service_chains()
        .await?
        .into_iter()
        .filter(|c| !keep.contains(c))
        .collect();
    let started = Instant::now();
    if let Err(e) = iptables::restore(&model::render(&cluster, ports, &stale)).await {
        metrics::get().failed();
        return Err(e);
    }
    iptables::ensure_jumps().await?;
    metrics::get().synced(Some(started.elapsed().as_secs_f64()), &wanted);
    tracing::debug!(services = ports.len(), took = ?started.elapsed(), "iptables synced");
    Ok(wanted)
}

/// Runs the proxy (and the node's cluster DNS, when configured) until `shutdown`; the rules
/// stay in place afterwards.
pub async fn run(client: Client, cfg: Config, shutdown: CancellationToken) -> Result<()> {
    // The router tells the DNS server which hosts it serves (they resolve to this node).
    let (hosts_tx, hosts_rx) = tokio::sync::watch::channel((Vec::new(), None));
    let dns = cfg.dns.clone().map(|d| {
        minik8s_task::spawn(
            "cluster-dns",
            dns::run(
                client.clone(),
                cfg.node_name.clone(),
                d,
                hosts_rx,
                shutdown.clone(),
            ),
        )
    });
    let router = cfg.router.clone().map(|r| {
        minik8s_task::spawn(
            "router",
            router::run(client.clone(), r, hosts_tx, shutdown.clone()),
        )
    });
    let _ = metrics::get();
    if let Some(addr) = cfg.metrics_bind {
        match minik8s_metrics::serving::bind(addr).await {
            Ok((bound, listener)) => {
                tracing::info!(%bound, "serving /metrics");
                minik8s_task::spawn(
                    "metrics-server",
                    minik8s_metrics::serving::serve_plain(
                        listener,
                        minik8s_metrics::serving::metrics_router(&["proxy"]),
                        shutdown.clone(),
                    ),
                );
            }
            Err(e) => tracing::warn!(error = %e, "not serving /metrics"),
        }
    }
    let result = run_rules(client, &cfg, shutdown).await;
    if let Some(router) = router {
        match router.await {
            Ok(Err(e)) => tracing::error!(error = %e, "router stopped"),
            Err(e) => tracing::error!(error = %e, "router task failed"),
            Ok(Ok(())) => {}
        }
    }
    if let Some(dns) = dns {
        match dns.await {
            Ok(Err(e)) => tracing::error!(error = %e, "cluster DNS stopped"),
            Err(e) => tracing::error!(error = %e, "cluster DNS task failed"),
            Ok(Ok(())) => {}
        }
    }
    result
}

async fn run_rules(client: Client, cfg: &Config, shutdown: CancellationToken) -> Result<()> {
    let changed = Arc::new(Notify::new());
    let (services, svc_feed) = mirror::<Service>(&client, watcher::Config::default(), &changed);
    let (slices, slice_feed) =
        mirror::<EndpointSlice>(&client, watcher::Config::default(), &changed);
    let syncer = async {
        let _ = services.wait_until_ready().await;
        let _ = slices.wait_until_ready().await;
        let mut last = String::new();
        loop {
            let ports = service_ports(&services.state(), &slices.state(), &cfg.node_name);
            match sync(cfg, &ports, &last).await {
                Ok(loaded) => last = loaded,
                Err(e) => {
                    tracing::warn!(error = %e, "iptables sync failed; retrying");
                    last.clear();
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changed.notified() => {}
                _ = tokio::time::sleep(cfg.resync) => last.clear(),
            }
            tokio::time::sleep(cfg.debounce).await;
        }
    };
    tokio::select! {
        _ = svc_feed => {}
        _ = slice_feed => {}
        _ = syncer => {}
    }
    Ok(())
}

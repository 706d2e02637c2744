//! The cluster DNS: a per-node server beside the proxy, like NodeLocal DNSCache. It listens
//! on the node's pod gateway address (port 53, UDP and TCP), builds its [`zone::Zone`] from
//! informers over Services, EndpointSlices and Pods, and forwards other names to the host's
//! resolvers. Pods reach it through the `kube-system/kube-dns` Service (ClusterIP
//! 10.96.0.10, `internalTrafficPolicy: Local`): every node publishes its own server as an
//! endpoint of that Service, so the proxy sends each pod's queries to its own node. What it
//! last learnt keeps being served while the apiserver is away.

pub mod server;
pub mod zone;

use crate::Result;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The names the node's router serves and the address they resolve to (the router sends
/// them; the DNS server answers them, so `DNS` objects' hosts resolve in the cluster).
pub type RouterHosts = tokio::sync::watch::Receiver<(Vec<String>, Option<Ipv4Addr>)>;

/// The conventional ClusterIP of `kube-system/kube-dns`.
pub const SERVICE_IP: &str = "10.96.0.10";
/// The field manager of what this module writes.
const MANAGER: &str = "minik8s-dns";

/// How a node's DNS server runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where it listens (the node's pod gateway address, port 53).
    pub listen: SocketAddr,
    /// The cluster domain.
    pub domain: String,
    /// How long a burst of changes is collected before the zone is rebuilt.
    pub debounce: Duration,
}

impl Config {
    /// Port 53 on `ip` for `cluster.local`.
    pub fn on(ip: IpAddr) -> Self {
        Config {
            listen: SocketAddr::new(ip, 53),
            domain: "cluster.local".into(),
            debounce: Duration::from_millis(100),
        }
    }

    /// The gateway (first) address of a node's pod range (`10.244.3.0/24` → `10.244.3.1`).
    pub fn gateway_of(pod_cidr: &str) -> Option<IpAddr> {
        let base: Ipv4Addr = pod_cidr.split('/').next()?.parse().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(u32::from(base) + 1)))
    }
}

/// Creates (or updates) the `kube-dns` Service and lets node proxies publish their servers
/// as its endpoints: a Role in `kube-system` for `system:kube-proxy` and the node group.
pub async fn install(client: Client) -> Result<()> {
    let pp = PatchParams::apply(MANAGER).force();
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
        "spec": {"clusterIP": SERVICE_IP, "internalTrafficPolicy": "Local",
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                           {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]},
    });
    services.patch("kube-dns", &pp, &Patch::Apply(&svc)).await?;
    let roles: Api<k8s_openapi::api::rbac::v1::Role> =
        Api::namespaced(client.clone(), "kube-system");
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "minik8s:dns-endpoints", "namespace": "kube-system"},
        "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                  {"apiGroups": [""], "resources": ["endpoints"], "resourceNames": ["kube-dns"],
                   "verbs": ["get", "update", "patch"]},
                  {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["create"]}],
    });
    roles
        .patch("minik8s:dns-endpoints", &pp, &Patch::Apply(&role))
        .await?;
    // What every node's server reads (upstream's `system:coredns`).
    let cluster_roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let reader = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "minik8s:dns"},
        "rules": [{"apiGroups": [""], "resources": ["services", "pods", "namespaces", "nodes"],
                   "verbs": ["get", "list", "watch"]},
                  {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                   "verbs": ["get", "list", "watch"]}],
    });
    cluster_roles
        .patch("minik8s:dns", &pp, &Patch::Apply(&reader))
        .await?;
    let cluster_bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> =
        Api::all(client.clone());
    let bound = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "minik8s:dns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "minik8s:dns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-proxy"},
                     {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    });
    cluster_bindings
        .patch("minik8s:dns", &pp, &Patch::Apply(&bound))
        .await?;
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(client, "kube-system");
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "minik8s:dns-endpoints", "namespace": "kube-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "minik8s:dns-endpoints"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-proxy"},
                     {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    });
    bindings
        .patch("minik8s:dns-endpoints", &pp, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// This node's endpoint of `kube-dns`.
fn slice(node: &str, ip: IpAddr) -> serde_json::Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("kube-dns-{node}"), "namespace": "kube-system",
                     "labels": {"kubernetes.io/service-name": "kube-dns",
                                "endpointslice.kubernetes.io/managed-by": MANAGER}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip.to_string()], "nodeName": node,
                       "conditions": {"ready": true, "serving": true, "terminating": false}}],
        "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                  {"name": "dns-tcp", "port": 53, "protocol": "TCP"}],
    })
}

/// The legacy `kube-dns` Endpoints from every node's slice (upstream's kube-dns has one, and
/// `kubectl get endpoints kube-dns -n kube-system` is step one of its DNS debugging guide).
/// Every node writes the same union of the slices it sees, so they agree.
fn endpoints(slices: &Store<EndpointSlice>) -> serde_json::Value {
    let mut ready: Vec<(String, String)> = slices
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some("kube-system"))
        .filter(|s| {
            s.labels()
                .get("kubernetes.io/service-name")
                .map(String::as_str)
                == Some("kube-dns")
        })
        .flat_map(|s| s.endpoints.clone())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .filter_map(|e| {
            Some((
                e.addresses.first()?.clone(),
                e.node_name.clone().unwrap_or_default(),
            ))
        })
        .collect();
    ready.sort();
    ready.dedup();
    let addresses: Vec<serde_json::Value> = ready
        .iter()
        .map(|(ip, node)| json!({"ip": ip, "nodeName": node}))
        .collect();
    let subsets = if addresses.is_empty() {
        json!([])
    } else {
        json!([{"addresses": addresses,
                "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
                          {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}])
    };
    json!({
        "apiVersion": "v1", "kind": "Endpoints",
        // The slices are the nodes' own, so the mirroring controller must leave these alone
        // (upstream's endpoints controller marks its Endpoints the same way).
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS",
                                "endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": subsets,
    })
}

fn v4(s: &str) -> Option<Ipv4Addr> {
    s.parse().ok()
}

/// The zone from the Services, EndpointSlices and Pods (the informers' stores, or an
/// edge's).
pub fn build(
    cfg: &Config,
    services: &[Arc<Service>],
    slices: &[Arc<EndpointSlice>],
    pods: &[Arc<Pod>],
    hosts: &[String],
    node_ip: Option<Ipv4Addr>,
) -> zone::Zone {
    let mut svcs = Vec::new();
    for s in services {
        let Some(spec) = s.spec.as_ref() else {
            continue;
        };
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p.name.clone().filter(|n| !n.is_empty())?,
                    p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                    p.port as u16,
                ))
            })
            .collect();
        svcs.push(zone::Service {
            namespace: s.namespace().unwrap_or_default(),
            name: s.name_any(),
            cluster_ip: spec.cluster_ip.as_deref().and_then(v4),
            external_name: (spec.type_.as_deref() == Some("ExternalName"))
                .then(|| spec.external_name.clone())
                .flatten(),
            ports,
            publish_not_ready: spec.publish_not_ready_addresses.unwrap_or(false),
        });
    }
    let mut endpoints = Vec::new();
    for sl in slices {
        let Some(service) = sl.labels().get("kubernetes.io/service-name").cloned() else {
            continue;
        };
        let ports: Vec<(String, String, u16)> = sl
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p.name.clone().unwrap_or_default(),
                    p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                    p.port? as u16,
                ))
            })
            .collect();
        for e in &sl.endpoints {
            let Some(ip) = e.addresses.first().and_then(|a| v4(a)) else {
                continue;
            };
            endpoints.push(zone::Endpoint {
                namespace: sl.namespace().unwrap_or_default(),
                service: service.clone(),
                ip,
                hostname: e.hostname.clone(),
                ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
                ports: ports.clone(),
            });
        }
    }
    let pods: Vec<zone::Pod> = pods
        .iter()
        .filter(|p| {
            !p.spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false)
        })
        .filter_map(|p| {
            Some(zone::Pod {
                namespace: p.namespace()?,
                ip: v4(p.status.as_ref()?.pod_ip.as_deref()?)?,
            })
        })
        .collect();
    zone::Zone::build(&cfg.domain, &svcs, &endpoints, &pods, hosts, node_ip)
}

/// Runs this node's DNS server until `shutdown`: binds, publishes its endpoint, and keeps the
/// zone current.
pub async fn run(
    client: Client,
    node: String,
    cfg: Config,
    mut hosts: RouterHosts,
    shutdown: CancellationToken,
) -> Result<()> {
    let (udp, tcp) = server::bind(cfg.listen)
        .map_err(|e| crate::Error::Dns(format!("binding {}: {e}", cfg.listen)))?;
    let shared: server::Shared = Arc::default();
    let handler = Arc::new(server::Handler::new(
        shared.clone(),
        server::Handler::system_resolver(),
    ));
    let serving = minik8s_task::spawn(
        "dns-server",
        server::serve(handler, udp, tcp, 2, shutdown.clone()),
    );
    tracing::info!(listen = %cfg.listen, domain = %cfg.domain, "cluster DNS serving");

    let changed = Arc::new(Notify::new());
    let default = watcher::Config::default;
    let (services, f1) = crate::mirror::<Service>(&client, default(), &changed);
    let (slices, f2) = crate::mirror::<EndpointSlice>(&client, default(), &changed);
    let (pods, f3) = crate::mirror::<Pod>(&client, default().any_semantic(), &changed);
    let publish = async {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), "kube-system");
        let pp = PatchParams::apply(MANAGER).force();
        let name = format!("kube-dns-{node}");
        loop {
            if let Err(e) = api
                .patch(&name, &pp, &Patch::Apply(slice(&node, cfg.listen.ip())))
                .await
            {
                tracing::warn!(error = %e, "publishing this node's DNS endpoint");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(60)) => {}
            }
        }
    };
    let rebuild = async {
        let listed = async {
            let _ = services.wait_until_ready().await;
            let _ = slices.wait_until_ready().await;
            let _ = pods.wait_until_ready().await;
        };
        tokio::select! {
            _ = listed => {}
            _ = shutdown.cancelled() => return,
        }
        // Without a router (its sender gone), only the cluster's objects change the zone.
        let mut routed = true;
        let legacy: Api<k8s_openapi::api::core::v1::Endpoints> =
            Api::namespaced(client.clone(), "kube-system");
        let mut written = serde_json::Value::Null;
        loop {
            let (names, node_ip) = hosts.borrow_and_update().clone();
            let z = build(
                &cfg,
                &services.state(),
                &slices.state(),
                &pods.state(),
                &names,
                node_ip,
            );
            *shared.write().expect("zone lock") = Arc::new(z);
            let wanted = endpoints(&slices);
            if wanted != written {
                let pp = PatchParams::apply(MANAGER).force();
                match legacy.patch("kube-dns", &pp, &Patch::Apply(&wanted)).await {
                    Ok(_) => written = wanted,
                    Err(e) => tracing::warn!(error = %e, "writing the kube-dns Endpoints"),
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = changed.notified() => {}
                r = hosts.changed(), if routed => routed = r.is_ok(),
            }
            tokio::time::sleep(cfg.debounce).await;
        }
    };
    tokio::select! {
        _ = f1 => {}
        _ = f2 => {}
        _ = f3 => {}
        _ = async { tokio::join!(publish, rebuild) } => {}
    }
    let _ = serving.await;
    // A node that stops cleanly withdraws its endpoint (best effort: the apiserver may be gone).
    let api: Api<EndpointSlice> = Api::namespaced(client, "kube-system");
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        api.delete(&format!("kube-dns-{node}"), &DeleteParams::default()),
    )
    .await;
    Ok(())
}

//! Names and Services at the edge (KubeEdge's EdgeMesh, OpenYurt's service topology, kept
//! small): from the Services and EndpointSlices the cloud shipped for the edge's namespaces,
//! kept in the [store](crate::store) so all of this goes on while the link is down,
//!
//! - the proxy's own rule code programs this machine's Service rules (ClusterIP, NodePort)
//!   with the endpoints **on this edge**: other machines' pods are not reachable from here;
//! - the cluster DNS's own zone and server answer the pods at their gateway address: the
//!   shipped Services' names (`<svc>.<ns>.svc.<domain>`, SRV, headless records of the
//!   endpoints here), the edge's pods' own records, and every other name through the
//!   machine's resolvers.
//!
//! What does not cross edges: a Service's endpoints on other edges or cloud nodes, Services
//! of namespaces where this edge has no pod, and the cluster's own DNS Service.

use super::Agent;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use minik8s_proxy::dns;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Where the edge's DNS server listens: the pods' gateway (the first address of the pod
/// range), port 53.
pub fn dns_address(pod_cidr: &str) -> Option<SocketAddr> {
    dns::Config::gateway_of(pod_cidr).map(|ip| SocketAddr::new(ip, 53))
}

/// The shipped objects of `kind`, decoded (an undecodable one is skipped and logged).
fn shipped<K: serde::de::DeserializeOwned>(agent: &Agent, kind: &str) -> Vec<Arc<K>> {
    agent
        .store
        .objects(kind, None)
        .into_iter()
        .filter_map(|v| match serde_json::from_value(v) {
            Ok(k) => Some(Arc::new(k)),
            Err(e) => {
                tracing::warn!(kind, error = %e, "a shipped object does not decode; skipped");
                None
            }
        })
        .collect()
}

/// Whether the pod is Ready, as this edge last saw it.
fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The shipped slices with only their endpoints on this edge, each ready as its pod is here
/// now: the cloud's view may be older (a slice shipped while the cloud thought the edge
/// gone says not ready), the edge's own is current, link or no link.
fn local_slices(
    slices: Vec<Arc<EndpointSlice>>,
    pods: &[Arc<Pod>],
    node: &str,
) -> Vec<Arc<EndpointSlice>> {
    slices
        .into_iter()
        .map(|s| {
            let mut s = (*s).clone();
            let ns = s.metadata.namespace.clone();
            s.endpoints.retain(|e| e.node_name.as_deref() == Some(node));
            for e in &mut s.endpoints {
                let here = e.target_ref.as_ref().and_then(|r| {
                    pods.iter().find(|p| {
                        p.metadata.name == r.name
                            && p.metadata.namespace == ns
                            && (r.uid.is_none() || p.metadata.uid == r.uid)
                    })
                });
                let Some(pod) = here else {
                    continue;
                };
                let conditions = e.conditions.get_or_insert_with(Default::default);
                conditions.ready = Some(ready(pod));
            }
            Arc::new(s)
        })
        .collect()
}

/// Keeps the edge's Service rules and DNS zone current until the edgelet stops.
pub async fn run(agent: Arc<Agent>) {
    let Some(listen) = dns_address(&agent.cfg.pod_cidr) else {
        tracing::error!(pod_cidr = %agent.cfg.pod_cidr, "no DNS address in the pod range; no names at the edge");
        return;
    };
    let mut proxy = minik8s_proxy::Config::new(&agent.node);
    proxy.pod_cidr = agent.cfg.pod_cidr.clone();
    let dns_cfg = dns::Config::on(listen.ip());
    let zone: dns::server::Shared = Arc::default();
    minik8s_task::spawn_on(
        &agent.tasks.clone(),
        "edgelet-dns",
        serve_dns(agent.clone(), listen, zone.clone()),
    );
    let mut services_changed = agent.store.services_changed.subscribe();
    let mut pods_changed = agent.store.subscribe();
    let mut last = String::new();
    // The shipped objects are read from the store's files only when the cloud changed them;
    // a pod's change (its address, its readiness) needs only the pods.
    let (mut services, mut shipped_slices) = (Vec::new(), Vec::new());
    let mut reread = true;
    loop {
        if std::mem::take(&mut reread) {
            services = shipped::<Service>(&agent, "services");
            shipped_slices = shipped(&agent, "endpointslices");
        }
        let pods: Vec<Arc<Pod>> = agent.store.pods().into_iter().map(Arc::new).collect();
        let slices = local_slices(shipped_slices.clone(), &pods, &agent.node);
        let ports = minik8s_proxy::service_ports(&services, &slices, &agent.node);
        match minik8s_proxy::sync(&proxy, &ports, &last).await {
            Ok(loaded) => {
                if loaded != last {
                    let endpoints: usize = ports.iter().map(|p| p.endpoints.len()).sum();
                    tracing::info!(
                        service_ports = ports.len(),
                        endpoints,
                        "the edge's Service rules are programmed"
                    );
                }
                last = loaded;
            }
            Err(e) => tracing::warn!(error = %e, "programming the edge's Service rules; retrying"),
        }
        let z = dns::build(&dns_cfg, &services, &slices, &pods, &[], None);
        *zone.write().expect("zone lock") = Arc::new(z);
        tokio::select! {
            _ = agent.shutdown.cancelled() => return,
            _ = services_changed.changed() => reread = true,
            _ = pods_changed.changed() => {}
            // A failed sync is retried, and rules someone removed come back.
            _ = tokio::time::sleep(Duration::from_secs(30)) => reread = true,
        }
        tokio::time::sleep(dns_cfg.debounce).await;
    }
}

/// Serves the zone at `listen` once the address exists (the pods' bridge comes with the
/// first pod), until the edgelet stops.
async fn serve_dns(agent: Arc<Agent>, listen: SocketAddr, zone: dns::server::Shared) {
    let mut logged = false;
    let (udp, tcp) = loop {
        match dns::server::bind(listen) {
            Ok(s) => break s,
            Err(e) => {
                if !logged {
                    tracing::info!(%listen, error = %e, "the edge's DNS address is not there yet; waiting for the pods' bridge");
                    logged = true;
                }
                tokio::select! {
                    _ = agent.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    tracing::info!(%listen, "edge DNS serving");
    let handler = Arc::new(dns::server::Handler::new(
        zone,
        dns::server::Handler::system_resolver(),
    ));
    dns::server::serve(handler, udp, tcp, 2, agent.shutdown.clone()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Only this edge's endpoints stay, each ready as its pod is here (the cloud's slice
    /// said not ready: it thought the edge gone).
    #[test]
    fn an_edges_endpoints_are_ready_as_its_own_pods_are() {
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-x", "namespace": "ns", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.88.1.2"], "nodeName": "edge-a", "conditions": {"ready": false},
                 "targetRef": {"kind": "Pod", "name": "a", "namespace": "ns", "uid": "u-a"}},
                {"addresses": ["10.88.1.3"], "nodeName": "edge-a", "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "b", "namespace": "ns", "uid": "u-b"}},
                {"addresses": ["10.88.2.2"], "nodeName": "edge-b", "conditions": {"ready": true}},
            ],
        }))
        .unwrap();
        let pod = |name: &str, ready: &str| -> Arc<Pod> {
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}")},
                    "status": {"conditions": [{"type": "Ready", "status": ready}]},
                }))
                .unwrap(),
            )
        };
        let pods = [pod("a", "True"), pod("b", "False")];
        let out = local_slices(vec![Arc::new(slice)], &pods, "edge-a");
        let eps: Vec<(String, Option<bool>)> = out[0]
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.addresses[0].clone(),
                    e.conditions.as_ref().and_then(|c| c.ready),
                )
            })
            .collect();
        assert_eq!(
            eps,
            [
                ("10.88.1.2".to_owned(), Some(true)),
                ("10.88.1.3".to_owned(), Some(false)),
            ]
        );
    }
}

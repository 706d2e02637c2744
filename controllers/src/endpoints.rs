//! The endpoints controller: for every Service with a selector, an EndpointSlice per
//! distinct set of resolved ports (named targetPorts are resolved per pod) listing the
//! matching pods' addresses with their ready/serving/terminating conditions, and the
//! legacy Endpoints object (ready addresses and notReadyAddresses). Headless services too.
//! Both are written by server-side apply, so repeated reconciles are cheap and idempotent.

use crate::Result;
use crate::driver::Driver;
use crate::informer::Namespaced;
use crate::util::{self, owner_ref};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Field manager and `managed-by` label value.
const MANAGER: &str = "endpointslice-controller.k8s.io";
/// Label naming a slice's Service.
pub const SERVICE_LABEL: &str = "kubernetes.io/service-name";
/// Label on Endpoints that are not to be mirrored into EndpointSlices.
pub const SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";

/// A service port resolved against one pod: (name, port, protocol).
type Resolved = Vec<(String, i32, String)>;

/// Resolves a service's ports against a pod, as upstream's `FindPort`: a named targetPort
/// is the pod's container port of that name and protocol; a port the pod lacks is left out
/// (the pod still serves the others).
pub fn resolve(ports: &[ServicePort], pod: &Pod) -> Resolved {
    ports
        .iter()
        .filter_map(|p| {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            let number = match &p.target_port {
                None => p.port,
                Some(IntOrString::Int(n)) => *n,
                Some(IntOrString::String(name)) => pod
                    .spec
                    .iter()
                    .flat_map(|s| s.containers.iter())
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|cp| {
                        cp.name.as_deref() == Some(name.as_str())
                            && cp.protocol.as_deref().unwrap_or("TCP") == protocol
                    })
                    .map(|cp| cp.container_port)?,
            };
            Some((p.name.clone().unwrap_or_default(), number, protocol))
        })
        .collect()
}

/// The address-bearing endpoints of a service, grouped by resolved ports.
pub fn group(svc: &Service, pods: &[Arc<Pod>]) -> BTreeMap<Resolved, Vec<Value>> {
    let spec = svc.spec.as_ref();
    let ports = spec.and_then(|s| s.ports.clone()).unwrap_or_default();
    let mut out: BTreeMap<Resolved, Vec<Value>> = BTreeMap::new();
    for p in pods {
        let Some(ip) = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty())
        else {
            continue;
        };
        if util::is_terminal(p) {
            continue;
        }
        let resolved = resolve(&ports, p);
        let terminating = p.metadata.deletion_timestamp.is_some();
        let serving = util::is_ready(p);
        let ready = serving && !terminating;
        let mut ep = json!({
            "addresses": [ip],
            "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": p.namespace(), "name": p.name_any(), "uid": p.uid()},
        });
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            ep["nodeName"] = json!(node);
        }
        // As upstream: the pod's hostname names its endpoint only when its subdomain is the
        // Service (that is the DNS record `<hostname>.<service>.<ns>.svc` the cluster DNS serves).
        if let Some(spec) = p.spec.as_ref()
            && let Some(h) = spec.hostname.clone()
            && spec.subdomain.as_deref() == Some(svc.name_any().as_str())
        {
            ep["hostname"] = json!(h);
        }
        out.entry(resolved).or_default().push(ep);
    }
    for eps in out.values_mut() {
        eps.sort_by(|a, b| a["addresses"][0].as_str().cmp(&b["addresses"][0].as_str()));
    }
    out
}

struct Ctx {
    client: Client,
    pods: Namespaced<Pod>,
    /// The cluster's EndpointSlices and Endpoints (the shared informers'): a service's stale
    /// slices are found, and an unchanged object is left unwritten, without a request, as
    /// upstream's controllers read their listers and write only a difference.
    slices: Namespaced<EndpointSlice>,
    endpoints: Store<Endpoints>,
}

async fn reconcile(svc: Arc<Service>, ctx: Arc<Ctx>) -> Result<Action> {
    let Some(selector) = svc
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .filter(|s| !s.is_empty())
    else {
        return Ok(Action::await_change());
    };
    if svc.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let pods: Vec<Arc<Pod>> = ctx.pods.list_selected(&ns, &selector);
    let groups = group(&svc, &pods);
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let pp = PatchParams::apply(MANAGER).force();
    let headless = svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None");
    let mut labels =
        json!({SERVICE_LABEL: name, "endpointslice.kubernetes.io/managed-by": MANAGER});
    if headless {
        labels["service.kubernetes.io/headless"] = json!("");
    }
    let mut wanted: Vec<String> = Vec::new();
    let ours = ctx
        .slices
        .list_selected(&ns, &[(SERVICE_LABEL.to_owned(), name.clone())].into());
    // A service without endpoints still gets one (empty) slice, as upstream.
    let groups: Vec<(Resolved, Vec<Value>)> = if groups.is_empty() {
        vec![(Vec::new(), Vec::new())]
    } else {
        groups.into_iter().collect()
    };
    for (ports, endpoints) in &groups {
        let slice_name = format!("{name}-{}", &util::hash_of(ports)[..5]);
        wanted.push(slice_name.clone());
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": slice_name, "namespace": ns, "labels": labels,
                         "ownerReferences": [owner_ref(svc.as_ref())]},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": ports.iter().map(|(n, p, proto)| json!({"name": n, "port": p, "protocol": proto})).collect::<Vec<_>>(),
        });
        let slice = util::normalized::<EndpointSlice>(slice)?;
        if ours.iter().any(|s| {
            s.name_any() == slice_name
                && util::unchanged(s.as_ref(), &slice, &["addressType", "endpoints", "ports"])
        }) {
            continue;
        }
        slices
            .patch(&slice_name, &pp, &Patch::Apply(&slice))
            .await?;
    }
    let stale: Vec<String> = ours
        .iter()
        .map(|s| s.name_any())
        .filter(|n| !wanted.contains(n))
        .collect();
    for n in stale {
        match slices.delete(&n, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The Endpoints object.
    let subsets: Vec<Value> = groups
        .iter()
        .filter(|(_, eps)| !eps.is_empty())
        .map(|(ports, eps)| {
            let addr = |e: &Value| {
                json!({"ip": e["addresses"][0], "nodeName": e.get("nodeName"), "targetRef": e["targetRef"]})
            };
            let ready: Vec<Value> = eps.iter().filter(|e| e["conditions"]["ready"] == json!(true)).map(addr).collect();
            let not_ready: Vec<Value> = eps.iter().filter(|e| e["conditions"]["ready"] != json!(true)).map(addr).collect();
            let mut s = json!({"ports": ports.iter().map(|(n, p, proto)| json!({"name": n, "port": p, "protocol": proto})).collect::<Vec<_>>()});
            if !ready.is_empty() {
                s["addresses"] = json!(ready);
            }
            if !not_ready.is_empty() {
                s["notReadyAddresses"] = json!(not_ready);
            }
            s
        })
        .collect();
    let mut ep_labels = svc.labels().clone();
    if headless {
        ep_labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    // The mirroring controller leaves this controller's Endpoints alone, as upstream's.
    ep_labels.insert(SKIP_MIRROR.into(), "true".into());
    let endpoints = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "namespace": ns, "labels": ep_labels},
        "subsets": subsets,
    });
    let endpoints = util::normalized::<Endpoints>(endpoints)?;
    if ctx
        .endpoints
        .get(&ObjectRef::new(&name).within(&ns))
        .is_some_and(|have| util::unchanged(have.as_ref(), &endpoints, &["subsets"]))
    {
        return Ok(Action::await_change());
    }
    let api: Api<Endpoints> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch(
        &name,
        &PatchParams::apply("endpoint-controller").force(),
        &Patch::Apply(&endpoints),
    )
    .await?;
    Ok(Action::await_change())
}

/// Deletes the Endpoints of each Service that `changes` shows gone from `services`, as
/// upstream's endpoints controller does on a Service's deletion.
async fn remove_orphaned(
    client: Client,
    changes: impl futures::Stream<Item = Arc<Service>> + Send,
    services: Store<Service>,
    shutdown: CancellationToken,
) {
    use futures::StreamExt;
    let mut changes = std::pin::pin!(changes);
    loop {
        let svc = tokio::select! {
            _ = shutdown.cancelled() => return,
            next = changes.next() => match next {
                Some(s) => s,
                None => return,
            },
        };
        if services.get(&ObjectRef::from_obj(svc.as_ref())).is_some() {
            continue;
        }
        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
        let api: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(namespace = %ns, service = %name, "deleted the Endpoints of a deleted Service")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(namespace = %ns, service = %name, error = %e, "could not delete the Endpoints of a deleted Service")
            }
        }
    }
}

/// Runs the endpoints controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let pods = informers.namespaced::<Pod>().await;
    let slices = informers.namespaced::<EndpointSlice>().await;
    let endpoints = informers.all::<Endpoints>().await;
    let by_namespace = informers.namespaced::<Service>().await;
    let driver = Driver::<Service>::new("endpoints", &informers).await;
    let services = driver.store();
    // A deleted Service's Endpoints go with it (its slices are owned by it and collected).
    minik8s_task::spawn_on(
        informers.tasks(),
        "endpoints-cleanup",
        remove_orphaned(
            client.clone(),
            informers.subscribe::<Service>(),
            services.clone(),
            shutdown.clone(),
        ),
    );
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        pods,
        slices,
        endpoints,
    });
    driver
        // Upstream's --concurrent-endpoint-syncs and --concurrent-service-endpoint-syncs.
        .workers(5)
        .watches::<Pod, _>(move |pod: Arc<Pod>| {
            // A pod change concerns the services of its namespace that select it.
            let labels = pod.labels();
            by_namespace
                .list(&pod.namespace().unwrap_or_default())
                .into_iter()
                .filter(|s| {
                    s.spec
                        .as_ref()
                        .and_then(|sp| sp.selector.as_ref())
                        .is_some_and(|sel| {
                            !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
                        })
                })
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect::<Vec<_>>()
        })
        .run(reconcile, ctx, shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_applies_a_slice_of_the_ready_pods_on_a_mock_api() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "s1"},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}))
        .unwrap();
        let pod = |name: &str, ip: &str, ready: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "containers": []},
                "status": {"phase": "Running", "podIP": ip,
                    "conditions": [{"type": "Ready", "status": ready}]}}))
            .unwrap()
        };
        // The service has one slice of an earlier set of ports, which goes.
        let m = crate::testing::mock(crate::testing::echo);
        let calls = m.calls.clone();
        let ctx = Arc::new(Ctx {
            client: m.client.clone(),
            pods: crate::testing::namespaced(vec![
                pod("a", "10.0.0.1", "True"),
                pod("b", "10.0.0.2", "False"),
            ]),
            endpoints: crate::testing::store(vec![]),
            slices: crate::testing::namespaced(vec![
                serde_json::from_value(json!({
                    "metadata": {"name": "web-old", "namespace": "default",
                        "labels": {SERVICE_LABEL: "web"}},
                    "addressType": "IPv4", "endpoints": []}))
                .unwrap(),
            ]),
        });
        m.run(reconcile(Arc::new(svc), ctx)).unwrap();
        let applied = crate::testing::matching(&calls, "PATCH", "");
        let slice = applied
            .iter()
            .find(|c| c.path.contains("/endpointslices/"))
            .expect("a slice is applied");
        let ready: Vec<(String, bool)> = slice.body["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["addresses"][0].as_str().unwrap().to_owned(),
                    e["conditions"]["ready"].as_bool().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            ready,
            [
                ("10.0.0.1".to_owned(), true),
                ("10.0.0.2".to_owned(), false)
            ]
        );
        assert_eq!(slice.body["ports"][0]["port"], 8080);
        let deleted = crate::testing::matching(&calls, "DELETE", "");
        assert_eq!(deleted.len(), 1);
        assert!(deleted[0].path.ends_with("/endpointslices/web-old"));
        assert!(
            crate::testing::matching(&calls, "GET", "").is_empty(),
            "no LIST: the slices come from the informer"
        );
    }

    #[test]
    fn a_second_reconcile_of_what_the_informers_already_hold_writes_nothing() {
        let svc: Arc<Service> = Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default", "uid": "s1", "labels": {"app": "web"}},
                "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10",
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}))
            .unwrap(),
        );
        let pods = || {
            crate::testing::namespaced(vec![
                serde_json::from_value::<Pod>(json!({
                    "metadata": {"name": "a", "namespace": "default", "uid": "p1", "labels": {"app": "web"}},
                    "spec": {"nodeName": "n1", "containers": []},
                    "status": {"phase": "Running", "podIP": "10.0.0.1",
                        "conditions": [{"type": "Ready", "status": "True"}]}}))
                .unwrap(),
            ])
        };
        let first = crate::testing::mock(crate::testing::echo);
        let calls = first.calls.clone();
        first
            .run(reconcile(
                svc.clone(),
                Arc::new(Ctx {
                    client: first.client.clone(),
                    pods: pods(),
                    slices: crate::testing::namespaced(vec![]),
                    endpoints: crate::testing::store(vec![]),
                }),
            ))
            .unwrap();
        let applied = crate::testing::matching(&calls, "PATCH", "");
        assert_eq!(applied.len(), 2, "a slice and the Endpoints are written");
        // The informers now hold what was applied, as the apiserver stores it.
        let stored = |path: &str| {
            let mut o = applied
                .iter()
                .find(|c| c.path.contains(path))
                .unwrap()
                .body
                .clone();
            o["metadata"]["uid"] = json!("x");
            o["metadata"]["resourceVersion"] = json!("7");
            o
        };
        let again = |svc: Arc<Service>| {
            let m = crate::testing::mock(crate::testing::echo);
            let calls = m.calls.clone();
            m.run(reconcile(
                svc,
                Arc::new(Ctx {
                    client: m.client.clone(),
                    pods: pods(),
                    slices: crate::testing::namespaced(vec![
                        serde_json::from_value(stored("/endpointslices/")).unwrap(),
                    ]),
                    endpoints: crate::testing::store(vec![
                        serde_json::from_value(stored("/endpoints/")).unwrap(),
                    ]),
                }),
            ))
            .unwrap();
            calls.lock().unwrap().clone()
        };
        let calls = again(svc.clone());
        assert!(
            calls.is_empty(),
            "nothing changed, nothing written: {calls:?}"
        );
        // The Service loses its label: the Endpoints, which carry the Service's labels, are
        // written again (the slice, whose labels are the controller's own, is not).
        let mut unlabelled = svc.as_ref().clone();
        unlabelled.metadata.labels = None;
        let calls = again(Arc::new(unlabelled));
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(calls[0].path.contains("/endpoints/web"), "{calls:?}");
    }

    #[test]
    fn a_pod_serves_the_service_ports_it_has_and_skips_the_rest() {
        let ports: Vec<ServicePort> = serde_json::from_value(json!([
            {"name": "portname1", "port": 80, "targetPort": "svc1"},
            {"name": "portname2", "port": 81, "targetPort": "svc2"},
        ]))
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "pod1"},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "svc1", "containerPort": 100}]}]}}))
        .unwrap();
        assert_eq!(
            resolve(&ports, &pod),
            vec![("portname1".to_owned(), 100, "TCP".to_owned())]
        );
    }
}

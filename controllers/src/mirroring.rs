//! The EndpointSlice mirroring controller (upstream's `endpointslicemirroring`): the
//! Endpoints of a Service without a selector — written by a user or another controller —
//! are mirrored into EndpointSlices, one per subset, so clients that read only
//! EndpointSlices (kube-proxy, DNS) see them. Endpoints labelled
//! `endpointslice.kubernetes.io/skip-mirror` (the endpoints controller's own) are left
//! alone; the slices are owned by their Endpoints and go with them.

use crate::Result;
use crate::driver::Driver;
use crate::endpoints::{SERVICE_LABEL, SKIP_MIRROR};
use crate::informer::Namespaced;
use crate::util::{self, owner_ref};
use k8s_openapi::api::core::v1::{EndpointSubset, Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Field manager and `managed-by` label value.
pub const MANAGER: &str = "endpointslicemirroring-controller.k8s.io";
/// Label every mirrored slice carries, naming the managing controller.
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";

struct Ctx {
    client: Client,
    /// The informers' Services and EndpointSlices: the endpoints controller's own Endpoints
    /// (most of them, each written at every change of its pods) cost no request here.
    services: Store<Service>,
    slices: Namespaced<EndpointSlice>,
}

/// The slice of one subset: its ports and its ready and not-ready addresses.
fn slice_of(ep: &Endpoints, subset: &EndpointSubset) -> Value {
    let name = ep.name_any();
    let address = |a: &k8s_openapi::api::core::v1::EndpointAddress, ready: bool| {
        let mut e = json!({"addresses": [a.ip], "conditions": {"ready": ready}});
        if let Some(h) = &a.hostname {
            e["hostname"] = json!(h);
        }
        if let Some(n) = &a.node_name {
            e["nodeName"] = json!(n);
        }
        if let Some(t) = &a.target_ref {
            e["targetRef"] = serde_json::to_value(t).unwrap_or_default();
        }
        e
    };
    let endpoints: Vec<Value> = subset
        .addresses
        .iter()
        .flatten()
        .map(|a| address(a, true))
        .chain(
            subset
                .not_ready_addresses
                .iter()
                .flatten()
                .map(|a| address(a, false)),
        )
        .collect();
    let ipv6 = subset
        .addresses
        .iter()
        .flatten()
        .chain(subset.not_ready_addresses.iter().flatten())
        .any(|a| a.ip.contains(':'));
    let ports: Vec<Value> = subset
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let mut port = json!({"name": p.name.clone().unwrap_or_default(), "port": p.port,
                "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into())});
            if let Some(a) = &p.app_protocol {
                port["appProtocol"] = json!(a);
            }
            port
        })
        .collect();
    let mut labels = ep.labels().clone();
    labels.remove(SKIP_MIRROR);
    labels.insert(SERVICE_LABEL.into(), name.clone());
    labels.insert(MANAGED_BY.into(), MANAGER.into());
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-{}", &util::hash_of(&ports)[..5]),
            "namespace": ep.namespace(), "labels": labels,
            "ownerReferences": [owner_ref(ep)]},
        "addressType": if ipv6 { "IPv6" } else { "IPv4" },
        "endpoints": endpoints,
        "ports": ports,
    })
}

async fn reconcile(ep: Arc<Endpoints>, ctx: Arc<Ctx>) -> Result<Action> {
    let ns = ep.namespace().unwrap_or_default();
    let name = ep.name_any();
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let skip = ep.labels().get(SKIP_MIRROR).is_some_and(|v| v == "true");
    // Only the Endpoints of an existing Service without a selector are mirrored.
    let mirrored = !skip
        && ep.metadata.deletion_timestamp.is_none()
        && ctx
            .services
            .get(&ObjectRef::new(&name).within(&ns))
            .is_some_and(|svc| {
                svc.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .is_none_or(|s| s.is_empty())
            });
    let existing: Vec<Arc<EndpointSlice>> = ctx.slices.list_selected(
        &ns,
        &[
            (SERVICE_LABEL.to_owned(), name.clone()),
            (MANAGED_BY.to_owned(), MANAGER.to_owned()),
        ]
        .into(),
    );
    let mut wanted = Vec::new();
    if mirrored {
        let pp = PatchParams::apply(MANAGER).force();
        for subset in ep.subsets.iter().flatten() {
            let slice = util::normalized::<EndpointSlice>(slice_of(&ep, subset))?;
            let slice_name = slice["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            wanted.push(slice_name.clone());
            if existing.iter().any(|s| {
                s.name_any() == slice_name
                    && util::unchanged(s.as_ref(), &slice, &["addressType", "endpoints", "ports"])
            }) {
                continue;
            }
            slices
                .patch(&slice_name, &pp, &Patch::Apply(&slice))
                .await?;
        }
    }
    for s in existing {
        let n = s.name_any();
        if !wanted.contains(&n) {
            match slices.delete(&n, &DeleteParams::background()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(Action::await_change())
}

/// Runs the mirroring controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        services: informers.all::<Service>().await,
        slices: informers.namespaced::<EndpointSlice>().await,
    });
    Driver::<Endpoints>::new("endpointslice-mirroring", &informers)
        .await
        // Upstream's --mirroring-concurrent-service-endpoint-syncs.
        .workers(5)
        .owns::<EndpointSlice>()
        // A Service gaining or losing its selector changes whether its Endpoints mirror.
        .watches::<Service, _>(|svc: Arc<Service>| {
            Some(
                ObjectRef::<Endpoints>::new(&svc.name_any())
                    .within(&svc.namespace().unwrap_or_default()),
            )
        })
        .run(reconcile, ctx, shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subset_becomes_one_slice_with_ready_and_not_ready_endpoints() {
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "ext", "namespace": "default", "uid": "u", "labels": {"team": "a"}},
            "subsets": [{"addresses": [{"ip": "10.1.2.3"}], "notReadyAddresses": [{"ip": "10.1.2.4"}],
                "ports": [{"name": "web", "port": 80}]}]}))
        .unwrap();
        let s = slice_of(&ep, &ep.subsets.as_ref().unwrap()[0]);
        assert_eq!(s["addressType"], "IPv4");
        assert_eq!(s["metadata"]["labels"][SERVICE_LABEL], "ext");
        assert_eq!(s["metadata"]["labels"][MANAGED_BY], MANAGER);
        assert_eq!(s["metadata"]["labels"]["team"], "a");
        assert_eq!(s["metadata"]["ownerReferences"][0]["kind"], "Endpoints");
        assert_eq!(s["endpoints"][0]["conditions"]["ready"], true);
        assert_eq!(s["endpoints"][1]["addresses"][0], "10.1.2.4");
        assert_eq!(s["endpoints"][1]["conditions"]["ready"], false);
        assert_eq!(
            s["ports"],
            json!([{"name": "web", "port": 80, "protocol": "TCP"}])
        );
    }

    #[test]
    fn mirrors_from_the_informers_and_writes_only_a_difference() {
        let services = || {
            crate::testing::store(vec![
                serde_json::from_value::<Service>(json!({
                    "metadata": {"name": "ext", "namespace": "default"}, "spec": {"ports": [{"port": 80}]}}))
                .unwrap(),
                serde_json::from_value::<Service>(json!({
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}))
                .unwrap(),
            ])
        };
        let endpoints = |name: &str, labels: Value| -> Arc<Endpoints> {
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"), "labels": labels},
                    "subsets": [{"addresses": [{"ip": "10.1.2.3"}], "ports": [{"name": "web", "port": 80}]}]}))
                .unwrap(),
            )
        };
        let run = |ep: Arc<Endpoints>, slices: Vec<EndpointSlice>| {
            let m = crate::testing::mock(crate::testing::echo);
            let calls = m.calls.clone();
            let ctx = Arc::new(Ctx {
                client: m.client.clone(),
                services: services(),
                slices: crate::testing::namespaced(slices),
            });
            m.run(reconcile(ep, ctx)).unwrap();
            calls.lock().unwrap().clone()
        };
        // The endpoints controller's own Endpoints cost no request at all.
        let own = endpoints("web", json!({SKIP_MIRROR: "true"}));
        assert!(run(own, vec![]).is_empty());
        // A selectorless Service's Endpoints are mirrored once; the same again writes nothing.
        let ext = endpoints("ext", json!({}));
        let first = run(ext.clone(), vec![]);
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].method, "PATCH");
        let mut stored = first[0].body.clone();
        stored["metadata"]["uid"] = json!("s");
        let again = run(ext, vec![serde_json::from_value(stored).unwrap()]);
        assert!(again.is_empty(), "{again:?}");
    }
}

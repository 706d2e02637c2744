//! The Service reconciler: a Configuration and a Route of the Service's name (owned by it),
//! and the Service's status made of theirs (`ConfigurationsReady`, `RoutesReady`, `Ready`,
//! the revisions, the URLs and the split), as Knative's service controller does.

use super::types::{RouteSpec, TrafficTarget};
use super::{Ctx, KService, SERVICE_LABEL, condition, ready};
use crate::reconcile::{Error, api};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

const MANAGER: &str = "knative-service-controller";

/// The Route's split for a Service: its own `traffic` (targets without a revision name go
/// to the Service's Configuration), or everything to the latest ready revision.
pub fn route_traffic(name: &str, traffic: &[TrafficTarget]) -> Vec<TrafficTarget> {
    if traffic.is_empty() {
        return vec![TrafficTarget {
            configuration_name: Some(name.to_owned()),
            latest_revision: Some(true),
            percent: Some(100),
            ..TrafficTarget::default()
        }];
    }
    traffic
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if t.revision_name.is_none() {
                t.configuration_name = Some(name.to_owned());
                t.latest_revision = Some(true);
            }
            t.url = None;
            t
        })
        .collect()
}

pub(crate) async fn reconcile(s: Arc<KService>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = s.name_any();
    let ns = s.namespace().unwrap_or_default();
    let owner = s
        .controller_owner_ref(&())
        .expect("a stored Service has a uid");
    let pp = PatchParams::apply(MANAGER).force();
    let mut labels = s.labels().clone();
    labels.insert(SERVICE_LABEL.to_owned(), name.clone());
    let configuration = json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Configuration",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": [owner]},
        "spec": {"template": s.spec.template},
    });
    // The objects as the applies left them (the stores may not have them yet): a part is
    // current once its controller has seen this spec.
    let c = Api::<super::KConfiguration>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&configuration))
        .await
        .map_err(api("applying the Service's Configuration"))?;
    let route = json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Route",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": [owner]},
        "spec": RouteSpec { traffic: route_traffic(&name, &s.spec.traffic) },
    });
    let r = Api::<super::KRoute>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&route))
        .await
        .map_err(api("applying the Service's Route"))?;

    // The status, from the Configuration's and the Route's (each once it saw its spec).
    let old = s.status.clone().unwrap_or_default();
    let (c, r) = (Some(c), Some(r));
    let part = |kind: &str, conditions: Option<&[super::Condition]>, current: bool| {
        let ready = conditions.and_then(ready).filter(|_| current);
        match ready {
            Some(c) => condition(
                &old.conditions,
                kind,
                &c.status,
                c.reason.as_deref(),
                c.message.clone(),
            ),
            None => condition(&old.conditions, kind, "Unknown", Some("OutOfDate"), None),
        }
    };
    let c_current = c.as_ref().is_some_and(|c| {
        c.status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .is_some_and(|g| Some(g) == c.metadata.generation)
    });
    let r_current = r.as_ref().is_some_and(|r| {
        r.status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .is_some_and(|g| Some(g) == r.metadata.generation)
    });
    let configs_ready = part(
        "ConfigurationsReady",
        c.as_ref()
            .and_then(|c| c.status.as_ref())
            .map(|s| s.conditions.as_slice()),
        c_current,
    );
    let routes_ready = part(
        "RoutesReady",
        r.as_ref()
            .and_then(|r| r.status.as_ref())
            .map(|s| s.conditions.as_slice()),
        r_current,
    );
    let overall = if configs_ready.status == "False" {
        condition(
            &old.conditions,
            "Ready",
            "False",
            configs_ready.reason.as_deref(),
            configs_ready.message.clone(),
        )
    } else if routes_ready.status == "False" {
        condition(
            &old.conditions,
            "Ready",
            "False",
            routes_ready.reason.as_deref(),
            routes_ready.message.clone(),
        )
    } else if configs_ready.status == "True" && routes_ready.status == "True" {
        condition(&old.conditions, "Ready", "True", None, None)
    } else {
        let unknown = if configs_ready.status != "True" {
            &configs_ready
        } else {
            &routes_ready
        };
        condition(
            &old.conditions,
            "Ready",
            "Unknown",
            unknown.reason.as_deref(),
            unknown.message.clone(),
        )
    };
    let cs = c
        .as_ref()
        .and_then(|c| c.status.clone())
        .unwrap_or_default();
    let rs = r
        .as_ref()
        .and_then(|r| r.status.clone())
        .unwrap_or_default();
    let status = super::types::ServiceStatus {
        observed_generation: s.metadata.generation,
        conditions: vec![configs_ready, overall, routes_ready],
        latest_created_revision_name: cs.latest_created_revision_name,
        latest_ready_revision_name: cs.latest_ready_revision_name,
        url: rs.url,
        address: rs.address,
        annotations: rs.annotations,
        traffic: rs.traffic,
    };
    if s.status.as_ref() != Some(&status) {
        Api::<KService>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .map_err(api("writing the Service's status"))?;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_without_traffic_routes_all_to_its_latest_revision() {
        let t = route_traffic("hello", &[]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].configuration_name.as_deref(), Some("hello"));
        assert_eq!(t[0].latest_revision, Some(true));
        assert_eq!(t[0].percent, Some(100));
        let split = route_traffic(
            "hello",
            &[
                TrafficTarget {
                    revision_name: Some("hello-00001".into()),
                    percent: Some(50),
                    ..Default::default()
                },
                TrafficTarget {
                    latest_revision: Some(true),
                    percent: Some(50),
                    tag: Some("latest".into()),
                    ..Default::default()
                },
            ],
        );
        assert_eq!(split[0].configuration_name, None);
        assert_eq!(split[1].configuration_name.as_deref(), Some("hello"));
    }
}

//! The Route reconciler: a Route's split becomes the traffic of the Function that runs its
//! Configuration (the gateway splits by it, the Function controller resolves it and keeps
//! the revisions it names); the Function lists the Route's hosts, which the gateway answers
//! on; a Service `<route>` (and `<tag>-<route>` per tag) leads to the gateway for the
//! cluster-local names, and an Ingress of the node's router for the domain's. Its status
//! gives the URLs and the split in effect, as Knative's route controller reports them.
//!
//! Not as in Knative: one Route splits over the revisions of one Configuration (Knative
//! allows several); a Route naming two is refused in its status.

use super::types::{Addressable, RouteStatus, TrafficTarget};
use super::{
    CONFIGURATION_LABEL, Ctx, DEFAULT_DOMAIN, DOMAIN_CONFIG, KRoute, SERVICE_LABEL,
    SETTINGS_NAMESPACE, condition,
};
use crate::gateway::HOSTS;
use crate::reconcile::{Error, api};
use crate::types::Function;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const MANAGER: &str = "knative-route-controller";
/// The status annotation with the gateway's path form of the URL.
pub const GATEWAY_URL: &str = "serverless.minik8s.io/gateway-url";

/// The Routes of `f`'s namespace (one of them may split over its revisions).
pub(crate) fn in_namespace(routes: &Store<KRoute>, f: &Function) -> Vec<ObjectRef<KRoute>> {
    routes
        .state()
        .into_iter()
        .filter(|r| r.namespace() == f.namespace())
        .map(|r| ObjectRef::from_obj(&*r))
        .collect()
}

/// The domain of the Routes' URLs: the first key of `knative-serving/config-domain`.
async fn domain(client: &kube::Client) -> String {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SETTINGS_NAMESPACE);
    match api.get_opt(DOMAIN_CONFIG).await {
        Ok(Some(cm)) => cm
            .data
            .unwrap_or_default()
            .into_keys()
            .find(|k| !k.starts_with('_'))
            .unwrap_or_else(|| DEFAULT_DOMAIN.to_owned()),
        _ => DEFAULT_DOMAIN.to_owned(),
    }
}

/// The hosts of route `name` in `ns`: (host, tag) pairs, the cluster-local names included.
pub fn hosts(name: &str, ns: &str, domain: &str, tags: &[String]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let names = |n: &str| {
        vec![
            format!("{n}.{ns}.{domain}"),
            format!("{n}.{ns}.svc.cluster.local"),
            format!("{n}.{ns}.svc"),
            format!("{n}.{ns}"),
        ]
    };
    for h in names(name) {
        out.push((h, None));
    }
    for tag in tags {
        for h in names(&format!("{tag}-{name}")) {
            out.push((h, Some(tag.clone())));
        }
    }
    out
}

/// Why a Route's split cannot be assigned.
#[derive(Debug, PartialEq, Eq)]
pub struct Unassigned {
    /// Knative's reason.
    pub reason: &'static str,
    /// Knative's message.
    pub message: String,
}

/// The Configuration whose revisions `traffic` splits over: named by its targets, or the
/// Configuration of a named revision (`revision_config`).
pub fn configuration_of(
    traffic: &[TrafficTarget],
    revision_config: impl Fn(&str) -> Option<String>,
) -> Result<String, Unassigned> {
    let mut configs = BTreeSet::new();
    for t in traffic {
        match (&t.revision_name, &t.configuration_name) {
            (Some(r), _) => match revision_config(r) {
                Some(c) => {
                    configs.insert(c);
                }
                None => {
                    return Err(Unassigned {
                        reason: "RevisionMissing",
                        message: format!("Revision \"{r}\" referenced in traffic not found."),
                    });
                }
            },
            (None, Some(c)) => {
                configs.insert(c.clone());
            }
            (None, None) => {
                return Err(Unassigned {
                    reason: "TrafficTargetInvalid",
                    message: "a traffic target names neither a revisionName nor a \
                              configurationName"
                        .into(),
                });
            }
        }
    }
    let mut configs = configs.into_iter();
    match (configs.next(), configs.next()) {
        (Some(c), None) => Ok(c),
        (None, _) => Err(Unassigned {
            reason: "TrafficTargetInvalid",
            message: "the Route's traffic is empty".into(),
        }),
        (Some(a), Some(b)) => Err(Unassigned {
            reason: "MultipleConfigurations",
            message: format!(
                "the traffic names revisions of Configurations \"{a}\" and \"{b}\"; minik8s \
                 splits one Route over the revisions of one Configuration"
            ),
        }),
    }
}

pub(crate) async fn reconcile(r: Arc<KRoute>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = r.name_any();
    let ns = r.namespace().unwrap_or_default();
    let old = r.status.clone().unwrap_or_default();
    let domain = domain(&ctx.client).await;
    let url = format!("http://{name}.{ns}.{domain}");
    let address = Addressable {
        url: Some(format!("http://{name}.{ns}.svc.cluster.local")),
    };
    let tags: Vec<String> = r
        .spec
        .traffic
        .iter()
        .filter_map(|t| t.tag.clone())
        .collect();
    let write = |conditions: Vec<super::Condition>,
                 traffic: Vec<TrafficTarget>,
                 annotations: BTreeMap<String, String>| {
        let next = RouteStatus {
            observed_generation: r.metadata.generation,
            conditions,
            url: Some(url.clone()),
            address: Some(address.clone()),
            traffic,
            annotations,
        };
        let client = ctx.client.clone();
        let ns = ns.clone();
        let name = name.clone();
        let same = r.status.as_ref() == Some(&next);
        async move {
            if same {
                return Ok(());
            }
            Api::<KRoute>::namespaced(client, &ns)
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": next})),
                )
                .await
                .map(|_| ())
                .map_err(api("writing the Route's status"))
        }
    };
    let unassigned = |u: Unassigned| {
        vec![
            condition(
                &old.conditions,
                "AllTrafficAssigned",
                "False",
                Some(u.reason),
                Some(u.message.clone()),
            ),
            condition(
                &old.conditions,
                "Ready",
                "False",
                Some(u.reason),
                Some(u.message),
            ),
        ]
    };

    // The Configuration (and so the Function) the split is over.
    let revision_config = |rev: &str| {
        ctx.revisions
            .get(&ObjectRef::new(rev).within(&ns))
            .and_then(|r| r.labels().get(CONFIGURATION_LABEL).cloned())
            .or_else(|| {
                ctx.fn_revisions
                    .get(&ObjectRef::new(rev).within(&ns))
                    .map(|r| r.spec.function.clone())
            })
    };
    let config = match configuration_of(&r.spec.traffic, revision_config) {
        Ok(c) => c,
        Err(u) => {
            write(unassigned(u), Vec::new(), BTreeMap::new()).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    if ctx
        .functions
        .get(&ObjectRef::new(&config).within(&ns))
        .is_none()
    {
        let exists = ctx
            .configurations
            .get(&ObjectRef::new(&config).within(&ns))
            .is_some();
        let u = Unassigned {
            reason: if exists {
                "RevisionMissing"
            } else {
                "ConfigurationMissing"
            },
            message: if exists {
                format!("Configuration \"{config}\" is waiting for a Revision to become ready.")
            } else {
                format!("Configuration \"{config}\" referenced in traffic not found.")
            },
        };
        write(unassigned(u), Vec::new(), BTreeMap::new()).await?;
        return Ok(Action::requeue(Duration::from_secs(2)));
    };

    // The Function's traffic and the hosts it answers on.
    let traffic: Vec<serde_json::Value> = r
        .spec
        .traffic
        .iter()
        .map(|t| {
            let mut v = json!({"percent": t.percent.unwrap_or(0)});
            match &t.revision_name {
                Some(rev) => v["revisionName"] = json!(rev),
                None => v["latestRevision"] = json!(true),
            }
            if let Some(tag) = &t.tag {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    let listed: Vec<String> = hosts(&name, &ns, &domain, &tags)
        .into_iter()
        .map(|(h, t)| t.map_or(h.clone(), |t| format!("{h}={t}")))
        .collect();
    let patch = json!({
        "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "Function",
        "metadata": {"name": config, "namespace": ns,
            "annotations": {HOSTS: listed.join(",")}},
        "spec": {"traffic": traffic},
    });
    let pp = PatchParams::apply(MANAGER).force();
    // As the apply left it: its status says the split once it observed this generation.
    let f = Api::<Function>::namespaced(ctx.client.clone(), &ns)
        .patch(&config, &pp, &Patch::Apply(&patch))
        .await
        .map_err(api("applying the Route's traffic to its Function"))?;
    let observed = f.status.as_ref().and_then(|s| s.observed_generation) == f.metadata.generation;

    // Services (cluster-local names) and an Ingress (the domain's) leading to the gateway.
    let owner = r
        .controller_owner_ref(&())
        .expect("a stored Route has a uid");
    let mut labels = json!({"serving.knative.dev/route": name});
    if let Some(s) = r.labels().get(SERVICE_LABEL) {
        labels[SERVICE_LABEL] = json!(s);
    }
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let gw = &ctx.gateway;
    for svc in std::iter::once(name.clone()).chain(tags.iter().map(|t| format!("{t}-{name}"))) {
        let service = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc, "namespace": ns, "labels": labels,
                "ownerReferences": [owner]},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": gw.port,
                "protocol": "TCP"}]},
        });
        services
            .patch(&svc, &pp, &Patch::Apply(&service))
            .await
            .map_err(api("applying the Route's Service"))?;
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": svc, "namespace": ns, "ownerReferences": [owner],
                "labels": {"kubernetes.io/service-name": svc,
                    "endpointslice.kubernetes.io/managed-by": MANAGER}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [gw.host], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": gw.port, "protocol": "TCP"}],
        });
        slices
            .patch(&svc, &pp, &Patch::Apply(&slice))
            .await
            .map_err(api("applying the Route's EndpointSlice"))?;
    }
    let rule = |host: &str| {
        json!({"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": name, "port": {"number": 80}}}}]}})
    };
    let rules: Vec<serde_json::Value> = std::iter::once(format!("{name}.{ns}.{domain}"))
        .chain(tags.iter().map(|t| format!("{t}-{name}.{ns}.{domain}")))
        .map(|h| rule(&h))
        .collect();
    let ingress = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": [owner]},
        "spec": {"ingressClassName": "minik8s", "rules": rules},
    });
    Api::<Ingress>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&ingress))
        .await
        .map_err(api("applying the Route's Ingress"))?;

    // The status: the split the Function resolved, with the tags' URLs.
    let fs = f.status.clone().unwrap_or_default();
    let resolved = observed
        && fs.traffic.len() == r.spec.traffic.len()
        && fs.traffic.iter().zip(&r.spec.traffic).all(|(got, want)| {
            got.tag == want.tag
                && got.percent.unwrap_or(0) == want.percent.unwrap_or(0)
                && want
                    .revision_name
                    .as_ref()
                    .is_none_or(|n| got.revision_name.as_ref() == Some(n))
        });
    let waiting_for_ready = r.spec.traffic.iter().any(|t| t.revision_name.is_none())
        && fs.latest_ready_revision.is_none();
    let split: Vec<TrafficTarget> = fs
        .traffic
        .iter()
        .map(|t| TrafficTarget {
            tag: t.tag.clone(),
            revision_name: t.revision_name.clone(),
            configuration_name: None,
            latest_revision: t.latest_revision,
            percent: t.percent,
            url: t
                .tag
                .as_ref()
                .map(|tag| format!("http://{tag}-{name}.{ns}.{domain}")),
        })
        .collect();
    let assigned = if !resolved {
        condition(
            &old.conditions,
            "AllTrafficAssigned",
            "Unknown",
            Some("TrafficNotAssigned"),
            Some("the split is being applied".into()),
        )
    } else if waiting_for_ready {
        condition(
            &old.conditions,
            "AllTrafficAssigned",
            "Unknown",
            Some("RevisionMissing"),
            Some(format!(
                "Configuration \"{config}\" is waiting for a Revision to become ready."
            )),
        )
    } else {
        condition(&old.conditions, "AllTrafficAssigned", "True", None, None)
    };
    let ready = match assigned.status.as_str() {
        "True" => condition(&old.conditions, "Ready", "True", None, None),
        s => condition(
            &old.conditions,
            "Ready",
            s,
            assigned.reason.as_deref(),
            assigned.message.clone(),
        ),
    };
    let settled = ready.status == "True";
    let conditions = vec![
        assigned,
        condition(
            &old.conditions,
            "CertificateProvisioned",
            "True",
            Some("TLSNotEnabled"),
            Some("External-TLS is not enabled".into()),
        ),
        condition(&old.conditions, "IngressReady", "True", None, None),
        ready,
    ];
    // The gateway's path form of the URL (the Function's).
    let gateway_url = f.status.as_ref().and_then(|s| s.url.clone());
    let annotations = gateway_url
        .map(|u| (GATEWAY_URL.to_owned(), u))
        .into_iter()
        .collect();
    write(conditions, split, annotations).await?;
    Ok(if settled {
        Action::requeue(Duration::from_secs(60))
    } else {
        Action::requeue(Duration::from_secs(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_has_its_hosts_and_its_tags_hosts() {
        let h = hosts("hello", "default", "example.com", &["old".into()]);
        assert!(h.contains(&("hello.default.example.com".into(), None)));
        assert!(h.contains(&("hello.default.svc.cluster.local".into(), None)));
        assert!(h.contains(&("old-hello.default.example.com".into(), Some("old".into()))));
        assert_eq!(h.len(), 8);
    }

    #[test]
    fn a_split_is_over_one_configuration() {
        let t = |rev: Option<&str>, cfg: Option<&str>| TrafficTarget {
            revision_name: rev.map(Into::into),
            configuration_name: cfg.map(Into::into),
            percent: Some(50),
            ..Default::default()
        };
        let of = |r: &str| r.strip_suffix("-00001").map(str::to_owned);
        assert_eq!(
            configuration_of(&[t(Some("a-00001"), None), t(None, Some("a"))], of),
            Ok("a".into())
        );
        assert_eq!(
            configuration_of(&[t(Some("b-00009x"), None)], of)
                .unwrap_err()
                .reason,
            "RevisionMissing"
        );
        assert_eq!(
            configuration_of(&[t(Some("a-00001"), None), t(None, Some("b"))], of)
                .unwrap_err()
                .reason,
            "MultipleConfigurations"
        );
    }
}

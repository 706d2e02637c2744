//! Knative Serving's API (`serving.knative.dev/v1`) on the Function engine, as Knative's four
//! controllers describe it:
//!
//! - a **Service** makes a Configuration and a Route of its name and reports both;
//! - a **Configuration** runs as a Function of its name with runtime `container` (the
//!   revision template as the pod): the Function controller makes an immutable revision
//!   `<name>-0000N` of every change, each a Deployment scaled 0 → N → 0 by the gateway; each
//!   such revision shows as a Knative **Revision** of the same name;
//! - a **Route** sets that Function's traffic (percentages, tags, `latestRevision`), names
//!   the hosts that reach it (`<route>.<ns>.<domain>`, `<tag>-<route>.<ns>.<domain>` and the
//!   cluster-local names), and makes a Service `<route>` (the gateway's address, for
//!   `<route>.<ns>.svc.cluster.local`) and an Ingress (the node's router, for the domain).
//!
//! So there is one gateway (activator and autoscaler), one revision garbage collector and
//! one traffic resolver for Functions and Knative Services alike. The domain comes from the
//! ConfigMap `knative-serving/config-domain`, as in Knative (`example.com` without one).

pub mod configuration;
pub mod revision;
pub mod route;
pub mod service;
pub mod types;

use crate::types::{Function, FunctionRevision};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::runtime::reflector::Store;
use minik8s_controllers::driver::Driver;
use minik8s_controllers::informer::Informers;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
pub use types::{Condition, KConfiguration, KRevision, KRoute, KService};

/// The label naming the Service a Configuration, Route or Revision belongs to.
pub const SERVICE_LABEL: &str = "serving.knative.dev/service";
/// The label naming a Revision's (and a Function's) Configuration.
pub const CONFIGURATION_LABEL: &str = "serving.knative.dev/configuration";
/// The label giving the Configuration's generation a Revision was made from.
pub const CONFIGURATION_GENERATION: &str = "serving.knative.dev/configurationGeneration";
/// The label naming a pod's Revision.
pub const REVISION_LABEL: &str = "serving.knative.dev/revision";
/// The namespace of Knative's settings.
pub const SETTINGS_NAMESPACE: &str = "knative-serving";
/// The ConfigMap whose first key is the domain of Routes' URLs.
pub const DOMAIN_CONFIG: &str = "config-domain";
/// The domain without a `config-domain`.
pub const DEFAULT_DOMAIN: &str = "example.com";

/// Knative's CRDs, as `minik8s up` installs them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt;
    [
        KService::crd(),
        KConfiguration::crd(),
        KRevision::crd(),
        KRoute::crd(),
    ]
    .into_iter()
    .map(|crd| {
        let mut v = serde_json::to_value(&crd).expect("a CRD serializes");
        types::unrequire_container_names(&mut v);
        // Knative's CRDs carry these labels (tools such as `kn` look for Knative's kinds).
        v["metadata"]["labels"] = serde_json::json!({
            "app.kubernetes.io/name": "knative-serving",
            "knative.dev/crd-install": "true",
        });
        serde_json::from_value(v).expect("a CRD")
    })
    .collect()
}

/// A condition in Knative's form, keeping its transition time while its status holds.
pub fn condition(
    old: &[Condition],
    type_: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<String>,
) -> Condition {
    let kept = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        severity: None,
        last_transition_time: Some(kept.unwrap_or_else(|| {
            jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        })),
        reason: reason.map(str::to_owned),
        message,
    }
}

/// The `Ready` condition of `conditions`.
pub fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == "Ready")
}

/// Where the gateway is reached (for Routes' Services).
#[derive(Clone, Debug)]
pub struct Gateway {
    /// The node address pods reach it at.
    pub host: String,
    /// Its port.
    pub port: u16,
}

impl Gateway {
    /// From the gateway's base URL (`http://<host>:<port>`).
    pub fn from_url(url: &str) -> Option<Gateway> {
        let rest = url.strip_prefix("http://")?.trim_end_matches('/');
        let (host, port) = rest.rsplit_once(':')?;
        Some(Gateway {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// What the Knative reconcilers share.
pub(crate) struct Ctx {
    pub client: Client,
    pub gateway: Gateway,
    pub functions: Store<Function>,
    pub fn_revisions: Store<FunctionRevision>,
    pub configurations: Store<KConfiguration>,
    pub routes: Store<KRoute>,
    pub revisions: Store<KRevision>,
    pub recorder: minik8s_events::Recorder,
}

/// Runs the four reconcilers until `shutdown`, on the Function controller's informers.
pub async fn run(
    client: Client,
    informers: &Informers,
    gateway: Gateway,
    functions: Store<Function>,
    fn_revisions: Store<FunctionRevision>,
    shutdown: CancellationToken,
) {
    let recorder = minik8s_events::Recorder::new(client.clone(), "knative-serving", None);
    let services = Driver::<KService>::new("knative-service", informers).await;
    let configurations = Driver::<KConfiguration>::new("knative-configuration", informers).await;
    let routes = Driver::<KRoute>::new("knative-route", informers).await;
    let revisions = Driver::<KRevision>::new("knative-revision", informers).await;
    let ctx = Arc::new(Ctx {
        client,
        gateway,
        functions,
        fn_revisions,
        configurations: configurations.store(),
        routes: routes.store(),
        revisions: revisions.store(),
        recorder,
    });
    let services = services.owns::<KConfiguration>().owns::<KRoute>().run(
        service::reconcile,
        ctx.clone(),
        shutdown.clone(),
    );
    let configurations = configurations
        .owns::<Function>()
        .owns::<KRevision>()
        .watches::<FunctionRevision, _>(configuration::of_function_revision)
        .run(configuration::reconcile, ctx.clone(), shutdown.clone());
    let by_namespace = {
        let routes = ctx.routes.clone();
        move |f: Arc<Function>| route::in_namespace(&routes, &f)
    };
    let routes = routes.watches::<Function, _>(by_namespace).run(
        route::reconcile,
        ctx.clone(),
        shutdown.clone(),
    );
    let revisions = revisions
        .watches::<FunctionRevision, _>(revision::of_function_revision)
        .run(revision::reconcile, ctx, shutdown);
    tokio::join!(services, configurations, routes, revisions);
}

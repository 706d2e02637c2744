//! The root CA publisher (upstream's `root-ca-cert-publisher`): every namespace that is not
//! being deleted holds the `kube-root-ca.crt` ConfigMap with the cluster's CA, which pods'
//! projected service account volumes read; a deleted or changed one is put back.

use crate::Result;
use crate::driver::Driver;
use crate::informer::Informers;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The ConfigMap's name.
pub const NAME: &str = "kube-root-ca.crt";
/// Its one key.
const KEY: &str = "ca.crt";
/// Upstream's description annotation.
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

struct Ctx {
    client: Client,
    ca: String,
}

/// The ConfigMap a namespace should hold.
fn wanted(ns: &str, ca: &str) -> Result<ConfigMap> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": NAME, "namespace": ns,
            "annotations": {"kubernetes.io/description": DESCRIPTION}},
        "data": {KEY: ca},
    }))?)
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action> {
    if ns.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = ns.name_any();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &name);
    match api.get_opt(NAME).await? {
        None => match api
            .create(&PostParams::default(), &wanted(&name, &ctx.ca)?)
            .await
        {
            Ok(_) => tracing::info!(namespace = %name, "published the root CA"),
            // The namespace went away, or someone else put it back first.
            Err(kube::Error::Api(s)) if matches!(s.code, 403 | 404 | 409) => {}
            Err(e) => return Err(e.into()),
        },
        Some(mut cm) => {
            let current = cm.data.as_ref().and_then(|d| d.get(KEY));
            if current != Some(&ctx.ca) {
                cm.data
                    .get_or_insert_with(Default::default)
                    .insert(KEY.into(), ctx.ca.clone());
                cm.annotations_mut()
                    .insert("kubernetes.io/description".into(), DESCRIPTION.into());
                match api.replace(NAME, &PostParams::default(), &cm).await {
                    Ok(_) => tracing::info!(namespace = %name, "restored the root CA"),
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => {
                        return Ok(Action::requeue(std::time::Duration::from_millis(200)));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(Action::await_change())
}

/// Runs the publisher until `shutdown`; without a CA (`--root-ca-file`) it publishes nothing.
pub async fn run(
    client: Client,
    ca: Option<String>,
    informers: Informers,
    shutdown: CancellationToken,
) {
    let Some(ca) = ca else {
        tracing::warn!("no root CA given: kube-root-ca.crt ConfigMaps are not published");
        return;
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        ca,
    });
    // Only the ConfigMaps of that name are watched, each naming its namespace.
    let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
    Driver::<Namespace>::new("root-ca-cert-publisher", &informers)
        .await
        .watches_api(Api::<ConfigMap>::all(client), config, |cm: ConfigMap| {
            cm.namespace().map(|ns| ObjectRef::new(&ns))
        })
        .run(reconcile, ctx, shutdown)
        .await;
}

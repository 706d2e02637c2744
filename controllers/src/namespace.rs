//! The namespace controller: a namespace being deleted (`Terminating`) has everything in
//! it deleted — every namespaced resource the API serves, found by discovery — and once
//! nothing is left its `kubernetes` finalizer is removed through the `finalize`
//! subresource, which lets the apiserver remove it.

use crate::Result;
use crate::driver::Driver;
use crate::gc::{Served, served};
use crate::informer::Informers;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Ctx {
    client: Client,
}

/// Deletes what is left of each resource in a namespace; returns how many objects remain.
async fn drain(client: &Client, ns: &str, resources: &[Served]) -> Result<usize> {
    let mut left = 0;
    for s in resources.iter().filter(|s| s.namespaced) {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &s.ar);
        let list = match api.list_metadata(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(s)) if matches!(s.code, 404 | 405) => continue,
            Err(e) => return Err(e.into()),
        };
        if list.items.is_empty() {
            continue;
        }
        left += list.items.len();
        if list
            .items
            .iter()
            .any(|o| o.metadata.deletion_timestamp.is_none())
        {
            let r = api
                .delete_collection(&DeleteParams::background(), &ListParams::default())
                .await;
            if let Err(e) = r {
                // Some resources refuse deletecollection: delete one by one.
                tracing::debug!(resource = %s.ar.plural, error = %e, "deletecollection failed");
                for o in &list.items {
                    let _ = api.delete(&o.name_any(), &DeleteParams::background()).await;
                }
            }
        }
    }
    Ok(left)
}

async fn reconcile(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action> {
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let has_finalizer = ns
        .spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .is_some_and(|f| f.iter().any(|f| f == "kubernetes"));
    if !has_finalizer {
        return Ok(Action::await_change());
    }
    let name = ns.name_any();
    let resources = served(&ctx.client).await?;
    if drain(&ctx.client, &name, &resources).await? > 0 {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let mut done = (*ns).clone();
    if let Some(spec) = done.spec.as_mut() {
        spec.finalizers = Some(
            spec.finalizers
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != "kubernetes")
                .collect(),
        );
    }
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    match api
        .replace_subresource("finalize", &name, &PostParams::default(), &done)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if matches!(s.code, 404) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Runs the namespace controller until `shutdown`.
pub async fn run(client: Client, informers: Informers, shutdown: CancellationToken) {
    Driver::<Namespace>::new("namespace", &informers)
        .await
        .run(reconcile, Arc::new(Ctx { client }), shutdown)
        .await;
}

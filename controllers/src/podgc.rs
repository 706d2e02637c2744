//! The pod garbage collector's orphan rule (upstream's `gcOrphaned`): a pod bound to a node
//! that no longer exists is deleted at once (grace 0: no kubelet is left to stop it), so its
//! controller replaces it on a node that does. A node must be missing for a short quarantine
//! and a direct read must confirm it is gone, so a node that is only just registering, or a
//! stale cache, never costs a pod.

use crate::driver::Driver;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long a node must be missing before its pods go (upstream: 40 s).
pub const QUARANTINE: Duration = Duration::from_secs(5);

struct Ctx {
    client: Client,
    nodes: Store<Node>,
    /// When each node the cache lacks was first found missing.
    missing_since: Mutex<HashMap<String, Instant>>,
}

/// Runs the collector until `shutdown`: a pod is looked at when it changes and when its
/// node is deleted.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let ctx = Arc::new(Ctx {
        client,
        nodes: informers.all::<Node>().await,
        missing_since: Mutex::default(),
    });
    let driver = Driver::<Pod>::new("podgc", &informers).await;
    let pods = driver.store();
    let nodes = ctx.nodes.clone();
    driver
        .watches::<Node, _>(move |node| {
            // Only a node's deletion concerns its pods (its status updates, each minute per
            // node, do not).
            if nodes.get(&ObjectRef::from_obj(node.as_ref())).is_some() {
                return Vec::new();
            }
            let name = node.name_any();
            pods.state()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()) == Some(&name))
                .map(|p| ObjectRef::from(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .run(collect, ctx, shutdown)
        .await;
}

/// Deletes a pod whose node has been gone for the quarantine.
async fn collect(pod: Arc<Pod>, ctx: Arc<Ctx>) -> crate::Result<Action> {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(Action::await_change());
    };
    if ctx.nodes.get(&ObjectRef::new(&node)).is_some() {
        ctx.missing_since.lock().expect("podgc").remove(&node);
        return Ok(Action::await_change());
    }
    let since = *ctx
        .missing_since
        .lock()
        .expect("podgc")
        .entry(node.clone())
        .or_insert_with(Instant::now);
    if since.elapsed() < QUARANTINE {
        return Ok(Action::requeue(QUARANTINE - since.elapsed()));
    }
    match Api::<Node>::all(ctx.client.clone()).get_opt(&node).await? {
        None => {}
        Some(_) => {
            ctx.missing_since.lock().expect("podgc").remove(&node);
            return Ok(Action::await_change());
        }
    }
    let ns = pod.namespace().unwrap_or_default();
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .delete(&pod.name_any(), &dp)
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %format!("{ns}/{}", pod.name_any()), %node, "deleted a pod bound to a node that no longer exists")
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

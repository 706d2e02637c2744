//! The pod garbage collector's orphan rule (upstream's `gcOrphaned`): a pod bound to a node
//! that no longer exists is deleted at once (grace 0: no kubelet is left to stop it), so its
//! controller replaces it on a node that does. A node must be missing for a short quarantine
//! and a direct read must confirm it is gone, so a node that is only just registering, or a
//! stale cache, never costs a pod.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long a node must be missing before its pods go (upstream: 40 s).
pub const QUARANTINE: Duration = Duration::from_secs(5);

/// Runs the collector until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let nodes = informers.all::<Node>().await;
    let pods = informers.all::<Pod>().await;
    let node_api: Api<Node> = Api::all(client.clone());
    let mut missing_since: HashMap<String, Instant> = HashMap::new();
    loop {
        let present: HashSet<String> = nodes.state().iter().map(|n| n.name_any()).collect();
        let mut orphans: HashMap<String, Vec<std::sync::Arc<Pod>>> = HashMap::new();
        for pod in pods.state() {
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone())
                && !present.contains(&node)
            {
                orphans.entry(node).or_default().push(pod);
            }
        }
        missing_since.retain(|n, _| orphans.contains_key(n));
        for (node, list) in orphans {
            let since = *missing_since
                .entry(node.clone())
                .or_insert_with(Instant::now);
            if since.elapsed() < QUARANTINE {
                continue;
            }
            match node_api.get_opt(&node).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "checking a missing node");
                    continue;
                }
            }
            for pod in list {
                let ns = pod.namespace().unwrap_or_default();
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: pod.uid(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match Api::<Pod>::namespaced(client.clone(), &ns)
                    .delete(&pod.name_any(), &dp)
                    .await
                {
                    Ok(_) => {
                        tracing::info!(pod = %format!("{ns}/{}", pod.name_any()), %node, "deleted a pod bound to a node that no longer exists")
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => {
                        tracing::warn!(pod = %pod.name_any(), error = %e, "deleting an orphaned pod")
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

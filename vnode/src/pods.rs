//! The pods of the served nodes, as virtual-kubelet's `PodController`, off the process's one
//! pod watch (a reconcile on the controller driver, keyed by pod, with back-off):
//!
//! - a pod bound to a served node that the provider does not run is created there; a spec
//!   change is passed on as an update;
//! - the provider's status notifications are written to `pods/status`;
//! - a pod being deleted is deleted in the provider, and its deletion finishes with a delete
//!   at grace 0 once the provider reports it terminal (or no longer has it);
//! - at take-over and every resync the provider's pods (`GetPods`) are compared with the
//!   API's: what runs is adopted (never created again), a provider pod the API no longer has
//!   is deleted, and a pod that vanished from the provider is reported `Failed`.

use crate::Served;
use crate::{Error, Shared, metrics};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A pod the provider runs, as this replica knows it.
#[derive(Clone, Debug)]
pub(crate) struct Running {
    uid: String,
    /// The spec last handed to the provider (JSON), to tell an update.
    spec: String,
    /// `delete_pod` was called.
    deleting: bool,
}

/// The pods one node's provider runs, by namespace and name.
#[derive(Debug, Default)]
pub struct PodState {
    pods: HashMap<(String, String), Running>,
}

impl PodState {
    /// How many pods the provider runs for the node.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether it runs none.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

fn key(pod: &Pod) -> (String, String) {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

fn spec_of(pod: &Pod) -> String {
    serde_json::to_string(&pod.spec).unwrap_or_default()
}

fn terminal(status: Option<&PodStatus>) -> bool {
    matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Times a provider call into `vnode_provider_call_duration_seconds{call}`.
async fn timed<T>(call: &str, fut: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = fut.await;
    metrics::get().provider_call(call, started.elapsed());
    out
}

/// Reconciles one pod of the shared watch (nothing when its node is not served here).
pub(crate) async fn reconcile(pod: Arc<Pod>, shared: Arc<Shared>) -> Result<Action, Error> {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(Action::await_change());
    };
    let Some(served) = shared.served(&node) else {
        return Ok(Action::await_change());
    };
    if !served.adopted.load(std::sync::atomic::Ordering::Acquire) {
        // A node just taken over: its pods are queued again once what runs is adopted.
        return Ok(Action::await_change());
    }
    sync_pod(&shared, &served, &pod).await
}

async fn sync_pod(shared: &Shared, served: &Served, pod: &Pod) -> Result<Action, Error> {
    let provider = &served.provider;
    let k = key(pod);
    let uid = pod.uid().unwrap_or_default();
    let mut state = served.pods.lock().await;
    // Another pod of the same name ran before (deleted and recreated): that one goes first.
    if let Some(old) = state.pods.get(&k)
        && old.uid != uid
    {
        let mut stale = pod.clone();
        stale.metadata.uid = Some(old.uid.clone());
        match timed("delete_pod", provider.delete_pod(&stale)).await {
            Ok(()) | Err(crate::ProviderError::NotFound(_)) => {
                state.pods.remove(&k);
            }
            Err(e) => return Err(e.into()),
        }
    }
    if pod.metadata.deletion_timestamp.is_some() {
        let Some(running) = state.pods.get_mut(&k) else {
            // Nothing runs it: the deletion finishes now.
            drop(state);
            force_delete(shared, pod).await?;
            return Ok(Action::await_change());
        };
        if !running.deleting {
            match timed("delete_pod", provider.delete_pod(pod)).await {
                Ok(()) => running.deleting = true,
                Err(crate::ProviderError::NotFound(_)) => {
                    state.pods.remove(&k);
                    drop(state);
                    force_delete(shared, pod).await?;
                    return Ok(Action::await_change());
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Finished when the provider reports it terminal (also through the notifier).
        let status = timed("get_pod_status", provider.get_pod_status(&k.0, &k.1)).await;
        match status {
            Ok(None) | Err(crate::ProviderError::NotFound(_)) => {
                state.pods.remove(&k);
                drop(state);
                force_delete(shared, pod).await?;
                Ok(Action::await_change())
            }
            Ok(Some(s)) if terminal(Some(&s)) => {
                state.pods.remove(&k);
                drop(state);
                write_status(shared, pod, &s).await?;
                force_delete(shared, pod).await?;
                Ok(Action::await_change())
            }
            Ok(Some(_)) => Ok(Action::requeue(Duration::from_secs(1))),
            Err(e) => Err(e.into()),
        }
    } else if let Some(running) = state.pods.get_mut(&k) {
        let spec = spec_of(pod);
        if running.spec != spec {
            timed("update_pod", provider.update_pod(pod)).await?;
            running.spec = spec;
        }
        Ok(Action::await_change())
    } else if terminal(pod.status.as_ref()) {
        Ok(Action::await_change())
    } else {
        match timed("create_pod", provider.create_pod(pod)).await {
            Ok(()) => {
                state.pods.insert(
                    k,
                    Running {
                        uid,
                        spec: spec_of(pod),
                        deleting: false,
                    },
                );
                Ok(Action::await_change())
            }
            Err(e) => {
                drop(state);
                // As virtual-kubelet's handleProviderError: the pod says why, and is retried.
                let status = PodStatus {
                    phase: Some("Pending".into()),
                    reason: Some("ProviderFailed".into()),
                    message: Some(e.to_string()),
                    ..Default::default()
                };
                let _ = write_status(shared, pod, &status).await;
                Err(e.into())
            }
        }
    }
}

/// A status the provider reported: written to the pod when it is still the pod the provider
/// runs; a pod being deleted whose status is terminal is then deleted at grace 0.
pub(crate) async fn on_provider_status(shared: &Shared, served: &Served, reported: Pod) {
    let k = key(&reported);
    let Some(pod) = shared
        .pods
        .get(&kube::runtime::reflector::ObjectRef::new(&k.1).within(&k.0))
    else {
        return;
    };
    if pod.spec.as_ref().and_then(|s| s.node_name.clone()) != Some(served.name()) {
        return;
    }
    if let Some(uid) = reported.uid()
        && Some(uid) != pod.uid()
    {
        return;
    }
    let Some(status) = reported.status else {
        return;
    };
    if let Err(e) = write_status(shared, &pod, &status).await {
        tracing::warn!(pod = %format!("{}/{}", k.0, k.1), error = %e, "writing the pod status failed");
        return;
    }
    if pod.metadata.deletion_timestamp.is_some() && terminal(Some(&status)) {
        served.pods.lock().await.pods.remove(&k);
        if let Err(e) = force_delete(shared, &pod).await {
            tracing::warn!(pod = %format!("{}/{}", k.0, k.1), error = %e, "finishing the deletion failed");
        }
    }
}

/// The provider no longer runs the pod: a pod being deleted (this uid) finishes its
/// deletion; any other is left to the next resync, which reports it vanished.
pub(crate) async fn on_provider_gone(shared: &Shared, served: &Served, gone: Pod) {
    let k = key(&gone);
    let Some(pod) = shared
        .pods
        .get(&kube::runtime::reflector::ObjectRef::new(&k.1).within(&k.0))
    else {
        return;
    };
    if pod.uid() != gone.uid() || pod.metadata.deletion_timestamp.is_none() {
        return;
    }
    served.pods.lock().await.pods.remove(&k);
    if let Err(e) = force_delete(shared, &pod).await {
        tracing::warn!(pod = %format!("{}/{}", k.0, k.1), error = %e, "finishing the deletion failed");
    }
}

/// Writes `status` to the pod unless it already says that.
async fn write_status(shared: &Shared, pod: &Pod, status: &PodStatus) -> Result<(), Error> {
    if pod.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let patch = json!({"metadata": {"uid": pod.uid()}, "status": status});
    match api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the pod at grace 0 (this uid only), as the kubelet does.
async fn force_delete(shared: &Shared, pod: &Pod) -> Result<(), Error> {
    Ok(minik8s_kubelet::pod::finish_deletion(&shared.client, pod).await?)
}

/// Compares the node's pods in the API with the provider's (`GetPods`). At `takeover` what
/// the provider runs is adopted first.
pub(crate) async fn resync(shared: &Shared, served: &Served, takeover: bool) {
    let name = served.name();
    // Held from the listing on: a pod created meanwhile would look vanished from a list
    // taken before it.
    let mut state = served.pods.lock().await;
    let provider_pods = match timed("get_pods", served.provider.get_pods()).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "listing the provider's pods failed");
            return;
        }
    };
    let api_pods: HashMap<(String, String), Arc<Pod>> = shared
        .pods
        .state()
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
        .map(|p| (key(&p), p))
        .collect();
    let mut in_provider = HashMap::new();
    for p in &provider_pods {
        let k = key(p);
        let same = api_pods
            .get(&k)
            .is_some_and(|a| p.uid().is_none() || p.uid() == a.uid());
        if !same {
            // The API no longer has it: a dangling pod (virtual-kubelet's deleteDanglingPods).
            tracing::info!(node = %name, pod = %format!("{}/{}", k.0, k.1), "deleting a pod the API no longer has");
            if let Err(e) = timed("delete_pod", served.provider.delete_pod(p)).await {
                tracing::warn!(node = %name, error = %e, "deleting a dangling pod failed");
            }
            state.pods.remove(&k);
            continue;
        }
        let api = &api_pods[&k];
        if takeover || !state.pods.contains_key(&k) {
            state.pods.insert(
                k.clone(),
                Running {
                    uid: api.uid().unwrap_or_default(),
                    spec: spec_of(api),
                    deleting: false,
                },
            );
        }
        in_provider.insert(k, p.status.clone());
    }
    // Known here, gone from the provider: the pod failed (virtual-kubelet's NotFound).
    let vanished: Vec<(String, String)> = state
        .pods
        .keys()
        .filter(|k| !in_provider.contains_key(*k))
        .cloned()
        .collect();
    for k in vanished {
        let running = state.pods.remove(&k);
        let Some(pod) = api_pods.get(&k) else {
            continue;
        };
        if running.is_some_and(|r| r.deleting) || pod.metadata.deletion_timestamp.is_some() {
            // Deleted in the provider already: the deletion finishes.
            if let Err(e) = force_delete(shared, pod).await {
                tracing::warn!(node = %name, error = %e, "finishing a deletion failed");
            }
        } else if !terminal(pod.status.as_ref()) {
            let status = PodStatus {
                phase: Some("Failed".into()),
                reason: Some("NotFound".into()),
                message: Some(
                    "The pod status was not found and may have been deleted from the provider"
                        .into(),
                ),
                ..pod.status.clone().unwrap_or_default()
            };
            if let Err(e) = write_status(shared, pod, &status).await {
                tracing::warn!(node = %name, error = %e, "marking a vanished pod failed");
            }
        }
    }
    drop(state);
    // Statuses the provider has that the API lacks (a notification lost in a take-over).
    for (k, status) in in_provider {
        if let (Some(pod), Some(status)) = (api_pods.get(&k), status)
            && pod.metadata.deletion_timestamp.is_none()
            && let Err(e) = write_status(shared, pod, &status).await
        {
            tracing::warn!(node = %name, error = %e, "writing a pod status failed");
        }
    }
    // The first listing adopted what runs: the node's pods may now be acted on.
    if !served
        .adopted
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        queue_pods_of(shared, &name);
    }
}

/// Queues every pod of node `name` for a reconcile.
pub(crate) fn queue_pods_of(shared: &Shared, name: &str) {
    for pod in shared.pods.state() {
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name) {
            let _ = shared
                .trigger
                .send(kube::runtime::reflector::ObjectRef::from(pod.as_ref()));
        }
    }
}

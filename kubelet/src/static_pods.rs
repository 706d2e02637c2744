//! Static pods: Pod manifests in a folder the kubelet watches. They run from the file alone
//! (no apiserver needed) and are mirrored into the API as mirror pods, read-only copies named
//! `<name>-<node>` with the `kubernetes.io/config.mirror` annotation and the Node as owner,
//! which carry their status. Deleting a mirror pod does not stop its pod: the kubelet makes
//! it again. Changing a manifest replaces its pod; removing it stops the pod.

use crate::error::{Error, Result};
pub use crate::pod::mirror::{MIRROR, SOURCE, is_mirror, runtime_uid};
use crate::pod::{self, Worker};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The annotation holding a static pod's hash.
pub const HASH: &str = "kubernetes.io/config.hash";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The static pod a manifest describes on `node`: named `<name>-<node>` in its namespace
/// (`default` if none), bound to the node, its uid the hash of the manifest and the node.
pub fn prepare(text: &str, node: &str) -> Result<Pod> {
    let mut pod: Pod = serde_yaml::from_str(text).map_err(|e| Error::Pod(e.to_string()))?;
    if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
        return Err(Error::Pod("the manifest has no metadata.name".into()));
    }
    if pod.spec.is_none() {
        return Err(Error::Pod("the manifest has no spec".into()));
    }
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!(
            "{node}\n{}",
            serde_json::to_string(&pod).unwrap_or_default()
        )
        .as_bytes(),
    );
    let hash = hex(&digest.as_ref()[..16]);
    let name = format!("{}-{node}", pod.name_any());
    let meta = &mut pod.metadata;
    meta.name = Some(name);
    meta.namespace = Some(meta.namespace.clone().unwrap_or_else(|| "default".into()));
    meta.uid = Some(hash.clone());
    meta.resource_version = None;
    let notes = meta.annotations.get_or_insert_with(BTreeMap::new);
    notes.insert(HASH.into(), hash);
    notes.insert(SOURCE.into(), "file".into());
    let spec = pod.spec.as_mut().expect("checked above");
    spec.node_name = Some(node.to_owned());
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".into());
    }
    pod.status = None;
    Ok(pod)
}

/// The static pods in `dir` (`*.yaml`, `*.yml`, `*.json`, one Pod each), by file; files that
/// do not hold a valid pod are logged and left out.
pub fn read_dir(dir: &Path, node: &str) -> BTreeMap<PathBuf, Pod> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let manifest = path
            .extension()
            .is_some_and(|x| x == "yaml" || x == "yml" || x == "json");
        if !manifest
            || path
                .file_name()
                .is_some_and(|n| n.as_encoded_bytes()[0] == b'.')
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match prepare(&text, node) {
            Ok(pod) => {
                out.insert(path, pod);
            }
            Err(e) => tracing::warn!(file = %path.display(), error = %e, "not a static pod"),
        }
    }
    out
}

/// The mirror pod of a static pod, owned by its Node.
fn mirror_of(pod: &Pod, node: &Node) -> Pod {
    let mut mirror = pod.clone();
    let hash = pod.uid().unwrap_or_default();
    mirror.metadata.uid = None;
    mirror
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(MIRROR.into(), hash);
    mirror.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.name_any(),
        uid: node.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    mirror
}

/// The static pods this kubelet runs, shared with orphan removal (their uids are live).
#[derive(Clone, Default)]
pub struct Running(Arc<Mutex<BTreeMap<PathBuf, Pod>>>);

impl Running {
    /// Starts from the manifests now in `dir`.
    pub fn load(&self, dir: &Path, node: &str) {
        *self.0.lock().expect("static pods lock") = read_dir(dir, node);
    }

    /// The uids of the static pods.
    pub fn uids(&self) -> HashSet<String> {
        self.0
            .lock()
            .expect("static pods lock")
            .values()
            .filter_map(|p| p.uid())
            .collect()
    }
}

/// Makes sure the mirror of `pod` is in the API and current (read from the kubelet's pod
/// store, which holds the node's pods); returns its status to start from (none when there is
/// no mirror yet or the API cannot be reached).
async fn sync_mirror(
    w: &Worker,
    api_pods: &Store<Pod>,
    pod: &Pod,
) -> Option<k8s_openapi::api::core::v1::PodStatus> {
    let ns = pod.namespace().unwrap_or_default();
    let hash = pod.uid().unwrap_or_default();
    match api_pods.get(&ObjectRef::new(&pod.name_any()).within(&ns)) {
        Some(m) if m.annotations().get(MIRROR) == Some(&hash) => {
            // Being deleted: the kubelet's pod loop finishes that; made again next pass.
            return m
                .metadata
                .deletion_timestamp
                .is_none()
                .then(|| m.status.clone())
                .flatten();
        }
        Some(old) => {
            // An older mirror (a changed manifest) or a pod in the way: replace it.
            if let Err(e) = w.remove(&old).await {
                tracing::warn!(pod = %old.name_any(), error = %e, "removing an old mirror pod");
            }
            return None;
        }
        // Not known yet, or not listed yet: the create below tells.
        None if !ready(api_pods) => return None,
        None => {}
    }
    let api: Api<Pod> = Api::namespaced(w.client.clone(), &ns);
    let nodes: Api<Node> = Api::all(w.client.clone());
    let node = nodes.get(&w.layout.node).await.ok()?;
    match api
        .create(&PostParams::default(), &mirror_of(pod, &node))
        .await
    {
        Ok(m) => {
            tracing::info!(pod = %pod.name_any(), "created the mirror pod");
            m.status
        }
        // The store had not seen it yet.
        Err(kube::Error::Api(e)) if e.code == 409 => None,
        Err(e) => {
            tracing::warn!(pod = %pod.name_any(), error = %e, "creating the mirror pod");
            None
        }
    }
}

/// Whether the pod store has its first full list (without waiting for it: static pods run
/// on while the apiserver is away).
fn ready(api_pods: &Store<Pod>) -> bool {
    use futures::FutureExt;
    api_pods
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}

/// Deletes the mirror pods of this node whose static pod is not running here.
async fn remove_stale_mirrors(w: &Worker, api_pods: &Store<Pod>, live: &HashSet<String>) {
    for m in api_pods.state() {
        let Some(hash) = m.annotations().get(MIRROR) else {
            continue;
        };
        if live.contains(hash) || m.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match w.remove(&m).await {
            Ok(_) => tracing::info!(pod = %m.name_any(), "removed a stale mirror pod"),
            Err(e) => tracing::debug!(pod = %m.name_any(), error = %e, "removing a mirror pod"),
        }
    }
}

/// One pass over a static pod: its mirror, then the usual pod pass with the mirror's status.
async fn pass(w: Arc<Worker>, api_pods: &Store<Pod>, pod: Pod) {
    let mut pod = pod;
    pod.status = sync_mirror(&w, api_pods, &pod).await;
    if let Err(e) = pod::reconcile(Arc::new(pod.clone()), w).await {
        tracing::debug!(pod = %pod.name_any(), error = %e, "static pod pass");
    }
}

/// Runs the static pods of `dir` until `shutdown`: a pass over every pod each relist period
/// and whenever the folder changes (inotify). They keep running after the kubelet stops.
pub async fn run(
    dir: PathBuf,
    w: Arc<Worker>,
    running: Running,
    api_pods: Store<Pod>,
    shutdown: CancellationToken,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    let _ = std::fs::create_dir_all(&dir);
    let watcher = {
        use notify::Watcher;
        notify::recommended_watcher(move |_| {
            let _ = tx.try_send(());
        })
        .and_then(|mut w| {
            w.watch(&dir, notify::RecursiveMode::NonRecursive)?;
            Ok(w)
        })
    };
    if let Err(e) = &watcher {
        tracing::warn!(dir = %dir.display(), error = %e, "not watching the manifest folder; reading it every second");
    }
    let mut ticks = 0u64;
    loop {
        let want = read_dir(&dir, &w.layout.node);
        let had = running.0.lock().expect("static pods lock").clone();
        // Pods whose manifest went away or changed stop first.
        for (path, old) in &had {
            if want.get(path).and_then(|p| p.uid()) != old.uid() {
                tracing::info!(pod = %old.name_any(), file = %path.display(), "stopping a static pod");
                let grace = old
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30);
                if let Err(e) = w
                    .teardown(&old.uid().unwrap_or_default(), grace, Some(old))
                    .await
                {
                    tracing::warn!(pod = %old.name_any(), error = %e, "stopping a static pod");
                }
            }
        }
        *running.0.lock().expect("static pods lock") = want.clone();
        futures::future::join_all(want.into_values().map(|p| pass(w.clone(), &api_pods, p))).await;
        // Mirrors of pods gone from the folder, now and then.
        if ticks.is_multiple_of(5) && ready(&api_pods) {
            remove_stale_mirrors(&w, &api_pods, &running.uids()).await;
        }
        ticks += 1;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = rx.recv() => {
                // Let a burst of writes settle.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while rx.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(pod::RELIST) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_becomes_a_static_pod_bound_to_the_node() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";
        let pod = prepare(text, "n1").unwrap();
        assert_eq!(pod.name_any(), "web-n1");
        assert_eq!(pod.namespace().as_deref(), Some("default"));
        assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));
        let uid = pod.uid().unwrap();
        assert_eq!(uid.len(), 32);
        assert_eq!(pod.annotations()[HASH], uid);
        // Same manifest, same uid; another node or another manifest, another uid.
        assert_eq!(prepare(text, "n1").unwrap().uid().unwrap(), uid);
        assert_ne!(prepare(text, "n2").unwrap().uid().unwrap(), uid);
        let changed = text.replace("busybox", "busybox:v2");
        assert_ne!(prepare(&changed, "n1").unwrap().uid().unwrap(), uid);
        assert!(prepare("kind: Pod\nmetadata: {}\nspec: {containers: []}", "n1").is_err());
        assert!(prepare("{not yaml: [", "n1").is_err());
    }
}

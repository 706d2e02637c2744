//! The edgelet's local store: every pod spec the cloud gave it (with the status the edge
//! computed), every volume's data, the events not yet sent, the agent's configuration and its
//! certificates, in a folder. A write the edge acknowledges is on disk first (written to a
//! temporary file, synced, renamed over the old one, the folder synced), so a crash at any
//! moment leaves either the old or the new file, never half of one.
//!
//! Changes (pod statuses, pods gone, events, node status) are numbered in one sequence;
//! the cloud asks for what changed since the last number it has (a heartbeat) or follows the
//! sequence (a watch). The sequence starts again at each start of the edgelet, which the
//! `boot` stamp tells the cloud, so that it then takes everything.

use crate::proto::{NodeStatusReply, PodChange};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Why the store could not read or write.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An object is not what it should be.
    #[error("{0}")]
    Invalid(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one: a temporary
/// file synced, renamed over `path`, and the folder synced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(())
}

/// Removes a file and syncs its folder (a missing file is fine).
fn remove_synced(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(path)(e)),
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(dir))?;
    }
    Ok(())
}

/// The agent's configuration, kept across restarts (`edgelet.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AgentConfig {
    /// The node's name.
    pub node: String,
    /// The registry it joined (`host:port`; empty: not joined).
    pub registry: String,
    /// The address the cloud reaches this edgelet at.
    pub address: String,
    /// The path whose file system the node's disk use is measured on.
    pub disk_path: String,
    /// The CN the cloud's client certificate must carry.
    pub cloud_identity: String,
    /// The cloud's version at join.
    pub cloud_version: String,
}

impl AgentConfig {
    /// Whether the agent is a member of a cluster.
    pub fn joined(&self) -> bool {
        !self.registry.is_empty()
    }
}

/// A pod as the store keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Stored {
    pod: Pod,
    /// The last change from the cloud applied (its resourceVersion).
    applied: u64,
    /// The change number of its last status change (not kept across restarts).
    #[serde(skip)]
    changed: u64,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    pods: BTreeMap<String, Stored>,
    /// Pods whose deletion finished: uid → (change, namespace, name).
    gone: BTreeMap<String, (u64, String, String)>,
    /// Events not yet acknowledged, by change number.
    events: BTreeMap<u64, Value>,
    /// The node status and its change number.
    node: Option<(u64, NodeStatusReply)>,
    config: AgentConfig,
}

/// What changed since a point.
#[derive(Debug, Default)]
pub struct Changes {
    /// Pods whose status changed, and pods gone.
    pub pods: Vec<PodChange>,
    /// Events recorded, with their change numbers.
    pub events: Vec<(u64, Value)>,
    /// The node status with its change number, if it changed.
    pub node: Option<(u64, NodeStatusReply)>,
    /// The newest change number included.
    pub seq: u64,
}

/// The store.
pub struct Store {
    dir: PathBuf,
    inner: Mutex<Inner>,
    /// The newest change number (watchers wait on it).
    changed: tokio::sync::watch::Sender<u64>,
    /// A pod's spec or deletion changed (its uid), for the pod runner.
    pub pod_changed: tokio::sync::broadcast::Sender<String>,
    /// A Service or EndpointSlice the cloud shipped changed (the edge's rules and names).
    pub services_changed: tokio::sync::watch::Sender<u64>,
    /// When this store was opened (ns since the epoch): the change sequence's identity.
    pub boot: i64,
}

/// Most events kept waiting for the cloud.
const MAX_EVENTS: usize = 1000;
/// Most gone pods remembered (older ones are known to the cloud by then or resynced).
const MAX_GONE: usize = 10_000;

impl Store {
    /// Opens (or creates) the store in `dir`, reading every pod and the configuration.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let pods_dir = dir.join("pods");
        std::fs::create_dir_all(&pods_dir).map_err(io(&pods_dir))?;
        let mut inner = Inner::default();
        for entry in std::fs::read_dir(&pods_dir).map_err(io(&pods_dir))? {
            let path = entry.map_err(io(&pods_dir))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                // A temporary file of a write cut short: the old file stands.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let text = std::fs::read(&path).map_err(io(&path))?;
            match serde_json::from_slice::<Stored>(&text) {
                Ok(s) => {
                    inner.pods.insert(s.pod.uid().unwrap_or_default(), s);
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "an unreadable pod file; ignored")
                }
            }
        }
        let cfg = dir.join("edgelet.json");
        if let Ok(text) = std::fs::read(&cfg) {
            inner.config = serde_json::from_slice(&text)
                .map_err(|e| StoreError::Invalid(format!("{}: {e}", cfg.display())))?;
        }
        // Every pod counts as changed at start: the cloud takes them all (a new boot).
        let mut seq = 0;
        for s in inner.pods.values_mut() {
            seq += 1;
            s.changed = seq;
        }
        inner.seq = seq;
        Ok(Store {
            dir: dir.to_owned(),
            inner: Mutex::new(inner),
            changed: tokio::sync::watch::Sender::new(seq),
            pod_changed: tokio::sync::broadcast::channel(1024).0,
            services_changed: tokio::sync::watch::Sender::new(0),
            boot: jiff::Timestamp::now().as_nanosecond() as i64,
        })
    }

    /// The store's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn pod_path(&self, uid: &str) -> PathBuf {
        self.dir.join("pods").join(format!("{uid}.json"))
    }

    fn persist(&self, s: &Stored) -> Result<(), StoreError> {
        let uid = s.pod.uid().unwrap_or_default();
        let bytes = serde_json::to_vec(s).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_atomic(&self.pod_path(&uid), &bytes)
    }

    fn bump(&self, inner: &mut Inner) -> u64 {
        inner.seq += 1;
        inner.seq
    }

    fn announce(&self, seq: u64) {
        self.changed.send_replace(seq);
    }

    /// The configuration.
    pub fn config(&self) -> AgentConfig {
        self.inner.lock().expect("store").config.clone()
    }

    /// Replaces the configuration (on disk first).
    pub fn set_config(&self, cfg: AgentConfig) -> Result<(), StoreError> {
        let bytes =
            serde_json::to_vec_pretty(&cfg).map_err(|e| StoreError::Invalid(e.to_string()))?;
        write_atomic(&self.dir.join("edgelet.json"), &bytes)?;
        self.inner.lock().expect("store").config = cfg;
        Ok(())
    }

    /// The certificate folder.
    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    /// Creates (`create`) or updates a pod from the cloud. A change at or below the last
    /// applied one (`seq`) is a duplicate: `Ok(false)`. The edge's status is kept.
    pub fn put_pod(&self, mut pod: Pod, seq: u64, create: bool) -> Result<bool, StoreError> {
        let uid = pod
            .uid()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| StoreError::Invalid("the pod has no uid".into()))?;
        // The uid names the pod's file: one plain name, as the apiserver's UUIDs are.
        if uid.starts_with('.')
            || !uid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(StoreError::Invalid(format!("invalid pod uid {uid:?}")));
        }
        if pod.metadata.name.as_deref().unwrap_or_default().is_empty() {
            return Err(StoreError::Invalid("the pod has no name".into()));
        }
        let stored = {
            let inner = self.inner.lock().expect("store");
            if inner.gone.contains_key(&uid) {
                return Ok(false);
            }
            match inner.pods.get(&uid) {
                Some(old) if create || seq <= old.applied => return Ok(false),
                Some(old) => {
                    pod.status = old.pod.status.clone();
                    // A deletion under way stays.
                    if old.pod.metadata.deletion_timestamp.is_some() {
                        pod.metadata.deletion_timestamp =
                            old.pod.metadata.deletion_timestamp.clone();
                        pod.metadata.deletion_grace_period_seconds =
                            old.pod.metadata.deletion_grace_period_seconds;
                    }
                    Stored {
                        pod,
                        applied: seq,
                        changed: old.changed,
                    }
                }
                None => {
                    pod.status = None;
                    pod.metadata.deletion_timestamp = None;
                    Stored {
                        pod,
                        applied: seq,
                        changed: 0,
                    }
                }
            }
        };
        self.persist(&stored)?;
        let seq = {
            let mut inner = self.inner.lock().expect("store");
            let n = self.bump(&mut inner);
            let mut stored = stored;
            stored.changed = n;
            inner.pods.insert(uid.clone(), stored);
            n
        };
        self.announce(seq);
        let _ = self.pod_changed.send(uid);
        Ok(true)
    }

    /// Starts deleting a pod (its containers get `grace` seconds). `Ok(false)`: no such pod
    /// (or it was already being deleted).
    pub fn delete_pod(&self, uid: &str, grace: i64) -> Result<bool, StoreError> {
        let stored = {
            let inner = self.inner.lock().expect("store");
            match inner.pods.get(uid) {
                Some(s) if s.pod.metadata.deletion_timestamp.is_none() => {
                    let mut s = s.clone();
                    s.pod.metadata.deletion_timestamp = Some(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
                    );
                    s.pod.metadata.deletion_grace_period_seconds = Some(grace.max(0));
                    s
                }
                _ => return Ok(false),
            }
        };
        self.persist(&stored)?;
        self.inner
            .lock()
            .expect("store")
            .pods
            .insert(uid.to_owned(), stored);
        let _ = self.pod_changed.send(uid.to_owned());
        Ok(true)
    }

    /// Every pod the edge holds.
    pub fn pods(&self) -> Vec<Pod> {
        let inner = self.inner.lock().expect("store");
        inner.pods.values().map(|s| s.pod.clone()).collect()
    }

    /// The pod `namespace/name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let inner = self.inner.lock().expect("store");
        inner
            .pods
            .values()
            .find(|s| s.pod.namespace().as_deref() == Some(namespace) && s.pod.name_any() == name)
            .map(|s| s.pod.clone())
    }

    /// The pod with this uid.
    pub fn pod_by_uid(&self, uid: &str) -> Option<Pod> {
        self.inner
            .lock()
            .expect("store")
            .pods
            .get(uid)
            .map(|s| s.pod.clone())
    }

    /// Merges a status change into the pod `namespace/name` (the kubelet worker's status
    /// write); the pod as it is now.
    pub fn patch_status(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        status: &Value,
    ) -> Result<Option<Pod>, StoreError> {
        let stored = {
            let inner = self.inner.lock().expect("store");
            let Some(s) = inner
                .pods
                .values()
                .find(|s| named(&s.pod, namespace, name, uid))
            else {
                return Ok(None);
            };
            let mut value =
                serde_json::to_value(&s.pod).map_err(|e| StoreError::Invalid(e.to_string()))?;
            merge(&mut value["status"], status);
            let pod: Pod = serde_json::from_value(value)
                .map_err(|e| StoreError::Invalid(format!("the status does not fit: {e}")))?;
            Stored {
                pod,
                applied: s.applied,
                changed: s.changed,
            }
        };
        self.persist(&stored)?;
        let uid = stored.pod.uid().unwrap_or_default();
        let pod = stored.pod.clone();
        let seq = {
            let mut inner = self.inner.lock().expect("store");
            let n = self.bump(&mut inner);
            let mut stored = stored;
            stored.changed = n;
            inner.pods.insert(uid, stored);
            n
        };
        self.announce(seq);
        Ok(Some(pod))
    }

    /// The pod's deletion finished (nothing of it runs): it goes from the store, and the
    /// cloud hears it is gone.
    pub fn finish(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Option<Pod>, StoreError> {
        let found = {
            let inner = self.inner.lock().expect("store");
            inner
                .pods
                .iter()
                .find(|(_, s)| named(&s.pod, namespace, name, uid))
                .map(|(uid, s)| (uid.clone(), s.pod.clone()))
        };
        let Some((uid, pod)) = found else {
            return Ok(None);
        };
        remove_synced(&self.pod_path(&uid))?;
        let seq = {
            let mut inner = self.inner.lock().expect("store");
            inner.pods.remove(&uid);
            let n = self.bump(&mut inner);
            inner
                .gone
                .insert(uid.clone(), (n, namespace.to_owned(), name.to_owned()));
            while inner.gone.len() > MAX_GONE {
                let oldest = inner
                    .gone
                    .iter()
                    .min_by_key(|(_, (s, _, _))| *s)
                    .map(|(u, _)| u.clone());
                if let Some(u) = oldest {
                    inner.gone.remove(&u);
                }
            }
            n
        };
        self.announce(seq);
        let _ = self.pod_changed.send(uid);
        Ok(Some(pod))
    }

    /// Records an event for the cloud (an event of the same name replaces the older one).
    pub fn push_event(&self, event: Value) {
        let seq = {
            let mut inner = self.inner.lock().expect("store");
            let name = event["metadata"]["name"].clone();
            inner
                .events
                .retain(|_, e| e["metadata"]["name"] != name || name.is_null());
            let n = self.bump(&mut inner);
            inner.events.insert(n, event);
            while inner.events.len() > MAX_EVENTS {
                inner.events.pop_first();
            }
            n
        };
        self.announce(seq);
    }

    /// The event named `name` in `namespace`, as last recorded.
    pub fn event(&self, namespace: &str, name: &str) -> Option<Value> {
        let inner = self.inner.lock().expect("store");
        inner
            .events
            .values()
            .find(|e| e["metadata"]["name"] == name && e["metadata"]["namespace"] == namespace)
            .cloned()
    }

    /// Sets the node status; announced when it changed.
    pub fn set_node(&self, status: NodeStatusReply) {
        let seq = {
            let mut inner = self.inner.lock().expect("store");
            if inner
                .node
                .as_ref()
                .is_some_and(|(_, s)| same_node(s, &status))
            {
                if let Some((_, s)) = inner.node.as_mut() {
                    *s = status;
                }
                return;
            }
            let n = self.bump(&mut inner);
            inner.node = Some((n, status));
            n
        };
        self.announce(seq);
    }

    /// The node status last set.
    pub fn node(&self) -> Option<NodeStatusReply> {
        self.inner
            .lock()
            .expect("store")
            .node
            .as_ref()
            .map(|(_, s)| s.clone())
    }

    /// What changed after `since` (everything when `since` is 0).
    pub fn changes_since(&self, since: u64) -> Changes {
        let inner = self.inner.lock().expect("store");
        let mut pods: Vec<PodChange> = inner
            .pods
            .iter()
            .filter(|(_, s)| s.changed > since || since == 0)
            .map(|(uid, s)| PodChange {
                seq: s.changed,
                namespace: s.pod.namespace().unwrap_or_default(),
                name: s.pod.name_any(),
                uid: uid.clone(),
                pod: serde_json::to_vec(&s.pod).unwrap_or_default(),
                gone: false,
            })
            .chain(inner.gone.iter().filter(|(_, (s, _, _))| *s > since).map(
                |(uid, (s, ns, name))| PodChange {
                    seq: *s,
                    namespace: ns.clone(),
                    name: name.clone(),
                    uid: uid.clone(),
                    pod: Vec::new(),
                    gone: true,
                },
            ))
            .collect();
        pods.sort_by_key(|p| p.seq);
        Changes {
            pods,
            events: inner
                .events
                .range(since + 1..)
                .map(|(s, e)| (*s, e.clone()))
                .collect(),
            node: inner
                .node
                .as_ref()
                .filter(|(s, _)| *s > since || since == 0)
                .cloned(),
            seq: inner.seq,
        }
    }

    /// A receiver of the newest change number.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Writes an object the cloud shipped as it sent it: for volumes a ConfigMap, a Secret or
    /// a token, with its data as files in the tree `volumes/<kind>/<namespace>/<name>/<key>`;
    /// for names and Service rules a Service or an EndpointSlice. A change at or below the
    /// stored one (`seq`) changes nothing: `Ok(false)`.
    pub fn put_volume(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        object: Value,
        seq: u64,
    ) -> Result<bool, StoreError> {
        check_object_key(kind, namespace, name)?;
        let base = self.dir.join("volumes").join(kind).join(namespace);
        let json = base.join(format!("{name}.json"));
        if let Ok(old) = std::fs::read(&json)
            && let Ok(old) = serde_json::from_slice::<Value>(&old)
            && old["seq"].as_u64().is_some_and(|s| s >= seq && seq > 0)
        {
            return Ok(false);
        }
        // The data as files (what an operator sees at the edge), then the object itself.
        let files = base.join(name);
        let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        for (key, v) in object["data"].as_object().into_iter().flatten() {
            let text = v.as_str().unwrap_or_default();
            let bytes = if kind == "secrets" {
                b64.decode(text).unwrap_or_default()
            } else {
                text.as_bytes().to_vec()
            };
            want.insert(key.clone(), bytes);
        }
        for (key, v) in object["binaryData"].as_object().into_iter().flatten() {
            want.insert(
                key.clone(),
                b64.decode(v.as_str().unwrap_or_default())
                    .unwrap_or_default(),
            );
        }
        if kind == "tokens" {
            want.insert(
                "token".into(),
                object["token"]
                    .as_str()
                    .unwrap_or_default()
                    .as_bytes()
                    .to_vec(),
            );
        }
        // Every key checked before anything is written: a refused object leaves nothing.
        if let Some(key) = want
            .keys()
            .find(|k| k.is_empty() || *k == "." || k.contains('/') || k.starts_with(".."))
        {
            return Err(StoreError::Invalid(format!("invalid data key {key:?}")));
        }
        std::fs::create_dir_all(&files).map_err(io(&files))?;
        for (key, bytes) in &want {
            write_atomic(&files.join(key), bytes)?;
        }
        if let Ok(list) = std::fs::read_dir(&files) {
            for e in list.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !want.contains_key(&n) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let wrapped = serde_json::json!({"seq": seq, "object": object});
        write_atomic(&json, &serde_json::to_vec(&wrapped).unwrap_or_default())?;
        if SERVICE_KINDS.contains(&kind) {
            self.services_changed.send_modify(|n| *n += 1);
        }
        Ok(true)
    }

    /// Removes a shipped object the cloud no longer has (and its files); `Ok(false)` when
    /// there was none.
    pub fn remove_volume(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<bool, StoreError> {
        check_object_key(kind, namespace, name)?;
        let base = self.dir.join("volumes").join(kind).join(namespace);
        let json = base.join(format!("{name}.json"));
        let existed = json.exists();
        let _ = std::fs::remove_file(&json);
        let _ = std::fs::remove_dir_all(base.join(name));
        if existed && SERVICE_KINDS.contains(&kind) {
            self.services_changed.send_modify(|n| *n += 1);
        }
        Ok(existed)
    }

    /// Every shipped object of `kind` (in `namespace`, or all), as last written.
    pub fn objects(&self, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let root = self.dir.join("volumes").join(kind);
        let namespaces: Vec<PathBuf> = match namespace {
            Some(ns) if !ns.contains('/') && !ns.starts_with('.') => vec![root.join(ns)],
            Some(_) => Vec::new(),
            None => std::fs::read_dir(&root)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect(),
        };
        let mut out = Vec::new();
        for dir in namespaces {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.extension().and_then(|x| x.to_str()) != Some("json") {
                    continue;
                }
                if let Ok(bytes) = std::fs::read(&p)
                    && let Ok(v) = serde_json::from_slice::<Value>(&bytes)
                {
                    out.push(v["object"].clone());
                }
            }
        }
        out
    }

    /// A volume's object as last written.
    pub fn volume(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        if [kind, namespace, name]
            .iter()
            .any(|p| p.contains('/') || p.starts_with('.'))
        {
            return None;
        }
        let json = self
            .dir
            .join("volumes")
            .join(kind)
            .join(namespace)
            .join(format!("{name}.json"));
        let text = std::fs::read(json).ok()?;
        let v: Value = serde_json::from_slice(&text).ok()?;
        Some(v["object"].clone())
    }
}

/// The kinds the cloud ships: volumes' and Services'.
pub const KINDS: [&str; 5] = [
    "configmaps",
    "secrets",
    "tokens",
    "services",
    "endpointslices",
];
/// The kinds behind the edge's Service rules and names.
const SERVICE_KINDS: [&str; 2] = ["services", "endpointslices"];

fn check_object_key(kind: &str, namespace: &str, name: &str) -> Result<(), StoreError> {
    for part in [kind, namespace, name] {
        if part.is_empty() || part.contains('/') || part.starts_with('.') {
            return Err(StoreError::Invalid(format!(
                "invalid object name part {part:?}"
            )));
        }
    }
    if !KINDS.contains(&kind) {
        return Err(StoreError::Invalid(format!(
            "unknown kind {kind:?} ({})",
            KINDS.join(", ")
        )));
    }
    Ok(())
}

/// Whether `pod` is `namespace/name` (with this uid, when one is given: a pod replaced under
/// the same name is another pod).
fn named(pod: &Pod, namespace: &str, name: &str, uid: Option<&str>) -> bool {
    pod.namespace().as_deref() == Some(namespace)
        && pod.name_any() == name
        && uid.is_none_or(|u| pod.uid().as_deref() == Some(u))
}

/// Whether two node statuses say the same (the figures that only drift do not count).
fn same_node(a: &NodeStatusReply, b: &NodeStatusReply) -> bool {
    a.memory_pressure == b.memory_pressure
        && a.disk_pressure == b.disk_pressure
        && a.ip == b.ip
        && a.runtime_version == b.runtime_version
        && a.pods == b.pods
        && a.runtime_problem == b.runtime_problem
}

/// JSON merge patch (RFC 7386) of `patch` into `target`.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Default::default());
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .unwrap()
    }

    #[test]
    fn pods_survive_a_reopen_and_duplicates_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert!(s.put_pod(pod("u1"), 5, true).unwrap());
        assert!(
            !s.put_pod(pod("u1"), 5, true).unwrap(),
            "a duplicate create"
        );
        assert!(!s.put_pod(pod("u1"), 4, false).unwrap(), "an older update");
        s.patch_status("default", "p", Some("u1"), &json!({"phase": "Running"}))
            .unwrap()
            .unwrap();
        // A temporary file left by a write cut short is ignored.
        std::fs::write(dir.path().join("pods/u2.tmp"), b"{half").unwrap();
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        let pods = s.pods();
        assert_eq!(pods.len(), 1);
        assert_eq!(
            pods[0].status.as_ref().unwrap().phase.as_deref(),
            Some("Running")
        );
        // Everything counts as changed after a start.
        assert_eq!(s.changes_since(0).pods.len(), 1);
        assert!(s.delete_pod("u1", 0).unwrap());
        assert!(s.finish("default", "p", Some("other")).unwrap().is_none());
        s.finish("default", "p", Some("u1")).unwrap().unwrap();
        let c = s.changes_since(1);
        assert!(c.pods.iter().any(|p| p.gone && p.uid == "u1"));
        assert!(
            !s.put_pod(pod("u1"), 9, true).unwrap(),
            "a gone pod does not come back"
        );
        drop(s);
        assert!(Store::open(dir.path()).unwrap().pods().is_empty());
    }

    #[test]
    fn volumes_are_files_per_kind_namespace_and_name() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let cm = json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "1", "b": "2"}});
        assert!(s.put_volume("configmaps", "default", "cfg", cm, 3).unwrap());
        let file = dir.path().join("volumes/configmaps/default/cfg/a");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "1");
        let cm2 = json!({"metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "9"}});
        assert!(
            !s.put_volume("configmaps", "default", "cfg", cm2.clone(), 3)
                .unwrap()
        );
        assert!(
            s.put_volume("configmaps", "default", "cfg", cm2, 4)
                .unwrap()
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "9");
        assert!(!dir.path().join("volumes/configmaps/default/cfg/b").exists());
        assert_eq!(
            s.volume("configmaps", "default", "cfg").unwrap()["data"]["a"],
            "9"
        );
        assert!(s.put_volume("configmaps", "..", "x", json!({}), 1).is_err());
        assert!(s.put_volume("pods", "default", "x", json!({}), 1).is_err());
    }

    #[test]
    fn a_uid_or_data_key_that_is_no_plain_name_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let s = Store::open(&store).unwrap();
        for uid in ["../../escape", "a/b", ".hidden", "x\0y"] {
            assert!(s.put_pod(pod(uid), 1, true).is_err(), "{uid:?}");
        }
        let cm = json!({"metadata": {"name": "cfg"}, "data": {"a": "1", "../b": "2"}});
        assert!(s.put_volume("configmaps", "default", "cfg", cm, 1).is_err());
        assert!(!store.join("volumes/configmaps/default/cfg").exists());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["store"]);
        assert!(s.pods().is_empty());
    }
}

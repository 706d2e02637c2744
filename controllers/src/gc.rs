//! The garbage collector and the resource discovery it shares with the namespace
//! controller. Every resource the API serves (built-in and custom, found by discovery and
//! refreshed every 30 s) is watched for metadata only; the ownerReference graph lives in
//! memory, with each owner's dependents. A sweep after changes looks at the objects the
//! changes concern (an object changed, its dependents, its owners and theirs; every object
//! every 30 s and again after a step failed), as upstream's collector queues only the items
//! an event concerns: at 150,000 pods, sweeping the whole graph after every burst was a
//! steady share of the CPU. It deletes dependents whose owners are all gone
//! (background), drives foreground deletion (`foregroundDeletion` finalizer: delete the
//! dependents, then release the owner) and orphaning (`orphan` finalizer: strip the
//! ownerReferences, then release the owner). A sweep's steps run 20 objects at a time, as
//! upstream's 20 workers, and an owner the API said is gone is not asked about again
//! (upstream's absentOwnerCache): one by one, each after a lookup of its owner, the 150,000
//! pods of the scale harness took 17 minutes to go.

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams,
    PropagationPolicy,
};
use kube::discovery::{Discovery, Scope, verbs};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A served resource that can be listed, watched and deleted.
#[derive(Clone, Debug)]
pub struct Served {
    /// Group, version, kind and plural.
    pub ar: ApiResource,
    /// Whether it lives in namespaces.
    pub namespaced: bool,
}

/// The preferred version of every resource that supports list, watch and delete.
pub async fn served(client: &Client) -> kube::Result<Vec<Served>> {
    let d = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for g in d.groups() {
        for (ar, caps) in g.recommended_resources() {
            if !caps.subresources.is_empty() && ar.plural.contains('/') {
                continue;
            }
            if [verbs::LIST, verbs::WATCH, verbs::DELETE]
                .iter()
                .all(|v| caps.supports_operation(v))
            {
                out.push(Served {
                    ar,
                    namespaced: caps.scope == Scope::Namespaced,
                });
            }
        }
    }
    Ok(out)
}

/// What the collector knows about one object.
#[derive(Clone, Debug)]
struct Meta {
    res: usize,
    namespace: Option<String>,
    name: String,
    owners: Vec<OwnerReference>,
    finalizers: Vec<String>,
    deleting: bool,
}

#[derive(Default)]
struct Graph {
    resources: Vec<Served>,
    objects: HashMap<String, Meta>,
    /// The dependents of each owner uid (whether the graph has the owner or not).
    children: Children,
    /// The uids whose steps may have changed since the last sweep.
    dirty: HashSet<String>,
}

/// Dependents by owner uid.
type Children = HashMap<String, HashSet<String>>;

impl Graph {
    /// Adds or updates an object.
    fn put(&mut self, uid: String, meta: Meta) {
        let mut owners: Vec<String> = meta.owners.iter().map(|o| o.uid.clone()).collect();
        for o in &owners {
            self.children
                .entry(o.clone())
                .or_default()
                .insert(uid.clone());
        }
        if let Some(old) = self.objects.insert(uid.clone(), meta) {
            for o in old.owners {
                if !owners.contains(&o.uid) {
                    self.unlink(&o.uid, &uid);
                    owners.push(o.uid);
                }
            }
        }
        self.touch(&uid, &owners);
    }

    /// Forgets an object.
    fn remove(&mut self, uid: &str) {
        let Some(old) = self.objects.remove(uid) else {
            return;
        };
        let owners: Vec<String> = old.owners.into_iter().map(|o| o.uid).collect();
        for o in &owners {
            self.unlink(o, uid);
        }
        self.touch(uid, &owners);
        // Tables keep their size when emptied: after a burst of objects comes and goes, the
        // memory is given back.
        if self.objects.len() < self.objects.capacity() / 4 {
            self.objects.shrink_to_fit();
        }
    }

    fn unlink(&mut self, owner: &str, dependent: &str) {
        if let Some(deps) = self.children.get_mut(owner) {
            deps.remove(dependent);
            if deps.is_empty() {
                self.children.remove(owner);
            }
        }
    }

    /// Marks for the next sweep what a change of `uid` (with these owners, before and after)
    /// concerns: the object; its dependents (one of their owners came or went) and their
    /// other owners (a foreground owner looks at whether its dependent has another owner);
    /// its owners (waiting for it in the foreground, or orphaning it) and theirs (a
    /// foreground owner looks at its dependents' dependents).
    fn touch(&mut self, uid: &str, owners: &[String]) {
        self.dirty.insert(uid.to_owned());
        for d in self.children.get(uid).into_iter().flatten() {
            self.dirty.insert(d.clone());
            if let Some(m) = self.objects.get(d) {
                self.dirty.extend(m.owners.iter().map(|o| o.uid.clone()));
            }
        }
        for o in owners {
            self.dirty.insert(o.clone());
            if let Some(m) = self.objects.get(o) {
                self.dirty.extend(m.owners.iter().map(|g| g.uid.clone()));
            }
        }
    }

    /// The steps for the objects marked since the last sweep.
    fn sweep_dirty(&mut self) -> Vec<Step> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut steps = Vec::new();
        for uid in &dirty {
            if let Some(m) = self.objects.get(uid) {
                steps_for(&self.objects, &self.children, uid, m, &mut steps);
            }
        }
        steps
    }
}

/// An action the sweep decided on.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Delete a dependent whose owners all seem gone (background), once the API confirms it.
    Collect(String),
    /// Delete a dependent of an owner deleted in the foreground (with this propagation).
    Delete(String, &'static str),
    /// Make an object's references to these owners non-blocking (breaks foreground cycles).
    Unblock(String, Vec<String>),
    /// Remove ownerReferences to these uids from an object.
    Unown(String, Vec<String>),
    /// Remove a finalizer from an object.
    Release(String, &'static str),
}

impl Step {
    /// The object the step acts on.
    fn uid(&self) -> &str {
        match self {
            Step::Collect(u)
            | Step::Delete(u, _)
            | Step::Unblock(u, _)
            | Step::Unown(u, _)
            | Step::Release(u, _) => u,
        }
    }
}

fn foreground(m: &Meta) -> bool {
    m.finalizers.iter().any(|f| f == "foregroundDeletion")
}

/// The steps a whole graph calls for (pure; the unit tests drive it).
#[cfg(test)]
fn sweep(objects: &HashMap<String, Meta>) -> Vec<Step> {
    let mut children = Children::new();
    for (uid, m) in objects {
        for o in &m.owners {
            children
                .entry(o.uid.clone())
                .or_default()
                .insert(uid.clone());
        }
    }
    let mut steps = Vec::new();
    for (uid, m) in objects {
        steps_for(objects, &children, uid, m, &mut steps);
    }
    steps
}

/// The steps one object calls for.
fn steps_for(
    objects: &HashMap<String, Meta>,
    children: &Children,
    uid: &String,
    m: &Meta,
    steps: &mut Vec<Step>,
) {
    let deps_of = |uid: &str| -> Vec<&str> {
        children
            .get(uid)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect()
    };
    {
        if m.deleting && foreground(m) {
            // Upstream's processDeletingDependentsItem: the owner waits only for dependents
            // whose reference to it blocks; each dependent is deleted (in the foreground if
            // it has dependents itself) unless another owner still holds it.
            let deps = deps_of(uid);
            let blocking = deps.iter().any(|d| {
                objects.get(*d).is_some_and(|dm| {
                    dm.owners
                        .iter()
                        .any(|o| o.uid == *uid && o.block_owner_deletion == Some(true))
                })
            });
            if !blocking {
                steps.push(Step::Release(uid.clone(), "foregroundDeletion"));
            }
            for d in deps {
                let Some(dm) = objects.get(d) else { continue };
                if dm.deleting {
                    continue;
                }
                let solid = dm
                    .owners
                    .iter()
                    .any(|o| objects.get(&o.uid).is_some_and(|om| !om.deleting));
                if solid {
                    steps.push(Step::Unown(d.to_owned(), vec![uid.clone()]));
                    continue;
                }
                let grandchildren = deps_of(d);
                if grandchildren.is_empty() {
                    steps.push(Step::Delete(d.to_owned(), "Background"));
                    continue;
                }
                // A dependent of its own that waits for its dependents would close a cycle:
                // its references to waiting owners stop blocking first (upstream's
                // unblockOwnerReferences).
                if grandchildren.iter().any(|g| {
                    objects
                        .get(*g)
                        .is_some_and(|gm| gm.deleting && foreground(gm))
                }) {
                    let waiting: Vec<String> = dm
                        .owners
                        .iter()
                        .filter(|o| {
                            objects
                                .get(&o.uid)
                                .is_some_and(|om| om.deleting && foreground(om))
                        })
                        .map(|o| o.uid.clone())
                        .collect();
                    steps.push(Step::Unblock(d.to_owned(), waiting));
                }
                steps.push(Step::Delete(d.to_owned(), "Foreground"));
            }
            return;
        }
        if m.deleting && m.finalizers.iter().any(|f| f == "orphan") {
            let deps = deps_of(uid);
            if deps.is_empty() {
                steps.push(Step::Release(uid.clone(), "orphan"));
            }
            for d in deps {
                steps.push(Step::Unown(d.to_owned(), vec![uid.clone()]));
            }
            return;
        }
        if m.owners.is_empty() || m.deleting {
            return;
        }
        let gone: Vec<String> = m
            .owners
            .iter()
            .filter(|o| !objects.contains_key(&o.uid))
            .map(|o| o.uid.clone())
            .collect();
        if gone.len() == m.owners.len() {
            steps.push(Step::Collect(uid.clone()));
        } else if !gone.is_empty() {
            steps.push(Step::Unown(uid.clone(), gone));
        }
    }
}

/// Objects whose steps are applied at once (upstream's `--concurrent-gc-syncs` default).
const WORKERS: usize = 20;

/// How many owner uids the API confirmed gone are remembered.
const ABSENT_KEPT: usize = 10_000;

struct Gc {
    client: Client,
    graph: Mutex<Graph>,
    dirty: Notify,
    /// Owner uids the API said are gone (upstream's absentOwnerCache). A uid never comes
    /// back, so the pods of a deleted ReplicaSet need one lookup of it, not one each.
    absent: Mutex<HashSet<String>>,
}

/// A sweep's steps by object, in the order the sweep gave them: steps on one object run in
/// turn (an `Unblock` before its `Delete`), different objects at once.
fn by_object(steps: Vec<Step>) -> Vec<(String, Vec<Step>)> {
    let mut out: Vec<(String, Vec<Step>)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for step in steps {
        let uid = step.uid().to_owned();
        match at.get(&uid) {
            Some(&i) => out[i].1.push(step),
            None => {
                at.insert(uid.clone(), out.len());
                out.push((uid, vec![step]));
            }
        }
    }
    out
}

impl Gc {
    fn api(&self, m: &Meta) -> Api<DynamicObject> {
        let g = self.graph.lock().expect("gc graph");
        let ar = &g.resources[m.res].ar;
        match &m.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    /// Whether an owner the graph misses is really gone (the watch may lag): asks the API
    /// unless it already said so.
    async fn owner_gone(&self, dependent: &Meta, owner: &OwnerReference) -> bool {
        if self.absent.lock().expect("gc absent").contains(&owner.uid) {
            return true;
        }
        let (group, version) = match owner.api_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), owner.api_version.clone()),
        };
        let found = {
            let g = self.graph.lock().expect("gc graph");
            g.resources
                .iter()
                .find(|s| s.ar.group == group && s.ar.kind == owner.kind)
                .cloned()
        };
        let Some(s) = found else {
            return false;
        };
        let mut ar = s.ar.clone();
        ar.version = version;
        ar.api_version = owner.api_version.clone();
        let api: Api<DynamicObject> = match (&dependent.namespace, s.namespaced) {
            (Some(ns), true) => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        };
        let gone = match api.get_opt(&owner.name).await {
            Ok(None) => true,
            Ok(Some(o)) => o.uid().as_deref() != Some(owner.uid.as_str()),
            Err(_) => false,
        };
        if gone {
            let mut absent = self.absent.lock().expect("gc absent");
            if absent.len() >= ABSENT_KEPT {
                absent.clear();
            }
            absent.insert(owner.uid.clone());
        }
        gone
    }

    /// Applies a sweep's steps, [`WORKERS`] objects at a time; returns the objects whose
    /// step failed.
    async fn apply_all(&self, steps: Vec<Step>) -> Vec<String> {
        futures::stream::iter(by_object(steps))
            .map(|(uid, steps)| async move {
                for step in steps {
                    if let Err(e) = self.apply(step).await {
                        tracing::warn!(error = %e, "garbage collection step failed");
                        return Some(uid);
                    }
                }
                None
            })
            .buffer_unordered(WORKERS)
            .filter_map(|failed| async move { failed })
            .collect()
            .await
    }

    /// Merge-patches an object's metadata (a gone object is fine).
    async fn patch_meta(&self, m: &Meta, patch: serde_json::Value) -> kube::Result<()> {
        ignore_gone(
            self.api(m)
                .patch(&m.name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map(|_| ()),
        )
    }

    async fn apply(&self, step: Step) -> kube::Result<()> {
        let meta = |uid: &str| {
            self.graph
                .lock()
                .expect("gc graph")
                .objects
                .get(uid)
                .cloned()
        };
        match step {
            Step::Collect(uid) => {
                let Some(m) = meta(&uid) else { return Ok(()) };
                for o in &m.owners {
                    if !self.owner_gone(&m, o).await {
                        return Ok(());
                    }
                }
                Box::pin(self.apply(Step::Delete(uid, "Background"))).await
            }
            Step::Unblock(uid, owners) => {
                let Some(m) = meta(&uid) else { return Ok(()) };
                let refs: Vec<OwnerReference> = m
                    .owners
                    .iter()
                    .cloned()
                    .map(|mut o| {
                        if owners.contains(&o.uid) {
                            o.block_owner_deletion = Some(false);
                        }
                        o
                    })
                    .collect();
                let patch = json!({"metadata": {"ownerReferences": refs, "uid": uid}});
                self.patch_meta(&m, patch).await
            }
            Step::Delete(uid, policy) => {
                let Some(m) = meta(&uid) else { return Ok(()) };
                let dp = DeleteParams {
                    propagation_policy: Some(if policy == "Foreground" {
                        PropagationPolicy::Foreground
                    } else {
                        PropagationPolicy::Background
                    }),
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                tracing::debug!(name = %m.name, "deleting dependent whose owners are gone");
                ignore_gone(self.api(&m).delete(&m.name, &dp).await.map(|_| ()))
            }
            Step::Unown(uid, owners) => {
                let Some(m) = meta(&uid) else { return Ok(()) };
                let keep: Vec<&OwnerReference> = m
                    .owners
                    .iter()
                    .filter(|o| !owners.contains(&o.uid))
                    .collect();
                // An empty list is dropped (null), as Go's omitempty does upstream.
                let refs = if keep.is_empty() {
                    json!(null)
                } else {
                    json!(keep)
                };
                let patch = json!({"metadata": {"ownerReferences": refs, "uid": uid}});
                self.patch_meta(&m, patch).await
            }
            Step::Release(uid, finalizer) => {
                let Some(m) = meta(&uid) else { return Ok(()) };
                let keep: Vec<&String> = m.finalizers.iter().filter(|f| *f != finalizer).collect();
                let patch = json!({"metadata": {"finalizers": keep, "uid": uid}});
                self.patch_meta(&m, patch).await
            }
        }
    }

    /// Watches one resource into the graph.
    async fn follow(self: Arc<Self>, index: usize, shutdown: CancellationToken) {
        let ar = self.graph.lock().expect("gc graph").resources[index]
            .ar
            .clone();
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.clone(), &ar);
        // The uids this resource has in the graph, and those a (re)list has shown so far.
        let mut seen: HashSet<String> = HashSet::new();
        let mut relisting: HashSet<String> = HashSet::new();
        // Metadata only, as upstream's garbage collector: owners, finalizers and deletion
        // are all it reads, and whole objects cost the apiserver and this process far more.
        let mut events = watcher(api, watcher::Config::default()).boxed();
        loop {
            let ev = tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = events.next() => ev,
            };
            let Some(ev) = ev else { return };
            let Ok(ev) = ev else {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            };
            let mut g = self.graph.lock().expect("gc graph");
            let listed = matches!(ev, watcher::Event::InitApply(_));
            match ev {
                watcher::Event::Init => relisting.clear(),
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                    let uid = o.uid().unwrap_or_default();
                    if listed {
                        relisting.insert(uid.clone());
                    }
                    seen.insert(uid.clone());
                    g.put(
                        uid,
                        Meta {
                            res: index,
                            namespace: o.namespace(),
                            name: o.name_any(),
                            owners: o.owner_references().to_vec(),
                            finalizers: o.finalizers().to_vec(),
                            deleting: o.metadata.deletion_timestamp.is_some(),
                        },
                    );
                }
                watcher::Event::Delete(o) => {
                    let uid = o.uid().unwrap_or_default();
                    seen.remove(&uid);
                    g.remove(&uid);
                    // Tables keep their size when emptied: after a burst of objects comes
                    // and goes, the memory is given back.
                    if seen.len() < seen.capacity() / 4 {
                        seen.shrink_to_fit();
                    }
                }
                watcher::Event::InitDone => {
                    for gone in seen.difference(&relisting) {
                        g.remove(gone);
                    }
                    seen = std::mem::take(&mut relisting);
                }
            }
            drop(g);
            self.dirty.notify_one();
        }
    }
}

fn ignore_gone(r: kube::Result<()>) -> kube::Result<()> {
    match r {
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => Ok(()),
        other => other,
    }
}

/// Runs the garbage collector until `shutdown`.
pub async fn run(client: Client, tasks: TaskTracker, shutdown: CancellationToken) {
    let gc = Arc::new(Gc {
        client: client.clone(),
        graph: Mutex::new(Graph::default()),
        dirty: Notify::new(),
        absent: Mutex::new(HashSet::new()),
    });
    let mut known: HashSet<(String, String)> = HashSet::new();
    let mut rediscover = tokio::time::interval(Duration::from_secs(30));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = rediscover.tick() => {
                // Every object is looked at again now and then (a step that found an owner
                // the graph misses, and the graph still misses it).
                {
                    let mut g = gc.graph.lock().expect("gc graph");
                    let Graph { objects, dirty, .. } = &mut *g;
                    dirty.extend(objects.keys().cloned());
                }
                gc.dirty.notify_one();
                match served(&client).await {
                    Ok(list) => {
                        for s in list {
                            if known.insert((s.ar.group.clone(), s.ar.plural.clone())) {
                                let index = {
                                    let mut g = gc.graph.lock().expect("gc graph");
                                    g.resources.push(s);
                                    g.resources.len() - 1
                                };
                                minik8s_task::spawn_on(
                                    &tasks,
                                    "garbagecollector-follow",
                                    gc.clone().follow(index, shutdown.clone()),
                                );
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "discovery failed"),
                }
            }
            _ = gc.dirty.notified() => {
                // Let a burst of events land before sweeping.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let steps = gc.graph.lock().expect("gc graph").sweep_dirty();
                let failed = gc.apply_all(steps).await;
                // Failed steps are tried again at the next sweep.
                if !failed.is_empty() {
                    gc.graph.lock().expect("gc graph").dirty.extend(failed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(owners: &[&str], finalizers: &[&str], deleting: bool) -> Meta {
        Meta {
            res: 0,
            namespace: Some("ns".into()),
            name: "x".into(),
            owners: owners
                .iter()
                .map(|u| OwnerReference {
                    uid: (*u).into(),
                    block_owner_deletion: Some(true),
                    ..Default::default()
                })
                .collect(),
            finalizers: finalizers.iter().map(|f| (*f).to_owned()).collect(),
            deleting,
        }
    }

    #[test]
    fn steps_on_one_object_keep_their_order() {
        let steps = vec![
            Step::Unblock("a".into(), vec!["o".into()]),
            Step::Collect("b".into()),
            Step::Delete("a".into(), "Foreground"),
            Step::Release("c".into(), "orphan"),
            Step::Unown("b".into(), vec!["p".into()]),
        ];
        assert_eq!(
            by_object(steps),
            vec![
                (
                    "a".to_owned(),
                    vec![
                        Step::Unblock("a".into(), vec!["o".into()]),
                        Step::Delete("a".into(), "Foreground"),
                    ]
                ),
                (
                    "b".to_owned(),
                    vec![
                        Step::Collect("b".into()),
                        Step::Unown("b".into(), vec!["p".into()]),
                    ]
                ),
                ("c".to_owned(), vec![Step::Release("c".into(), "orphan")]),
            ]
        );
    }

    #[test]
    fn orphans_of_deleted_owners_are_collected() {
        let objects: HashMap<String, Meta> = [("pod".to_owned(), obj(&["rs"], &[], false))].into();
        assert_eq!(sweep(&objects), vec![Step::Collect("pod".into())]);
    }

    #[test]
    fn foreground_deletes_dependents_then_releases_the_owner() {
        let mut objects: HashMap<String, Meta> = [
            ("rs".to_owned(), obj(&[], &["foregroundDeletion"], true)),
            ("pod".to_owned(), obj(&["rs"], &[], false)),
        ]
        .into();
        assert_eq!(
            sweep(&objects),
            vec![Step::Delete("pod".into(), "Background")]
        );
        objects.remove("pod");
        assert_eq!(
            sweep(&objects),
            vec![Step::Release("rs".into(), "foregroundDeletion")]
        );
    }

    #[test]
    fn orphaning_strips_owner_references_then_releases() {
        let mut objects: HashMap<String, Meta> = [
            ("rs".to_owned(), obj(&[], &["orphan"], true)),
            ("pod".to_owned(), obj(&["rs"], &[], false)),
        ]
        .into();
        assert_eq!(
            sweep(&objects),
            vec![Step::Unown("pod".into(), vec!["rs".into()])]
        );
        objects.get_mut("pod").unwrap().owners.clear();
        assert_eq!(sweep(&objects), vec![Step::Release("rs".into(), "orphan")]);
    }

    #[test]
    fn a_surviving_owner_keeps_the_dependent() {
        let objects: HashMap<String, Meta> = [
            ("a".to_owned(), obj(&[], &[], false)),
            ("pod".to_owned(), obj(&["a", "b"], &[], false)),
        ]
        .into();
        assert_eq!(
            sweep(&objects),
            vec![Step::Unown("pod".into(), vec!["b".into()])]
        );
    }

    #[test]
    fn a_foreground_cycle_is_broken_by_unblocking_references() {
        // pod1 → owned by pod3, pod2 → by pod1, pod3 → by pod2; pod1 deleted in the foreground.
        let mut objects: HashMap<String, Meta> = [
            (
                "pod1".to_owned(),
                obj(&["pod3"], &["foregroundDeletion"], true),
            ),
            ("pod2".to_owned(), obj(&["pod1"], &[], false)),
            ("pod3".to_owned(), obj(&["pod2"], &[], false)),
        ]
        .into();
        assert_eq!(
            sweep(&objects),
            vec![Step::Delete("pod2".into(), "Foreground")]
        );
        let pod2 = objects.get_mut("pod2").unwrap();
        pod2.deleting = true;
        pod2.finalizers = vec!["foregroundDeletion".into()];
        let mut steps = sweep(&objects);
        steps.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(
            steps,
            vec![
                Step::Delete("pod3".into(), "Foreground"),
                Step::Unblock("pod3".into(), vec!["pod2".into()]),
            ]
        );
        // Once pod3 no longer blocks pod2, pod2 is released.
        let pod3 = objects.get_mut("pod3").unwrap();
        pod3.owners[0].block_owner_deletion = Some(false);
        pod3.deleting = true;
        pod3.finalizers = vec!["foregroundDeletion".into()];
        assert!(sweep(&objects).contains(&Step::Release("pod2".into(), "foregroundDeletion")));
    }

    #[test]
    fn a_dependent_another_owner_holds_is_only_unowned() {
        let objects: HashMap<String, Meta> = [
            ("rs".to_owned(), obj(&[], &["foregroundDeletion"], true)),
            ("other".to_owned(), obj(&[], &[], false)),
            ("pod".to_owned(), obj(&["rs", "other"], &[], false)),
        ]
        .into();
        assert_eq!(
            sweep(&objects),
            vec![Step::Unown("pod".into(), vec!["rs".into()])]
        );
    }

    /// After any change, every object a sweep does not look at calls for the steps it called
    /// for when last looked at: the marks cover what a change concerns.
    #[test]
    fn sweeping_what_changed_misses_nothing() {
        let uids = ["a", "b", "c", "d", "e"];
        let mut seed: u64 = 7;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n
        };
        let sorted = |mut v: Vec<Step>| {
            v.sort_by_key(|s| format!("{s:?}"));
            v
        };
        let mut g = Graph::default();
        let mut last: HashMap<String, Vec<Step>> = HashMap::new();
        for _ in 0..5000 {
            let uid = uids[next(uids.len())];
            if next(4) == 0 {
                g.remove(uid);
            } else {
                let owners: Vec<&str> = uids
                    .iter()
                    .copied()
                    .filter(|o| *o != uid && next(3) == 0)
                    .collect();
                let finalizers: &[&str] = match next(4) {
                    0 => &["foregroundDeletion"],
                    1 => &["orphan"],
                    _ => &[],
                };
                let mut m = obj(&owners, finalizers, next(2) == 0);
                for o in &mut m.owners {
                    o.block_owner_deletion = Some(next(2) == 0);
                }
                g.put(uid.to_owned(), m);
            }
            let dirty: Vec<String> = g.dirty.iter().cloned().collect();
            for d in dirty {
                let mut steps = Vec::new();
                if let Some(m) = g.objects.get(&d) {
                    steps_for(&g.objects, &g.children, &d, m, &mut steps);
                }
                last.insert(d, sorted(steps));
            }
            g.sweep_dirty();
            for (uid, m) in &g.objects {
                let mut steps = Vec::new();
                steps_for(&g.objects, &g.children, uid, m, &mut steps);
                assert_eq!(sorted(steps), last[uid], "{uid}");
            }
        }
    }
}

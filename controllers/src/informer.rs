//! Informers: a reflector store kept in step with the API by a watch, driven by a task that
//! ends on shutdown. [`Informers`] shares one watch and one store per kind among all the
//! controllers of a manager, as client-go's shared informer factory does, and like the
//! upstream controller-manager's informers they drop `managedFields`, which no controller
//! reads and which is most of a stored object's memory. Controllers also subscribe to a
//! kind's changes ([`Informers::subscribe`]) instead of opening watches of their own, so one
//! pod change costs the apiserver one watch event, not one per controller.
//!
//! Each shared store is also indexed by namespace and by controller ([`Namespaced`]), as
//! client-go's informers keep their `NamespaceIndex` and upstream's controllers their
//! `PodControllerUIDIndex`: a controller reads one namespace's pods without walking every
//! pod of the cluster, a ReplicaSet its own pods without walking its namespace's, and a
//! Service its selector's pods among those holding its rarest label. The
//! index holds the store's own objects, so reading it costs no lookup per object.

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Starts watching `api` into a store (on `tasks`, until `shutdown`); returns the store.
pub fn start<K>(
    api: Api<K>,
    config: watcher::Config,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    start_with(api, config, tasks, shutdown, None)
}

/// What a shared informer keeps beside its store: its index (by namespace and controller),
/// its readiness (the store and the index both hold a full listing) and its change feed.
struct Shared<K> {
    names: Arc<RwLock<Names<K>>>,
    ready: tokio::sync::watch::Sender<bool>,
    changes: broadcast::Sender<Arc<K>>,
}

/// [`start`], also keeping `shared`: the index is updated after the store and before the
/// change is sent, so a subscriber woken by a change finds it in both.
fn start_with<K>(
    api: Api<K>,
    config: watcher::Config,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
    shared: Option<Shared<K>>,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stored = reader.clone();
    let stream = watcher(api, config)
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .default_backoff()
        .reflect(writer)
        .for_each(move |ev| {
            if let (Ok(e), Some(shared)) = (&ev, &shared) {
                let synced = shared.names.write().expect("names").apply(e, &stored);
                if synced {
                    shared.ready.send_replace(true);
                }
            }
            match ev {
                Ok(
                    watcher::Event::Apply(o)
                    | watcher::Event::InitApply(o)
                    | watcher::Event::Delete(o),
                ) => {
                    if let Some(shared) = &shared {
                        // No subscriber yet is fine: they start from the store.
                        let _ = shared.changes.send(Arc::new(o));
                    }
                }
                Ok(_) => {}
                // A LIST that fails keeps the informer unsynced (and its controllers waiting):
                // said as upstream's reflector says it. A watch that ends is routine.
                Err(e @ (watcher::Error::InitialListFailed(_) | watcher::Error::WatchStartFailed(_))) => {
                    tracing::warn!(error = %e, kind = %K::kind(&()), "listing or watching failed (retrying)");
                }
                Err(e) => {
                    tracing::debug!(error = %e, kind = %K::kind(&()), "watch error (retrying)");
                }
            }
            async {}
        });
    let shutdown = shutdown.clone();
    minik8s_task::spawn_on(tasks, "informer-watch", async move {
        tokio::select! {
            _ = stream => {}
            _ = shutdown.cancelled() => {}
        }
    });
    reader
}

/// Changes a subscriber may fall behind before it is resynced from the store.
const CHANGES_BUFFER: usize = 1_024;

/// One kind's shared store (read by namespace too), its readiness and its change feed.
#[derive(Clone)]
struct Entry<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    index: Namespaced<K>,
    ready: tokio::sync::watch::Receiver<bool>,
    changes: broadcast::Sender<Arc<K>>,
}

/// A kind's objects by namespace ("" for cluster-scoped ones) and by controller, following
/// the watch as kube-runtime's store does: a relist is gathered apart and swapped in whole.
/// The objects are the store's own (`Arc`s of the same allocations), looked up once per
/// change, so a namespace is read without a lookup per object.
struct Names<K> {
    live: Index<K>,
    /// The names a relist under way has seen; its objects are the store's once it is done.
    relist: Vec<(String, String, String)>,
}

impl<K> Default for Names<K> {
    fn default() -> Self {
        Names {
            live: Index::default(),
            relist: Vec::new(),
        }
    }
}

/// Objects by namespace and name, each with the UID of its controller ("" for none), and
/// their names by namespace and controller: client-go's `NamespaceIndex` and upstream's
/// `PodControllerUIDIndex`, whose orphan key per namespace is "" here. Their names also by
/// namespace, label and value, so a selector's objects are found among the fewest candidates.
struct Index<K> {
    by_namespace: HashMap<String, HashMap<Arc<str>, Controlled<K>>>,
    by_controller: HashMap<String, HashMap<Arc<str>, HashSet<Arc<str>>>>,
    by_label: HashMap<String, Labels>,
}

/// A namespace's names by label and value.
type Labels = HashMap<String, HashMap<String, HashSet<Arc<str>>>>;

/// An object with the UID of its controller ("" for none).
type Controlled<K> = (Arc<str>, Arc<K>);

impl<K> Default for Index<K> {
    fn default() -> Self {
        Index {
            by_namespace: HashMap::new(),
            by_controller: HashMap::new(),
            by_label: HashMap::new(),
        }
    }
}

impl<K: Resource> Index<K> {
    fn insert(&mut self, ns: &str, name: &str, controller: &str, object: Arc<K>) {
        let names = self.by_namespace.entry(ns.to_owned()).or_default();
        let (name, was) = match names.get_key_value(name) {
            Some((n, (c, o))) => {
                if o.labels() != object.labels() {
                    Self::unlabel(&mut self.by_label, ns, n, o.labels());
                    Self::label(&mut self.by_label, ns, n, object.labels());
                }
                (n.clone(), Some(c.clone()))
            }
            None => {
                let name: Arc<str> = Arc::from(name);
                Self::label(&mut self.by_label, ns, &name, object.labels());
                (name, None)
            }
        };
        let controller = match was {
            Some(c) if *c == *controller => c,
            was => {
                let in_ns = self.by_controller.entry(ns.to_owned()).or_default();
                if let Some(c) = was {
                    Self::unlink(in_ns, &c, &name);
                }
                let controller: Arc<str> = in_ns
                    .get_key_value(controller)
                    .map_or_else(|| controller.into(), |(c, _)| c.clone());
                in_ns
                    .entry(controller.clone())
                    .or_default()
                    .insert(name.clone());
                controller
            }
        };
        names.insert(name, (controller, object));
    }

    fn remove(&mut self, ns: &str, name: &str) {
        let Some(names) = self.by_namespace.get_mut(ns) else {
            return;
        };
        let Some((controller, object)) = names.remove(name) else {
            return;
        };
        if names.is_empty() {
            self.by_namespace.remove(ns);
        }
        Self::unlabel(&mut self.by_label, ns, name, object.labels());
        if let Some(in_ns) = self.by_controller.get_mut(ns) {
            Self::unlink(in_ns, &controller, name);
            if in_ns.is_empty() {
                self.by_controller.remove(ns);
            }
        }
    }

    fn label(
        by_label: &mut HashMap<String, Labels>,
        ns: &str,
        name: &Arc<str>,
        labels: &BTreeMap<String, String>,
    ) {
        if labels.is_empty() {
            return;
        }
        let in_ns = by_label.entry(ns.to_owned()).or_default();
        for (k, v) in labels {
            in_ns
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default()
                .insert(name.clone());
        }
    }

    fn unlabel(
        by_label: &mut HashMap<String, Labels>,
        ns: &str,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) {
        let Some(in_ns) = by_label.get_mut(ns) else {
            return;
        };
        for (k, v) in labels {
            let Some(values) = in_ns.get_mut(k) else {
                continue;
            };
            if let Some(names) = values.get_mut(v) {
                names.remove(name);
                if names.is_empty() {
                    values.remove(v);
                }
            }
            if values.is_empty() {
                in_ns.remove(k);
            }
        }
        if in_ns.is_empty() {
            by_label.remove(ns);
        }
    }

    fn unlink(in_ns: &mut HashMap<Arc<str>, HashSet<Arc<str>>>, controller: &str, name: &str) {
        if let Some(names) = in_ns.get_mut(controller) {
            names.remove(name);
            if names.is_empty() {
                in_ns.remove(controller);
            }
        }
    }
}

impl<K> Names<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// Applies a watch event that `store` has applied already; true when a listing is
    /// complete.
    fn apply(&mut self, event: &watcher::Event<K>, store: &Store<K>) -> bool {
        fn key<K: Resource>(o: &K) -> (&str, &str, &str) {
            let m = o.meta();
            (
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default(),
                crate::util::controller_of(m).map_or("", |c| c.uid.as_str()),
            )
        }
        let stored = |ns: &str, name: &str| store.get(&ObjectRef::new(name).within(ns));
        match event {
            watcher::Event::Apply(o) => {
                let (ns, name, controller) = key(o);
                if let Some(object) = stored(ns, name) {
                    self.live.insert(ns, name, controller, object);
                }
            }
            watcher::Event::Delete(o) => {
                let (ns, name, _) = key(o);
                self.live.remove(ns, name);
            }
            watcher::Event::Init => self.relist.clear(),
            watcher::Event::InitApply(o) => {
                let (ns, name, controller) = key(o);
                self.relist
                    .push((ns.to_owned(), name.to_owned(), controller.to_owned()));
            }
            watcher::Event::InitDone => {
                // The store holds the listing now.
                let mut live = Index::default();
                for (ns, name, controller) in std::mem::take(&mut self.relist) {
                    if let Some(object) = stored(&ns, &name) {
                        live.insert(&ns, &name, &controller, object);
                    }
                }
                self.live = live;
                return true;
            }
        }
        false
    }
}

/// A kind's shared store read by namespace, and by controller.
#[derive(Clone)]
pub struct Namespaced<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    names: Arc<RwLock<Names<K>>>,
}

impl<K> Namespaced<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The objects of namespace `ns`, as the store holds them.
    pub fn list(&self, ns: &str) -> Vec<Arc<K>> {
        self.list_selected(ns, &BTreeMap::new())
    }

    /// The objects of namespace `ns` whose labels hold every label and value of `selector`
    /// (every object for an empty one), found among the names the rarest of its labels holds.
    pub fn list_selected(&self, ns: &str, selector: &BTreeMap<String, String>) -> Vec<Arc<K>> {
        let names = self.names.read().expect("names");
        let Some(objects) = names.live.by_namespace.get(ns) else {
            return Vec::new();
        };
        if selector.is_empty() {
            return objects.values().map(|(_, o)| o.clone()).collect();
        }
        let labels = names.live.by_label.get(ns);
        let mut rarest: Option<&HashSet<Arc<str>>> = None;
        for (k, v) in selector {
            let Some(holding) = labels
                .and_then(|l| l.get(k))
                .and_then(|values| values.get(v))
            else {
                return Vec::new();
            };
            if rarest.is_none_or(|r| holding.len() < r.len()) {
                rarest = Some(holding);
            }
        }
        rarest
            .into_iter()
            .flatten()
            .filter_map(|n| objects.get(n))
            .filter(|(_, o)| selector.iter().all(|(k, v)| o.labels().get(k) == Some(v)))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The objects of namespace `ns` controlled by the object of UID `controller`, then
    /// those no controller controls (it may adopt them), as the store holds them: upstream's
    /// `FilterPodsByOwner` with orphans, which a controller reads instead of its namespace.
    pub fn controlled_by_or_orphans(&self, ns: &str, controller: &str) -> Vec<Arc<K>> {
        let names = self.names.read().expect("names");
        let (Some(objects), Some(in_ns)) = (
            names.live.by_namespace.get(ns),
            names.live.by_controller.get(ns),
        ) else {
            return Vec::new();
        };
        let of = |c: &str| in_ns.get(c).into_iter().flatten();
        of(controller)
            .chain(of(""))
            .filter_map(|n| objects.get(n).map(|(_, o)| o.clone()))
            .collect()
    }

    /// `store` read by namespace, its index built from `events` (for tests).
    #[cfg(test)]
    pub(crate) fn following(store: Store<K>, events: &[watcher::Event<K>]) -> Self {
        let mut names = Names::default();
        for e in events {
            names.apply(e, &store);
        }
        Namespaced {
            store,
            names: Arc::new(RwLock::new(names)),
        }
    }
}

/// Cluster-wide informers shared by the controllers of one manager: the first request for a
/// kind starts its watch, later ones get the same store.
#[derive(Clone)]
pub struct Informers {
    client: Client,
    tasks: TaskTracker,
    shutdown: CancellationToken,
    stores: Arc<Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>>,
}

impl Informers {
    /// Informers on `client` whose watches run on `tasks` until `shutdown`.
    pub fn new(client: Client, tasks: TaskTracker, shutdown: CancellationToken) -> Self {
        Informers {
            client,
            tasks,
            shutdown,
            stores: Arc::default(),
        }
    }

    /// The shared store of every object of kind `K` (all namespaces), once it has listed
    /// them (or at shutdown).
    pub async fn all<K>(&self) -> Store<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.namespaced::<K>().await.store
    }

    /// The shared store of every `K`, read by namespace, once it has listed them (or at
    /// shutdown).
    pub async fn namespaced<K>(&self) -> Namespaced<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let Entry {
            index, mut ready, ..
        } = self.entry::<K>();
        tokio::select! {
            _ = ready.wait_for(|r| *r) => {}
            _ = self.shutdown.cancelled() => {}
        }
        index
    }

    /// The store of `K` and its readiness, starting its watch on first use. Readiness is
    /// relayed through a watch channel set when both the store and its index hold a full
    /// listing (kube-runtime's `Store::wait_until_ready` wakes only one of several waiters).
    fn entry<K>(&self) -> Entry<K>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let mut stores = self.stores.lock().expect("informers");
        if let Some(entry) = stores
            .get(&TypeId::of::<K>())
            .and_then(|s| s.downcast_ref::<Entry<K>>())
        {
            return entry.clone();
        }
        let (changes, _) = broadcast::channel(CHANGES_BUFFER);
        let (tx, ready) = tokio::sync::watch::channel(false);
        let names = Arc::new(RwLock::new(Names::default()));
        let store = start_with(
            Api::<K>::all(self.client.clone()),
            watcher::Config::default(),
            &self.tasks,
            &self.shutdown,
            Some(Shared {
                names: names.clone(),
                ready: tx,
                changes: changes.clone(),
            }),
        );
        let entry = Entry {
            index: Namespaced { store, names },
            ready,
            changes,
        };
        stores.insert(TypeId::of::<K>(), Box::new(entry.clone()));
        entry
    }

    /// Every change of a `K` (the object as stored, or as it was when deleted), for
    /// `Controller::owns_shared_stream` and `watches_shared_stream`. A subscriber that falls
    /// more than the buffer behind gets every object in the store instead of what it missed
    /// (level-triggered, as a resync).
    pub fn subscribe<K>(&self) -> impl Stream<Item = Arc<K>> + Send + 'static
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let Entry {
            index: Namespaced { store, .. },
            changes,
            ..
        } = self.entry::<K>();
        let rx = changes.subscribe();
        futures::stream::unfold(
            (rx, store, VecDeque::new()),
            |(mut rx, store, mut pending)| async move {
                loop {
                    if let Some(o) = pending.pop_front() {
                        return Some((o, (rx, store, pending)));
                    }
                    match rx.recv().await {
                        Ok(o) => return Some((o, (rx, store, pending))),
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::debug!(missed = n, kind = %K::kind(&()), "subscriber lagged; resyncing");
                            pending.extend(store.state());
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        )
    }

    /// The task tracker the watches run on (for controllers' own watches).
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// The shutdown token.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(ns: &str, name: &str) -> Pod {
        controlled(ns, name, None)
    }

    fn controlled(ns: &str, name: &str, controller: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.owner_references = controller.map(|uid| {
            vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    uid: uid.into(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]
        });
        p
    }

    /// A store and its index, fed as the informer feeds them (the store first).
    struct Fed {
        writer: reflector::store::Writer<Pod>,
        index: Namespaced<Pod>,
    }

    impl Fed {
        fn new() -> Self {
            let (store, writer) = reflector::store();
            Fed {
                writer,
                index: Namespaced {
                    store,
                    names: Arc::default(),
                },
            }
        }

        fn apply(&mut self, e: watcher::Event<Pod>) -> bool {
            self.writer.apply_watcher_event(&e);
            let store = self.index.store.clone();
            self.index.names.write().unwrap().apply(&e, &store)
        }

        fn names_in(&self, ns: &str) -> Vec<String> {
            sorted(&self.index.list(ns))
        }

        fn of(&self, ns: &str, controller: &str) -> Vec<String> {
            sorted(&self.index.controlled_by_or_orphans(ns, controller))
        }
    }

    fn sorted(pods: &[Arc<Pod>]) -> Vec<String> {
        let mut v: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        v.sort();
        v
    }

    #[test]
    fn names_follow_the_watch_and_a_relist_replaces_them_whole() {
        let mut fed = Fed::new();
        assert!(!fed.apply(watcher::Event::Init));
        assert!(!fed.apply(watcher::Event::InitApply(pod("a", "p1"))));
        assert!(fed.names_in("a").is_empty(), "a listing counts once done");
        assert!(fed.apply(watcher::Event::InitDone));
        assert_eq!(fed.names_in("a"), ["p1"]);
        fed.apply(watcher::Event::Apply(pod("a", "p2")));
        fed.apply(watcher::Event::Apply(pod("b", "p3")));
        fed.apply(watcher::Event::Delete(pod("a", "p1")));
        assert_eq!(fed.names_in("a"), ["p2"]);
        assert_eq!(fed.names_in("b"), ["p3"]);
        // A relist (after a 410): the old objects stand until it is done, then only its own.
        fed.apply(watcher::Event::Init);
        fed.apply(watcher::Event::InitApply(pod("b", "p4")));
        assert_eq!(fed.names_in("a"), ["p2"]);
        assert!(fed.apply(watcher::Event::InitDone));
        assert!(fed.names_in("a").is_empty());
        assert_eq!(fed.names_in("b"), ["p4"]);
        fed.apply(watcher::Event::Delete(pod("b", "p4")));
        let names = fed.index.names.read().unwrap();
        assert!(
            names.live.by_namespace.is_empty()
                && names.live.by_controller.is_empty()
                && names.live.by_label.is_empty(),
            "an emptied namespace goes"
        );
    }

    fn labelled(ns: &str, name: &str, labels: &[(&str, &str)]) -> Pod {
        let mut p = pod(ns, name);
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    #[test]
    fn a_selector_finds_its_objects_by_label_as_labels_change() {
        let mut fed = Fed::new();
        let selected = |fed: &Fed, ns: &str, selector: &[(&str, &str)]| {
            let selector = selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            sorted(&fed.index.list_selected(ns, &selector))
        };
        fed.apply(watcher::Event::Init);
        for p in [
            labelled("a", "p1", &[("app", "web"), ("tier", "front")]),
            labelled("a", "p2", &[("app", "web")]),
            labelled("a", "p3", &[("app", "db")]),
            labelled("b", "p4", &[("app", "web")]),
            pod("a", "p5"),
        ] {
            fed.apply(watcher::Event::InitApply(p));
        }
        fed.apply(watcher::Event::InitDone);
        assert_eq!(selected(&fed, "a", &[("app", "web")]), ["p1", "p2"]);
        assert_eq!(
            selected(&fed, "a", &[("app", "web"), ("tier", "front")]),
            ["p1"]
        );
        assert!(selected(&fed, "a", &[("app", "web"), ("tier", "back")]).is_empty());
        assert!(selected(&fed, "a", &[("nope", "x")]).is_empty());
        assert_eq!(selected(&fed, "a", &[]), ["p1", "p2", "p3", "p5"]);
        // Relabelled, labels dropped, deleted: the index follows.
        fed.apply(watcher::Event::Apply(labelled(
            "a",
            "p3",
            &[("app", "web")],
        )));
        fed.apply(watcher::Event::Apply(pod("a", "p1")));
        assert_eq!(selected(&fed, "a", &[("app", "web")]), ["p2", "p3"]);
        assert!(selected(&fed, "a", &[("app", "db")]).is_empty());
        assert!(selected(&fed, "a", &[("tier", "front")]).is_empty());
        for name in ["p1", "p2", "p3", "p5"] {
            fed.apply(watcher::Event::Delete(pod("a", name)));
        }
        assert!(selected(&fed, "a", &[("app", "web")]).is_empty());
        assert_eq!(selected(&fed, "b", &[("app", "web")]), ["p4"]);
        let names = fed.index.names.read().unwrap();
        assert!(
            !names.live.by_label.contains_key("a"),
            "an unlabelled namespace goes"
        );
    }

    #[test]
    fn the_index_holds_the_stores_own_objects_as_they_change() {
        let mut fed = Fed::new();
        fed.apply(watcher::Event::Init);
        fed.apply(watcher::Event::InitDone);
        let mut p = pod("a", "p1");
        p.metadata.resource_version = Some("2".into());
        fed.apply(watcher::Event::Apply(p));
        let listed = fed.index.list("a");
        let stored = fed
            .index
            .store
            .get(&ObjectRef::new("p1").within("a"))
            .unwrap();
        assert!(
            Arc::ptr_eq(&listed[0], &stored),
            "one allocation, not a copy"
        );
        assert_eq!(listed[0].resource_version().as_deref(), Some("2"));
    }

    #[test]
    fn a_controller_reads_its_own_and_the_orphans_of_its_namespace_through_adoption_and_release() {
        let mut fed = Fed::new();
        fed.apply(watcher::Event::Init);
        for p in [
            controlled("a", "p1", Some("rs1")),
            controlled("a", "p2", None),
            controlled("a", "p3", Some("rs2")),
            // Another namespace's pod naming the same UID is not rs1's in "a".
            controlled("b", "p4", Some("rs1")),
        ] {
            fed.apply(watcher::Event::InitApply(p));
        }
        fed.apply(watcher::Event::InitDone);
        assert_eq!(fed.of("a", "rs1"), ["p1", "p2"]);
        assert_eq!(fed.of("b", "rs1"), ["p4"]);
        assert_eq!(fed.names_in("a"), ["p1", "p2", "p3"]);
        // Adopted by rs2, released by rs1.
        fed.apply(watcher::Event::Apply(controlled("a", "p2", Some("rs2"))));
        fed.apply(watcher::Event::Apply(controlled("a", "p1", None)));
        assert_eq!(fed.of("a", "rs1"), ["p1"]);
        assert_eq!(fed.of("a", "rs2"), ["p1", "p2", "p3"]);
        for name in ["p1", "p2", "p3"] {
            fed.apply(watcher::Event::Delete(pod("a", name)));
        }
        assert!(fed.of("a", "rs2").is_empty());
        let names = fed.index.names.read().unwrap();
        assert!(!names.live.by_namespace.contains_key("a"));
        assert!(!names.live.by_controller.contains_key("a"));
    }
}

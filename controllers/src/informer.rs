//! Informers: a reflector store kept in step with the API by a watch, driven by a task that
//! ends on shutdown. [`Informers`] shares one watch and one store per kind among all the
//! controllers of a manager, as client-go's shared informer factory does, and like the
//! upstream controller-manager's informers they drop `managedFields`, which no controller
//! reads and which is most of a stored object's memory. Controllers also subscribe to a
//! kind's changes ([`Informers::subscribe`]) instead of opening watches of their own, so one
//! pod change costs the apiserver one watch event, not one per controller.
//!
//! Each shared store also keeps its objects' names by namespace ([`Namespaced`]), as
//! client-go's informers keep their `NamespaceIndex`: a controller reads one namespace's
//! pods without walking every pod of the cluster.

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet, VecDeque};
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

/// What a shared informer keeps beside its store: the names by namespace, its readiness
/// (the store and the index both hold a full listing) and its change feed.
struct Shared<K> {
    names: Arc<RwLock<Names>>,
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
    let stream = watcher(api, config)
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .default_backoff()
        .reflect(writer)
        .for_each(move |ev| {
            if let (Ok(e), Some(shared)) = (&ev, &shared) {
                let synced = shared.names.write().expect("names").apply(e);
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

/// The names of a kind's objects by namespace ("" for cluster-scoped ones), following the
/// watch as kube-runtime's store does: a relist is gathered apart and swapped in whole.
#[derive(Default)]
struct Names {
    live: HashMap<String, HashSet<String>>,
    relist: HashMap<String, HashSet<String>>,
}

impl Names {
    /// Applies a watch event; true when a listing is complete.
    fn apply<K: Resource>(&mut self, event: &watcher::Event<K>) -> bool {
        let key = |o: &K| {
            (
                o.meta().namespace.clone().unwrap_or_default(),
                o.meta().name.clone().unwrap_or_default(),
            )
        };
        match event {
            watcher::Event::Apply(o) => {
                let (ns, name) = key(o);
                self.live.entry(ns).or_default().insert(name);
            }
            watcher::Event::Delete(o) => {
                let (ns, name) = key(o);
                if let Some(names) = self.live.get_mut(&ns) {
                    names.remove(&name);
                    if names.is_empty() {
                        self.live.remove(&ns);
                    }
                }
            }
            watcher::Event::Init => self.relist = HashMap::new(),
            watcher::Event::InitApply(o) => {
                let (ns, name) = key(o);
                self.relist.entry(ns).or_default().insert(name);
            }
            watcher::Event::InitDone => {
                self.live = std::mem::take(&mut self.relist);
                return true;
            }
        }
        false
    }
}

/// A kind's shared store read by namespace.
#[derive(Clone)]
pub struct Namespaced<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    names: Arc<RwLock<Names>>,
}

impl<K> Namespaced<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The objects of namespace `ns`, as the store holds them.
    pub fn list(&self, ns: &str) -> Vec<Arc<K>> {
        let names = self.names.read().expect("names");
        names.live.get(ns).map_or_else(Vec::new, |names| {
            names
                .iter()
                .filter_map(|n| self.store.get(&ObjectRef::new(n).within(ns)))
                .collect()
        })
    }

    /// `store` read by namespace, its index built from `events` (for tests).
    #[cfg(test)]
    pub(crate) fn following(store: Store<K>, events: &[watcher::Event<K>]) -> Self {
        let mut names = Names::default();
        for e in events {
            names.apply(e);
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
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p
    }

    fn names_in(names: &Names, ns: &str) -> Vec<String> {
        let mut v: Vec<String> = names.live.get(ns).into_iter().flatten().cloned().collect();
        v.sort();
        v
    }

    #[test]
    fn names_follow_the_watch_and_a_relist_replaces_them_whole() {
        let mut names = Names::default();
        assert!(!names.apply(&watcher::Event::<Pod>::Init));
        assert!(!names.apply(&watcher::Event::InitApply(pod("a", "p1"))));
        assert!(
            names_in(&names, "a").is_empty(),
            "a listing counts once done"
        );
        assert!(names.apply(&watcher::Event::<Pod>::InitDone));
        names.apply(&watcher::Event::Apply(pod("a", "p2")));
        names.apply(&watcher::Event::Apply(pod("b", "p3")));
        names.apply(&watcher::Event::Delete(pod("a", "p1")));
        assert_eq!(names_in(&names, "a"), ["p2"]);
        assert_eq!(names_in(&names, "b"), ["p3"]);
        // A relist (after a 410): the old names stand until it is done, then only its own.
        names.apply(&watcher::Event::<Pod>::Init);
        names.apply(&watcher::Event::InitApply(pod("b", "p4")));
        assert_eq!(names_in(&names, "a"), ["p2"]);
        assert!(names.apply(&watcher::Event::<Pod>::InitDone));
        assert!(names_in(&names, "a").is_empty());
        assert_eq!(names_in(&names, "b"), ["p4"]);
        names.apply(&watcher::Event::Delete(pod("b", "p4")));
        assert!(names.live.is_empty(), "an emptied namespace goes");
    }
}

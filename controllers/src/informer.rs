//! Informers: a reflector store kept in step with the API by a watch, driven by a task that
//! ends on shutdown. [`Informers`] shares one watch and one store per kind among all the
//! controllers of a manager, as client-go's shared informer factory does, and like the
//! upstream controller-manager's informers they drop `managedFields`, which no controller
//! reads and which is most of a stored object's memory. Controllers also subscribe to a
//! kind's changes ([`Informers::subscribe`]) instead of opening watches of their own, so one
//! pod change costs the apiserver one watch event, not one per controller.

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::any::{Any, TypeId};
use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
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

/// [`start`], also sending every changed or deleted object (after the store has it) to
/// `changes`.
fn start_with<K>(
    api: Api<K>,
    config: watcher::Config,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
    changes: Option<broadcast::Sender<Arc<K>>>,
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
            match ev {
                Ok(
                    watcher::Event::Apply(o)
                    | watcher::Event::InitApply(o)
                    | watcher::Event::Delete(o),
                ) => {
                    if let Some(tx) = &changes {
                        // No subscriber yet is fine: they start from the store.
                        let _ = tx.send(Arc::new(o));
                    }
                }
                Ok(_) => {}
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

/// One kind's shared store, its readiness and its change feed.
type Entry<K> = (
    Store<K>,
    tokio::sync::watch::Receiver<bool>,
    broadcast::Sender<Arc<K>>,
);

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
        let (store, mut ready, _) = self.entry::<K>();
        tokio::select! {
            _ = ready.wait_for(|r| *r) => {}
            _ = self.shutdown.cancelled() => {}
        }
        store
    }

    /// The store of `K` and its readiness, starting its watch on first use. Readiness is
    /// relayed through a watch channel: kube-runtime's `Store::wait_until_ready` wakes only
    /// one of several concurrent waiters.
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
        let store = start_with(
            Api::<K>::all(self.client.clone()),
            watcher::Config::default(),
            &self.tasks,
            &self.shutdown,
            Some(changes.clone()),
        );
        let (tx, rx) = tokio::sync::watch::channel(false);
        let waiter = store.clone();
        minik8s_task::spawn_on(&self.tasks, "informer-synced", async move {
            if waiter.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
            }
        });
        let entry = (store, rx, changes);
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
        let (store, _, changes) = self.entry::<K>();
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

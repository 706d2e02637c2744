//! Informers: a reflector store kept in step with the API by a watch, driven by a task that
//! ends on shutdown. [`Informers`] shares one watch and one store per kind among all the
//! controllers of a manager, as client-go's shared informer factory does, and like the
//! upstream controller-manager's informers they drop `managedFields`, which no controller
//! reads and which is most of a stored object's memory.

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
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
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .default_backoff()
        .reflect(writer)
        .for_each(|ev| async move {
            if let Err(e) = ev {
                tracing::debug!(error = %e, kind = %K::kind(&()), "watch error (retrying)");
            }
        });
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = stream => {}
            _ = shutdown.cancelled() => {}
        }
    });
    reader
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
        let (store, mut ready) = self.entry::<K>();
        tokio::select! {
            _ = ready.wait_for(|r| *r) => {}
            _ = self.shutdown.cancelled() => {}
        }
        store
    }

    /// The store of `K` and its readiness, starting its watch on first use. Readiness is
    /// relayed through a watch channel: kube-runtime's `Store::wait_until_ready` wakes only
    /// one of several concurrent waiters.
    fn entry<K>(&self) -> (Store<K>, tokio::sync::watch::Receiver<bool>)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        type Entry<K> = (Store<K>, tokio::sync::watch::Receiver<bool>);
        let mut stores = self.stores.lock().expect("informers");
        if let Some(entry) = stores
            .get(&TypeId::of::<K>())
            .and_then(|s| s.downcast_ref::<Entry<K>>())
        {
            return entry.clone();
        }
        let store = start(
            Api::<K>::all(self.client.clone()),
            watcher::Config::default(),
            &self.tasks,
            &self.shutdown,
        );
        let (tx, rx) = tokio::sync::watch::channel(false);
        let waiter = store.clone();
        self.tasks.spawn(async move {
            if waiter.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
            }
        });
        stores.insert(TypeId::of::<K>(), Box::new((store.clone(), rx.clone())));
        (store, rx)
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

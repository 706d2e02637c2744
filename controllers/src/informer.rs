//! Informers: a reflector store kept in step with the API by a watch, driven by a task that
//! ends on shutdown.

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
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
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
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

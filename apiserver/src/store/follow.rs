//! Keeping an in-memory copy of the objects under a key prefix in step with the store
//! (RBAC objects, webhook configurations): list, then watch and reload on every change.

use crate::Api;
use futures::StreamExt;
use minik8s_storage::{KeyValue, RangeRequest, Store};
use std::sync::Arc;

/// Calls `load` with every object under `prefix` now and after each change, until shutdown.
/// The copies are small, so a change reloads the whole prefix.
pub async fn follow(api: Arc<Api>, prefix: &'static str, load: impl Fn(&Api, &[KeyValue])) {
    loop {
        let listed = match api.store.range(RangeRequest::prefix(prefix)).await {
            Ok(l) => l,
            Err(_) => {
                tokio::select! {
                    _ = api.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                }
            }
        };
        load(&api, &listed.kvs);
        let Ok(mut events) = api.store.watch(prefix, listed.revision + 1).await else {
            continue;
        };
        loop {
            let ev = tokio::select! {
                _ = api.shutdown.cancelled() => return,
                ev = events.next() => ev,
            };
            match ev {
                Some(Ok(_)) => {
                    if let Ok(all) = api.store.range(RangeRequest::prefix(prefix)).await {
                        load(&api, &all.kvs);
                    }
                }
                _ => break,
            }
        }
    }
}

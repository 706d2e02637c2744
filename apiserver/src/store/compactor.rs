//! Compacting the store's history every interval, as upstream's apiserver does
//! (`--etcd-compaction-interval`, 5 minutes by default; k8s.io/apiserver/pkg/storage/etcd3/
//! compact.go). Each tick compacts to the revision seen at the tick before, so reads and
//! watches at older revisions keep at least one interval of history and a store that only
//! renews Leases does not grow for hours. Several apiservers on one store agree through a
//! compare-and-swap on `compact_rev_key` (upstream's key, so a store shared with upstream's
//! apiservers agrees too): the one whose swap wins compacts, the others learn the key's
//! revision and try again next tick.

use bytes::Bytes;
use minik8s_storage::{Error, Store};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The key the apiservers compare-and-swap to take turns (upstream's `compactRevKey`).
pub const KEY: &str = "compact_rev_key";

/// Upstream's default interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);

/// What one apiserver remembers between ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Turn {
    /// The `mod_revision` of [`KEY`] as last seen (0: not seen yet).
    key_revision: i64,
    /// The store's revision at the last tick: what the next won tick compacts to.
    last_revision: i64,
}

/// Compacts `store` every `interval` until `shutdown` (never when `interval` is zero).
pub async fn run(store: impl Store, interval: Duration, shutdown: CancellationToken) {
    if interval.is_zero() {
        return;
    }
    let mut turn = Turn::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match tick(&store, turn).await {
            Ok(next) => turn = next,
            Err(e) => tracing::warn!(error = %e, "compacting the store's history"),
        }
    }
}

/// One tick: swap [`KEY`] if it is still as last seen and, having won, compact to the
/// revision of the tick before; otherwise remember what another apiserver wrote.
async fn tick(store: &impl Store, turn: Turn) -> Result<Turn, Error> {
    let value = Bytes::from(turn.last_revision.to_string());
    let swapped = match turn.key_revision {
        0 => store.create(KEY, value).await,
        expected => store.update(KEY, value, expected).await,
    };
    let next = |key_revision, last_revision| Turn {
        key_revision,
        last_revision,
    };
    match swapped {
        Ok(kv) => {
            if turn.last_revision > 0 {
                store.compact(turn.last_revision).await?;
                tracing::debug!(
                    revision = turn.last_revision,
                    "compacted the store's history"
                );
            }
            Ok(next(kv.mod_revision, kv.mod_revision))
        }
        Err(Error::Conflict { current, .. }) => {
            Ok(next(current.mod_revision, store.current_revision().await?))
        }
        Err(Error::AlreadyExists { .. }) => {
            let seen = store.get(KEY).await?.map_or(0, |kv| kv.mod_revision);
            Ok(next(seen, store.current_revision().await?))
        }
        // Someone deleted the key: create it again next tick.
        Err(Error::NotFound { .. }) => Ok(next(0, store.current_revision().await?)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minik8s_storage::Embedded;

    async fn write(store: &Embedded, keys: std::ops::Range<usize>) {
        for i in keys {
            let key = format!("/registry/x/{i}");
            store.create(&key, Bytes::from("v")).await.unwrap();
        }
    }

    #[tokio::test]
    async fn the_winner_compacts_to_the_tick_before_and_the_others_wait() {
        let dir = tempfile::tempdir().unwrap();
        let store = Embedded::open(dir.path()).unwrap();
        write(&store, 0..3).await;
        let (a, b) = (Turn::default(), Turn::default());

        // First ticks: A creates the key and does not compact (upstream: not on bootstrap);
        // B finds it there and only learns it.
        let a = tick(&store, a).await.unwrap();
        let b = tick(&store, b).await.unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), 0);
        assert_eq!(a.key_revision, b.key_revision);
        let a_saw = a.last_revision;

        write(&store, 3..8).await;
        // B's swap wins (nobody wrote the key since it looked) and compacts to its last tick.
        let b_saw = b.last_revision;
        let b = tick(&store, b).await.unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), b_saw);
        assert!(b_saw >= a_saw);
        // A lost this round: the key moved, so A only learns the new revision.
        let a = tick(&store, a).await.unwrap();
        assert_eq!(store.compacted_revision().await.unwrap(), b_saw);
        assert_eq!(a.key_revision, b.key_revision);

        // Reads before the floor are gone; at and after it they still work.
        let current = store.current_revision().await.unwrap();
        let old = store
            .range(minik8s_storage::RangeRequest {
                revision: b_saw - 1,
                ..minik8s_storage::RangeRequest::prefix("/registry/x/")
            })
            .await;
        assert!(matches!(old, Err(Error::Compacted { .. })), "{old:?}");
        assert!(b_saw < current);

        // The key deleted: a tick notices, and the next creates it again.
        store.delete(KEY, None).await.unwrap();
        let a = tick(&store, a).await.unwrap();
        assert_eq!(a.key_revision, 0);
        let a = tick(&store, a).await.unwrap();
        assert!(a.key_revision > 0);
    }
}

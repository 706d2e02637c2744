//! The apiserver's storage layer: one revisioned key-value [`Store`] trait modelled on etcd's
//! data model, with two backends behind the [`Storage`] enum: [`Embedded`] (redb, the default,
//! nothing to install) and [`Etcd`] (etcd v3 over gRPC, for several apiservers).
//!
//! The trait knows bytes, keys and revisions, never Kubernetes types. Its contract:
//! - one global revision, bumped by every successful write; each key records the revision that
//!   created it (`create_revision`) and the one that last changed it (`mod_revision`);
//! - `create` fails if the key exists; `update` and `delete` are compare-and-swap on
//!   `mod_revision`;
//! - `range` reads a key prefix in key order, from a start key, up to a limit, at the latest or
//!   an older revision;
//! - `watch` streams every change under a prefix from a revision on (inclusive), with the
//!   previous value, in revision order;
//! - revisions older than the last compaction answer [`Error::Compacted`];
//! - a write returns only once it is durable.

mod backend;
pub mod bench;
pub mod embedded;
mod error;
pub mod etcd;
pub mod metrics;
pub mod testing;
mod types;

pub use backend::{Endpoint, Storage};
pub use embedded::{DEFAULT_CACHE_BYTES, DEFAULT_HISTORY_AGE, Embedded, EmbeddedOptions, Stats};
pub use error::{Error, Result};
pub use etcd::{Etcd, EtcdTls};
pub use types::{
    Deleted, Event, EventKind, KeyValue, RangeRequest, RangeResult, WatchIndex, WatchStream,
};

use bytes::Bytes;
use std::future::Future;

/// A revisioned, compare-and-swap key-value store with watches: what the apiserver stores
/// objects in. See the crate docs for the contract every backend keeps.
pub trait Store: Send + Sync + 'static {
    /// The store's current revision (the revision of the last successful write).
    fn current_revision(&self) -> impl Future<Output = Result<i64>> + Send;

    /// The revision below which history is gone (reads and watches before it are `Compacted`).
    fn compacted_revision(&self) -> impl Future<Output = Result<i64>> + Send;

    /// The latest value of one key, if present.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<KeyValue>>> + Send;

    /// Keys under a prefix in key order, optionally after a start key, up to a limit, at a revision.
    fn range(&self, req: RangeRequest) -> impl Future<Output = Result<RangeResult>> + Send;

    /// Creates a key; fails with [`Error::AlreadyExists`] if it is present.
    fn create(&self, key: &str, value: Bytes) -> impl Future<Output = Result<KeyValue>> + Send;

    /// Replaces a key's value if its `mod_revision` is still `expected`; otherwise
    /// [`Error::Conflict`] carrying the current value, or [`Error::NotFound`].
    fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: i64,
    ) -> impl Future<Output = Result<KeyValue>> + Send;

    /// Deletes a key, if `expected` is given only while its `mod_revision` is still that.
    fn delete(
        &self,
        key: &str,
        expected: Option<i64>,
    ) -> impl Future<Output = Result<Deleted>> + Send;

    /// Streams the changes under `prefix` whose revision is at least `start_revision`
    /// (0: from the next write on). A too-old start yields [`Error::Compacted`] as the first item.
    fn watch(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> impl Future<Output = Result<WatchStream>> + Send;

    /// Drops the history before `revision`: later reads and watches before it are `Compacted`.
    fn compact(&self, revision: i64) -> impl Future<Output = Result<()>> + Send;

    /// Indexes the keys under `prefix` by what `index` reads from their values: a watch
    /// opened with [`Store::watch_where`] is then woken only by the changes of its value
    /// (read before and after the change), and [`Store::range_where`] reads only the keys
    /// of its value. A backend without indexes (the default) ignores it.
    fn index(&self, prefix: &str, index: WatchIndex) -> Result<()> {
        let _ = (prefix, index);
        Ok(())
    }

    /// [`Store::range`] at the latest revision of the keys whose value an index reads as
    /// `value`, or `None` when no index covers the prefix or the read is of an older
    /// revision (the default: the caller ranges over the prefix instead). It may hand over
    /// other keys too: the caller filters them.
    fn range_where(
        &self,
        req: RangeRequest,
        value: &str,
    ) -> impl Future<Output = Result<Option<RangeResult>>> + Send {
        let _ = (req, value);
        async { Ok(None) }
    }

    /// [`Store::watch`] for a watcher that wants only the changes whose value, before or
    /// after, an index reads as `value`. It may still be handed other changes under the prefix
    /// (always, without an index for it): the caller filters them.
    fn watch_where(
        &self,
        prefix: &str,
        start_revision: i64,
        value: &str,
    ) -> impl Future<Output = Result<WatchStream>> + Send {
        let _ = value;
        self.watch(prefix, start_revision)
    }
}

/// The exclusive upper end of the key range that holds every key starting with `prefix`
/// (etcd's "range end" for a prefix), or `None` when the prefix is empty or all 0xff.
pub(crate) fn prefix_end(prefix: &str) -> Option<Vec<u8>> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(
            prefix_end("/registry/pods/"),
            Some(b"/registry/pods0".to_vec())
        );
        assert_eq!(prefix_end("a"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(""), None);
    }
}

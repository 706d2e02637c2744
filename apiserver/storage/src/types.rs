//! The values the [`Store`](crate::Store) trait reads and writes.

use bytes::Bytes;
use futures::stream::BoxStream;

/// One key with its value and revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, e.g. `/registry/configmaps/default/x`.
    pub key: String,
    /// The value (the JSON of an object, for the apiserver).
    pub value: Bytes,
    /// The revision that created the key.
    pub create_revision: i64,
    /// The revision that last changed the key (a Kubernetes object's `resourceVersion`).
    pub mod_revision: i64,
}

/// What a successful delete returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deleted {
    /// The key's value just before the delete.
    pub prev: KeyValue,
    /// The revision of the delete.
    pub revision: i64,
}

/// What a watch event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or updated.
    Put,
    /// The key was deleted.
    Delete,
    /// No change: the watch has been handed every change it wants up to `kv.mod_revision`
    /// (the key is empty). Only watches opened with
    /// [`Store::watch_where`](crate::Store::watch_where) get these, while their value is
    /// quiet, so that their resourceVersion (bookmarks, a watch started again) stays recent
    /// although they see few of the prefix's changes (etcd's progress notifications).
    Progress,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change; for a delete the value is empty, `create_revision` is 0 and
    /// `mod_revision` is the delete's revision.
    pub kv: KeyValue,
    /// The key before the change, if it existed.
    pub prev: Option<KeyValue>,
}

impl Event {
    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

/// A stream of watch events in revision order; an error ends it.
pub type WatchStream = BoxStream<'static, crate::Result<Event>>;

/// What a watch index reads from a stored value: the value its watches are found by (a pod's
/// node name), if any. See [`Store::index`](crate::Store::index).
pub type WatchIndex = std::sync::Arc<dyn Fn(&[u8]) -> Option<String> + Send + Sync>;

/// A read of the keys under a prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    /// Every key returned starts with this.
    pub prefix: String,
    /// Only keys strictly after this one (a continue token's last key).
    pub start_after: Option<String>,
    /// At most this many keys; 0 means no limit.
    pub limit: usize,
    /// Read at this revision; 0 means the latest.
    pub revision: i64,
    /// Also count every key of the range, beyond `limit` ([`RangeResult::count`]).
    pub count: bool,
}

impl RangeRequest {
    /// At most how many keys to hand over (`limit`, with 0 as no limit).
    pub fn max_keys(&self) -> usize {
        match self.limit {
            0 => usize::MAX,
            n => n,
        }
    }

    /// All keys under `prefix` at the latest revision.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        RangeRequest {
            prefix: prefix.into(),
            ..Default::default()
        }
    }
}

/// The answer to a [`RangeRequest`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResult {
    /// The keys, in key order.
    pub kvs: Vec<KeyValue>,
    /// Whether more keys follow the last one returned.
    pub more: bool,
    /// The revision the read was made at.
    pub revision: i64,
    /// With [`RangeRequest::count`], how many keys the range holds (after `start_after`),
    /// returned or not; otherwise the number returned.
    pub count: usize,
}

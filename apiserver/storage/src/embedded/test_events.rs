//! Events for the hub's and the list index's unit tests.

use crate::{Event, EventKind, KeyValue};
use bytes::Bytes;

/// `key` put to `value`, from `prev` when given.
pub fn put(key: &str, value: &str, prev: Option<&str>) -> Event {
    let kv = |v: &str| KeyValue {
        key: key.into(),
        value: Bytes::copy_from_slice(v.as_bytes()),
        create_revision: 1,
        mod_revision: 2,
    };
    Event {
        kind: EventKind::Put,
        kv: kv(value),
        prev: prev.map(kv),
    }
}

/// `key` deleted, its value having been `prev`.
pub fn delete(key: &str, prev: &str) -> Event {
    let mut e = put(key, "", Some(prev));
    e.kind = EventKind::Delete;
    e
}

//! Watches and LISTs found by a field's value (upstream's "indexed triggers" and its watch
//! cache's indexers): every kubelet watches and lists the pods of its node
//! (`fieldSelector=spec.nodeName=<node>`), and without an index each pod's change would wake
//! every one of those watches, thousands at a scale upstream supports, to be filtered and
//! dropped, and each of those LISTs would read every pod. The store indexes the keys of a
//! kind whose registry row names a `watch_index` field by that field's text in the stored
//! object: a watch whose field selector asks for one value of it is woken only by the
//! changes of that value (read before and after each change), and a LIST of the latest
//! revision reads only the objects of that value. Both still filter what they are handed
//! (a batch may carry other changes; the etcd backend has no index and hands over
//! everything).

use crate::Api;
use minik8s_storage::Store;
use std::sync::Arc;

/// Indexes the store's keys of every kind whose registry row names a watch index (reading
/// what the store holds once).
pub fn register(api: &Api) -> Result<(), minik8s_storage::Error> {
    for res in api.registry.all() {
        let Some(field) = res.watch_index else {
            continue;
        };
        if !res.stored_as_served() {
            continue;
        }
        api.store.index(
            &res.scope_prefix(None),
            Arc::new(move |stored: &[u8]| index_value(stored, field)),
        )?;
    }
    Ok(())
}

/// The field's text in a stored object, as a field selector reads it ("" when unset: the
/// unscheduled pods' watches, `spec.nodeName=`, are indexed too).
fn index_value(stored: &[u8], field: &str) -> Option<String> {
    let partial = crate::object::decode_paths(stored, &[field])?;
    Some(crate::object::field_text(&partial, field))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_node_name_is_read_from_its_stored_bytes() {
        let bound =
            br#"{"kind":"Pod","metadata":{"name":"p"},"spec":{"nodeName":"n1","containers":[]}}"#;
        let pending = br#"{"kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[]}}"#;
        assert_eq!(index_value(bound, "spec.nodeName").as_deref(), Some("n1"));
        assert_eq!(index_value(pending, "spec.nodeName").as_deref(), Some(""));
        assert_eq!(index_value(b"not json", "spec.nodeName"), None);
    }
}

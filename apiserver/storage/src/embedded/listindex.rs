//! Reads found by a field's value, as upstream's watch cache lists a node's pods from its
//! `spec.nodeName` index: every kubelet lists its node's pods when it starts and whenever its
//! watch must start over, and without an index each of those LISTs reads every pod of the
//! cluster (1,000 kubelets after a restart at 30,000 pods: 30 million objects read to hand out
//! 30,000). An indexed prefix keeps, for each value its index reads, the keys whose current
//! value reads as it.
//!
//! The sets are a superset of the keys at any snapshot a read can take: the writer adds a
//! key to its new value's set before the commit and takes it out of its old value's set after
//! it, and a read takes its snapshot and its candidates under the same lock. A read checks
//! each candidate in its snapshot (its caller filters what it is handed, as a watch's does).

use super::{KV, codec, snapshot_revision};
use crate::{Event, EventKind, RangeRequest, RangeResult, Result, WatchIndex, prefix_end};
use redb::{Database, ReadableDatabase};
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::RwLock;

/// One indexed prefix: the keys under it by the value their current value reads as.
struct Index {
    prefix: String,
    index: WatchIndex,
    keys: HashMap<String, BTreeSet<String>>,
}

impl Index {
    /// What `value` (a stored value, empty for a deleted key) reads as.
    fn read(&self, value: &[u8]) -> Option<String> {
        (!value.is_empty()).then(|| (self.index)(value)).flatten()
    }
}

/// The store's list indexes. The lock is also the gate between the writer's changes to the
/// sets and a read's snapshot (see the module's comment).
#[derive(Default)]
pub(super) struct Lists {
    indexes: RwLock<Vec<Index>>,
}

impl Lists {
    /// Indexes the keys under `prefix` (replacing an index of the same prefix), reading the
    /// current keys once. Writes wait while it reads them, so none is missed.
    pub fn add(&self, db: &Database, prefix: &str, index: WatchIndex) -> Result<()> {
        let mut indexes = self.indexes.write().expect("list index lock");
        indexes.retain(|i| i.prefix != prefix);
        let mut new = Index {
            prefix: prefix.to_owned(),
            index,
            keys: HashMap::new(),
        };
        let txn = db.begin_read()?;
        let kv = txn.open_table(KV)?;
        let upper = prefix_end(prefix);
        let upper = match &upper {
            Some(u) => Bound::Excluded(u.as_slice()),
            None => Bound::Unbounded,
        };
        for entry in kv.range::<&[u8]>((Bound::Included(prefix.as_bytes()), upper))? {
            let (k, v) = entry?;
            let kv = codec::decode_value(k.value(), v.value())?;
            if let Some(value) = new.read(&kv.value) {
                new.keys.entry(value).or_default().insert(kv.key);
            }
        }
        indexes.push(new);
        Ok(())
    }

    /// Before a batch is committed: each changed key joins the set of the value it reads as
    /// now.
    pub fn before_commit(&self, events: &[Event]) {
        let mut indexes = self.indexes.write().expect("list index lock");
        for i in indexes.iter_mut() {
            for e in events.iter().filter(|e| e.kv.key.starts_with(&i.prefix)) {
                if e.kind != EventKind::Put {
                    continue;
                }
                if let Some(value) = i.read(&e.kv.value) {
                    i.keys.entry(value).or_default().insert(e.kv.key.clone());
                }
            }
        }
    }

    /// After a batch is committed: each changed key leaves the sets of the values it read as
    /// before and during the batch, but for the one it reads as at its end. (A batch that
    /// failed to commit changed nothing: what [`Lists::before_commit`] added stays, a superset
    /// still.)
    pub fn after_commit(&self, events: &[Event]) {
        let mut indexes = self.indexes.write().expect("list index lock");
        for i in indexes.iter_mut() {
            // Each change's values before and after, read once.
            let changes: Vec<(&str, Option<String>, Option<String>)> = events
                .iter()
                .filter(|e| e.kv.key.starts_with(&i.prefix))
                .map(|e| {
                    let before = e.prev.as_ref().and_then(|p| i.read(&p.value));
                    (e.kv.key.as_str(), before, i.read(&e.kv.value))
                })
                .collect();
            let last: HashMap<&str, &Option<String>> =
                changes.iter().map(|(k, _, after)| (*k, after)).collect();
            for (key, before, after) in &changes {
                for value in [before, after].into_iter().flatten() {
                    if last[key].as_ref() == Some(value) {
                        continue;
                    }
                    if let Some(set) = i.keys.get_mut(value) {
                        set.remove(*key);
                        if set.is_empty() {
                            i.keys.remove(value);
                        }
                    }
                }
            }
        }
    }

    /// The keys under `req.prefix` whose value reads as `value`, at the latest revision (after
    /// `req.start_after`, at most `req.limit`; `count` counts the candidates), or `None` when
    /// no index covers the prefix.
    pub fn range(
        &self,
        db: &Database,
        req: &RangeRequest,
        value: &str,
    ) -> Result<Option<RangeResult>> {
        let (txn, candidates) = {
            let indexes = self.indexes.read().expect("list index lock");
            let Some(i) = indexes.iter().find(|i| req.prefix.starts_with(&i.prefix)) else {
                return Ok(None);
            };
            let txn = db.begin_read()?;
            let lower = match &req.start_after {
                Some(k) if k.as_str() >= req.prefix.as_str() => Bound::Excluded(k.clone()),
                _ => Bound::Included(req.prefix.clone()),
            };
            let candidates: Vec<String> = i.keys.get(value).map_or_else(Vec::new, |set| {
                set.range((lower, Bound::Unbounded))
                    .take_while(|k| k.starts_with(&req.prefix))
                    .cloned()
                    .collect()
            });
            (txn, candidates)
        };
        let revision = snapshot_revision(&txn)?;
        let kv = txn.open_table(KV)?;
        let limit = req.max_keys();
        let mut kvs = Vec::new();
        let mut more = false;
        let mut count = 0;
        for key in &candidates {
            let Some(raw) = kv.get(key.as_bytes())? else {
                continue;
            };
            count += 1;
            if kvs.len() == limit {
                more = true;
                if !req.count {
                    break;
                }
                continue;
            }
            kvs.push(codec::decode_value(key.as_bytes(), raw.value())?);
        }
        Ok(Some(RangeResult {
            kvs,
            more,
            revision,
            count,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_events::{delete, put};
    use super::*;
    use std::sync::Arc;

    fn lists() -> Lists {
        let lists = Lists::default();
        lists.indexes.write().unwrap().push(Index {
            prefix: "/p/".into(),
            index: Arc::new(|v: &[u8]| {
                let s = std::str::from_utf8(v).ok()?;
                Some(s.split_once(':')?.0.to_owned())
            }),
            keys: HashMap::new(),
        });
        lists
    }

    fn keys(lists: &Lists, value: &str) -> Vec<String> {
        let indexes = lists.indexes.read().unwrap();
        indexes[0]
            .keys
            .get(value)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_key_is_in_both_sets_while_its_move_commits_and_in_its_last_after() {
        let lists = lists();
        let created = [put("/p/a", "n1:x", None), put("/q/a", "n1:x", None)];
        lists.before_commit(&created);
        lists.after_commit(&created);
        assert_eq!(keys(&lists, "n1"), ["/p/a"], "only keys under the prefix");

        let moved = [put("/p/a", "n2:x", Some("n1:x"))];
        lists.before_commit(&moved);
        assert_eq!(keys(&lists, "n1"), ["/p/a"]);
        assert_eq!(keys(&lists, "n2"), ["/p/a"]);
        lists.after_commit(&moved);
        assert!(keys(&lists, "n1").is_empty());
        assert_eq!(keys(&lists, "n2"), ["/p/a"]);

        // Away and back in one batch: it stays where it ends.
        let back_and_forth = [
            put("/p/a", "n3:x", Some("n2:x")),
            put("/p/a", "n2:y", Some("n3:x")),
        ];
        lists.before_commit(&back_and_forth);
        lists.after_commit(&back_and_forth);
        assert_eq!(keys(&lists, "n2"), ["/p/a"]);
        assert!(keys(&lists, "n3").is_empty());

        let deleted = [delete("/p/a", "n2:y")];
        lists.before_commit(&deleted);
        assert_eq!(keys(&lists, "n2"), ["/p/a"]);
        lists.after_commit(&deleted);
        assert!(keys(&lists, "n2").is_empty());
        assert!(lists.indexes.read().unwrap()[0].keys.is_empty());
    }
}

//! What a read at an older revision undoes, kept between the pages of a paginated LIST.
//!
//! A read at revision `at` is the current keys with the changes since `at` undone: for each
//! key changed since, the previous value of its oldest change. Every page of a paginated LIST
//! is read at the first page's revision, so finding those changes anew read all the history
//! written since the first page, and each page cost more than the one before: at 5,000 nodes
//! (500–1,000 writes a second) a page read tens of thousands of history entries half a minute
//! into a LIST. Kept here, a page reads only the history written since the page before, and
//! only the changed keys from the page's first key on are remembered.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many reads' changes are kept at most (the one used longest ago goes first).
const KEPT: usize = 16;

/// How long unused changes are kept: a client that stopped paging does not come back.
const IDLE: Duration = Duration::from_secs(60);

/// How many changed keys are kept over all reads at most (about 100 bytes each).
const MAX_KEYS: usize = 400_000;

/// The keys under a prefix changed since a revision, as far as the history was read.
#[derive(Debug)]
pub(super) struct Changes {
    prefix: String,
    at: i64,
    /// The history in (`at`, `upto`] has been read.
    upto: i64,
    /// Keys up to this one were dropped: the pages after it need no undo of them.
    dropped_to: Option<Vec<u8>>,
    /// Each key changed in (`at`, `upto`] and after `dropped_to` → the revision of its oldest
    /// change there, whose history entry holds the key's value at `at`.
    first: BTreeMap<Vec<u8>, u64>,
    used: Instant,
}

impl Changes {
    /// No history read yet for a read of `prefix` at `at`.
    pub fn new(prefix: &str, at: i64) -> Self {
        Changes {
            prefix: prefix.to_owned(),
            at,
            upto: at,
            dropped_to: None,
            first: BTreeMap::new(),
            used: Instant::now(),
        }
    }

    /// The revision up to which the history has been read.
    pub fn upto(&self) -> i64 {
        self.upto
    }

    /// Notes the history entry of `key` at `revision`; entries come in ascending revisions,
    /// so a key's first stays.
    pub fn note(&mut self, revision: u64, key: &[u8]) {
        if !key.starts_with(self.prefix.as_bytes())
            || self.dropped_to.as_deref().is_some_and(|d| key <= d)
        {
            return;
        }
        if !self.first.contains_key(key) {
            self.first.insert(key.to_vec(), revision);
        }
    }

    /// Marks the history up to `revision` read.
    pub fn read_to(&mut self, revision: i64) {
        self.upto = self.upto.max(revision);
    }

    /// Forgets the keys up to `key`: the pages from here on start after it.
    pub fn drop_to(&mut self, key: &[u8]) {
        if self.dropped_to.as_deref().is_some_and(|d| key <= d) {
            return;
        }
        let mut rest = self.first.split_off(key);
        rest.remove(key);
        self.first = rest;
        self.dropped_to = Some(key.to_vec());
    }

    /// The changed keys in `range`, each with the revision of its first change.
    pub fn in_range<'a>(
        &'a self,
        range: (std::ops::Bound<&'a [u8]>, std::ops::Bound<&'a [u8]>),
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a u64)> + 'a {
        self.first.range::<[u8], _>(range)
    }
}

/// The changes of the reads at older revisions that may have pages to come.
#[derive(Default)]
pub(super) struct Kept {
    kept: Mutex<Vec<Changes>>,
}

impl Kept {
    /// Takes out the changes kept for a read of `prefix` at `at` from after `start_after`, in
    /// a snapshot at `current`: only if they were read no further than `current` (an older
    /// snapshot has not the history they point into) and dropped no key the read needs.
    pub fn take(
        &self,
        prefix: &str,
        at: i64,
        current: i64,
        start_after: Option<&[u8]>,
    ) -> Option<Changes> {
        let mut kept = self.kept.lock().expect("undo cache");
        let i = kept.iter().position(|c| {
            c.prefix == prefix
                && c.at == at
                && c.upto <= current
                && match (&c.dropped_to, start_after) {
                    (None, _) => true,
                    (Some(d), Some(s)) => s >= d.as_slice(),
                    (Some(_), None) => false,
                }
        })?;
        Some(kept.swap_remove(i))
    }

    /// Keeps `changes` for the next page, within [`KEPT`], [`IDLE`] and [`MAX_KEYS`].
    pub fn put(&self, mut changes: Changes) {
        changes.used = Instant::now();
        let mut kept = self.kept.lock().expect("undo cache");
        kept.retain(|c| c.used.elapsed() < IDLE);
        kept.push(changes);
        kept.sort_by_key(|c| std::cmp::Reverse(c.used));
        let mut keys = 0;
        let mut keep = 0;
        for c in kept.iter() {
            if keep == KEPT || keys + c.first.len() > MAX_KEYS {
                break;
            }
            keys += c.first.len();
            keep += 1;
        }
        kept.truncate(keep);
    }

    /// How many reads' changes are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.lock().expect("undo cache").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Bound;

    #[test]
    fn a_key_keeps_its_first_change_and_dropped_keys_stay_dropped() {
        let mut c = Changes::new("/p/", 10);
        c.note(11, b"/p/b");
        c.note(12, b"/p/a");
        c.note(13, b"/p/b");
        c.note(14, b"/q/a");
        c.read_to(14);
        let all: Vec<_> = c
            .in_range((Bound::Unbounded, Bound::Unbounded))
            .map(|(k, r)| (k.clone(), *r))
            .collect();
        assert_eq!(all, vec![(b"/p/a".to_vec(), 12), (b"/p/b".to_vec(), 11)]);
        c.drop_to(b"/p/a");
        c.note(15, b"/p/a");
        c.note(16, b"/p/c");
        let rest: Vec<_> = c
            .in_range((Bound::Unbounded, Bound::Unbounded))
            .map(|(k, r)| (k.clone(), *r))
            .collect();
        assert_eq!(rest, vec![(b"/p/b".to_vec(), 11), (b"/p/c".to_vec(), 16)]);
        assert_eq!(c.upto(), 14);
    }

    #[test]
    fn changes_are_taken_only_where_they_serve() {
        let kept = Kept::default();
        let mut c = Changes::new("/p/", 10);
        c.read_to(20);
        c.drop_to(b"/p/m");
        kept.put(c);
        assert!(
            kept.take("/p/", 10, 19, Some(b"/p/n")).is_none(),
            "older snapshot"
        );
        assert!(
            kept.take("/p/", 10, 20, Some(b"/p/a")).is_none(),
            "dropped keys needed"
        );
        assert!(
            kept.take("/p/", 10, 20, None).is_none(),
            "dropped keys needed"
        );
        assert!(
            kept.take("/p/", 11, 20, Some(b"/p/n")).is_none(),
            "another revision"
        );
        assert!(
            kept.take("/q/", 10, 20, Some(b"/p/n")).is_none(),
            "another prefix"
        );
        assert!(kept.take("/p/", 10, 25, Some(b"/p/m")).is_some());
        assert_eq!(kept.len(), 0);
        for at in 0..(KEPT as i64 + 4) {
            kept.put(Changes::new("/p/", at));
        }
        assert_eq!(kept.len(), KEPT);
        assert!(
            kept.take("/p/", 0, 100, None).is_none(),
            "the oldest went first"
        );
    }
}

//! Routing of committed batches to the store's watches by key prefix: the writer hands a batch
//! only to the watches with a changed key under their prefix, so a commit wakes the watches it
//! concerns rather than every watch of the store (about 60 with the controller-manager's
//! informers). Watches of an indexed prefix (pods by node name: every kubelet's watch) are
//! found by the value their changes read as, as upstream's watch cache finds its "indexed
//! triggers": a pod's change wakes its node's watch, not the thousands of others. Each watch
//! has a bounded queue; one that falls behind is flagged and told, and catches up from the
//! history table, as it did when it lagged behind a broadcast channel.
//!
//! The hub also keeps the batches of the last [`RECENT_AGE`] (up to a size in bytes), as
//! upstream's watch cache keeps a cyclic buffer of recent events: a new watch starting from a
//! recent revision (a kubelet's after its LIST), and a watch that fell behind, replay from
//! there instead of reading the whole history table since their revision. At 5,000 nodes,
//! those reads from disk took 80 % of the CPU (docs/benchmarks.md).

use crate::{Event, WatchIndex};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc};

/// How long the hub keeps a batch for replays: upstream's watch cache keeps its events fresh
/// for 75 s (`eventFreshDuration`).
pub(super) const RECENT_AGE: Duration = Duration::from_secs(75);

/// One watch's end of the hub.
pub(super) struct Subscription {
    /// The batches with a key under the watch's prefix (and, indexed, a change that reads as
    /// its value), in commit order.
    pub batches: mpsc::Receiver<Arc<[Event]>>,
    /// Set when a batch was dropped because the queue was full; `lag` is signalled then.
    pub lagged: Arc<AtomicBool>,
    pub lag: Arc<Notify>,
}

struct Sub {
    prefix: String,
    tx: mpsc::Sender<Arc<[Event]>>,
    lagged: Arc<AtomicBool>,
    lag: Arc<Notify>,
}

impl Sub {
    /// Hands the batch over; false once the watch is gone.
    fn send(&self, batch: &Arc<[Event]>) -> bool {
        match self.tx.try_send(batch.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.lagged.store(true, Ordering::Release);
                self.lag.notify_one();
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

/// The watches of an indexed prefix, by the value they want.
struct Indexed {
    prefix: String,
    index: WatchIndex,
    by_value: HashMap<String, Vec<Sub>>,
}

#[derive(Default)]
struct Subs {
    plain: Vec<Sub>,
    indexed: Vec<Indexed>,
}

/// The batches of the last [`RECENT_AGE`], oldest first, holding at most `cap` bytes.
struct Recent {
    batches: VecDeque<(Instant, usize, Arc<[Event]>)>,
    bytes: usize,
    cap: usize,
}

impl Recent {
    /// The first revision of the kept batches (`None` while none is kept).
    fn first(&self) -> Option<i64> {
        self.batches
            .front()
            .and_then(|(_, _, b)| b.first())
            .map(Event::revision)
    }

    fn push(&mut self, batch: &Arc<[Event]>, now: Instant) {
        let size = batch.iter().map(weight).sum::<usize>();
        self.batches.push_back((now, size, batch.clone()));
        self.bytes += size;
        while let Some((at, size, _)) = self.batches.front() {
            if self.bytes <= self.cap && now.duration_since(*at) <= RECENT_AGE {
                break;
            }
            self.bytes -= size;
            self.batches.pop_front();
        }
    }
}

/// About the bytes an event holds (its key and values, and their bookkeeping).
fn weight(e: &Event) -> usize {
    const OVERHEAD: usize = 128;
    let kv = |kv: &crate::KeyValue| kv.key.len() + kv.value.len();
    OVERHEAD + kv(&e.kv) + e.prev.as_ref().map_or(0, kv)
}

/// The watches of one store; `None` once the store is closed.
pub(super) struct Hub {
    subs: Mutex<Option<Subs>>,
    /// The revision of the last batch handed to every watch it concerns.
    published: AtomicI64,
    recent: Mutex<Recent>,
}

fn new_sub(prefix: &str, buffer: usize) -> (Sub, Subscription) {
    let (tx, batches) = mpsc::channel(buffer.max(1));
    let lagged = Arc::new(AtomicBool::new(false));
    let lag = Arc::new(Notify::new());
    let sub = Sub {
        prefix: prefix.to_owned(),
        tx,
        lagged: lagged.clone(),
        lag: lag.clone(),
    };
    (
        sub,
        Subscription {
            batches,
            lagged,
            lag,
        },
    )
}

impl Hub {
    /// The hub of a store at `revision`, keeping at most `recent_bytes` of recent batches for
    /// replays.
    pub fn new(revision: i64, recent_bytes: usize) -> Self {
        Hub {
            subs: Mutex::new(Some(Subs::default())),
            published: AtomicI64::new(revision),
            recent: Mutex::new(Recent {
                batches: VecDeque::new(),
                bytes: 0,
                cap: recent_bytes,
            }),
        }
    }

    /// Indexes the watches of keys under `prefix` (one index a prefix; a later one replaces
    /// it for later watches).
    pub fn index(&self, prefix: &str, index: WatchIndex) {
        let mut guard = self.subs.lock().expect("hub lock");
        let Some(subs) = guard.as_mut() else { return };
        subs.indexed.retain(|i| i.prefix != prefix);
        subs.indexed.push(Indexed {
            prefix: prefix.to_owned(),
            index,
            by_value: HashMap::new(),
        });
    }

    /// A new watch of `prefix` with room for `buffer` batches; with `value`, one that only
    /// changes reading as that value wake when an index covers the prefix (else every change
    /// under it wakes it); `None` once closed.
    pub fn subscribe_where(
        &self,
        prefix: &str,
        value: Option<&str>,
        buffer: usize,
    ) -> Option<Subscription> {
        let (sub, subscription) = new_sub(prefix, buffer);
        let mut guard = self.subs.lock().expect("hub lock");
        let subs = guard.as_mut()?;
        let indexed = value.and_then(|v| {
            let i = subs
                .indexed
                .iter_mut()
                .find(|i| prefix.starts_with(&i.prefix))?;
            Some((i, v))
        });
        match indexed {
            Some((i, v)) => {
                let watches = i.by_value.entry(v.to_owned()).or_default();
                watches.retain(|s| !s.tx.is_closed());
                watches.push(sub);
            }
            None => subs.plain.push(sub),
        }
        Some(subscription)
    }

    /// The revision through which every committed batch is in the queues of the watches it
    /// concerns (or flagged as dropped): a watch that drained its queue after reading it, and
    /// is not flagged, has been handed everything it wants up to it.
    pub fn published(&self) -> i64 {
        self.published.load(Ordering::Acquire)
    }

    /// Hands a committed batch to every watch it concerns; forgets watches that are gone.
    pub fn publish(&self, batch: &Arc<[Event]>) {
        let mut guard = self.subs.lock().expect("hub lock");
        let Some(subs) = guard.as_mut() else { return };
        hand_out(subs, batch);
        // Only once every queue has the batch (still under the lock: in commit order).
        if let Some(last) = batch.last() {
            self.published.fetch_max(last.revision(), Ordering::Release);
        }
        drop(guard);
        self.recent
            .lock()
            .expect("hub lock")
            .push(batch, Instant::now());
    }

    /// The kept batches with a change from revision `from` on, if the hub kept every batch
    /// published since `from` (or `from` is beyond what was published): with a subscription
    /// taken before, they and its queue hold every change from `from` on. `None` when older
    /// batches were let go, for the caller to read the history table.
    pub fn since(&self, from: i64) -> Option<Vec<Arc<[Event]>>> {
        let recent = self.recent.lock().expect("hub lock");
        match recent.first() {
            Some(first) if first <= from => {}
            // Nothing kept from `from` on: only a revision beyond every published one is
            // covered (by the queue).
            _ if from > self.published() => return Some(Vec::new()),
            _ => return None,
        }
        let start = recent
            .batches
            .partition_point(|(_, _, b)| b.last().is_some_and(|e| e.revision() < from));
        Some(
            recent
                .batches
                .range(start..)
                .map(|(_, _, b)| b.clone())
                .collect(),
        )
    }

    /// The first revision of the kept batches (`None` while none is kept): from it on, the hub
    /// holds every published batch, so a replay needs the history table only before it.
    pub fn kept_from(&self) -> Option<i64> {
        self.recent.lock().expect("hub lock").first()
    }

    /// Ends every watch (their queues close once drained).
    pub fn close(&self) {
        self.subs.lock().expect("hub lock").take();
    }
}

/// Hands a batch to the watches it concerns; forgets watches that are gone.
fn hand_out(subs: &mut Subs, batch: &Arc<[Event]>) {
    subs.plain.retain(|s| {
        if s.tx.is_closed() {
            return false;
        }
        if !batch.iter().any(|e| e.kv.key.starts_with(&s.prefix)) {
            return true;
        }
        s.send(batch)
    });
    for i in &mut subs.indexed {
        if i.by_value.is_empty() {
            continue;
        }
        // The keys of the batch's changes under the prefix by what they read as, before and
        // after.
        let mut keys: HashMap<String, Vec<&str>> = HashMap::new();
        for e in batch.iter().filter(|e| e.kv.key.starts_with(&i.prefix)) {
            let before = e.prev.as_ref().and_then(|p| (i.index)(&p.value));
            let after = (!e.kv.value.is_empty())
                .then(|| (i.index)(&e.kv.value))
                .flatten();
            for v in [before, after].into_iter().flatten() {
                keys.entry(v).or_default().push(&e.kv.key);
            }
        }
        for (v, keys) in keys {
            let Some(watches) = i.by_value.get_mut(&v) else {
                continue;
            };
            watches.retain(|s| !keys.iter().any(|k| k.starts_with(&s.prefix)) || s.send(batch));
            if watches.is_empty() {
                i.by_value.remove(&v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_events::{delete, put};
    use super::*;

    /// The index of the tests: a value's text up to its first ':' ("node:rest").
    fn by_node() -> WatchIndex {
        Arc::new(|v: &[u8]| {
            let s = std::str::from_utf8(v).ok()?;
            s.split_once(':').map(|(n, _)| n.to_owned())
        })
    }

    fn got(s: &mut Subscription) -> usize {
        let mut n = 0;
        while s.batches.try_recv().is_ok() {
            n += 1;
        }
        n
    }

    #[test]
    fn an_indexed_watch_is_woken_only_by_changes_of_its_value() {
        let hub = Hub::new(0, 0);
        hub.index("/pods/", by_node());
        let mut n1 = hub.subscribe_where("/pods/", Some("n1"), 8).unwrap();
        let mut n2 = hub.subscribe_where("/pods/", Some("n2"), 8).unwrap();
        let mut n1_in_b = hub.subscribe_where("/pods/b/", Some("n1"), 8).unwrap();
        let mut all = hub.subscribe_where("/pods/", None, 8).unwrap();
        // Unindexed prefix: the value is ignored, every change under it wakes the watch.
        let mut other = hub.subscribe_where("/nodes/", Some("n1"), 8).unwrap();

        hub.publish(&Arc::from(vec![put("/pods/a/p", "n1:x", None)]));
        hub.publish(&Arc::from(vec![put("/pods/a/q", "n2:x", Some(":pending"))]));
        // Bound to n2 from nothing, and deleted from n1: both wake their node's watch.
        hub.publish(&Arc::from(vec![delete("/pods/b/r", "n1:x")]));
        hub.publish(&Arc::from(vec![put("/pods/a/s", ":pending", None)]));
        hub.publish(&Arc::from(vec![put("/nodes/n9", "n9:x", None)]));

        assert_eq!(
            got(&mut n1),
            2,
            "n1's pod created, and its pod in b deleted"
        );
        assert_eq!(got(&mut n2), 1);
        assert_eq!(got(&mut n1_in_b), 1, "only the change under its own prefix");
        assert_eq!(got(&mut all), 4);
        assert_eq!(got(&mut other), 1);
    }

    #[test]
    fn closed_indexed_watches_are_forgotten() {
        let hub = Hub::new(0, 0);
        hub.index("/pods/", by_node());
        let gone = hub.subscribe_where("/pods/", Some("n1"), 8).unwrap();
        drop(gone);
        hub.publish(&Arc::from(vec![put("/pods/a/p", "n1:x", None)]));
        let subs = hub.subs.lock().unwrap();
        assert!(subs.as_ref().unwrap().indexed[0].by_value.is_empty());
    }

    /// A put at `revision`.
    fn at(revision: i64, key: &str) -> Event {
        let mut e = put(key, "v", None);
        e.kv.mod_revision = revision;
        e
    }

    fn revisions(batches: Option<Vec<Arc<[Event]>>>) -> Option<Vec<i64>> {
        batches.map(|b| {
            b.iter()
                .flat_map(|b| b.iter().map(Event::revision))
                .collect()
        })
    }

    #[test]
    fn recent_batches_replay_only_what_they_cover() {
        let one = weight(&at(1, "/k/a"));
        // Room for three single-event batches.
        let hub = Hub::new(0, 3 * one);
        assert_eq!(
            revisions(hub.since(1)),
            Some(vec![]),
            "the queue will have it"
        );
        hub.publish(&Arc::from(vec![at(1, "/k/a")]));
        hub.publish(&Arc::from(vec![at(2, "/k/a")]));
        assert_eq!(revisions(hub.since(1)), Some(vec![1, 2]));
        assert_eq!(revisions(hub.since(2)), Some(vec![2]));
        assert_eq!(
            revisions(hub.since(3)),
            Some(vec![]),
            "the queue has the rest"
        );
        hub.publish(&Arc::from(vec![at(3, "/k/a")]));
        hub.publish(&Arc::from(vec![at(4, "/k/a")]));
        assert_eq!(revisions(hub.since(1)), None, "revision 1 was let go");
        assert_eq!(revisions(hub.since(2)), Some(vec![2, 3, 4]));
        assert_eq!(revisions(hub.since(9)), Some(vec![]));

        // Batches of several revisions: replay begins with the one holding `from`. A store
        // reopened at revision 6 kept nothing before it: its history table has it.
        let hub = Hub::new(6, 1 << 20);
        assert_eq!(revisions(hub.since(6)), None);
        assert_eq!(revisions(hub.since(7)), Some(vec![]));
        hub.publish(&Arc::from(vec![at(7, "/k/a"), at(8, "/k/b")]));
        hub.publish(&Arc::from(vec![at(9, "/k/a")]));
        assert_eq!(revisions(hub.since(6)), None);
        assert_eq!(revisions(hub.since(8)), Some(vec![7, 8, 9]));
        assert_eq!(revisions(hub.since(9)), Some(vec![9]));

        // Nothing is kept longer than RECENT_AGE.
        let mut recent = Recent {
            batches: VecDeque::new(),
            bytes: 0,
            cap: 1 << 20,
        };
        let t = Instant::now();
        recent.push(&Arc::from(vec![at(1, "/k/a")]), t);
        recent.push(&Arc::from(vec![at(2, "/k/a")]), t + RECENT_AGE);
        assert_eq!(recent.batches.len(), 2);
        recent.push(
            &Arc::from(vec![at(3, "/k/a")]),
            t + RECENT_AGE + Duration::from_secs(1),
        );
        assert_eq!(recent.batches.len(), 2);
        assert_eq!(recent.bytes, 2 * one);
    }
}

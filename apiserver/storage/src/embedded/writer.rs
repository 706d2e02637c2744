//! The single writer thread: takes every write request queued since its last commit, applies
//! them in one redb transaction (each successful write gets the next revision), commits once
//! with an fsync (group commit), then publishes the events and answers the callers.
//! It also drops old history in small chunks so no commit is held up for long.
//!
//! With the write-ahead log (the default), a batch's durability is the log's fsync: redb is
//! committed without one, and every so often a checkpoint (one durable redb commit, then an
//! emptied log) runs after the batch's callers have their answers.

use super::codec;
use super::wal::Wal;
use super::{KV, LOG, META, META_COMPACTED, META_REVISION, Published};
use crate::{Deleted, Error, Event, EventKind, KeyValue, Result};
use bytes::Bytes;
use redb::{Database, Durability, ReadableTable, Table};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, oneshot};

/// Most requests applied in one commit.
const MAX_BATCH: usize = 1024;
/// Commits slower than this are logged.
const SLOW_COMMIT: std::time::Duration = std::time::Duration::from_millis(20);
/// Most history entries dropped in one commit.
const COMPACT_CHUNK: u64 = 1024;
/// A checkpoint runs once the log holds this much (or `checkpoint_every` after the last one).
const CHECKPOINT_BYTES: u64 = 16 << 20;

/// A write the writer thread carries out.
pub(super) enum Op {
    Create {
        key: String,
        value: Bytes,
    },
    Update {
        key: String,
        value: Bytes,
        expected: i64,
    },
    Delete {
        key: String,
        expected: Option<i64>,
    },
    /// Wakes the writer to drop history up to the (already raised) compaction floor.
    Compact,
    Close,
}

/// What a write answers.
pub(super) enum Reply {
    Kv(KeyValue),
    Deleted(Deleted),
    Done,
}

/// One queued write and where its answer goes.
pub(super) struct Request {
    pub op: Op,
    pub reply: oneshot::Sender<Result<Reply>>,
}

/// The writer thread's state.
pub(super) struct Writer {
    pub db: Arc<Database>,
    pub rx: mpsc::Receiver<Request>,
    pub hub: Arc<super::hub::Hub>,
    /// The list indexes, kept by the writer around each commit.
    pub lists: Arc<super::listindex::Lists>,
    pub published: Arc<Published>,
    /// The last committed revision.
    pub revision: i64,
    /// History below this revision is physically gone.
    pub physical_floor: i64,
    /// How many revisions of history to keep at least.
    pub history: i64,
    /// How long history is kept at least.
    pub history_age: std::time::Duration,
    /// When each recent batch was committed, with the revision after it (oldest first; the
    /// first is the newest older than `history_age`, or where the store opened).
    pub commits: std::collections::VecDeque<(std::time::Instant, i64)>,
    /// The write-ahead log, or `None` for a durable redb commit per batch.
    pub wal: Option<Wal>,
    /// The compaction floor in the last logged record.
    pub logged_floor: i64,
    /// When the last checkpoint finished.
    pub last_checkpoint: std::time::Instant,
    /// How long after the last checkpoint the next one is due.
    pub checkpoint_every: std::time::Duration,
}

impl Writer {
    /// Runs until the store is closed or every handle is dropped.
    pub fn run(mut self) {
        loop {
            let first = if self.compaction_pending() {
                match self.rx.try_recv() {
                    Ok(req) => req,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        if let Err(e) = self.commit_batch(&mut Vec::new()) {
                            tracing::error!(error = %e, "history compaction failed");
                        }
                        continue;
                    }
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            } else {
                match self.rx.blocking_recv() {
                    Some(req) => req,
                    None => return,
                }
            };
            let mut batch = vec![first];
            let mut close = None;
            while batch.len() < MAX_BATCH {
                match self.rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            if let Some(pos) = batch.iter().position(|r| matches!(r.op, Op::Close)) {
                // Requests queued behind the close are answered `Closed` when they are dropped.
                batch.truncate(pos + 1);
                close = batch.pop();
            }
            if let Err(e) = self.commit_batch(&mut batch) {
                tracing::error!(error = %e, "embedded store commit failed");
            }
            if let Some(close) = close {
                if let Err(e) = self.checkpoint() {
                    tracing::error!(error = %e, "final checkpoint of the embedded store failed");
                }
                drop(self.rx);
                drop(self.db);
                let _ = close.reply.send(Ok(Reply::Done));
                return;
            }
        }
    }

    /// The newest revision the store had `history_age` before `now` (or where it opened):
    /// reads at it, and later ones, must still work.
    fn newest_aged(&mut self, now: std::time::Instant) -> i64 {
        while self
            .commits
            .get(1)
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= self.history_age)
        {
            self.commits.pop_front();
        }
        self.commits.front().map_or(self.revision, |(_, r)| *r)
    }

    fn compaction_pending(&self) -> bool {
        self.physical_floor < self.published.compacted.load(Ordering::Acquire)
    }

    /// Applies a batch in one durable transaction and answers each request.
    fn commit_batch(&mut self, batch: &mut Vec<Request>) -> Result<()> {
        let mut results = Vec::with_capacity(batch.len());
        let mut events = Vec::with_capacity(batch.len());
        let start_revision = self.revision;
        let started = std::time::Instant::now();
        let mut compacted = 0;
        let outcome = (|| -> Result<i64> {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(match self.wal {
                Some(_) => Durability::None,
                None => Durability::Immediate,
            })?;
            let mut revision = start_revision;
            let mut floor = self.physical_floor;
            {
                let mut kv = txn.open_table(KV)?;
                let mut log = txn.open_table(LOG)?;
                let mut meta = txn.open_table(META)?;
                for req in batch.iter() {
                    let result = apply(&mut kv, &mut log, &req.op, revision + 1);
                    if let Ok((_, Some(event))) = &result {
                        revision += 1;
                        events.push(event.clone());
                    }
                    results.push(result.map(|(reply, _)| reply));
                }
                // Keep `history` revisions and `history_age` of them; compact logically at
                // once, physically in chunks.
                let auto = (revision - self.history).min(self.newest_aged(started));
                self.published.compacted.fetch_max(auto, Ordering::AcqRel);
                let target = self.published.compacted.load(Ordering::Acquire);
                if floor < target {
                    let t = std::time::Instant::now();
                    let upto = target.min(floor + COMPACT_CHUNK as i64);
                    for rev in floor.max(0)..upto {
                        log.remove(rev as u64)?;
                    }
                    compacted = upto - floor;
                    floor = upto;
                    meta.insert(META_COMPACTED, floor as u64)?;
                    let stats = &self.published.stats;
                    stats
                        .worst_compaction_us
                        .fetch_max(micros(t.elapsed()), Ordering::Relaxed);
                    stats
                        .compacted_entries
                        .fetch_add(compacted as u64, Ordering::Relaxed);
                }
                if revision != start_revision {
                    meta.insert(META_REVISION, revision as u64)?;
                }
            }
            if let Some(wal) = &mut self.wal {
                // Durable from here: the log's fsync, before redb shows the batch to anyone.
                let floor = self.published.compacted.load(Ordering::Acquire);
                if !events.is_empty() || floor != self.logged_floor {
                    wal.append(revision, floor, &events)?;
                    self.logged_floor = floor;
                }
            }
            let applied = started.elapsed();
            self.lists.before_commit(&events);
            txn.commit()?;
            self.physical_floor = floor;
            let took = started.elapsed();
            let stats = &self.published.stats;
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats
                .writes
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            stats
                .worst_commit_us
                .fetch_max(micros(took), Ordering::Relaxed);
            if took > SLOW_COMMIT {
                tracing::warn!(
                    writes = batch.len(),
                    compacted,
                    apply_ms = applied.as_millis() as u64,
                    commit_ms = (took - applied).as_millis() as u64,
                    "slow storage commit"
                );
            }
            Ok(revision)
        })();
        match outcome {
            Ok(revision) => {
                if revision != self.revision {
                    self.commits.push_back((started, revision));
                }
                self.revision = revision;
                self.published.revision.store(revision, Ordering::Release);
                if !events.is_empty() {
                    self.lists.after_commit(&events);
                    self.hub.publish(&events.into());
                }
                for (req, result) in batch.drain(..).zip(results) {
                    let _ = req.reply.send(result);
                }
                if self.checkpoint_due() {
                    self.checkpoint()?;
                }
                Ok(())
            }
            Err(e) => {
                // Nothing of the batch was written: every caller learns it failed.
                for req in batch.drain(..) {
                    let _ = req
                        .reply
                        .send(Err(Error::Corrupt(format!("commit failed: {e}"))));
                }
                Err(e)
            }
        }
    }
}

impl Writer {
    fn checkpoint_due(&self) -> bool {
        self.wal.as_ref().is_some_and(|wal| {
            wal.len() >= CHECKPOINT_BYTES
                || (wal.len() > 0 && self.last_checkpoint.elapsed() >= self.checkpoint_every)
        })
    }

    /// Makes every logged batch durable in redb (one durable commit) and empties the log.
    fn checkpoint(&mut self) -> Result<()> {
        let Some(wal) = &mut self.wal else {
            return Ok(());
        };
        if wal.len() == 0 {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(META)?
            .insert(META_REVISION, self.revision as u64)?;
        txn.commit()?;
        wal.reset()?;
        let took = started.elapsed();
        self.last_checkpoint = std::time::Instant::now();
        let stats = &self.published.stats;
        stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        stats
            .worst_checkpoint_us
            .fetch_max(micros(took), Ordering::Relaxed);
        if took > SLOW_COMMIT {
            tracing::warn!(took_ms = took.as_millis() as u64, "slow storage checkpoint");
        }
        Ok(())
    }
}

fn micros(d: std::time::Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

pub(super) type KvTable<'t> = Table<'t, &'static [u8], &'static [u8]>;
pub(super) type LogTable<'t> = Table<'t, u64, &'static [u8]>;

/// Applies one write at `revision`; returns the reply and, if it changed anything, its event.
fn apply(
    kv: &mut KvTable<'_>,
    log: &mut LogTable<'_>,
    op: &Op,
    revision: i64,
) -> Result<(Reply, Option<Event>)> {
    let current = |kv: &KvTable<'_>, key: &str| -> Result<Option<KeyValue>> {
        kv.get(key.as_bytes())?
            .map(|raw| codec::decode_value(key.as_bytes(), raw.value()))
            .transpose()
    };
    let check = |key: &str, cur: &Option<KeyValue>, expected: Option<i64>| -> Result<KeyValue> {
        let cur = cur
            .clone()
            .ok_or_else(|| Error::NotFound { key: key.into() })?;
        match expected {
            Some(expected) if expected != cur.mod_revision => Err(Error::Conflict {
                key: key.into(),
                expected,
                current: Box::new(cur),
            }),
            _ => Ok(cur),
        }
    };
    let event = match op {
        Op::Create { key, value } => {
            if current(kv, key)?.is_some() {
                return Err(Error::AlreadyExists { key: key.clone() });
            }
            let new = KeyValue {
                key: key.clone(),
                value: value.clone(),
                create_revision: revision,
                mod_revision: revision,
            };
            Event {
                kind: EventKind::Put,
                kv: new,
                prev: None,
            }
        }
        Op::Update {
            key,
            value,
            expected,
        } => {
            let prev = check(key, &current(kv, key)?, Some(*expected))?;
            Event {
                kind: EventKind::Put,
                kv: KeyValue {
                    key: key.clone(),
                    value: value.clone(),
                    create_revision: prev.create_revision,
                    mod_revision: revision,
                },
                prev: Some(prev),
            }
        }
        Op::Delete { key, expected } => {
            let prev = check(key, &current(kv, key)?, *expected)?;
            Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: key.clone(),
                    value: Bytes::new(),
                    create_revision: 0,
                    mod_revision: revision,
                },
                prev: Some(prev),
            }
        }
        // Compaction itself happens after the batch's writes; these only wake the writer.
        Op::Compact | Op::Close => return Ok((Reply::Done, None)),
    };
    store_event(kv, log, &event)?;
    let reply = match event.kind {
        EventKind::Put => Reply::Kv(event.kv.clone()),
        EventKind::Delete => Reply::Deleted(Deleted {
            prev: event.prev.clone().expect("a delete has a previous value"),
            revision,
        }),
        EventKind::Progress => unreachable!("a write is a put or a delete"),
    };
    Ok((reply, Some(event)))
}

/// Writes one change: the key's new current value (or its removal) and its history entry.
pub(super) fn store_event(
    kv: &mut KvTable<'_>,
    log: &mut LogTable<'_>,
    event: &Event,
) -> Result<()> {
    match event.kind {
        EventKind::Put => {
            let raw = codec::encode_value(
                event.kv.create_revision,
                event.kv.mod_revision,
                &event.kv.value,
            );
            kv.insert(event.kv.key.as_bytes(), raw.as_slice())?;
        }
        EventKind::Delete => {
            kv.remove(event.kv.key.as_bytes())?;
        }
        EventKind::Progress => unreachable!("a watch's progress is never stored"),
    }
    log.insert(
        event.kv.mod_revision as u64,
        codec::encode_event(event).as_slice(),
    )?;
    Ok(())
}

//! The embedded backend: one redb file holding the current keys (`kv`), a bounded history of
//! changes keyed by revision (`log`, for watches and reads at older revisions) and the current
//! revision (`meta`), and a write-ahead log beside it. Writes go through one writer thread that
//! commits concurrent requests together, made durable by one sequential append to the log;
//! reads use redb's snapshot transactions and never wait for the writer.

mod codec;
mod hub;
mod listindex;
#[cfg(test)]
mod test_events;
mod undo;
mod wal;
mod writer;

use crate::{
    Deleted, Error, Event, EventKind, KeyValue, RangeRequest, RangeResult, Result, Store,
    WatchIndex, WatchStream, prefix_end,
};
use bytes::Bytes;
use futures::StreamExt;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use writer::{Op, Reply, Request, Writer};

const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";

/// Ranges of at most this many keys at the latest revision are read on the caller's thread.
const INLINE_RANGE: usize = 64;

/// How many history entries a watch replays per read transaction.
const REPLAY_CHUNK: u64 = 512;

/// redb's page cache by default: 4 MiB. The cache fills with every page written (the history
/// log's pages too, which are written once and rarely read) and never shrinks, while the
/// kernel's page cache holds the same file's pages anyway: at 32 MiB an api-bench run of
/// 2,000 objects left 22 MiB of it behind as anonymous memory, at 4 MiB the same run showed
/// no slower reads or writes, and scale-bench's 5,000 pods ran as fast with 32 MiB less at
/// their peak (docs/benchmarks.md). `minik8s up --store-cache-mib` sets it.
pub const DEFAULT_CACHE_BYTES: usize = 4 << 20;

/// How long history is kept at least by default ([`EmbeddedOptions::history_age`]);
/// `minik8s up --store-history-age` sets it.
pub const DEFAULT_HISTORY_AGE: Duration = Duration::from_secs(300);

/// Settings of the embedded store.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// How many revisions of history to keep for watches and reads at older revisions, at
    /// most (the apiserver also compacts by age, every 5 minutes). Watches that see few of
    /// their prefix's changes are kept recent by bookmarks and progress instead (a watch
    /// starts again from a revision at most seconds old). 100,000, tried at 1,000 nodes,
    /// grew the file to 1 GB (each entry holds the previous value) and its reads missed the
    /// page cache.
    pub history: i64,
    /// History younger than this is kept beyond [`history`](Self::history) revisions: every
    /// page of a paginated LIST is read at the first page's revision, and a LIST of 150,000
    /// pods by kubectl's pages of 500 runs for seconds to tens of seconds while 5,000 nodes
    /// write 500–1,000 revisions a second (10,000 revisions were 10–20 s, and such a LIST
    /// ended `Expired`). 5 minutes by default, as upstream's etcd keeps at least (the
    /// apiserver compacts it every 5 minutes): 60 s was too short at 150,000 pods, where a
    /// restarted server's informers and a client's recount listed them in pages while 5,000
    /// nodes renewed their Leases, and both ended `Expired` (docs/benchmarks.md).
    pub history_age: Duration,
    /// How many write batches a watcher may fall behind before it catches up from disk. A
    /// catch-up reads every change since the watcher's revision, of every prefix: at 5,000
    /// nodes (500 Lease renewals a second), 1,024 batches were a second or two of a busy
    /// watcher's stall, and catching up took three quarters of the CPU, which made it fall
    /// behind again (docs/benchmarks.md). Queued batches are shared with the other watchers.
    pub watch_buffer: usize,
    /// How many bytes of recent write batches (at most [`hub::RECENT_AGE`] old) are kept in
    /// memory for new watches, and watches that fell behind, to replay from instead of
    /// reading the history table (all prefixes' changes since their revision) from disk: at
    /// 5,000 nodes, 5,000 kubelets starting watches made those reads 80 % of the CPU.
    pub recent_bytes: usize,
    /// Queued writes beyond which callers wait.
    pub write_queue: usize,
    /// redb's page cache size in bytes ([`DEFAULT_CACHE_BYTES`]).
    pub cache_bytes: usize,
    /// Make commits durable through the write-ahead log (sequential appends, redb checkpointed
    /// in the background) rather than with a durable redb commit per batch, whose random page
    /// writes stalled writers for up to 0.85 s under churn.
    pub wal: bool,
    /// With the log, how often its batches are checkpointed into redb while writes go on (a
    /// checkpoint is one durable redb commit of the pages changed since the last: 23–30 ms at
    /// full churn every 250 ms, 36 ms every second).
    pub checkpoint_every: Duration,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            history: 10_000,
            history_age: DEFAULT_HISTORY_AGE,
            watch_buffer: 16_384,
            recent_bytes: 64 << 20,
            write_queue: 8192,
            cache_bytes: DEFAULT_CACHE_BYTES,
            wal: true,
            checkpoint_every: Duration::from_millis(250),
        }
    }
}

/// Revisions the writer publishes for readers.
pub(crate) struct Published {
    /// The last committed revision.
    revision: AtomicI64,
    /// Reads and watches before this revision answer `Compacted`.
    compacted: AtomicI64,
    /// Counters of the writer, for [`Embedded::stats`].
    stats: WriterStats,
    /// What reads at older revisions undo, kept for their next pages.
    undo: undo::Kept,
}

impl Published {
    /// `Compacted` when reads or watches at `revision` are no longer possible.
    fn not_compacted(&self, revision: i64) -> Result<()> {
        let compacted = self.compacted.load(Ordering::Acquire);
        if revision < compacted {
            return Err(Error::Compacted {
                requested: revision,
                compacted,
            });
        }
        Ok(())
    }
}

/// Counters the writer keeps about its commits.
#[derive(Default)]
pub(crate) struct WriterStats {
    commits: AtomicU64,
    writes: AtomicU64,
    compacted_entries: AtomicU64,
    worst_commit_us: AtomicU64,
    worst_compaction_us: AtomicU64,
    checkpoints: AtomicU64,
    worst_checkpoint_us: AtomicU64,
}

/// What the writer has done since the store was opened.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Transactions committed.
    pub commits: u64,
    /// Writes applied (several per commit under concurrency).
    pub writes: u64,
    /// History entries dropped by compaction.
    pub compacted_entries: u64,
    /// The longest commit, apply and fsync included, in milliseconds.
    pub worst_commit_ms: f64,
    /// The longest time compaction added to one commit, in milliseconds.
    pub worst_compaction_ms: f64,
    /// Checkpoints of the write-ahead log into redb.
    pub checkpoints: u64,
    /// The longest checkpoint, in milliseconds.
    pub worst_checkpoint_ms: f64,
}

struct Inner {
    path: PathBuf,
    db: Mutex<Option<Arc<Database>>>,
    hub: Arc<hub::Hub>,
    lists: Arc<listindex::Lists>,
    /// Batches a watch may have queued before it catches up from history instead.
    watch_buffer: usize,
    writes: mpsc::Sender<Request>,
    published: Arc<Published>,
}

/// The embedded, crash-safe store (one redb file). Cheap to clone; clones share the store.
#[derive(Clone)]
pub struct Embedded {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Embedded {
    /// Opens (or creates) the store in `dir` (file `dir/store.redb`) with default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(dir, EmbeddedOptions::default())
    }

    /// Opens (or creates) the store in `dir` with the given options.
    pub fn open_with(dir: impl AsRef<Path>, options: EmbeddedOptions) -> Result<Self> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let path = dir.join("store.redb");
        let open_err = |source: redb::Error| Error::Open {
            path: path.clone(),
            source,
        };
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create(&path)
            .map_err(|e| open_err(e.into()))?;
        // Make sure the tables exist and read where the last run stopped.
        let txn = db.begin_write().map_err(|e| open_err(e.into()))?;
        let (revision, floor) = {
            txn.open_table(KV).map_err(|e| open_err(e.into()))?;
            txn.open_table(LOG).map_err(|e| open_err(e.into()))?;
            let meta = txn.open_table(META).map_err(|e| open_err(e.into()))?;
            let get = |k| -> Result<i64> { Ok(meta.get(k)?.map_or(0, |v| v.value() as i64)) };
            (get(META_REVISION)?, get(META_COMPACTED)?)
        };
        txn.commit().map_err(|e| open_err(e.into()))?;
        let (revision, compacted, wal) = recover(&db, dir, revision, floor, options.wal)?;

        let db = Arc::new(db);
        let published = Arc::new(Published {
            revision: AtomicI64::new(revision),
            compacted: AtomicI64::new(compacted),
            stats: WriterStats::default(),
            undo: undo::Kept::default(),
        });
        let hub = Arc::new(hub::Hub::new(revision, options.recent_bytes));
        let lists = Arc::new(listindex::Lists::default());
        let (writes, rx) = mpsc::channel(options.write_queue.max(16));
        let writer = Writer {
            db: db.clone(),
            rx,
            hub: hub.clone(),
            lists: lists.clone(),
            published: published.clone(),
            revision,
            physical_floor: floor,
            history: options.history.max(1),
            history_age: options.history_age,
            commits: std::collections::VecDeque::from([(std::time::Instant::now(), revision)]),
            wal,
            logged_floor: compacted,
            last_checkpoint: std::time::Instant::now(),
            checkpoint_every: options.checkpoint_every,
        };
        std::thread::Builder::new()
            .name("storage-writer".into())
            .spawn(move || writer.run())
            .map_err(|source| Error::Io {
                what: "starting the storage writer thread".into(),
                source,
            })?;
        tracing::debug!(path = %path.display(), revision, "opened embedded store");
        Ok(Embedded {
            inner: Arc::new(Inner {
                path,
                db: Mutex::new(Some(db)),
                hub,
                lists,
                watch_buffer: options.watch_buffer.max(16),
                writes,
                published,
            }),
        })
    }

    /// A watch of `prefix` from `start_revision` (0: the next write); with `value`, woken
    /// only by the changes an index of the prefix reads as that value.
    fn watch_from(
        &self,
        prefix: &str,
        start_revision: i64,
        value: Option<&str>,
    ) -> Result<WatchStream> {
        // Subscribe before reading history, so nothing committed in between is missed.
        let live = self
            .inner
            .hub
            .subscribe_where(prefix, value, self.inner.watch_buffer)
            .ok_or(Error::Closed)?;
        let next = match start_revision {
            0 => self.inner.published.revision.load(Ordering::Acquire) + 1,
            r => r,
        };
        let (tx, rx) = mpsc::channel(256);
        let watcher = Watcher {
            store: self.clone(),
            prefix: prefix.to_owned(),
            next,
            tx,
            progress: value.is_some(),
        };
        minik8s_task::spawn("store-watch", watcher.run(live));
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
    }

    /// Flushes queued writes, ends every watch and closes the file, for all clones.
    pub async fn close(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        if self
            .inner
            .writes
            .send(Request {
                op: Op::Close,
                reply,
            })
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
        self.inner.hub.close();
        let db = self.inner.db.lock().expect("db lock").take();
        if let Some(mut db) = db {
            // Short reads may still hold the database; wait for them to finish.
            for _ in 0..500 {
                match Arc::try_unwrap(db) {
                    Ok(db) => {
                        drop(db);
                        return Ok(());
                    }
                    Err(still_shared) => db = still_shared,
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tracing::warn!("embedded store closed while a read still held it");
        }
        Ok(())
    }

    /// Counters of the writer since the store was opened.
    pub fn stats(&self) -> Stats {
        let s = &self.inner.published.stats;
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1000.0;
        Stats {
            commits: s.commits.load(Ordering::Relaxed),
            writes: s.writes.load(Ordering::Relaxed),
            compacted_entries: s.compacted_entries.load(Ordering::Relaxed),
            worst_commit_ms: ms(&s.worst_commit_us),
            worst_compaction_ms: ms(&s.worst_compaction_us),
            checkpoints: s.checkpoints.load(Ordering::Relaxed),
            worst_checkpoint_ms: ms(&s.worst_checkpoint_us),
        }
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn db(&self) -> Result<Arc<Database>> {
        self.inner
            .db
            .lock()
            .expect("db lock")
            .clone()
            .ok_or(Error::Closed)
    }

    async fn write(&self, op: Op) -> Result<Reply> {
        let (reply, rx) = oneshot::channel();
        self.inner
            .writes
            .send(Request { op, reply })
            .await
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database, &Published) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let db = self.db()?;
        let published = self.inner.published.clone();
        tokio::task::spawn_blocking(move || f(&db, &published))
            .await
            .map_err(|e| Error::Corrupt(format!("read task failed: {e}")))?
    }
}

/// Applies the write-ahead log's batches that redb's last durable commit does not hold, makes
/// them durable in redb and empties the log. Returns the revision, the logical compaction
/// floor and the log to go on with (`None` when the store runs without one).
fn recover(
    db: &Database,
    dir: &Path,
    revision: i64,
    floor: i64,
    use_wal: bool,
) -> Result<(i64, i64, Option<wal::Wal>)> {
    if !use_wal && !dir.join(wal::FILE).exists() {
        return Ok((revision, floor, None));
    }
    let wal::Recovered {
        mut wal,
        records,
        torn_bytes,
    } = wal::Wal::open(dir)?;
    let compacted = records.iter().map(|r| r.compacted).fold(floor, i64::max);
    let (mut last, mut replayed) = (revision, 0usize);
    if records.iter().any(|r| r.revision > revision) {
        let txn = db.begin_write()?;
        {
            let mut kv = txn.open_table(KV)?;
            let mut log = txn.open_table(LOG)?;
            for record in &records {
                for event in &record.events {
                    let rev = event.revision();
                    if rev <= last {
                        continue;
                    }
                    if rev != last + 1 {
                        return Err(Error::Corrupt(format!(
                            "write-ahead log jumps from revision {last} to {rev}"
                        )));
                    }
                    writer::store_event(&mut kv, &mut log, event)?;
                    last = rev;
                    replayed += 1;
                }
            }
            txn.open_table(META)?.insert(META_REVISION, last as u64)?;
        }
        txn.commit()?;
    }
    if replayed > 0 || torn_bytes > 0 {
        tracing::info!(
            replayed,
            torn_bytes,
            revision = last,
            "recovered the embedded store from its write-ahead log"
        );
    }
    if !use_wal {
        drop(wal);
        std::fs::remove_file(dir.join(wal::FILE)).map_err(|source| Error::Io {
            what: "removing the write-ahead log".into(),
            source,
        })?;
        return Ok((last, compacted, None));
    }
    wal.reset()?;
    Ok((last, compacted, Some(wal)))
}

fn kv_reply(reply: Reply) -> KeyValue {
    match reply {
        Reply::Kv(kv) => kv,
        _ => unreachable!("the writer answers a put with a key-value"),
    }
}

/// Rejects keys the store cannot hold.
fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidRequest("empty key".into()));
    }
    Ok(())
}

impl Store for Embedded {
    async fn current_revision(&self) -> Result<i64> {
        self.db()?;
        Ok(self.inner.published.revision.load(Ordering::Acquire))
    }

    async fn compacted_revision(&self) -> Result<i64> {
        self.db()?;
        Ok(self.inner.published.compacted.load(Ordering::Acquire))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let db = self.db()?;
        let txn = db.begin_read()?;
        let kv = txn.open_table(KV)?;
        let raw = kv.get(key.as_bytes())?;
        raw.map(|raw| codec::decode_value(key.as_bytes(), raw.value()))
            .transpose()
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResult> {
        // A short read of the latest revision costs less than the hand-off to a blocking
        // thread (two context switches); long ranges and reads of history go there.
        if req.revision <= 0 && (1..=INLINE_RANGE).contains(&req.limit) {
            return range_at(&*self.db()?, &self.inner.published, &req);
        }
        self.blocking(move |db, published| range_at(db, published, &req))
            .await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        check_key(key)?;
        let op = Op::Create {
            key: key.to_owned(),
            value,
        };
        self.write(op).await.map(kv_reply)
    }

    async fn update(&self, key: &str, value: Bytes, expected: i64) -> Result<KeyValue> {
        check_key(key)?;
        let op = Op::Update {
            key: key.to_owned(),
            value,
            expected,
        };
        self.write(op).await.map(kv_reply)
    }

    async fn delete(&self, key: &str, expected: Option<i64>) -> Result<Deleted> {
        check_key(key)?;
        let op = Op::Delete {
            key: key.to_owned(),
            expected,
        };
        match self.write(op).await? {
            Reply::Deleted(d) => Ok(d),
            _ => unreachable!("the writer answers a delete with the deleted value"),
        }
    }

    async fn watch(&self, prefix: &str, start_revision: i64) -> Result<WatchStream> {
        self.watch_from(prefix, start_revision, None)
    }

    fn index(&self, prefix: &str, index: WatchIndex) -> Result<()> {
        self.inner.lists.add(&*self.db()?, prefix, index.clone())?;
        self.inner.hub.index(prefix, index);
        Ok(())
    }

    async fn range_where(&self, req: RangeRequest, value: &str) -> Result<Option<RangeResult>> {
        if req.revision > 0 {
            return Ok(None);
        }
        let (lists, value) = (self.inner.lists.clone(), value.to_owned());
        self.blocking(move |db, _| lists.range(db, &req, &value))
            .await
    }

    async fn watch_where(
        &self,
        prefix: &str,
        start_revision: i64,
        value: &str,
    ) -> Result<WatchStream> {
        self.watch_from(prefix, start_revision, Some(value))
    }
    async fn compact(&self, revision: i64) -> Result<()> {
        let current = self.current_revision().await?;
        if revision > current {
            return Err(Error::FutureRevision {
                requested: revision,
                current,
            });
        }
        self.inner
            .published
            .compacted
            .fetch_max(revision, Ordering::AcqRel);
        self.write(Op::Compact).await.map(|_| ())
    }
}

/// The last committed revision a read transaction sees.
fn snapshot_revision(txn: &redb::ReadTransaction) -> Result<i64> {
    Ok(txn
        .open_table(META)?
        .get(META_REVISION)?
        .map_or(0, |v| v.value() as i64))
}

/// Reads a range at the latest or an older revision from one snapshot: the current keys,
/// with the changes made after the requested revision undone from the history.
fn range_at(db: &Database, published: &Published, req: &RangeRequest) -> Result<RangeResult> {
    let txn = db.begin_read()?;
    let current = snapshot_revision(&txn)?;
    let at = if req.revision <= 0 {
        current
    } else {
        req.revision
    };
    if at > current {
        return Err(Error::FutureRevision {
            requested: at,
            current,
        });
    }
    published.not_compacted(at)?;
    let lower: Vec<u8> = match &req.start_after {
        Some(k) if k.as_str() >= req.prefix.as_str() => k.as_bytes().to_vec(),
        _ => req.prefix.as_bytes().to_vec(),
    };
    let lower_bound = if req
        .start_after
        .as_deref()
        .is_some_and(|k| k >= req.prefix.as_str())
    {
        Bound::Excluded(lower.as_slice())
    } else {
        Bound::Included(lower.as_slice())
    };
    let upper = prefix_end(&req.prefix);
    let upper_bound = match &upper {
        Some(u) => Bound::Excluded(u.as_slice()),
        None => Bound::Unbounded,
    };

    // The state at `at` of every key changed since: the previous value of its oldest later
    // change. A page after the first of a paginated read goes on from the changes the page
    // before found, reading only the history written since.
    let log = if at < current {
        Some(txn.open_table(LOG)?)
    } else {
        None
    };
    let mut changes = None;
    if let Some(log) = &log {
        let after = match lower_bound {
            Bound::Excluded(k) => Some(k),
            _ => None,
        };
        let mut c = published
            .undo
            .take(&req.prefix, at, current, after)
            .unwrap_or_else(|| undo::Changes::new(&req.prefix, at));
        if let Some(k) = after {
            c.drop_to(k);
        }
        for entry in log.range((c.upto() as u64 + 1)..=(current as u64))? {
            let (rev, raw) = entry?;
            c.note(rev.value(), codec::event_key(raw.value())?);
        }
        c.read_to(current);
        changes = Some(c);
    }

    let kv = txn.open_table(KV)?;
    let mut latest = kv.range::<&[u8]>((lower_bound, upper_bound))?.peekable();
    let mut undone = changes
        .iter()
        .flat_map(|c| c.in_range((lower_bound, upper_bound)))
        .peekable();
    // A changed key's value at `at`: the previous value in the history entry of its first
    // change since.
    let value_at = |rev: u64| -> Result<Option<KeyValue>> {
        let log = log.as_ref().expect("changes come from the history");
        let raw = log
            .get(rev)?
            .ok_or_else(|| Error::Corrupt(format!("history entry {rev} is missing")))?;
        Ok(codec::decode_event(rev, raw.value())?.prev)
    };
    let limit = req.max_keys();
    let mut kvs = Vec::new();
    let mut more = false;
    let mut beyond = 0;
    loop {
        let next_latest = match latest.peek() {
            Some(Ok((k, _))) => Some(k.value().to_vec()),
            Some(Err(_)) => {
                return Err(latest.next().expect("peeked").err().expect("error").into());
            }
            None => None,
        };
        let next_undone = undone.peek().map(|&(k, _)| k.as_slice());
        // The next key's value at `at`: `None` if it did not exist then, `Some(None)` if it
        // is current and beyond the page (only counted: no need to decode it).
        let found = match (next_latest.as_deref(), next_undone) {
            (None, None) => break,
            (Some(l), Some(u)) if u <= l => {
                if u == l {
                    latest.next();
                }
                value_at(*undone.next().expect("peeked").1)?.map(Some)
            }
            (Some(_), _) => {
                let (k, v) = latest.next().expect("peeked")?;
                Some(
                    (kvs.len() < limit)
                        .then(|| codec::decode_value(k.value(), v.value()))
                        .transpose()?,
                )
            }
            (None, Some(_)) => value_at(*undone.next().expect("peeked").1)?.map(Some),
        };
        let Some(item) = found else { continue };
        if kvs.len() == limit {
            more = true;
            if !req.count {
                break;
            }
            beyond += 1;
            continue;
        }
        kvs.push(item.expect("decoded within the page"));
    }
    drop(undone);
    // Pages may follow: keep what this one found.
    if let Some(c) = changes.filter(|_| more) {
        published.undo.put(c);
    }
    let count = kvs.len() + beyond;
    Ok(RangeResult {
        kvs,
        more,
        revision: at,
        count,
    })
}

/// Reads the history entries from `from` on (at most `REPLAY_CHUNK`) under `prefix`; returns
/// them and the revision to continue from.
fn read_history(
    db: &Database,
    published: &Published,
    prefix: &str,
    from: i64,
    until: i64,
) -> Result<(Vec<Event>, i64)> {
    let txn = db.begin_read()?;
    published.not_compacted(from)?;
    let current = snapshot_revision(&txn)?;
    let end = current.min(until).min(from + REPLAY_CHUNK as i64 - 1);
    let log = txn.open_table(LOG)?;
    let mut events = Vec::new();
    if from <= end {
        for entry in log.range((from as u64)..=(end as u64))? {
            let (rev, raw) = entry?;
            if codec::event_key(raw.value())?.starts_with(prefix.as_bytes()) {
                events.push(codec::decode_event(rev.value(), raw.value())?);
            }
        }
    }
    Ok((events, end.max(from - 1) + 1))
}

/// One watch: replays history from its start revision, then follows the live events; if it
/// falls behind the live channel it catches up from history again.
struct Watcher {
    store: Embedded,
    prefix: String,
    /// The next revision this watch has not yet delivered.
    next: i64,
    tx: mpsc::Sender<Result<Event>>,
    /// Whether it tells its progress while quiet (an indexed watch: [`EventKind::Progress`]).
    progress: bool,
}

/// How long an indexed watch stays quiet before it tells its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

impl Watcher {
    async fn run(mut self, mut live: hub::Subscription) {
        if let Err(e) = self.catch_up().await {
            let _ = self.tx.send(Err(e)).await;
            return;
        }
        loop {
            let batch = tokio::select! {
                batch = live.batches.recv() => batch,
                _ = live.lag.notified() => {
                    // Deliver what is queued first, then what was dropped, from history.
                    while let Ok(batch) = live.batches.try_recv() {
                        if !self.deliver_batch(&batch).await {
                            return;
                        }
                    }
                    if live.lagged.swap(false, Ordering::AcqRel) {
                        tracing::warn!(prefix = %self.prefix, from = self.next, "a watch fell behind its queue; catching up from history");
                        if let Err(e) = self.catch_up().await {
                            let _ = self.tx.send(Err(e)).await;
                            return;
                        }
                    }
                    continue;
                }
                _ = self.tx.closed() => return,
                _ = tokio::time::sleep(PROGRESS_EVERY), if self.progress => {
                    if !self.tell_progress(&mut live).await {
                        return;
                    }
                    continue;
                }
            };
            match batch {
                Some(batch) => {
                    if !self.deliver_batch(&batch).await {
                        return;
                    }
                }
                None => {
                    let _ = self.tx.send(Err(Error::Closed)).await;
                    return;
                }
            }
        }
    }

    /// While its value is quiet: every batch published so far is queued (or flagged as
    /// dropped), so once the queue is drained and nothing was dropped, the watch has been
    /// handed everything it wants up to the hub's published revision, and says so. False once
    /// the receiver is gone.
    async fn tell_progress(&mut self, live: &mut hub::Subscription) -> bool {
        let published = self.store.inner.hub.published();
        while let Ok(batch) = live.batches.try_recv() {
            if !self.deliver_batch(&batch).await {
                return false;
            }
        }
        if live.lagged.load(Ordering::Acquire) || published < self.next {
            return true;
        }
        self.next = published + 1;
        let progress = Event {
            kind: EventKind::Progress,
            kv: KeyValue {
                key: String::new(),
                value: Bytes::new(),
                create_revision: 0,
                mod_revision: published,
            },
            prev: None,
        };
        self.tx.send(Ok(progress)).await.is_ok()
    }

    /// Sends a batch's events under the prefix; false once the receiver is gone.
    async fn deliver_batch(&mut self, batch: &[Event]) -> bool {
        for event in batch {
            if !self.deliver(event.clone()).await {
                return false;
            }
        }
        true
    }

    /// Sends one event if it is new and under the prefix; false once the receiver is gone.
    async fn deliver(&mut self, event: Event) -> bool {
        let rev = event.revision();
        if rev < self.next {
            return true;
        }
        self.next = rev + 1;
        if !event.kv.key.starts_with(&self.prefix) {
            return true;
        }
        self.tx.send(Ok(event)).await.is_ok()
    }

    /// Delivers every committed change from `next` on: from the hub's recent batches when
    /// they reach back to `next` (with the subscription's queue, they hold every change), else
    /// from the history table up to where the hub's batches begin, then from them. After a
    /// restart the hub holds everything since it, so a watch resumed from before the restart
    /// reads from the table only what came before it, not every revision since.
    async fn catch_up(&mut self) -> Result<()> {
        self.store.inner.published.not_compacted(self.next)?;
        loop {
            if let Some(batches) = self.store.inner.hub.since(self.next) {
                for batch in batches {
                    if !self.deliver_batch(&batch).await {
                        return Err(Error::Closed);
                    }
                }
                return Ok(());
            }
            let current = self.store.inner.published.revision.load(Ordering::Acquire);
            if self.next > current {
                return Ok(());
            }
            let (prefix, from) = (self.prefix.clone(), self.next);
            // At least `from` itself, so every read moves on.
            let until = self
                .store
                .inner
                .hub
                .kept_from()
                .map_or(current, |first| (first - 1).max(from));
            let (events, next) = self
                .store
                .blocking(move |db, published| read_history(db, published, &prefix, from, until))
                .await?;
            for event in events {
                if !self.deliver(event).await {
                    return Err(Error::Closed);
                }
            }
            self.next = self.next.max(next);
        }
    }
}

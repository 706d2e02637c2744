//! The etcd backend: a thin adapter from the [`Store`] trait to etcd v3 transactions, ranges,
//! watches and compaction (the data model the trait was cut from).

use crate::{
    Deleted, Error, Event, EventKind, KeyValue, RangeRequest, RangeResult, Result, Store,
    WatchStream, prefix_end,
};
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KvClient, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchClient, WatchOptions,
};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A store kept in an etcd cluster. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

struct Inner {
    kv: KvClient,
    watch: WatchClient,
    /// The newest compaction this process has seen (etcd does not report it on its own).
    compacted: AtomicI64,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd").finish_non_exhaustive()
    }
}

/// TLS to etcd (PEM): the CA the members' certificates are signed by, and this client's
/// certificate and key (upstream's `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`).
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA certificate.
    pub ca_pem: String,
    /// The client certificate.
    pub cert_pem: String,
    /// The client key.
    pub key_pem: String,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

impl Etcd {
    /// Connects to etcd at the given endpoints (`http://host:port`).
    pub async fn connect(endpoints: &[String]) -> Result<Self> {
        Self::connect_with(endpoints, None).await
    }

    /// Connects to etcd at the given endpoints, over TLS when `tls` is given (the endpoints'
    /// `http://` is then `https://`).
    pub async fn connect_with(endpoints: &[String], tls: Option<&EtcdTls>) -> Result<Self> {
        // As upstream's apiserver: a member without a leader refuses requests with "no leader"
        // (sent again for an election's length, then a 503; watches end so they are resumed
        // elsewhere) instead of holding them;
        // HTTP/2 pings find a dead member's connection.
        let base = etcd_client::ConnectOptions::new()
            .with_require_leader(true)
            .with_keep_alive(
                std::time::Duration::from_secs(10),
                std::time::Duration::from_secs(5),
            )
            .with_connect_timeout(std::time::Duration::from_secs(5));
        let (endpoints, options) = match tls {
            None => (endpoints.to_vec(), base),
            Some(tls) => {
                let endpoints = endpoints
                    .iter()
                    .map(|e| match e.strip_prefix("http://") {
                        Some(rest) => format!("https://{rest}"),
                        None => e.clone(),
                    })
                    .collect();
                let options = etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem))
                    .identity(etcd_client::Identity::from_pem(&tls.cert_pem, &tls.key_pem));
                (endpoints, base.with_tls(options))
            }
        };
        let client = Client::connect(&endpoints, Some(options)).await?;
        let etcd = Etcd {
            inner: Arc::new(Inner {
                kv: client.kv_client(),
                watch: client.watch_client(),
                compacted: AtomicI64::new(0),
            }),
        };
        // Fail now, not on the first request, when nothing answers.
        etcd.current_revision().await?;
        Ok(etcd)
    }

    /// `key`'s value at `revision` (0: the latest; `None`: absent then).
    async fn value_at(&self, key: &str, revision: i64) -> Result<Option<KeyValue>> {
        let kv = &self.inner.kv;
        let resp = read_again(|| {
            let mut kv = kv.clone();
            async move {
                kv.get(key, Some(GetOptions::new().with_revision(revision)))
                    .await
            }
        })
        .await
        .map_err(|e| self.read_error(e, revision))?;
        resp.kvs().first().map(convert).transpose()
    }

    /// Opens an etcd watch of `prefix` (every key when empty) from `start_revision` (0:
    /// from now), with the previous values.
    async fn open_watch(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<etcd_client::WatchStream> {
        let mut opts = WatchOptions::new().with_prev_key();
        opts = if prefix.is_empty() {
            opts.with_all_keys()
        } else {
            opts.with_prefix()
        };
        if start_revision > 0 {
            opts = opts.with_start_revision(start_revision);
        }
        let watch = &self.inner.watch;
        let stream = unreached_again(|| {
            let (mut watch, opts) = (watch.clone(), opts.clone());
            async move { watch.watch(prefix, Some(opts)).await }
        })
        .await?;
        Ok(stream)
    }

    /// Opens the watch again from `next` after its stream broke, trying for up to 30 s
    /// (an election, or a member coming back), then gives up with the last error.
    async fn resume_watch(&self, prefix: &str, next: i64) -> Result<etcd_client::WatchStream> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut wait = std::time::Duration::from_millis(50);
        loop {
            match self.open_watch(prefix, next).await {
                Ok(stream) => {
                    tracing::info!(prefix, revision = next, "etcd watch resumed");
                    return Ok(stream);
                }
                Err(e) if tokio::time::Instant::now() + wait < deadline => {
                    tracing::debug!(error = %e, prefix, "resuming the etcd watch");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn seen_compaction(&self, revision: i64) {
        self.inner.compacted.fetch_max(revision, Ordering::AcqRel);
    }

    /// Turns etcd's "compacted" / "future revision" answers into typed errors.
    fn read_error(&self, e: etcd_client::Error, requested: i64) -> Error {
        if let etcd_client::Error::GRpcStatus(status) = &e {
            // etcd reports these only as messages (mvcc.ErrCompacted, mvcc.ErrFutureRev).
            if status
                .message()
                .contains("required revision has been compacted")
            {
                let compacted = self
                    .inner
                    .compacted
                    .load(Ordering::Acquire)
                    .max(requested + 1);
                return Error::Compacted {
                    requested,
                    compacted,
                };
            }
            if status
                .message()
                .contains("required revision is a future revision")
            {
                return Error::FutureRevision {
                    requested,
                    current: -1,
                };
            }
        }
        e.into()
    }
}

/// Runs `op` again (up to 5 more times, a little later each time) while it fails without
/// having reached any member: the connection to the member the client's balancer picked could
/// not be made, so that member is down and another may answer. As etcd's own client does, a
/// request that reached a member is never sent twice.
async fn unreached_again<T, F, Fut>(mut op: F) -> std::result::Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let mut attempt = 0u64;
    loop {
        match op().await {
            Err(e) if attempt < 5 && unreached(&e) => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "no etcd member reached; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(10 * attempt)).await;
            }
            result => return result,
        }
    }
}

/// How long a request whose outcome is unknown is sent again: an etcd leader election takes
/// about a second (the election timeout), and a dead member's connection is found by the
/// keep-alive; within this the apiserver answers as if nothing happened.
const AGAIN_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a request etcd refused with "no leader" is sent again: the refusal comes before
/// the request reaches raft, so another copy is always safe. After a leader dies the others
/// elect one within an election timeout or two (etcd's default: 1 s, randomized up to 2 s);
/// past this the quorum is taken to be lost and the apiserver answers 503.
const ELECTION_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether etcd refused a request because the member has no leader (nothing was applied).
fn no_leader(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status)
        if status.code() == tonic::Code::Unavailable && status.message().contains("no leader"))
}

/// Whether a failed request is sent again, `elapsed` after it was first sent.
fn send_again(e: &etcd_client::Error, elapsed: std::time::Duration) -> bool {
    (elapsed < AGAIN_FOR && outcome_unknown(e)) || (elapsed < ELECTION_WAIT && no_leader(e))
}

/// The pause before sending a request again the `again`th time: 100 ms doubling to 1 s.
fn pause(again: u32) -> std::time::Duration {
    std::time::Duration::from_millis((100u64 << again.min(4).saturating_sub(1)).min(1000))
}

/// Sends a write transaction, and sends it again (for up to [`AGAIN_FOR`]) when its outcome is
/// unknown: the member that had it went away mid-request, or etcd gave up waiting on a lost
/// leader. The transactions are compare-and-swaps, so a second copy never writes twice; its
/// callers read their own bytes back to see that the first copy landed. Returns whether it was
/// sent again.
async fn write_txn(kv: &KvClient, txn: &Txn) -> Result<(etcd_client::TxnResponse, bool)> {
    let started = tokio::time::Instant::now();
    let mut again = 0u32;
    loop {
        let sent = unreached_again(|| {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await;
        match sent {
            Err(e) if send_again(&e, started.elapsed()) => {
                again += 1;
                tracing::info!(error = %e, again, "an etcd write failed without an answer or a leader; sending it again");
                tokio::time::sleep(pause(again)).await;
            }
            Err(e) => return Err(e.into()),
            Ok(resp) => return Ok((resp, again > 0)),
        }
    }
}

/// Sends a read, and sends it again (for up to [`AGAIN_FOR`]) while it fails in a way another
/// try may not: no member reached, or no answer came back. Reads change nothing, so as etcd's
/// own client does for them, a second copy is always safe.
async fn read_again<T, F, Fut>(mut op: F) -> std::result::Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let started = tokio::time::Instant::now();
    let mut again = 0u32;
    loop {
        match unreached_again(&mut op).await {
            Err(e) if send_again(&e, started.elapsed()) => {
                again += 1;
                tracing::debug!(error = %e, again, "an etcd read failed; sending it again");
                tokio::time::sleep(pause(again)).await;
            }
            result => return result,
        }
    }
}

/// Whether a request may have reached a member without an answer coming back: the connection
/// broke mid-request, or the member timed out waiting on consensus. etcd's "no leader" is a
/// clear answer (nothing was applied) and is not among them; see [`ELECTION_WAIT`].
fn outcome_unknown(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            use tonic::Code;
            matches!(
                status.code(),
                Code::Unknown
                    | Code::Internal
                    | Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Cancelled
            ) && !status.message().contains("no leader")
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// Whether a watch event creates its key (it has no previous value).
fn is_creation(event: &Event) -> bool {
    event.kind == EventKind::Put && event.kv.create_revision == event.kv.mod_revision
}

/// Whether a request failed before any member saw it (a failed connect).
fn unreached(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable
                && [
                    "tcp connect error",
                    "Connection refused",
                    "error trying to connect",
                ]
                .iter()
                .any(|m| status.message().contains(m))
        }
        _ => false,
    }
}

fn convert(kv: &etcd_client::KeyValue) -> Result<KeyValue> {
    Ok(KeyValue {
        key: kv
            .key_str()
            .map_err(|_| Error::Corrupt("etcd key is not UTF-8".into()))?
            .to_owned(),
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
    })
}

/// The first key-value of a transaction's `get` branch, if any.
fn got(responses: Vec<TxnOpResponse>) -> Result<Option<KeyValue>> {
    for r in responses {
        if let TxnOpResponse::Get(get) = r {
            return get.kvs().first().map(convert).transpose();
        }
    }
    Ok(None)
}

/// The error for a compare-and-swap whose compare failed, from the key's current value.
fn cas_failed(key: &str, expected: i64, current: Option<KeyValue>) -> Error {
    match current {
        None => Error::NotFound { key: key.into() },
        Some(current) => Error::Conflict {
            key: key.into(),
            expected,
            current: Box::new(current),
        },
    }
}

impl Store for Etcd {
    async fn current_revision(&self) -> Result<i64> {
        let kv = &self.inner.kv;
        let resp = read_again(|| {
            let mut kv = kv.clone();
            async move {
                kv.get("\0", Some(GetOptions::new().with_count_only()))
                    .await
            }
        })
        .await?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    async fn compacted_revision(&self) -> Result<i64> {
        Ok(self.inner.compacted.load(Ordering::Acquire))
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        // Revision 0 is etcd's latest.
        self.value_at(key, 0).await
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResult> {
        let start = match &req.start_after {
            Some(k) if k.as_str() >= req.prefix.as_str() => format!("{k}\0"),
            _ => req.prefix.clone(),
        };
        let end = prefix_end(&req.prefix).unwrap_or_else(|| vec![0]);
        let mut opts = GetOptions::new().with_range(end);
        if req.limit > 0 {
            opts = opts.with_limit(req.limit as i64);
        }
        if req.revision > 0 {
            opts = opts.with_revision(req.revision);
        }
        let kv = &self.inner.kv;
        let resp = read_again(|| {
            let (mut kv, start, opts) = (kv.clone(), start.clone(), opts.clone());
            async move { kv.get(start, Some(opts)).await }
        })
        .await
        .map_err(|e| self.read_error(e, req.revision))?;
        let kvs = resp.kvs().iter().map(convert).collect::<Result<Vec<_>>>()?;
        let revision = match req.revision {
            0 => resp.header().map_or(0, |h| h.revision()),
            r => r,
        };
        // etcd counts the whole range whatever the limit.
        let count = match req.count {
            true => usize::try_from(resp.count()).unwrap_or(kvs.len()),
            false => kvs.len(),
        };
        Ok(RangeResult {
            kvs,
            more: resp.more(),
            revision,
            count,
        })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value.to_vec(), None)])
            .or_else([TxnOp::get(key, None)]);
        let (resp, again) = write_txn(&self.inner.kv, &txn).await?;
        if !resp.succeeded() {
            // Sent again: the key holding these very bytes (an object's uid is in them) is
            // the first copy having landed.
            return match got(resp.op_responses())? {
                Some(current) if again && current.value == value => Ok(current),
                _ => Err(Error::AlreadyExists { key: key.into() }),
            };
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok(KeyValue {
            key: key.into(),
            value,
            create_revision: revision,
            mod_revision: revision,
        })
    }

    async fn update(&self, key: &str, value: Bytes, expected: i64) -> Result<KeyValue> {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::NotEqual, 0),
                Compare::mod_revision(key, CompareOp::Equal, expected),
            ])
            .and_then([TxnOp::put(
                key,
                value.to_vec(),
                Some(PutOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let (resp, again) = write_txn(&self.inner.kv, &txn).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            return match got(resp.op_responses())? {
                // Sent again, and the key moved on to exactly these bytes: the first copy.
                Some(current)
                    if again && current.mod_revision > expected && current.value == value =>
                {
                    Ok(current)
                }
                current => Err(cas_failed(key, expected, current)),
            };
        }
        let create_revision = resp
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Put(p) => p.prev_key().map(|p| p.create_revision()),
                _ => None,
            })
            .unwrap_or(revision);
        Ok(KeyValue {
            key: key.into(),
            value,
            create_revision,
            mod_revision: revision,
        })
    }

    async fn delete(&self, key: &str, expected: Option<i64>) -> Result<Deleted> {
        let mut compares = vec![Compare::create_revision(key, CompareOp::NotEqual, 0)];
        if let Some(expected) = expected {
            compares.push(Compare::mod_revision(key, CompareOp::Equal, expected));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::delete(
                key,
                Some(etcd_client::DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(key, None)]);
        let kv = &self.inner.kv;
        let resp = unreached_again(|| {
            let (mut kv, txn) = (kv.clone(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            return Err(cas_failed(
                key,
                expected.unwrap_or(0),
                got(resp.op_responses())?,
            ));
        }
        let prev = resp
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Delete(d) => d.prev_kvs().first().map(convert),
                _ => None,
            })
            .transpose()?
            .ok_or_else(|| Error::NotFound { key: key.into() })?;
        Ok(Deleted { prev, revision })
    }

    async fn watch(&self, prefix: &str, start_revision: i64) -> Result<WatchStream> {
        let stream = self.open_watch(prefix, start_revision).await?;
        struct State {
            stream: etcd_client::WatchStream,
            pending: VecDeque<Event>,
            done: bool,
            etcd: Etcd,
            prefix: String,
            start: i64,
            /// The revision to resume from: every event before it was delivered (0: none
            /// known yet, the watch started at "now" and has not been created).
            next: i64,
        }
        let state = State {
            stream,
            pending: VecDeque::new(),
            done: false,
            etcd: self.clone(),
            prefix: prefix.to_owned(),
            start: start_revision,
            next: start_revision.max(0),
        };
        let events = futures::stream::unfold(state, |mut st| async move {
            loop {
                if let Some(event) = st.pending.pop_front() {
                    return Some((Ok(event), st));
                }
                if st.done {
                    return None;
                }
                let message = st.stream.message().await;
                let resp = match message {
                    Ok(Some(resp)) => resp,
                    // The member went away (killed, cut off, or its leader changed): as
                    // etcd's own client does, the watch resumes on another member from the
                    // next revision it has not delivered, so the watcher misses nothing.
                    Ok(None) | Err(_) if st.next > 0 => {
                        match st.etcd.resume_watch(&st.prefix, st.next).await {
                            Ok(stream) => {
                                st.stream = stream;
                                continue;
                            }
                            Err(e) => {
                                st.done = true;
                                return Some((Err(e), st));
                            }
                        }
                    }
                    Ok(None) => {
                        st.done = true;
                        return Some((Err(Error::Closed), st));
                    }
                    Err(e) => {
                        st.done = true;
                        return Some((Err(e.into()), st));
                    }
                };
                if resp.compact_revision() > 0 {
                    st.done = true;
                    st.etcd.seen_compaction(resp.compact_revision());
                    let err = Error::Compacted {
                        requested: st.start,
                        compacted: resp.compact_revision(),
                    };
                    return Some((Err(err), st));
                }
                if resp.canceled() {
                    st.done = true;
                    let reason = resp.cancel_reason().to_owned();
                    return Some((Err(Error::InvalidRequest(reason)), st));
                }
                if resp.created()
                    && st.next == 0
                    && let Some(header) = resp.header()
                {
                    // Started at "now": everything after the creation's revision is to come.
                    st.next = header.revision() + 1;
                }
                for e in resp.events() {
                    let Some(kv) = e.kv() else { continue };
                    st.next = st.next.max(kv.mod_revision() + 1);
                    let event = (|| -> Result<Event> {
                        Ok(Event {
                            kind: match e.event_type() {
                                EventType::Put => EventKind::Put,
                                EventType::Delete => EventKind::Delete,
                            },
                            kv: convert(kv)?,
                            prev: e.prev_kv().map(convert).transpose()?,
                        })
                    })();
                    // etcd's watch server notes that a watch wants previous values only after
                    // registering it (v3rpc/watch.go), so a watch from an older revision may
                    // be handed its first events before: a change that is not a creation then
                    // comes without its previous value, which is read back here.
                    let event = match event {
                        Ok(mut event) if event.prev.is_none() && !is_creation(&event) => {
                            match st
                                .etcd
                                .value_at(&event.kv.key, event.kv.mod_revision - 1)
                                .await
                            {
                                Ok(prev) => {
                                    event.prev = prev;
                                    Ok(event)
                                }
                                Err(e) => Err(e),
                            }
                        }
                        other => other,
                    };
                    match event {
                        Ok(event) => st.pending.push_back(event),
                        Err(err) => {
                            st.done = true;
                            return Some((Err(err), st));
                        }
                    }
                }
            }
        });
        Ok(Box::pin(events))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        let kv = &self.inner.kv;
        match unreached_again(|| {
            let mut kv = kv.clone();
            async move { kv.compact(revision, None).await }
        })
        .await
        {
            Ok(_) => {
                self.seen_compaction(revision);
                Ok(())
            }
            // Compacting to an already compacted revision is not an error.
            Err(e) => match self.read_error(e, revision) {
                Error::Compacted { .. } => Ok(()),
                other => Err(other),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn a_broken_connection_leaves_the_outcome_unknown_but_no_leader_is_an_answer() {
        for e in [
            status(tonic::Code::Unknown, "h2 protocol error: connection reset"),
            status(
                tonic::Code::Unavailable,
                "error reading a body from connection",
            ),
            status(tonic::Code::Unavailable, "etcdserver: request timed out"),
            status(tonic::Code::Unavailable, "etcdserver: leader changed"),
        ] {
            assert!(outcome_unknown(&e), "{e}");
        }
        for e in [
            status(tonic::Code::Unavailable, "etcdserver: no leader"),
            status(
                tonic::Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            status(
                tonic::Code::OutOfRange,
                "required revision has been compacted",
            ),
        ] {
            assert!(!outcome_unknown(&e), "{e}");
        }
    }

    #[test]
    fn only_a_put_that_made_its_key_is_a_creation() {
        let kv = |create_revision, mod_revision| KeyValue {
            key: "/r/a".into(),
            value: Bytes::from_static(b"v"),
            create_revision,
            mod_revision,
        };
        let event = |kind, kv| Event {
            kind,
            kv,
            prev: None,
        };
        assert!(is_creation(&event(EventKind::Put, kv(5, 5))));
        assert!(!is_creation(&event(EventKind::Put, kv(5, 6))));
        assert!(!is_creation(&event(EventKind::Delete, kv(5, 7))));
    }

    #[test]
    fn no_leader_is_sent_again_for_an_election_then_answered() {
        let refused = status(tonic::Code::Unavailable, "etcdserver: no leader");
        assert!(no_leader(&refused));
        assert!(send_again(&refused, std::time::Duration::from_secs(1)));
        assert!(!send_again(&refused, ELECTION_WAIT));
        let broken = status(tonic::Code::Unknown, "h2 protocol error: connection reset");
        assert!(!no_leader(&broken));
        assert!(send_again(&broken, ELECTION_WAIT));
        assert!(!send_again(&broken, AGAIN_FOR));
        let invalid = status(
            tonic::Code::InvalidArgument,
            "etcdserver: key is not provided",
        );
        assert!(!send_again(&invalid, std::time::Duration::ZERO));
    }
}

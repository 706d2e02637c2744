//! GET, LIST and WATCH for every resource.

use super::{Ctx, json_response, raw_json};
use crate::context::{decode_continue, encode_continue};
use crate::error::{ApiError, ApiResult};
use crate::object;
use crate::registry::ResourceInfo;
use crate::store::watchcache::{Decoded, WatchCache};
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use minik8s_storage::{EventKind, RangeRequest, Store};
use minik8s_types::{FieldSelector, LabelSelector};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// GET one object.
pub async fn get(ctx: Ctx) -> ApiResult<Response> {
    let kv = ctx
        .api
        .store
        .get(&ctx.key())
        .await?
        .ok_or_else(|| ApiError::not_found(&ctx.res.group, &ctx.res.plural, ctx.name()))?;
    let kv = crate::store::broken::serve(kv);
    let obj = ctx.res.read(&kv)?;
    if ctx.wants_metadata() {
        return Ok(json_response(
            StatusCode::OK,
            &object::partial_metadata(&obj),
            &[],
        ));
    }
    if ctx.wants_table() {
        let mut out = Vec::new();
        crate::serving::table::write(
            &mut out,
            &ctx.res,
            &[obj],
            ctx.params.include_object.as_deref(),
            &json!({}),
            true,
        );
        return Ok(raw_json(StatusCode::OK, out, &[]));
    }
    Ok(json_response(StatusCode::OK, &obj, &[]))
}

/// Label and field selectors of a list or watch, checked against what the kind supports.
pub struct Selectors {
    label: LabelSelector,
    field: FieldSelector,
}

impl Selectors {
    /// Parses and checks the request's selectors.
    pub fn from(ctx: &Ctx) -> ApiResult<Self> {
        let label = LabelSelector::parse(ctx.params.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
        let field = FieldSelector::parse(ctx.params.field_selector.as_deref().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        for f in field.fields() {
            let ok = matches!(f, "metadata.name" | "metadata.namespace")
                || ctx.res.field_selectors.iter().any(|s| s == f);
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {f}"
                )));
            }
        }
        Ok(Selectors { label, field })
    }

    /// Whether everything matches (no selector given).
    pub fn is_empty(&self) -> bool {
        self.label.is_empty() && self.field.is_empty()
    }

    /// The value the field selector requires `field` to equal (`field=value`), if it does.
    pub fn equal(&self, field: &str) -> Option<&str> {
        self.field
            .terms
            .iter()
            .find(|(f, _, equal)| f == field && *equal)
            .map(|(_, v, _)| v.as_str())
    }

    /// Whether an object matches both selectors.
    pub fn matches(&self, obj: &Value) -> bool {
        self.label.matches_json(object::meta(obj).get("labels"))
            && self.field.matches(|f| object::field_text(obj, f))
    }
}

/// The objects of one list page and what the list response's metadata needs.
pub struct Page {
    /// Matching objects (parsed).
    pub items: Vec<Value>,
    /// Matching objects as JSON bytes, when the caller asked for raw items.
    pub raw: Vec<Vec<u8>>,
    /// The revision the list was read at.
    pub revision: i64,
    /// A continue token when more may follow.
    pub continue_token: Option<String>,
    /// How many objects follow the page (`remainingItemCount`): known for a limited list
    /// without selectors, as upstream.
    pub remaining: Option<usize>,
}

/// Reads a (page of a) list with selectors, limit and continue, at a consistent revision.
pub async fn list_page(ctx: &Ctx, selectors: &Selectors) -> ApiResult<Page> {
    list_page_as(ctx, selectors, false).await
}

/// Like [`list_page`]; with `raw` the items stay JSON bytes where the stored version is the
/// served one (no parsing), and selectors read only what they select on.
pub async fn list_page_as(ctx: &Ctx, selectors: &Selectors, raw: bool) -> ApiResult<Page> {
    let raw = raw && ctx.res.stored_as_served();
    let prefix = ctx.res.scope_prefix(ctx.namespace());
    let store = &ctx.api.store;
    // What follows the token's key, carried by the token (counted on the first page).
    let mut carried = None;
    let (mut revision, mut start_after) = match &ctx.params.continue_token {
        Some(token) => {
            if ctx.params.resource_version.is_some() {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            // A token's revision of -1 (handed out when its list's revision was compacted
            // away) continues at the latest revision, where its count no longer holds.
            let token = decode_continue(token)?;
            if token.rv > 0 {
                carried = token.remaining;
            }
            (token.rv.max(0), Some(format!("{prefix}{}", token.start)))
        }
        None => {
            let rv = ctx.params.revision()?;
            match (rv, ctx.params.resource_version_match.as_deref()) {
                (Some(rv), Some("Exact")) => (rv, None),
                (Some(rv), _) => {
                    let current = store.current_revision().await?;
                    if rv > current {
                        return Err(ApiError::from(minik8s_storage::Error::FutureRevision {
                            requested: rv,
                            current,
                        }));
                    }
                    (0, None)
                }
                (None, _) => (0, None),
            }
        }
    };
    let limit = ctx.params.limit;
    let mut items = Vec::new();
    let mut raw_items = Vec::new();
    let mut read_at = None;
    let mut continue_key = None;
    let mut remaining = None;
    let count = limit > 0 && selectors.is_empty();
    // The store counts what follows a page only when no token carries it: the first page.
    let store_counts = count && carried.is_none();
    // A LIST of one value of the kind's indexed field at the latest revision (a kubelet's, of
    // its node's pods) reads only that value's objects (`store::watchindex`); pages after the
    // first are read at its revision from the whole prefix.
    let mut indexed = match ctx.res.watch_index.and_then(|f| selectors.equal(f)) {
        Some(value) if revision == 0 && start_after.is_none() => {
            store
                .range_where(RangeRequest::prefix(prefix.clone()), value)
                .await?
        }
        _ => None,
    };
    // Selected LISTs read the store in larger chunks: each chunk after the first is read at
    // the first's revision, which undoes the history written since.
    let chunk = if selectors.is_empty() { 64 } else { 1024 };
    'pages: loop {
        let read = match indexed.take() {
            Some(page) => Ok(page),
            None => {
                store
                    .range(RangeRequest {
                        prefix: prefix.clone(),
                        start_after: start_after.clone(),
                        limit: if limit > 0 { limit.max(chunk) } else { 0 },
                        revision,
                        count: store_counts,
                    })
                    .await
            }
        };
        let page = read.map_err(|e| match e {
            minik8s_storage::Error::Compacted { .. } if ctx.params.continue_token.is_some() => {
                let from = start_after.as_deref().unwrap_or(&prefix);
                ApiError::inconsistent_continue(encode_continue(-1, &from[prefix.len()..], None))
            }
            other => other.into(),
        })?;
        read_at.get_or_insert(page.revision);
        revision = page.revision;
        let n = page.kvs.len();
        for (i, kv) in page.kvs.iter().enumerate() {
            // The whole object, when the selectors needed it decoded.
            let mut decoded = None;
            if !selectors.is_empty() {
                let selected = match ctx.res.selectable(kv) {
                    Some(partial) => selectors.matches(&partial),
                    None => selectors.matches(decoded.insert(ctx.res.read(kv)?)),
                };
                if !selected {
                    continue;
                }
            }
            if raw {
                let bytes = match object::raw_with_rv(&kv.value, kv.mod_revision) {
                    Some(bytes) => bytes,
                    None => serde_json::to_vec(&ctx.res.read(kv)?).expect("json"),
                };
                raw_items.push(bytes);
            } else {
                items.push(match decoded {
                    Some(obj) => obj,
                    None => ctx.res.read(kv)?,
                });
            }
            if limit > 0 && items.len() + raw_items.len() >= limit {
                if i + 1 < n || page.more {
                    continue_key = Some(kv.key.clone());
                    let returned = items.len() + raw_items.len();
                    remaining = count.then(|| match carried {
                        Some(n) => n.saturating_sub(returned),
                        None => page.count.saturating_sub(i + 1),
                    });
                }
                break 'pages;
            }
        }
        if !page.more {
            break;
        }
        start_after = page.kvs.last().map(|kv| kv.key.clone());
    }
    let revision = read_at.unwrap_or(0);
    let continue_token =
        continue_key.map(|k| encode_continue(revision, &k[prefix.len()..], remaining));
    Ok(Page {
        items,
        raw: raw_items,
        revision,
        continue_token,
        remaining,
    })
}

/// LIST a collection.
pub async fn list(ctx: Ctx) -> ApiResult<Response> {
    let selectors = Selectors::from(&ctx)?;
    let table = ctx.wants_table();
    let page = list_page_as(&ctx, &selectors, !table).await?;
    let mut meta = json!({"resourceVersion": page.revision.to_string()});
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        meta["remainingItemCount"] = json!(n);
    }
    if ctx.wants_table() {
        let mut out = Vec::new();
        crate::serving::table::write(
            &mut out,
            &ctx.res,
            &page.items,
            ctx.params.include_object.as_deref(),
            &meta,
            true,
        );
        return Ok(raw_json(StatusCode::OK, out, &[]));
    }
    // The list goes out as it is written, as upstream's streaming list encoding sends it: its
    // items in chunks of about 64 KiB, each item freed once copied, so a LIST of every pod
    // (800 MB at 150,000 pods) is never held twice.
    let metadata_only = ctx.wants_metadata();
    let (list_kind, api_version) = match metadata_only {
        true => (
            "PartialObjectMetadataList".to_owned(),
            "meta.k8s.io/v1".into(),
        ),
        false => (ctx.res.list_kind.clone(), ctx.res.api_version()),
    };
    let mut head = Vec::with_capacity(256);
    head.extend_from_slice(b"{\"kind\":");
    serde_json::to_writer(&mut head, &list_kind).expect("string");
    head.extend_from_slice(b",\"apiVersion\":");
    serde_json::to_writer(&mut head, &api_version).expect("string");
    head.extend_from_slice(b",\"metadata\":");
    serde_json::to_writer(&mut head, &meta).expect("json");
    head.extend_from_slice(b",\"items\":[");
    let raw = page.raw.into_iter().map(move |item| {
        match metadata_only
            .then(|| object::partial_metadata_raw(&item))
            .flatten()
        {
            Some(partial) => partial,
            None => item,
        }
    });
    let typed = page.items.into_iter().map(move |item| {
        match metadata_only {
            true => serde_json::to_vec(&object::partial_metadata(&item)),
            false => serde_json::to_vec(&item),
        }
        .expect("json")
    });
    let chunks = ListChunks {
        next: Some(head),
        items: raw.chain(typed),
        first: true,
    };
    let body = Body::from_stream(futures::stream::iter(
        chunks.map(Ok::<_, std::convert::Infallible>),
    ));
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// How much of a list one chunk of its body carries.
const LIST_CHUNK: usize = 64 * 1024;

/// A list's body in chunks: the head (up to `"items":[`), the items separated by commas,
/// and the end, about [`LIST_CHUNK`] bytes at a time.
struct ListChunks<I> {
    /// The chunk being filled; `None` once the end was given.
    next: Option<Vec<u8>>,
    items: I,
    first: bool,
}

impl<I: Iterator<Item = Vec<u8>>> Iterator for ListChunks<I> {
    type Item = bytes::Bytes;

    fn next(&mut self) -> Option<bytes::Bytes> {
        let mut chunk = self.next.take()?;
        loop {
            let Some(item) = self.items.next() else {
                chunk.extend_from_slice(b"]}");
                return Some(chunk.into());
            };
            if !std::mem::take(&mut self.first) {
                chunk.push(b',');
            }
            chunk.extend_from_slice(&item);
            if chunk.len() >= LIST_CHUNK {
                self.next = Some(Vec::with_capacity(2 * LIST_CHUNK));
                return Some(chunk.into());
            }
        }
    }
}

/// How a store event looks to a watcher with selectors (objects decoded once for all
/// watchers, through the shared cache, and only when selectors need them).
fn transform(
    cache: &WatchCache,
    res: &ResourceInfo,
    selectors: &Selectors,
    event: &minik8s_storage::Event,
) -> ApiResult<Option<(&'static str, Arc<Decoded>)>> {
    match event.kind {
        EventKind::Put => {
            let new = cache.object(res, &event.kv, event.kv.mod_revision);
            let new_ok = selectors.is_empty() || selectors.matches(new.selectable(res)?);
            let Some(prev) = &event.prev else {
                return Ok(new_ok.then_some(("ADDED", new)));
            };
            if selectors.is_empty() {
                return Ok(Some(("MODIFIED", new)));
            }
            let old = cache.object(res, prev, prev.mod_revision);
            let old_ok = selectors.matches(old.selectable(res)?);
            Ok(match (old_ok, new_ok) {
                (true, true) => Some(("MODIFIED", new)),
                (false, true) => Some(("ADDED", new)),
                (true, false) => Some(("DELETED", new)),
                (false, false) => None,
            })
        }
        EventKind::Delete => {
            let Some(prev) = &event.prev else {
                return Ok(None);
            };
            let old = cache.object(res, prev, event.kv.mod_revision);
            let ok = selectors.is_empty() || selectors.matches(old.selectable(res)?);
            Ok(ok.then_some(("DELETED", old)))
        }
        EventKind::Progress => Ok(None),
    }
}

/// Encodes watch events, as Table rows when the client asked for a Table.
struct Encoder {
    res: std::sync::Arc<ResourceInfo>,
    table: bool,
    /// Objects as PartialObjectMetadata (metadata-only clients).
    metadata: bool,
    include_object: Option<String>,
    sent_columns: bool,
}

impl Encoder {
    /// A shared object's event: its JSON spliced in as is, unless a Table is wanted.
    fn shared(&mut self, kind: &str, obj: &Decoded) -> ApiResult<bytes::Bytes> {
        if self.table {
            let value = obj.value(&self.res)?.clone();
            return Ok(self.event(kind, value));
        }
        let json = match self.metadata {
            true => obj.metadata_json(&self.res)?,
            false => obj.json(&self.res)?,
        };
        let mut line = Vec::with_capacity(json.len() + 32);
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(kind.as_bytes());
        line.extend_from_slice(b"\",\"object\":");
        line.extend_from_slice(&json);
        line.extend_from_slice(b"}\n");
        Ok(line.into())
    }

    fn event(&mut self, kind: &str, obj: Value) -> bytes::Bytes {
        let obj = if self.table && kind != "BOOKMARK" && kind != "ERROR" {
            // The one-row Table is written straight after the event's head.
            let mut line = Vec::with_capacity(1024);
            line.extend_from_slice(b"{\"type\":");
            serde_json::to_writer(&mut line, kind).expect("json");
            line.extend_from_slice(b",\"object\":");
            crate::serving::table::write(
                &mut line,
                &self.res,
                &[obj],
                self.include_object.as_deref(),
                &json!({}),
                !self.sent_columns,
            );
            self.sent_columns = true;
            line.extend_from_slice(b"}\n");
            return line.into();
        } else if self.metadata && kind != "BOOKMARK" && kind != "ERROR" {
            object::partial_metadata(&obj)
        } else {
            obj
        };
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).expect("json");
        line.push(b'\n');
        line.into()
    }

    fn bookmark(&mut self, rv: i64, initial_end: bool) -> bytes::Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj =
            json!({"kind": self.res.kind, "apiVersion": self.res.api_version(), "metadata": meta});
        self.event("BOOKMARK", obj)
    }
}

/// WATCH a collection: optional initial events, then every change as newline-delimited JSON.
pub async fn watch(ctx: Ctx) -> ApiResult<Response> {
    let selectors = Selectors::from(&ctx)?;
    let requested = ctx.params.revision()?;
    // No resourceVersion (or "0") means: the current state as ADDED events, then changes.
    let initial = ctx
        .params
        .send_initial_events
        .unwrap_or(requested.is_none());
    let streaming_list = ctx.params.send_initial_events == Some(true);
    let prefix = ctx.res.scope_prefix(ctx.namespace());
    let mut encoder = Encoder {
        res: ctx.res.clone(),
        table: ctx.wants_table(),
        metadata: ctx.wants_metadata(),
        include_object: ctx.params.include_object.clone(),
        sent_columns: false,
    };

    let mut first: Vec<bytes::Bytes> = Vec::new();
    let start = if initial {
        let mut list_ctx_params = ctx.params.clone();
        list_ctx_params.limit = 0;
        list_ctx_params.continue_token = None;
        list_ctx_params.resource_version = None;
        let list_ctx = Ctx {
            api: ctx.api.clone(),
            res: ctx.res.clone(),
            req: ctx.req.clone(),
            params: list_ctx_params,
            headers: ctx.headers.clone(),
            user: ctx.user.clone(),
            upgrade: None,
            warnings: ctx.warnings.clone(),
        };
        let page = list_page(&list_ctx, &selectors).await?;
        for item in page.items {
            first.push(encoder.event("ADDED", item));
        }
        if streaming_list {
            first.push(encoder.bookmark(page.revision, true));
        }
        page.revision + 1
    } else {
        requested.unwrap_or(0) + 1
    };

    // A watch of one value of the kind's indexed field (a kubelet's, of its node's pods) is
    // woken only by that value's changes (`store::watchindex`).
    let opened = match ctx.res.watch_index.and_then(|f| selectors.equal(f)) {
        Some(value) => ctx.api.store.watch_where(&prefix, start, value).await,
        None => ctx.api.store.watch(&prefix, start).await,
    };
    let mut events = match opened {
        Ok(events) => events,
        // Upstream answers a watch from a compacted revision with 200 and one ERROR event.
        Err(e @ minik8s_storage::Error::Compacted { .. }) => {
            let line = encoder.event("ERROR", watch_error(e).status());
            return Ok(watch_response(Body::from(line)));
        }
        Err(e) => return Err(e.into()),
    };
    let (tx, rx) = mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(64);
    let timeout = Duration::from_secs(ctx.params.timeout_seconds.unwrap_or(1800).max(1));
    let bookmarks = ctx.params.allow_watch_bookmarks;
    let shutdown = ctx.api.shutdown.clone();
    let api = ctx.api.clone();
    let mut last_rv = start - 1;
    minik8s_task::spawn_on(&ctx.api.tasks, "watch", async move {
        for line in first {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        tick.tick().await;
        loop {
            let line = tokio::select! {
                _ = &mut deadline => {
                    // As upstream's watch cache: a last bookmark before the end, so the client
                    // watches again from a recent resourceVersion (one its history still has).
                    if bookmarks {
                        let _ = tx.send(Ok(encoder.bookmark(last_rv, false))).await;
                    }
                    return;
                }
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                _ = tick.tick(), if bookmarks => encoder.bookmark(last_rv, false),
                ev = events.next() => match ev {
                    None => return,
                    Some(Err(e)) => {
                        let status = watch_error(e).status();
                        let _ = tx.send(Ok(encoder.event("ERROR", status))).await;
                        return;
                    }
                    Some(Ok(ev)) => {
                        last_rv = ev.revision();
                        if ev.kind == EventKind::Progress {
                            continue;
                        }
                        if crate::store::broken::drop_event() {
                            continue;
                        }
                        let line = transform(&api.watch_cache, &encoder.res, &selectors, &ev)
                            .and_then(|t| t.map(|(kind, obj)| encoder.shared(kind, &obj)).transpose());
                        match line {
                            Ok(Some(line)) => line,
                            Ok(None) => continue,
                            Err(e) => encoder.event("ERROR", e.status()),
                        }
                    }
                },
            };
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(watch_response(body))
}

/// A storage error of a watch as its ERROR event says it: a watch's `requested` revision is
/// the one after its resourceVersion.
fn watch_error(e: minik8s_storage::Error) -> ApiError {
    match e {
        minik8s_storage::Error::Compacted {
            requested,
            compacted,
        } => ApiError::watch_too_old(requested - 1, compacted),
        e => e.into(),
    }
}

/// A watch's 200 response around its stream of events.
fn watch_response(body: Body) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(items: Vec<Vec<u8>>) -> (Vec<u8>, usize) {
        let chunks: Vec<bytes::Bytes> = ListChunks {
            next: Some(b"{\"items\":[".to_vec()),
            items: items.into_iter(),
            first: true,
        }
        .collect();
        (chunks.concat(), chunks.len())
    }

    #[test]
    fn a_list_goes_out_in_chunks_that_make_its_json() {
        assert_eq!(body(vec![]), (b"{\"items\":[]}".to_vec(), 1));
        assert_eq!(body(vec![b"1".to_vec()]), (b"{\"items\":[1]}".to_vec(), 1));
        // 3,000 items of 100 bytes: about 300 KiB, in chunks of about 64 KiB.
        let item = format!("\"{}\"", "x".repeat(98)).into_bytes();
        let (all, n) = body(vec![item.clone(); 3000]);
        let v: Value = serde_json::from_slice(&all).unwrap();
        assert_eq!(v["items"].as_array().unwrap().len(), 3000);
        assert_eq!(n, 300_000 / LIST_CHUNK + 1);
    }
}

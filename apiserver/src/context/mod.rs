//! What every verb handler works with: the request context ([`Ctx`]: the server, the
//! resource's registry row, the parsed request, its parameters and user) and the response
//! helpers. Handlers, admission, the kubelet and metrics proxies all take a `Ctx`; keeping
//! it here, outside `handlers/`, means none of them imports the handlers.

mod params;

pub use params::{FieldValidation, Params, decode_continue, encode_continue};

use crate::Api;
use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use crate::serving::request::ResourceRequest;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use minik8s_storage::Store;
use serde_json::Value;
use std::sync::Arc;

/// Largest request body accepted (upstream's limit is 3 MiB for most requests).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Everything a verb handler needs about one request.
pub struct Ctx {
    /// The server.
    pub api: Arc<Api>,
    /// The resource's registry row.
    pub res: Arc<ResourceInfo>,
    /// The parsed request.
    pub req: ResourceRequest,
    /// Its query parameters.
    pub params: Params,
    /// Its headers.
    pub headers: HeaderMap,
    /// Who is asking.
    pub user: User,
    /// The client's connection once upgraded (exec, attach, port-forward).
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// Warnings admission gave for this request (upstream's `warning.AddWarning`), sent
    /// back as `Warning` headers.
    pub warnings: Warnings,
}

/// The warnings of one request, shared by the contexts made from it.
#[derive(Clone, Default)]
pub struct Warnings(Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    /// Adds a warning (once).
    pub fn add(&self, text: String) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !list.contains(&text) {
            list.push(text);
        }
    }

    /// `base` followed by the warnings added so far.
    pub fn with(&self, mut base: Vec<String>) -> Vec<String> {
        let list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        base.extend(list.iter().cloned());
        base
    }
}

impl Ctx {
    /// The object name from the path (handlers that need one are only called with one).
    pub fn name(&self) -> &str {
        self.req.name.as_deref().unwrap_or_default()
    }

    /// The namespace of the request, for namespaced resources.
    pub fn namespace(&self) -> Option<&str> {
        if self.res.namespaced {
            self.req.namespace.as_deref()
        } else {
            None
        }
    }

    /// The storage key of the object the path names.
    pub fn key(&self) -> String {
        self.res.key(self.namespace(), self.name())
    }

    /// Reads the object the request names, with its revision; 404 if absent.
    pub async fn current(&self) -> ApiResult<(Value, i64)> {
        let kv =
            self.api.store.get(&self.key()).await?.ok_or_else(|| {
                ApiError::not_found(&self.res.group, &self.res.plural, self.name())
            })?;
        Ok((self.res.read(&kv)?, kv.mod_revision))
    }

    /// The request body's content type (JSON if none was given).
    pub fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
    }

    /// A failed compare-and-swap write of the named object as upstream reports it: a changed
    /// object is 409 Conflict, a vanished one 404.
    pub fn write_error(&self, e: minik8s_storage::Error) -> ApiError {
        match e {
            minik8s_storage::Error::Conflict { .. } => {
                ApiError::stale(&self.res.group, &self.res.plural, self.name())
            }
            minik8s_storage::Error::NotFound { .. } => {
                ApiError::not_found(&self.res.group, &self.res.plural, self.name())
            }
            other => other.into(),
        }
    }

    /// Whether the client asked for Table output.
    pub fn wants_table(&self) -> bool {
        self.accepts_as("Table")
    }

    /// Whether the client asked for metadata only (`as=PartialObjectMetadata` or
    /// `as=PartialObjectMetadataList`, as client-go's and kube-rs's metadata clients do).
    pub fn wants_metadata(&self) -> bool {
        self.accepts_as("PartialObjectMetadata")
    }

    /// Whether the first media type the client accepts has an `as=<kind>` parameter whose
    /// value starts with `kind`.
    fn accepts_as(&self, kind: &str) -> bool {
        self.headers
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok())
            .and_then(|a| a.split(',').next())
            .is_some_and(|first| {
                first
                    .split(';')
                    .filter_map(|p| p.trim().strip_prefix("as="))
                    .any(|v| v.starts_with(kind))
            })
    }
}

/// Reads a request body up to [`MAX_BODY`]; larger bodies are 413.
pub async fn read_body(body: Body) -> ApiResult<Bytes> {
    axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::too_large(MAX_BODY))
}

/// A JSON response with a status code and optional `Warning` headers.
pub fn json_response(status: StatusCode, value: &Value, warnings: &[String]) -> Response {
    let body = serde_json::to_vec(value).expect("JSON serializes");
    raw_json(status, body, warnings)
}

/// A response from already-serialized JSON.
pub fn raw_json(status: StatusCode, body: Vec<u8>, warnings: &[String]) -> Response {
    let mut resp = (status, body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        let text = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(v) = HeaderValue::from_str(&text) {
            h.append(header::WARNING, v);
        }
    }
    resp
}

//! Query parameters of resource requests, parsed once into a typed struct.

use crate::error::{ApiError, ApiResult};
use std::collections::HashMap;

/// `fieldValidation`: what to do with unknown or duplicate fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and say so in a `Warning` header (the default).
    #[default]
    Warn,
    /// Reject the request with 400.
    Strict,
}

/// Every query parameter the resource handlers read.
#[derive(Clone, Debug, Default)]
pub struct Params {
    /// `labelSelector`.
    pub label_selector: Option<String>,
    /// `fieldSelector`.
    pub field_selector: Option<String>,
    /// `limit` (0: none).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub resource_version_match: Option<String>,
    /// `timeoutSeconds`.
    pub timeout_seconds: Option<u64>,
    /// `allowWatchBookmarks`.
    pub allow_watch_bookmarks: bool,
    /// `sendInitialEvents`.
    pub send_initial_events: Option<bool>,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `fieldManager`.
    pub field_manager: Option<String>,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// `force` (server-side apply takes conflicting fields).
    pub force: bool,
    /// `propagationPolicy`.
    pub propagation_policy: Option<String>,
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `includeObject` for Table output (`None`, `Metadata`, `Object`).
    pub include_object: Option<String>,
    /// The options of the streaming pod subresources (`log`, `exec`, …) passed on to the
    /// kubelet as given: `container`, `follow`, `tailLines`, `command`, …
    pub streaming: Vec<(String, String)>,
    /// The query as given (the `proxy` subresource passes it on).
    pub raw: String,
}

/// Query parameters of the streaming pod subresources.
const STREAMING: [&str; 14] = [
    "container",
    "follow",
    "tailLines",
    "timestamps",
    "previous",
    "sinceSeconds",
    "sinceTime",
    "limitBytes",
    "command",
    "stdin",
    "stdout",
    "stderr",
    "tty",
    "ports",
];

fn truthy(v: &str) -> bool {
    minik8s_types::parse_bool(v) == Some(true)
}

impl Params {
    /// Parses a query string.
    pub fn parse(query: Option<&str>) -> ApiResult<Self> {
        let pairs: Vec<(String, String)> = match query {
            Some(q) => serde_urlencoded::from_str::<Vec<(String, String)>>(q)
                .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?,
            None => Vec::new(),
        };
        let streaming = pairs
            .iter()
            .filter(|(k, _)| STREAMING.contains(&k.as_str()))
            .cloned()
            .collect();
        let map: HashMap<String, String> = pairs.into_iter().collect();
        let num = |k: &str| -> ApiResult<Option<i64>> {
            map.get(k)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    v.parse::<i64>()
                        .map_err(|_| ApiError::bad_request(format!("invalid value for {k}: {v:?}")))
                })
                .transpose()
        };
        let field_validation = match map.get("fieldValidation").map(String::as_str) {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\", got {other:?}"
                )));
            }
        };
        let dry_run = match map.get("dryRun").map(String::as_str) {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid dry run value: {other:?}"
                )));
            }
        };
        Ok(Params {
            raw: query.unwrap_or_default().to_owned(),
            streaming,
            label_selector: map.get("labelSelector").cloned().filter(|s| !s.is_empty()),
            field_selector: map.get("fieldSelector").cloned().filter(|s| !s.is_empty()),
            limit: num("limit")?.unwrap_or(0).max(0) as usize,
            continue_token: map.get("continue").cloned().filter(|s| !s.is_empty()),
            resource_version: map
                .get("resourceVersion")
                .cloned()
                .filter(|s| !s.is_empty()),
            resource_version_match: map
                .get("resourceVersionMatch")
                .cloned()
                .filter(|s| !s.is_empty()),
            timeout_seconds: num("timeoutSeconds")?.map(|t| t.max(0) as u64),
            allow_watch_bookmarks: map.get("allowWatchBookmarks").is_some_and(|v| truthy(v)),
            send_initial_events: map.get("sendInitialEvents").map(|v| truthy(v)),
            dry_run,
            field_manager: map.get("fieldManager").cloned().filter(|s| !s.is_empty()),
            field_validation,
            force: map.get("force").is_some_and(|v| truthy(v)),
            propagation_policy: map
                .get("propagationPolicy")
                .cloned()
                .filter(|s| !s.is_empty()),
            grace_period_seconds: num("gracePeriodSeconds")?,
            include_object: map.get("includeObject").cloned(),
        })
    }

    /// `resourceVersion` as a revision; "" and "0" are `None` (any / most recent).
    pub fn revision(&self) -> ApiResult<Option<i64>> {
        match self.resource_version.as_deref() {
            None | Some("0") => Ok(None),
            Some(rv) => rv
                .parse::<i64>()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}"))),
        }
    }
}

/// What a continue token holds: upstream's fields (the revision the list is read at and the
/// last key returned) and, for a list of every object under its prefix, how many follow the
/// last key at that revision. Clients pass the token back as they got it, so the count is
/// known on every page from one count on the first: counting the rest of the prefix anew on
/// each page read every remaining object, and a paged LIST of 150,000 pods took longer than
/// the store's history lasted (docs/benchmarks.md).
#[derive(Debug, PartialEq)]
pub struct Continue {
    pub rv: i64,
    /// The last key returned, without the list's prefix.
    pub start: String,
    /// How many objects follow `start` at `rv` (`remainingItemCount`), when known.
    pub remaining: Option<usize>,
}

/// A continue token: the revision the list started at, the last key returned and, when known,
/// how many objects follow it.
pub fn encode_continue(rv: i64, last_key_suffix: &str, remaining: Option<usize>) -> String {
    let mut token = serde_json::json!({"v": "meta.k8s.io/v1", "rv": rv, "start": last_key_suffix});
    if let Some(n) = remaining {
        token["remaining"] = serde_json::json!(n);
    }
    base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        token.to_string(),
    )
}

/// What a continue token holds; a 400 in upstream's words for anything else. Tokens without a
/// count (upstream's, or of a selected list) decode with `remaining` unknown.
pub fn decode_continue(token: &str) -> ApiResult<Continue> {
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        token.trim_end_matches('='),
    )
    .map_err(|_| bad())?;
    let v: serde_json::Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v
        .get("rv")
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(bad)?;
    let start = v
        .get("start")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(bad)?;
    if start.contains("..") || start.starts_with('/') {
        return Err(bad());
    }
    let remaining = match v.get("remaining") {
        None => None,
        Some(n) => Some(
            n.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(bad)?,
        ),
    };
    Ok(Continue {
        rv,
        start: start.to_owned(),
        remaining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let t = encode_continue(42, "default/web-1", None);
        let want = Continue {
            rv: 42,
            start: "default/web-1".into(),
            remaining: None,
        };
        assert_eq!(decode_continue(&t).unwrap(), want);
        let counted = encode_continue(42, "default/web-1", Some(7));
        assert_eq!(decode_continue(&counted).unwrap().remaining, Some(7));
        // Upstream's token, byte for byte, decodes with no count.
        let upstream = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            r#"{"v":"meta.k8s.io/v1","rv":42,"start":"default/web-1"}"#,
        );
        assert_eq!(decode_continue(&upstream).unwrap(), want);
        assert!(decode_continue("not-base64!").is_err());
        let evil = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            r#"{"rv":1,"start":"../secrets/x"}"#,
        );
        assert!(decode_continue(&evil).is_err());
        let negative = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            r#"{"rv":1,"start":"default/a","remaining":-1}"#,
        );
        assert!(decode_continue(&negative).is_err());
    }
}

//! CREATE, UPDATE, PATCH, DELETE and DELETECOLLECTION for every resource, and the steps they
//! share: decoding with field validation, metadata bookkeeping, defaulting, validation and
//! the compare-and-swap write. One file per verb.

mod create;
mod delete;
mod update;

pub use create::create;
pub use delete::{delete, delete_collection};
pub use update::{patch, update};

use crate::context::{Ctx, FieldValidation};
use crate::error::{ApiError, ApiResult};
use crate::object::{self, meta_str};
use crate::registry::ResourceInfo;
use crate::registry::validation;
use axum::http::header;
use bytes::Bytes;
use minik8s_storage::KeyValue;
use serde_json::{Value, json};

/// Fields present in `input` but gone after the typed round trip: unknown fields.
pub(super) fn unknown_fields(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(i), Value::Object(t)) => {
            for (k, v) in i {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match t.get(k) {
                    Some(tv) => unknown_fields(v, tv, &p, out),
                    None if v.is_null() => {}
                    None => out.push(p),
                }
            }
        }
        (Value::Array(i), Value::Array(t)) => {
            for (n, (iv, tv)) in i.iter().zip(t).enumerate() {
                unknown_fields(iv, tv, &format!("{path}[{n}]"), out);
            }
        }
        _ => {}
    }
}

/// Checks an object against its kind's type; returns it with unknown fields dropped, and
/// warnings (or a 400, under `fieldValidation=Strict`).
pub fn typed(ctx: &Ctx, obj: Value) -> ApiResult<(Value, Vec<String>)> {
    typed_with(ctx, obj, &[])
}

/// As [`typed`], with the fields the body named twice (`duplicate field`, after the
/// unknown ones, as upstream's strict decoder).
fn typed_with(ctx: &Ctx, obj: Value, duplicates: &[String]) -> ApiResult<(Value, Vec<String>)> {
    let duplicates = duplicates
        .iter()
        .map(|f| format!("duplicate field \"{f}\""));
    let res = &ctx.res;
    if let Some(schema) = &res.crd_schema {
        let mut obj = obj;
        let out = crate::registry::structural::apply(schema, &mut obj);
        if !out.causes.is_empty() {
            let name = meta_str(&obj, "name").unwrap_or_default().to_owned();
            return Err(ApiError::invalid(&res.group, &res.kind, &name, out.causes));
        }
        let messages: Vec<String> = out
            .pruned
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .chain(duplicates)
            .collect();
        return match ctx.params.field_validation {
            FieldValidation::Strict if !messages.is_empty() => Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                messages.join(", ")
            ))),
            FieldValidation::Ignore => Ok((obj, vec![])),
            _ => Ok((obj, messages)),
        };
    }
    let Some(decode) = res.decode else {
        return Ok((obj, vec![]));
    };
    let duplicates: Vec<String> = duplicates.collect();
    let normal = decode(&obj).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            res.kind, res.version, res.kind
        ))
    })?;
    let mut unknown = Vec::new();
    unknown_fields(&obj, &normal, "", &mut unknown);
    let messages: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .chain(duplicates)
        .collect();
    match ctx.params.field_validation {
        FieldValidation::Strict if !messages.is_empty() => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            messages.join(", ")
        ))),
        FieldValidation::Ignore => Ok((normal, vec![])),
        _ => Ok((normal, messages)),
    }
}

/// Decodes a create or update body and checks its kind and apiVersion.
pub(super) fn decode(ctx: &Ctx, body: &Bytes) -> ApiResult<(Value, Vec<String>)> {
    let mut obj = object::decode_body(ctx.content_type(), body)?;
    default_kind(&ctx.res, &mut obj);
    check_kind(&ctx.res, &obj, body)?;
    let json = ctx.content_type().split(';').next().unwrap_or("").trim();
    // A second pass over the body, only when its findings are wanted.
    let duplicates = match json {
        _ if ctx.params.field_validation == FieldValidation::Ignore => vec![],
        "" | "*/*" | "application/json" => object::duplicate_fields(body),
        _ => vec![],
    };
    typed_with(ctx, obj, &duplicates)
}

/// A built-in kind's body may leave out `kind` and `apiVersion`: as upstream's decoder does
/// with the endpoint's group, version and kind, they are taken from the request path (typed
/// clients such as the official Python client send models without them). Custom resources
/// must still name them.
pub(crate) fn default_kind(res: &ResourceInfo, obj: &mut Value) {
    if res.is_custom() {
        return;
    }
    let Some(m) = obj.as_object_mut() else {
        return;
    };
    let missing = |v: Option<&Value>| v.and_then(Value::as_str).is_none_or(str::is_empty);
    if missing(m.get("kind")) {
        m.insert("kind".into(), json!(res.kind));
    }
    if missing(m.get("apiVersion")) {
        m.insert("apiVersion".into(), json!(res.api_version()));
    }
}

pub(super) fn check_kind(res: &ResourceInfo, obj: &Value, body: &[u8]) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON or YAML object",
        ));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind.is_empty() {
        let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(ApiError::bad_request(format!(
            "Object 'Kind' is missing in '{shown}'"
        )));
    }
    if kind != res.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            res.kind
        )));
    }
    if api_version != res.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            res.api_version()
        )));
    }
    Ok(())
}

/// The field manager of a request: `fieldManager`, else the user agent's program name.
pub(super) fn manager(ctx: &Ctx) -> String {
    if let Some(m) = &ctx.params.field_manager {
        return m.clone();
    }
    let ua = ctx
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    ua.split('/').next().unwrap_or("unknown").to_owned()
}

/// Records the request's manager as the owner of the fields it changed (an Update).
pub(crate) fn record_manager(
    ctx: &Ctx,
    old: Option<&Value>,
    obj: &mut Value,
    subresource: Option<&str>,
) {
    crate::object::apply::record_update(
        ctx.res.lists().for_apply(),
        old,
        obj,
        &manager(ctx),
        &ctx.res.api_version(),
        subresource,
    );
}

/// Metadata and kind validation → 422.
pub(super) fn validate(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> ApiResult<()> {
    let res = &ctx.res;
    let mut causes = validation::validate_meta(res, obj);
    res.strategy.validate(obj, &mut causes);
    if let Some(old) = old {
        crate::registry::kinds::no_new_finalizers(obj, old, &mut causes);
        if let Some(schema) = &res.crd_schema {
            causes.extend(crate::registry::rules::transition_causes(schema, obj, old));
        }
        match ctx.req.subresource.as_deref() {
            Some(sub) => res
                .strategy
                .validate_subresource_update(sub, obj, old, &mut causes),
            None => res.strategy.validate_update(obj, old, &mut causes),
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let name = meta_str(obj, "name").unwrap_or_default();
    Err(ApiError::invalid(&res.group, &res.kind, name, causes))
}

pub(super) fn set_rv(obj: &mut Value, kv: &KeyValue) {
    object::meta_mut(obj).insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
}

/// How often a write is re-read and retried after a concurrent write before it gives up.
pub(super) const MAX_RETRIES: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_found_by_the_typed_round_trip() {
        let input = json!({"spec": {"replicas": 1, "x": 2, "template": {"y": null}}, "z": [ {"a": 1, "b": 2} ]});
        let typed = json!({"spec": {"replicas": 1, "template": {}}, "z": [ {"a": 1} ]});
        let mut out = Vec::new();
        unknown_fields(&input, &typed, "", &mut out);
        assert_eq!(out, ["spec.x", "z[0].b"]);
    }
}

//! DELETE and DELETECOLLECTION: preconditions, propagation, graceful deletion and
//! finalizers.

use super::*;
use crate::admission::{self, Operation};
use crate::context::{Ctx, json_response};
use crate::error::{ApiError, ApiResult};
use crate::object::{self, meta, meta_str};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use minik8s_storage::Store;
use serde_json::{Value, json};

/// `DeleteOptions` from the body and the query.
pub(super) struct DeleteOptions {
    propagation: Option<String>,
    grace: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

pub(super) fn delete_options(ctx: &Ctx, body: &Bytes) -> ApiResult<DeleteOptions> {
    let b: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        object::decode_body(ctx.content_type(), body)?
    };
    let pre = b.get("preconditions");
    let dry = b
        .get("dryRun")
        .and_then(Value::as_array)
        .is_some_and(|d| d.iter().any(|x| x == "All"));
    Ok(DeleteOptions {
        propagation: ctx
            .params
            .propagation_policy
            .clone()
            .or_else(|| {
                b.get("propagationPolicy")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .or_else(
                || match b.get("orphanDependents").and_then(Value::as_bool) {
                    Some(true) => Some("Orphan".into()),
                    Some(false) => Some("Background".into()),
                    None => None,
                },
            ),
        grace: ctx
            .params
            .grace_period_seconds
            .or_else(|| b.get("gracePeriodSeconds").and_then(Value::as_i64)),
        uid: pre
            .and_then(|p| p.get("uid"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        resource_version: pre
            .and_then(|p| p.get("resourceVersion"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        dry_run: ctx.params.dry_run || dry,
    })
}

/// Deletes one object: immediately, or by marking it (finalizers, graceful pod deletion).
/// DELETE one object, read-and-write again when another write slipped in between (a status
/// update by the kubelet, say); preconditions are checked on every attempt.
pub(super) async fn delete_one(ctx: &Ctx, opts: &DeleteOptions) -> ApiResult<(StatusCode, Value)> {
    for _ in 0..MAX_RETRIES {
        if let Some(done) = try_delete(ctx, opts).await? {
            return Ok(done);
        }
    }
    Err(ApiError::stale(&ctx.res.group, &ctx.res.plural, ctx.name()))
}

/// One attempt at a DELETE; `Ok(None)` means a concurrent write, retry.
pub(super) async fn try_delete(
    ctx: &Ctx,
    opts: &DeleteOptions,
) -> ApiResult<Option<(StatusCode, Value)>> {
    let (mut obj, stored) = ctx.current().await?;
    let conflict =
        |why: String| ApiError::conflict(&ctx.res.group, &ctx.res.plural, ctx.name(), &why);
    if let Some(uid) = &opts.uid
        && meta_str(&obj, "uid") != Some(uid.as_str())
    {
        return Err(conflict(format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            meta_str(&obj, "uid").unwrap_or_default()
        )));
    }
    if let Some(rv) = &opts.resource_version
        && *rv != stored.to_string()
    {
        return Err(conflict(format!(
            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {stored}"
        )));
    }
    admission::validate(ctx, Operation::Delete, None, Some(&obj)).await?;
    let mut finalizers: Vec<Value> = meta(&obj)
        .get("finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let add = match opts.propagation.as_deref() {
        Some("Foreground") => Some("foregroundDeletion"),
        Some("Orphan") => Some("orphan"),
        Some("Background") | None => None,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unsupported propagationPolicy {other:?}"
            )));
        }
    };
    if let Some(f) = add
        && !finalizers.iter().any(|x| x == f)
    {
        finalizers.push(json!(f));
    }
    let grace = ctx.res.strategy.deletion_grace(&obj, opts.grace);
    let already = meta(&obj).get("deletionTimestamp").is_some();
    if finalizers.is_empty() && grace == 0 && !ctx.res.strategy.held_by_spec(&obj) {
        if opts.dry_run {
            return Ok(Some((StatusCode::OK, obj)));
        }
        let d = match ctx.api.store.delete(&ctx.key(), Some(stored)).await {
            Err(minik8s_storage::Error::Conflict { .. }) if opts.resource_version.is_none() => {
                return Ok(None);
            }
            other => other.map_err(|e| ctx.write_error(e))?,
        };
        let mut gone = ctx.res.read(&d.prev)?;
        object::meta_mut(&mut gone).insert("resourceVersion".into(), json!(d.revision.to_string()));
        deleted(ctx, d.revision).await?;
        return Ok(Some((StatusCode::OK, gone)));
    }
    // Mark for deletion: finalizers or the kubelet finish it.
    {
        let m = object::meta_mut(&mut obj);
        if !already {
            let when = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(grace);
            m.insert(
                "deletionTimestamp".into(),
                json!(
                    when.round(jiff::Unit::Second)
                        .unwrap_or(when)
                        .strftime("%Y-%m-%dT%H:%M:%SZ")
                        .to_string()
                ),
            );
        }
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    ctx.res.strategy.begin_deletion(&mut obj);
    if opts.dry_run {
        return Ok(Some((StatusCode::OK, obj)));
    }
    let kv = match ctx
        .api
        .store
        .update(&ctx.key(), ctx.res.encode(&mut obj)?, stored)
        .await
    {
        Err(minik8s_storage::Error::Conflict { .. }) if opts.resource_version.is_none() => {
            return Ok(None);
        }
        other => other.map_err(|e| ctx.write_error(e))?,
    };
    set_rv(&mut obj, &kv);
    Ok(Some((StatusCode::OK, obj)))
}

/// After an object is gone (at `revision`): a Service's addresses and ports are free for the
/// next allocation, and quotas of its namespace count one less.
pub(super) async fn deleted(ctx: &Ctx, revision: i64) -> ApiResult<()> {
    if ctx.res.strategy.allocates() {
        ctx.api.alloc.wrote(&ctx.key(), None, revision);
    }
    match ctx.namespace() {
        Some(ns) => admission::quota::refresh(&ctx.api, ns).await,
        None => Ok(()),
    }
}

/// DELETE one object.
pub async fn delete(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let opts = delete_options(&ctx, &body)?;
    let (code, obj) = delete_one(&ctx, &opts).await?;
    Ok(json_response(code, &obj, &[]))
}

/// DELETE a collection (with selectors).
pub async fn delete_collection(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let opts = delete_options(&ctx, &body)?;
    let selectors = super::super::read::Selectors::from(&ctx)?;
    let page = super::super::read::list_page(&ctx, &selectors).await?;
    let mut deleted = Vec::new();
    for item in page.items {
        let name = meta_str(&item, "name").unwrap_or_default().to_owned();
        let mut req = ctx.req.clone();
        req.name = Some(name);
        if ctx.namespace().is_none() && ctx.res.namespaced {
            req.namespace = meta_str(&item, "namespace").map(str::to_owned);
        }
        let one = Ctx {
            api: ctx.api.clone(),
            res: ctx.res.clone(),
            req,
            params: ctx.params.clone(),
            headers: ctx.headers.clone(),
            user: ctx.user.clone(),
            upgrade: None,
            warnings: ctx.warnings.clone(),
        };
        match delete_one(&one, &opts).await {
            Ok((_, obj)) => deleted.push(obj),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": ctx.res.list_kind,
        "apiVersion": ctx.res.api_version(),
        "metadata": {"resourceVersion": ctx.api.store.current_revision().await?.to_string()},
        "items": deleted,
    });
    Ok(json_response(StatusCode::OK, &list, &[]))
}

//! CREATE: server-owned metadata, defaults and the initial status of a new object, then
//! admission, validation, the kind's allocation and the write (with generated names).

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

/// Fills in server-owned metadata and defaults of a new object.
pub(super) fn prepare_create(ctx: &Ctx, obj: &mut Value) -> ApiResult<()> {
    let res = &ctx.res;
    let ns = ctx.namespace().map(str::to_owned);
    {
        let m = object::meta_mut(obj);
        match (&ns, m.get("namespace").and_then(Value::as_str)) {
            (Some(path), Some(body)) if !body.is_empty() && body != path => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        match &ns {
            Some(ns) => {
                m.insert("namespace".into(), json!(ns));
            }
            None => {
                m.remove("namespace");
            }
        }
        let name = m.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty()
            && let Some(prefix) = m.get("generateName").and_then(Value::as_str)
            && !prefix.is_empty()
        {
            let name = format!("{prefix}{}", object::random_suffix());
            m.insert("name".into(), json!(name));
        }
        m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        m.insert("creationTimestamp".into(), json!(object::now()));
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.remove(f);
        }
        if res.generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    if res.status
        && !res.keep_status_on_create
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    res.strategy.default(obj);
    res.strategy.prepare_for_create(obj, &ctx.user);
    res.strategy.initial_status(obj);
    record_manager(ctx, None, obj, None);
    Ok(())
}

/// Namespaced objects may only be created in an existing namespace that is not terminating
/// (upstream's NamespaceLifecycle admission).
pub(super) async fn check_namespace(ctx: &Ctx, obj: &Value) -> ApiResult<()> {
    let Some(ns) = ctx.namespace() else {
        return Ok(());
    };
    let kv = ctx
        .api
        .store
        .get(&format!("/registry/core/namespaces/{ns}"))
        .await?
        .ok_or_else(|| ApiError::not_found("", "namespaces", ns))?;
    let nsobj: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
    if meta(&nsobj).get("deletionTimestamp").is_some()
        || nsobj.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating")
    {
        return Err(ApiError::forbidden_object(
            &ctx.res.group,
            &ctx.res.plural,
            meta_str(obj, "name").unwrap_or_default(),
            &format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ),
        ));
    }
    Ok(())
}

/// POST: create an object.
pub async fn create(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let (obj, warnings) = decode(&ctx, &body)?;
    create_object(ctx, obj, warnings, false).await
}

/// Creates a decoded object; with `applied`, its manager owns its fields as an Apply.
pub(super) async fn create_object(
    ctx: Ctx,
    mut obj: Value,
    warnings: Vec<String>,
    applied: bool,
) -> ApiResult<Response> {
    let applied_fields =
        applied.then(|| crate::object::apply::fields_of(ctx.res.lists().for_apply(), &obj));
    prepare_create(&ctx, &mut obj)?;
    if let Some(fields) = applied_fields {
        let entry = crate::object::apply::Entry {
            manager: manager(&ctx),
            operation: "Apply".into(),
            api_version: ctx.res.api_version(),
            subresource: None,
            fields,
            time: object::now(),
        };
        crate::object::apply::set_entries(&mut obj, &[entry]);
    }
    check_namespace(&ctx, &obj).await?;
    admission::mutate(&ctx, Operation::Create, &mut obj, None).await?;
    // Admission may have changed what the status follows (a pod's QoS class).
    ctx.res.strategy.initial_status(&mut obj);
    validate(&ctx, &obj, None)?;
    admission::validate(&ctx, Operation::Create, Some(&obj), None).await?;
    let ns = ctx.namespace().unwrap_or_default().to_owned();
    let quota = match ctx.params.dry_run {
        true => None,
        false => admission::quota::admit(&ctx.api, &ctx.res, &ns, &obj).await?,
    };
    let generated = meta_str(&obj, "generateName").is_some_and(|g| !g.is_empty())
        && ctx.params.dry_run.then_some(()).is_none();
    let strategy = ctx.res.strategy;
    for attempt in 0..8 {
        let name = meta_str(&obj, "name").unwrap_or_default().to_owned();
        let key = ctx.res.key(ctx.namespace(), &name);
        // Kept until the write has landed (and the pool told it) or failed.
        let _reserved = match ctx.params.dry_run {
            true => None,
            false => strategy.allocate(&ctx.api, &key, &mut obj, None).await?,
        };
        if ctx.params.dry_run {
            if ctx.api.store.get(&key).await?.is_some() {
                return Err(ApiError::already_exists(
                    &ctx.res.group,
                    &ctx.res.plural,
                    &name,
                ));
            }
            return Ok(json_response(
                StatusCode::CREATED,
                &obj,
                &ctx.warnings.with(warnings),
            ));
        }
        let value = ctx.res.encode(&mut obj)?;
        match ctx.api.store.create(&key, value.clone()).await {
            Ok(kv) => {
                set_rv(&mut obj, &kv);
                if strategy.allocates() {
                    ctx.api.alloc.wrote(&key, Some(&value[..]), kv.mod_revision);
                }
                strategy.after_create(&ctx.api, &obj).await?;
                if quota.is_some() {
                    admission::quota::refresh(&ctx.api, &ns).await?;
                }
                strategy.after_write(&ctx.api, &obj).await?;
                return Ok(json_response(
                    StatusCode::CREATED,
                    &obj,
                    &ctx.warnings.with(warnings),
                ));
            }
            Err(minik8s_storage::Error::AlreadyExists { .. }) if generated && attempt < 7 => {
                let prefix = meta_str(&obj, "generateName")
                    .unwrap_or_default()
                    .to_owned();
                object::meta_mut(&mut obj).insert(
                    "name".into(),
                    json!(format!("{prefix}{}", object::random_suffix())),
                );
            }
            Err(minik8s_storage::Error::AlreadyExists { .. }) => {
                return Err(ApiError::already_exists(
                    &ctx.res.group,
                    &ctx.res.plural,
                    &name,
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::internal("could not generate a unique name"))
}

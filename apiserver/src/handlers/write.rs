//! CREATE, UPDATE, PATCH, DELETE and DELETECOLLECTION for every resource, and the steps they
//! share: decoding with field validation, metadata bookkeeping, defaulting, validation and
//! the compare-and-swap write.

use super::{Ctx, FieldValidation, json_response};
use crate::admission::{self, Operation};
use crate::error::{ApiError, ApiResult, Cause};
use crate::object::{self, meta, meta_str};
use crate::patch::{self, PatchType};
use crate::registry::ResourceInfo;
use crate::validation;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use minik8s_storage::{KeyValue, Store};
use serde_json::{Value, json};

/// Fields present in `input` but gone after the typed round trip: unknown fields.
fn unknown_fields(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
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
    let res = &ctx.res;
    if let Some(schema) = &res.crd_schema {
        let mut obj = obj;
        let out = crate::structural::apply(schema, &mut obj);
        if !out.causes.is_empty() {
            let name = meta_str(&obj, "name").unwrap_or_default().to_owned();
            return Err(ApiError::invalid(&res.group, &res.kind, &name, out.causes));
        }
        let messages: Vec<String> = out
            .pruned
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
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
fn decode(ctx: &Ctx, body: &Bytes) -> ApiResult<(Value, Vec<String>)> {
    let mut obj = object::decode_body(ctx.content_type(), body)?;
    default_kind(&ctx.res, &mut obj);
    check_kind(&ctx.res, &obj, body)?;
    typed(ctx, obj)
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

fn check_kind(res: &ResourceInfo, obj: &Value, body: &[u8]) -> ApiResult<()> {
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
fn manager(ctx: &Ctx) -> String {
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
    crate::apply::record_update(
        ctx.res.lists().for_apply(),
        old,
        obj,
        &manager(ctx),
        &ctx.res.api_version(),
        subresource,
    );
}

/// Whether anything but metadata and status differs (a spec change bumps `generation`).
fn spec_changed(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a != b;
    };
    fn rest(m: &serde_json::Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
        m.iter().filter(|(k, _)| *k != "metadata" && *k != "status")
    }
    rest(a).count() != rest(b).count() || rest(a).any(|(k, v)| b.get(k) != Some(v))
}

/// Fills in server-owned metadata and defaults of a new object.
fn prepare_create(ctx: &Ctx, obj: &mut Value) -> ApiResult<()> {
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

/// Metadata and kind validation → 422.
fn validate(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> ApiResult<()> {
    let res = &ctx.res;
    let mut causes = validation::validate_meta(res, obj);
    res.strategy.validate(obj, &mut causes);
    if let Some(old) = old {
        crate::kinds::no_new_finalizers(obj, old, &mut causes);
        res.strategy.validate_update(obj, old, &mut causes);
    }
    if causes.is_empty() {
        return Ok(());
    }
    let name = meta_str(obj, "name").unwrap_or_default();
    Err(ApiError::invalid(&res.group, &res.kind, name, causes))
}

/// Namespaced objects may only be created in an existing namespace that is not terminating
/// (upstream's NamespaceLifecycle admission).
async fn check_namespace(ctx: &Ctx, obj: &Value) -> ApiResult<()> {
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
async fn create_object(
    ctx: Ctx,
    mut obj: Value,
    warnings: Vec<String>,
    applied: bool,
) -> ApiResult<Response> {
    let applied_fields =
        applied.then(|| crate::apply::fields_of(ctx.res.lists().for_apply(), &obj));
    prepare_create(&ctx, &mut obj)?;
    if let Some(fields) = applied_fields {
        let entry = crate::apply::Entry {
            manager: manager(&ctx),
            operation: "Apply".into(),
            api_version: ctx.res.api_version(),
            subresource: None,
            fields,
            time: object::now(),
        };
        crate::apply::set_entries(&mut obj, &[entry]);
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
    let _guard = match strategy.allocates() {
        true => Some(ctx.api.alloc.lock().await),
        false => None,
    };
    for attempt in 0..8 {
        let name = meta_str(&obj, "name").unwrap_or_default().to_owned();
        let key = ctx.res.key(ctx.namespace(), &name);
        if !ctx.params.dry_run {
            strategy.allocate(&ctx.api, &key, &mut obj, None).await?;
        }
        if ctx.params.dry_run {
            if ctx.api.store.get(&key).await?.is_some() {
                return Err(ApiError::already_exists(
                    &ctx.res.group,
                    &ctx.res.plural,
                    &name,
                ));
            }
            return Ok(json_response(StatusCode::CREATED, &obj, &warnings));
        }
        match ctx.api.store.create(&key, ctx.res.encode(&mut obj)?).await {
            Ok(kv) => {
                set_rv(&mut obj, &kv);
                strategy.after_create(&ctx.api, &obj).await?;
                if quota.is_some() {
                    admission::quota::refresh(&ctx.api, &ns).await?;
                }
                strategy.after_write(&ctx.api, &obj).await?;
                return Ok(json_response(StatusCode::CREATED, &obj, &warnings));
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

fn set_rv(obj: &mut Value, kv: &KeyValue) {
    object::meta_mut(obj).insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
}

/// Reads the object the request names, with its revision; 404 if absent.
pub async fn current(ctx: &Ctx) -> ApiResult<(Value, i64)> {
    let kv = ctx
        .api
        .store
        .get(&ctx.key())
        .await?
        .ok_or_else(|| ApiError::not_found(&ctx.res.group, &ctx.res.plural, ctx.name()))?;
    Ok((ctx.res.read(&kv)?, kv.mod_revision))
}

/// Carries server-owned state from the stored object into an updated one.
pub fn prepare_update(
    ctx: &Ctx,
    new: &mut Value,
    old: &Value,
    subresource: Option<&str>,
) -> ApiResult<()> {
    let res = ctx.res.clone();
    let name = ctx.name().to_owned();
    {
        let body_name = meta_str(new, "name").unwrap_or_default();
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(ns) = ctx.namespace()
            && meta_str(new, "namespace").is_some_and(|b| !b.is_empty() && b != ns)
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if let (Some(a), Some(b)) = (meta_str(new, "uid"), meta_str(old, "uid"))
            && !a.is_empty()
            && a != b
        {
            return Err(ApiError::conflict(
                &res.group,
                &res.plural,
                &name,
                &format!("Precondition failed: UID in precondition: {a}, UID in object meta: {b}"),
            ));
        }
    }
    if matches!(subresource, Some("status" | "approval")) {
        // A status update changes only status (a CSR's approval only its conditions) and,
        // as upstream's status strategies keep the new object's metadata, its labels and
        // annotations.
        let status = new.as_object_mut().and_then(|m| m.remove("status"));
        // Which metadata a status update may change is the kind's (upstream's status
        // strategies).
        let (keep_labels, keep_annotations) = res.strategy.status_keeps_metadata();
        let labels = if keep_labels {
            meta(new).get("labels").cloned()
        } else {
            meta(old).get("labels").cloned()
        };
        let annotations = if keep_annotations {
            meta(new).get("annotations").cloned()
        } else {
            meta(old).get("annotations").cloned()
        };
        let rv = meta(new).get("resourceVersion").cloned();
        // The stored object without its old status (not cloned only to be replaced).
        let mut merged = match old.as_object() {
            Some(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| *k != "status")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            None => old.clone(),
        };
        if let Some(s) = status {
            merged["status"] = s;
        }
        let m = object::meta_mut(&mut merged);
        for (key, value) in [("labels", labels), ("annotations", annotations)] {
            match value {
                Some(v) => m.insert(key.into(), v),
                None => m.remove(key),
            };
        }
        match rv {
            Some(rv) => {
                object::meta_mut(&mut merged).insert("resourceVersion".into(), rv);
            }
            None => {
                object::meta_mut(&mut merged).remove("resourceVersion");
            }
        }
        res.strategy
            .prepare_for_status(&mut merged, old, subresource);
        *new = merged;
        record_manager(ctx, Some(old), new, subresource);
        return Ok(());
    }
    let old_meta = meta(old).clone();
    {
        let m = object::meta_mut(new);
        m.insert("name".into(), json!(name));
        if let Some(ns) = ctx.namespace() {
            m.insert("namespace".into(), json!(ns));
        }
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old_meta.get(f) {
                Some(v) => m.insert(f.into(), v.clone()),
                None => m.remove(f),
            };
        }
        if old_meta.get("managedFields").is_some() && m.get("managedFields").is_none() {
            m.insert("managedFields".into(), old_meta["managedFields"].clone());
        }
    }
    if res.status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    res.strategy.prepare_for_update(new, old, subresource);
    res.strategy.default(new);
    if res.generation && spec_changed(new, old) {
        let g = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        object::meta_mut(new).insert("generation".into(), json!(g + 1));
    }
    record_manager(ctx, Some(old), new, None);
    Ok(())
}

/// Writes an updated object if the stored one is still at `expected`; completes a pending
/// deletion once the last finalizer is gone.
async fn save(ctx: &Ctx, mut new: Value, old: &Value, expected: i64) -> ApiResult<Value> {
    admission::mutate(ctx, Operation::Update, &mut new, Some(old)).await?;
    validate(ctx, &new, Some(old))?;
    admission::validate(ctx, Operation::Update, Some(&new), Some(old)).await?;
    let key = ctx.key();
    let strategy = ctx.res.strategy;
    let main = ctx.req.subresource.is_none();
    let _guard = match strategy.allocates() && main {
        true => Some(ctx.api.alloc.lock().await),
        false => None,
    };
    if main {
        strategy
            .allocate(&ctx.api, &key, &mut new, Some(old))
            .await?;
    }
    // As upstream's ShouldDeleteDuringUpdate: the last finalizer gone from an object being
    // deleted ends it, unless it is still in its grace period (a terminating pod whose
    // kubelet writes status keeps existing until the kubelet deletes it).
    let finished = meta(&new).get("deletionTimestamp").is_some()
        && crate::kinds::finalized(&ctx.res, &new)
        && meta(old)
            .get("deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0;
    if !finished && unchanged(&new, old) {
        // As upstream: an update that changes nothing is not written (no new
        // resourceVersion, no watch event); the stored object is the answer.
        return Ok(old.clone());
    }
    if ctx.params.dry_run {
        object::meta_mut(&mut new).insert("resourceVersion".into(), json!(expected.to_string()));
        return Ok(new);
    }
    if finished {
        let d = ctx
            .api
            .store
            .delete(&key, Some(expected))
            .await
            .map_err(|e| ctx.write_error(e))?;
        object::meta_mut(&mut new).insert("resourceVersion".into(), json!(d.revision.to_string()));
        deleted(ctx).await?;
        return Ok(new);
    }
    let kv = ctx
        .api
        .store
        .update(&key, ctx.res.encode(&mut new)?, expected)
        .await
        .map_err(|e| ctx.write_error(e))?;
    set_rv(&mut new, &kv);
    if main && strategy.after_write(&ctx.api, &new).await? {
        return Ok(current(ctx).await?.0);
    }
    Ok(new)
}

/// Whether an updated object equals the stored one but for its resourceVersion and the
/// timestamps of its managedFields entries (which an update that changes nothing renews).
fn unchanged(new: &Value, old: &Value) -> bool {
    let (Some(n), Some(o)) = (new.as_object(), old.as_object()) else {
        return new == old;
    };
    let rest =
        |m: &serde_json::Map<String, Value>| m.iter().filter(|(k, _)| *k != "metadata").count();
    if rest(n) != rest(o)
        || n.iter()
            .any(|(k, v)| k != "metadata" && o.get(k) != Some(v))
    {
        return false;
    }
    let (Some(nm), Some(om)) = (
        n.get("metadata").and_then(Value::as_object),
        o.get("metadata").and_then(Value::as_object),
    ) else {
        return n.get("metadata") == o.get("metadata");
    };
    let skip = |k: &str| k == "resourceVersion" || k == "managedFields";
    let count = |m: &serde_json::Map<String, Value>| m.keys().filter(|k| !skip(k)).count();
    if count(nm) != count(om) || nm.iter().any(|(k, v)| !skip(k) && om.get(k) != Some(v)) {
        return false;
    }
    let entries = |m: &serde_json::Map<String, Value>| -> Vec<Value> {
        m.get("managedFields")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|e| {
                        let mut e = e.clone();
                        if let Some(e) = e.as_object_mut() {
                            e.remove("time");
                        }
                        e
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    entries(nm) == entries(om)
}

/// The revision an update expects: the body's resourceVersion, else the stored one.
fn expected_revision(ctx: &Ctx, new: &Value, stored: i64) -> ApiResult<i64> {
    match meta_str(new, "resourceVersion") {
        None | Some("") => Ok(stored),
        Some(rv) => {
            let rv: i64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
            if rv != stored {
                return Err(ApiError::stale(&ctx.res.group, &ctx.res.plural, ctx.name()));
            }
            Ok(rv)
        }
    }
}

/// PUT: replace an object (or its status).
pub async fn update(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let (mut new, warnings) = decode(&ctx, &body)?;
    let (old, stored) = current(&ctx).await?;
    let expected = expected_revision(&ctx, &new, stored)?;
    prepare_update(&ctx, &mut new, &old, ctx.req.subresource.as_deref())?;
    let saved = save(&ctx, new, &old, expected).await?;
    Ok(json_response(StatusCode::OK, &saved, &warnings))
}

/// Applies a patch body to an object.
fn apply_patch(ctx: &Ctx, ty: PatchType, target: &mut Value, patch: &Value) -> ApiResult<()> {
    match ty {
        PatchType::Json => patch::json_patch(target, patch),
        PatchType::Merge => {
            patch::merge_patch(target, patch);
            Ok(())
        }
        PatchType::Strategic | PatchType::Apply => {
            if !ctx.res.strategic_merge {
                return Err(ApiError::unsupported_media_type(
                    "application/strategic-merge-patch+json",
                ));
            }
            patch::strategic_merge(ctx.res.lists(), target, patch)
        }
    }
}

/// How often a write is re-read and retried after a concurrent write before it gives up.
const MAX_RETRIES: usize = 16;

/// PATCH: change an object (or its status) by a patch, retrying on concurrent writes.
pub async fn patch(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let ct = ctx.content_type().to_owned();
    let ty =
        PatchType::from_content_type(&ct).ok_or_else(|| ApiError::unsupported_media_type(&ct))?;
    let patch_body = object::decode_body(&ct, &body)?;
    for _ in 0..MAX_RETRIES {
        let found = ctx.api.store.get(&ctx.key()).await?;
        let (old, stored) = match found {
            Some(kv) => (ctx.res.read(&kv)?, kv.mod_revision),
            None if ty == PatchType::Apply && ctx.req.subresource.is_none() => {
                // Server-side apply of an absent object creates it.
                check_kind(&ctx.res, &patch_body, &body)?;
                let (obj, warnings) = typed(&ctx, patch_body.clone())?;
                return create_object(ctx, obj, warnings, true).await;
            }
            None => {
                return Err(ApiError::not_found(
                    &ctx.res.group,
                    &ctx.res.plural,
                    ctx.name(),
                ));
            }
        };
        if ty == PatchType::Apply {
            let (saved, warnings) =
                server_side_apply(&ctx, &old, stored, &patch_body, &body).await?;
            match saved {
                Some(saved) => return Ok(json_response(StatusCode::OK, &saved, &warnings)),
                None => continue,
            }
        }
        let mut new = old.clone();
        apply_patch(&ctx, ty, &mut new, &patch_body)?;
        check_kind(&ctx.res, &new, &body)?;
        let (mut new, warnings) = typed(&ctx, new)?;
        let expected = expected_revision(&ctx, &new, stored)?;
        prepare_update(&ctx, &mut new, &old, ctx.req.subresource.as_deref())?;
        match save(&ctx, new, &old, expected).await {
            Ok(saved) => return Ok(json_response(StatusCode::OK, &saved, &warnings)),
            // Someone wrote in between: read again and reapply, unless the patch pinned a version.
            Err(e)
                if e.code == 409
                    && e.reason == "Conflict"
                    && meta_str(&patch_body, "resourceVersion").is_none() =>
            {
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::stale(&ctx.res.group, &ctx.res.plural, ctx.name()))
}

/// Server-side apply onto an existing object: `Ok(None)` means a concurrent write, retry.
async fn server_side_apply(
    ctx: &Ctx,
    old: &Value,
    stored: i64,
    applied: &Value,
    body: &[u8],
) -> ApiResult<(Option<Value>, Vec<String>)> {
    check_kind(&ctx.res, applied, body)?;
    if ctx.params.field_manager.is_none() {
        return Err(ApiError::bad_request(
            "PATCH with application/apply-patch+yaml requires a fieldManager",
        ));
    }
    // An applied configuration is partial: the merged object is what gets validated.
    let applied = applied.clone();
    let manager = manager(ctx);
    let lists = ctx.res.lists().for_apply();
    let merged = crate::apply::apply(
        lists,
        old,
        &applied,
        &manager,
        &ctx.res.api_version(),
        ctx.req.subresource.as_deref(),
        ctx.params.force,
        |t, p| {
            let mut p = p.clone();
            if let Some(m) = p.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
                m.remove("resourceVersion");
            }
            // Apply merges by list type: built-in merge keys, or the CRD schema's list types.
            let _ = patch::strategic_merge(lists, t, &p);
        },
    );
    let new = match merged {
        Ok(v) => v,
        Err(conflicts) => {
            let causes: Vec<Cause> = conflicts
                .iter()
                .map(|c| Cause {
                    reason: "FieldManagerConflict".into(),
                    message: format!("conflict with \"{}\"", c.manager),
                    field: crate::apply::display(&c.path),
                })
                .collect();
            let lines: Vec<String> = causes
                .iter()
                .map(|c| format!("{}: {}", c.message, c.field))
                .collect();
            let n = causes.len();
            let mut e = ApiError::conflict(&ctx.res.group, &ctx.res.plural, ctx.name(), "");
            e.message = format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                lines.join("\n")
            );
            e.details = Some(
                json!({"name": ctx.name(), "group": ctx.res.group, "kind": ctx.res.plural, "causes": causes}),
            );
            return Err(e);
        }
    };
    let managed = new.pointer("/metadata/managedFields").cloned();
    let (mut new, warnings) = typed(ctx, new)?;
    let expected = expected_revision(ctx, applied_rv(&applied, &mut new), stored)?;
    prepare_update(ctx, &mut new, old, ctx.req.subresource.as_deref())?;
    if let Some(m) = managed {
        object::meta_mut(&mut new).insert("managedFields".into(), m);
    }
    match save(ctx, new, old, expected).await {
        Ok(saved) => Ok((Some(saved), warnings)),
        Err(e)
            if e.code == 409
                && e.reason == "Conflict"
                && meta_str(&applied, "resourceVersion").is_none() =>
        {
            Ok((None, warnings))
        }
        Err(e) => Err(e),
    }
}

/// An applied configuration may pin a resourceVersion; the merged object carries it.
fn applied_rv<'a>(applied: &Value, merged: &'a mut Value) -> &'a Value {
    match meta_str(applied, "resourceVersion") {
        Some(rv) => {
            object::meta_mut(merged).insert("resourceVersion".into(), json!(rv));
        }
        None => {
            object::meta_mut(merged).remove("resourceVersion");
        }
    }
    merged
}

/// `DeleteOptions` from the body and the query.
struct DeleteOptions {
    propagation: Option<String>,
    grace: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
    dry_run: bool,
}

fn delete_options(ctx: &Ctx, body: &Bytes) -> ApiResult<DeleteOptions> {
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
async fn delete_one(ctx: &Ctx, opts: &DeleteOptions) -> ApiResult<(StatusCode, Value)> {
    for _ in 0..MAX_RETRIES {
        if let Some(done) = try_delete(ctx, opts).await? {
            return Ok(done);
        }
    }
    Err(ApiError::stale(&ctx.res.group, &ctx.res.plural, ctx.name()))
}

/// One attempt at a DELETE; `Ok(None)` means a concurrent write, retry.
async fn try_delete(ctx: &Ctx, opts: &DeleteOptions) -> ApiResult<Option<(StatusCode, Value)>> {
    let (mut obj, stored) = current(ctx).await?;
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
        deleted(ctx).await?;
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

/// After an object is gone: quotas of its namespace count one less.
async fn deleted(ctx: &Ctx) -> ApiResult<()> {
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
    let selectors = super::read::Selectors::from(&ctx)?;
    let page = super::read::list_page(&ctx, &selectors).await?;
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

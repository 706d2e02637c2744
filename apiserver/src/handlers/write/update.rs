//! UPDATE, PATCH (JSON, merge, strategic merge) and server-side APPLY: carrying server-owned
//! state over from the stored object, and the compare-and-swap write that retries a patch.

use super::*;
use crate::admission::{self, Operation};
use crate::context::{Ctx, json_response};
use crate::error::{ApiError, ApiResult, Cause};
use crate::object::patch::{self, PatchType};
use crate::object::{self, meta, meta_str};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use minik8s_storage::Store;
use serde_json::{Value, json};

/// Whether anything but metadata and status differs (a spec change bumps `generation`).
pub(super) fn spec_changed(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a != b;
    };
    fn rest(m: &serde_json::Map<String, Value>) -> impl Iterator<Item = (&String, &Value)> {
        m.iter().filter(|(k, _)| *k != "metadata" && *k != "status")
    }
    rest(a).count() != rest(b).count() || rest(a).any(|(k, v)| b.get(k) != Some(v))
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
    if subresource == Some("ephemeralcontainers") {
        // As upstream's dropNonEphemeralContainerUpdates: the stored pod with the request's
        // ephemeral containers; metadata, the rest of the spec and status stay as stored.
        let ephemeral = new.pointer("/spec/ephemeralContainers").cloned();
        let rv = meta(new).get("resourceVersion").cloned();
        let mut merged = old.clone();
        match (
            ephemeral,
            merged.get_mut("spec").and_then(Value::as_object_mut),
        ) {
            (Some(e), Some(spec)) => {
                spec.insert("ephemeralContainers".into(), e);
            }
            (None, Some(spec)) => {
                spec.remove("ephemeralContainers");
            }
            _ => {}
        }
        match rv {
            Some(rv) => object::meta_mut(&mut merged).insert("resourceVersion".into(), rv),
            None => object::meta_mut(&mut merged).remove("resourceVersion"),
        };
        res.strategy.default(&mut merged);
        // As upstream's updatePodGeneration: new ephemeral containers are a spec change.
        let changed =
            merged.pointer("/spec/ephemeralContainers") != old.pointer("/spec/ephemeralContainers");
        if res.generation && changed {
            let g = meta(old)
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            object::meta_mut(&mut merged).insert("generation".into(), json!(g + 1));
        }
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
pub(super) async fn save(
    ctx: &Ctx,
    mut new: Value,
    old: &Value,
    expected: i64,
) -> ApiResult<Value> {
    admission::mutate(ctx, Operation::Update, &mut new, Some(old)).await?;
    validate(ctx, &new, Some(old))?;
    admission::validate(ctx, Operation::Update, Some(&new), Some(old)).await?;
    let key = ctx.key();
    let strategy = ctx.res.strategy;
    let main = ctx.req.subresource.is_none();
    // Kept until the write has landed (and the pool told it) or failed.
    let _reserved = match main {
        true => {
            strategy
                .allocate(&ctx.api, &key, &mut new, Some(old))
                .await?
        }
        false => None,
    };
    // As upstream's ShouldDeleteDuringUpdate: the last finalizer gone from an object being
    // deleted ends it, unless it is still in its grace period (a terminating pod whose
    // kubelet writes status keeps existing until the kubelet deletes it).
    let finished = meta(&new).get("deletionTimestamp").is_some()
        && crate::registry::kinds::finalized(&ctx.res, &new)
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
        super::delete::deleted(ctx, d.revision).await?;
        return Ok(new);
    }
    let value = ctx.res.encode(&mut new)?;
    let kv = ctx
        .api
        .store
        .update(&key, value.clone(), expected)
        .await
        .map_err(|e| ctx.write_error(e))?;
    set_rv(&mut new, &kv);
    if strategy.allocates() {
        ctx.api.alloc.wrote(&key, Some(&value[..]), kv.mod_revision);
    }
    if main && strategy.after_write(&ctx.api, &new).await? {
        return Ok(ctx.current().await?.0);
    }
    Ok(new)
}

/// Whether an updated object equals the stored one but for its resourceVersion and the
/// timestamps and order of its managedFields entries (which an update that changes nothing
/// renews, and an apply reorders).
pub(super) fn unchanged(new: &Value, old: &Value) -> bool {
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
    // In any order: an apply moves its manager's entry, which changes nothing stored.
    let sorted = |mut v: Vec<Value>| {
        v.sort_by_cached_key(Value::to_string);
        v
    };
    sorted(entries(nm)) == sorted(entries(om))
}

/// The revision an update expects: the body's resourceVersion, else the stored one.
pub(super) fn expected_revision(ctx: &Ctx, new: &Value, stored: i64) -> ApiResult<i64> {
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
    let (old, stored) = ctx.current().await?;
    let expected = expected_revision(&ctx, &new, stored)?;
    prepare_update(&ctx, &mut new, &old, ctx.req.subresource.as_deref())?;
    let saved = save(&ctx, new, &old, expected).await?;
    Ok(json_response(
        StatusCode::OK,
        &saved,
        &ctx.warnings.with(warnings),
    ))
}

/// Applies a patch body to an object.
pub(super) fn apply_patch(
    ctx: &Ctx,
    ty: PatchType,
    target: &mut Value,
    patch: &Value,
) -> ApiResult<()> {
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
                let (obj, mut warnings) =
                    typed(&ctx, patch_body.clone()).map_err(|e| apply_strict_error(&ctx, e))?;
                warnings.extend(apply_duplicates(&ctx, &body)?);
                return super::create::create_object(ctx, obj, warnings, true).await;
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
                Some(saved) => {
                    return Ok(json_response(
                        StatusCode::OK,
                        &saved,
                        &ctx.warnings.with(warnings),
                    ));
                }
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
            Ok(saved) => {
                return Ok(json_response(
                    StatusCode::OK,
                    &saved,
                    &ctx.warnings.with(warnings),
                ));
            }
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
pub(super) async fn server_side_apply(
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
    let merged = crate::object::apply::apply(
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
                    field: crate::object::apply::display(&c.path),
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
    let (mut new, mut warnings) = typed(ctx, new).map_err(|e| apply_strict_error(ctx, e))?;
    warnings.extend(apply_duplicates(ctx, body)?);
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
pub(super) fn applied_rv<'a>(applied: &Value, merged: &'a mut Value) -> &'a Value {
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

/// As upstream's apply, once the patch has applied: the strict YAML decoder's findings over the
/// patch body (keys named twice) refuse it under fieldValidation=Strict and are warnings under
/// Warn, one per key.
fn apply_duplicates(ctx: &Ctx, body: &[u8]) -> ApiResult<Vec<String>> {
    if ctx.params.field_validation == FieldValidation::Ignore {
        return Ok(Vec::new());
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return Ok(Vec::new());
    };
    let lines = object::yaml_duplicate_keys(text);
    match ctx.params.field_validation {
        FieldValidation::Strict if !lines.is_empty() => Err(ApiError::bad_request(format!(
            "error strict decoding YAML: error converting YAML to JSON: yaml: unmarshal errors:\n  {}",
            lines.join("\n  ")
        ))),
        _ => Ok(lines),
    }
}

/// A server-side apply refused by strict field validation says what upstream's apply says:
/// the typed patch's fields that are not in the schema (`.spec.x: field not declared in
/// schema`), not the decoder's words.
fn apply_strict_error(ctx: &Ctx, mut e: ApiError) -> ApiError {
    let Some(list) = e.message.strip_prefix("strict decoding error: ") else {
        return e;
    };
    let fields: Vec<String> = list
        .split(", ")
        .filter_map(|item| {
            let f = item.strip_prefix("unknown field \"")?.strip_suffix('"')?;
            Some(format!(".{f}: field not declared in schema"))
        })
        .collect();
    if fields.is_empty() {
        return e;
    }
    let ns = ctx.namespace().map(|n| format!("{n}/")).unwrap_or_default();
    e.message = format!(
        "failed to create typed patch object ({ns}{}; {}, Kind={}): {}",
        ctx.name(),
        ctx.res.api_version(),
        ctx.res.kind,
        fields.join(", ")
    );
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_is_unchanged_whatever_its_managed_fields_times_and_order() {
        let entry = |manager: &str, time: &str| {
            json!({"manager": manager, "operation": "Apply", "time": time,
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}})
        };
        let old = json!({"metadata": {"name": "f", "resourceVersion": "5",
            "managedFields": [entry("a", "t1"), entry("b", "t1")]}, "spec": {"x": 1}});
        let reordered = json!({"metadata": {"name": "f", "resourceVersion": "5",
            "managedFields": [entry("b", "t2"), entry("a", "t1")]}, "spec": {"x": 1}});
        assert!(unchanged(&reordered, &old));
        let changed = json!({"metadata": {"name": "f",
            "managedFields": [entry("b", "t2"), entry("a", "t1")]}, "spec": {"x": 2}});
        assert!(!unchanged(&changed, &old));
        let other_manager = json!({"metadata": {"name": "f",
            "managedFields": [entry("b", "t2"), entry("c", "t1")]}, "spec": {"x": 1}});
        assert!(!unchanged(&other_manager, &old));
    }
}

//! Admission webhooks: `MutatingWebhookConfiguration` and `ValidatingWebhookConfiguration`
//! (admissionregistration.k8s.io/v1), called over HTTPS with `AdmissionReview` v1. Rules,
//! namespace and object selectors, `failurePolicy`, `timeoutSeconds` and `sideEffects` are
//! honoured as upstream; mutating webhooks run in configuration-name order and patch with
//! JSONPatch, validating webhooks run concurrently. `matchConditions` (CEL) decide, after the
//! rules and selectors, whether a webhook is called.

use super::Operation;
use super::matching::Matcher;
use super::review::review;
use crate::Api;
use crate::admission::webhook_client::{Target, client_config, post_review};
use crate::context::Ctx;
use crate::error::{ApiError, ApiResult};
use crate::object::meta_str;
use base64::Engine;
use minik8s_storage::KeyValue;
use serde_json::Value;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Where both configuration kinds (and the admission policies) are stored.
pub const PREFIX: &str = "/registry/admissionregistration.k8s.io/";

/// One webhook of a configuration.
#[derive(Debug, Clone)]
struct Hook {
    name: String,
    config: String,
    target: Target,
    ca: Vec<u8>,
    matcher: Matcher,
    /// `matchConditions`: (name, expression), all of which must hold.
    conditions: Vec<(String, String)>,
    fail_open: bool,
    timeout: Duration,
    side_effects_on_dry_run: bool,
}

impl Hook {
    fn from(config: &str, v: &Value) -> Option<Self> {
        let (target, ca) = client_config(v.get("clientConfig")?)?;
        Some(Hook {
            name: v.get("name")?.as_str()?.to_owned(),
            config: config.to_owned(),
            target,
            ca,
            matcher: Matcher::webhook(v),
            conditions: super::cel::conditions(v),
            fail_open: v.get("failurePolicy").and_then(Value::as_str) == Some("Ignore"),
            timeout: Duration::from_secs(
                v.get("timeoutSeconds")
                    .and_then(Value::as_u64)
                    .unwrap_or(10)
                    .clamp(1, 30),
            ),
            side_effects_on_dry_run: matches!(
                v.get("sideEffects").and_then(Value::as_str),
                Some("Some" | "Unknown")
            ),
        })
    }
}

/// The webhooks of every stored configuration, kept in step with the store.
#[derive(Default)]
pub struct Webhooks {
    /// (mutating, validating), each in configuration-name order.
    hooks: RwLock<Arc<(Vec<Hook>, Vec<Hook>)>>,
}

impl Webhooks {
    /// Rebuilds the copy from the stored configurations.
    pub fn load(&self, kvs: &[KeyValue]) {
        let mut mutating = Vec::new();
        let mut validating = Vec::new();
        let mut configs: Vec<(String, bool, Value)> = kvs
            .iter()
            .filter(|kv| kv.key.contains("webhookconfigurations/"))
            .filter_map(|kv| {
                let o: Value = serde_json::from_slice(&kv.value).ok()?;
                let mutating = kv.key.contains("/mutatingwebhookconfigurations/");
                Some((meta_str(&o, "name")?.to_owned(), mutating, o))
            })
            .collect();
        configs.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, is_mutating, o) in configs {
            let hooks = o
                .get("webhooks")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|h| Hook::from(&name, h));
            if is_mutating {
                mutating.extend(hooks);
            } else {
                validating.extend(hooks);
            }
        }
        *self.hooks.write().expect("webhooks lock") = Arc::new((mutating, validating));
    }

    fn snapshot(&self) -> Arc<(Vec<Hook>, Vec<Hook>)> {
        self.hooks.read().expect("webhooks lock").clone()
    }
}

/// Whether a webhook applies to this request: rules, selectors, then its
/// `matchConditions` (a condition that fails to evaluate follows the failure policy).
async fn applies(
    hook: &Hook,
    ctx: &Ctx,
    op: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<bool> {
    if !hook.matcher.matches(ctx, op, obj, old, false).await? {
        return Ok(false);
    }
    if hook.conditions.is_empty() {
        return Ok(true);
    }
    let input = super::cel::Input::new(ctx, op, obj, old, None, None);
    match input.conditions_hold(&hook.conditions) {
        Ok(holds) => Ok(holds),
        Err(_) if hook.fail_open => Ok(false),
        Err(e) => Err(ApiError::internal(format!(
            "failed calling webhook \"{}\": {e}",
            hook.name
        ))),
    }
}

/// POSTs a review to a webhook over TLS verified against its `caBundle`, within its timeout
/// (sent as `?timeout=`, as upstream's client does).
async fn post(api: &Api, hook: &Hook, body: Vec<u8>) -> Result<Value, String> {
    post_review(
        &api.store,
        &api.tasks,
        &hook.target,
        &hook.ca,
        body,
        Some(hook.timeout),
    )
    .await
}

/// Status reasons a webhook may give that the API knows by name.
fn known_reason(r: &str) -> &'static str {
    const KNOWN: [&str; 10] = [
        "BadRequest",
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Invalid",
        "InternalError",
        "ServiceUnavailable",
        "TooManyRequests",
    ];
    KNOWN.into_iter().find(|k| *k == r).unwrap_or("")
}

/// Calls one webhook: `Ok(Some(response))` when it answered, `Ok(None)` when it failed
/// and its policy is Ignore, `Err` otherwise (including a denial).
async fn call(ctx: &Ctx, hook: &Hook, review: Value) -> ApiResult<Option<Value>> {
    if ctx.params.dry_run && hook.side_effects_on_dry_run {
        return Err(ApiError::bad_request(format!(
            "admission webhook {:?} has side effects and does not support dry run",
            hook.name
        )));
    }
    let body = serde_json::to_vec(&review).map_err(ApiError::internal)?;
    let sent_uid = review.pointer("/request/uid").cloned();
    let answer = post(&ctx.api, hook, body).await;
    let response = answer.and_then(|v| {
        let r = v
            .get("response")
            .cloned()
            .ok_or("AdmissionReview has no response")?;
        if r.get("uid") != sent_uid.as_ref() {
            return Err("AdmissionReview response uid does not match the request".into());
        }
        Ok(r)
    });
    let response = match response {
        Ok(r) => r,
        Err(e) if hook.fail_open => {
            tracing::warn!(webhook = %hook.name, config = %hook.config, error = %e, "webhook failed, ignored by its failurePolicy");
            return Ok(None);
        }
        Err(e) => {
            return Err(ApiError::internal(format!(
                "failed calling webhook \"{}\": {e}",
                hook.name
            )));
        }
    };
    if response.get("allowed").and_then(Value::as_bool) != Some(true) {
        let status = response.get("status").cloned().unwrap_or_default();
        let denied = format!("admission webhook \"{}\" denied the request", hook.name);
        // Upstream's ToStatusErr: the message, else the reason, explains the denial.
        let text = |k: &str| {
            status
                .get(k)
                .and_then(Value::as_str)
                .filter(|m| !m.is_empty())
        };
        let message = match text("message").or_else(|| text("reason")) {
            Some(m) => format!("{denied}: {m}"),
            None => format!("{denied} without explanation"),
        };
        let mut e = ApiError::bad_request(message);
        if let Some(code) = status.get("code").and_then(Value::as_u64)
            && (400..600).contains(&code)
        {
            e.code = code as u16;
        }
        e.reason = known_reason(status.get("reason").and_then(Value::as_str).unwrap_or(""));
        if e.reason.is_empty() && e.code == 400 {
            e.reason = "BadRequest";
        }
        return Err(e);
    }
    Ok(Some(response))
}

/// Runs the mutating webhooks in order; returns whether any patched the object.
pub async fn mutate(
    ctx: &Ctx,
    op: Operation,
    obj: &mut Value,
    old: Option<&Value>,
) -> ApiResult<bool> {
    let hooks = ctx.api.webhooks.snapshot();
    let mut patched = false;
    for hook in &hooks.0 {
        if !applies(hook, ctx, op, Some(obj), old).await? {
            continue;
        }
        let Some(response) = call(ctx, hook, review(ctx, op, Some(obj), old)).await? else {
            continue;
        };
        let Some(patch) = response.get("patch").and_then(Value::as_str) else {
            continue;
        };
        let bad = |e: String| {
            ApiError::internal(format!(
                "admission webhook \"{}\" returned an invalid patch: {e}",
                hook.name
            ))
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .map_err(|e| bad(e.to_string()))?;
        let ops: Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        crate::object::patch::json_patch(obj, &ops).map_err(|e| bad(e.message))?;
        patched = true;
    }
    Ok(patched)
}

/// Runs the validating webhooks concurrently; the first denial (in order) wins.
pub async fn validate(
    ctx: &Ctx,
    op: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<()> {
    let hooks = ctx.api.webhooks.snapshot();
    if hooks.1.is_empty() {
        return Ok(());
    }
    let mut calls = Vec::new();
    for hook in &hooks.1 {
        if applies(hook, ctx, op, obj, old).await? {
            calls.push(call(ctx, hook, review(ctx, op, obj, old)));
        }
    }
    for result in futures::future::join_all(calls).await {
        result?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hooks_are_read_from_configurations_in_name_order() {
        let cfg = |name: &str| {
            KeyValue {
            key: format!("/registry/admissionregistration.k8s.io/validatingwebhookconfigurations/{name}"),
            value: serde_json::to_vec(&json!({
                "metadata": {"name": name},
                "webhooks": [{
                    "name": format!("{name}.example.com"),
                    "clientConfig": {"url": "https://127.0.0.1:9443/validate"},
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 3,
                }],
            }))
            .unwrap()
            .into(),
            create_revision: 1,
            mod_revision: 1,
        }
        };
        let w = Webhooks::default();
        w.load(&[cfg("b"), cfg("a")]);
        let snap = w.snapshot();
        assert!(snap.0.is_empty());
        let names: Vec<&str> = snap.1.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a.example.com", "b.example.com"]);
        assert!(snap.1[0].fail_open);
        assert_eq!(snap.1[0].timeout, Duration::from_secs(3));
    }
}

//! ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): policies of CEL validations
//! and the bindings that put them in force, evaluated in the apiserver as upstream's
//! `ValidatingAdmissionPolicy` admission plugin does, after the built-in validation and
//! before validating webhooks. A policy matches by its `matchConstraints`, a binding
//! narrows by its `matchResources` and supplies parameters (`paramRef`); `matchConditions`,
//! `variables`, `validations` (message, `messageExpression`, reason) and `failurePolicy` are
//! honoured, and a binding's `validationActions` deny (`Deny`), warn (`Warn`, as `Warning`
//! headers) or record (`Audit`, logged: there is no audit annotation here).

use super::Operation;
use super::cel::{Input, conditions, describe};
use super::matching::{Matcher, namespace_object};
use crate::context::Ctx;
use crate::error::{ApiError, ApiResult};
use crate::object::{from_store, meta_str};
use minik8s_storage::{KeyValue, RangeRequest, Store};
use minik8s_types::LabelSelector;
use serde_json::{Value, json};
use std::sync::{Arc, RwLock};

/// Where policies are stored.
const POLICIES: &str = "/validatingadmissionpolicies/";
/// Where their bindings are stored.
const BINDINGS: &str = "/validatingadmissionpolicybindings/";

/// Upstream's limit on an evaluated `messageExpression` (`MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE: usize = 5 * 1024;

#[derive(Debug, Clone)]
struct Validation {
    expression: String,
    message: String,
    message_expression: String,
    reason: Option<String>,
}

#[derive(Debug, Clone)]
struct Binding {
    name: String,
    matcher: Option<Matcher>,
    actions: Vec<String>,
    param_ref: Option<Value>,
}

#[derive(Debug, Clone)]
struct Policy {
    name: String,
    matcher: Matcher,
    conditions: Vec<(String, String)>,
    variables: Vec<(String, String)>,
    validations: Vec<Validation>,
    fail_open: bool,
    /// `paramKind`: (apiVersion, kind).
    param_kind: Option<(String, String)>,
    bindings: Vec<Binding>,
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

impl Policy {
    fn from(o: &Value) -> Option<Self> {
        let spec = o.get("spec")?;
        let list = |k: &str| {
            spec.get(k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        Some(Policy {
            name: meta_str(o, "name")?.to_owned(),
            matcher: Matcher::resources(spec.get("matchConstraints").unwrap_or(&Value::Null)),
            conditions: conditions(spec),
            variables: list("variables")
                .iter()
                .map(|v| (text(v, "name"), text(v, "expression")))
                .collect(),
            validations: list("validations")
                .iter()
                .map(|v| Validation {
                    expression: text(v, "expression"),
                    message: text(v, "message"),
                    message_expression: text(v, "messageExpression"),
                    reason: v.get("reason").and_then(Value::as_str).map(str::to_owned),
                })
                .collect(),
            fail_open: spec.get("failurePolicy").and_then(Value::as_str) == Some("Ignore"),
            param_kind: spec
                .get("paramKind")
                .map(|p| (text(p, "apiVersion"), text(p, "kind"))),
            bindings: Vec::new(),
        })
    }
}

impl Binding {
    /// A binding and the name of its policy.
    fn from(o: &Value) -> Option<(String, Self)> {
        let spec = o.get("spec")?;
        Some((
            text(spec, "policyName"),
            Binding {
                name: meta_str(o, "name")?.to_owned(),
                matcher: spec.get("matchResources").map(Matcher::resources),
                actions: crate::object::strings_at(spec, "/validationActions"),
                param_ref: spec.get("paramRef").cloned(),
            },
        ))
    }
}

/// The stored policies with their bindings, kept in step with the store.
#[derive(Default)]
pub struct Policies {
    policies: RwLock<Arc<Vec<Policy>>>,
}

impl Policies {
    /// Rebuilds the copy from the stored admissionregistration objects.
    pub fn load(&self, kvs: &[KeyValue]) {
        let decode = |kv: &KeyValue| serde_json::from_slice::<Value>(&kv.value).ok();
        let mut policies: Vec<Policy> = kvs
            .iter()
            .filter(|kv| kv.key.contains(POLICIES))
            .filter_map(|kv| Policy::from(&decode(kv)?))
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        let mut bindings: Vec<(String, Binding)> = kvs
            .iter()
            .filter(|kv| kv.key.contains(BINDINGS))
            .filter_map(|kv| Binding::from(&decode(kv)?))
            .collect();
        bindings.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        for (policy, binding) in bindings {
            if let Some(p) = policies.iter_mut().find(|p| p.name == policy) {
                p.bindings.push(binding);
            }
        }
        policies.retain(|p| !p.bindings.is_empty());
        *self.policies.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policies);
    }

    fn snapshot(&self) -> Arc<Vec<Policy>> {
        self.policies
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One failed validation (or a configuration or evaluation error under `failurePolicy:
/// Fail`).
struct Denial {
    policy: String,
    binding: Option<String>,
    message: String,
    reason: Option<String>,
}

/// Runs the policies bound to this request; the first denial is the answer.
pub async fn validate(
    ctx: &Ctx,
    op: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<()> {
    let policies = ctx.api.policies.snapshot();
    if policies.is_empty() {
        return Ok(());
    }
    let mut denials = Vec::new();
    for policy in policies.iter() {
        if !policy.matcher.matches(ctx, op, obj, old, true).await? {
            continue;
        }
        for binding in &policy.bindings {
            if let Some(m) = &binding.matcher
                && !m.matches(ctx, op, obj, old, true).await?
            {
                continue;
            }
            let config_error = |e: String| Denial {
                policy: policy.name.clone(),
                binding: Some(binding.name.clone()),
                message: format!("failed to configure binding: {e}"),
                reason: None,
            };
            let params = match params(ctx, policy, binding).await {
                Ok(p) => p,
                Err(e) if policy.fail_open => {
                    tracing::warn!(policy = %policy.name, binding = %binding.name, error = %e, "policy binding ignored by its failurePolicy");
                    continue;
                }
                Err(e) => {
                    denials.push(config_error(e));
                    continue;
                }
            };
            // A namespace's own namespace is not looked up (upstream unsets it).
            let is_namespace = ctx.res.strategy.is_namespace();
            let namespace = match is_namespace {
                true => None,
                false => namespace_object(ctx).await?,
            };
            for param in params {
                let input = Input::new(ctx, op, obj, old, namespace.clone(), param);
                for (message, reason) in evaluate(policy, input) {
                    decide(ctx, policy, binding, message, reason, &mut denials);
                }
            }
        }
    }
    match denials.into_iter().next() {
        None => Ok(()),
        Some(d) => Err(denied(ctx, obj.or(old), d)),
    }
}

/// Evaluates a policy's conditions, variables and validations; returns the failures as
/// (message, reason).
fn evaluate(policy: &Policy, mut input: Input) -> Vec<(String, Option<String>)> {
    let error = |message: String| match policy.fail_open {
        true => None,
        false => Some((message, None)),
    };
    match input.conditions_hold(&policy.conditions) {
        Ok(true) => {}
        Ok(false) => return vec![],
        Err(e) => return error(e).into_iter().collect(),
    }
    for (name, expression) in &policy.variables {
        input.bind_variable(name, expression);
    }
    let mut failures = Vec::new();
    for v in &policy.validations {
        match input.eval_bool(&v.expression) {
            Ok(true) => {}
            Ok(false) => failures.push((message(&input, v), v.reason.clone())),
            Err(e) => failures.extend(error(describe(&v.expression, &e))),
        }
    }
    failures
}

/// A failed validation's message: its `messageExpression`'s (a one-line string within
/// the limit), else its `message`, else the expression, as upstream's validator.
fn message(input: &Input, v: &Validation) -> String {
    if !v.message_expression.is_empty()
        && let Ok(cel::Value::String(s)) = input.eval(&v.message_expression)
    {
        let s = s.trim();
        if !s.is_empty() && s.len() <= MAX_MESSAGE && !s.contains('\n') {
            return s.to_owned();
        }
    }
    match v.message.trim() {
        "" => format!("failed expression: {}", v.expression.trim()),
        m => m.to_owned(),
    }
}

/// Applies a binding's actions to one failure.
fn decide(
    ctx: &Ctx,
    policy: &Policy,
    binding: &Binding,
    message: String,
    reason: Option<String>,
    denials: &mut Vec<Denial>,
) {
    for action in &binding.actions {
        match action.as_str() {
            "Deny" => denials.push(Denial {
                policy: policy.name.clone(),
                binding: Some(binding.name.clone()),
                message: message.clone(),
                reason: reason.clone(),
            }),
            "Warn" => ctx.warnings.add(format!(
                "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{}': {message}",
                policy.name, binding.name
            )),
            "Audit" => {
                tracing::info!(policy = %policy.name, binding = %binding.name, %message, "validation failed (Audit)")
            }
            _ => {}
        }
    }
}

/// The error of a denial: upstream's `admission.NewForbidden` with the validation's reason
/// (Invalid, 422, unless it names another) and the message as its one cause.
fn denied(ctx: &Ctx, obj: Option<&Value>, d: Denial) -> ApiError {
    let message = match &d.binding {
        Some(b) => format!(
            "ValidatingAdmissionPolicy '{}' with binding '{b}' denied request: {}",
            d.policy, d.message
        ),
        None => format!(
            "ValidatingAdmissionPolicy '{}' denied request: {}",
            d.policy, d.message
        ),
    };
    let name = obj.and_then(|o| meta_str(o, "name")).unwrap_or(ctx.name());
    let mut e = ApiError::forbidden_object(&ctx.res.group, &ctx.res.plural, name, &message);
    (e.reason, e.code) = match d.reason.as_deref() {
        Some("Forbidden") => ("Forbidden", 403),
        Some("Unauthorized") => ("Unauthorized", 401),
        Some("RequestEntityTooLarge") => ("RequestEntityTooLarge", 413),
        _ => ("Invalid", 422),
    };
    if let Some(details) = e.details.as_mut() {
        details["causes"] = json!([{"message": message}]);
    }
    e
}

/// The parameter objects a binding supplies (`[None]` for a policy without `paramKind`),
/// as upstream's `CollectParams`.
async fn params(
    ctx: &Ctx,
    policy: &Policy,
    binding: &Binding,
) -> Result<Vec<Option<Value>>, String> {
    let Some((api_version, kind)) = &policy.param_kind else {
        return Ok(vec![None]);
    };
    let Some(reference) = &binding.param_ref else {
        return Err(format!(
            "paramKind kind `{kind}` is set, but paramRef is not set on binding {}",
            binding.name
        ));
    };
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let info = ctx
        .api
        .registry
        .all()
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.kind == *kind)
        .ok_or_else(|| {
            format!("failed to find resource referenced by paramKind: '{api_version}, Kind={kind}'")
        })?;
    let namespace = match (info.namespaced, text(reference, "namespace").as_str()) {
        (false, _) => None,
        (true, "") => Some(ctx.namespace().map(str::to_owned).ok_or(
            "cannot use namespaced paramRef in policy binding that matches cluster-scoped resources",
        )?),
        (true, ns) => Some(ns.to_owned()),
    };
    let store_error = |e: minik8s_storage::Error| e.to_string();
    let name = text(reference, "name");
    let found: Vec<Value> = if !name.is_empty() {
        let key = info.key(namespace.as_deref(), &name);
        match ctx.api.store.get(&key).await.map_err(store_error)? {
            Some(kv) => vec![from_store(&kv).map_err(|e| e.message)?],
            None => vec![],
        }
    } else {
        let selector = reference
            .get("selector")
            .map(LabelSelector::from_json)
            .transpose()
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let prefix = info.scope_prefix(namespace.as_deref());
        let listed = ctx
            .api
            .store
            .range(RangeRequest::prefix(&prefix))
            .await
            .map_err(store_error)?;
        listed
            .kvs
            .iter()
            .filter_map(|kv| from_store(kv).ok())
            .filter(|o| selector.matches_json(o.pointer("/metadata/labels")))
            .collect()
    };
    if found.is_empty() {
        return match text(reference, "parameterNotFoundAction").as_str() {
            "Deny" => {
                Err("no params found for policy binding with `Deny` parameterNotFoundAction".into())
            }
            _ => Ok(vec![]),
        };
    }
    Ok(found.into_iter().map(Some).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, v: Value) -> KeyValue {
        KeyValue {
            key: format!("/registry/admissionregistration.k8s.io{key}"),
            value: serde_json::to_vec(&v).unwrap().into(),
            create_revision: 1,
            mod_revision: 1,
        }
    }

    #[test]
    fn only_bound_policies_are_in_force() {
        let policy = |name: &str| {
            json!({"metadata": {"name": name}, "spec": {
                "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["deployments"]}]},
                "validations": [{"expression": "object.spec.replicas > 1"}]}})
        };
        let p = Policies::default();
        p.load(&[
            kv("/validatingadmissionpolicies/a", policy("a")),
            kv("/validatingadmissionpolicies/b", policy("b")),
            kv(
                "/validatingadmissionpolicybindings/a-binding",
                json!({"metadata": {"name": "a-binding"},
                    "spec": {"policyName": "a", "validationActions": ["Deny", "Audit"]}}),
            ),
            kv(
                "/validatingwebhookconfigurations/w",
                json!({"metadata": {"name": "w"}, "webhooks": []}),
            ),
        ]);
        let snap = p.snapshot();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].name, "a");
        assert_eq!(snap[0].bindings[0].actions, ["Deny", "Audit"]);
        assert!(!snap[0].fail_open);
    }

    #[test]
    fn failure_messages_fall_back_as_upstreams() {
        let input = |replicas: i64| {
            let v = json!({"spec": {"replicas": replicas}});
            super::super::cel::tests_input(v)
        };
        let v = |expr: &str, msg: &str, msg_expr: &str| Validation {
            expression: expr.into(),
            message: msg.into(),
            message_expression: msg_expr.into(),
            reason: None,
        };
        let i = input(1);
        // A messageExpression that fails (string + int) falls back to the message …
        assert_eq!(
            message(
                &i,
                &v(
                    "object.spec.replicas > 1",
                    "too few",
                    "'got ' + object.spec.replicas"
                )
            ),
            "too few"
        );
        // … and without one, to the expression.
        assert_eq!(
            message(&i, &v(" object.spec.replicas > 1 ", "", "")),
            "failed expression: object.spec.replicas > 1"
        );
        assert_eq!(
            message(&i, &v("x", "", "'got ' + string(object.spec.replicas)")),
            "got 1"
        );
    }
}

//! Admission: what happens to a write between decoding and storing, in upstream's order.
//! Mutating: LimitRanger defaults, ServiceAccount, Priority, DefaultTolerationSeconds,
//! RuntimeClass, DefaultStorageClass, StorageObjectInUseProtection, then mutating webhooks.
//! Validating: LimitRanger limits, ValidatingAdmissionPolicies, validating webhooks, then
//! ResourceQuota (which the create path runs under its lock, see [`quota`]). Namespace lifecycle is checked before all of them.

pub(crate) mod cel;
pub mod limits;
pub(crate) mod matching;
pub mod policy;
pub mod priority;
pub mod protection;
pub mod quota;
mod review;
pub mod runtimeclass;
pub mod serviceaccount;
pub mod storageclass;
pub mod webhook;
pub mod webhook_client;

use crate::context::Ctx;
use crate::error::ApiResult;
use crate::registry::kinds::Admit;
use serde_json::Value;

/// The operation being admitted, as AdmissionReview names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A new object.
    Create,
    /// A changed object (including status writes and finalizer removal).
    Update,
    /// A deletion.
    Delete,
    /// A connection to a subresource (`pods/exec`, `pods/attach`, `pods/portforward`, the
    /// proxies); the object is its options (`PodExecOptions`, …).
    Connect,
}

impl Operation {
    /// The AdmissionReview spelling (`CREATE`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// Whether the request writes the object itself (not a subresource) and its kind's strategy
/// lists the built-in admission step `step`.
fn admits(ctx: &Ctx, step: Admit) -> bool {
    ctx.req.subresource.is_none() && ctx.res.strategy.admission().contains(&step)
}

/// One built-in admission step of the kind's strategy, where it applies to `op`.
async fn builtin(ctx: &Ctx, op: Operation, step: Admit, obj: &mut Value) -> ApiResult<()> {
    match (step, op) {
        (Admit::NewPod, Operation::Create) => {
            let ns = ctx.namespace().unwrap_or_default().to_owned();
            let ranges = limits::ranges(&ctx.api, &ns).await?;
            limits::default_pod(&ranges, obj);
            serviceaccount::admit(&ctx.api, &ns, obj).await?;
            priority::admit_pod(&ctx.api, obj).await?;
            default_tolerations(obj, ctx.api.default_toleration_seconds);
            runtimeclass::admit_pod(&ctx.api, obj).await?;
        }
        (Admit::PriorityClass, Operation::Create | Operation::Update) => {
            priority::admit_class(&ctx.api, obj).await?;
        }
        (Admit::DefaultStorageClass, Operation::Create) => {
            storageclass::admit(&ctx.api, obj).await?;
        }
        (Admit::Protection(finalizer), Operation::Create) => protection::admit(finalizer, obj),
        _ => {}
    }
    Ok(())
}

/// The mutating phase: the built-in steps the kind's strategy lists (in its order; a
/// subresource's writes take none), then mutating webhooks.
pub async fn mutate(
    ctx: &Ctx,
    op: Operation,
    obj: &mut Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    if ctx.req.subresource.is_none() {
        for &step in ctx.res.strategy.admission() {
            builtin(ctx, op, step, obj).await?;
        }
    }
    if webhook::mutate(ctx, op, obj, old).await? {
        // Patched objects are defaulted again (and custom resources pruned and checked
        // against their schema), as upstream's decode after a webhook does.
        ctx.res.strategy.default(obj);
        if let Some(schema) = &ctx.res.crd_schema {
            let out = crate::registry::structural::apply(schema, obj);
            if !out.causes.is_empty() {
                let name = crate::object::meta_str(obj, "name")
                    .unwrap_or_default()
                    .to_owned();
                return Err(crate::error::ApiError::invalid(
                    &ctx.res.group,
                    &ctx.res.kind,
                    &name,
                    out.causes,
                ));
            }
        }
    }
    Ok(())
}

/// Admission of a CONNECT (exec, attach, port-forward): webhooks whose rules name the
/// operation and subresource see the request's options and may deny it, as upstream's
/// connect handler runs them.
pub async fn connect(ctx: &Ctx, options: &Value) -> ApiResult<()> {
    let mut shown = options.clone();
    webhook::mutate(ctx, Operation::Connect, &mut shown, None).await?;
    webhook::validate(ctx, Operation::Connect, Some(options), None).await
}

/// DefaultTolerationSeconds: a pod that does not tolerate the not-ready and unreachable
/// NoExecute taints tolerates each for `seconds`, so the node lifecycle controller evicts it
/// that long after its node goes away.
fn default_tolerations(pod: &mut Value, seconds: i64) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let list = spec
        .entry("tolerations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if list.is_null() {
        *list = Value::Array(Vec::new());
    }
    let Some(list) = list.as_array_mut() else {
        return;
    };
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let covered = list.iter().any(|t| {
            let effect = t.get("effect").and_then(Value::as_str).unwrap_or("");
            let k = t.get("key").and_then(Value::as_str).unwrap_or("");
            let exists_all =
                k.is_empty() && t.get("operator").and_then(Value::as_str) == Some("Exists");
            (k == key || exists_all) && (effect.is_empty() || effect == "NoExecute")
        });
        if !covered {
            list.push(
                serde_json::json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": seconds}),
            );
        }
    }
}

/// The validating phase: built-in limits, then validating webhooks. `obj` is `None` for a
/// deletion.
pub async fn validate(
    ctx: &Ctx,
    op: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<()> {
    if op == Operation::Create
        && admits(ctx, Admit::NewPod)
        && let Some(pod) = obj
    {
        let ns = ctx.namespace().unwrap_or_default();
        let ranges = limits::ranges(&ctx.api, ns).await?;
        limits::check_pod(&ranges, pod)?;
    }
    policy::validate(ctx, op, obj, old).await?;
    webhook::validate(ctx, op, obj, old).await
}

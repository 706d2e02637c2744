//! The `AdmissionReview` an admission step sees: sent to webhooks, and its `request` bound as
//! CEL's `request` in `matchConditions` and policies.

use super::Operation;
use crate::context::Ctx;
use crate::object::meta_str;
use serde_json::{Value, json};

/// The AdmissionReview sent to a webhook (its `request` is also CEL's `request`).
pub(crate) fn review(ctx: &Ctx, op: Operation, obj: Option<&Value>, old: Option<&Value>) -> Value {
    let res = &ctx.res;
    // A CONNECT's kind is its options' (`PodAttachOptions`), as upstream's connect scope.
    let kind_name = match op {
        Operation::Connect => obj
            .and_then(|o| o.get("kind"))
            .and_then(Value::as_str)
            .unwrap_or(&res.kind),
        _ => &res.kind,
    };
    let kind = json!({"group": res.group, "version": res.version, "kind": kind_name});
    let resource = json!({"group": res.group, "version": res.version, "resource": res.plural});
    let options_kind = match op {
        Operation::Create => Some("CreateOptions"),
        Operation::Update => Some("UpdateOptions"),
        Operation::Delete => Some("DeleteOptions"),
        Operation::Connect => None,
    };
    let name = match op {
        Operation::Connect => ctx.name(),
        _ => obj
            .or(old)
            .and_then(|o| meta_str(o, "name"))
            .unwrap_or(ctx.name()),
    };
    let mut request = json!({
        "uid": uuid::Uuid::new_v4().to_string(),
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": name,
        "operation": op.as_str(),
        "userInfo": {"username": ctx.user.name, "groups": ctx.user.groups},
        "object": obj.cloned().unwrap_or(Value::Null),
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": ctx.params.dry_run,
        "options": options_kind.map_or(Value::Null, |k| json!({"kind": k, "apiVersion": "meta.k8s.io/v1"})),
    });
    if let Some(ns) = ctx.namespace() {
        request["namespace"] = json!(ns);
    }
    if let Some(sub) = &ctx.req.subresource {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

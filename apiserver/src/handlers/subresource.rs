//! Subresources: `status` (GET/PUT/PATCH of the parent, changing only status), `scale`
//! (an autoscaling/v1 Scale view of the replicas), pod `binding` and `eviction`, and
//! namespace `finalize`, and pod `log`, which the pod's kubelet answers (see [`crate::aggregation::kubelet`]).

use super::{Ctx, json_response, write};
use crate::error::{ApiError, ApiResult};
use crate::object::{self, meta_str};
use crate::serving::request::Verb;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use k8s_openapi::Resource;
use k8s_openapi::api::core::v1 as core;
use minik8s_storage::Store;
use serde_json::{Value, json};

/// Serves a subresource request.
pub async fn handle(ctx: Ctx, sub: &str, body: Bytes) -> ApiResult<Response> {
    match (sub, ctx.req.verb) {
        ("status", Verb::Get) => super::read::get(ctx).await,
        ("status", Verb::Update) => write::update(ctx, body).await,
        ("status", Verb::Patch) => write::patch(ctx, body).await,
        ("scale", Verb::Get | Verb::Update | Verb::Patch) => scale(ctx, body).await,
        ("binding", Verb::Create) => binding(ctx, body).await,
        ("eviction", Verb::Create) => eviction(ctx).await,
        ("finalize", Verb::Update) => write::update(ctx, body).await,
        // A pod's ephemeral containers (`kubectl debug`): the pod, written through the
        // ephemeral containers' strategy (write::update's prepare_update, the Pod kind's rules).
        ("ephemeralcontainers", Verb::Get | Verb::Update | Verb::Patch)
            if ctx.res.extra_subresources.iter().any(|s| s == sub) =>
        {
            match ctx.req.verb {
                Verb::Get => super::read::get(ctx).await,
                Verb::Update => write::update(ctx, body).await,
                _ => write::patch(ctx, body).await,
            }
        }
        ("approval", Verb::Get) => super::read::get(ctx).await,
        ("approval", Verb::Update | Verb::Patch) => {
            may_approve(&ctx).await?;
            if ctx.req.verb == Verb::Update {
                write::update(ctx, body).await
            } else {
                write::patch(ctx, body).await
            }
        }
        ("token", Verb::Create) => token(ctx, body).await,
        ("log", Verb::Get) if ctx.res.extra_subresources.iter().any(|s| s == "log") => {
            crate::aggregation::kubelet::log(ctx).await
        }
        ("proxy", _) => crate::aggregation::proxy::serve(ctx, body).await,
        ("exec" | "attach" | "portforward", Verb::Get | Verb::Create)
            if ctx.res.extra_subresources.iter().any(|s| s == sub) =>
        {
            crate::aggregation::kubelet::stream(ctx, sub).await
        }
        _ => Err(ApiError::method_not_supported(
            &ctx.res.group,
            &format!("{}/{sub}", ctx.res.plural),
            ctx.req.verb.as_str(),
        )),
    }
}

/// Deciding a CSR also needs `approve` on its signer (`signers`, named by the signerName or
/// its `<domain>/*`), as upstream's CertificateApproval admission plugin checks.
async fn may_approve(ctx: &Ctx) -> ApiResult<()> {
    let (csr, _) = ctx.current().await?;
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let wildcard = signer
        .split_once('/')
        .map(|(domain, _)| format!("{domain}/*"))
        .unwrap_or_default();
    let allowed = [signer.as_str(), wildcard.as_str()].iter().any(|name| {
        ctx.api.rbac.allows(
            &ctx.user,
            &crate::auth::rbac::Attributes {
                verb: "approve".into(),
                group: "certificates.k8s.io".into(),
                resource: "signers".into(),
                subresource: String::new(),
                namespace: String::new(),
                name: (*name).to_owned(),
                path: None,
            },
        )
    });
    if allowed {
        Ok(())
    } else {
        Err(ApiError::forbidden(format!(
            "certificatesigningrequests.certificates.k8s.io \"{}\" is forbidden: user not permitted to approve requests with signerName \"{signer}\"",
            ctx.name()
        )))
    }
}

fn success(details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201, "details": details})
}

/// The Scale view of an object.
fn scale_of(ctx: &Ctx, obj: &Value) -> Value {
    let info = ctx.res.scale.as_ref().expect("scale subresource");
    let selector = info
        .selector
        .as_deref()
        .map(|p| object::at(obj, p))
        .and_then(|s| minik8s_types::LabelSelector::from_json(s).ok())
        .map(|s| s.to_string())
        .unwrap_or_default();
    let m = object::meta(obj);
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m.get("name"), "namespace": m.get("namespace"), "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"), "creationTimestamp": m.get("creationTimestamp"),
        },
        "spec": {"replicas": object::at(obj, &info.spec_replicas).as_i64().unwrap_or(0)},
        "status": {"replicas": object::at(obj, &info.status_replicas).as_i64().unwrap_or(0), "selector": selector},
    })
}

async fn scale(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let info = ctx.res.scale.clone().expect("scale subresource");
    for _ in 0..16 {
        let (obj, revision) = ctx.current().await?;
        let current = scale_of(&ctx, &obj);
        if ctx.req.verb == Verb::Get {
            return Ok(json_response(StatusCode::OK, &current, &[]));
        }
        let ct = ctx.content_type().to_owned();
        let input = object::decode_body(&ct, &body)?;
        let wanted = if ctx.req.verb == Verb::Patch {
            let ty = crate::object::patch::PatchType::from_content_type(&ct)
                .ok_or_else(|| ApiError::unsupported_media_type(&ct))?;
            let mut s = current.clone();
            match ty {
                crate::object::patch::PatchType::Json => {
                    crate::object::patch::json_patch(&mut s, &input)?
                }
                crate::object::patch::PatchType::Merge => {
                    crate::object::patch::merge_patch(&mut s, &input)
                }
                _ => crate::object::patch::strategic_merge(
                    crate::registry::lists::Lists::Builtin(&crate::registry::kinds::Plain),
                    &mut s,
                    &input,
                )?,
            }
            s
        } else {
            input
        };
        let replicas = wanted
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                "autoscaling",
                "Scale",
                ctx.name(),
                vec![crate::error::Cause::invalid(
                    "spec.replicas",
                    &replicas.to_string(),
                    "must be greater than or equal to 0",
                )],
            ));
        }
        let expected = match meta_str(&wanted, "resourceVersion") {
            Some(rv) if !rv.is_empty() => {
                if rv != revision.to_string() {
                    return Err(ApiError::stale(&ctx.res.group, &ctx.res.plural, ctx.name()));
                }
                revision
            }
            _ => revision,
        };
        let mut new = obj.clone();
        object::set_at(&mut new, &info.spec_replicas, json!(replicas));
        if ctx.res.generation && new != obj {
            let g = object::meta(&obj)
                .get("generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            object::meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        write::record_manager(&ctx, Some(&obj), &mut new, Some("scale"));
        if ctx.params.dry_run {
            return Ok(json_response(StatusCode::OK, &scale_of(&ctx, &new), &[]));
        }
        match ctx
            .api
            .store
            .update(&ctx.key(), ctx.res.encode(&mut new)?, expected)
            .await
        {
            Ok(kv) => {
                object::meta_mut(&mut new)
                    .insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
                return Ok(json_response(StatusCode::OK, &scale_of(&ctx, &new), &[]));
            }
            Err(minik8s_storage::Error::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::stale(&ctx.res.group, &ctx.res.plural, ctx.name()))
}

/// POST pods/{name}/binding: assigns the pod to a node, once.
async fn binding(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let b: Value =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let node = b
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "",
                "Binding",
                ctx.name(),
                vec![crate::error::Cause::required("target.name", "")],
            )
        })?
        .to_owned();
    for _ in 0..16 {
        let (mut pod, revision) = ctx.current().await?;
        if let Some(existing) = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::conflict(
                "",
                "pods/binding",
                ctx.name(),
                &format!(
                    "pod {} is already assigned to node \"{existing}\"",
                    ctx.name()
                ),
            ));
        }
        if object::meta(&pod).get("deletionTimestamp").is_some() {
            return Err(ApiError::conflict(
                "",
                "pods/binding",
                ctx.name(),
                "pod is being deleted",
            ));
        }
        pod["spec"]["nodeName"] = json!(node);
        let now = object::now();
        let conditions = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut conditions: Vec<Value> = conditions
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}));
        pod["status"]["conditions"] = json!(conditions);
        match ctx
            .api
            .store
            .update(&ctx.key(), ctx.res.encode(&mut pod)?, revision)
            .await
        {
            Ok(_) => {
                return Ok(json_response(
                    StatusCode::CREATED,
                    &success(json!({"name": ctx.name(), "kind": "pods"})),
                    &[],
                ));
            }
            Err(minik8s_storage::Error::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::stale("", "pods", ctx.name()))
}

/// POST pods/{name}/eviction: deletes the pod unless that would break its
/// PodDisruptionBudget, as upstream's eviction REST: a pod guarded by one budget is evicted
/// only while the budget allows a disruption (the allowance is taken in the same
/// compare-and-swap that records the pod in `disruptedPods`); otherwise 429 with the budget's
/// numbers. Pods already finished or being deleted, and pods no budget guards, just go.
async fn eviction(ctx: Ctx) -> ApiResult<Response> {
    let pods = ctx.res.clone();
    let budgets = ctx
        .api
        .registry
        .lookup("policy", "v1", "poddisruptionbudgets")?;
    let ns = ctx.namespace().unwrap_or_default().to_owned();
    for _ in 0..16 {
        let kv = ctx
            .api
            .store
            .get(&ctx.key())
            .await?
            .ok_or_else(|| ApiError::not_found("", "pods", ctx.name()))?;
        let pod = pods.read(&kv)?;
        let phase = pod.pointer("/status/phase").and_then(Value::as_str);
        let done = matches!(phase, Some("Succeeded" | "Failed"))
            || object::meta(&pod).get("deletionTimestamp").is_some();
        let listed = ctx
            .api
            .store
            .range(minik8s_storage::RangeRequest::prefix(format!(
                "{}{ns}/",
                budgets.key_prefix()
            )))
            .await?;
        let labels = object::meta(&pod).get("labels").cloned();
        let mut guarding = Vec::new();
        for kv in &listed.kvs {
            let pdb = budgets.read(kv)?;
            let selects = pdb
                .pointer("/spec/selector")
                .and_then(|s| minik8s_types::LabelSelector::from_json(s).ok())
                .is_some_and(|s| s.matches_json(labels.as_ref()));
            if selects {
                guarding.push((pdb, kv.mod_revision));
            }
        }
        if done || guarding.is_empty() {
            return evict(ctx).await;
        }
        if guarding.len() > 1 {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
        let (mut pdb, revision) = guarding.pop().expect("one budget");
        let name = meta_str(&pdb, "name").unwrap_or_default().to_owned();
        let int = |p: &str| pdb.pointer(p).and_then(Value::as_i64).unwrap_or(0);
        let refuse = |why: String| {
            let mut e = ApiError::too_many_requests(0);
            e.message = "Cannot evict pod as it would violate the pod's disruption budget.".into();
            e.retry_after = None;
            e.details = Some(json!({"causes": [{"reason": "DisruptionBudget", "message": why}]}));
            e
        };
        if int("/status/observedGeneration") < int("/metadata/generation") {
            return Err(refuse(format!(
                "The disruption budget {name} is still being processed by the server."
            )));
        }
        let (healthy, desired) = (int("/status/currentHealthy"), int("/status/desiredHealthy"));
        let ready = pod
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        if !ready {
            // An unhealthy pod costs the budget nothing: it may go while the budget holds
            // (`IfHealthyBudget`, the default) or always (`AlwaysAllow`).
            let always =
                pdb.pointer("/spec/unhealthyPodEvictionPolicy") == Some(&json!("AlwaysAllow"));
            if always || healthy >= desired {
                return evict(ctx).await;
            }
            return Err(refuse(format!(
                "The disruption budget {name} needs {desired} healthy pods and has {healthy} currently"
            )));
        }
        let allowed = int("/status/disruptionsAllowed");
        if allowed <= 0 {
            return Err(refuse(format!(
                "The disruption budget {name} needs {desired} healthy pods and has {healthy} currently"
            )));
        }
        pdb["status"]["disruptionsAllowed"] = json!(allowed - 1);
        if !pdb["status"]["disruptedPods"].is_object() {
            pdb["status"]["disruptedPods"] = json!({});
        }
        pdb["status"]["disruptedPods"][ctx.name()] = json!(object::now());
        let key = budgets.key(Some(&ns), &name);
        match ctx
            .api
            .store
            .update(&key, budgets.encode(&mut pdb)?, revision)
            .await
        {
            Ok(_) => return evict(ctx).await,
            Err(minik8s_storage::Error::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::stale(
        "policy",
        "poddisruptionbudgets",
        ctx.name(),
    ))
}

/// Deletes the pod an eviction is for, first marking a pod that has not finished with the
/// `DisruptionTarget` condition (upstream's `EvictionByEvictionAPI`), so its controller (a
/// Job's pod failure policy) can tell an eviction from a failure.
async fn evict(ctx: Ctx) -> ApiResult<Response> {
    let marks = if ctx.params.dry_run { 0 } else { 16 };
    for _ in 0..marks {
        let Some(kv) = ctx.api.store.get(&ctx.key()).await? else {
            break;
        };
        let mut pod = ctx.res.read(&kv)?;
        let phase = pod.pointer("/status/phase").and_then(Value::as_str);
        if matches!(phase, Some("Succeeded" | "Failed"))
            || object::meta(&pod).get("deletionTimestamp").is_some()
        {
            break;
        }
        let condition = json!({"type": "DisruptionTarget", "status": "True",
            "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting",
            "lastTransitionTime": object::now()});
        let status = crate::registry::defaults::child(&mut pod, "status");
        let conditions = crate::registry::defaults::child(status, "conditions");
        if !conditions.is_array() {
            *conditions = json!([]);
        }
        if let Some(list) = conditions.as_array_mut() {
            list.retain(|c| c["type"] != "DisruptionTarget");
            list.push(condition);
        }
        match ctx
            .api
            .store
            .update(&ctx.key(), ctx.res.encode(&mut pod)?, kv.mod_revision)
            .await
        {
            Ok(_) => break,
            Err(minik8s_storage::Error::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let mut req = ctx.req.clone();
    req.subresource = None;
    req.verb = Verb::Delete;
    let del = Ctx { req, ..ctx };
    write::delete(del, Bytes::new()).await?;
    Ok(json_response(StatusCode::CREATED, &success(json!({})), &[]))
}

/// POST serviceaccounts/{name}/token: issues a signed token for the ServiceAccount, optionally
/// bound to a pod (TokenRequest).
async fn token(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let issuer = ctx
        .api
        .tokens
        .as_ref()
        .ok_or_else(|| ApiError::unavailable("no service-account signing key is configured"))?;
    let ns = ctx.namespace().unwrap_or_default().to_owned();
    let sa_kv = ctx
        .api
        .store
        .get(&ctx.key())
        .await?
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", ctx.name()))?;
    let sa = object::from_store(&sa_kv)?;
    let ct = ctx.content_type().to_owned();
    let mut req: Value = if body.is_empty() {
        json!({})
    } else {
        object::decode_body(&ct, &body)?
    };
    if !req.is_object()
        || req
            .get("spec")
            .is_some_and(|s| !s.is_object() && !s.is_null())
    {
        return Err(ApiError::bad_request(
            "the body of a TokenRequest must be an object with an object spec",
        ));
    }
    let seconds = req
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    if seconds < issuer.min_seconds {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            ctx.name(),
            vec![crate::error::Cause::invalid(
                "spec.expirationSeconds",
                &seconds.to_string(),
                &format!(
                    "may not specify a duration less than {} seconds",
                    issuer.min_seconds
                ),
            )],
        ));
    }
    let audiences = match req.pointer("/spec/audiences").and_then(Value::as_array) {
        Some(a) if !a.is_empty() => Value::Array(a.clone()),
        _ => json!([crate::auth::tokens::ISSUER]),
    };
    let now = jiff::Timestamp::now().as_second();
    let mut k8s = json!({"namespace": ns, "serviceaccount": {"name": ctx.name(), "uid": object::meta_str(&sa, "uid")}});
    if let Some(bound) = req
        .pointer("/spec/boundObjectRef")
        .filter(|b| b.is_object())
    {
        bind_token(&ctx, &ns, bound, &mut k8s).await?;
    }
    let claims = json!({"iss": crate::auth::tokens::ISSUER, "aud": audiences, "sub": format!("system:serviceaccount:{ns}:{}", ctx.name()),
        "iat": now, "nbf": now, "exp": now + seconds, "jti": uuid::Uuid::new_v4().to_string(), "kubernetes.io": k8s});
    let expires = jiff::Timestamp::from_second(now + seconds)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["kind"] = json!("TokenRequest");
    req["metadata"] =
        json!({"name": ctx.name(), "namespace": ns, "creationTimestamp": object::now()});
    if !req["spec"].is_object() {
        req["spec"] = json!({});
    }
    req["spec"]["audiences"] = audiences;
    req["spec"]["expirationSeconds"] = json!(seconds);
    req["status"] = json!({"token": issuer.sign(&claims), "expirationTimestamp": expires});
    Ok(json_response(StatusCode::CREATED, &req, &[]))
}

/// The object a token is bound to, as upstream's TokenRequest: a Pod (with the Node it runs
/// on, by name even when that Node is gone), a Node or a Secret, whose uid must match the
/// reference's when it names one. Their names and uids go into the `kubernetes.io` claims.
async fn bind_token(ctx: &Ctx, ns: &str, bound: &Value, k8s: &mut Value) -> ApiResult<()> {
    let field = |k: &str| bound.get(k).and_then(Value::as_str).unwrap_or("");
    let (kind, name) = (field("kind"), field("name").to_owned());
    let group = field("apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
    let read = |key: String, plural: &'static str, name: String| async move {
        let kv = ctx.api.store.get(&key).await?;
        let kv = kv.ok_or_else(|| ApiError::not_found("", plural, &name))?;
        object::from_store(&kv)
    };
    let (claim, object) = match (group, kind) {
        ("", core::Pod::KIND) => {
            let pod = read(
                format!("/registry/core/pods/{ns}/{name}"),
                "pods",
                name.clone(),
            )
            .await?;
            let account = pod
                .pointer("/spec/serviceAccountName")
                .and_then(Value::as_str);
            if account.unwrap_or("default") != ctx.name() {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {:?} to pod running with different serviceaccount name.",
                    ctx.name()
                )));
            }
            if let Some(node) = pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                let uid = match ctx
                    .api
                    .store
                    .get(&format!("/registry/core/nodes/{node}"))
                    .await?
                {
                    Some(kv) => {
                        object::meta_str(&object::from_store(&kv)?, "uid").map(str::to_owned)
                    }
                    None => None,
                };
                k8s["node"] = match uid {
                    Some(uid) => json!({"name": node, "uid": uid}),
                    None => json!({"name": node}),
                };
            }
            ("pod", pod)
        }
        ("", core::Node::KIND) => (
            "node",
            read(
                format!("/registry/core/nodes/{name}"),
                "nodes",
                name.clone(),
            )
            .await?,
        ),
        ("", core::Secret::KIND) => (
            "secret",
            read(
                format!("/registry/core/secrets/{ns}/{name}"),
                "secrets",
                name.clone(),
            )
            .await?,
        ),
        _ => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {}",
                match group {
                    "" => format!("/{}, Kind={kind}", field("apiVersion")),
                    _ => format!("{}, Kind={kind}", field("apiVersion")),
                }
            )));
        }
    };
    let uid = object::meta_str(&object, "uid").unwrap_or("");
    let wanted = field("uid");
    if !wanted.is_empty() && wanted != uid {
        return Err(ApiError::conflict(
            group,
            kind,
            &name,
            &format!(
                "the UID in the bound object reference ({wanted}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    k8s[claim] = json!({"name": name, "uid": uid});
    Ok(())
}

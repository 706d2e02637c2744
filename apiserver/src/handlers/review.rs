//! Review resources, answered at once and never stored: SelfSubjectAccessReview,
//! SubjectAccessReview, LocalSubjectAccessReview (`kubectl auth can-i`), SelfSubjectReview
//! (`kubectl auth whoami`) and TokenReview.

use super::{Ctx, json_response};
use crate::auth::User;
use crate::auth::rbac::Attributes;
use crate::error::{ApiError, ApiResult};
use crate::registry::Review;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

fn s(v: &Value, p: &str) -> String {
    v.pointer(p)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

fn attributes(spec: &Value, namespace: Option<&str>) -> ApiResult<Attributes> {
    if let Some(r) = spec.get("resourceAttributes") {
        return Ok(Attributes {
            verb: s(r, "/verb"),
            group: s(r, "/group"),
            resource: s(r, "/resource"),
            subresource: s(r, "/subresource"),
            namespace: namespace
                .map(str::to_owned)
                .unwrap_or_else(|| s(r, "/namespace")),
            name: s(r, "/name"),
            path: None,
        });
    }
    if let Some(n) = spec.get("nonResourceAttributes") {
        return Ok(Attributes::non_resource(&s(n, "/verb"), &s(n, "/path")));
    }
    Err(ApiError::invalid(
        "authorization.k8s.io",
        "SubjectAccessReview",
        "",
        vec![crate::error::Cause::required(
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )],
    ))
}

/// Answers a review.
pub async fn handle(ctx: Ctx, answers: Review, body: Bytes) -> ApiResult<Response> {
    let mut obj = crate::object::decode_body(ctx.content_type(), &body)?;
    super::write::default_kind(&ctx.res, &mut obj);
    let (obj, _) = super::write::typed(&ctx, std::mem::take(&mut obj))?;
    let mut obj = obj;
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let status = match answers {
        Review::SelfSubject => {
            json!({"userInfo": {"username": ctx.user.name, "groups": ctx.user.groups}})
        }
        Review::Token => {
            // As upstream's TokenReview REST: the token through this server's authenticators;
            // a token none accepts is answered (201) with authenticated false, not an error.
            let token = s(&spec, "/token");
            if token.is_empty() {
                return Err(ApiError::bad_request(
                    "token is required for TokenReview in spec",
                ));
            }
            let user = match ctx.api.authn.static_token(&token) {
                Some(u) => Ok(u.clone()),
                None => crate::auth::tokens::user_of(&ctx.api, &token).await,
            };
            let audiences = spec
                .get("audiences")
                .filter(|a| a.as_array().is_some_and(|a| !a.is_empty()))
                .cloned()
                .unwrap_or_else(|| json!([crate::auth::tokens::ISSUER]));
            match user {
                Ok(u) => {
                    let mut user = json!({"username": u.name, "groups": u.groups});
                    // A ServiceAccount token's id and binding, as upstream's authenticator.
                    if let Some(extra) = crate::auth::tokens::extra_of(&ctx.api, &token)
                        .filter(|e| e.as_object().is_some_and(|m| !m.is_empty()))
                    {
                        user["extra"] = extra;
                    }
                    json!({"authenticated": true, "user": user, "audiences": audiences})
                }
                Err(_) => json!({
                    "user": {},
                    "error": "[invalid bearer token, token lookup failed]",
                }),
            }
        }
        Review::SelfAccess | Review::Access => {
            let user = if answers == Review::SelfAccess {
                ctx.user.clone()
            } else {
                let groups = spec
                    .get("groups")
                    .and_then(Value::as_array)
                    .map(|g| {
                        g.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default();
                User::new(s(&spec, "/user"), groups)
            };
            let attrs = attributes(&spec, ctx.namespace())?;
            let allowed = ctx.api.rbac.allows(&user, &attrs);
            let mut st = json!({"allowed": allowed});
            if allowed {
                st["reason"] = json!("allowed by RBAC");
            }
            st
        }
    };
    obj["status"] = status;
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("creationTimestamp".into(), Value::Null);
    }
    Ok(json_response(StatusCode::CREATED, &obj, &[]))
}

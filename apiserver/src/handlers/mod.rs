//! The one request pipeline: authenticate → parse into a `RequestInfo` → look the resource up
//! in the registry → authorize → the generic handler of the verb. No handler names a kind.

mod read;
mod review;
mod subresource;
pub(crate) mod write;

pub(crate) use crate::context::{Ctx, Params, json_response, raw_json, read_body};

use crate::Api;
use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::serving::request::{self, RequestInfo, Verb};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::sync::Arc;

/// The axum fallback that serves every request.
pub async fn dispatch(State(api): State<Arc<Api>>, req: Request) -> Response {
    let started = std::time::Instant::now();
    let uri = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let mut record = crate::serving::audit::Record::default();
    // Long-running requests (watches, follows) are not counted or timed out; others are
    // limited in number (429 beyond) and in time (504).
    let long_running = request::wants_watch(req.uri().query())
        || req.uri().path().contains("/watch/")
        || ["/exec", "/attach", "/portforward"]
            .iter()
            .any(|s| req.uri().path().ends_with(s))
        || req.uri().query().is_some_and(|q| q.contains("follow=true"));
    let metrics = crate::serving::prometheus::get();
    let info = request::parse(req.method(), req.uri().path(), req.uri().query());
    let described = metrics.describe(
        &api,
        &info,
        req.headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
        long_running,
    );
    let permit = if long_running {
        None
    } else {
        match api.inflight.try_acquire(&info) {
            Some(p) => Some(p),
            None => {
                let resp = ApiError::too_many_requests(1).into_response();
                api.audit.record(record, &uri, 429, started);
                metrics.begin(&described, false).finish(429);
                return resp;
            }
        }
    };
    let guard = metrics.begin(&described, long_running);
    let resp = if long_running {
        match handle(api.clone(), req, info, &mut record).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        }
    } else {
        match tokio::time::timeout(
            api.request_timeout,
            handle(api.clone(), req, info, &mut record),
        )
        .await
        {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => e.into_response(),
            Err(_) => ApiError::timeout(api.request_timeout).into_response(),
        }
    };
    drop(permit);
    let code = resp.status().as_u16();
    // A body sent as it is written (a LIST's items) counts once it is sent, as upstream's
    // handler returns only after writing its answer.
    let streamed = http_body::Body::size_hint(resp.body()).exact().is_none();
    if long_running || streamed {
        // A watch or stream counts once it ends; its gauges stay up while it is served.
        let (parts, body) = resp.into_parts();
        let body = axum::body::Body::new(GuardedBody {
            inner: body,
            guard: Some((guard, code)),
        });
        api.audit.record(record, &uri, code, started);
        return Response::from_parts(parts, body);
    }
    guard.finish(code);
    tracing::debug!(%uri, status = code, elapsed_us = started.elapsed().as_micros() as u64, "request");
    api.audit.record(record, &uri, code, started);
    resp
}

/// A long-running response's body that keeps its request counted as in progress until the
/// body ends (or is dropped), then records it.
struct GuardedBody {
    inner: axum::body::Body,
    guard: Option<(crate::serving::prometheus::Guard, u16)>,
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(None) = polled
            && let Some((g, code)) = self.guard.take()
        {
            g.finish(code);
        }
        polled
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        if let Some((g, code)) = self.guard.take() {
            g.finish(code);
        }
    }
}

async fn handle(
    api: Arc<Api>,
    req: Request,
    info: RequestInfo,
    record: &mut crate::serving::audit::Record,
) -> ApiResult<Response> {
    let (mut parts, body) = req.into_parts();
    record.verb = parts.method.as_str().to_ascii_lowercase();
    let user = match api.authn.authenticate(&parts)? {
        crate::auth::Credential::User(u) => u,
        crate::auth::Credential::Token(t) => crate::auth::tokens::user_of(&api, &t).await?,
        crate::auth::Credential::Anonymous => crate::auth::anonymous(),
    };
    let anonymous = user.name == "system:anonymous";
    let user = impersonate(&api, user, &parts.headers)?;
    record.user = Some((user.name.clone(), user.groups.clone()));
    // A group/version an APIService sends to a Service: authorized here, served there.
    if crate::aggregation::routes(&api, parts.uri.path()) {
        let attrs = match &info {
            RequestInfo::Resource(req) => crate::auth::rbac::Attributes::of(req),
            RequestInfo::NonResource { verb, path } => {
                crate::auth::rbac::Attributes::non_resource(verb, path)
            }
        };
        authorize_maybe_anonymous(&api, &user, anonymous, &attrs)?;
        return crate::aggregation::proxy(&api, &user, parts, body).await;
    }
    match info {
        // The issuer's discovery documents, as RBAC allows (anonymous users too, when a
        // binding lets them, as upstream).
        RequestInfo::NonResource { path, .. } if crate::auth::tokens::is_discovery_path(&path) => {
            let attrs = crate::auth::rbac::Attributes::non_resource("get", &path);
            authorize_maybe_anonymous(&api, &user, anonymous, &attrs)?;
            let (body, content_type) = if path.starts_with("/openid/") {
                let issuer = api
                    .tokens
                    .as_ref()
                    .ok_or_else(|| ApiError::not_found("", "", "jwks"))?;
                (issuer.jwks(), "application/jwk-set+json")
            } else {
                (
                    crate::auth::tokens::openid_configuration(),
                    "application/json",
                )
            };
            Ok((
                [(axum::http::header::CONTENT_TYPE, content_type)],
                body.to_string(),
            )
                .into_response())
        }
        RequestInfo::NonResource { .. } if anonymous => Err(ApiError::unauthorized()),
        RequestInfo::NonResource { path, .. } => {
            let segments: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
            match segments.as_slice() {
                ["metrics"] => {
                    let attrs = crate::auth::rbac::Attributes::non_resource("get", "/metrics");
                    api.rbac.authorize(&user, &attrs)?;
                    let m = crate::serving::prometheus::get();
                    m.count_objects(&api).await?;
                    Ok((
                        [(
                            axum::http::header::CONTENT_TYPE,
                            minik8s_metrics::CONTENT_TYPE,
                        )],
                        minik8s_metrics::encode(crate::serving::prometheus::SERVED, &[]),
                    )
                        .into_response())
                }
                [endpoint @ ("healthz" | "livez" | "readyz"), rest @ ..] if rest.len() <= 1 => {
                    crate::serving::health::serve(
                        &api,
                        endpoint,
                        rest.first().copied(),
                        parts.uri.query(),
                    )
                    .await
                }
                _ => crate::discovery::serve(&api, &path, &parts.headers),
            }
        }
        RequestInfo::Resource(req) => {
            record.verb = req.verb.as_str().to_owned();
            record.object = Some(serde_json::json!({
                "resource": req.resource, "namespace": req.namespace, "name": req.name,
                "apiGroup": req.group, "apiVersion": req.version, "subresource": req.subresource,
            }));
            let res = api
                .registry
                .lookup(&req.group, &req.version, &req.resource)?;
            // Scope must match the path: no namespace for cluster-scoped objects, and a
            // namespace for named namespaced objects.
            if (!res.namespaced && req.namespace.is_some())
                || (res.namespaced && req.namespace.is_none() && req.name.is_some())
            {
                return Err(ApiError::no_route(parts.uri.path()));
            }
            // A namespaced kind is created (and deleted by collection) only under
            // `/namespaces/{ns}/`: upstream registers no such route across namespaces.
            if res.namespaced
                && req.namespace.is_none()
                && matches!(req.verb, Verb::Create | Verb::DeleteCollection)
            {
                return Err(ApiError::method_not_allowed());
            }
            if let Some(sub) = &req.subresource
                && !res.subresources().contains(sub)
            {
                return Err(ApiError::no_route(parts.uri.path()));
            }
            let attrs = crate::auth::rbac::Attributes::of(&req);
            if anonymous && !api.rbac.allows(&user, &attrs) {
                return Err(ApiError::unauthorized());
            }
            api.rbac.authorize(&user, &attrs)?;
            let params = Params::parse(parts.uri.query())?;
            let ctx = Ctx {
                api,
                res,
                req,
                params,
                headers: parts.headers,
                user,
                upgrade: parts.extensions.remove::<hyper::upgrade::OnUpgrade>(),
                warnings: Default::default(),
            };
            // Read the body once here (bounded), so the audit log can record it.
            let body = match ctx.req.verb {
                Verb::Get | Verb::List | Verb::Watch => Bytes::new(),
                _ => read_body(body).await?,
            };
            if ctx.api.audit.wants_body() && !body.is_empty() {
                record.body = crate::object::decode_body(ctx.content_type(), &body).ok();
            }
            route(ctx, body).await
        }
    }
}

/// Applies `Impersonate-User` / `Impersonate-Group` headers if the user may impersonate.
fn impersonate(api: &Api, user: User, headers: &HeaderMap) -> ApiResult<User> {
    let Some(target) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        if headers.contains_key("impersonate-group") {
            return Err(ApiError::bad_request(
                "requested impersonation of groups without a user",
            ));
        }
        return Ok(user);
    };
    let check = |resource: &str, name: &str| {
        let attrs = crate::auth::rbac::Attributes {
            verb: "impersonate".into(),
            group: String::new(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: String::new(),
            name: name.into(),
            path: None,
        };
        api.rbac.authorize(&user, &attrs)
    };
    check("users", target)?;
    let mut groups = Vec::new();
    for g in headers.get_all("impersonate-group") {
        let g = g
            .to_str()
            .map_err(|_| ApiError::bad_request("invalid Impersonate-Group header"))?;
        check("groups", g)?;
        groups.push(g.to_owned());
    }
    Ok(User::new(target, groups))
}

async fn route(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    if ctx.res.serving == crate::registry::Serving::Metrics {
        return match ctx.req.verb {
            Verb::Get => crate::apis::metrics::get(ctx).await,
            Verb::List => crate::apis::metrics::list(ctx).await,
            verb => Err(ApiError::method_not_supported(
                &ctx.res.group,
                &ctx.res.plural,
                verb.as_str(),
            )),
        };
    }
    if let crate::registry::Serving::Review(answers) = ctx.res.serving {
        if ctx.req.verb != Verb::Create {
            return Err(ApiError::method_not_supported(
                &ctx.res.group,
                &ctx.res.plural,
                ctx.req.verb.as_str(),
            ));
        }
        // A review has no object metadata: Table output is refused, as upstream's 406.
        if ctx.wants_table() {
            return Err(ApiError::not_acceptable(
                "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
            ));
        }
        return review::handle(ctx, answers, body).await;
    }
    let sub = ctx.req.subresource.clone();
    match (ctx.req.verb, sub.as_deref()) {
        (Verb::Get, None) => read::get(ctx).await,
        (Verb::List, None) => read::list(ctx).await,
        (Verb::Watch, None) => read::watch(ctx).await,
        (Verb::Create, None) => write::create(ctx, body).await,
        (Verb::Update, None) => write::update(ctx, body).await,
        (Verb::Patch, None) => write::patch(ctx, body).await,
        (Verb::Delete, None) => write::delete(ctx, body).await,
        (Verb::DeleteCollection, None) => write::delete_collection(ctx, body).await,
        // OPTIONS is parsed for proxies only.
        (Verb::Options, None) => Err(ApiError::method_not_supported(
            &ctx.res.group,
            &ctx.res.plural,
            "options",
        )),
        (_, Some(sub)) => {
            let sub = sub.to_owned();
            subresource::handle(ctx, &sub, body).await
        }
    }
}

/// Authorizes a request that anonymous users may make when RBAC lets them: an anonymous
/// request RBAC refuses is 401 (not 403), as upstream.
fn authorize_maybe_anonymous(
    api: &crate::Api,
    user: &crate::auth::User,
    anonymous: bool,
    attrs: &crate::auth::rbac::Attributes,
) -> ApiResult<()> {
    if anonymous && !api.rbac.allows(user, attrs) {
        return Err(ApiError::unauthorized());
    }
    api.rbac.authorize(user, attrs)
}

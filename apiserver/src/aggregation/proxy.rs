//! The `proxy` subresource of nodes, pods and services (upstream's `ProxyREST`): the request
//! goes on to the node's kubelet (HTTPS with the apiserver's kubelet-client certificate), to
//! the pod's IP, or to one of the Service's ready endpoints, and the answer streams back.
//! The name may carry a scheme and a port, as upstream's: `[https:]name[:port]`.

use crate::context::Ctx;
use crate::error::{ApiError, ApiResult};
use crate::object;
use axum::body::Body;
use axum::http::{HeaderValue, Request, header};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use minik8s_storage::Store;
use serde_json::Value;
use std::sync::Arc;

/// `[scheme:]name[:port]` split as upstream's `net.SplitSchemeNamePort`.
fn split(id: &str) -> ApiResult<(Option<&str>, &str, Option<&str>)> {
    let parts: Vec<&str> = id.split(':').collect();
    let bad = || ApiError::bad_request(format!("invalid request {id:?}"));
    let (scheme, name, port) = match parts.as_slice() {
        [name] => (None, *name, None),
        [name, port] => (None, *name, Some(*port)),
        [scheme, name, port] => (Some(*scheme), *name, Some(*port)),
        _ => return Err(bad()),
    };
    if name.is_empty() || scheme.is_some_and(|s| !matches!(s, "" | "http" | "https")) {
        return Err(bad());
    }
    Ok((
        scheme.filter(|s| !s.is_empty()),
        name,
        port.filter(|p| !p.is_empty()),
    ))
}

/// Where a proxied request goes.
struct Target {
    https: bool,
    host: String,
    port: u16,
    /// The kubelet: present the apiserver's kubelet-client certificate.
    kubelet: bool,
}

/// Serves `…/{nodes|pods|services}/{name}/proxy/{path}`.
pub async fn serve(ctx: Ctx, body: Bytes) -> ApiResult<Response> {
    let id = ctx.name().to_owned();
    let (scheme, name, port) = split(&id)?;
    let ns = ctx.namespace().map(str::to_owned);
    let read = |resource: &str| {
        let key = ctx.res.key(ns.as_deref(), name);
        let what = resource.to_owned();
        let name = name.to_owned();
        let api = ctx.api.clone();
        async move {
            let kv = api
                .store
                .get(&key)
                .await?
                .ok_or_else(|| ApiError::not_found("", &what, &name))?;
            object::from_store(&kv)
        }
    };
    let target = match (ctx.res.group.as_str(), ctx.res.plural.as_str()) {
        ("", "nodes") => {
            let node = read("nodes").await?;
            let (host, kubelet_port) = crate::aggregation::kubelet::endpoint(&node)?;
            let port = match port {
                Some(p) => p
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid port {p:?}")))?,
                None => kubelet_port,
            };
            // The kubelet's own port speaks HTTPS; another port is plain unless asked.
            let https = scheme.map_or(port == kubelet_port, |s| s == "https");
            Target {
                https,
                host,
                port,
                kubelet: port == kubelet_port,
            }
        }
        ("", "pods") => {
            let pod = read("pods").await?;
            let ip = pod
                .pointer("/status/podIP")
                .and_then(Value::as_str)
                .filter(|ip| !ip.is_empty())
                .ok_or_else(|| {
                    ApiError::unavailable(format!("address not allowed: pod {name} has no IP"))
                })?
                .to_owned();
            let port = match port {
                Some(p) => pod_port(&pod, p)?,
                // Upstream: the first port of the first container that has one, else 80.
                None => pod
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .find_map(|c| c.pointer("/ports/0/containerPort").and_then(Value::as_u64))
                    .map_or(80, |p| p as u16),
            };
            Target {
                https: scheme == Some("https"),
                host: ip,
                port,
                kubelet: false,
            }
        }
        ("", "services") => {
            let svc = read("services").await?;
            let (host, port) = service_endpoint(&ctx, &svc, name, port).await?;
            Target {
                https: scheme == Some("https"),
                host,
                port,
                kubelet: false,
            }
        }
        _ => {
            return Err(ApiError::method_not_supported(
                &ctx.res.group,
                &format!("{}/proxy", ctx.res.plural),
                ctx.req.verb.as_str(),
            ));
        }
    };
    // Upstream: a GET or HEAD of the proxy itself (no path, no trailing slash) is sent to
    // the same path with a slash (issue 4958), keeping the query.
    if ctx.req.proxy_path.as_deref() == Some("")
        && ctx.req.verb == crate::serving::request::Verb::Get
    {
        return Ok(redirect_to_slash(&ctx));
    }
    forward(&ctx, target, body).await
}

/// 301 to the request's own path with a trailing slash.
fn redirect_to_slash(ctx: &Ctx) -> Response {
    let r = &ctx.req;
    let mut path = match r.group.as_str() {
        "" => format!("/api/{}", r.version),
        g => format!("/apis/{g}/{}", r.version),
    };
    if let Some(ns) = ctx.namespace() {
        path.push_str(&format!("/namespaces/{ns}"));
    }
    path.push_str(&format!("/{}/{}/proxy/", r.resource, ctx.name()));
    if !ctx.params.raw.is_empty() {
        path.push('?');
        path.push_str(&ctx.params.raw);
    }
    Response::builder()
        .status(axum::http::StatusCode::MOVED_PERMANENTLY)
        .header(header::LOCATION, path)
        .body(axum::body::Body::empty())
        .unwrap_or_default()
}

/// A pod port given by number or by a container port's name.
fn pod_port(pod: &Value, port: &str) -> ApiResult<u16> {
    if let Ok(p) = port.parse::<u16>() {
        return Ok(p);
    }
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .find(|p| p.get("name").and_then(Value::as_str) == Some(port))
        .and_then(|p| p.get("containerPort").and_then(Value::as_u64))
        .map(|p| p as u16)
        .ok_or_else(|| ApiError::bad_request(format!("invalid port {port:?}")))
}

/// A ready endpoint of the Service for the port named (by name or number; the only port if
/// none), as upstream's service `ResourceLocation` picks one: (address, target port).
async fn service_endpoint(
    ctx: &Ctx,
    svc: &Value,
    name: &str,
    port: Option<&str>,
) -> ApiResult<(String, u16)> {
    let ns = ctx.namespace().unwrap_or_default();
    let ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let port_name = match port {
        None if ports.len() <= 1 => ports
            .first()
            .and_then(|p| p.get("name").and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned(),
        None => {
            return Err(ApiError::unavailable(format!(
                "no endpoints available for service \"{name}\""
            )));
        }
        Some(p) => ports
            .iter()
            .find(|sp| {
                sp.get("name").and_then(Value::as_str) == Some(p)
                    || sp
                        .get("port")
                        .and_then(Value::as_u64)
                        .map(|n| n.to_string())
                        .as_deref()
                        == Some(p)
            })
            .and_then(|sp| sp.get("name").and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned(),
    };
    ready_endpoint(&ctx.api, ns, name, &port_name)
        .await?
        .ok_or_else(|| {
            ApiError::unavailable(format!("no endpoints available for service \"{name}\""))
        })
}

/// A ready endpoint of Service `ns/name` for its port named `port_name` (`""` for an unnamed
/// one), from its EndpointSlices: (address, target port).
pub async fn ready_endpoint(
    api: &crate::Api,
    ns: &str,
    name: &str,
    port_name: &str,
) -> ApiResult<Option<(String, u16)>> {
    let prefix = format!("/registry/discovery.k8s.io/endpointslices/{ns}/");
    let slices = api
        .store
        .range(minik8s_storage::RangeRequest::prefix(&prefix))
        .await?;
    for kv in slices.kvs {
        let slice: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
        if slice
            .pointer("/metadata/labels/kubernetes.io~1service-name")
            .and_then(Value::as_str)
            != Some(name)
        {
            continue;
        }
        let Some(target) = slice
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str).unwrap_or_default() == port_name)
            .and_then(|p| p.get("port").and_then(Value::as_u64))
        else {
            continue;
        };
        let ready = slice
            .get("endpoints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|e| e.pointer("/conditions/ready") != Some(&Value::Bool(false)))
            .and_then(|e| e.pointer("/addresses/0").and_then(Value::as_str));
        if let Some(ip) = ready {
            return Ok(Some((ip.to_owned(), target as u16)));
        }
    }
    Ok(None)
}

/// Headers that belong to one hop and are not passed on.
const HOP: [header::HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Largest HTML body rewritten (larger ones fail rather than stream unrewritten).
const MAX_REWRITE: usize = 16 * 1024 * 1024;

/// The path this proxy serves the backend under: everything up to and including `/proxy`.
fn prefix_of(ctx: &Ctx) -> String {
    let base = ctx.res.base_path();
    match ctx.namespace() {
        Some(ns) => format!(
            "{base}/namespaces/{ns}/{}/{}/proxy",
            ctx.res.plural,
            ctx.name()
        ),
        None => format!("{base}/{}/{}/proxy", ctx.res.plural, ctx.name()),
    }
}

/// A URL from the backend as upstream's `Transport.rewriteURL` rewrites it: an absolute path
/// (on the backend's host, or no host) gets the proxy's prefix; anything else is left alone.
fn rewrite_url(url: &str, prefix: &str, backend: &str, request_host: &str) -> String {
    let (host, rest) = if let Some(r) = url.strip_prefix("//") {
        r.split_at(r.find('/').unwrap_or(r.len()))
    } else if let Some((_, r)) = url.split_once("://").filter(|(scheme, _)| {
        scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    }) {
        r.split_at(r.find('/').unwrap_or(r.len()))
    } else {
        ("", url)
    };
    if (!host.is_empty() && host != backend && host != request_host) || !rest.starts_with('/') {
        return url.to_owned();
    }
    if rest.starts_with(prefix) {
        return rest.to_owned();
    }
    format!("{prefix}{rest}")
}

/// The HTML attributes that hold URLs (upstream's `atomsToAttrs`).
const URL_ATTRS: [&str; 14] = [
    "href",
    "src",
    "action",
    "cite",
    "background",
    "formaction",
    "icon",
    "longdesc",
    "manifest",
    "poster",
    "profile",
    "usemap",
    "codebase",
    "data",
];

/// Rewrites the URL attributes of an HTML document (`name="…"` or `name='…'`).
fn rewrite_html(html: &str, prefix: &str, backend: &str, request_host: &str) -> String {
    let bytes = html.as_bytes();
    let mut out = String::with_capacity(html.len() + 64);
    let mut last = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' && i + 1 < bytes.len() && matches!(bytes[i + 1], b'"' | b'\'') {
            let mut start = i;
            while start > 0 && bytes[start - 1].is_ascii_alphabetic() {
                start -= 1;
            }
            let name = html[start..i].to_ascii_lowercase();
            let quote = bytes[i + 1];
            if start > 0
                && bytes[start - 1].is_ascii_whitespace()
                && URL_ATTRS.contains(&name.as_str())
                && let Some(len) = bytes[i + 2..].iter().position(|b| *b == quote)
            {
                let (vs, ve) = (i + 2, i + 2 + len);
                out.push_str(&html[last..vs]);
                out.push_str(&rewrite_url(&html[vs..ve], prefix, backend, request_host));
                last = ve;
                i = ve;
                continue;
            }
        }
        i += 1;
    }
    out.push_str(&html[last..]);
    out
}

/// Sends the request on and streams the answer back.
async fn forward(ctx: &Ctx, t: Target, body: Bytes) -> ApiResult<Response> {
    let rest = ctx.req.proxy_path.as_deref().unwrap_or_default();
    let path = format!("/{}", rest.trim_start_matches('/'));
    let uri = match ctx.params.raw.as_str() {
        "" => path,
        q => format!("{path}?{q}"),
    };
    let method = match ctx.req.verb {
        crate::serving::request::Verb::Create => axum::http::Method::POST,
        crate::serving::request::Verb::Update => axum::http::Method::PUT,
        crate::serving::request::Verb::Patch => axum::http::Method::PATCH,
        crate::serving::request::Verb::Delete | crate::serving::request::Verb::DeleteCollection => {
            axum::http::Method::DELETE
        }
        crate::serving::request::Verb::Options => axum::http::Method::OPTIONS,
        _ if ctx.req.head => axum::http::Method::HEAD,
        _ => axum::http::Method::GET,
    };
    let mut req = Request::builder().method(method).uri(&uri);
    for (k, v) in &ctx.headers {
        // The client's credentials are for this apiserver, not for what is behind it.
        if HOP.contains(k) || *k == header::AUTHORIZATION || *k == header::HOST {
            continue;
        }
        req = req.header(k, v);
    }
    let host = format!("{}:{}", t.host, t.port);
    let req = req
        .header(header::HOST, &host)
        .body(Full::new(body))
        .map_err(ApiError::internal)?;
    let unreachable =
        |e: String| ApiError::unavailable(format!("error trying to reach service: {e}"));
    let resp = if t.https {
        let tls = match (&ctx.api.kubelet, t.kubelet) {
            (Some(k), true) => k.tls(),
            _ => Arc::new(minik8s_kubeconfig::insecure::client_config()),
        };
        let mut sender =
            crate::serving::server::dial_https(tls, &t.host, t.port, &t.host, &ctx.api.tasks)
                .await
                .map_err(unreachable)?;
        sender.send_request(req).await
    } else {
        let tcp = tokio::net::TcpStream::connect((t.host.as_str(), t.port))
            .await
            .map_err(|e| unreachable(format!("dial tcp {host}: {e}")))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(|e| unreachable(e.to_string()))?;
        minik8s_task::spawn_on(&ctx.api.tasks, "proxy-connection", async move {
            let _ = conn.await;
        });
        sender.send_request(req).await
    }
    .map_err(|e| unreachable(e.to_string()))?;
    let (mut parts, body) = resp.into_parts();
    for h in HOP {
        parts.headers.remove(h);
    }
    // Links back to the backend are rewritten to go through this proxy, as upstream's
    // proxy transport does: the Location of a redirect, and links in HTML.
    let prefix = prefix_of(ctx);
    let request_host = ctx
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if let Some(loc) = parts
        .headers
        .get(header::LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(|l| rewrite_url(l, &prefix, &host, &request_host))
        .and_then(|l| HeaderValue::from_str(&l).ok())
    {
        parts.headers.insert(header::LOCATION, loc);
    }
    let html = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.split(';').next().is_some_and(|t| t.trim() == "text/html"));
    let plain = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_none_or(|e| e.as_bytes() == b"identity");
    if html && plain {
        let bytes = http_body_util::Limited::new(body, MAX_REWRITE)
            .collect()
            .await
            .map_err(|e| ApiError::unavailable(format!("error reading from backend: {e}")))?
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes);
        let out = rewrite_html(&text, &prefix, &host, &request_host);
        parts.headers.remove(header::CONTENT_LENGTH);
        return Ok(Response::from_parts(parts, Body::from(out)));
    }
    if !parts.headers.contains_key(header::CONTENT_TYPE) {
        parts
            .headers
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    }
    Ok(Response::from_parts(
        parts,
        Body::new(body.map_err(axum::Error::new)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_scheme_name_and_port_as_upstream() {
        assert_eq!(split("web").unwrap(), (None, "web", None));
        assert_eq!(split("web:8080").unwrap(), (None, "web", Some("8080")));
        assert_eq!(
            split("https:web:443").unwrap(),
            (Some("https"), "web", Some("443"))
        );
        assert_eq!(split("http:web:").unwrap(), (Some("http"), "web", None));
        assert!(split("ftp:web:21").is_err());
        assert!(split("a:b:c:d").is_err());
    }

    #[test]
    fn links_to_the_backend_are_rewritten_through_the_proxy_as_upstream() {
        let p = "/api/v1/namespaces/n/pods/web:1080/proxy";
        let b = "10.0.0.5:1080";
        assert_eq!(
            rewrite_url("/rewriteme", p, b, "h:6443"),
            format!("{p}/rewriteme")
        );
        assert_eq!(
            rewrite_url("http://10.0.0.5:1080/x/", p, b, "h:6443"),
            format!("{p}/x/")
        );
        assert_eq!(
            rewrite_url("http://elsewhere/x", p, b, "h"),
            "http://elsewhere/x"
        );
        assert_eq!(rewrite_url("relative/x", p, b, "h"), "relative/x");
        assert_eq!(
            rewrite_url(&format!("{p}/already"), p, b, "h"),
            format!("{p}/already")
        );
        let html = r#"<a href="/rewriteme">test</a><img SRC='/i.png'><p title="/not">x</p>"#;
        assert_eq!(
            rewrite_html(html, p, b, "h"),
            format!(
                r#"<a href="{p}/rewriteme">test</a><img SRC='{p}/i.png'><p title="/not">x</p>"#
            )
        );
    }
}

//! The apiserver's side of the streaming pod subresources: it finds the pod's node and the
//! node's kubelet endpoint, calls the kubelet over HTTPS with the apiserver's kubelet-client
//! certificate, and streams the answer back (`pods/log` as upstream's `kubectl logs` uses it).

use crate::context::Ctx;
use crate::error::{ApiError, ApiResult};
use crate::object;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use http_body_util::{BodyExt, Empty};
use minik8s_storage::Store;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// An HTTPS client for kubelets, presenting the apiserver's kubelet-client certificate.
pub struct KubeletClient {
    tls: Arc<rustls::ClientConfig>,
}

impl KubeletClient {
    /// Its TLS configuration (with the kubelet-client certificate).
    pub fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.tls.clone()
    }

    /// Loads the client certificate and key (PEM files).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, crate::serving::server::TlsError> {
        let err = |e: String| crate::serving::server::TlsError::new(format!("kubelet client: {e}"));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| err(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| err(e.to_string()))?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| err(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| err(e.to_string()))?
            .dangerous()
            // Any kubelet serving certificate, as upstream's apiserver accepts when no
            // `--kubelet-certificate-authority` is set (kubelets sign their own).
            .with_custom_certificate_verifier(Arc::new(
                minik8s_kubeconfig::insecure::AnyServerCert::new(provider),
            ))
            .with_client_auth_cert(certs, key)
            .map_err(|e| err(e.to_string()))?;
        Ok(KubeletClient { tls: Arc::new(tls) })
    }

    /// Sends `GET path` (with its query and `headers`) to the kubelet at `host:port`; the
    /// answer's body streams, and an upgraded answer can be taken over with
    /// `hyper::upgrade::on`.
    async fn get(
        &self,
        host: &str,
        port: u16,
        path: &str,
        headers: &[(header::HeaderName, header::HeaderValue)],
        tasks: &tokio_util::task::TaskTracker,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let mut sender =
            crate::serving::server::dial_https(self.tls.clone(), host, port, host, tasks).await?;
        let mut req = Request::get(path).header(header::HOST, format!("{host}:{port}"));
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let req = req
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| e.to_string())?;
        sender.send_request(req).await.map_err(|e| e.to_string())
    }
}

impl KubeletClient {
    /// GETs a JSON document from the kubelet at `host:port`.
    pub async fn json(
        &self,
        host: &str,
        port: u16,
        path: &str,
        tasks: &tokio_util::task::TaskTracker,
    ) -> Result<Value, String> {
        let resp = self.get(host, port, path, &[], tasks).await?;
        let code = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !code.is_success() {
            return Err(format!("kubelet answered {code}"));
        }
        serde_json::from_slice(&body).map_err(|e| e.to_string())
    }
}

/// Headers of an upgrade request that go on to the kubelet.
const UPGRADE_HEADERS: [&str; 7] = [
    "upgrade",
    "connection",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
    "x-stream-protocol-version",
];

/// Checks `PodExecOptions`/`PodAttachOptions` as upstream does (booleans as Go parses them,
/// at least one stream, a command for exec) and passes the booleans on in one spelling:
/// a malformed request is a 400 here, not a runtime error at the node.
fn stream_options(ctx: &mut Ctx, sub: &str) -> ApiResult<()> {
    let mut set = std::collections::HashSet::new();
    for (k, v) in ctx.params.streaming.iter_mut() {
        if !matches!(k.as_str(), "stdin" | "stdout" | "stderr" | "tty") {
            continue;
        }
        let b = minik8s_types::parse_bool(v).ok_or_else(|| {
            ApiError::bad_request(format!(
                "invalid value for {k}: {v:?}: must be a boolean (true, false, 1, 0, ...)"
            ))
        })?;
        *v = b.to_string();
        if b {
            set.insert(k.clone());
        }
    }
    if !["stdin", "stdout", "stderr"]
        .iter()
        .any(|s| set.contains(*s))
    {
        return Err(ApiError::bad_request(
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    if sub == "exec" && !ctx.params.streaming.iter().any(|(k, _)| k == "command") {
        return Err(ApiError::bad_request(
            "you must specify at least one command for the container",
        ));
    }
    Ok(())
}

/// The options object of a connect request, as admission sees it (`PodExecOptions`,
/// `PodAttachOptions`, `PodPortForwardOptions`).
fn connect_options(ctx: &Ctx, sub: &str) -> serde_json::Value {
    let params = &ctx.params.streaming;
    let all = |k: &str| -> Vec<String> {
        params
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .collect()
    };
    let flag = |k: &str| params.iter().any(|(key, v)| key == k && v == "true");
    let kind = match sub {
        "exec" => "PodExecOptions",
        "attach" => "PodAttachOptions",
        _ => "PodPortForwardOptions",
    };
    let mut o = serde_json::json!({"kind": kind, "apiVersion": "v1"});
    if sub == "portforward" {
        let ports: Vec<i64> = all("ports")
            .iter()
            .flat_map(|p| {
                p.split(',')
                    .filter_map(|p| p.trim().parse().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        o["ports"] = serde_json::json!(ports);
        return o;
    }
    for k in ["stdin", "stdout", "stderr", "tty"] {
        if flag(k) {
            o[k] = serde_json::json!(true);
        }
    }
    if let Some(c) = all("container").into_iter().next() {
        o["container"] = serde_json::json!(c);
    }
    if sub == "exec" {
        o["command"] = serde_json::json!(all("command"));
    }
    o
}

/// `pods/exec`, `pods/attach`, `pods/portforward`: the client's upgraded connection (WebSocket
/// or SPDY) relayed to the pod's kubelet, which relays it on to the runtime.
pub async fn stream(mut ctx: Ctx, sub: &str) -> ApiResult<Response> {
    if sub != "portforward" {
        stream_options(&mut ctx, sub)?;
    }
    crate::admission::connect(&ctx, &connect_options(&ctx, sub)).await?;
    let Some(client) = ctx.api.kubelet.as_ref() else {
        return Err(ApiError::unavailable(
            "this apiserver has no kubelet client certificate",
        ));
    };
    let Some(upgrade) = ctx.upgrade.take() else {
        return Err(ApiError::bad_request(format!(
            "{sub} needs an upgraded connection (WebSocket or SPDY)"
        )));
    };
    // Every protocol passes through to the kubelet: SPDY and WebSocket as they are (it
    // translates WebSocket v5 exec/attach and unwraps port-forward's WebSocket tunnel).
    let (pod, host, port) = kubelet_of(&ctx).await?;
    let ns = ctx.namespace().unwrap_or_default().to_owned();
    let query: Vec<(String, String)> = ctx
        .params
        .streaming
        .iter()
        .filter(|(k, _)| k != "container")
        .cloned()
        .collect();
    let query = serde_urlencoded::to_string(&query).unwrap_or_default();
    let path = if sub == "portforward" {
        format!("/portForward/{ns}/{}?{query}", ctx.name())
    } else {
        let container = container_of(&ctx, &pod)?;
        let verb = if sub == "exec" { "exec" } else { "attach" };
        format!("/{verb}/{ns}/{}/{container}?{query}", ctx.name())
    };
    relay_upgrade(&ctx, client, upgrade, &host, port, &path).await
}

/// Relays the client's upgraded connection to `path` on the kubelet at `host:port`, answering
/// with the kubelet's answer.
async fn relay_upgrade(
    ctx: &Ctx,
    client: &KubeletClient,
    upgrade: hyper::upgrade::OnUpgrade,
    host: &str,
    port: u16,
    path: &str,
) -> ApiResult<Response> {
    let headers: Vec<(header::HeaderName, header::HeaderValue)> = UPGRADE_HEADERS
        .iter()
        .flat_map(|name| {
            ctx.headers
                .get_all(*name)
                .iter()
                .map(|v| (header::HeaderName::from_static(name), v.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut resp = client
        .get(host, port, path, &headers, &ctx.api.tasks)
        .await
        .map_err(|e| ApiError::unavailable(format!("reaching the kubelet: {e}")))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        return Ok(Response::from_parts(
            parts,
            Body::new(body.map_err(axum::Error::new)),
        ));
    }
    let mut answer = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (name, value) in resp.headers() {
        answer = answer.header(name, value);
    }
    let kubelet_side = hyper::upgrade::on(&mut resp);
    minik8s_task::spawn_on(&ctx.api.tasks, "kubelet-stream", async move {
        let (Ok(client), Ok(kubelet)) = (upgrade.await, kubelet_side.await) else {
            return;
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut kubelet = hyper_util::rt::TokioIo::new(kubelet);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await;
    });
    answer.body(Body::empty()).map_err(ApiError::internal)
}

/// The pod (from the store) and where its kubelet listens: (pod, host, port).
async fn kubelet_of(ctx: &Ctx) -> ApiResult<(Value, String, u16)> {
    let (pod, _) = ctx.current().await?;
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!("pod {} does not have a host assigned", ctx.name()))
        })?
        .to_owned();
    let kv = ctx
        .api
        .store
        .get(&format!("/registry/core/nodes/{node}"))
        .await?
        .ok_or_else(|| ApiError::not_found("", "nodes", &node))?;
    let (host, port) = endpoint(&object::from_store(&kv)?)?;
    Ok((pod, host, port))
}

/// Where a node's kubelet listens: its InternalIP (or Hostname) and kubelet port.
pub fn endpoint(node: &Value) -> ApiResult<(String, u16)> {
    let name = object::meta_str(node, "name")
        .unwrap_or_default()
        .to_owned();
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request(format!("node {name} has no kubelet endpoint")))?
        as u16;
    let addresses = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let address = |kind: &str| {
        addresses
            .iter()
            .find(|a| a.get("type").and_then(Value::as_str) == Some(kind))
            .and_then(|a| a.get("address").and_then(Value::as_str))
            .map(str::to_owned)
    };
    let host = address("InternalIP")
        .or_else(|| address("Hostname"))
        .ok_or_else(|| ApiError::bad_request(format!("node {name} has no address")))?;
    Ok((host, port))
}

/// The container a request means: `container` if given, else the pod's only one.
fn container_of(ctx: &Ctx, pod: &Value) -> ApiResult<String> {
    if let Some((_, c)) = ctx.params.streaming.iter().find(|(k, _)| k == "container") {
        return Ok(c.clone());
    }
    let names: Vec<String> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {}, choose one of: [{}]",
            ctx.name(),
            names.join(" ")
        ))),
    }
}

/// `GET pods/{name}/log`: the container's log from its kubelet.
pub async fn log(mut ctx: Ctx) -> ApiResult<Response> {
    let Some(client) = ctx.api.kubelet.as_ref() else {
        return Err(ApiError::unavailable(
            "this apiserver has no kubelet client certificate",
        ));
    };
    let (pod, host, port) = kubelet_of(&ctx).await?;
    let container = container_of(&ctx, &pod)?;
    let query: Vec<(String, String)> = ctx
        .params
        .streaming
        .iter()
        .filter(|(k, _)| k != "container")
        .cloned()
        .collect();
    let query = serde_urlencoded::to_string(&query).unwrap_or_default();
    let ns = ctx.namespace().unwrap_or_default();
    let path = format!("/containerLogs/{ns}/{}/{container}?{query}", ctx.name());
    // A WebSocket client (binary.k8s.io, base64.binary.k8s.io) is relayed to the kubelet,
    // which streams the log in messages.
    let websocket = ctx
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if websocket && let Some(upgrade) = ctx.upgrade.take() {
        return relay_upgrade(&ctx, client, upgrade, &host, port, &path).await;
    }
    let resp = client
        .get(&host, port, &path, &[], &ctx.api.tasks)
        .await
        .map_err(|e| ApiError::unavailable(format!("reaching the kubelet: {e}")))?;
    if resp.status() == StatusCode::OK {
        let (parts, body) = resp.into_parts();
        return Ok(Response::from_parts(
            parts,
            Body::new(body.map_err(axum::Error::new)),
        ));
    }
    let code = resp.status();
    let message = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    Err(if code == StatusCode::NOT_FOUND {
        ApiError::not_found("", "pods", ctx.name())
    } else {
        ApiError::bad_request(message)
    })
}

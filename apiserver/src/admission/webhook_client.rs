//! Calling webhooks: admission webhooks and CRD conversion webhooks share a `clientConfig`
//! (a URL or a Service, and a CA bundle) and how a review is POSTed over TLS to it.

use axum::http::{Request, Uri, header};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use minik8s_storage::Store;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Where a webhook is served.
#[derive(Debug, Clone)]
pub enum Target {
    /// A URL (https).
    Url(String),
    /// A Service's ClusterIP, with the TLS name `<name>.<namespace>.svc`.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The path called.
        path: String,
        /// The port called.
        port: u16,
    },
}

/// A webhook `clientConfig` (admission and CRD conversion share it): where to call, and the
/// CA bundle (PEM) that verifies it.
pub fn client_config(cc: &Value) -> Option<(Target, Vec<u8>)> {
    let target = match (cc.get("url").and_then(Value::as_str), cc.get("service")) {
        (Some(url), _) => Target::Url(url.to_owned()),
        (None, Some(s)) => Target::Service {
            namespace: s.get("namespace")?.as_str()?.to_owned(),
            name: s.get("name")?.as_str()?.to_owned(),
            path: s
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("/")
                .to_owned(),
            port: s.get("port").and_then(Value::as_u64).unwrap_or(443) as u16,
        },
        _ => return None,
    };
    let ca = cc
        .get("caBundle")
        .and_then(Value::as_str)
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_default();
    Some((target, ca))
}

/// Host, port, TLS server name and path of a webhook.
async fn endpoint(
    store: &minik8s_storage::Storage,
    target: &Target,
) -> Result<(String, u16, String, String), String> {
    match target {
        Target::Url(url) => {
            let uri: Uri = url
                .parse()
                .map_err(|e| format!("invalid url {url:?}: {e}"))?;
            if uri.scheme_str() != Some("https") {
                return Err(format!("webhook url {url:?} must use https"));
            }
            let host = uri.host().ok_or("webhook url has no host")?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let path = uri
                .path_and_query()
                .map_or("/".to_owned(), |p| p.as_str().to_owned());
            Ok((host.clone(), uri.port_u16().unwrap_or(443), host, path))
        }
        Target::Service {
            namespace,
            name,
            path,
            port,
        } => {
            // Upstream's default resolver: the Service's ClusterIP, TLS name <svc>.<ns>.svc.
            let kv = store
                .get(&format!("/registry/core/services/{namespace}/{name}"))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("service \"{namespace}/{name}\" not found"))?;
            let svc: Value = serde_json::from_slice(&kv.value).map_err(|e| e.to_string())?;
            let ip = svc
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .filter(|ip| !ip.is_empty() && *ip != "None")
                .ok_or_else(|| format!("service \"{namespace}/{name}\" has no ClusterIP"))?;
            Ok((
                ip.to_owned(),
                *port,
                format!("{name}.{namespace}.svc"),
                path.clone(),
            ))
        }
    }
}

/// POSTs a JSON review to `target` over TLS verified against `ca` (within `timeout`, also
/// sent as the `timeout` query parameter); the answer's JSON. Errors read as Go's client
/// reports them: `Post "URL": why`.
pub async fn post_review(
    store: &minik8s_storage::Storage,
    tasks: &tokio_util::task::TaskTracker,
    target: &Target,
    ca: &[u8],
    body: Vec<u8>,
    timeout: Option<Duration>,
) -> Result<Value, String> {
    let (host, port, server_name, mut path) = endpoint(store, target).await?;
    if let Some(t) = timeout {
        path.push(if path.contains('?') { '&' } else { '?' });
        path.push_str(&format!("timeout={}s", t.as_secs().max(1)));
    }
    let url = format!("https://{server_name}:{port}{path}");
    let exchange = exchange(&host, port, &server_name, &path, ca, body, tasks);
    match timeout {
        Some(t) => match tokio::time::timeout(t, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err("context deadline exceeded".to_owned()),
        },
        None => exchange.await,
    }
    .map_err(|e| format!("Post \"{url}\": {e}"))
}

async fn exchange(
    host: &str,
    port: u16,
    server_name: &str,
    path: &str,
    ca: &[u8],
    body: Vec<u8>,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<Value, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca).flatten() {
        let _ = roots.add(cert);
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut sender =
        crate::serving::server::dial_https(Arc::new(tls), host, port, server_name, tasks).await?;
    let req = Request::post(path)
        .header(header::HOST, format!("{host}:{port}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("webhook answered {status}"));
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("invalid review: {e}"))
}

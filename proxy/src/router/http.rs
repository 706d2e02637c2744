//! The router's HTTP server: each request is matched against the current [`Table`] and sent
//! on to its Service's ClusterIP (kept-alive connections, through the node's Service rules).
//! A table swap never touches requests in flight: each holds the backend it resolved.

use super::routes::{Backend, Port, Table};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A Service as the router needs it: its ClusterIP and ports (name → port).
#[derive(Clone, Debug, Default)]
pub struct ServiceInfo {
    /// The ClusterIP.
    pub cluster_ip: Option<std::net::Ipv4Addr>,
    /// Ports by name (`""` for an unnamed one) and their numbers.
    pub ports: Vec<(String, u16)>,
}

/// What requests are routed with, replaced whole on every change.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// The routes.
    pub table: Table,
    /// Services by `namespace/name`.
    pub services: HashMap<String, ServiceInfo>,
    /// TLS certificates by host (`*.example.com` for wildcards), from Ingresses' Secrets.
    pub certs: HashMap<String, Arc<rustls::sign::CertifiedKey>>,
}

/// Picks a certificate by SNI from the current state: the exact host, then its wildcard.
#[derive(Debug)]
pub struct Certs(pub Shared);

impl rustls::server::ResolvesServerCert for Certs {
    fn resolve(
        &self,
        hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let host = hello.server_name()?.to_ascii_lowercase();
        let state = self.0.read().expect("router state").clone();
        state.certs.get(&host).cloned().or_else(|| {
            let (_, rest) = host.split_once('.')?;
            state.certs.get(&format!("*.{rest}")).cloned()
        })
    }
}

/// A certificate and key from a `kubernetes.io/tls` Secret's PEM.
pub fn certified_key(crt: &[u8], key: &[u8]) -> Result<rustls::sign::CertifiedKey, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("tls.key: {e}"))?;
    let key = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("tls.key: {e}"))?;
    Ok(rustls::sign::CertifiedKey::new(chain, key))
}

/// The shared, swappable state.
pub type Shared = Arc<RwLock<Arc<State>>>;

type Body = BoxBody<Bytes, hyper::Error>;

fn text(code: StatusCode, message: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(message + "\n"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = code;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The address of a backend, or why there is none (503's text).
pub fn resolve(state: &State, b: &Backend) -> Result<SocketAddr, String> {
    let key = format!("{}/{}", b.namespace, b.service);
    let svc = state
        .services
        .get(&key)
        .ok_or_else(|| format!("service {key} not found"))?;
    let ip = svc
        .cluster_ip
        .ok_or_else(|| format!("service {key} has no ClusterIP"))?;
    let port = match &b.port {
        Port::Number(n) => svc
            .ports
            .iter()
            .find(|(_, p)| p == n)
            .map(|(_, p)| *p)
            .ok_or_else(|| format!("service {key} has no port {n}"))?,
        Port::Name(name) => svc
            .ports
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| *p)
            .ok_or_else(|| format!("service {key} has no port named {name:?}"))?,
    };
    Ok(SocketAddr::from((ip, port)))
}

async fn handle(
    req: Request<Incoming>,
    shared: Shared,
    client: Client<HttpConnector, Incoming>,
    peer: SocketAddr,
    tls: bool,
) -> Result<Response<Body>, hyper::Error> {
    let state = shared.read().expect("router state").clone();
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or_default()
        .to_owned();
    let path = req.uri().path().to_owned();
    let Some((backend, sent)) = state.table.route(&host, &path) else {
        return Ok(text(
            StatusCode::NOT_FOUND,
            format!("no route for http://{host}{path}"),
        ));
    };
    let addr = match resolve(&state, backend) {
        Ok(a) => a,
        Err(why) => return Ok(text(StatusCode::SERVICE_UNAVAILABLE, why)),
    };
    let (mut parts, body) = req.into_parts();
    let query = parts
        .uri
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    parts.uri = match format!("http://{addr}{sent}{query}").parse() {
        Ok(u) => u,
        Err(e) => return Ok(text(StatusCode::BAD_REQUEST, format!("bad path: {e}"))),
    };
    parts.version = hyper::Version::HTTP_11;
    let forwarded = match parts
        .headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
    {
        Some(before) => format!("{before}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(v) = forwarded.parse() {
        parts.headers.insert("x-forwarded-for", v);
    }
    parts.headers.insert(
        "x-forwarded-proto",
        hyper::header::HeaderValue::from_static(if tls { "https" } else { "http" }),
    );
    parts.headers.insert(
        "x-forwarded-host",
        host.parse()
            .unwrap_or(hyper::header::HeaderValue::from_static("")),
    );
    strip_hop_by_hop(&mut parts.headers);
    match client.request(Request::from_parts(parts, body)).await {
        Ok(mut resp) => {
            strip_hop_by_hop(resp.headers_mut());
            Ok(resp.map(|b| b.boxed()))
        }
        Err(e) => Ok(text(
            StatusCode::BAD_GATEWAY,
            format!(
                "service {}/{} ({addr}): {e}",
                backend.namespace, backend.service
            ),
        )),
    }
}

/// Removes the headers that concern one connection only (RFC 9110 7.6.1), and those the
/// `Connection` header names, so each side of the proxy keeps its own connection settings.
fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .collect();
    for h in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ]
    .into_iter()
    .chain(named.iter().map(String::as_str))
    {
        headers.remove(h);
    }
}

/// Serves HTTP on `listener` (HTTPS when `tls` is given) until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "router accept");
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        let _ = stream.set_nodelay(true);
        let (shared, client, tls) = (shared.clone(), client.clone(), tls.clone());
        minik8s_task::spawn("router-connection", async move {
            let secure = tls.is_some();
            let service = hyper::service::service_fn(move |req| {
                handle(req, shared.clone(), client.clone(), peer, secure)
            });
            let conn = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let served = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(s) => conn.serve_connection(TokioIo::new(s), service).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "router TLS handshake");
                        return;
                    }
                },
                None => conn.serve_connection(TokioIo::new(stream), service).await,
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "router connection");
            }
        });
    }
}

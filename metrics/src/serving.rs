//! The HTTPS servers of components other than the apiserver (the kubelet's 10250, the
//! controller manager's 10257), as upstream's: a self-signed serving certificate made at
//! start (upstream makes one when none is given), clients authenticated by a certificate
//! from the cluster CA (user from its CN, groups from its O), and each request authorised
//! either by a group the certificate must carry or by a SubjectAccessReview to the apiserver
//! (upstream's delegated authorisation, so RBAC's `system:monitoring` role works). And the
//! proxy's plain-HTTP metrics server (10249), as upstream's.

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Making the TLS configuration failed.
    #[error("TLS: {0}")]
    Tls(String),
    /// Binding the address failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
}

/// A server config with a fresh self-signed certificate for `names` (and 127.0.0.1) that
/// asks clients for a certificate from `client_ca`.
pub fn self_signed_tls(client_ca: &Path, names: &[String]) -> Result<rustls::ServerConfig, Error> {
    let key = rcgen::KeyPair::generate().map_err(|e| Error::Tls(e.to_string()))?;
    let mut params =
        rcgen::CertificateParams::new(names.to_vec()).map_err(|e| Error::Tls(e.to_string()))?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(
        std::net::Ipv4Addr::LOCALHOST.into(),
    ));
    let cert = params
        .self_signed(&key)
        .map_err(|e| Error::Tls(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(client_ca).map_err(|e| Error::Tls(e.to_string()))? {
        roots
            .add(ca.map_err(|e| Error::Tls(e.to_string()))?)
            .map_err(|e| Error::Tls(e.to_string()))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| Error::Tls(e.to_string()))?;
    let key_der = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
        .map_err(|e| Error::Tls(e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert.der().clone()], key_der)
        .map_err(|e| Error::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Who a client certificate names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The user (the certificate's CN).
    pub user: String,
    /// The groups (its O entries).
    pub groups: Vec<String>,
}

/// The identity in a (CA-verified) client certificate.
pub fn identity(cert: &CertificateDer<'_>) -> Option<Identity> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(Identity { user, groups })
}

/// How a server decides whether an authenticated client may make a request.
#[derive(Clone)]
pub enum Access {
    /// The certificate must carry this group (the kubelet's rule for the apiserver).
    Group(&'static str),
    /// Ask the apiserver: a SubjectAccessReview of the request's path and verb `get`.
    Review(kube::Client),
}

impl Access {
    /// Whether `who` may `GET` `path`.
    pub async fn allows(&self, who: &Identity, path: &str) -> bool {
        match self {
            Access::Group(g) => who.groups.iter().any(|x| x == g),
            Access::Review(client) => review(client, who, path).await,
        }
    }
}

async fn review(client: &kube::Client, who: &Identity, path: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let sar: SubjectAccessReview = match serde_json::from_value(serde_json::json!({
        "spec": {"user": who.user, "groups": who.groups,
                 "nonResourceAttributes": {"path": path, "verb": "get"}},
    })) {
        Ok(s) => s,
        Err(_) => return false,
    };
    let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
    match api.create(&Default::default(), &sar).await {
        Ok(r) => r.status.is_some_and(|s| s.allowed),
        Err(e) => {
            tracing::warn!(error = %e, "SubjectAccessReview for a metrics client");
            false
        }
    }
}

fn plain_status(code: StatusCode, message: &str) -> Response {
    (code, format!("{message}\n")).into_response()
}

/// Serves `app` over TLS on `listener` until `shutdown`: clients without a certificate get
/// 401, those `access` refuses 403. Connections (and upgraded streams) are waited for.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    app: Router,
    access: Access,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let conns = tokio_util::task::TaskTracker::new();
    loop {
        let (tcp, _) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let access = access.clone();
        let shutdown = shutdown.clone();
        minik8s_task::spawn_on(&conns, "metrics-connection", async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let who = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(identity);
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let app = app.clone();
                    let access = access.clone();
                    let who = who.clone();
                    async move {
                        use tower::ServiceExt;
                        let Some(who) = who else {
                            return Ok(plain_status(StatusCode::UNAUTHORIZED, "Unauthorized"));
                        };
                        let path = req.uri().path().to_owned();
                        if !access.allows(&who, &path).await {
                            let msg =
                                format!("Forbidden (user={}, verb=get, path={path})", who.user);
                            return Ok(plain_status(StatusCode::FORBIDDEN, &msg));
                        }
                        app.oneshot(req.map(Body::new)).await
                    }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                _ = conn => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
    conns.close();
    conns.wait().await;
}

/// A router answering `/metrics` with the given components' series and `/healthz`.
pub fn metrics_router(components: &'static [&'static str]) -> Router {
    Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || async move {
                (
                    [(axum::http::header::CONTENT_TYPE, crate::CONTENT_TYPE)],
                    crate::encode(components, &[]),
                )
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }))
}

/// Binds `addr`; the bound address (port 0 picks one) and the listener.
pub async fn bind(addr: SocketAddr) -> Result<(SocketAddr, tokio::net::TcpListener), Error> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    Ok((bound, listener))
}

/// Serves `app` over plain HTTP until `shutdown` (the proxy's metrics port, as upstream's).
pub async fn serve_plain(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
) {
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    {
        tracing::warn!(error = %e, "metrics server");
    }
}

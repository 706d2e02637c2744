//! HTTPS serving: rustls with optional client certificates verified against the cluster CA,
//! HTTP/1.1 and HTTP/2 (ALPN), each request tagged with its connection's identity, and a
//! graceful stop (stop accepting, end watches, drain in-flight requests).

use crate::auth::{PeerIdentity, user_from_cert};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Setting up TLS failed.
#[derive(Debug, thiserror::Error)]
#[error("TLS setup: {what}")]
pub struct TlsError {
    what: String,
}

impl TlsError {
    /// A TLS setup error saying `what` went wrong.
    pub fn new(what: impl std::fmt::Display) -> Self {
        tls_err(what)
    }
}

fn tls_err(what: impl std::fmt::Display) -> TlsError {
    TlsError {
        what: what.to_string(),
    }
}

/// A rustls server config: the serving certificate, and client certificates from `client_ca`
/// verified when offered.
pub fn tls_config(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| tls_err(format!("{}: {e}", cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err(format!("{}: {e}", cert.display())))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| tls_err(format!("{}: {e}", key.display())))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(client_ca)
        .map_err(|e| tls_err(format!("{}: {e}", client_ca.display())))?
    {
        roots
            .add(ca.map_err(|e| tls_err(format!("{}: {e}", client_ca.display())))?)
            .map_err(tls_err)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(tls_err)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(tls_err)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Opens an HTTP/1.1 connection over TLS to `host:port` (verifying the certificate for
/// `server_name` as `tls` says); the connection runs on `tasks` and allows upgrades.
pub async fn dial_https<B>(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    server_name: &str,
    tasks: &TaskTracker,
) -> Result<hyper::client::conn::http1::SendRequest<B>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("tls: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    minik8s_task::spawn_on(tasks, "upstream-connection", async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// Accepts connections until `shutdown`, then lets in-flight requests finish (up to 10 s).
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    app: Router,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        minik8s_task::spawn_on(&tasks, "connection", async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
            let identity = PeerIdentity(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| user_from_cert(c.as_ref())),
            );
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                req.extensions_mut().insert(identity.clone());
                let app = app.clone();
                async move {
                    use tower::ServiceExt;
                    app.oneshot(req.map(axum::body::Body::new)).await
                }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after 10 s; closing them");
    }
}

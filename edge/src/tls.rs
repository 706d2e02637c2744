//! Mutual TLS between cloud and edge, on the cluster CA:
//!
//! - the edgelet serves with its `kubelet-serving` certificate (CN `system:node:<name>`, its
//!   address as IP SAN) and takes calls only from the registry's client certificate;
//! - the cloud's client checks the chain, the address, and that the certificate is the node's
//!   it means to reach (an edge presenting another node's name is refused);
//! - the registry serves with the apiserver's certificate; discovery alone runs before the
//!   edge trusts it (then the cluster-info's signature and the CA pin decide, as `kubeadm
//!   join`).

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Why a TLS setting could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM does not hold what it should.
    #[error("{0}")]
    Pem(String),
    /// rustls refused the setting.
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    /// The address is not usable.
    #[error("invalid address {0:?}")]
    Address(String),
}

fn certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let out: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem(format!("certificate PEM: {e}")))?;
    if out.is_empty() {
        return Err(TlsError::Pem("no certificate in the PEM".into()));
    }
    Ok(out)
}

fn key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| TlsError::Pem(format!("key PEM: {e}")))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The subject CN of a DER certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der).ok()?;
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

/// The CN of the client certificate a request came with.
pub fn peer_cn<T>(req: &tonic::Request<T>) -> Option<String> {
    let certs = req.peer_certs()?;
    common_name(certs.first()?.as_ref())
}

/// Checks the chain (webpki) and then that the certificate's CN is the expected one.
#[derive(Debug)]
struct NamedServer {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    cn: Option<String>,
}

impl ServerCertVerifier for NamedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ok =
            self.inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        if let Some(want) = &self.cn {
            let found = common_name(end_entity.as_ref()).unwrap_or_default();
            if &found != want {
                return Err(rustls::Error::General(format!(
                    "the peer presents the certificate of {found:?}, not of {want:?}"
                )));
            }
        }
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A client config trusting `ca_pem`, presenting `identity` (cert, key PEM) when given, and
/// accepting only a server certificate whose CN is `server_cn` when given.
pub fn client_config(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    server_cn: Option<String>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca_pem)? {
        roots
            .add(c)
            .map_err(|e| TlsError::Pem(format!("CA certificate: {e}")))?;
    }
    let inner =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| TlsError::Pem(format!("CA: {e}")))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NamedServer {
            inner,
            cn: server_cn,
        }));
    let mut config = match identity {
        Some((cert, k)) => builder.with_client_auth_cert(certs(cert)?, key(k)?)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A client config that trusts any server (discovery only, before the CA is known).
pub fn insecure_config() -> rustls::ClientConfig {
    let mut c = minik8s_kubeconfig::insecure::client_config();
    c.alpn_protocols = vec![b"h2".to_vec()];
    c
}

/// A gRPC channel to `addr` (`host:port`) over TLS with `config`, connecting lazily (and
/// again after a failure), each call bounded by `timeout`.
pub fn channel(
    addr: &str,
    config: rustls::ClientConfig,
    timeout: Duration,
) -> Result<Channel, TlsError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|_| TlsError::Address(addr.to_owned()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let service = tower::service_fn(move |uri: http::Uri| {
        let connector = connector.clone();
        async move {
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_matches(['[', ']'])
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(host.clone())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(service))
}

/// A server TLS setting: `cert`/`key` PEM, client certificates chained to `ca_pem`
/// required (or optional).
pub fn server_config(
    cert: &str,
    key: &str,
    ca_pem: &str,
    client_optional: bool,
) -> tonic::transport::ServerTlsConfig {
    tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(cert, key))
        .client_ca_root(tonic::transport::Certificate::from_pem(ca_pem))
        .client_auth_optional(client_optional)
}

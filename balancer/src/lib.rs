//! The nodes' client-side load balancer over every apiserver, as k3s agents run one: a TCP
//! proxy on a loopback port that hands each connection to a live apiserver. TLS passes through
//! untouched (every apiserver's serving certificate names 127.0.0.1), so clients still verify
//! the apiserver and present their own certificates, and a node's kubeconfig simply points at
//! the balancer.
//!
//! - It starts with the servers it is given (those `join` knew) and takes new lists with
//!   [`Balancer::set_servers`] (the caller refreshes them from `default/kubernetes`).
//! - Each connection goes to the first server in the list that is healthy and accepts it; a
//!   server that refuses or does not answer within [`CONNECT_TIMEOUT`] is marked down and the
//!   next one is tried at once, so a client waits at most one connect timeout per dead server,
//!   never a request timeout.
//! - Every [`CHECK_INTERVAL`] each server is checked and marked up or down: with the cluster's
//!   CA ([`Health::Readyz`]), by `GET /readyz` over TLS (anonymous, as upstream allows), so an
//!   apiserver that answers but has lost etcd is passed over; else by a TCP connect.
//! - A connection whose server dies is closed: its client's request in flight fails once, and
//!   its next connection goes to another server.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long a connect to one apiserver may take before the next is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How often every apiserver's health is checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// The balancer could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Its listening address could not be bound.
    #[error("binding the apiserver balancer to {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No apiserver was given.
    #[error("the apiserver balancer needs at least one server")]
    NoServers,
    /// The CA for `/readyz` checks is unusable.
    #[error("the apiserver balancer's CA: {0}")]
    Ca(String),
}

/// How servers are checked.
#[derive(Clone, Debug)]
pub enum Health {
    /// A TCP connect.
    Tcp,
    /// `GET /readyz` over TLS, verifying the server with this CA (PEM); healthy on 200.
    Readyz(String),
}

/// One apiserver (`host:port`) and whether it answered last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// `host:port`.
    pub address: String,
    /// Whether its last connect or health check succeeded.
    pub healthy: bool,
}

/// A running balancer (it stops with the token given to [`start`]).
#[derive(Clone)]
pub struct Balancer {
    addr: SocketAddr,
    servers: Arc<Mutex<Vec<Server>>>,
}

impl Balancer {
    /// Where it listens (`https://` this is the node's apiserver URL).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The servers and their health, in the order they are tried.
    pub fn servers(&self) -> Vec<Server> {
        self.servers.lock().expect("servers").clone()
    }

    /// Replaces the list (kept in the order given; servers already known keep their health,
    /// new ones start healthy). An empty list is ignored: the balancer never forgets every
    /// server at once.
    pub fn set_servers(&self, addresses: &[String]) {
        if addresses.is_empty() {
            return;
        }
        let mut servers = self.servers.lock().expect("servers");
        let next: Vec<Server> = addresses
            .iter()
            .map(|a| {
                servers
                    .iter()
                    .find(|s| &s.address == a)
                    .cloned()
                    .unwrap_or(Server {
                        address: a.clone(),
                        healthy: true,
                    })
            })
            .collect();
        if *servers != next {
            tracing::info!(servers = ?addresses, "apiserver balancer: servers updated");
            *servers = next;
        }
    }

    fn mark(&self, address: &str, healthy: bool) {
        let mut servers = self.servers.lock().expect("servers");
        if let Some(s) = servers.iter_mut().find(|s| s.address == address)
            && s.healthy != healthy
        {
            s.healthy = healthy;
            if healthy {
                tracing::info!(server = address, "apiserver balancer: server is back");
            } else {
                tracing::warn!(server = address, "apiserver balancer: server is down");
            }
        }
    }

    /// Connects to a live server: the healthy ones in order, then (all down) every one, so a
    /// recovered server is found before its next health check.
    async fn connect(&self) -> Option<(String, TcpStream)> {
        let servers = self.servers();
        let order = servers
            .iter()
            .filter(|s| s.healthy)
            .chain(servers.iter().filter(|s| !s.healthy));
        for s in order {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&s.address)).await {
                Ok(Ok(stream)) => {
                    self.mark(&s.address, true);
                    return Some((s.address.clone(), stream));
                }
                Ok(Err(e)) => {
                    tracing::debug!(server = %s.address, error = %e, "apiserver balancer: connect failed");
                    self.mark(&s.address, false);
                }
                Err(_) => self.mark(&s.address, false),
            }
        }
        None
    }
}

/// Starts a balancer on `listen` (port 0 picks one) over `servers` (`host:port`), checked
/// with a TCP connect, until `shutdown`.
pub async fn start(
    listen: SocketAddr,
    servers: &[String],
    shutdown: CancellationToken,
) -> Result<Balancer, Error> {
    start_with(listen, servers, Health::Tcp, shutdown).await
}

/// As [`start`], checking the servers with `health`.
pub async fn start_with(
    listen: SocketAddr,
    servers: &[String],
    health: Health,
    shutdown: CancellationToken,
) -> Result<Balancer, Error> {
    if servers.is_empty() {
        return Err(Error::NoServers);
    }
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| Error::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: listen,
        source,
    })?;
    let balancer = Balancer {
        addr,
        servers: Arc::new(Mutex::new(
            servers
                .iter()
                .map(|a| Server {
                    address: a.clone(),
                    healthy: true,
                })
                .collect(),
        )),
    };
    minik8s_task::spawn(
        "apiserver-balancer",
        accept(listener, balancer.clone(), shutdown.clone()),
    );
    let probe = Probe::new(health)?;
    minik8s_task::spawn(
        "apiserver-balancer-health",
        check(balancer.clone(), probe, shutdown),
    );
    tracing::info!(%addr, servers = ?servers, "apiserver balancer listening");
    Ok(balancer)
}

async fn accept(listener: TcpListener, balancer: Balancer, shutdown: CancellationToken) {
    loop {
        let (client, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "apiserver balancer: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let balancer = balancer.clone();
        let shutdown = shutdown.clone();
        minik8s_task::spawn("apiserver-balancer-connection", async move {
            let _ = client.set_nodelay(true);
            let Some((server, upstream)) = balancer.connect().await else {
                tracing::warn!("apiserver balancer: no apiserver answers");
                return;
            };
            let _ = upstream.set_nodelay(true);
            let (mut client, mut upstream) = (client, upstream);
            tokio::select! {
                _ = shutdown.cancelled() => {}
                r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                    if let Err(e) = r {
                        tracing::debug!(%server, error = %e, "apiserver balancer: connection ended");
                    }
                }
            }
        });
    }
}

/// A health check.
enum Probe {
    Tcp,
    Readyz(tokio_rustls::TlsConnector),
}

impl Probe {
    fn new(health: Health) -> Result<Self, Error> {
        let Health::Readyz(ca_pem) = health else {
            return Ok(Probe::Tcp);
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in
            <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(
                ca_pem.as_bytes(),
            )
        {
            let cert = cert.map_err(|e| Error::Ca(e.to_string()))?;
            roots.add(cert).map_err(|e| Error::Ca(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(Error::Ca("no certificate in the PEM".into()));
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Ca(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Probe::Readyz(tokio_rustls::TlsConnector::from(Arc::new(
            config,
        ))))
    }

    /// Whether `address` is up (within [`CONNECT_TIMEOUT`]).
    async fn up(&self, address: &str) -> bool {
        let attempt = async {
            let tcp = TcpStream::connect(address).await.ok()?;
            let Probe::Readyz(tls) = self else {
                return Some(true);
            };
            let host = address
                .rsplit_once(':')
                .map_or(address, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_owned()).ok()?;
            let mut stream = tls.connect(name, tcp).await.ok()?;
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            stream
                .write_all(
                    format!("GET /readyz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .ok()?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).await.ok()?;
            Some(&head[9..12] == b"200")
        };
        matches!(
            tokio::time::timeout(CONNECT_TIMEOUT, attempt).await,
            Ok(Some(true))
        )
    }
}

async fn check(balancer: Balancer, probe: Probe, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CHECK_INTERVAL) => {}
        }
        for s in balancer.servers() {
            let up = probe.up(&s.address).await;
            balancer.mark(&s.address, up);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server answering with its own name first; returns its address.
    async fn named_server(name: &'static str, shutdown: CancellationToken) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    a = listener.accept() => a.unwrap(),
                };
                tokio::spawn(async move {
                    let _ = s.write_all(name.as_bytes()).await;
                });
            }
        });
        addr
    }

    async fn ask(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    }

    #[tokio::test]
    async fn connections_go_to_the_first_live_server_and_fail_over_at_once() {
        let stop = CancellationToken::new();
        let (a_stop, b_stop) = (stop.child_token(), stop.child_token());
        let a = named_server("a", a_stop.clone()).await;
        let b = named_server("b", b_stop.clone()).await;
        // A server that was never there (nothing listens on it) comes first.
        let gone = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().to_string()
        };
        let lb = start(
            "127.0.0.1:0".parse().unwrap(),
            &[gone.clone(), a.clone(), b.clone()],
            stop.clone(),
        )
        .await
        .unwrap();
        assert_eq!(ask(lb.addr()).await, "a");
        assert!(!lb.servers()[0].healthy, "{:?}", lb.servers());
        // a stops: the next connection goes to b, with no wait.
        a_stop.cancel();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        assert_eq!(ask(lb.addr()).await, "b");
        assert!(started.elapsed() < Duration::from_secs(1));
        // A new list (refreshed from default/kubernetes) is taken; an empty one ignored.
        lb.set_servers(std::slice::from_ref(&b));
        lb.set_servers(&[]);
        assert_eq!(lb.servers().len(), 1);
        assert_eq!(ask(lb.addr()).await, "b");
        stop.cancel();
    }

    #[tokio::test]
    async fn no_servers_is_an_error() {
        let err = start(
            "127.0.0.1:0".parse().unwrap(),
            &[],
            CancellationToken::new(),
        )
        .await
        .err()
        .expect("an error");
        assert!(matches!(err, Error::NoServers));
    }

    /// A TLS server for 127.0.0.1 (signed by a new CA) answering every request with
    /// `status`; returns its address and the CA's PEM.
    async fn tls_server(status: &'static str, shutdown: CancellationToken) -> (String, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (s, _) = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    a = listener.accept() => a.unwrap(),
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(s).await else {
                        return;
                    };
                    let mut buf = [0u8; 512];
                    let _ = tls.read(&mut buf).await;
                    let _ = tls
                        .write_all(
                            format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
                        )
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (addr, ca_cert.pem())
    }

    #[tokio::test]
    async fn readyz_checks_pass_over_an_apiserver_that_lost_etcd() {
        let stop = CancellationToken::new();
        let (ready, ca) = tls_server("200 OK", stop.clone()).await;
        let probe = Probe::new(Health::Readyz(ca.clone())).unwrap();
        assert!(probe.up(&ready).await, "200 is up");
        let (unready, ca2) = tls_server("503 Service Unavailable", stop.clone()).await;
        let probe2 = Probe::new(Health::Readyz(ca2)).unwrap();
        assert!(!probe2.up(&unready).await, "503 is down");
        // Another CA's server is not trusted.
        assert!(!probe.up(&unready).await, "an unknown CA is down");
        // A closed port is down; TCP checks see only that.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        assert!(!probe.up(&closed).await);
        assert!(Probe::Tcp.up(&unready).await);
        assert!(matches!(
            Probe::new(Health::Readyz("not a PEM".into())),
            Err(Error::Ca(_))
        ));
        stop.cancel();
    }
}

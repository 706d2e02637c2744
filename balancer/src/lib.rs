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
//! - Every [`CHECK_INTERVAL`] each server is checked with a TCP connect and marked up or down.
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

/// Starts a balancer on `listen` (port 0 picks one) over `servers` (`host:port`), until
/// `shutdown`.
pub async fn start(
    listen: SocketAddr,
    servers: &[String],
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
    minik8s_task::spawn(
        "apiserver-balancer-health",
        check(balancer.clone(), shutdown),
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

async fn check(balancer: Balancer, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CHECK_INTERVAL) => {}
        }
        for s in balancer.servers() {
            let up = matches!(
                tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&s.address)).await,
                Ok(Ok(_))
            );
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
}

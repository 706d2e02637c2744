//! Container probes (startup, liveness, readiness) with upstream's timing fields: each probe
//! runs when due (initialDelaySeconds after the container started, then every periodSeconds,
//! each try bounded by timeoutSeconds) and flips after successThreshold / failureThreshold
//! consecutive results. Results live here between passes, keyed by container id, so a new
//! container starts over.

use crate::cri::Cri;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Gates the other two until it succeeds once.
    Startup,
    /// Failing kills the container.
    Liveness,
    /// Gates the container's readiness.
    Readiness,
}

#[derive(Clone, Debug, Default)]
struct Track {
    container_id: String,
    successes: i32,
    failures: i32,
    last: Option<Instant>,
    /// The settled result (`None` until a threshold is reached).
    ok: Option<bool>,
}

/// Probe results of every container on the node.
#[derive(Debug, Default)]
pub struct Probes {
    tracks: Mutex<HashMap<(String, Kind), Track>>,
}

/// What the probes say about one running container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The startup probe passed (or there is none).
    pub started: bool,
    /// Ready for traffic.
    pub ready: bool,
    /// The liveness (or startup) probe failed: restart it.
    pub kill: bool,
}

fn port_of(port: &IntOrString, c: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// Runs one probe try: exec, HTTP(S) GET, TCP connect or gRPC health check, as upstream's
/// prober. `Err` carries the failure as upstream words it (for the `Unhealthy` event).
pub async fn run_once(
    cri: &Cri,
    p: &Probe,
    c: &Container,
    container_id: &str,
    pod_ip: &str,
) -> Result<(), String> {
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(exec) = &p.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return match tokio::time::timeout(
            timeout + Duration::from_secs(1),
            cri.exec_sync(container_id, cmd, timeout.as_secs() as i64),
        )
        .await
        {
            Ok(Ok(r)) if r.exit_code == 0 => Ok(()),
            Ok(Ok(r)) => Err(String::from_utf8_lossy(&r.stdout).into_owned()
                + &String::from_utf8_lossy(&r.stderr)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("command timed out after {}s", timeout.as_secs())),
        };
    }
    if let Some(tcp) = &p.tcp_socket {
        let host = tcp.host.clone().unwrap_or_else(|| pod_ip.to_owned());
        let port = port_of(&tcp.port, c).ok_or("unknown port")?;
        return match tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
        };
    }
    if let Some(http) = &p.http_get {
        let host = http.host.clone().unwrap_or_else(|| pod_ip.to_owned());
        let port = port_of(&http.port, c).ok_or("unknown port")?;
        let https = http.scheme.as_deref() == Some("HTTPS");
        let path = http.path.clone().unwrap_or_default();
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        let url = Url {
            https,
            host,
            port,
            path: if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            },
        };
        let shown = url.to_string();
        return match tokio::time::timeout(timeout, http_get(url, &headers)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "Get \"{shown}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            )),
        };
    }
    if let Some(grpc) = &p.grpc {
        let port = u16::try_from(grpc.port).map_err(|_| "invalid port".to_owned())?;
        let service = grpc.service.clone().unwrap_or_default();
        return match tokio::time::timeout(timeout, grpc_check(pod_ip, port, service)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "timeout: health rpc did not complete within {}s",
                timeout.as_secs()
            )),
        };
    }
    // A probe with no handler: nothing to fail.
    Ok(())
}

/// Where an HTTP probe goes.
#[derive(Clone, Debug, PartialEq)]
struct Url {
    https: bool,
    host: String,
    port: u16,
    path: String,
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}{}", self.host, self.port, self.path)
    }
}

impl Url {
    /// Where a redirect's `Location` points, relative to this URL.
    fn join(&self, location: &str) -> Option<Url> {
        if let Some((scheme, rest)) = location.split_once("://") {
            let https = match scheme.to_ascii_lowercase().as_str() {
                "http" => false,
                "https" => true,
                _ => return None,
            };
            let (authority, path) = match rest.find('/') {
                Some(i) => (&rest[..i], rest[i..].to_owned()),
                None => (rest, "/".to_owned()),
            };
            let (host, port) = match authority.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                    (h.to_owned(), p.parse().ok()?)
                }
                _ => (authority.to_owned(), if https { 443 } else { 80 }),
            };
            return Some(Url {
                https,
                host,
                port,
                path,
            });
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let dir = &self.path[..self.path.rfind('/').map_or(0, |i| i + 1)];
            format!("{}{location}", if dir.is_empty() { "/" } else { dir })
        };
        Some(Url {
            path,
            ..self.clone()
        })
    }
}

/// upstream's `kube-probe/<major>.<minor>` User-Agent.
const USER_AGENT: &str = "kube-probe/1.33";

/// An HTTP(S) probe as upstream's `prober/http`: its headers (User-Agent and Accept unless
/// the probe sets them, an empty Accept dropped, Host from a `Host` header), certificates not
/// verified, redirects followed on the same host (at most 10; one to another host ends the
/// probe with the redirect's answer), and success for 200–399.
async fn http_get(mut url: Url, headers: &[(String, String)]) -> Result<(), String> {
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    let first_host = url.host.clone();
    for redirects in 0.. {
        let code_and_location = http_once(&url, headers, &has).await?;
        let (code, location) = code_and_location;
        if (300..400).contains(&code)
            && let Some(next) = location.as_deref().and_then(|l| url.join(l))
        {
            if next.host != first_host {
                // Not followed: the redirect's own answer counts (a success, with a warning upstream).
                return Ok(());
            }
            if redirects >= 10 {
                return Err(format!("Get \"{next}\": stopped after 10 redirects"));
            }
            url = next;
            continue;
        }
        return if (200..400).contains(&code) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {code}"))
        };
    }
    unreachable!("the loop returns")
}

/// One GET: the status code and `Location`.
async fn http_once(
    url: &Url,
    headers: &[(String, String)],
    has: &impl Fn(&str) -> bool,
) -> Result<(u16, Option<String>), String> {
    use http_body_util::{BodyExt, Empty};
    use hyper::header::{HeaderName, HeaderValue};
    let err = |e: &dyn std::fmt::Display| format!("Get \"{url}\": {e}");
    let tcp = tokio::net::TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| err(&format!("dial tcp {}:{}: {e}", url.host, url.port)))?;
    let mut req = hyper::Request::get(&url.path);
    let mut host = format!("{}:{}", url.host, url.port);
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("host") {
            host = v.clone();
            continue;
        }
        if k.eq_ignore_ascii_case("accept") && v.is_empty() {
            continue;
        }
        if let (Ok(k), Ok(v)) = (
            HeaderName::try_from(k.as_str()),
            HeaderValue::try_from(v.as_str()),
        ) {
            req = req.header(k, v);
        }
    }
    if !has("user-agent") {
        req = req.header(hyper::header::USER_AGENT, USER_AGENT);
    }
    if !has("accept") {
        req = req.header(hyper::header::ACCEPT, "*/*");
    }
    let req = req
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| err(&e))?;
    let resp = if url.https {
        let tls = std::sync::Arc::new(minik8s_kubeconfig::insecure::client_config());
        let name =
            rustls::pki_types::ServerName::try_from(url.host.clone()).map_err(|e| err(&e))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| err(&e))?;
        send(hyper_util::rt::TokioIo::new(stream), req).await
    } else {
        send(hyper_util::rt::TokioIo::new(tcp), req).await
    }
    .map_err(|e| err(&e))?;
    let code = resp.status().as_u16();
    let location = resp
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Upstream reads at most 10 KiB of the body; the answer is decided by the code.
    let mut body = resp.into_body();
    let mut read = 0;
    while read < 10 * 1024 {
        match body.frame().await {
            Some(Ok(f)) => read += f.data_ref().map_or(0, |d| d.len()),
            _ => break,
        }
    }
    Ok((code, location))
}

async fn send<S>(
    io: hyper_util::rt::TokioIo<S>,
    req: hyper::Request<http_body_util::Empty<bytes::Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    minik8s_task::spawn("probe-connection", async move {
        let _ = conn.await;
    });
    sender.send_request(req).await
}

/// The generated gRPC health client.
mod health {
    tonic::include_proto!("grpc.health.v1");
}

/// A gRPC probe: `grpc.health.v1.Health/Check` on the pod's port, without TLS, as upstream;
/// only SERVING succeeds.
async fn grpc_check(pod_ip: &str, port: u16, service: String) -> Result<(), String> {
    use health::health_check_response::ServingStatus;
    let addr = format!("http://{pod_ip}:{port}");
    let channel = tonic::transport::Endpoint::from_shared(addr.clone())
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("failed to connect service \"{pod_ip}:{port}\" within 1s: {e}"))?;
    let mut client = health::health_client::HealthClient::new(channel);
    let resp = client
        .check(health::HealthCheckRequest { service })
        .await
        .map_err(|s| format!("rpc error: code = {:?} desc = {}", s.code(), s.message()))?;
    match ServingStatus::try_from(resp.into_inner().status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(format!(
            "service unhealthy (responded with \"{}\")",
            other.as_str_name()
        )),
        Err(_) => Err("service unhealthy (responded with \"UNKNOWN\")".into()),
    }
}

impl Kind {
    /// The probe's name as upstream's events give it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }
}

impl Probes {
    /// Runs whatever probes of container `c` (running as `container_id` since `started_ns`)
    /// are due, and says where it stands, with the failures of the probes run now.
    pub async fn check(
        &self,
        cri: &Cri,
        c: &Container,
        container_id: &str,
        started_ns: i64,
        pod_ip: &str,
    ) -> (Verdict, Vec<(Kind, String)>) {
        let mut failed = Vec::new();
        let since_start = Duration::from_nanos(
            (jiff::Timestamp::now().as_nanosecond() as i64 - started_ns).max(0) as u64,
        );
        let mut verdict = Verdict {
            started: true,
            ready: true,
            kill: false,
        };
        for (kind, probe) in [
            (Kind::Startup, &c.startup_probe),
            (Kind::Liveness, &c.liveness_probe),
            (Kind::Readiness, &c.readiness_probe),
        ] {
            let Some(p) = probe else { continue };
            if kind != Kind::Startup && !verdict.started {
                if kind == Kind::Readiness {
                    verdict.ready = false;
                }
                continue;
            }
            let key = (container_id.to_owned(), kind);
            let mut track = {
                let tracks = self.tracks.lock().expect("probe lock");
                tracks.get(&key).cloned().unwrap_or(Track {
                    container_id: container_id.to_owned(),
                    ..Default::default()
                })
            };
            // Once the startup probe has succeeded it is not run again for this container.
            let settled_startup = kind == Kind::Startup && track.ok == Some(true);
            let delay = Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64);
            let period = Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
            let due = !settled_startup
                && since_start >= delay
                && track.last.is_none_or(|l| l.elapsed() >= period);
            if due {
                let result = run_once(cri, p, c, container_id, pod_ip).await;
                let ok = result.is_ok();
                if let Err(message) = result {
                    failed.push((kind, message));
                }
                track.last = Some(Instant::now());
                if ok {
                    track.successes += 1;
                    track.failures = 0;
                    if track.successes >= p.success_threshold.unwrap_or(1).max(1) {
                        track.ok = Some(true);
                    }
                } else {
                    track.failures += 1;
                    track.successes = 0;
                    if track.failures >= p.failure_threshold.unwrap_or(3).max(1) {
                        track.ok = Some(false);
                    }
                }
            }
            match kind {
                Kind::Startup => {
                    verdict.started = track.ok == Some(true);
                    verdict.kill |= track.ok == Some(false);
                }
                Kind::Liveness => verdict.kill |= track.ok == Some(false),
                // Not ready until the readiness probe has succeeded.
                Kind::Readiness => verdict.ready = track.ok == Some(true),
            }
            self.tracks.lock().expect("probe lock").insert(key, track);
        }
        verdict.ready &= verdict.started && !verdict.kill;
        (verdict, failed)
    }

    /// Forgets the probes of containers not in `live` (container ids).
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.tracks
            .lock()
            .expect("probe lock")
            .retain(|_, t| live.contains(&t.container_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Answers each connection on `listener` with what `answer` makes of the request's head.
    async fn serve_http<S, F>(
        listener: tokio::net::TcpListener,
        wrap: F,
        answer: fn(&str) -> String,
    ) where
        F: Fn(tokio::net::TcpStream) -> S + Send + Sync + 'static,
        S: std::future::Future<Output = Option<Box<dyn Io>>> + Send,
    {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let Some(mut io) = wrap(tcp).await else {
                continue;
            };
            let mut buf = vec![0u8; 4096];
            let n = io.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            let _ = io.write_all(answer(&head).as_bytes()).await;
            let _ = io.shutdown().await;
        }
    }

    trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
    impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

    fn answer(head: &str) -> String {
        let path = head.split_whitespace().nth(1).unwrap_or("/");
        let has = |h: &str| head.to_ascii_lowercase().contains(&h.to_ascii_lowercase());
        let (code, location) = match path {
            "/ok" if has("user-agent: kube-probe/1.33") && has("accept: */*") => (200, None),
            "/custom" if has("x-check: yes") && has("user-agent: mine") => (200, None),
            "/redirect" => (302, Some("/ok")),
            "/elsewhere" => (302, Some("http://example.invalid/ok")),
            "/loop" => (302, Some("/loop")),
            _ => (500, None),
        };
        let loc = location
            .map(|l| format!("Location: {l}\r\n"))
            .unwrap_or_default();
        format!("HTTP/1.1 {code} X\r\n{loc}Content-Length: 0\r\nConnection: close\r\n\r\n")
    }

    fn url(https: bool, port: u16, path: &str) -> Url {
        Url {
            https,
            host: "127.0.0.1".into(),
            port,
            path: path.into(),
        }
    }

    #[tokio::test]
    async fn http_probes_send_upstreams_headers_follow_local_redirects_and_speak_tls() {
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = plain.local_addr().unwrap().port();
        tokio::spawn(serve_http(
            plain,
            |t| async move { Some(Box::new(t) as Box<dyn Io>) },
            answer,
        ));
        assert_eq!(http_get(url(false, p, "/ok"), &[]).await, Ok(()));
        let custom = [
            ("X-Check".into(), "yes".into()),
            ("User-Agent".into(), "mine".into()),
        ];
        assert_eq!(http_get(url(false, p, "/custom"), &custom).await, Ok(()));
        assert_eq!(http_get(url(false, p, "/redirect"), &[]).await, Ok(()));
        // A redirect to another host is not followed: its own 302 counts as success.
        assert_eq!(http_get(url(false, p, "/elsewhere"), &[]).await, Ok(()));
        assert!(
            http_get(url(false, p, "/loop"), &[])
                .await
                .unwrap_err()
                .contains("stopped after 10 redirects")
        );
        assert_eq!(
            http_get(url(false, p, "/fail"), &[]).await,
            Err("HTTP probe failed with statuscode: 500".into())
        );

        // HTTPS with a self-signed certificate: not verified, as upstream's probes.
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let t = tls.local_addr().unwrap().port();
        tokio::spawn(serve_http(
            tls,
            move |tcp| {
                let acceptor = acceptor.clone();
                async move {
                    acceptor
                        .accept(tcp)
                        .await
                        .ok()
                        .map(|s| Box::new(s) as Box<dyn Io>)
                }
            },
            answer,
        ));
        assert_eq!(http_get(url(true, t, "/ok"), &[]).await, Ok(()));
        // Plain HTTP to the TLS port fails, as it did before HTTPS probes were honoured.
        assert!(http_get(url(false, t, "/ok"), &[]).await.is_err());
    }

    struct Health(health::health_check_response::ServingStatus);

    #[tonic::async_trait]
    impl health::health_server::Health for Health {
        async fn check(
            &self,
            req: tonic::Request<health::HealthCheckRequest>,
        ) -> Result<tonic::Response<health::HealthCheckResponse>, tonic::Status> {
            if req.get_ref().service == "missing" {
                return Err(tonic::Status::not_found("unknown service"));
            }
            Ok(tonic::Response::new(health::HealthCheckResponse {
                status: self.0 as i32,
            }))
        }

        type WatchStream =
            futures::stream::Empty<Result<health::HealthCheckResponse, tonic::Status>>;

        async fn watch(
            &self,
            _: tonic::Request<health::HealthCheckRequest>,
        ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
            Err(tonic::Status::unimplemented("watch"))
        }
    }

    async fn grpc_server(status: health::health_check_response::ServingStatus) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health::health_server::HealthServer::new(Health(status)))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        port
    }

    #[tokio::test]
    async fn grpc_probes_call_the_health_service() {
        use health::health_check_response::ServingStatus;
        let serving = grpc_server(ServingStatus::Serving).await;
        assert_eq!(
            grpc_check("127.0.0.1", serving, String::new()).await,
            Ok(())
        );
        let err = grpc_check("127.0.0.1", serving, "missing".into())
            .await
            .unwrap_err();
        assert!(err.contains("NotFound"), "{err}");
        let down = grpc_server(ServingStatus::NotServing).await;
        assert_eq!(
            grpc_check("127.0.0.1", down, String::new()).await,
            Err("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        // Nothing listening: a failure, not a success.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = closed.local_addr().unwrap().port();
        drop(closed);
        assert!(grpc_check("127.0.0.1", p, String::new()).await.is_err());
    }
}

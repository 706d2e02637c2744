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

/// Runs one probe try: exec, HTTP GET (2xx/3xx is success) or TCP connect.
pub async fn run_once(
    cri: &Cri,
    p: &Probe,
    c: &Container,
    container_id: &str,
    pod_ip: &str,
) -> bool {
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(exec) = &p.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return matches!(
            tokio::time::timeout(timeout + Duration::from_secs(1), cri.exec_sync(container_id, cmd, timeout.as_secs() as i64)).await,
            Ok(Ok(r)) if r.exit_code == 0
        );
    }
    if let Some(tcp) = &p.tcp_socket {
        let host = tcp.host.clone().unwrap_or_else(|| pod_ip.to_owned());
        let Some(port) = port_of(&tcp.port, c) else {
            return false;
        };
        return matches!(
            tokio::time::timeout(
                timeout,
                tokio::net::TcpStream::connect((host.as_str(), port))
            )
            .await,
            Ok(Ok(_))
        );
    }
    if let Some(http) = &p.http_get {
        let host = http.host.clone().unwrap_or_else(|| pod_ip.to_owned());
        let Some(port) = port_of(&http.port, c) else {
            return false;
        };
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let headers: String = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| format!("{}: {}\r\n", h.name, h.value))
            .collect();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.33\r\n{headers}Connection: close\r\n\r\n"
        );
        let attempt = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .ok()?;
            s.write_all(request.as_bytes()).await.ok()?;
            let mut head = vec![0u8; 64];
            let n = s.read(&mut head).await.ok()?;
            let line = String::from_utf8_lossy(&head[..n]).into_owned();
            line.split_whitespace().nth(1)?.parse::<u16>().ok()
        };
        return matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(code)) if (200..400).contains(&code));
    }
    // A probe with no handler: nothing to fail.
    true
}

impl Probes {
    /// Runs whatever probes of container `c` (running as `container_id` since `started_ns`)
    /// are due, and says where it stands.
    pub async fn check(
        &self,
        cri: &Cri,
        c: &Container,
        container_id: &str,
        started_ns: i64,
        pod_ip: &str,
    ) -> Verdict {
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
                let ok = run_once(cri, p, c, container_id, pod_ip).await;
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
        verdict
    }

    /// Forgets the probes of containers not in `live` (container ids).
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        self.tracks
            .lock()
            .expect("probe lock")
            .retain(|_, t| live.contains(&t.container_id));
    }
}

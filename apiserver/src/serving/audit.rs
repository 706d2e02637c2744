//! The audit log: one JSON line per request (who, what, on which object, the response code,
//! the latency), written by a background task so requests never wait on the file.

use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

/// How much of each request is recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Level {
    /// Nothing.
    None,
    /// User, verb, object reference, response code and latency.
    #[default]
    Metadata,
    /// Metadata plus the request body.
    Request,
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "None" => Ok(Level::None),
            "Metadata" => Ok(Level::Metadata),
            "Request" => Ok(Level::Request),
            other => Err(format!(
                "audit level must be None, Metadata or Request, not {other:?}"
            )),
        }
    }
}

/// Where audit events go.
#[derive(Clone, Debug)]
pub struct Auditor {
    level: Level,
    tx: Option<mpsc::Sender<Value>>,
}

/// Opening the audit log failed.
#[derive(Debug, thiserror::Error)]
#[error("opening the audit log {path}")]
pub struct AuditError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// What one request did, filled in as the pipeline learns it.
#[derive(Debug, Default)]
pub struct Record {
    /// User name and groups.
    pub user: Option<(String, Vec<String>)>,
    /// `get`, `list`, `create`, … (or the HTTP verb of a non-resource request).
    pub verb: String,
    /// The object reference (group, version, resource, namespace, name, subresource).
    pub object: Option<Value>,
    /// The request body, when recorded.
    pub body: Option<Value>,
}

impl Auditor {
    /// An auditor that records nothing.
    pub fn disabled() -> Self {
        Auditor {
            level: Level::None,
            tx: None,
        }
    }

    /// Opens (appends to) the log file and starts its writer.
    pub fn open(path: &Path, level: Level) -> Result<Self, AuditError> {
        if level == Level::None {
            return Ok(Self::disabled());
        }
        use std::os::unix::fs::OpenOptionsExt;
        // Request-level events may carry secrets: owner-only.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| AuditError {
                path: path.into(),
                source,
            })?;
        let (tx, mut rx) = mpsc::channel::<Value>(4096);
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(file);
                while let Some(ev) = rx.blocking_recv() {
                    let _ = serde_json::to_writer(&mut out, &ev);
                    let _ = out.write_all(b"\n");
                    while let Ok(ev) = rx.try_recv() {
                        let _ = serde_json::to_writer(&mut out, &ev);
                        let _ = out.write_all(b"\n");
                    }
                    let _ = out.flush();
                }
            })
            .map_err(|source| AuditError {
                path: path.into(),
                source,
            })?;
        Ok(Auditor {
            level,
            tx: Some(tx),
        })
    }

    /// Whether request bodies are recorded.
    pub fn wants_body(&self) -> bool {
        self.level == Level::Request
    }

    /// Records one finished request (dropped, never blocking, if the writer is behind).
    pub fn record(&self, rec: Record, uri: &str, code: u16, started: std::time::Instant) {
        let Some(tx) = &self.tx else { return };
        let (username, groups) = rec.user.unwrap_or_default();
        let mut ev = json!({
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": if self.level == Level::Request { "Request" } else { "Metadata" },
            "auditID": uuid::Uuid::new_v4().to_string(),
            "stage": "ResponseComplete",
            "requestURI": uri,
            "verb": rec.verb,
            "user": {"username": username, "groups": groups},
            "responseStatus": {"code": code},
            "stageTimestamp": crate::object::now_micro(),
            "latencyMs": (started.elapsed().as_secs_f64() * 1e6).round() / 1e3,
        });
        if let Some(o) = rec.object {
            ev["objectRef"] = o;
        }
        if let Some(b) = rec.body {
            ev["requestObject"] = b;
        }
        let _ = tx.try_send(ev);
    }
}

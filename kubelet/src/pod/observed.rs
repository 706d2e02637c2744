//! What the runtime holds for one pod: its newest sandbox and, per container name, that
//! sandbox's containers newest first. Read from the CRI on every pass, so a restarted kubelet
//! sees exactly what its predecessor left.

use crate::cri::{self, Cri, labels};
use crate::error::Result;
use std::collections::HashMap;

/// A container's state as the runtime reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Run {
    /// Created, not started.
    Created,
    /// Running since `started` (ns since the epoch).
    Running {
        /// Start time.
        started: i64,
    },
    /// Exited.
    Exited {
        /// Exit code.
        code: i32,
        /// The runtime's reason (`Completed`, `Error`, `OOMKilled`).
        reason: String,
        /// Start time (ns since the epoch).
        started: i64,
        /// Exit time (ns since the epoch).
        finished: i64,
        /// The termination message (its file, or the log's tail when the policy says so).
        message: String,
    },
    /// Unknown to the runtime's state machine.
    Unknown,
}

/// Annotation naming where a container's termination message is written (upstream's).
pub const TERMINATION_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Annotation holding a container's termination message policy (upstream's).
pub const TERMINATION_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";

/// Most bytes of a termination message read from its file (upstream's 4096).
const MAX_MESSAGE: usize = 4096;
/// Most log lines and bytes a FallbackToLogsOnError message takes (upstream's 80 and 2048).
const FALLBACK_LINES: usize = 80;
const FALLBACK_BYTES: usize = 2048;

/// An exited container's termination message, as upstream's `getTerminationMessage`: the
/// file mounted at its terminationMessagePath, else (FallbackToLogsOnError, on failure) the
/// tail of its log.
fn termination_message(s: &cri::ContainerStatus) -> String {
    let path = s
        .annotations
        .get(TERMINATION_PATH)
        .cloned()
        .unwrap_or_default();
    let mut message = String::new();
    if !path.is_empty()
        && let Some(m) = s.mounts.iter().find(|m| m.container_path == path)
        && let Ok(bytes) = std::fs::read(&m.host_path)
    {
        let bytes = &bytes[..bytes.len().min(MAX_MESSAGE)];
        message = String::from_utf8_lossy(bytes).into_owned();
    }
    let fallback =
        s.annotations.get(TERMINATION_POLICY).map(String::as_str) == Some("FallbackToLogsOnError");
    if message.is_empty() && fallback && s.exit_code != 0 && !s.log_path.is_empty() {
        message = log_tail(&s.log_path);
    }
    message
}

/// The last lines of a CRI log file (`<time> <stream> <tag> <text>` lines), as text.
fn log_tail(path: &str) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(FALLBACK_LINES);
    let mut out = String::new();
    for line in &lines[start..] {
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, msg) = (parts.next(), parts.next(), parts.next(), parts.next());
        out.push_str(msg.unwrap_or_default());
        // A partial line (`P`) continues on the next one.
        if tag != Some("P") {
            out.push('\n');
        }
    }
    if out.len() > FALLBACK_BYTES {
        let mut cut = out.len() - FALLBACK_BYTES;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out = out[cut..].to_owned();
    }
    out
}

/// One container of the pod's sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRun {
    /// Runtime id.
    pub id: String,
    /// Attempt (= restarts before it).
    pub attempt: u32,
    /// Its state.
    pub run: Run,
    /// The image's digest reference.
    pub image_ref: String,
}

/// The pod's sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sandbox {
    /// Runtime id.
    pub id: String,
    /// Attempt.
    pub attempt: u32,
    /// Whether its network namespace is up.
    pub ready: bool,
    /// The pod IP.
    pub ip: Option<String>,
}

/// The runtime's view of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The newest sandbox.
    pub sandbox: Option<Sandbox>,
    /// Sandboxes older than the newest (to remove).
    pub old_sandboxes: Vec<String>,
    /// Containers of the newest sandbox by spec name, newest first.
    pub containers: HashMap<String, Vec<ContainerRun>>,
}

impl Observed {
    /// The newest container named `name`.
    pub fn latest(&self, name: &str) -> Option<&ContainerRun> {
        self.containers.get(name).and_then(|c| c.first())
    }

    /// The container before the newest (for `lastState`).
    pub fn previous(&self, name: &str) -> Option<&ContainerRun> {
        self.containers.get(name).and_then(|c| c.get(1))
    }

    /// Reads the pod `uid`'s sandboxes and containers from the runtime.
    pub async fn read(cri: &Cri, uid: &str) -> Result<Self> {
        let by_uid = HashMap::from([(labels::POD_UID.to_owned(), uid.to_owned())]);
        let mut sandboxes = cri.sandboxes(by_uid.clone()).await?;
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let mut observed = Observed::default();
        let Some(newest) = sandboxes.first() else {
            return Ok(observed);
        };
        observed.old_sandboxes = sandboxes[1..].iter().map(|s| s.id.clone()).collect();
        let ready = newest.state == cri::PodSandboxState::SandboxReady as i32;
        let ip = if ready {
            cri.sandbox_status(&newest.id)
                .await?
                .and_then(|s| s.network)
                .map(|n| n.ip)
                .filter(|ip| !ip.is_empty())
        } else {
            None
        };
        observed.sandbox = Some(Sandbox {
            id: newest.id.clone(),
            attempt: newest.metadata.as_ref().map_or(0, |m| m.attempt),
            ready,
            ip,
        });
        let mut containers = cri.containers(by_uid).await?;
        containers.retain(|c| c.pod_sandbox_id == newest.id);
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        for c in containers {
            let Some(name) = c.labels.get(labels::CONTAINER_NAME).cloned() else {
                continue;
            };
            // The status has the image's repo digest (`name@sha256:…`) where the list has
            // only its id.
            let mut image_ref = c.image_ref;
            let run = if c.state == cri::ContainerState::ContainerExited as i32
                || c.state == cri::ContainerState::ContainerRunning as i32
            {
                match cri.container_status(&c.id).await? {
                    Some(s) => {
                        if !s.image_ref.is_empty() {
                            image_ref = s.image_ref.clone();
                        }
                        if c.state == cri::ContainerState::ContainerRunning as i32 {
                            Run::Running {
                                started: s.started_at,
                            }
                        } else {
                            Run::Exited {
                                code: s.exit_code,
                                message: termination_message(&s),
                                reason: s.reason,
                                started: s.started_at,
                                finished: s.finished_at,
                            }
                        }
                    }
                    None if c.state == cri::ContainerState::ContainerRunning as i32 => {
                        Run::Running { started: 0 }
                    }
                    None => Run::Unknown,
                }
            } else if c.state == cri::ContainerState::ContainerCreated as i32 {
                Run::Created
            } else {
                Run::Unknown
            };
            observed
                .containers
                .entry(name)
                .or_default()
                .push(ContainerRun {
                    id: c.id,
                    attempt: c.metadata.map_or(0, |m| m.attempt),
                    run,
                    image_ref,
                });
        }
        Ok(observed)
    }
}

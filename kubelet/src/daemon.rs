//! The node's helper daemons (containerd, the local registry): each runs in its own process
//! group with its pid in a file, so a restarted kubelet adopts it instead of starting another,
//! and `down` can stop it.

use crate::error::{Error, Result, io};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Writes `text` to `path`, making its folder first.
pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    std::fs::write(path, text).map_err(io(path))
}

/// Whether process `pid` lives (and is not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// The live process named `comm` whose pid `pid_file` holds, if any.
pub(crate) fn adopt(pid_file: &Path, comm: &str) -> Option<u32> {
    let pid = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()?;
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    // `comm` is cut at 15 bytes.
    (alive(pid) && comm.starts_with(name.trim())).then_some(pid)
}

/// Starts `cmd` in its own process group (a Ctrl-C meant for the kubelet does not reach it)
/// with its output in `log`, records its pid in `pid_file` and reaps it when it exits.
pub(crate) fn spawn(mut cmd: std::process::Command, log: &Path, pid_file: &Path) -> Result<u32> {
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let out = std::fs::File::create(log).map_err(io(log))?;
    let err = out.try_clone().map_err(io(log))?;
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Daemon(format!("starting {:?}: {e}", cmd.get_program())))?;
    let pid = child.id();
    write(pid_file, &pid.to_string())?;
    std::thread::Builder::new()
        .name(format!("reap-{pid}"))
        .spawn(move || {
            let mut child = child;
            let _ = child.wait();
        })
        .map_err(|e| Error::Daemon(format!("reaper thread: {e}")))?;
    Ok(pid)
}

async fn signal(pid: u32, sig: &str) {
    let _ = tokio::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .await;
}

/// Why a daemon did not come up.
pub(crate) enum NotReady {
    /// It exited.
    Exited,
    /// It did not answer within the limit.
    Late,
}

/// Polls `ready` every 50 ms until it says yes, process `pid` exits, or `limit` passes.
pub(crate) async fn wait_ready<F: Future<Output = bool>>(
    pid: u32,
    limit: Duration,
    mut ready: impl FnMut() -> F,
) -> std::result::Result<(), NotReady> {
    let start = std::time::Instant::now();
    loop {
        if ready().await {
            return Ok(());
        }
        if !alive(pid) {
            return Err(NotReady::Exited);
        }
        if start.elapsed() > limit {
            return Err(NotReady::Late);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops process `pid` (SIGTERM, then SIGKILL after 10 s) and removes its pid file.
pub(crate) async fn stop(pid: u32, pid_file: PathBuf) {
    signal(pid, "-TERM").await;
    for _ in 0..200 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if alive(pid) {
        signal(pid, "-KILL").await;
    }
    let _ = std::fs::remove_file(pid_file);
}

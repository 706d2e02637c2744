//! The node's local OCI registry: Debian's `docker-registry` on loopback, with its storage
//! under the cluster's folder. Images pushed there are pulled by containerd through the CRI's
//! `PullImage`, as from any registry; the runtime sends `docker.io`, `registry.k8s.io` and `ghcr.io`
//! pulls to it (see [`crate::containerd::MIRRORED`]), so `busybox` resolves to the local copy.
//! Like containerd, a registry left running from the same folder is adopted.

use crate::containerd::MIRRORED;
use crate::daemon;
use crate::error::{Error, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where `hack/install-deps.sh --node` unpacks Debian's `docker-registry` (unpacked rather than
/// installed, so no system registry service starts on :5000).
pub const INSTALLED_BINARY: &str = "/opt/minik8s/docker-registry/usr/bin/docker-registry";

/// The registry binary: `$MINIK8S_REGISTRY_BIN`, the unpacked package, or `docker-registry` on
/// the PATH.
pub fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MINIK8S_REGISTRY_BIN") {
        return Some(p.into());
    }
    if Path::new(INSTALLED_BINARY).exists() {
        return Some(INSTALLED_BINARY.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("docker-registry"))
            .find(|p| p.exists())
    })
}

/// Where a reference lives in the mirror (its registry host dropped), if its registry is one
/// the node mirrors: `docker.io/library/busybox:latest` → `library/busybox:latest`.
pub fn mirror_path(reference: &str) -> Option<String> {
    let (host, rest) = reference.split_once('/')?;
    if !MIRRORED.contains(&host) {
        return None;
    }
    let rest = if host == "docker.io" && !rest.contains('/') {
        format!("library/{rest}")
    } else {
        rest.to_owned()
    };
    Some(rest)
}

/// A running registry, started here or adopted.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    addr: SocketAddr,
    pid: u32,
}

impl Registry {
    /// Starts the registry serving `addr` (loopback) with its data in `dir`, or adopts the one
    /// already serving from `dir`, and waits until it answers.
    pub async fn start(dir: &Path, addr: SocketAddr) -> Result<Self> {
        if !addr.ip().is_loopback() {
            return Err(Error::Registry(format!(
                "{addr}: the local registry listens on loopback only"
            )));
        }
        let pid_file = dir.join("registry.pid");
        let pid = match daemon::adopt(&pid_file, "docker-registry") {
            Some(pid) => pid,
            None => {
                let bin = binary().ok_or_else(|| {
                    Error::Registry(
                        "docker-registry is missing: run hack/install-deps.sh --node".into(),
                    )
                })?;
                let config = dir.join("config.yml");
                daemon::write(
                    &config,
                    &format!(
                        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                         http:\n  addr: {addr}\n",
                        dir.join("data").display()
                    ),
                )?;
                let mut cmd = std::process::Command::new(bin);
                cmd.arg("serve").arg(&config);
                let pid = daemon::spawn(cmd, &dir.join("registry.log"), &pid_file)?;
                tracing::info!(pid, %addr, "started the local registry");
                pid
            }
        };
        let me = Registry {
            dir: dir.to_owned(),
            addr,
            pid,
        };
        me.wait_ready(Duration::from_secs(20)).await?;
        Ok(me)
    }

    async fn wait_ready(&self, limit: Duration) -> Result<()> {
        daemon::wait_ready(self.pid, limit, || answers(self.addr))
            .await
            .map_err(|why| {
                Error::Registry(match why {
                    daemon::NotReady::Exited => {
                        format!("it exited; see {}", self.dir.join("registry.log").display())
                    }
                    daemon::NotReady::Late => {
                        format!("{} not answering after {limit:?}", self.addr)
                    }
                })
            })
    }

    /// Where it listens (`127.0.0.1:PORT`), the runtime's mirror address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Pushes every tagged image of a docker archive whose registry is mirrored; returns the
    /// references pushed (none: the archive has no mirrored tag and must be imported).
    pub async fn push(&self, archive: &Path) -> Result<Vec<String>> {
        let mut pushed = Vec::new();
        for reference in archive_tags(archive).await? {
            let Some(path) = mirror_path(&reference) else {
                continue;
            };
            self.copy(
                &format!("docker-archive:{}:{reference}", archive.display()),
                &path,
            )
            .await?;
            pushed.push(reference);
        }
        Ok(pushed)
    }

    /// Copies image `source` (any skopeo transport) to `path` (`repo:tag`) in this registry.
    pub async fn copy(&self, source: &str, path: &str) -> Result<()> {
        let out = tokio::process::Command::new("skopeo")
            .args(["copy", "-q", "--dest-tls-verify=false", source])
            .arg(format!("docker://{}/{path}", self.addr))
            .output()
            .await
            .map_err(|e| Error::Registry(format!("running skopeo: {e}")))?;
        if !out.status.success() {
            return Err(Error::Registry(format!(
                "pushing {source} as {path}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Stops the registry; its images stay in its folder.
    pub async fn stop(self) {
        daemon::stop(self.pid, self.dir.join("registry.pid")).await;
    }
}

/// Starts (or adopts) the registry in `dir` on `addr` and pushes `archives` to it; returns it
/// with the archives it could not take (no mirrored tag), which the node imports instead.
pub async fn publish(
    dir: &Path,
    addr: SocketAddr,
    archives: &[PathBuf],
) -> Result<(Registry, Vec<PathBuf>)> {
    let registry = Registry::start(dir, addr).await?;
    let mut rest = Vec::new();
    for archive in archives {
        if registry.push(archive).await?.is_empty() {
            rest.push(archive.clone());
        }
    }
    Ok((registry, rest))
}

/// Stops the registry serving from `dir`, if one runs.
pub async fn stop_in(dir: &Path) {
    let pid_file = dir.join("registry.pid");
    if let Some(pid) = daemon::adopt(&pid_file, "docker-registry") {
        daemon::stop(pid, pid_file).await;
    }
}

/// Whether a registry answers `GET /v2/` at `addr`.
async fn answers(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr)).await
    else {
        return false;
    };
    let req = format!("GET /v2/ HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut head))
        .await
        .is_ok_and(|r| r.is_ok())
        && head.ends_with(b"200")
}

/// The `RepoTags` of a docker archive (its `manifest.json`).
pub async fn archive_tags(archive: &Path) -> Result<Vec<String>> {
    let out = tokio::process::Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("manifest.json")
        .output()
        .await
        .map_err(|e| Error::Registry(format!("running tar: {e}")))?;
    if !out.status.success() {
        // Not a docker archive (an OCI tar, say): nothing to push.
        return Ok(Vec::new());
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(rename = "RepoTags", default)]
        repo_tags: Option<Vec<String>>,
    }
    let entries: Vec<Entry> = serde_json::from_slice(&out.stdout)
        .map_err(|e| Error::Registry(format!("{}: manifest.json: {e}", archive.display())))?;
    Ok(entries
        .into_iter()
        .flat_map(|e| e.repo_tags.unwrap_or_default())
        .map(|t| normalize(&t))
        .collect())
}

/// The full form of an image reference: `busybox` → `docker.io/library/busybox:latest`.
pub fn normalize(reference: &str) -> String {
    let (name, tag) = match reference.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n.to_owned(), format!(":{t}")),
        _ => (reference.to_owned(), ":latest".to_owned()),
    };
    let first = name.split('/').next().unwrap_or_default();
    let has_host =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let name = if has_host {
        name
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    };
    format!("{name}{tag}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_normalize_and_map_into_the_mirror() {
        assert_eq!(normalize("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalize("me/app:v1"), "docker.io/me/app:v1");
        assert_eq!(normalize("127.0.0.1:5000/web"), "127.0.0.1:5000/web:latest");
        assert_eq!(
            mirror_path("docker.io/library/busybox:latest").as_deref(),
            Some("library/busybox:latest")
        );
        assert_eq!(
            mirror_path("registry.k8s.io/pause:3.9-local").as_deref(),
            Some("pause:3.9-local")
        );
        assert_eq!(mirror_path("quay.io/x/y:1"), None);
    }
}

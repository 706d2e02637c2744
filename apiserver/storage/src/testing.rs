//! Test and benchmark helpers: a private etcd server (from Debian's `etcd-server` package)
//! started on free loopback ports with a temporary data folder, stopped on drop.

use crate::{Error, Etcd, Result};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The script that installs the etcd this harness needs.
pub const INSTALL_HINT: &str =
    "run `hack/install-deps.sh` (as root) to install Debian's etcd-server";

/// A private etcd server for one test or benchmark.
pub struct TestEtcd {
    child: Child,
    /// The client URL (`http://127.0.0.1:PORT`).
    pub url: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
        what: "finding a free loopback port".into(),
        source,
    })?;
    Ok(listener.local_addr().expect("bound").port())
}

/// Finds the etcd binary: `$ETCD_BIN`, then `etcd` on the PATH, then `/usr/bin/etcd`.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("ETCD_BIN") {
        return Some(bin.into());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

impl TestEtcd {
    /// Starts etcd and waits until it answers; fails (naming the install script) if etcd is
    /// not installed.
    pub async fn start() -> Result<Self> {
        let bin = etcd_binary().ok_or_else(|| Error::Io {
            what: format!("etcd is not installed: {INSTALL_HINT}"),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?;
        let dir = tempfile::tempdir().map_err(|source| Error::Io {
            what: "creating etcd's data folder".into(),
            source,
        })?;
        let (client, peer) = (free_port()?, free_port()?);
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&bin)
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .arg("--log-level=error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| Error::Io {
                what: format!("starting {}", bin.display()),
                source,
            })?;
        let etcd = TestEtcd {
            child,
            url,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match Etcd::connect(std::slice::from_ref(&etcd.url)).await {
                Ok(_) => return Ok(etcd),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// A client of this server.
    pub async fn connect(&self) -> Result<Etcd> {
        Etcd::connect(std::slice::from_ref(&self.url)).await
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

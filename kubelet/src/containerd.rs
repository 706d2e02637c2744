//! A private containerd for one node: its config (root, state, socket and runc state under the
//! node's folder, the CNI bridge conflist), the process itself, and image import. A containerd
//! left running by an earlier kubelet of the same folder is adopted, not restarted, so its pods
//! keep running across kubelet restarts.

use crate::cri::{Cri, socket_in};
use crate::daemon;
use crate::error::{Error, Result, io};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The runtime of one node.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The node's runtime folder (root, state, socket, CNI config, IPAM state).
    pub dir: PathBuf,
    /// The CNI bridge's name (at most 15 bytes).
    pub bridge: String,
    /// The node's pod subnet, e.g. `10.244.0.0/24`.
    pub pod_cidr: String,
    /// The sandbox (pause) image.
    pub sandbox_image: String,
    /// Where `docker.io` and `registry.k8s.io` images are pulled from instead (a loopback
    /// registry, `127.0.0.1:PORT`), if anywhere.
    pub registry_mirror: Option<String>,
}

impl RuntimeConfig {
    /// A node runtime in `dir` with the default bridge and subnet.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            dir: dir.into(),
            bridge: "mk8s0".into(),
            pod_cidr: "10.244.0.0/24".into(),
            sandbox_image: PAUSE_IMAGE.into(),
            registry_mirror: None,
        }
    }

    fn config_toml(&self) -> String {
        let d = self.dir.display();
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{d}/containerd.sock"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{image}"
    netns_mounts_under_state_dir = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_unprivileged_ports = true
    enable_unprivileged_icmp = true
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{d}/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "{d}/runc"
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "{d}/certs.d"
"#,
            image = self.sandbox_image
        )
    }

    /// Removes this node's bridge when it exists but the node has handed out no pod address
    /// (no IPAM state): a node that was killed rather than torn down left it, with its pods'
    /// interfaces still attached, and the addresses this node hands out again would collide
    /// with theirs. A restarted node keeps its IPAM state, so its bridge and pods stay.
    async fn clear_stale_bridge(&self) {
        if self.dir.join("ipam").exists()
            || !Path::new("/sys/class/net").join(&self.bridge).exists()
        {
            return;
        }
        tracing::warn!(bridge = %self.bridge, "removing a bridge left by a node that was not torn down");
        quiet("ip", &["link", "del", &self.bridge]).await;
    }

    fn conflist(&self) -> String {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": format!("pods-{}", self.bridge),
            "plugins": [
                {"type": "bridge", "bridge": self.bridge, "isGateway": true, "ipMasq": false,
                 "hairpinMode": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_cidr}]],
                          "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": self.dir.join("ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        })
        .to_string()
    }
}

/// The registries whose images the node pulls from its local mirror when it has one (GitHub's
/// holds Knative's sample images).
pub const MIRRORED: [&str; 3] = ["docker.io", "registry.k8s.io", "ghcr.io"];

/// containerd's hosts file sending one registry's pulls to the loopback `mirror` only (no
/// fallback to the internet).
fn hosts_toml(mirror: &str) -> String {
    format!(
        "server = \"http://{mirror}\"\n[host.\"http://{mirror}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// The sandbox image built by `hack/images.sh`.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.9-local";

/// A running containerd, started here (stopped by [`Containerd::stop`]) or adopted.
#[derive(Debug)]
pub struct Containerd {
    dir: PathBuf,
    pid: u32,
}

impl Containerd {
    /// Writes the configuration and starts containerd (or adopts the one already serving
    /// this folder), then waits until its CRI answers ready.
    pub async fn start(cfg: &RuntimeConfig) -> Result<Self> {
        let dir = &cfg.dir;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        // Read at each pull, so an adopted runtime follows too.
        if let Some(mirror) = &cfg.registry_mirror {
            for registry in MIRRORED {
                daemon::write(
                    &dir.join(format!("certs.d/{registry}/hosts.toml")),
                    &hosts_toml(mirror),
                )?;
            }
        }
        let pid_file = dir.join("containerd.pid");
        let pid = match daemon::adopt(&pid_file, "containerd") {
            Some(pid) => {
                tracing::info!(pid, dir = %dir.display(), "adopting the running containerd");
                pid
            }
            None => {
                cfg.clear_stale_bridge().await;
                daemon::write(&dir.join("config.toml"), &cfg.config_toml())?;
                daemon::write(&dir.join("net.d/10-pods.conflist"), &cfg.conflist())?;
                let _ = std::fs::remove_file(socket_in(dir));
                let mut cmd = std::process::Command::new("containerd");
                cmd.arg("--config").arg(dir.join("config.toml"));
                let pid = daemon::spawn(cmd, &dir.join("containerd.log"), &pid_file)?;
                tracing::info!(pid, dir = %dir.display(), "started containerd");
                pid
            }
        };
        let me = Containerd {
            dir: dir.clone(),
            pid,
        };
        me.wait_ready(Duration::from_secs(30)).await?;
        Ok(me)
    }

    async fn wait_ready(&self, limit: Duration) -> Result<()> {
        let socket = self.socket();
        daemon::wait_ready(self.pid, limit, || async {
            match Cri::connect(&socket).await {
                Ok(cri) => cri.ready().await.unwrap_or(false),
                Err(_) => false,
            }
        })
        .await
        .map_err(|why| {
            Error::Containerd(match why {
                daemon::NotReady::Exited => format!(
                    "containerd exited; see {}",
                    self.dir.join("containerd.log").display()
                ),
                daemon::NotReady::Late => format!("containerd not ready after {limit:?}"),
            })
        })
    }

    /// The CRI socket.
    pub fn socket(&self) -> PathBuf {
        socket_in(&self.dir)
    }

    /// Imports an image archive (docker-archive or OCI tar) into the `k8s.io` namespace.
    pub async fn import(&self, archive: &Path) -> Result<()> {
        let out = tokio::process::Command::new("ctr")
            .arg("-a")
            .arg(self.socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .await
            .map_err(|e| Error::Containerd(format!("running ctr: {e}")))?;
        if !out.status.success() {
            return Err(Error::Containerd(format!(
                "importing {}: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Stops containerd (SIGTERM, then SIGKILL after 10 s). Pods' shims outlive it.
    pub async fn stop(self) {
        daemon::stop(self.pid, self.dir.join("containerd.pid")).await;
    }
}

/// Runs a command for its effect only (a missing link or mount is no error here).
pub(crate) async fn quiet(cmd: &str, args: &[&str]) {
    let _ = tokio::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
}

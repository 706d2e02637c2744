//! Tearing a node down: every pod sandbox it made, its containerd, its bridge, its cgroups and
//! mounts, its IPAM state and its hold on the traffic guard. What `minik8s down` and the test
//! harness call; running it twice is harmless.

use crate::Config;
use crate::containerd::{Containerd, quiet};
use crate::cri::{Cri, labels};
use crate::error::Result;
use std::collections::HashMap;
use std::path::Path;

/// Removes a cgroup folder tree (deepest first) in every v1 hierarchy and the v2 root.
fn remove_cgroups(root: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let top = h.path().join(root.trim_start_matches('/'));
        remove_tree(&top);
        // The now empty parents we made (`/minik8s`).
        if let Some(parent) = top.parent()
            && parent != h.path()
        {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Stops and removes everything the node made.
pub async fn down(cfg: &Config) -> Result<()> {
    crate::routes::flush().await;
    let socket = crate::cri::socket_in(&cfg.runtime.dir);
    if socket.exists()
        && let Ok(runtime) = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            Containerd::start(&cfg.runtime),
        )
        .await
        && let Ok(runtime) = runtime
    {
        if let Ok(cri) = Cri::connect(&runtime.socket()).await {
            let mine = HashMap::from([(labels::NODE.to_owned(), cfg.node_name.clone())]);
            for s in cri.sandboxes(mine).await.unwrap_or_default() {
                let _ = cri.stop_sandbox(&s.id).await;
                let _ = cri.remove_sandbox(&s.id).await;
            }
        }
        runtime.stop().await;
    }
    // Mounts under the node's folder (tmpfs volumes, leftover netns or shm).
    let prefix = cfg.root.display().to_string();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(1).map(str::to_owned))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        quiet("umount", &["-l", &m]).await;
    }
    quiet("ip", &["link", "del", &cfg.runtime.bridge]).await;
    remove_cgroups(&cfg.cgroup_root);
    let _ = std::fs::remove_dir_all(cfg.runtime.dir.join("ipam"));
    let _ = std::fs::remove_dir_all(cfg.root.join("pods"));
    let _ = std::fs::remove_dir_all(cfg.root.join("logs"));
    crate::netguard::release(&cfg.node_name).await?;
    Ok(())
}

/// What of the node is still there: its bridge, cgroups, mounts, network namespaces, runtime
/// process, and (when no other node holds it) the guard chain. Empty after [`down`].
pub async fn leftovers(cfg: &Config) -> Vec<String> {
    let mut left = Vec::new();
    if Path::new("/sys/class/net")
        .join(&cfg.runtime.bridge)
        .exists()
    {
        left.push(format!("bridge {}", cfg.runtime.bridge));
    }
    if let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") {
        for h in hierarchies.flatten() {
            let dir = h.path().join(cfg.cgroup_root.trim_start_matches('/'));
            if dir.exists() {
                left.push(format!("cgroup {}", dir.display()));
            }
        }
    }
    let prefix = cfg.root.display().to_string();
    for m in std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
    {
        if let Some(point) = m.split(' ').nth(1)
            && point.starts_with(&prefix)
        {
            left.push(format!("mount {point}"));
        }
    }
    let netns = cfg
        .runtime
        .dir
        .join("state/io.containerd.grpc.v1.cri/netns");
    if std::fs::read_dir(&netns).is_ok_and(|mut d| d.next().is_some()) {
        left.push(format!("network namespaces in {}", netns.display()));
    }
    let pid = std::fs::read_to_string(cfg.runtime.dir.join("containerd.pid")).unwrap_or_default();
    if !pid.trim().is_empty() && Path::new("/proc").join(pid.trim()).exists() {
        left.push(format!("containerd process {}", pid.trim()));
    }
    if crate::netguard::held_by_none() {
        let out = tokio::process::Command::new("iptables-save").output().await;
        if let Ok(o) = out {
            let saved = String::from_utf8_lossy(&o.stdout);
            for chain in crate::netguard::CHAINS {
                if saved.contains(chain) {
                    left.push(format!("iptables chain {chain}"));
                }
            }
        }
        if crate::netguard::forward_saved() {
            left.push("net.ipv4.ip_forward not put back".into());
        }
    }
    left
}

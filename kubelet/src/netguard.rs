//! Guard rules that keep pod and service traffic on the machine: whatever the proxy does (or
//! fails to do), packets to the pod or service ranges never leave through an interface other
//! than loopback and the cluster's own bridges and veths. Each node holding the guard leaves a
//! mark file with its process id; the rules go when the last mark does. A mark whose process
//! is gone (a node SIGKILLed and never brought back) holds nothing.
//!
//! Beside the guard, the forward chain accepts pod traffic at the end of `FORWARD`, as
//! flannel's rules do: a running Docker sets the `FORWARD` policy to `DROP` (and loads
//! `br_netfilter`, so even traffic between two pods of one bridge passes `FORWARD`), and pods
//! must still reach each other, Services and other nodes' pods beside it. Appended, so the
//! rules before it (the guard, the proxy's `KUBE-FORWARD`, Docker's own) still come first.

use crate::error::{Error, Result, io};
use std::path::{Path, PathBuf};

/// The pod range every node's subnet is cut from.
pub const POD_RANGE: &str = "10.244.0.0/16";
/// The service range.
pub const SERVICE_RANGE: &str = "10.96.0.0/12";
/// Prefix of the bridges nodes create.
pub const BRIDGE_PREFIX: &str = "mk8s";
const CHAIN: &str = "MINIK8S-GUARD";
/// The chain that accepts pod traffic whatever the `FORWARD` policy.
const FORWARD_CHAIN: &str = "MINIK8S-FORWARD";
/// Every chain the guard writes (gone when the last node is).
pub const CHAINS: [&str; 2] = [CHAIN, FORWARD_CHAIN];
const MARKS: &str = "/run/minik8s/guard";
/// `net.ipv4.ip_forward` as it was before the first node (the CNI bridge turns it on).
const SAVED_FORWARD: &str = "/run/minik8s/ip_forward";
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// The `iptables-restore` input that (re)writes the guard chain.
pub fn rules() -> String {
    rules_with(&[])
}

/// The guard with exceptions: pod blocks of other nodes (`destination`, `device`) that this
/// node routes to over the node network.
pub fn rules_with(routes: &[(String, String)]) -> String {
    let mut out = String::new();
    for table in ["mangle", "filter"] {
        out.push_str(&format!("*{table}\n:{CHAIN} - [0:0]\n"));
        for iface in ["lo", &format!("{BRIDGE_PREFIX}+"), "veth+", "cni+"] {
            out.push_str(&format!("-A {CHAIN} -o {iface} -j RETURN\n"));
        }
        for (dst, dev) in routes {
            out.push_str(&format!(
                "-A {CHAIN} -d {dst} -o {dev} -m comment --comment \"minik8s: another node's pods\" -j RETURN\n"
            ));
        }
        for range in [POD_RANGE, SERVICE_RANGE] {
            out.push_str(&format!(
                "-A {CHAIN} -d {range} -m comment --comment \"minik8s: cluster traffic stays on this machine\" -j DROP\n"
            ));
        }
        if table == "filter" {
            out.push_str(&format!(":{FORWARD_CHAIN} - [0:0]\n"));
            for dir in ["-s", "-d"] {
                out.push_str(&format!(
                    "-A {FORWARD_CHAIN} {dir} {POD_RANGE} -m comment --comment \"minik8s: pod traffic is forwarded whatever the policy\" -j ACCEPT\n"
                ));
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

async fn iptables(args: &[&str], input: Option<&str>) -> Result<bool> {
    use tokio::io::AsyncWriteExt;
    let program = if input.is_some() {
        "iptables-restore"
    } else {
        "iptables"
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(io(program))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    if let Some(text) = input {
        stdin
            .write_all(text.as_bytes())
            .await
            .map_err(io(program))?;
    }
    drop(stdin);
    let out = child.wait_with_output().await.map_err(io(program))?;
    Ok(out.status.success())
}

/// The jumps into the guard chains: (table, hook chain, chain, where: `-I` first or `-A` last).
const HOOKS: [(&str, &str, &str, &str); 3] = [
    ("mangle", "POSTROUTING", CHAIN, "-I"),
    ("filter", "FORWARD", CHAIN, "-I"),
    ("filter", "FORWARD", FORWARD_CHAIN, "-A"),
];

/// Installs the guard (idempotent) and marks `holder` as holding it.
pub async fn install(holder: &str) -> Result<()> {
    if held_by_none()
        && !Path::new(SAVED_FORWARD).exists()
        && let Ok(value) = std::fs::read_to_string(IP_FORWARD)
    {
        std::fs::create_dir_all(MARKS).map_err(io(MARKS))?;
        std::fs::write(SAVED_FORWARD, value).map_err(io(SAVED_FORWARD))?;
    }
    if !iptables(&["--noflush", "-w"], Some(&rules())).await? {
        return Err(Error::Pod(
            "iptables-restore refused the guard rules".into(),
        ));
    }
    for (table, hook, chain, at) in HOOKS {
        let jump = ["-w", "-t", table, "-C", hook, "-j", chain];
        if !iptables(&jump, None).await? {
            let mut add = vec!["-w", "-t", table, at, hook];
            if at == "-I" {
                add.push("1");
            }
            add.extend(["-j", chain]);
            iptables(&add, None).await?;
        }
    }
    std::fs::create_dir_all(MARKS).map_err(io(MARKS))?;
    let mark = mark(holder);
    std::fs::write(&mark, std::process::id().to_string()).map_err(io(&mark))?;
    Ok(())
}

/// Rewrites the guard so traffic to other nodes' pods may leave through the node network
/// (`routes`: destination block and device), as the node's routes send it.
pub async fn allow_routes(routes: &[(String, String)]) -> Result<()> {
    if iptables(&["--noflush", "-w"], Some(&rules_with(routes))).await? {
        Ok(())
    } else {
        Err(Error::Pod(
            "iptables-restore refused the guard rules".into(),
        ))
    }
}

fn mark(holder: &str) -> PathBuf {
    Path::new(MARKS).join(holder.replace('/', "_"))
}

/// Whether an `ip_forward` value waits to be put back.
pub fn forward_saved() -> bool {
    Path::new(SAVED_FORWARD).exists()
}

/// Whether no node holds the guard now (marks of processes that are gone hold nothing).
pub fn held_by_none() -> bool {
    std::fs::read_dir(MARKS).map_or(true, |d| {
        !d.flatten()
            .any(|m| std::fs::read_to_string(m.path()).is_ok_and(|pid| alive(&pid)))
    })
}

/// Whether the process of a mark's id still runs.
fn alive(pid: &str) -> bool {
    let pid = pid.trim();
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && Path::new("/proc").join(pid).exists()
}

/// Drops `holder`'s mark and those of processes that are gone; removes the rules (and puts
/// `ip_forward` back) when no holder is left.
pub async fn release(holder: &str) -> Result<()> {
    let _ = std::fs::remove_file(mark(holder));
    for m in std::fs::read_dir(MARKS).into_iter().flatten().flatten() {
        if !std::fs::read_to_string(m.path()).is_ok_and(|pid| alive(&pid)) {
            let _ = std::fs::remove_file(m.path());
        }
    }
    if !held_by_none() {
        return Ok(());
    }
    for (table, hook, chain, _) in HOOKS {
        while iptables(&["-w", "-t", table, "-D", hook, "-j", chain], None).await? {}
        iptables(&["-w", "-t", table, "-F", chain], None).await?;
        iptables(&["-w", "-t", table, "-X", chain], None).await?;
    }
    if let Ok(value) = std::fs::read_to_string(SAVED_FORWARD) {
        std::fs::write(IP_FORWARD, value).map_err(io(IP_FORWARD))?;
        let _ = std::fs::remove_file(SAVED_FORWARD);
    }
    Ok(())
}

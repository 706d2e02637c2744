//! Routes to the other nodes' pods: for every other Node with a `spec.podCIDR` and an
//! `InternalIP`, a host route `<podCIDR> via <InternalIP>` (tagged with our own routing
//! protocol number, so they are told apart from everyone else's and removed by `down`).
//!
//! This is direct routing, as flannel's `host-gw` backend: it needs the nodes on one L2
//! network, each reaching the others' InternalIPs without a router. Nodes across routers
//! need those routes in the routers (BGP, as Calico does) or an overlay (VXLAN, as flannel's
//! default) instead.

use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The routing protocol number our routes carry (`ip route … proto 77`).
pub const PROTO: &str = "77";

/// The routes this node wants: each other node's pod CIDR via its InternalIP (nodes sharing
/// our address, as several nodes on one machine's network do, need none).
pub fn wanted(nodes: &[Node], me: &str, my_ip: &str) -> BTreeMap<String, String> {
    nodes
        .iter()
        .filter(|n| n.name_any() != me)
        .filter_map(|n| {
            let cidr = n.spec.as_ref()?.pod_cidr.clone()?;
            let ip = n
                .status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .find(|a| a.type_ == "InternalIP")?
                .address
                .clone();
            (ip != my_ip).then_some((cidr, ip))
        })
        .collect()
}

async fn ip(args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new("ip")
        .args(args)
        .output()
        .await
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Our routes now: destination → (gateway, device).
async fn current() -> BTreeMap<String, (String, String)> {
    ip(&["-4", "route", "show", "proto", PROTO])
        .await
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let after = |key: &str| {
                words
                    .iter()
                    .position(|w| *w == key)
                    .and_then(|i| words.get(i + 1))
                    .map(|s| s.to_string())
            };
            Some((words.first()?.to_string(), (after("via")?, after("dev")?)))
        })
        .collect()
}

/// Makes the routes what `want` says, and lets the guard pass what they carry.
async fn sync(want: &BTreeMap<String, String>) {
    let have = current().await;
    for (dst, via) in want {
        if have.get(dst).is_some_and(|(v, _)| v == via) {
            continue;
        }
        match ip(&["route", "replace", dst, "via", via, "proto", PROTO]).await {
            Ok(_) => tracing::info!(%dst, %via, "route to a node's pods"),
            Err(e) => {
                tracing::warn!(%dst, %via, error = %e, "cannot route to a node's pods (is it on this node's network?)")
            }
        }
    }
    for dst in have.keys().filter(|d| !want.contains_key(*d)) {
        if let Err(e) = ip(&["route", "del", dst, "proto", PROTO]).await {
            tracing::warn!(%dst, error = %e, "removing a route to a node that left");
        } else {
            tracing::info!(%dst, "removed the route to a node that left");
        }
    }
    let routed: Vec<(String, String)> = current()
        .await
        .into_iter()
        .map(|(dst, (_, dev))| (dst, dev))
        .collect();
    if let Err(e) = crate::netguard::allow_routes(&routed).await {
        tracing::warn!(error = %e, "letting other nodes' pod traffic past the guard");
    }
}

/// Keeps the routes until `shutdown` (they stay afterwards, so pods keep talking).
pub async fn run(client: Client, me: String, my_ip: String, shutdown: CancellationToken) {
    use futures::StreamExt;
    let (store, writer) = reflector::store();
    let changed = std::sync::Arc::new(tokio::sync::Notify::new());
    let feed = {
        let changed = changed.clone();
        reflector(
            writer,
            watcher(Api::<Node>::all(client), watcher::Config::default()),
        )
        .default_backoff()
        .touched_objects()
        .for_each(move |_| {
            changed.notify_one();
            async {}
        })
    };
    let sync_loop = async {
        if store.wait_until_ready().await.is_err() {
            return;
        }
        let mut last = None;
        loop {
            let nodes: Vec<Node> = store.state().iter().map(|n| (**n).clone()).collect();
            let want = wanted(&nodes, &me, &my_ip);
            if last.as_ref() != Some(&want) {
                sync(&want).await;
                last = Some(want);
            }
            tokio::select! {
                _ = changed.notified() => {}
                // Now and then, routes someone else removed come back.
                _ = tokio::time::sleep(Duration::from_secs(30)) => last = None,
            }
        }
    };
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = feed => {}
        _ = sync_loop => {}
    }
}

/// Removes every route [`run`] made in this network namespace.
pub async fn flush() {
    let _ = ip(&["route", "flush", "proto", PROTO]).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, cidr: Option<&str>, ip: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": cidr},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
        }))
        .unwrap()
    }

    #[test]
    fn every_other_node_with_a_block_and_its_own_address_gets_a_route() {
        let nodes = [
            node("me", Some("10.244.0.0/24"), "10.250.0.1"),
            node("a", Some("10.244.1.0/24"), "10.250.0.2"),
            node("waiting", None, "10.250.0.3"),
            node("same-host", Some("10.244.9.0/24"), "10.250.0.1"),
        ];
        let want = wanted(&nodes, "me", "10.250.0.1");
        assert_eq!(
            want,
            BTreeMap::from([("10.244.1.0/24".to_owned(), "10.250.0.2".to_owned())])
        );
    }
}

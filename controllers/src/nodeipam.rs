//! The node IPAM controller (upstream's range allocator, `--allocate-node-cidrs`): every Node
//! without a `spec.podCIDR` gets the lowest free block of the cluster CIDR (`/24`s of
//! `10.244.0.0/16` by default). Blocks nodes already claim (a kubelet started with its own
//! `--pod-cidr`) are never handed out again. Virtual nodes (`type: virtual-kubelet`) get none:
//! their pods' addresses are their provider's.

use crate::driver::Driver;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The cluster's pod address space and the size of each node's block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The cluster CIDR's network address.
    pub network: Ipv4Addr,
    /// The cluster CIDR's prefix length.
    pub prefix: u8,
    /// Each node's prefix length (`--node-cidr-mask-size`, 24).
    pub node_prefix: u8,
    /// Blocks never handed out: those nodes take themselves (the control-plane machine's
    /// own node of `minik8s up`/`init`, which may register after a joining node asks).
    pub reserved: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            network: Ipv4Addr::new(10, 244, 0, 0),
            prefix: 16,
            node_prefix: 24,
            reserved: Vec::new(),
        }
    }
}

impl Config {
    /// Parses `a.b.c.d/n` (the cluster CIDR) with `/node_prefix` blocks.
    pub fn parse(cidr: &str, node_prefix: u8) -> Result<Self, String> {
        let (ip, len) = parse_cidr(cidr).ok_or_else(|| format!("{cidr:?} is not an IPv4 CIDR"))?;
        if node_prefix < len || node_prefix > 30 {
            return Err(format!(
                "node blocks of /{node_prefix} do not fit in {cidr} (want /{len}../30)"
            ));
        }
        Ok(Config {
            network: ip,
            prefix: len,
            node_prefix,
            reserved: Vec::new(),
        })
    }

    /// Whether `block` (`a.b.c.d/n`) lies within the cluster CIDR.
    pub fn contains(&self, block: &str) -> bool {
        parse_cidr(block).is_some_and(|(ip, len)| {
            len >= self.prefix
                && u32::from(ip) & mask(self.prefix) == u32::from(self.network) & mask(self.prefix)
        })
    }

    /// The `index`-th block, or `None` past the end.
    fn block(&self, index: u32) -> Option<String> {
        let count = 1u64 << (self.node_prefix - self.prefix);
        if u64::from(index) >= count {
            return None;
        }
        let base = u32::from(self.network) & mask(self.prefix);
        let ip = Ipv4Addr::from(base + (index << (32 - self.node_prefix)));
        Some(format!("{ip}/{}", self.node_prefix))
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, len) = s.split_once('/')?;
    let len: u8 = len.parse().ok()?;
    (len <= 32).then_some(())?;
    Some((ip.parse().ok()?, len))
}

/// The block for a node when `used` are taken: the lowest free one.
pub fn next_free(cfg: &Config, used: &BTreeSet<String>) -> Option<String> {
    (0..)
        .map_while(|i| cfg.block(i))
        .find(|b| !used.contains(b))
}

struct Ctx {
    client: Client,
    cfg: Config,
    nodes: Store<Node>,
    /// Blocks handed out, by node, until the cache shows them.
    given: Mutex<BTreeMap<String, String>>,
    /// Nodes told that no block is left (told once, not at each of their status updates).
    told: Mutex<BTreeSet<String>>,
    recorder: minik8s_events::Recorder,
}

/// Runs the allocator until `shutdown`: a node is looked at when it changes, one at a time.
pub async fn run(
    client: Client,
    cfg: Config,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let driver = Driver::<Node>::new("nodeipam", &informers).await;
    let ctx = Arc::new(Ctx {
        recorder: minik8s_events::Recorder::new(client.clone(), "node-ipam-controller", None),
        client,
        cfg,
        nodes: driver.store(),
        given: Mutex::default(),
        told: Mutex::default(),
    });
    driver.one_at_a_time().run(allocate, ctx, shutdown).await;
}

/// Gives a node without a pod CIDR the lowest free block.
async fn allocate(node: Arc<Node>, ctx: Arc<Ctx>) -> crate::Result<Action> {
    // A virtual node's pods take their addresses from its provider, so it routes no block
    // (and a thousand of them would exhaust a /16 of /24s).
    let is_virtual = node.labels().get("type").map(String::as_str) == Some("virtual-kubelet");
    if is_virtual
        || node
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidr.as_ref())
            .is_some()
    {
        return Ok(Action::await_change());
    }
    let all = ctx.nodes.state();
    let used: BTreeSet<String> = {
        let mut given = ctx.given.lock().expect("nodeipam");
        // What the cache shows, or no longer needs remembering (the node is gone).
        given.retain(|name, _| {
            all.iter().any(|n| {
                n.name_any() == *name && n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_none()
            })
        });
        all.iter()
            .filter_map(|n| n.spec.as_ref()?.pod_cidr.clone())
            .chain(given.values().cloned())
            .chain(ctx.cfg.reserved.iter().cloned())
            .collect()
    };
    let Some(block) = next_free(&ctx.cfg, &used) else {
        // As upstream's range allocator: the node's status, as an event, once.
        let name = node.name_any();
        if ctx.told.lock().expect("nodeipam").insert(name.clone()) {
            let cidr = format!("{}/{}", ctx.cfg.network, ctx.cfg.prefix);
            tracing::warn!(node = %name, %cidr, "no pod CIDR left in the cluster CIDR");
            ctx.recorder.normal(
                &node.object_ref(&()),
                "CIDRNotAvailable",
                format!("Node {name} status is now: CIDRNotAvailable"),
            );
        }
        return Ok(Action::await_change());
    };
    ctx.told.lock().expect("nodeipam").remove(&node.name_any());
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"podCIDR": block, "podCIDRs": [block]},
    });
    match Api::<Node>::all(ctx.client.clone())
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(node = %node.name_any(), cidr = %block, "allocated the node's pod CIDR");
            ctx.given
                .lock()
                .expect("nodeipam")
                .insert(node.name_any(), block);
        }
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_handed_out_lowest_first_and_never_twice() {
        let cfg = Config::default();
        let mut used = BTreeSet::new();
        assert_eq!(next_free(&cfg, &used).as_deref(), Some("10.244.0.0/24"));
        used.insert("10.244.0.0/24".to_owned());
        used.insert("10.244.2.0/24".to_owned());
        assert_eq!(next_free(&cfg, &used).as_deref(), Some("10.244.1.0/24"));
        assert!(cfg.contains("10.244.255.0/24") && !cfg.contains("10.245.0.0/24"));
        assert!(!cfg.contains("10.0.0.0/8") && !cfg.contains("not a block"));
        used.insert("10.244.1.0/24".to_owned());
        assert_eq!(next_free(&cfg, &used).as_deref(), Some("10.244.3.0/24"));
        let tiny = Config::parse("10.9.0.0/23", 24).unwrap();
        let full: BTreeSet<String> = ["10.9.0.0/24", "10.9.1.0/24"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(next_free(&tiny, &full), None);
        assert!(Config::parse("10.9.0.0/25", 24).is_err());
        assert!(Config::parse("nope", 24).is_err());
    }
}

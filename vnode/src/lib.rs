//! Virtual nodes: a programmable kubelet, as virtual-kubelet's node library, hosting many
//! nodes in one process and sharing them between replicas, as Koupleless' ModuleControllerV2.
//!
//! - A *provider* runs the pods of a virtual node behind virtual-kubelet's interfaces
//!   ([`provider`]); it tells the library which nodes exist ([`Discovered`]).
//! - **One process, many nodes.** Whatever the number of nodes, the process opens one pod
//!   watch (the pods `Config::pod_selector` selects), one Lease watch and nothing per node:
//!   pod changes are dispatched in process to the node the pod is bound to ([`pods`]).
//! - **Replicas share the nodes by racing for Leases.** Every replica sees every node and
//!   races to hold its node Lease (`kube-node-lease/<node>`, which the node lifecycle
//!   controller reads as the heartbeat). Before each race a replica waits in proportion to its
//!   load level (nodes held / nodes known, in `max_level` steps), so replicas end up with
//!   equal shares; replicas know of each other by a presence Lease each, and a replica alone
//!   does not wait. The holder serves the node ([`node`]): registers the Node, renews the Lease
//!   every 10 s, writes the node status on change and at least every minute, and runs its
//!   pods through the provider. The others stand by and take the node over when its Lease is
//!   released (a clean stop releases at once) or lapses (a whole lease duration unchanged, by
//!   the candidate's own clock). A holder that cannot renew within the lease duration stops
//!   serving before anyone may take over, so two replicas never serve one node at once.
//! - The kubelet endpoint ([`server`]) answers `containerLogs` for the pods of every node this
//!   process serves, on one port for all of them, with the kubelet's TLS and access rule.

pub mod fake;
pub mod metrics;
pub mod node;
pub mod pods;
pub mod provider;
pub mod server;

pub use provider::{
    Conn, Discovered, LogOptions, NodeNotify, NodeProvider, PodLifecycleHandler, PodNotifier,
    PodNotify, Provider, ProviderError, Streams, VNodeInfo,
};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use minik8s_controllers::leader::{self, Hold, Observed};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The label every virtual node, its Lease and (by convention) its pods carry: the provider.
pub const PROVIDER_LABEL: &str = "minik8s.io/vnode-provider";
/// The taint every virtual node carries (`<provider>:NoSchedule`), as virtual-kubelet's.
pub const TAINT_KEY: &str = "virtual-kubelet.io/provider";
/// The label of the replicas' presence Leases (one per replica, beside the node Leases).
pub const REPLICA_LABEL: &str = "minik8s.io/vnode-replica";
/// The namespace of node Leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// The field manager of what the library writes.
pub const MANAGER: &str = "minik8s-vnode";

/// Why the library could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API refused or could not be reached.
    #[error("api: {0}")]
    Api(#[from] kube::Error),
    /// A provider call failed.
    #[error("provider: {0}")]
    Provider(#[from] ProviderError),
    /// The kubelet endpoint could not start.
    #[error("kubelet endpoint: {0}")]
    Server(String),
}

/// How a process hosts virtual nodes.
#[derive(Clone, Debug)]
pub struct Config {
    /// The provider's name: the taint's value and the [`PROVIDER_LABEL`] value.
    pub provider: String,
    /// This replica's identity (the Leases' `holderIdentity`).
    pub identity: String,
    /// The label selector of the one pod watch (the pods virtual nodes may run; empty:
    /// any label).
    pub pod_selector: String,
    /// A field selector of the one pod watch (for pods bound by users to the provider's
    /// nodes, which carry no provider label: `spec.nodeName!=`).
    pub pod_fields: Option<String>,
    /// Where the kubelet endpoint listens (port 0: any free port).
    pub listen: SocketAddr,
    /// The address the apiserver reaches the endpoint at: every node's InternalIP, as
    /// virtual-kubelet's nodes carry their process's address (pods have their provider's).
    pub address: String,
    /// The cluster CA the endpoint's clients must chain to; no endpoint without it.
    pub client_ca: Option<PathBuf>,
    /// `leaseDurationSeconds` of the node Leases (upstream's node lease: 40 s).
    pub lease_duration: Duration,
    /// How often a holder renews (upstream: 10 s) and pings the provider.
    pub renew_interval: Duration,
    /// The node status is written on change and at least this often (upstream: 1 min).
    pub status_interval: Duration,
    /// How often each served node's pods are compared with the provider's (`GetPods`).
    pub resync: Duration,
    /// The highest load level; a replica holding all nodes waits `max_level` steps.
    pub max_level: u32,
    /// The wait per load level before a race.
    pub level_step: Duration,
}

impl Config {
    /// Upstream's timings for `provider`, as replica `identity`.
    pub fn new(provider: &str, identity: &str) -> Config {
        Config {
            provider: provider.to_owned(),
            identity: identity.to_owned(),
            pod_selector: format!("{PROVIDER_LABEL}={provider}"),
            pod_fields: None,
            listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            address: "127.0.0.1".into(),
            client_ca: None,
            lease_duration: Duration::from_secs(40),
            renew_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(60),
            resync: Duration::from_secs(60),
            max_level: 10,
            level_step: Duration::from_millis(100),
        }
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(PROVIDER_LABEL.to_owned(), self.provider.clone())])
    }

    /// The name of this replica's presence Lease.
    fn presence(&self) -> String {
        let id: String = self
            .identity
            .to_ascii_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        format!("{}-replica-{}", self.provider, id.trim_matches('-'))
    }
}

/// The load level of a replica holding `held` of `total` nodes: `0..=max_level`.
pub fn load_level(held: usize, total: usize, max_level: u32) -> u32 {
    if total == 0 {
        return 0;
    }
    ((held as u64 * u64::from(max_level)) / total as u64).min(u64::from(max_level)) as u32
}

/// A node this replica knows of (every replica knows every node).
struct Known {
    info: VNodeInfo,
    provider: Arc<dyn Provider>,
}

/// A node this replica serves.
pub struct Served {
    /// The node as its provider describes it.
    pub info: std::sync::Mutex<VNodeInfo>,
    /// Its provider.
    pub provider: Arc<dyn Provider>,
    /// Cancelled when this replica stops serving it.
    pub stop: CancellationToken,
    /// The node changed (re-register it).
    pub(crate) refresh: Notify,
    /// The pods the provider runs for it, as this replica knows them (one pod change at a
    /// time per node).
    pub(crate) pods: tokio::sync::Mutex<pods::PodState>,
    /// Set once the provider's pods have been listed and adopted: until then a pod of the
    /// node is left alone, or one the provider runs would be created a second time.
    pub(crate) adopted: std::sync::atomic::AtomicBool,
    /// Set when the serving task has finished.
    done: tokio::sync::watch::Sender<bool>,
}

impl Served {
    /// Waits until the node's serving task has finished.
    pub async fn stopped(&self) {
        let mut rx = self.done.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// The node's name.
    pub fn name(&self) -> String {
        self.info.lock().expect("info").name.clone()
    }
}

/// What the process's tasks share.
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) cfg: Config,
    /// The kubelet endpoint's port (every node's `daemonEndpoints.kubeletEndpoint.Port`).
    pub(crate) port: Mutex<u16>,
    known: Mutex<HashMap<String, Known>>,
    /// The nodes this replica serves now.
    pub(crate) served: Mutex<HashMap<String, Arc<Served>>>,
    /// Every node Lease of this provider as last seen.
    observed: Mutex<HashMap<String, (Lease, Observed)>>,
    /// The one shared pod watch's store.
    pub(crate) pods: Store<Pod>,
    /// Pods to reconcile now (a node taken over: its pods).
    pub(crate) trigger: mpsc::UnboundedSender<ObjectRef<Pod>>,
    /// Wakes the racer (a node appeared, a Lease was released or lapsed).
    wake: Notify,
    pub(crate) tasks: TaskTracker,
    pub(crate) shutdown: CancellationToken,
}

impl Shared {
    /// The node `name` if this replica serves it.
    pub(crate) fn served(&self, name: &str) -> Option<Arc<Served>> {
        self.served.lock().expect("served").get(name).cloned()
    }

    pub(crate) fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), LEASE_NAMESPACE)
    }
}

/// Hosts the virtual nodes `discovered` announces until `shutdown`, then releases every
/// Lease it holds. Returns the kubelet endpoint's address once it is bound, through
/// `bound` (for tests and benchmarks that start the endpoint on port 0).
pub async fn run(
    client: Client,
    cfg: Config,
    mut discovered: mpsc::UnboundedReceiver<Discovered>,
    bound: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let tasks = TaskTracker::new();
    let informers = minik8s_controllers::informer::Informers::new(
        client.clone(),
        tasks.clone(),
        shutdown.clone(),
    );
    let (trigger, triggered) = mpsc::unbounded_channel();
    let mut selection = watcher::Config::default();
    if !cfg.pod_selector.is_empty() {
        selection = selection.labels(&cfg.pod_selector);
    }
    if let Some(fields) = &cfg.pod_fields {
        selection = selection.fields(fields);
    }
    let driver = minik8s_controllers::driver::Driver::<Pod>::filtered(
        "vnode-pods",
        &informers,
        Api::all(client.clone()),
        selection,
    )
    .with(|c| {
        c.reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(
            triggered,
        ))
    })
    .resync(cfg.resync);
    let shared = Arc::new(Shared {
        client: client.clone(),
        cfg: cfg.clone(),
        port: Mutex::new(0),
        known: Mutex::default(),
        served: Mutex::default(),
        observed: Mutex::default(),
        pods: driver.store(),
        trigger,
        wake: Notify::new(),
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
    });
    if let Some(ca) = &cfg.client_ca {
        let (addr, serve) = server::bind(cfg.listen, ca, shared.clone()).await?;
        *shared.port.lock().expect("port") = addr.port();
        if let Some(b) = bound {
            let _ = b.send(addr);
        }
        minik8s_task::spawn_on(&tasks, "vnode-kubelet-endpoint", serve);
    }
    metrics::get();
    minik8s_task::spawn_on(
        &tasks,
        "vnode-pods",
        driver.run(pods::reconcile, shared.clone(), shutdown.clone()),
    );
    minik8s_task::spawn_on(&tasks, "vnode-leases", watch_leases(shared.clone()));
    minik8s_task::spawn_on(&tasks, "vnode-presence", presence(shared.clone()));
    minik8s_task::spawn_on(&tasks, "vnode-racer", race(shared.clone()));
    tracing::info!(provider = %cfg.provider, identity = %cfg.identity, "virtual nodes started");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            d = discovered.recv() => match d {
                Some(d) => on_discovered(&shared, d).await,
                None => shutdown.cancelled().await,
            },
        }
    }
    // Stop serving, then release every Lease still held (a race in flight at the stop
    // included), so the other replicas take over at once.
    let served: Vec<_> = shared.served.lock().expect("served").drain().collect();
    for (_, s) in &served {
        s.stop.cancel();
    }
    tasks.close();
    tasks.wait().await;
    let held = shared
        .leases()
        .list(
            &kube::api::ListParams::default().labels(&format!("{PROVIDER_LABEL}={}", cfg.provider)),
        )
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mine: Vec<String> = held
        .iter()
        .filter(|l| holder_of(l).as_deref() == Some(cfg.identity.as_str()))
        .map(|l| l.name_any())
        .collect();
    let leases = shared.leases();
    futures::future::join_all(
        mine.iter()
            .map(|n| leader::release(&leases, n, &cfg.identity)),
    )
    .await;
    metrics::get().held.set(0);
    tracing::info!("virtual nodes stopped; leases released");
    Ok(())
}

async fn on_discovered(shared: &Arc<Shared>, d: Discovered) {
    match d {
        Discovered::Up(info, provider) => {
            let name = info.name.clone();
            let changed = {
                let mut known = shared.known.lock().expect("known");
                let changed = known.get(&name).is_some_and(|k| k.info != info);
                known.insert(
                    name.clone(),
                    Known {
                        info: info.clone(),
                        provider,
                    },
                );
                changed
            };
            if changed && let Some(s) = shared.served(&name) {
                *s.info.lock().expect("info") = info;
                s.refresh.notify_one();
            }
            shared.wake.notify_one();
        }
        Discovered::Down(name) => {
            shared.known.lock().expect("known").remove(&name);
            let served = shared.served.lock().expect("served").remove(&name);
            if let Some(s) = served {
                s.stop.cancel();
                s.stopped().await;
                node::remove(shared, &name).await;
                metrics::get().held.dec();
            }
        }
    }
}

/// The one Lease watch: every node Lease of this provider. A Lease released or taken from
/// this replica wakes the racer; a served node whose Lease another replica now holds stops
/// at once.
async fn watch_leases(shared: Arc<Shared>) {
    let config =
        watcher::Config::default().labels(&format!("{PROVIDER_LABEL}={}", shared.cfg.provider));
    let stream = watcher::watcher(shared.leases(), config).default_backoff();
    futures::pin_mut!(stream);
    loop {
        let ev = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
        };
        let leases = match ev {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => vec![l],
            Ok(watcher::Event::Delete(l)) => {
                shared
                    .observed
                    .lock()
                    .expect("observed")
                    .remove(&l.name_any());
                shared.wake.notify_one();
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "lease watch (retrying)");
                continue;
            }
        };
        for lease in leases {
            let name = lease.name_any();
            let holder = holder_of(&lease);
            let before = {
                let mut observed = shared.observed.lock().expect("observed");
                let entry = observed
                    .entry(name.clone())
                    .or_insert_with(|| (lease.clone(), Observed::default()));
                let before = holder_of(&entry.0);
                entry.1.see(&lease);
                entry.0 = lease;
                before
            };
            // A renewal by the same holder changes nothing here (its lapse is timed).
            if holder.is_some() && holder == before && before.is_some() {
                continue;
            }
            if holder.as_deref() != Some(shared.cfg.identity.as_str()) {
                if let Some(holder) = &holder
                    && let Some(s) = shared.served(&name)
                {
                    tracing::warn!(node = %name, %holder, "lease taken by another replica; stopping");
                    s.stop.cancel();
                }
                shared.wake.notify_one();
            }
        }
    }
}

fn holder_of(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

/// Keeps this replica's presence Lease (so the others know to share with it) until
/// shutdown, then deletes it.
async fn presence(shared: Arc<Shared>) {
    let name = shared.cfg.presence();
    let mut labels = shared.cfg.labels();
    labels.insert(REPLICA_LABEL.to_owned(), "true".to_owned());
    let hold = Hold {
        name: &name,
        identity: &shared.cfg.identity,
        duration: shared.cfg.lease_duration,
        labels: &labels,
    };
    let (mut observed, mut last) = (Observed::default(), None);
    loop {
        if let Err(e) = leader::try_hold(&shared.leases(), &hold, &mut observed, &mut last).await {
            tracing::warn!(error = %e, "renewing this replica's presence lease failed");
            last = None;
        }
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            _ = tokio::time::sleep(shared.cfg.renew_interval) => {}
        }
    }
    let _ = shared
        .leases()
        .delete(&name, &kube::api::DeleteParams::default())
        .await;
}

/// How many other replicas are alive (their presence Leases held and not lapsed).
fn other_replicas(shared: &Shared) -> usize {
    let observed = shared.observed.lock().expect("observed");
    observed
        .values()
        .filter(|(lease, seen)| {
            lease.labels().contains_key(REPLICA_LABEL)
                && holder_of(lease).is_some_and(|h| h != shared.cfg.identity)
                && seen
                    .expires_in(shared.cfg.lease_duration)
                    .is_some_and(|left| !left.is_zero())
        })
        .count()
}

/// The racer: one race at a time, each after the load-level wait (when other replicas are
/// alive to share with), for every known node whose Lease is absent, free or lapsed.
async fn race(shared: Arc<Shared>) {
    let labels = shared.cfg.labels();
    let m = metrics::get();
    loop {
        // Nodes to race for, and how long until the next Lease we know of lapses.
        let mut next_expiry = shared.cfg.lease_duration;
        let candidates: Vec<String> = {
            let known = shared.known.lock().expect("known");
            let served = shared.served.lock().expect("served");
            let observed = shared.observed.lock().expect("observed");
            let mut c: Vec<String> = known
                .keys()
                .filter(|n| !served.contains_key(*n))
                .filter(|n| match observed.get(*n) {
                    None => true,
                    Some((lease, seen)) => {
                        let takeable = leader::takeable(
                            lease,
                            &shared.cfg.identity,
                            seen,
                            shared.cfg.lease_duration,
                        );
                        if !takeable && let Some(left) = seen.expires_in(shared.cfg.lease_duration)
                        {
                            next_expiry = next_expiry.min(left + Duration::from_millis(50));
                        }
                        takeable
                    }
                })
                .cloned()
                .collect();
            c.sort();
            c
        };
        for name in candidates {
            if shared.shutdown.is_cancelled() {
                return;
            }
            let (held, total) = {
                let held = shared.served.lock().expect("served").len();
                (held, shared.known.lock().expect("known").len())
            };
            let level = if other_replicas(&shared) == 0 {
                0
            } else {
                load_level(held, total, shared.cfg.max_level)
            };
            if level > 0 {
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(shared.cfg.level_step * level) => {}
                }
            }
            let Some((info, provider)) = shared
                .known
                .lock()
                .expect("known")
                .get(&name)
                .map(|k| (k.info.clone(), k.provider.clone()))
            else {
                continue;
            };
            let (mut seen, before) = match shared.observed.lock().expect("observed").get(&name) {
                Some((l, o)) => (o.clone(), Some(holder_of(l))),
                None => (Observed::default(), None),
            };
            let hold = Hold {
                name: &name,
                identity: &shared.cfg.identity,
                duration: shared.cfg.lease_duration,
                labels: &labels,
            };
            let mut last = None;
            match leader::try_hold(&shared.leases(), &hold, &mut seen, &mut last).await {
                Ok(true) => {
                    m.races
                        .get_or_create(&minik8s_metrics::labels(&[("result", "won")]))
                        .inc();
                    if let Some(prev) = before
                        && prev.as_deref() != Some(shared.cfg.identity.as_str())
                    {
                        m.takeovers.inc();
                        tracing::info!(node = %name, previous = ?prev, "took the node over");
                    }
                    node::start(&shared, info, provider, last);
                }
                Ok(false) => {
                    m.races
                        .get_or_create(&minik8s_metrics::labels(&[("result", "lost")]))
                        .inc();
                }
                Err(e) => tracing::warn!(node = %name, error = %e, "lease race failed"),
            }
        }
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(next_expiry) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_level_grows_with_the_share_held() {
        assert_eq!(load_level(0, 6, 10), 0);
        assert_eq!(load_level(1, 6, 10), 1);
        assert_eq!(load_level(2, 6, 10), 3);
        assert_eq!(load_level(6, 6, 10), 10);
        assert_eq!(load_level(3, 0, 10), 0);
        assert_eq!(load_level(9, 6, 10), 10);
    }
}

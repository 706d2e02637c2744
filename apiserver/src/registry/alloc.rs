//! ClusterIP and NodePort allocation for Services. What is in use is derived from the stored
//! Services and the allocations of writes still under way, nothing else: a table of them
//! is kept in memory from a watch of the store ([`Allocator::follow`]), as upstream keeps
//! its allocation bitmaps in memory, so that an allocation reads no Service. This server's
//! own Service writes go into the table as they are made ([`Allocator::wrote`]), ahead of
//! the watch, so the next allocation need not wait for the watch to bring them: waiting
//! made every Service write wait for the watch's delivery under the lock, and at 150,000
//! pods a late watch made creates queue for seconds. An allocation is a [`Reservation`] in
//! the table until its write has landed or failed, as upstream allocates from its bitmaps
//! before the write and releases on failure: no lock is held across the store's commit, which
//! at 150,000 pods made Service creates queue behind each other's commits. A table not
//! filled yet gives way, after a short wait, to a read of the store, and then the lock is
//! held until the write is done.

use crate::error::{ApiError, ApiResult, Cause};
use futures::StreamExt;
use minik8s_storage::{EventKind, RangeRequest, Storage, Store};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::sync::Mutex;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Where Services are stored.
const PREFIX: &str = "/registry/core/services/";

/// How long a write waits for the table to be filled before it reads the store instead.
const CATCH_UP: Duration = Duration::from_secs(2);

/// The service IP range and node port range, with the lock that serialises allocation and
/// the table of what the stored Services and the writes under way hold.
#[derive(Debug)]
pub struct Allocator {
    base: u32,
    size: u32,
    ports: RangeInclusive<u16>,
    lock: tokio::sync::Mutex<()>,
    /// What the stored Services hold: as the watch told it, with this server's later writes.
    used: Mutex<Used>,
    /// Whether `used` has been filled from a list of the Services.
    filled: tokio::sync::watch::Sender<bool>,
}

/// A service CIDR or port range that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid {what} {value:?}")]
pub struct RangeError {
    what: &'static str,
    value: String,
}

impl Allocator {
    /// An allocator for a CIDR such as `10.96.0.0/12` and a port range such as 30000–32767.
    pub fn new(cidr: &str, ports: RangeInclusive<u16>) -> Result<Self, RangeError> {
        let bad = || RangeError {
            what: "service CIDR",
            value: cidr.into(),
        };
        let (ip, bits) = cidr.split_once('/').ok_or_else(bad)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
        let bits: u32 = bits.parse().map_err(|_| bad())?;
        if !(8..=30).contains(&bits) {
            return Err(bad());
        }
        let size = 1u32 << (32 - bits);
        Ok(Allocator {
            base: u32::from(ip) & !(size - 1),
            size,
            ports,
            lock: tokio::sync::Mutex::new(()),
            used: Mutex::new(Used::default()),
            filled: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Puts a Service write this server made at `revision` into the table at once: the
    /// Service at `key` now stored as `value`, or gone (`None`).
    pub fn wrote(&self, key: &str, value: Option<&[u8]>, revision: i64) {
        self.used
            .lock()
            .expect("allocation table")
            .own_write(revision, key, value);
    }

    /// Keeps the table of what the stored Services hold in step with the store (list, then
    /// watch; again after a broken or compacted watch), until `shutdown`.
    pub async fn follow(&self, store: &Storage, shutdown: &CancellationToken) {
        loop {
            let started = async {
                let listed = store.range(RangeRequest::prefix(PREFIX)).await?;
                let events = store.watch(PREFIX, listed.revision + 1).await?;
                Ok::<_, minik8s_storage::Error>((listed, events))
            };
            let (listed, mut events) = match started.await {
                Ok(started) => started,
                Err(e) => {
                    tracing::warn!(error = %e, "following Services for their allocations failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            self.used
                .lock()
                .expect("allocation table")
                .relisted(&listed.kvs, listed.revision);
            self.filled.send_replace(true);
            loop {
                let ev = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    ev = events.next() => ev,
                };
                let ev = match ev {
                    Some(Ok(ev)) => ev,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "the Services watch ended; listing again");
                        break;
                    }
                    None => break,
                };
                let (key, value) = match ev.kind {
                    EventKind::Put => (Some(ev.kv.key.as_str()), Some(&ev.kv.value[..])),
                    EventKind::Delete => (Some(ev.kv.key.as_str()), None),
                    EventKind::Progress => (None, None),
                };
                self.used
                    .lock()
                    .expect("allocation table")
                    .watched(ev.revision(), key, value);
            }
        }
    }

    /// The table of what the stored Services hold: kept in memory once it has been filled,
    /// else (after [`CATCH_UP`]) read from the store.
    async fn table(&self, store: &Storage) -> ApiResult<Table<'_>> {
        let mut filled = self.filled.subscribe();
        let ready =
            tokio::time::timeout(CATCH_UP, async { filled.wait_for(|f| *f).await.is_ok() }).await;
        if ready == Ok(true) {
            return Ok(Table::Kept(self.used.lock().expect("allocation table")));
        }
        tracing::debug!("the allocation table is not filled yet; reading the Services");
        let all = store.range(RangeRequest::prefix(PREFIX)).await?;
        let mut used = Used::default();
        used.relisted(&all.kvs, all.revision);
        Ok(Table::Read(Box::new(used)))
    }

    /// The range, as `10.96.0.0/12`.
    pub fn cidr(&self) -> String {
        format!(
            "{}/{}",
            Ipv4Addr::from(self.base),
            32 - self.size.trailing_zeros()
        )
    }

    /// The first address of the range: the `kubernetes` Service's ClusterIP.
    pub fn first_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 1)
    }

    fn contains(&self, ip: Ipv4Addr) -> bool {
        let n = u32::from(ip);
        n > self.base && n < self.base + self.size - 1
    }

    /// Fills in or checks a Service's ClusterIP and NodePorts. What it takes stays taken
    /// while the [`Reservation`] lives: keep it until the write has landed and
    /// [`Allocator::wrote`] has been told it, or has failed.
    pub async fn assign(
        &self,
        store: &Storage,
        key: &str,
        svc: &mut Value,
        old: Option<&Value>,
    ) -> ApiResult<Reservation<'_>> {
        let lock = self.lock.lock().await;
        let mut table = self.table(store).await?;
        let name = svc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let invalid = |c: Cause| ApiError::invalid("", "Service", &name, vec![c]);
        let spec = &mut svc["spec"];
        let ty = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_owned();
        // An ExternalName service had no address: one is allocated when it changes type.
        let old_ip = old
            .and_then(|o| o.pointer("/spec/clusterIP"))
            .and_then(Value::as_str)
            .filter(|ip| !ip.is_empty())
            .map(str::to_owned);
        if ty == "ExternalName" {
            // Upstream drops the type's address fields (and so releases the IP).
            if let Some(m) = spec.as_object_mut() {
                for f in [
                    "clusterIP",
                    "clusterIPs",
                    "ipFamilies",
                    "ipFamilyPolicy",
                    "internalTrafficPolicy",
                ] {
                    m.remove(f);
                }
                if m.get("healthCheckNodePort") == Some(&json!(0)) {
                    m.remove("healthCheckNodePort");
                }
            }
        } else {
            let given = spec
                .get("clusterIP")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let ip = match (given.as_str(), &old_ip) {
                ("", Some(old)) => old.clone(),
                (g, Some(old)) if g != old => {
                    return Err(invalid(Cause::invalid(
                        "spec.clusterIPs[0]",
                        g,
                        "may not change once set",
                    )));
                }
                ("None", _) => "None".into(),
                ("", None) => {
                    let band = static_band(self.size, 16, 256);
                    let free = pick_free(1, self.size - 1, band, |i| {
                        !table.ip_taken(&Ipv4Addr::from(self.base + i).to_string(), key)
                    })
                    .ok_or_else(|| {
                        ApiError::internal("failed to allocate a serviceIP: range is full")
                    })?;
                    Ipv4Addr::from(self.base + free).to_string()
                }
                (g, _) => {
                    let ip: Ipv4Addr = g.parse().map_err(|_| {
                        invalid(Cause::invalid(
                            "spec.clusterIPs[0]",
                            g,
                            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                        ))
                    })?;
                    if old_ip.is_none() {
                        if !self.contains(ip) {
                            return Err(invalid(Cause::invalid(
                                "spec.clusterIPs",
                                g,
                                "failed to allocate IP: the provided IP is not in the valid range",
                            )));
                        }
                        if table.ip_taken(g, key) {
                            return Err(invalid(Cause::invalid(
                                "spec.clusterIPs",
                                g,
                                &format!(
                                    "failed to allocate IP {g}: provided IP is already allocated"
                                ),
                            )));
                        }
                    }
                    g.to_owned()
                }
            };
            spec["clusterIP"] = json!(ip);
            spec["clusterIPs"] = json!([ip]);
            if ip != "None" {
                spec["ipFamilies"] = json!(["IPv4"]);
                spec["ipFamilyPolicy"] = json!("SingleStack");
            }
        }
        let wants_node_ports = matches!(ty.as_str(), "NodePort" | "LoadBalancer");
        // The ports this Service has taken so far.
        let mut taken: HashSet<u16> = HashSet::new();
        let is_taken =
            |n: u16, taken: &HashSet<u16>| taken.contains(&n) || table.port_taken(n, key);
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for (i, p) in ports.iter_mut().enumerate() {
                if !wants_node_ports {
                    if let Some(m) = p.as_object_mut() {
                        m.remove("nodePort");
                    }
                    continue;
                }
                let port = p.get("port").cloned();
                let previous = old
                    .and_then(|o| o.pointer("/spec/ports"))
                    .and_then(Value::as_array)
                    .and_then(|ps| ps.iter().find(|op| op.get("port") == port.as_ref()))
                    .and_then(|op| op.get("nodePort"))
                    .and_then(Value::as_u64);
                // 0 means "not set" (what typed clients send for an empty port).
                let chosen = match p
                    .get("nodePort")
                    .and_then(Value::as_u64)
                    .filter(|n| *n != 0)
                {
                    Some(n) if Some(n) == previous => n as u16,
                    Some(n) => {
                        let field = format!("spec.ports[{i}].nodePort");
                        if !self.ports.contains(&(n as u16)) || n > u16::MAX as u64 {
                            return Err(invalid(Cause::invalid(
                                &field,
                                &n.to_string(),
                                &format!(
                                    "provided port is not in the valid range. The range of valid ports is {}-{}",
                                    self.ports.start(),
                                    self.ports.end()
                                ),
                            )));
                        }
                        if is_taken(n as u16, &taken) {
                            return Err(invalid(Cause::invalid(
                                &field,
                                &n.to_string(),
                                "provided port is already allocated",
                            )));
                        }
                        n as u16
                    }
                    None => match previous {
                        Some(n) => n as u16,
                        None => {
                            let (lo, hi) =
                                (u32::from(*self.ports.start()), u32::from(*self.ports.end()));
                            let band = static_band(hi + 1 - lo, 32, 128);
                            pick_free(lo, hi + 1, band, |n| !is_taken(n as u16, &taken))
                                .ok_or_else(|| {
                                    ApiError::internal(
                                        "failed to allocate a nodePort: range is full",
                                    )
                                })? as u16
                        }
                    },
                };
                taken.insert(chosen);
                p["nodePort"] = json!(chosen);
            }
        }
        Ok(match &mut table {
            Table::Kept(used) => {
                let spec = StoredSpec::deserialize(&svc["spec"]).unwrap_or_default();
                Reservation {
                    alloc: self,
                    id: Some(used.reserve(Holds::of_spec(spec))),
                    _lock: None,
                }
            }
            // Nothing else sees a table read for this write: the lock stays until it is done.
            Table::Read(_) => Reservation {
                alloc: self,
                id: None,
                _lock: Some(lock),
            },
        })
    }
}

/// What a Service write under way has allocated, taken in the table until dropped (after
/// the write has landed and been told to [`Allocator::wrote`], or has failed).
#[must_use = "the allocation is released when the reservation is dropped"]
#[derive(Debug)]
pub struct Reservation<'a> {
    alloc: &'a Allocator,
    id: Option<u64>,
    _lock: Option<tokio::sync::MutexGuard<'a, ()>>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.alloc
                .used
                .lock()
                .expect("allocation table")
                .release(id);
        }
    }
}

/// The static band of a range of `size` values, as upstream reserves it (KEP-3070 for
/// ClusterIPs: a 16th of the range, 16 to 256; KEP-3668 for NodePorts: a 32nd, 16 to 128):
/// the lower values, which dynamic allocation takes only once the rest is full, so that a
/// chosen one (the cluster DNS's `10.96.0.10`) stays free however many Services came first.
fn static_band(size: u32, step: u32, max: u32) -> u32 {
    if size < 16 {
        0
    } else {
        (size / step).clamp(16, max)
    }
}

/// A free value of `lo..hi` for a dynamic allocation, as upstream's allocators pick: from a
/// random place above the static `band` (wrapping within it), then within the band.
fn pick_free(lo: u32, hi: u32, band: u32, free: impl Fn(u32) -> bool) -> Option<u32> {
    let split = lo.saturating_add(band).min(hi);
    let upper = hi - split;
    if upper > 0 {
        let start = rand::random_range(0..upper);
        if let Some(v) = (0..upper)
            .map(|i| split + (start + i) % upper)
            .find(|v| free(*v))
        {
            return Some(v);
        }
    }
    (lo..split).find(|v| free(*v))
}

/// What one stored Service holds.
#[derive(Debug, Default)]
struct Holds {
    ip: Option<String>,
    ports: Vec<u16>,
}

/// The fields of a stored Service that hold something.
#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    spec: StoredSpec,
}

#[derive(Default, Deserialize)]
struct StoredSpec {
    #[serde(rename = "clusterIP", default)]
    cluster_ip: Option<String>,
    #[serde(default)]
    ports: Option<Vec<StoredPort>>,
}

#[derive(Deserialize)]
struct StoredPort {
    #[serde(rename = "nodePort", default)]
    node_port: Option<u64>,
}

impl Holds {
    /// What a stored Service's JSON holds (nothing, if it cannot be read).
    fn of(value: &[u8]) -> Holds {
        let Ok(stored) = serde_json::from_slice::<Stored>(value) else {
            return Holds::default();
        };
        Holds::of_spec(stored.spec)
    }

    fn of_spec(spec: StoredSpec) -> Holds {
        Holds {
            ip: spec.cluster_ip,
            ports: (spec.ports.into_iter().flatten())
                .filter_map(|p| p.node_port)
                .map(|n| n as u16)
                .collect(),
        }
    }
}

/// What the stored Services hold, by key, with how many hold each IP and port.
#[derive(Debug, Default)]
struct Used {
    by_key: HashMap<String, Holds>,
    ips: HashMap<String, u32>,
    ports: HashMap<u16, u32>,
    /// The revision up to which the watch (or the list) has told every change.
    seen: i64,
    /// This server's writes after `seen`, by revision: the Service's key and stored value
    /// (`None`: deleted). A relisted table gets them again; an older watch event for their
    /// key does not undo them.
    own: BTreeMap<i64, (String, Option<Vec<u8>>)>,
    /// What this server's writes under way have allocated, by reservation; counted in
    /// `ips` and `ports` with the stored Services.
    reserved: HashMap<u64, Holds>,
    next_reservation: u64,
}

/// The table an allocation reads: the one kept in memory, or one just read from the store.
enum Table<'a> {
    Kept(std::sync::MutexGuard<'a, Used>),
    Read(Box<Used>),
}

impl std::ops::Deref for Table<'_> {
    type Target = Used;

    fn deref(&self) -> &Used {
        match self {
            Table::Kept(used) => used,
            Table::Read(used) => used,
        }
    }
}

impl Used {
    /// The table of the Services in `kvs`, listed at `revision`, with this server's writes
    /// after it.
    fn relisted(&mut self, kvs: &[minik8s_storage::KeyValue], revision: i64) {
        let own = std::mem::take(&mut self.own);
        let reserved = std::mem::take(&mut self.reserved);
        *self = Used {
            seen: revision,
            next_reservation: self.next_reservation,
            ..Used::default()
        };
        for (id, holds) in reserved {
            self.count(&holds, true);
            self.reserved.insert(id, holds);
        }
        for kv in kvs {
            self.put(&kv.key, &kv.value);
        }
        for (rev, (key, value)) in own.into_iter().filter(|(rev, _)| *rev > revision) {
            self.own_write(rev, &key, value.as_deref());
        }
    }

    /// A write of this server at `revision`, ahead of the watch (unless the watch already
    /// told it, or a later change of its Service).
    fn own_write(&mut self, revision: i64, key: &str, value: Option<&[u8]>) {
        if revision <= self.seen {
            return;
        }
        self.own
            .insert(revision, (key.to_owned(), value.map(<[u8]>::to_vec)));
        self.set(key, value);
    }

    /// A watch event at `revision` (`key` `None`: a progress notice): every change up to it
    /// has been told. A write of this server after it to the same Service stays.
    fn watched(&mut self, revision: i64, key: Option<&str>, value: Option<&[u8]>) {
        self.seen = self.seen.max(revision);
        self.own = self.own.split_off(&(revision + 1));
        if let Some(key) = key
            && !self.own.values().any(|(k, _)| k == key)
        {
            self.set(key, value);
        }
    }

    fn set(&mut self, key: &str, value: Option<&[u8]>) {
        match value {
            Some(v) => self.put(key, v),
            None => self.remove(key),
        }
    }

    /// The Service at `key` now holds what its stored `value` says.
    fn put(&mut self, key: &str, value: &[u8]) {
        self.remove(key);
        let holds = Holds::of(value);
        self.count(&holds, true);
        self.by_key.insert(key.to_owned(), holds);
    }

    /// The Service at `key` is gone.
    fn remove(&mut self, key: &str) {
        if let Some(holds) = self.by_key.remove(key) {
            self.count(&holds, false);
        }
    }

    /// Takes what a write under way has allocated until [`Used::release`].
    fn reserve(&mut self, holds: Holds) -> u64 {
        self.next_reservation += 1;
        self.count(&holds, true);
        self.reserved.insert(self.next_reservation, holds);
        self.next_reservation
    }

    fn release(&mut self, id: u64) {
        if let Some(holds) = self.reserved.remove(&id) {
            self.count(&holds, false);
        }
    }

    /// Counts `holds` in (`add`) or out of the IPs and ports held.
    fn count(&mut self, holds: &Holds, add: bool) {
        fn step<K: std::hash::Hash + Eq + Clone>(m: &mut HashMap<K, u32>, k: &K, add: bool) {
            if add {
                *m.entry(k.clone()).or_default() += 1;
            } else if let Some(n) = m.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    m.remove(k);
                }
            }
        }
        if let Some(ip) = &holds.ip {
            step(&mut self.ips, ip, add);
        }
        for p in &holds.ports {
            step(&mut self.ports, p, add);
        }
    }

    /// Whether a Service other than the one at `key` holds `ip`.
    fn ip_taken(&self, ip: &str, key: &str) -> bool {
        let own = self.by_key.get(key).and_then(|h| h.ip.as_deref()) == Some(ip);
        self.ips.get(ip).copied().unwrap_or(0) > u32::from(own)
    }

    /// Whether a Service other than the one at `key` holds node port `port`.
    fn port_taken(&self, port: u16, key: &str) -> bool {
        let own = self
            .by_key
            .get(key)
            .map_or(0, |h| h.ports.iter().filter(|p| **p == port).count());
        self.ports.get(&port).copied().unwrap_or(0) as usize > own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_gives_the_kubernetes_service_its_first_address() {
        let a = Allocator::new("10.96.0.0/12", 30000..=32767).unwrap();
        assert_eq!(a.first_ip(), Ipv4Addr::new(10, 96, 0, 1));
        assert!(a.contains(Ipv4Addr::new(10, 111, 255, 254)));
        assert!(!a.contains(Ipv4Addr::new(10, 112, 0, 1)));
        assert!(Allocator::new("10.96.0.0", 1..=2).is_err());
    }

    #[test]
    fn dynamic_allocation_leaves_the_static_band_until_the_rest_is_full() {
        assert_eq!(static_band(1 << 20, 16, 256), 256);
        assert_eq!(static_band(256, 16, 256), 16);
        assert_eq!(static_band(8, 16, 256), 0);
        assert_eq!(static_band(2768, 32, 128), 86);
        // A /24: addresses 1..255, the band 1..17.
        let mut taken = HashSet::new();
        for _ in 0..(255 - 17) {
            let v = pick_free(1, 255, 16, |v| !taken.contains(&v)).unwrap();
            assert!(v >= 17, "{v} is in the static band");
            taken.insert(v);
        }
        let v = pick_free(1, 255, 16, |v| !taken.contains(&v)).unwrap();
        assert!(v < 17);
        for v in 1..17 {
            taken.insert(v);
        }
        assert_eq!(pick_free(1, 255, 16, |v| !taken.contains(&v)), None);
    }

    fn svc(ip: &str, node_ports: &[u16]) -> bytes::Bytes {
        let ports: Vec<Value> = node_ports
            .iter()
            .map(|n| json!({"port": 80, "nodePort": n}))
            .collect();
        serde_json::to_vec(&json!({"spec": {"clusterIP": ip, "ports": ports}}))
            .unwrap()
            .into()
    }

    #[test]
    fn the_table_counts_holders_and_leaves_out_the_service_asking() {
        let mut used = Used::default();
        used.put("/a", &svc("10.96.0.5", &[30001]));
        used.put("/b", &svc("None", &[]));
        used.put("/c", &svc("None", &[30002, 30002]));
        assert!(used.ip_taken("10.96.0.5", "/x"));
        assert!(!used.ip_taken("10.96.0.5", "/a"), "its own IP");
        assert!(used.port_taken(30001, "/b"));
        assert!(!used.port_taken(30001, "/a"), "its own port");
        assert!(!used.port_taken(30002, "/c"), "both holders are itself");
        // An update moves what it holds; a delete frees it.
        used.put("/a", &svc("10.96.0.5", &[30003]));
        assert!(!used.port_taken(30001, "/x"));
        assert!(used.port_taken(30003, "/x"));
        used.remove("/a");
        assert!(!used.ip_taken("10.96.0.5", "/x"));
        assert!(!used.port_taken(30003, "/x"));
        assert!(used.ip_taken("None", "/b"), "/c still holds it");
        used.put("/d", b"not json");
        assert!(used.by_key.contains_key("/d"));
        assert_eq!(used.ips.len(), 1);
    }

    #[tokio::test]
    async fn allocations_see_every_write_before_them_through_the_kept_table() {
        let dir = tempfile::tempdir().unwrap();
        let store = Storage::Embedded(minik8s_storage::Embedded::open(dir.path()).unwrap());
        store
            .create(&format!("{PREFIX}default/a"), svc("10.96.0.5", &[30001]))
            .await
            .unwrap();
        let alloc = std::sync::Arc::new(Allocator::new("10.96.0.0/24", 30000..=30002).unwrap());
        let shutdown = CancellationToken::new();
        let follower = tokio::spawn({
            let (alloc, store, shutdown) = (alloc.clone(), store.clone(), shutdown.clone());
            async move { alloc.follow(&store, &shutdown).await }
        });
        let assign = |name: &str, spec: Value| {
            let (alloc, store) = (alloc.clone(), store.clone());
            let key = format!("{PREFIX}default/{name}");
            let mut obj = json!({"metadata": {"name": name}, "spec": spec});
            async move {
                let reserved = alloc.assign(&store, &key, &mut obj, None).await?;
                let value = serde_json::to_vec(&obj).unwrap();
                let kv = store.create(&key, value.clone().into()).await.unwrap();
                alloc.wrote(&key, Some(&value[..]), kv.mod_revision);
                drop(reserved);
                ApiResult::Ok(obj)
            }
        };
        let taken = assign("b", json!({"clusterIP": "10.96.0.5"})).await;
        assert_eq!(taken.unwrap_err().code, 422);
        let np = json!({"type": "NodePort", "ports": [{"port": 80}]});
        let b = assign("b", np.clone()).await.unwrap();
        let c = assign("c", np.clone()).await.unwrap();
        let mut ports: Vec<_> = [b, c]
            .iter()
            .map(|o| o["spec"]["ports"][0]["nodePort"].as_u64().unwrap())
            .collect();
        ports.sort();
        assert_eq!(
            ports,
            [30000, 30002],
            "30001 is a's; each write seen by the next"
        );
        assert_eq!(
            assign("d", np.clone()).await.unwrap_err().code,
            500,
            "the range is full"
        );
        // A delete frees its port for the next allocation at once.
        let a = format!("{PREFIX}default/a");
        let d = store.delete(&a, None).await.unwrap();
        alloc.wrote(&a, None, d.revision);
        let d = assign("d", np.clone()).await.unwrap();
        assert_eq!(d["spec"]["ports"][0]["nodePort"], 30001);
        // With the watch stopped, this server's own writes are still seen by the next
        // allocation, without waiting for it.
        shutdown.cancel();
        follower.await.unwrap();
        let c = format!("{PREFIX}default/c");
        let gone = store.delete(&c, None).await.unwrap();
        alloc.wrote(&c, None, gone.revision);
        let started = std::time::Instant::now();
        let e = assign("e", np.clone()).await.unwrap();
        assert!(started.elapsed() < CATCH_UP, "no wait for the watch");
        let freed = e["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        assert_eq!(
            assign("f", np).await.unwrap_err().code,
            500,
            "e took the port c freed ({freed}); the range is full again"
        );
    }

    #[tokio::test]
    async fn a_reservation_holds_what_it_took_until_dropped_without_a_lock() {
        let dir = tempfile::tempdir().unwrap();
        let store = Storage::Embedded(minik8s_storage::Embedded::open(dir.path()).unwrap());
        let alloc = std::sync::Arc::new(Allocator::new("10.96.0.0/24", 30000..=30001).unwrap());
        let shutdown = CancellationToken::new();
        let follower = tokio::spawn({
            let (alloc, store, shutdown) = (alloc.clone(), store.clone(), shutdown.clone());
            async move { alloc.follow(&store, &shutdown).await }
        });
        let np = || json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        let port = |o: &Value| o["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        let key = |name: &str| format!("{PREFIX}default/{name}");
        // Two writes under way at once, neither stored yet: each has its own port.
        let (mut a, mut b) = (np(), np());
        let ra = alloc.assign(&store, &key("a"), &mut a, None).await.unwrap();
        let rb = alloc.assign(&store, &key("b"), &mut b, None).await.unwrap();
        assert_ne!(port(&a), port(&b));
        assert_ne!(a["spec"]["clusterIP"], b["spec"]["clusterIP"]);
        let mut c = np();
        let full = alloc.assign(&store, &key("c"), &mut c, None).await;
        assert_eq!(full.unwrap_err().code, 500, "both ports are reserved");
        // a's write failed: what it took is free again.
        drop(ra);
        let mut c = np();
        let rc = alloc.assign(&store, &key("c"), &mut c, None).await.unwrap();
        assert_eq!(port(&c), port(&a));
        // b's write landed: the stored Service holds its port after the reservation.
        let value = serde_json::to_vec(&b).unwrap();
        let kv = store.create(&key("b"), value.clone().into()).await.unwrap();
        alloc.wrote(&key("b"), Some(&value[..]), kv.mod_revision);
        drop(rb);
        drop(rc);
        let mut d = np();
        let rd = alloc.assign(&store, &key("d"), &mut d, None).await.unwrap();
        assert_eq!(
            port(&d),
            port(&a),
            "c's reservation is gone; b's port is stored"
        );
        assert_eq!(alloc.used.lock().unwrap().reserved.len(), 1);
        drop(rd);
        shutdown.cancel();
        follower.await.unwrap();
    }

    #[test]
    fn own_writes_stay_ahead_of_the_watch_and_over_a_relist() {
        let mut used = Used::default();
        used.relisted(&[], 10);
        // Written by this server at 12 and 13; the watch is at 11.
        used.own_write(12, "/a", Some(&svc("10.96.0.5", &[])[..]));
        used.own_write(13, "/b", Some(&svc("10.96.0.6", &[])[..]));
        used.watched(11, Some("/a"), None);
        assert!(used.ip_taken("10.96.0.5", "/x"), "an older delete of /a");
        // A relist at 12 has /a; /b (13) is kept over it.
        let kv = |key: &str, value: bytes::Bytes, rev| minik8s_storage::KeyValue {
            key: key.into(),
            value,
            create_revision: rev,
            mod_revision: rev,
        };
        used.relisted(&[kv("/a", svc("10.96.0.5", &[]), 12)], 12);
        assert!(used.ip_taken("10.96.0.5", "/x"));
        assert!(used.ip_taken("10.96.0.6", "/x"));
        // The watch brings 13 itself: /b is as written; the own write is done.
        used.watched(13, Some("/b"), Some(&svc("10.96.0.6", &[])[..]));
        assert!(used.own.is_empty());
        assert!(used.ip_taken("10.96.0.6", "/x"));
        // A write the watch already passed is not taken again.
        used.watched(15, Some("/a"), None);
        used.own_write(14, "/a", Some(&svc("10.96.0.5", &[])[..]));
        assert!(!used.ip_taken("10.96.0.5", "/x"));
    }
}

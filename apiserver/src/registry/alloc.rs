//! ClusterIP and NodePort allocation for Services. Allocations are derived from the stored
//! Services (nothing extra to keep consistent) and serialised by one lock held across the write.

use crate::error::{ApiError, ApiResult, Cause};
use minik8s_storage::{RangeRequest, Storage, Store};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

/// The service IP range and node port range, with the lock that serialises allocation.
#[derive(Debug)]
pub struct Allocator {
    base: u32,
    size: u32,
    ports: RangeInclusive<u16>,
    lock: tokio::sync::Mutex<()>,
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
        })
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

    /// Takes the allocation lock; hold it until the Service is written.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    fn contains(&self, ip: Ipv4Addr) -> bool {
        let n = u32::from(ip);
        n > self.base && n < self.base + self.size - 1
    }

    /// Fills in or checks a Service's ClusterIP and NodePorts (call with the lock held).
    pub async fn assign(
        &self,
        store: &Storage,
        key: &str,
        svc: &mut Value,
        old: Option<&Value>,
    ) -> ApiResult<()> {
        let (used_ips, used_ports) = used(store, key).await?;
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
                        !used_ips.contains(&Ipv4Addr::from(self.base + i).to_string())
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
                        if used_ips.contains(g) {
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
        let mut taken: HashSet<u16> = used_ports;
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
                        if taken.contains(&(n as u16)) {
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
                            pick_free(lo, hi + 1, band, |n| !taken.contains(&(n as u16)))
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
        Ok(())
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

/// The ClusterIPs and NodePorts of every stored Service except the one at `key`.
async fn used(store: &Storage, key: &str) -> ApiResult<(HashSet<String>, HashSet<u16>)> {
    let all = store
        .range(RangeRequest::prefix("/registry/core/services/"))
        .await?;
    let mut ips = HashSet::new();
    let mut ports = HashSet::new();
    for kv in all.kvs.iter().filter(|kv| kv.key != key) {
        let Ok(svc) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        if let Some(ip) = svc.pointer("/spec/clusterIP").and_then(Value::as_str) {
            ips.insert(ip.to_owned());
        }
        for p in svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(n) = p.get("nodePort").and_then(Value::as_u64) {
                ports.insert(n as u16);
            }
        }
    }
    Ok((ips, ports))
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
}

//! `default/kubernetes` lists every live apiserver, as upstream's lease endpoint reconciler
//! (`--endpoint-reconciler-type=lease`) keeps it. Each apiserver keeps a Lease in
//! `kube-system` (`apiserver-<hash of its advertised address>`, labelled as upstream's
//! apiserver identity leases, its address in an annotation) and renews it every [`RENEW`].
//! Every pass it sets the Endpoints and EndpointSlice `default/kubernetes` to the addresses of
//! the leases renewed within their duration ([`TTL_SECONDS`]) and deletes the expired ones. A
//! stopping apiserver deletes its own lease and takes its address out, as upstream's does.

use crate::Api;
use crate::error::{ApiError, ApiResult};
use crate::object::{ensure, ensure_fields};
use minik8s_storage::{RangeRequest, Store};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How often an apiserver renews its lease and reconciles the endpoints.
pub const RENEW: Duration = Duration::from_secs(10);
/// How long a lease not renewed keeps its apiserver in the endpoints.
pub const TTL_SECONDS: i64 = 15;
/// Where the apiservers' leases are stored.
const LEASES: &str = "/registry/coordination.k8s.io/leases/kube-system/";
/// Upstream's label on apiserver identity leases.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
/// The annotation carrying an apiserver's advertised `host:port`.
pub const ADDRESS_ANNOTATION: &str = "minik8s.io/advertise-address";

/// The lease name of the apiserver advertised at `advertise`: the same across its restarts,
/// so a restarted apiserver takes its lease back instead of leaving one to expire.
pub fn lease_name(advertise: &str) -> String {
    // FNV-1a: short, stable, and no dependency for sixteen hex digits.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in advertise.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("apiserver-{h:016x}")
}

/// `host` and `port` of an advertised `host:port` (`[v6]:port` too; port 6443 if missing).
pub fn split_address(advertise: &str) -> (String, u16) {
    advertise
        .rsplit_once(':')
        .map(|(h, p)| {
            (
                h.trim_matches(['[', ']']).to_owned(),
                p.parse::<u16>().unwrap_or(6443),
            )
        })
        .unwrap_or_else(|| (advertise.to_owned(), 6443))
}

/// Renews this apiserver's lease and reconciles the endpoints every [`RENEW`] until the
/// server stops; then deletes the lease and takes this apiserver's address out.
pub async fn run(api: Arc<Api>) {
    let name = lease_name(&api.advertise);
    loop {
        tokio::select! {
            _ = api.shutdown.cancelled() => break,
            _ = tokio::time::sleep(RENEW) => {}
        }
        if let Err(e) = pass(&api, true).await {
            tracing::warn!(error = %e.message, "reconciling the endpoints of default/kubernetes");
        }
    }
    let _ = api.store.delete(&format!("{LEASES}{name}"), None).await;
    if let Err(e) = pass(&api, false).await {
        tracing::warn!(error = %e.message, "taking this apiserver out of default/kubernetes");
    }
}

/// One pass: renews this apiserver's lease when `alive`, deletes expired leases, and writes
/// the addresses of the live ones (this apiserver's when `alive`, never when not).
pub async fn pass(api: &Api, alive: bool) -> ApiResult<()> {
    let name = lease_name(&api.advertise);
    let (own_host, port) = split_address(&api.advertise);
    if alive {
        renew(api, &name).await?;
    }
    let now = jiff::Timestamp::now().as_second();
    let listed = api.store.range(RangeRequest::prefix(LEASES)).await?;
    let mut hosts = BTreeSet::new();
    for kv in &listed.kvs {
        let Ok(lease) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        let meta = &lease["metadata"];
        if meta["labels"][IDENTITY_LABEL] != "kube-apiserver" {
            continue;
        }
        if meta["name"] == name.as_str() {
            continue;
        }
        let renewed = lease["spec"]["renewTime"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map_or(0, |t| t.as_second());
        let duration = lease["spec"]["leaseDurationSeconds"]
            .as_i64()
            .unwrap_or(TTL_SECONDS);
        if now - renewed >= duration {
            // Expired: its apiserver is gone (deleted only if no one renewed it meanwhile).
            let _ = api.store.delete(&kv.key, Some(kv.mod_revision)).await;
            continue;
        }
        if let Some(address) = meta["annotations"][ADDRESS_ANNOTATION].as_str() {
            hosts.insert(split_address(address).0);
        }
    }
    if alive {
        hosts.insert(own_host);
    }
    write_endpoints(api, &hosts, port).await
}

/// Creates or renews this apiserver's lease.
async fn renew(api: &Api, name: &str) -> ApiResult<()> {
    let key = format!("{LEASES}{name}");
    let renew_time = crate::object::now_micro();
    let Some(kv) = api.store.get(&key).await? else {
        let lease = json!({
            "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
            "metadata": {"name": name, "namespace": "kube-system",
                "labels": {IDENTITY_LABEL: "kube-apiserver"},
                "annotations": {ADDRESS_ANNOTATION: api.advertise}},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": TTL_SECONDS,
                "acquireTime": renew_time, "renewTime": renew_time},
        });
        return ensure(api, &key, lease).await;
    };
    let mut stored: Value = serde_json::from_slice(&kv.value).map_err(ApiError::internal)?;
    stored["spec"]["renewTime"] = json!(renew_time);
    stored["spec"]["leaseDurationSeconds"] = json!(TTL_SECONDS);
    stored["spec"]["holderIdentity"] = json!(name);
    stored["metadata"]["annotations"][ADDRESS_ANNOTATION] = json!(api.advertise);
    match api
        .store
        .update(&key, crate::object::to_store(&mut stored), kv.mod_revision)
        .await
    {
        Ok(_) | Err(minik8s_storage::Error::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets the Endpoints and EndpointSlice `default/kubernetes` to `hosts` on `port` (kube-proxy
/// reads the slice; the Endpoints carry upstream's skip-mirror label).
async fn write_endpoints(api: &Api, hosts: &BTreeSet<String>, port: u16) -> ApiResult<()> {
    let addresses: Vec<Value> = hosts.iter().map(|h| json!({"ip": h})).collect();
    let subsets = if addresses.is_empty() {
        json!([])
    } else {
        json!([{"addresses": addresses,
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}])
    };
    let ep = json!({
        "kind": "Endpoints", "apiVersion": "v1",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": subsets,
    });
    ensure_fields(
        api,
        "/registry/core/endpoints/default/kubernetes",
        ep,
        &["subsets"],
    )
    .await?;
    let v6 = hosts.iter().next().is_some_and(|h| h.contains(':'));
    let endpoints: Vec<Value> = hosts
        .iter()
        .map(|h| json!({"addresses": [h], "conditions": {"ready": true}}))
        .collect();
    let slice = json!({
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "endpoints": endpoints,
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    ensure_fields(
        api,
        "/registry/discovery.k8s.io/endpointslices/default/kubernetes",
        slice,
        &["addressType", "endpoints", "ports"],
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_stable_and_distinct() {
        assert_eq!(lease_name("10.0.0.1:6443"), lease_name("10.0.0.1:6443"));
        assert_ne!(lease_name("10.0.0.1:6443"), lease_name("10.0.0.2:6443"));
        assert!(lease_name("x").starts_with("apiserver-"));
        assert_eq!(lease_name("x").len(), "apiserver-".len() + 16);
    }

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(split_address("10.0.0.1:6443"), ("10.0.0.1".into(), 6443));
        assert_eq!(split_address("[::1]:443"), ("::1".into(), 443));
        assert_eq!(split_address("host"), ("host".into(), 6443));
    }
}

//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does:
//! a candidate takes the Lease when it is free or has not changed for a whole lease
//! duration (measured on the candidate's own clock, so clock skew does not matter), the
//! leader renews it every retry period, and a leader that cannot renew within the renew
//! deadline stops leading. Writes carry the Lease's resourceVersion, so two candidates can
//! never both win. On shutdown the leader releases the Lease for a fast handover.

use futures::FutureExt;
use futures::future::FusedFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Where and how to hold the Lease.
#[derive(Clone, Debug)]
pub struct Config {
    /// Namespace of the Lease (`kube-system`).
    pub namespace: String,
    /// Name of the Lease (`kube-controller-manager`).
    pub name: String,
    /// This candidate's identity (`<host>_<uuid>`).
    pub identity: String,
    /// How long a Lease stays valid without renewal.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up leading.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and leaders renew.
    pub retry_period: Duration,
}

impl Config {
    /// Upstream's Lease names with timings that hand over within 15 s of a leader's death.
    pub fn new(name: &str, identity: String) -> Config {
        Config {
            namespace: "kube-system".into(),
            name: name.into(),
            identity,
            lease_duration: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(7),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// A unique identity for this process: host name, then a random suffix.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into());
    format!("{host}_{}", crate::util::random_suffix())
}

/// What a candidate saw of a Lease the last time it looked.
#[derive(Default, Clone, Debug)]
pub struct Observed {
    /// holderIdentity and renewTime as last seen.
    record: Option<(Option<String>, Option<String>)>,
    /// When that record was first seen (local clock).
    since: Option<Instant>,
}

impl Observed {
    /// Notes the Lease as it is now; the clock restarts when its holder or renewTime changed.
    pub fn see(&mut self, lease: &Lease) {
        let spec = lease.spec.as_ref();
        let record = Some((
            spec.and_then(|s| s.holder_identity.clone()),
            spec.and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
        ));
        if record != self.record {
            self.record = record;
            self.since = Some(Instant::now());
        }
    }

    /// How long until the Lease as last seen expires by this candidate's clock (zero when it
    /// has; `None` when never seen).
    pub fn expires_in(&self, duration: Duration) -> Option<Duration> {
        self.since.map(|t| duration.saturating_sub(t.elapsed()))
    }
}

/// Whether a Lease may be taken by `me`: it is mine, free, or unchanged for its duration.
pub fn takeable(lease: &Lease, me: &str, observed: &Observed, default_duration: Duration) -> bool {
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("");
    if holder.is_empty() || holder == me {
        return true;
    }
    let duration = spec
        .and_then(|s| s.lease_duration_seconds)
        .map_or(default_duration, |d| Duration::from_secs(d.max(1) as u64));
    observed.since.is_some_and(|t| t.elapsed() >= duration)
}

/// One Lease a candidate holds or tries to.
#[derive(Clone, Debug)]
pub struct Hold<'a> {
    /// The Lease's name (in the `Api`'s namespace).
    pub name: &'a str,
    /// The candidate.
    pub identity: &'a str,
    /// `leaseDurationSeconds`.
    pub duration: Duration,
    /// Labels a created Lease carries (so its holders can watch theirs by label).
    pub labels: &'a std::collections::BTreeMap<String, String>,
}

/// Tries once to acquire or renew a Lease; `Ok(true)` when `hold.identity` holds it. With
/// `last` (the Lease as this candidate last wrote it) a renewal is one write; without it, or
/// when it is stale, the Lease is read first. `last` is left as written, or `None`.
pub async fn try_hold(
    api: &Api<Lease>,
    hold: &Hold<'_>,
    observed: &mut Observed,
    last: &mut Option<Lease>,
) -> kube::Result<bool> {
    let now = MicroTime(jiff::Timestamp::now());
    let secs = hold.duration.as_secs() as i32;
    let current = match last.take() {
        Some(l) => Some(l),
        None => api.get_opt(hold.name).await?,
    };
    let Some(mut lease) = current else {
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": hold.name, "labels": hold.labels},
            "spec": {"holderIdentity": hold.identity, "leaseDurationSeconds": secs,
                "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
        }))
        .expect("lease");
        return match api.create(&PostParams::default(), &lease).await {
            Ok(written) => {
                observed.see(&written);
                *last = Some(written);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    observed.see(&lease);
    if !takeable(&lease, hold.identity, observed, hold.duration) {
        return Ok(false);
    }
    let spec = lease.spec.get_or_insert_default();
    if spec.holder_identity.as_deref() != Some(hold.identity) {
        spec.holder_identity = Some(hold.identity.to_owned());
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(secs);
    spec.renew_time = Some(now);
    // The resourceVersion makes this a compare-and-swap: a rival's write makes it a 409.
    match api
        .replace(&lease.name_any(), &PostParams::default(), &lease)
        .await
    {
        Ok(written) => {
            observed.see(&written);
            *last = Some(written);
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives a Lease up (if `identity` still holds it) so another candidate can take it at once.
pub async fn release(api: &Api<Lease>, name: &str, identity: &str) {
    let Ok(Some(mut lease)) = api.get_opt(name).await else {
        return;
    };
    let spec = lease.spec.get_or_insert_default();
    if spec.holder_identity.as_deref() != Some(identity) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    if let Err(e) = api.replace(name, &PostParams::default(), &lease).await {
        tracing::warn!(error = %e, lease = name, "could not release the lease");
    }
}

/// Runs `lead` while this process holds the Lease, until `shutdown`. `lead` gets a token
/// that is cancelled when leadership is lost (it must then stop and return); after a loss
/// the process becomes a candidate again.
pub async fn run<F, Fut>(client: Client, cfg: Config, shutdown: CancellationToken, lead: F)
where
    F: Fn(CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut observed = Observed::default();
    let labels = std::collections::BTreeMap::new();
    let hold = Hold {
        name: &cfg.name,
        identity: &cfg.identity,
        duration: cfg.lease_duration,
        labels: &labels,
    };
    while !shutdown.is_cancelled() {
        match try_hold(&api, &hold, &mut observed, &mut None).await {
            Ok(true) => {}
            Ok(false) => {
                sleep_or(&shutdown, cfg.retry_period).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "lease: acquiring failed");
                sleep_or(&shutdown, cfg.retry_period).await;
                continue;
            }
        }
        tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became leader");
        leading_status(&cfg.name, 1);
        let leading = shutdown.child_token();
        let mut work = minik8s_task::spawn("leading", lead(leading.clone())).fuse();
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = &mut work => break,
                _ = tokio::time::sleep(cfg.retry_period) => {}
            }
            if shutdown.is_cancelled() {
                break;
            }
            match try_hold(&api, &hold, &mut observed, &mut None).await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => {
                    tracing::warn!(lease = %cfg.name, "lease taken by another candidate");
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "lease: renewing failed"),
            }
            if renewed.elapsed() >= cfg.renew_deadline {
                tracing::warn!(lease = %cfg.name, "could not renew the lease in time");
                break;
            }
        }
        leading.cancel();
        leading_status(&cfg.name, 0);
        if !work.is_terminated() {
            let _ = work.await;
        }
        if shutdown.is_cancelled() {
            release(&api, &cfg.name, &cfg.identity).await;
        } else {
            tracing::warn!(lease = %cfg.name, "stopped leading; standing as a candidate again");
        }
    }
}

/// Sets `leader_election_master_status{name}` (1 while leading), as upstream's.
fn leading_status(name: &str, v: i64) {
    static G: std::sync::OnceLock<minik8s_metrics::GaugeVec> = std::sync::OnceLock::new();
    let g = G.get_or_init(|| {
        let g = minik8s_metrics::GaugeVec::default();
        minik8s_metrics::register(
            "controller-manager",
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            g.clone(),
        );
        g
    });
    g.get_or_create(&minik8s_metrics::labels(&[("name", name)]))
        .set(v);
}

async fn sleep_or(shutdown: &CancellationToken, d: Duration) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: &str) -> Lease {
        serde_json::from_value(json!({"metadata": {"name": "l"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 1, "renewTime": renewed}}))
        .unwrap()
    }

    #[test]
    fn a_lease_is_takeable_when_free_mine_or_unchanged_for_its_duration() {
        let mut seen = Observed::default();
        let free = lease(None, "2026-01-01T00:00:00.000000Z");
        assert!(takeable(&free, "me", &seen, Duration::from_secs(1)));
        let other = lease(Some("rival"), "2026-01-01T00:00:00.000000Z");
        seen.see(&other);
        assert!(!takeable(&other, "me", &seen, Duration::from_secs(1)));
        assert!(takeable(&other, "rival", &seen, Duration::from_secs(1)));
        std::thread::sleep(Duration::from_millis(1100));
        // Unchanged for longer than its duration (by our clock): expired.
        seen.see(&other);
        assert!(takeable(&other, "me", &seen, Duration::from_secs(1)));
        // A renewal resets the clock.
        seen.see(&lease(Some("rival"), "2026-01-01T00:00:05.000000Z"));
        assert!(!takeable(&other, "me", &seen, Duration::from_secs(1)));
    }
}

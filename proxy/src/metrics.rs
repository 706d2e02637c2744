//! The proxy's Prometheus series, as upstream's kube-proxy names them: how long each sync of
//! the rules takes, when the last one was, how many rules each table holds, and failed
//! loads. Served on the proxy's metrics address (10249, plain HTTP, as upstream) and, in
//! `minik8s up`, on the apiserver's `/metrics`.

use minik8s_metrics::{GaugeVec, labels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

const COMPONENT: &str = "proxy";

/// The proxy's series.
pub struct Metrics {
    sync: Histogram,
    last: Gauge<f64, AtomicU64>,
    rules: GaugeVec,
    failures: Counter,
}

/// The process's proxy series (registered on first use).
pub fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics {
            // Upstream's buckets: 1 ms doubling.
            sync: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            last: Gauge::default(),
            rules: GaugeVec::default(),
            failures: Counter::default(),
        };
        use minik8s_metrics::register as r;
        r(
            COMPONENT,
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync.clone(),
        );
        r(
            COMPONENT,
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last.clone(),
        );
        r(
            COMPONENT,
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            m.rules.clone(),
        );
        r(
            COMPONENT,
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            m.failures.clone(),
        );
        m
    })
}

/// The number of rules (`-A` lines) per table in `iptables-restore` input.
pub fn rules_per_table(rules: &str) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = Vec::new();
    for line in rules.lines() {
        if let Some(table) = line.strip_prefix('*') {
            out.push((table.to_owned(), 0));
        } else if line.starts_with("-A ")
            && let Some(last) = out.last_mut()
        {
            last.1 += 1;
        }
    }
    out
}

impl Metrics {
    /// A successful sync that took `secs` and left `rules` loaded.
    pub fn synced(&self, secs: Option<f64>, rules: &str) {
        if let Some(s) = secs {
            self.sync.observe(s);
        }
        self.last.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        for (table, n) in rules_per_table(rules) {
            self.rules
                .get_or_create(&labels(&[("table", &table)]))
                .set(n);
        }
    }

    /// A load that failed.
    pub fn failed(&self) {
        self.failures.inc();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rules_are_counted_per_table() {
        let text = "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n*nat\n-A A -j B\n-A C -j D\nCOMMIT\n";
        assert_eq!(
            super::rules_per_table(text),
            [("filter".to_owned(), 1), ("nat".to_owned(), 2)]
        );
    }
}

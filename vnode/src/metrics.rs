//! The virtual nodes' series: nodes held, Lease races won and lost, take-overs, and how long
//! provider calls take.

use minik8s_metrics::{CounterVec, HistogramVec};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::OnceLock;
use std::time::Duration;

/// The component the series are registered under.
pub const COMPONENT: &str = "vnode";

/// The process's virtual-node series.
pub struct Metrics {
    /// `vnode_held`: nodes this replica serves.
    pub held: Gauge,
    /// `vnode_lease_races_total{result="won"|"lost"}`.
    pub races: CounterVec,
    /// `vnode_takeovers_total`: nodes taken over from another replica.
    pub takeovers: Counter,
    calls: HistogramVec,
}

/// The series (registered on first use).
pub fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics {
            held: Gauge::default(),
            races: CounterVec::default(),
            takeovers: Counter::default(),
            calls: minik8s_metrics::latency_family(),
        };
        use minik8s_metrics::register as r;
        r(
            COMPONENT,
            "vnode_held",
            "Virtual nodes this replica serves (holds the Lease of)",
            m.held.clone(),
        );
        r(
            COMPONENT,
            "vnode_lease_races",
            "Node Lease races, by result (won or lost)",
            m.races.clone(),
        );
        r(
            COMPONENT,
            "vnode_takeovers",
            "Virtual nodes taken over from another replica",
            m.takeovers.clone(),
        );
        r(
            COMPONENT,
            "vnode_provider_call_duration_seconds",
            "How long provider calls take, by call",
            m.calls.clone(),
        );
        m
    })
}

impl Metrics {
    /// A provider call `call` took `took`.
    pub fn provider_call(&self, call: &str, took: Duration) {
        self.calls
            .get_or_create(&minik8s_metrics::labels(&[("call", call)]))
            .observe(took.as_secs_f64());
    }
}

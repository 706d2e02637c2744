//! The kubelet's Prometheus series, with upstream's names. `/metrics`: pods and containers
//! running (counted from the runtime at each scrape), pods and containers started, and how
//! long a pod worker's sync takes. `/metrics/resource`: node, pod and container CPU time and
//! working-set memory from the runtime's stats (the `/stats/summary` figures), as upstream's
//! resource endpoint (which metrics-server reads) names them.

use crate::cri::{Cri, labels as cri_labels};
use minik8s_metrics::{CounterVec, GaugeVec, HistogramVec, labels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

const COMPONENT: &str = "kubelet";

/// The kubelet's series.
pub struct Metrics {
    running_pods: Gauge,
    running_containers: GaugeVec,
    started_pods: Counter,
    started_containers: CounterVec,
    pod_worker: HistogramVec,
    node_name: GaugeVec,
}

/// The process's kubelet series (registered on first use).
pub fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics {
            running_pods: Gauge::default(),
            running_containers: GaugeVec::default(),
            started_pods: Counter::default(),
            started_containers: CounterVec::default(),
            pod_worker: minik8s_metrics::latency_family(),
            node_name: GaugeVec::default(),
        };
        use minik8s_metrics::register as r;
        r(COMPONENT, "kubelet_running_pods", "Number of pods that have a running pod sandbox", m.running_pods.clone());
        r(COMPONENT, "kubelet_running_containers", "Number of containers currently running", m.running_containers.clone());
        r(COMPONENT, "kubelet_started_pods", "Cumulative number of pods started", m.started_pods.clone());
        r(COMPONENT, "kubelet_started_containers", "Cumulative number of containers started", m.started_containers.clone());
        r(COMPONENT, "kubelet_pod_worker_duration_seconds", "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync", m.pod_worker.clone());
        r(COMPONENT, "kubelet_node_name", "The node's name. The count is always 1.", m.node_name.clone());
        m
    })
}

impl Metrics {
    /// A pod's sandbox was started.
    pub fn pod_started(&self) {
        self.started_pods.inc();
    }

    /// A container was started.
    pub fn container_started(&self) {
        self.started_containers
            .get_or_create(&labels(&[("container_type", "container")]))
            .inc();
    }

    /// One pod sync took `secs`.
    pub fn pod_synced(&self, operation: &str, secs: f64) {
        self.pod_worker
            .get_or_create(&labels(&[("operation_type", operation)]))
            .observe(secs);
    }

    /// Refreshes the gauges counted from the runtime.
    pub async fn refresh(&self, cri: &Cri, node: &str) {
        self.node_name
            .get_or_create(&labels(&[("node", node)]))
            .set(1);
        let mine = HashMap::from([(cri_labels::NODE.to_owned(), node.to_owned())]);
        if let Ok(sandboxes) = cri.sandboxes(mine.clone()).await {
            let ready = sandboxes.iter().filter(|s| s.state == 0).count();
            self.running_pods.set(ready as i64);
        }
        if let Ok(containers) = cri.containers(mine).await {
            let mut by_state: HashMap<&str, i64> = HashMap::from([
                ("created", 0),
                ("running", 0),
                ("exited", 0),
                ("unknown", 0),
            ]);
            for c in &containers {
                let state = match c.state {
                    0 => "created",
                    1 => "running",
                    2 => "exited",
                    _ => "unknown",
                };
                *by_state.entry(state).or_default() += 1;
            }
            for (state, n) in by_state {
                self.running_containers
                    .get_or_create(&labels(&[("container_state", state)]))
                    .set(n);
            }
        }
    }
}

type FloatGauge = prometheus_client::metrics::gauge::Gauge<f64, AtomicU64>;
type FloatCounter = prometheus_client::metrics::counter::Counter<f64, AtomicU64>;

/// The `/metrics/resource` series of one `/stats/summary` document.
pub fn resource_registry(summary: &Value) -> Registry {
    let mut r = Registry::default();
    let num = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(0.0);
    let node_cpu = FloatCounter::default();
    node_cpu.inc_by(num(summary, "/node/cpu/usageCoreNanoSeconds") / 1e9);
    let node_mem = FloatGauge::default();
    node_mem.set(num(summary, "/node/memory/workingSetBytes"));
    r.register(
        "node_cpu_usage_seconds",
        "Cumulative cpu time consumed by the node in core-seconds",
        node_cpu,
    );
    r.register(
        "node_memory_working_set_bytes",
        "Current working set of the node in bytes",
        node_mem,
    );
    let c_cpu = prometheus_client::metrics::family::Family::<
        minik8s_metrics::Labels,
        FloatCounter,
    >::default();
    let c_mem =
        prometheus_client::metrics::family::Family::<minik8s_metrics::Labels, FloatGauge>::default(
        );
    let c_start =
        prometheus_client::metrics::family::Family::<minik8s_metrics::Labels, FloatGauge>::default(
        );
    let p_cpu = prometheus_client::metrics::family::Family::<
        minik8s_metrics::Labels,
        FloatCounter,
    >::default();
    let p_mem =
        prometheus_client::metrics::family::Family::<minik8s_metrics::Labels, FloatGauge>::default(
        );
    for pod in summary
        .get("pods")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
        let (name, ns) = (s("/podRef/name"), s("/podRef/namespace"));
        let pod_labels = labels(&[("namespace", ns), ("pod", name)]);
        let (mut cpu, mut mem) = (0.0, 0.0);
        for c in pod
            .get("containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let cname = c.get("name").and_then(Value::as_str).unwrap_or("");
            let l = labels(&[("container", cname), ("namespace", ns), ("pod", name)]);
            let used = num(c, "/cpu/usageCoreNanoSeconds") / 1e9;
            let working = num(c, "/memory/workingSetBytes");
            cpu += used;
            mem += working;
            c_cpu.get_or_create(&l).inc_by(used);
            c_mem.get_or_create(&l).set(working);
            if let Some(t) = c
                .get("startTime")
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            {
                c_start
                    .get_or_create(&l)
                    .set(t.as_millisecond() as f64 / 1000.0);
            }
        }
        p_cpu.get_or_create(&pod_labels).inc_by(cpu);
        p_mem.get_or_create(&pod_labels).set(mem);
    }
    r.register(
        "container_cpu_usage_seconds",
        "Cumulative cpu time consumed by the container in core-seconds",
        c_cpu,
    );
    r.register(
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        c_mem,
    );
    r.register(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds",
        c_start,
    );
    r.register(
        "pod_cpu_usage_seconds",
        "Cumulative cpu time consumed by the pod in core-seconds",
        p_cpu,
    );
    r.register(
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        p_mem,
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resource_metrics_follow_the_summary() {
        let summary = json!({
            "node": {"cpu": {"usageCoreNanoSeconds": 5_000_000_000u64}, "memory": {"workingSetBytes": 1024}},
            "pods": [{"podRef": {"name": "p", "namespace": "ns"}, "containers": [
                {"name": "a", "startTime": "2026-01-01T00:00:00Z",
                 "cpu": {"usageCoreNanoSeconds": 1_500_000_000u64}, "memory": {"workingSetBytes": 100}},
                {"name": "b", "cpu": {"usageCoreNanoSeconds": 500_000_000u64}, "memory": {"workingSetBytes": 50}},
            ]}],
        });
        let r = resource_registry(&summary);
        let text = minik8s_metrics::encode(&[], &[&r]);
        for want in [
            "node_cpu_usage_seconds_total 5.0",
            "node_memory_working_set_bytes 1024.0",
            "container_cpu_usage_seconds_total{container=\"a\",namespace=\"ns\",pod=\"p\"} 1.5",
            "pod_cpu_usage_seconds_total{namespace=\"ns\",pod=\"p\"} 2.0",
            "pod_memory_working_set_bytes{namespace=\"ns\",pod=\"p\"} 150.0",
            "container_start_time_seconds{container=\"a\",namespace=\"ns\",pod=\"p\"} 1767225600.0",
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
    }
}

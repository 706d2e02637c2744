//! Prometheus metrics for every minik8s component. Each component (`apiserver`,
//! `controller-manager`, `kubelet`, `proxy`) registers its series in its own registry here,
//! once per process; an endpoint encodes the registries of the components it speaks for
//! (the apiserver of `minik8s up` also serves the controller manager's and the proxy's, which
//! run in its process). The text is OpenMetrics, which Prometheus scrapes.

pub mod serving;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A label set: `(name, value)` pairs in a fixed order.
pub type Labels = Vec<(String, String)>;

/// Counters by label set.
pub type CounterVec = Family<Labels, Counter>;

/// Gauges by label set.
pub type GaugeVec = Family<Labels, Gauge>;

/// Histograms by label set.
pub type HistogramVec = Family<Labels, Histogram, fn() -> Histogram>;

/// Upstream's request-latency buckets (seconds), as the apiserver and workqueues use.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// A histogram family with [`LATENCY_BUCKETS`].
pub fn latency_family() -> HistogramVec {
    Family::new_with_constructor(latency_histogram as fn() -> Histogram)
}

/// A label set from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn registries() -> &'static Mutex<BTreeMap<&'static str, Registry>> {
    static R: OnceLock<Mutex<BTreeMap<&'static str, Registry>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Registers `metric` as `name` in `component`'s registry. Counters get `_total` appended on
/// output, as OpenMetrics names them.
pub fn register(component: &'static str, name: &str, help: &str, metric: impl Metric) {
    let mut r = registries().lock().expect("metrics registry");
    r.entry(component).or_default().register(name, help, metric);
}

/// Whether `component` has registered anything in this process.
pub fn has(component: &str) -> bool {
    registries()
        .lock()
        .expect("metrics registry")
        .contains_key(component)
}

/// The OpenMetrics text of the given components' registries (those present), plus `extra`
/// registries built for this scrape.
pub fn encode(components: &[&str], extra: &[&Registry]) -> String {
    let mut text = String::new();
    {
        let r = registries().lock().expect("metrics registry");
        for c in components {
            if let Some(reg) = r.get(c) {
                // Writing to a String cannot fail.
                let _ = prometheus_client::encoding::text::encode_registry(&mut text, reg);
            }
        }
    }
    for reg in extra {
        let _ = prometheus_client::encoding::text::encode_registry(&mut text, reg);
    }
    let _ = prometheus_client::encoding::text::encode_eof(&mut text);
    text
}

/// The workqueue series upstream's controllers expose, one `name` label per controller. A
/// controller here is either a kube-runtime reconciler (one item per object reconciled) or a
/// periodic pass over its informers' stores (one item per pass).
pub struct Workqueue {
    adds: CounterVec,
    retries: CounterVec,
    work: HistogramVec,
    queued: HistogramVec,
    busy: GaugeVec,
}

/// The controller manager's workqueue series.
pub fn workqueue() -> &'static Workqueue {
    static W: OnceLock<Workqueue> = OnceLock::new();
    W.get_or_init(|| {
        let w = Workqueue {
            adds: CounterVec::default(),
            retries: CounterVec::default(),
            work: latency_family(),
            queued: latency_family(),
            busy: GaugeVec::default(),
        };
        const C: &str = "controller-manager";
        register(
            C,
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            w.adds.clone(),
        );
        register(
            C,
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            w.retries.clone(),
        );
        register(
            C,
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            w.work.clone(),
        );
        register(
            C,
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            w.queued.clone(),
        );
        register(
            C,
            "workqueue_depth",
            "Current depth of workqueue: items being processed (kube-runtime keeps its pending queue to itself)",
            w.busy.clone(),
        );
        w
    })
}

impl Workqueue {
    /// Records how long an item of controller `name` waited, from the change that queued
    /// it to its start.
    pub fn waited(&'static self, name: &'static str, waited: std::time::Duration) {
        self.queued
            .get_or_create(&labels(&[("name", name)]))
            .observe(waited.as_secs_f64());
    }

    /// Starts an item of controller `name`; finish it with [`Item::done`].
    pub fn start(&'static self, name: &'static str) -> Item {
        let l = labels(&[("name", name)]);
        self.adds.get_or_create(&l).inc();
        self.busy.get_or_create(&l).inc();
        // Shown (at zero) before the first retry, as upstream's queues show it.
        let _ = self.retries.get_or_create(&l);
        Item {
            queue: self,
            name,
            started: std::time::Instant::now(),
        }
    }
}

/// One item of work being processed.
pub struct Item {
    queue: &'static Workqueue,
    name: &'static str,
    started: std::time::Instant,
}

impl Item {
    /// Records the item's duration; a failed item counts as a retry (it is requeued).
    pub fn done(self, ok: bool) {
        let l = labels(&[("name", self.name)]);
        self.queue
            .work
            .get_or_create(&l)
            .observe(self.started.elapsed().as_secs_f64());
        self.queue.busy.get_or_create(&l).dec();
        if !ok {
            self.queue.retries.get_or_create(&l).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_encode_separately_with_one_eof() {
        let c = CounterVec::default();
        register("test-a", "things", "Things done", c.clone());
        c.get_or_create(&labels(&[("kind", "x")])).inc_by(3);
        let g = Gauge::<i64>::default();
        register("test-b", "level", "A level", g.clone());
        g.set(7);
        let a = encode(&["test-a"], &[]);
        assert!(a.contains("# TYPE things counter"), "{a}");
        assert!(a.contains("things_total{kind=\"x\"} 3"), "{a}");
        assert!(!a.contains("level"), "{a}");
        let both = encode(&["test-a", "test-b", "absent"], &[]);
        assert!(both.contains("level 7"), "{both}");
        assert_eq!(both.matches("# EOF").count(), 1);
        assert!(both.ends_with("# EOF\n"));
    }

    #[test]
    fn workqueue_items_count_adds_retries_and_time() {
        let w = workqueue();
        w.start("unit").done(true);
        w.start("unit").done(false);
        w.waited("unit", std::time::Duration::from_millis(3));
        let text = encode(&["controller-manager"], &[]);
        assert!(
            text.contains("workqueue_adds_total{name=\"unit\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_retries_total{name=\"unit\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_work_duration_seconds_count{name=\"unit\"} 2"),
            "{text}"
        );
        assert!(text.contains("workqueue_depth{name=\"unit\"} 0"), "{text}");
        assert!(
            text.contains("workqueue_queue_duration_seconds_bucket{le=\"0.005\",name=\"unit\"} 1"),
            "{text}"
        );
    }
}

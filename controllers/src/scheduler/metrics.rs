//! The scheduler's Prometheus series, with kube-scheduler's names and buckets: attempts by
//! result, each attempt's latency (the decision and the binding), the decision alone, and
//! the Bind extension point. The apiserver of `minik8s up` serves them with the controller
//! manager's series.

use minik8s_metrics::{CounterVec, HistogramVec, labels};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::OnceLock;
use std::time::Duration;

const COMPONENT: &str = "controller-manager";

/// Every decision here is labelled with the default profile (upstream labels by profile,
/// which is the scheduler's name).
pub const PROFILE: &str = "default-scheduler";

/// How an attempt ended, as upstream's `result` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Bound to a node.
    Scheduled,
    /// No node fits.
    Unschedulable,
    /// The binding (or the status write) failed.
    Error,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Scheduled => "scheduled",
            Outcome::Unschedulable => "unschedulable",
            Outcome::Error => "error",
        }
    }
}

/// The scheduler's series.
pub struct Metrics {
    attempts: CounterVec,
    attempt: HistogramVec,
    algorithm: Histogram,
    extension: HistogramVec,
}

/// From 1 ms, doubling: upstream's `ExponentialBuckets(0.001, 2, 15)`.
fn attempt_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// From 0.1 ms, doubling: upstream's `ExponentialBuckets(0.0001, 2, 12)`.
fn extension_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 12))
}

/// The process's scheduler series (registered on first use).
pub fn get() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics {
            attempts: CounterVec::default(),
            attempt: HistogramVec::new_with_constructor(attempt_buckets),
            algorithm: attempt_buckets(),
            extension: HistogramVec::new_with_constructor(extension_buckets),
        };
        use minik8s_metrics::register as r;
        r(COMPONENT, "scheduler_schedule_attempts", "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.", m.attempts.clone());
        r(COMPONENT, "scheduler_scheduling_attempt_duration_seconds", "Scheduling attempt latency in seconds (scheduling algorithm + binding)", m.attempt.clone());
        r(COMPONENT, "scheduler_scheduling_algorithm_duration_seconds", "Scheduling algorithm latency in seconds", m.algorithm.clone());
        r(COMPONENT, "scheduler_framework_extension_point_duration_seconds", "Latency for running all plugins of a specific extension point.", m.extension.clone());
        m
    })
}

impl Metrics {
    /// An attempt ended `outcome` after `took` (from its start to the binding's answer).
    pub fn attempted(&self, outcome: Outcome, took: Duration) {
        let l = labels(&[("result", outcome.label()), ("profile", PROFILE)]);
        self.attempts.get_or_create(&l).inc();
        self.attempt.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// A decision (filtering and scoring the nodes) took `took`.
    pub fn decided(&self, took: Duration) {
        self.algorithm.observe(took.as_secs_f64());
    }

    /// A binding was answered after `took`, `ok` or not.
    pub fn bound(&self, ok: bool, took: Duration) {
        let status = if ok { "Success" } else { "Error" };
        self.extension
            .get_or_create(&labels(&[
                ("extension_point", "Bind"),
                ("status", status),
                ("profile", PROFILE),
            ]))
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_and_their_parts_are_told_by_upstreams_names() {
        let m = get();
        m.attempted(Outcome::Scheduled, Duration::from_millis(3));
        m.attempted(Outcome::Unschedulable, Duration::from_millis(1));
        m.decided(Duration::from_micros(500));
        m.bound(true, Duration::from_millis(2));
        // Other tests in this process schedule too: the series are checked, not their counts.
        let text = minik8s_metrics::encode(&[COMPONENT], &[]);
        for want in [
            "scheduler_schedule_attempts_total{result=\"scheduled\",profile=\"default-scheduler\"} ",
            "scheduler_schedule_attempts_total{result=\"unschedulable\",profile=\"default-scheduler\"} ",
            "scheduler_scheduling_attempt_duration_seconds_bucket{le=\"0.001\",result=\"scheduled\",profile=\"default-scheduler\"} ",
            "scheduler_scheduling_algorithm_duration_seconds_count ",
            "scheduler_framework_extension_point_duration_seconds_count{extension_point=\"Bind\",status=\"Success\",profile=\"default-scheduler\"} ",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
    }
}

//! What the scale harness measures: API call latencies from the client's side and from the
//! server's `apiserver_request_duration_seconds`, the SLOs of Kubernetes' scalability SIG over
//! them, and 5xx answers from `apiserver_request_total`.

use crate::bench::percentiles;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A call's class: (verb, resource, scope), as upstream's metrics label it.
pub type Call = (String, String, String);

/// Latencies of the calls the harness makes itself, and the errors they met.
#[derive(Default)]
pub struct Client {
    /// By the phase of the load they were made in.
    latencies: Mutex<BTreeMap<(&'static str, Call), Vec<Duration>>>,
    phase: Mutex<&'static str>,
    errors: Mutex<BTreeMap<(Call, u16), u64>>,
    paused: std::sync::atomic::AtomicBool,
    /// Calls that took longer than [`SLOW`], by phase, as they ended (at most [`SLOW_KEPT`]
    /// a phase): when in the run a tail happened, to set beside the server's view of it.
    slow: Mutex<BTreeMap<&'static str, Vec<Value>>>,
}

/// A call slower than this is logged with the time it ended (every SLO's bound is 1 s or more).
const SLOW: Duration = Duration::from_secs(1);
/// How many slow calls a report keeps per phase (a busy phase cannot crowd out the rest).
const SLOW_KEPT: usize = 300;

impl Client {
    /// Stops (or resumes) recording: while the server is down on purpose.
    pub fn pause(&self, paused: bool) {
        self.paused
            .store(paused, std::sync::atomic::Ordering::Relaxed);
    }

    /// The calls from now on are of `phase` of the load.
    pub fn enter(&self, phase: &'static str) {
        *self.phase.lock().expect("phase") = phase;
    }

    /// Times `call`, recorded under `verb`, `resource` and `scope` (`resource`, `namespace`
    /// or `cluster`).
    pub async fn time<T>(
        &self,
        (verb, resource, scope): (&str, &str, &str),
        call: impl Future<Output = kube::Result<T>>,
    ) -> kube::Result<T> {
        let t = Instant::now();
        let out = call.await;
        let took = t.elapsed();
        if self.paused.load(std::sync::atomic::Ordering::Relaxed) {
            return out;
        }
        let key = (verb.to_owned(), resource.to_owned(), scope.to_owned());
        match &out {
            Ok(_) => {
                let phase = *self.phase.lock().expect("phase");
                if took > SLOW {
                    let mut slow = self.slow.lock().expect("slow");
                    let kept = slow.entry(phase).or_default();
                    if kept.len() < SLOW_KEPT {
                        let ended = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default();
                        kept.push(json!({
                            "verb": verb, "resource": resource, "scope": scope,
                            "ended_unix_s": ended.as_secs(), "ms": took.as_millis() as u64,
                        }));
                    }
                }
                self.latencies
                    .lock()
                    .expect("latencies")
                    .entry((phase, key))
                    .or_default()
                    .push(took);
            }
            Err(e) => {
                let code = match e {
                    kube::Error::Api(s) => s.code,
                    _ => 0,
                };
                *self
                    .errors
                    .lock()
                    .expect("errors")
                    .entry((key, code))
                    .or_default() += 1;
            }
        }
        out
    }

    /// Each class's count and p50/p99 in milliseconds.
    pub fn report(&self) -> Vec<Value> {
        let mut all: BTreeMap<Call, Vec<Duration>> = BTreeMap::new();
        for ((_, call), samples) in self.latencies.lock().expect("latencies").iter() {
            all.entry(call.clone()).or_default().extend(samples);
        }
        all.iter_mut()
            .map(|(call, samples)| row(call, samples))
            .collect()
    }

    /// [`Client::report`] for each phase of the load.
    pub fn report_by_phase(&self) -> BTreeMap<&'static str, Vec<Value>> {
        let mut out: BTreeMap<&'static str, Vec<Value>> = BTreeMap::new();
        for ((phase, call), samples) in self.latencies.lock().expect("latencies").iter_mut() {
            out.entry(phase).or_default().push(row(call, samples));
        }
        out
    }

    /// The calls slower than [`SLOW`], by phase, each in the order they ended.
    pub fn slow(&self) -> Value {
        json!(*self.slow.lock().expect("slow"))
    }

    /// Errors by class and code (0: no HTTP answer).
    pub fn errors(&self) -> Vec<Value> {
        self.errors
            .lock()
            .expect("errors")
            .iter()
            .map(|((c, code), n)| {
                json!({"verb": c.0, "resource": c.1, "scope": c.2, "code": code, "count": n})
            })
            .collect()
    }
}

/// A class's count and p50/p99 in milliseconds.
fn row((verb, resource, scope): &Call, samples: &mut [Duration]) -> Value {
    let mut row = percentiles(samples);
    row["verb"] = json!(verb);
    row["resource"] = json!(resource);
    row["scope"] = json!(scope);
    row["count"] = json!(samples.len());
    row
}

/// The slowest row (by p99) of each SLO class.
pub fn worst(rows: &[Value]) -> BTreeMap<&'static str, Value> {
    let mut out: BTreeMap<&'static str, Value> = BTreeMap::new();
    for r in rows {
        let (Some(verb), Some(scope)) = (r["verb"].as_str(), r["scope"].as_str()) else {
            continue;
        };
        let Some((class, _)) = slo(verb, scope) else {
            continue;
        };
        let p99 = r["p99_ms"].as_f64().unwrap_or(0.0);
        if out
            .get(class)
            .is_none_or(|w| w["p99_ms"].as_f64().unwrap_or(0.0) < p99)
        {
            out.insert(class, r.clone());
        }
    }
    out
}

/// A metric's labels and value, from one line of Prometheus' text format.
fn sample(line: &str) -> Option<(&str, BTreeMap<&str, &str>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (head, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}')?),
        None => (head, ""),
    };
    let mut map = BTreeMap::new();
    // Label values here never hold `",`.
    for pair in labels.split("\",") {
        if let Some((k, v)) = pair.split_once("=\"") {
            map.insert(k, v.trim_end_matches('"'));
        }
    }
    Some((name, map, value))
}

/// One histogram series: cumulative counts by upper bound.
type Buckets = Vec<(f64, f64)>;

/// What a `/metrics` scrape holds of requests: latency histograms by (verb, resource,
/// subresource, scope), and answers by (verb, resource, code); and of the scheduler, where
/// the apiserver serves its series (minik8s's does; upstream's kube-scheduler serves them on
/// a port of its own): its attempts' latency by result, its decisions' and its bindings'.
#[derive(Default, Clone)]
pub struct Scrape {
    latency: BTreeMap<(String, String, String, String), Buckets>,
    answers: BTreeMap<(String, String, String), f64>,
    scheduler: BTreeMap<String, Buckets>,
}

/// A histogram's bucket line's upper bound.
fn upper_bound(labels: &BTreeMap<&str, &str>) -> Option<f64> {
    match labels.get("le") {
        Some(&"+Inf") => Some(f64::INFINITY),
        Some(le) => Some(le.parse().unwrap_or(f64::INFINITY)),
        None => None,
    }
}

/// `after`'s counts less `before`'s, series by series.
fn subtract<K: Ord>(after: &mut BTreeMap<K, Buckets>, before: &BTreeMap<K, Buckets>) {
    for (k, buckets) in after.iter_mut() {
        if let Some(old) = before.get(k) {
            for (b, o) in buckets.iter_mut().zip(old) {
                b.1 -= o.1;
            }
        }
    }
}

/// `other`'s counts added to `into`'s, series by series.
fn add<K: Ord + Clone>(into: &mut BTreeMap<K, Buckets>, other: &BTreeMap<K, Buckets>) {
    for (k, buckets) in other {
        match into.get_mut(k) {
            Some(mine) if mine.len() == buckets.len() => {
                for (m, o) in mine.iter_mut().zip(buckets) {
                    m.1 += o.1;
                }
            }
            _ => {
                into.insert(k.clone(), buckets.clone());
            }
        }
    }
}

impl Scrape {
    /// What a scrape's text holds of requests.
    pub fn parse(text: &str) -> Scrape {
        let mut s = Scrape::default();
        for line in text.lines() {
            let Some((name, labels, value)) = sample(line) else {
                continue;
            };
            let get = |k: &str| labels.get(k).copied().unwrap_or("").to_owned();
            match name {
                "apiserver_request_duration_seconds_bucket" => {
                    let Some(le) = upper_bound(&labels) else {
                        continue;
                    };
                    s.latency
                        .entry((
                            get("verb"),
                            get("resource"),
                            get("subresource"),
                            get("scope"),
                        ))
                        .or_default()
                        .push((le, value));
                }
                "apiserver_request_total" => {
                    *s.answers
                        .entry((get("verb"), get("resource"), get("code")))
                        .or_default() += value;
                }
                _ => {
                    let series = match name {
                        "scheduler_scheduling_attempt_duration_seconds_bucket" => {
                            format!("attempt_{}", get("result"))
                        }
                        "scheduler_scheduling_algorithm_duration_seconds_bucket" => {
                            "algorithm".to_owned()
                        }
                        // From the pod's change reaching the scheduler to its attempt.
                        "workqueue_queue_duration_seconds_bucket" if get("name") == "scheduler" => {
                            "queue".to_owned()
                        }
                        "scheduler_framework_extension_point_duration_seconds_bucket"
                            if get("extension_point") == "Bind" =>
                        {
                            format!("bind_{}", get("status").to_lowercase())
                        }
                        _ => continue,
                    };
                    if let Some(le) = upper_bound(&labels) {
                        s.scheduler.entry(series).or_default().push((le, value));
                    }
                }
            }
        }
        for b in s.latency.values_mut().chain(s.scheduler.values_mut()) {
            b.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        s
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &Scrape) -> Scrape {
        let mut out = self.clone();
        subtract(&mut out.latency, &before.latency);
        subtract(&mut out.scheduler, &before.scheduler);
        for (k, v) in out.answers.iter_mut() {
            *v -= before.answers.get(k).copied().unwrap_or(0.0);
        }
        out
    }

    /// The requests of `self` and of `other` together: what two processes served, one after
    /// the other (before and after a restart, whose counters start again at zero).
    pub fn plus(&self, other: &Scrape) -> Scrape {
        let mut out = self.clone();
        add(&mut out.latency, &other.latency);
        add(&mut out.scheduler, &other.scheduler);
        for (k, v) in &other.answers {
            *out.answers.entry(k.clone()).or_default() += v;
        }
        out
    }

    /// The scheduler's series with observations: count, p50 and p99 (ms), by series
    /// (`attempt_scheduled`, `attempt_unschedulable`, `algorithm`, `bind_success`, `queue`:
    /// from a pending pod's change reaching the scheduler to its attempt …).
    pub fn scheduler(&self) -> BTreeMap<String, Value> {
        self.scheduler
            .iter()
            .filter_map(|(series, buckets)| {
                let count = buckets.last().map_or(0.0, |b| b.1);
                (count > 0.0).then(|| {
                    let ms = |q| (quantile(buckets, q) * 1e4).round() / 10.0;
                    (
                        series.clone(),
                        json!({"count": count, "p50_ms": ms(0.5), "p99_ms": ms(0.99)}),
                    )
                })
            })
            .collect()
    }

    /// 5xx answers by (verb, resource, code).
    pub fn server_errors(&self) -> Vec<Value> {
        self.answers
            .iter()
            .filter(|((_, _, code), n)| code.starts_with('5') && **n > 0.0)
            .map(|((verb, resource, code), n)| {
                json!({"verb": verb, "resource": resource, "code": code, "count": n})
            })
            .collect()
    }
}

/// The `q` quantile of a cumulative histogram, interpolated within its bucket as Prometheus'
/// `histogram_quantile` does (the upper bound of the last finite bucket beyond it).
fn quantile(buckets: &Buckets, q: f64) -> f64 {
    let total = buckets.last().map_or(0.0, |b| b.1);
    if total <= 0.0 {
        return 0.0;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return lower;
            }
            let width = count - below;
            return if width > 0.0 {
                lower + (le - lower) * (rank - below) / width
            } else {
                le
            };
        }
        (lower, below) = (le, count);
    }
    lower
}

/// The SLO a call class falls under, as the scalability SIG states them: mutating calls of
/// single objects and reads of single objects p99 ≤ 1 s; LISTs in a namespace p99 ≤ 5 s,
/// cluster-wide p99 ≤ 30 s. Watches and long-running calls have none.
pub fn slo(verb: &str, scope: &str) -> Option<(&'static str, f64)> {
    match (verb, scope) {
        ("POST" | "PUT" | "PATCH" | "APPLY" | "DELETE", "resource" | "namespace") => {
            Some(("mutating", 1.0))
        }
        ("GET", "resource") => Some(("read", 1.0)),
        ("LIST", "namespace") => Some(("list-namespace", 5.0)),
        ("LIST", "cluster") => Some(("list-cluster", 30.0)),
        _ => None,
    }
}

/// Each server-side class with calls: count, p50 and p99 (ms, interpolated in the bucket)
/// and its SLO; and what broke an SLO.
pub fn server_latencies(diff: &Scrape) -> (Vec<Value>, Vec<String>) {
    let (mut rows, mut broken) = (Vec::new(), Vec::new());
    for ((verb, resource, sub, scope), buckets) in &diff.latency {
        let count = buckets.last().map_or(0.0, |b| b.1);
        if count <= 0.0 {
            continue;
        }
        let Some((class, limit)) = slo(verb, scope) else {
            continue;
        };
        let (p50, p99) = (quantile(buckets, 0.5), quantile(buckets, 0.99));
        let what = if sub.is_empty() {
            resource.clone()
        } else {
            format!("{resource}/{sub}")
        };
        if p99 > limit {
            broken.push(format!(
                "server {verb} {what} ({scope}): p99 {:.0} ms > {limit} s",
                p99 * 1e3
            ));
        }
        rows.push(json!({"verb": verb, "resource": what, "scope": scope, "count": count,
            "slo": class, "p50_ms": (p50 * 1e4).round() / 10.0, "p99_ms": (p99 * 1e4).round() / 10.0}));
    }
    (rows, broken)
}

/// What broke an SLO among the client's own calls.
pub fn client_broken(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .filter_map(|r| {
            let (verb, scope) = (r["verb"].as_str()?, r["scope"].as_str()?);
            let (_, limit) = slo(verb, scope)?;
            let p99 = r["p99_ms"].as_f64()? / 1e3;
            (p99 > limit).then(|| {
                format!(
                    "client {verb} {} ({scope}): p99 {:.0} ms > {limit} s",
                    r["resource"].as_str().unwrap_or(""),
                    p99 * 1e3
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_duration_seconds x
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1",le="0.1"} 90
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1",le="1"} 99
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1",le="2"} 100
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1",le="+Inf"} 100
apiserver_request_total{code="201",component="apiserver",resource="pods",verb="POST"} 100
apiserver_request_total{code="503",component="apiserver",resource="pods",verb="POST"} 2
"#;

    #[test]
    fn quantiles_and_errors_come_from_the_difference_of_two_scrapes() {
        let after = Scrape::parse(TEXT);
        let (rows, broken) = server_latencies(&after.since(&Scrape::default()));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["p50_ms"], 55.6);
        assert_eq!(rows[0]["p99_ms"], 1000.0);
        assert!(broken.is_empty());
        let (rows, _) = server_latencies(&after.since(&after));
        assert!(rows.is_empty());
        assert_eq!(after.server_errors().len(), 1);
        // Before a restart and after it: the two processes' requests together.
        let both = after.plus(&after);
        let (rows, _) = server_latencies(&both.since(&Scrape::default()));
        assert_eq!(rows[0]["count"], 200.0);
        assert_eq!(rows[0]["p50_ms"], 55.6);
        assert_eq!(both.server_errors()[0]["count"], 4.0);
        let worse = Scrape::parse(&TEXT.replace("} 99\n", "} 98\n"));
        let (_, broken) = server_latencies(&worse.since(&Scrape::default()));
        assert_eq!(broken.len(), 1, "{broken:?}");
    }

    #[test]
    fn the_schedulers_series_are_told_by_attempt_result_decision_and_binding() {
        let text = r#"scheduler_scheduling_attempt_duration_seconds_bucket{le="0.001",result="scheduled",profile="default-scheduler"} 0
scheduler_scheduling_attempt_duration_seconds_bucket{le="0.002",result="scheduled",profile="default-scheduler"} 10
scheduler_scheduling_attempt_duration_seconds_bucket{le="+Inf",result="scheduled",profile="default-scheduler"} 10
scheduler_scheduling_algorithm_duration_seconds_bucket{le="0.001"} 4
scheduler_scheduling_algorithm_duration_seconds_bucket{le="+Inf"} 4
scheduler_framework_extension_point_duration_seconds_bucket{le="0.001",extension_point="Bind",status="Success",profile="default-scheduler"} 3
scheduler_framework_extension_point_duration_seconds_bucket{le="+Inf",extension_point="Bind",status="Success",profile="default-scheduler"} 3
scheduler_framework_extension_point_duration_seconds_bucket{le="+Inf",extension_point="Filter",status="Success",profile="default-scheduler"} 3
workqueue_queue_duration_seconds_bucket{le="0.005",name="scheduler"} 5
workqueue_queue_duration_seconds_bucket{le="+Inf",name="scheduler"} 6
workqueue_queue_duration_seconds_bucket{le="+Inf",name="replicaset"} 6
"#;
        let after = Scrape::parse(text);
        let s = after.since(&Scrape::default()).scheduler();
        assert_eq!(
            s.keys().collect::<Vec<_>>(),
            ["algorithm", "attempt_scheduled", "bind_success", "queue"]
        );
        assert_eq!(s["queue"]["count"], 6.0);
        assert_eq!(s["attempt_scheduled"]["count"], 10.0);
        assert_eq!(s["attempt_scheduled"]["p50_ms"], 1.5);
        assert!(after.since(&after).scheduler().is_empty());
        assert_eq!(after.plus(&after).scheduler()["algorithm"]["count"], 8.0);
    }
}

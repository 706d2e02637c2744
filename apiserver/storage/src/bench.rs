//! The storage micro-benchmark behind `storage-bench`: latency and throughput of creates,
//! ranges and watch delivery on any backend, and a churn run that checks the embedded file
//! stays bounded while compaction never stalls writers for long.

use crate::{Error, RangeRequest, Result, Store};
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sizes of one benchmark run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Sequential creates measured one by one.
    pub sequential: usize,
    /// Creates spread over the concurrent writers.
    pub concurrent: usize,
    /// Concurrent writers.
    pub writers: usize,
    /// Keys in the range measurement.
    pub range_keys: usize,
    /// Writes timed for watch delivery.
    pub watch_events: usize,
    /// Bytes per value (about a small ConfigMap's JSON).
    pub value_bytes: usize,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            sequential: 2_000,
            concurrent: 40_000,
            writers: 16,
            range_keys: 10_000,
            watch_events: 2_000,
            value_bytes: 300,
        }
    }
}

/// Milliseconds at a few percentiles.
#[derive(Clone, Debug, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Worst.
    pub max_ms: f64,
}

impl Percentiles {
    /// Percentiles of a set of durations.
    pub fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
            ms(samples[i])
        };
        Percentiles {
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            max_ms: samples.last().map_or(0.0, |d| ms(*d)),
        }
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The figures of one backend.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The backend measured.
    pub backend: String,
    /// Latency of one create at a time.
    pub sequential_create: Percentiles,
    /// Durable creates per second with `writers` concurrent writers.
    pub concurrent_creates_per_s: f64,
    /// Latency of each create under that concurrency.
    pub concurrent_create: Percentiles,
    /// Concurrent writers used.
    pub writers: usize,
    /// Time to range over `range_keys` keys.
    pub range: Percentiles,
    /// Keys in that range.
    pub range_keys: usize,
    /// From a write's acknowledgement to the watcher having its event (0 if it came first).
    pub watch_delivery_after_ack: Percentiles,
    /// From the start of a write to the watcher having its event.
    pub watch_delivery_from_write_start: Percentiles,
}

fn value(len: usize) -> Bytes {
    Bytes::from(vec![b'x'; len])
}

/// Runs the standard measurements on a store under the key prefix `root`.
pub async fn run<S: Store + Clone>(backend: &str, store: &S, plan: &Plan) -> Result<Report> {
    let v = value(plan.value_bytes);

    let mut seq = Vec::with_capacity(plan.sequential);
    for i in 0..plan.sequential {
        let t = Instant::now();
        store
            .create(&format!("/bench/seq/{i:08}"), v.clone())
            .await?;
        seq.push(t.elapsed());
    }

    let per_writer = plan.concurrent / plan.writers.max(1);
    let start = Instant::now();
    let tasks: Vec<_> = (0..plan.writers)
        .map(|w| {
            let (store, v) = (store.clone(), v.clone());
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_writer);
                for i in 0..per_writer {
                    let t = Instant::now();
                    store
                        .create(&format!("/bench/conc/{w:02}/{i:08}"), v.clone())
                        .await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, Error>(lat)
            })
        })
        .collect();
    let mut conc = Vec::new();
    for t in tasks {
        conc.extend(t.await.expect("writer task")?);
    }
    let elapsed = start.elapsed();
    let creates_per_s = (per_writer * plan.writers) as f64 / elapsed.as_secs_f64();

    // Range: the first `range_keys` keys of the concurrent phase (which wrote enough of them).
    let mut range = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        let got = store
            .range(RangeRequest {
                prefix: "/bench/conc/".into(),
                limit: plan.range_keys,
                ..Default::default()
            })
            .await?;
        range.push(t.elapsed());
        assert_eq!(
            got.kvs.len(),
            plan.range_keys.min(per_writer * plan.writers)
        );
    }

    let (after_ack, from_start) = watch_delivery(store, plan, &v).await?;
    Ok(Report {
        backend: backend.into(),
        sequential_create: Percentiles::of(&mut seq),
        concurrent_creates_per_s: creates_per_s.round(),
        concurrent_create: Percentiles::of(&mut conc),
        writers: plan.writers,
        range: Percentiles::of(&mut range),
        range_keys: plan.range_keys,
        watch_delivery_after_ack: Percentiles::of(&mut after_ack.clone()),
        watch_delivery_from_write_start: Percentiles::of(&mut from_start.clone()),
    })
}

/// Times each of a series of sequential writes from its start and from its acknowledgement
/// until a watcher has received it.
async fn watch_delivery<S: Store + Clone>(
    store: &S,
    plan: &Plan,
    v: &Bytes,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut w = store.watch("/bench/watch/", 0).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let received = Arc::new(std::sync::Mutex::new(Vec::with_capacity(plan.watch_events)));
    let n = plan.watch_events;
    let rx = received.clone();
    let reader = tokio::spawn(async move {
        for _ in 0..n {
            match w.next().await {
                Some(Ok(_)) => rx.lock().expect("lock").push(Instant::now()),
                other => return Err(other.and_then(|r| r.err()).unwrap_or(Error::Closed)),
            }
        }
        Ok(())
    });
    let mut starts = Vec::with_capacity(n);
    let mut acks = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        store
            .create(&format!("/bench/watch/{i:08}"), v.clone())
            .await?;
        starts.push(t);
        acks.push(Instant::now());
        // Wait for delivery so each write is timed alone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while received.lock().expect("lock").len() <= i && Instant::now() < deadline {
            tokio::task::yield_now().await;
        }
    }
    reader.await.expect("watch reader")?;
    let got = received.lock().expect("lock").clone();
    let after_ack = got
        .iter()
        .zip(&acks)
        .map(|(r, a)| r.saturating_duration_since(*a))
        .collect();
    let from_start = got
        .iter()
        .zip(&starts)
        .map(|(r, s)| r.duration_since(*s))
        .collect();
    Ok((after_ack, from_start))
}

/// The figures of a churn run.
#[derive(Clone, Debug, Serialize)]
pub struct ChurnReport {
    /// Updates made.
    pub updates: usize,
    /// Distinct keys updated.
    pub keys: usize,
    /// Updates per second.
    pub updates_per_s: f64,
    /// The longest any single update took (includes any compaction stall).
    pub worst_write_stall_ms: f64,
    /// Latency of the updates.
    pub update: Percentiles,
    /// Size of the data file at the end.
    pub file_mib: f64,
    /// The embedded writer's counters (worst commit, worst compaction time in one commit).
    pub writer: Option<crate::embedded::Stats>,
}

/// Updates `keys` keys `updates` times in total from `writers` writers (compare-and-swap on
/// each key's last revision) and reports throughput and the worst stall.
pub async fn churn<S: Store + Clone>(
    store: &S,
    keys: usize,
    updates: usize,
    writers: usize,
    value_bytes: usize,
) -> Result<ChurnReport> {
    let v = value(value_bytes);
    let mut revs = Vec::with_capacity(keys);
    for k in 0..keys {
        revs.push(
            store
                .create(&format!("/churn/{k:06}"), v.clone())
                .await?
                .mod_revision,
        );
    }
    let per_writer = updates / writers;
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, v) = (store.clone(), v.clone());
            // Writer `w` owns the keys `k` with `k % writers == w`.
            let mine: Vec<usize> = (w..keys).step_by(writers).collect();
            let mut revs: Vec<i64> = mine.iter().map(|&k| revs[k]).collect();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_writer);
                for i in 0..per_writer {
                    let slot = i % revs.len();
                    let key = format!("/churn/{:06}", mine[slot]);
                    let t = Instant::now();
                    revs[slot] = store
                        .update(&key, v.clone(), revs[slot])
                        .await?
                        .mod_revision;
                    lat.push(t.elapsed());
                }
                Ok::<_, Error>(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("churn task")?);
    }
    let elapsed = start.elapsed();
    let update = Percentiles::of(&mut lat);
    Ok(ChurnReport {
        updates: per_writer * writers,
        keys,
        updates_per_s: ((per_writer * writers) as f64 / elapsed.as_secs_f64()).round(),
        worst_write_stall_ms: update.max_ms,
        update,
        file_mib: 0.0,
        writer: None,
    })
}

//! GPUJob throughput: `minik8s up` (no node) with its GPUJob controller, the private Slurm of
//! `hack/slurm.sh`, and `jobs` small jobs created at once. Each job's phases are timed as the
//! watch sees them (millisecond clock); Slurm's own submit and start times (whole seconds)
//! separate Slurm's scheduling from the controller's part.

use crate::bench::{Server, percentiles};
use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use minik8s_gpu::GPUJob;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// When each job was created and first seen Submitted, Running and finished.
#[derive(Default, Clone)]
struct Seen {
    created: Option<Instant>,
    submitted: Option<Instant>,
    running: Option<Instant>,
    done: Option<Instant>,
    phase: String,
    slurm_queue_s: Option<i64>,
}

fn slurm(args: &[&str], kubeconfig: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("bash")
        .arg(minik8s_conformance::node::repo_root().join("hack/slurm.sh"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .status()?;
    anyhow::ensure!(status.success(), "hack/slurm.sh {args:?} failed");
    Ok(())
}

/// Runs the benchmark with `jobs` jobs; the report.
pub async fn run(binary: &Path, jobs: usize) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let server = Server::start(binary, dir.path()).await?;
    slurm(&["up"], &server.kubeconfig)?;
    let client = minik8s_kubeconfig::client(&server.kubeconfig).await?;
    let api: Api<GPUJob> = Api::namespaced(client, "default");
    let seen: std::sync::Arc<std::sync::Mutex<HashMap<String, Seen>>> = Default::default();
    let watch = {
        let seen = seen.clone();
        let api = api.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(job)) = events.next().await {
                let name = job.metadata.name.clone().unwrap_or_default();
                let status = job.status.clone().unwrap_or_default();
                let phase = status.phase.clone().unwrap_or_default();
                let now = Instant::now();
                let mut s = seen.lock().expect("seen");
                let e = s.entry(name).or_default();
                match phase.as_str() {
                    "Submitted" | "Queued" => {
                        e.submitted.get_or_insert(now);
                    }
                    "Running" => {
                        e.submitted.get_or_insert(now);
                        e.running.get_or_insert(now);
                    }
                    "Succeeded" | "Failed" | "Cancelled" => {
                        e.submitted.get_or_insert(now);
                        e.running.get_or_insert(now);
                        e.done.get_or_insert(now);
                        let t = |v: &Option<String>| {
                            v.as_deref().and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        };
                        if let (Some(a), Some(b)) = (t(&status.submit_time), t(&status.start_time))
                        {
                            e.slurm_queue_s = Some((b - a).get_seconds());
                        }
                    }
                    _ => {}
                }
                e.phase = phase;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    for i in 0..jobs {
        let name = format!("bench-{i}");
        let job: GPUJob = serde_json::from_value(json!({
            "apiVersion": "gpu.minik8s.io/v1alpha1", "kind": "GPUJob",
            "metadata": {"name": name},
            "spec": {"run": "echo $SLURM_JOB_ID", "cpusPerTask": 1},
        }))?;
        seen.lock().expect("seen").entry(name).or_default().created = Some(Instant::now());
        api.create(&PostParams::default(), &job).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = seen
            .lock()
            .expect("seen")
            .values()
            .filter(|s| s.done.is_some())
            .count();
        if done == jobs {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{done} of {jobs} jobs finished in 600 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_done = started.elapsed();
    watch.abort();
    let seen = seen.lock().expect("seen").clone();
    let succeeded = seen.values().filter(|s| s.phase == "Succeeded").count();
    let since = |s: &Seen, t: Option<Instant>| t.zip(s.created).map(|(t, c)| t - c);
    let mut to_submitted: Vec<Duration> = seen
        .values()
        .filter_map(|s| since(s, s.submitted))
        .collect();
    let mut to_running: Vec<Duration> = seen.values().filter_map(|s| since(s, s.running)).collect();
    // The controller's part: create → Running less Slurm's own queueing (whole seconds).
    let mut overhead: Vec<Duration> = seen
        .values()
        .filter_map(|s| {
            let total = since(s, s.running)?;
            let queue = Duration::from_secs(s.slurm_queue_s?.max(0) as u64);
            Some(total.saturating_sub(queue))
        })
        .collect();
    let mut slurm_queue: Vec<Duration> = seen
        .values()
        .filter_map(|s| {
            s.slurm_queue_s
                .map(|q| Duration::from_secs(q.max(0) as u64))
        })
        .collect();
    slurm(&["down"], &server.kubeconfig)?;
    Ok(json!({
        "jobs": jobs,
        "succeeded": succeeded,
        "all_finished_s": all_done.as_secs_f64(),
        "create_to_submitted": percentiles(&mut to_submitted),
        "create_to_running": percentiles(&mut to_running),
        "slurm_queue_wait": percentiles(&mut slurm_queue),
        "controller_overhead": percentiles(&mut overhead),
    }))
}

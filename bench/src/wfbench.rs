//! The workflow benchmark behind `wf-bench`: many concurrent runs of a three-step chain of
//! warm no-op functions; the per-transition overhead (a run's time minus its functions' own
//! time, per step) and runs per second.

use crate::bench::percentiles;
use crate::fnbench::{apply_code, call, url_of};
use kube::api::{Api, ListParams, PostParams};
use minik8s_serverless::Function;
use minik8s_serverless::workflow::{Workflow, WorkflowRun};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Runs started at once.
    pub runs: usize,
    /// Pods of the no-op function.
    pub pods: i32,
}

/// Runs the benchmark against `minik8s up` with its node.
pub async fn run(
    binary: &std::path::Path,
    images: &[std::path::PathBuf],
    plan: Plan,
) -> anyhow::Result<Value> {
    crate::nodebench::around_node(binary, images, |client, pid| async move {
        measure(client, pid, plan).await
    })
    .await
}

fn secs(a: &str, b: &str) -> anyhow::Result<f64> {
    minik8s_serverless::workflow::engine::seconds_between(a, b)
        .ok_or_else(|| anyhow::anyhow!("times {a:?} and {b:?}"))
}

async fn measure(client: kube::Client, pid: u32, plan: Plan) -> anyhow::Result<Value> {
    let fns: Api<Function> = Api::namespaced(client.clone(), "default");
    let wfs: Api<Workflow> = Api::namespaced(client.clone(), "default");
    let runs: Api<WorkflowRun> = Api::namespaced(client.clone(), "default");

    // A warm no-op function with its pods up.
    let scale =
        json!({"minScale": plan.pods, "maxScale": plan.pods, "scaleToZeroAfterSeconds": 600});
    apply_code(
        &fns,
        "noop",
        "def handler(event):\n    return event\n",
        scale,
    )
    .await?;
    let url = url_of(&fns, "noop").await?;
    call(&url).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while fns
        .get("noop")
        .await?
        .status
        .map_or(0, |s| s.ready_replicas)
        < plan.pods
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the no-op function's pods are not ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..50 {
        call(&url).await?;
    }

    let wf: Workflow = serde_json::from_value(json!({
        "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "chain"},
        "spec": {"startAt": "one", "steps": [
            {"name": "one", "type": "Task", "function": "noop", "next": "two"},
            {"name": "two", "type": "Task", "function": "noop", "next": "three"},
            {"name": "three", "type": "Task", "function": "noop"},
        ]},
    }))?;
    wfs.create(&PostParams::default(), &wf).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = wfs.get("chain").await?.status.is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the workflow is not Ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // All runs at once; a watch (not polling, which would load the two cores) sees every
    // one end.
    let (tx, ended) = tokio::sync::oneshot::channel();
    {
        let runs = runs.clone();
        let want = plan.runs;
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::{WatchStreamExt, watcher};
            let mut seen = std::collections::HashSet::new();
            let stream = watcher(runs, watcher::Config::default()).applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(r)) = stream.next().await {
                if r.status.as_ref().is_some_and(|s| s.phase.finished()) {
                    seen.insert(kube::ResourceExt::name_any(&r));
                    if seen.len() >= want {
                        let _ = tx.send(Instant::now());
                        return;
                    }
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu0 = crate::bench::cpu_seconds(pid);
    let started = Instant::now();
    let creates = (0..plan.runs).map(|i| {
        let runs = runs.clone();
        async move {
            let run: WorkflowRun = serde_json::from_value(json!({
                "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "WorkflowRun",
                "metadata": {"name": format!("bench-{i}")},
                "spec": {"workflowRef": {"name": "chain"}, "input": {"i": i}},
            }))?;
            runs.create(&PostParams::default(), &run).await?;
            anyhow::Ok(())
        }
    });
    futures::future::try_join_all(creates).await?;
    let finished_at = tokio::time::timeout(Duration::from_secs(300), ended)
        .await
        .map_err(|_| anyhow::anyhow!("the runs did not all end within 300 s"))??;
    let cpu = crate::bench::cpu_seconds(pid) - cpu0;
    let done = runs.list(&ListParams::default()).await?.items;
    let wall = finished_at - started;

    let mut per_transition = Vec::new();
    let mut run_times = Vec::new();
    let mut task_times = Vec::new();
    let mut failed = 0;
    for r in &done {
        let s = r.status.clone().unwrap_or_default();
        if s.phase != minik8s_serverless::workflow::types::Phase::Succeeded {
            failed += 1;
            continue;
        }
        let total = secs(
            s.start_time.as_deref().unwrap_or_default(),
            s.completion_time.as_deref().unwrap_or_default(),
        )?;
        let mut functions = 0.0;
        for step in &s.steps {
            let t = secs(&step.start_time, &step.end_time)?;
            functions += t;
            task_times.push(Duration::from_secs_f64(t));
        }
        let steps = s.steps.len().max(1) as f64;
        per_transition.push(Duration::from_secs_f64(
            ((total - functions) / steps).max(0.0),
        ));
        run_times.push(Duration::from_secs_f64(total));
    }
    Ok(json!({
        "runs": plan.runs,
        "failed_runs": failed,
        "function_pods": plan.pods,
        "wall_s": (wall.as_secs_f64() * 1e3).round() / 1e3,
        "server_cpu_ms_per_run": (cpu / plan.runs as f64 * 1e6).round() / 1e3,
        "runs_per_s": ((plan.runs as f64 / wall.as_secs_f64()) * 10.0).round() / 10.0,
        "per_transition_overhead": percentiles(&mut per_transition),
        "task_step": percentiles(&mut task_times),
        "run_time": percentiles(&mut run_times),
    }))
}

//! The scale benchmark behind `scale-bench`: `minik8s up` (apiserver and controller-manager in
//! one process) as its own process, N simulated nodes in the benchmark's process, and one
//! Deployment of M pods; it times scheduling and readiness from a watch and reads the
//! server's peak RSS from `/proc`.

use crate::bench::{Server, peak_rss_mib, rss_mib};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// When the watch first saw a pod, saw it bound, and saw it Running.
#[derive(Default, Clone, Copy)]
struct Seen {
    created: Option<Duration>,
    bound: Option<Duration>,
    running: Option<Duration>,
}

/// Runs the scale scenario and returns the report.
pub async fn run(
    binary: &Path,
    nodes: usize,
    pods: usize,
    limit: Duration,
) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let server = Server::start(binary, dir.path()).await?;
    let pid = server.pid();
    let client = minik8s_kubeconfig::client(&server.kubeconfig).await?;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();

    let sim = minik8s_controllers::simnodes::SimConfig {
        count: nodes,
        ..Default::default()
    };
    tokio::spawn(minik8s_controllers::simnodes::run(
        client.clone(),
        sim,
        shutdown.clone(),
    ));
    let node_api: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    while node_api.list(&ListParams::default()).await?.items.len() < nodes {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "nodes did not register"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "scale"}}))?,
    )
    .await?;
    let rss_before = rss_mib(pid);

    // RSS sampled while the scenario runs (VmHWM also covers the peaks between samples).
    let sampled_max = Arc::new(AtomicU64::new(0));
    {
        let (max, stop) = (sampled_max.clone(), shutdown.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                max.fetch_max((rss_mib(pid) * 10.0) as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    let t0 = Instant::now();
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), "scale");
    let mut events = watcher(pod_api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "scale"},
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "scale"}},
            "template": {"metadata": {"labels": {"app": "scale"}},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}
    }))?;
    Api::<Deployment>::namespaced(client.clone(), "scale")
        .create(&PostParams::default(), &deploy)
        .await?;
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut running = 0;
    while running < pods {
        let left = limit.saturating_sub(t0.elapsed());
        anyhow::ensure!(
            !left.is_zero(),
            "only {running} of {pods} pods Running after {limit:?}"
        );
        let Ok(Some(ev)) = tokio::time::timeout(left, events.next()).await else {
            continue;
        };
        let Ok(pod) = ev else { continue };
        let now = t0.elapsed();
        let s = seen.entry(pod.name_any()).or_default();
        s.created.get_or_insert(now);
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
        {
            s.bound.get_or_insert(now);
        }
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && s.running.is_none()
        {
            s.running = Some(now);
            running += 1;
        }
    }
    let secs = |d: Option<Duration>| d.map_or(0.0, |d| (d.as_secs_f64() * 1000.0).round() / 1000.0);
    let first_created = seen.values().filter_map(|s| s.created).min();
    let last_created = seen.values().filter_map(|s| s.created).max();
    let last_bound = seen.values().filter_map(|s| s.bound).max();
    let last_running = seen.values().filter_map(|s| s.running).max();
    let bind_window = last_bound
        .zip(first_created)
        .map(|(b, c)| b.saturating_sub(c));
    let per_s = |n: usize, d: Option<Duration>| {
        d.map_or(0.0, |d| (n as f64 / d.as_secs_f64().max(1e-9)).round())
    };
    Ok(json!({
        "nodes": nodes,
        "pods": pods,
        "first_pod_seen_s": secs(first_created),
        "last_pod_created_s": secs(last_created),
        "all_bound_s": secs(last_bound),
        "all_running_s": secs(last_running),
        "scheduler_pods_per_s": per_s(pods, bind_window),
        "end_to_end_pods_per_s": per_s(pods, last_running),
        "server_rss_before_mib": rss_before,
        "server_rss_sampled_max_mib": sampled_max.load(Ordering::Relaxed) as f64 / 10.0,
        "server_peak_rss_mib": peak_rss_mib(pid),
        "server_rss_end_mib": rss_mib(pid),
        "server_cpu_s": crate::bench::cpu_seconds(pid),
    }))
}

//! The virtual-node benchmark behind `vnode-bench`: `minik8s up` (apiserver and controllers,
//! no node) as its own process, and N virtual nodes of the fake provider hosted by one more
//! process (`vnode-bench host`, the library as a provider would run it). It reports the host's
//! RSS, the apiserver's registered watchers before and after the host started (they must not
//! grow with N), the Lease renewals per second, and pod create → Running through the virtual
//! nodes (bare pods bound to them by name, so the path timed is the library's, not the
//! scheduler's).

use crate::bench::{Server, percentiles, rss_mib};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The label of the benchmark's pods (the host's pod watch selects it).
const PROVIDER: &str = "bench";

/// Hosts `nodes` fake virtual nodes until SIGINT/SIGTERM (`vnode-bench host`).
pub async fn host(kubeconfig: &Path, nodes: usize) -> anyhow::Result<()> {
    let client = minik8s_kubeconfig::client(kubeconfig).await?;
    let shutdown = minik8s_kubeconfig::process::shutdown_on_signal();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..nodes {
        let backend = minik8s_vnode::fake::Backend::new(&format!("vn-{i}"));
        let fake = minik8s_vnode::fake::Fake::new(backend, "host", None);
        tx.send(minik8s_vnode::Discovered::Up(
            minik8s_vnode::fake::info(&format!("vn-{i}"), 110),
            Arc::new(fake),
        ))?;
    }
    let cfg = minik8s_vnode::Config::new(PROVIDER, "host");
    minik8s_vnode::run(client, cfg, rx, None, shutdown).await?;
    Ok(())
}

/// The apiserver's registered watchers (`apiserver_registered_watchers`, summed).
async fn watchers(client: &kube::Client) -> anyhow::Result<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_registered_watchers{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Runs the benchmark: `nodes` virtual nodes, `pods` pods through them.
pub async fn run(binary: &Path, bench: &Path, nodes: usize, pods: usize) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let server = Server::start(binary, dir.path()).await?;
    let client = minik8s_kubeconfig::client(&server.kubeconfig).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let watchers_before = watchers(&client).await?;

    let started = Instant::now();
    let mut child = tokio::process::Command::new(bench)
        .args(["host", "--nodes", &nodes.to_string(), "--kubeconfig"])
        .arg(&server.kubeconfig)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()?;
    let host_pid = child.id().unwrap_or(0);
    let node_api: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{}={PROVIDER}", minik8s_vnode::PROVIDER_LABEL));
    loop {
        let ready = node_api
            .list(&lp)
            .await?
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready == nodes {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "only {ready} of {nodes} virtual nodes Ready"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let registered = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let watchers_after = watchers(&client).await?;
    let rss_idle = rss_mib(host_pid);

    // Lease renewals per second, counted on a watch over 30 s.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let counted = Arc::new(Mutex::new(0u64));
    let counter = {
        let counted = counted.clone();
        let cfg = watcher::Config::default()
            .labels(&format!("{}={PROVIDER}", minik8s_vnode::PROVIDER_LABEL));
        tokio::spawn(async move {
            let stream = watcher::watcher(leases, cfg);
            futures::pin_mut!(stream);
            let mut initial = true;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::InitDone) => initial = false,
                    Ok(watcher::Event::Apply(_)) if !initial => *counted.lock().unwrap() += 1,
                    _ => {}
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    *counted.lock().unwrap() = 0;
    let window = Duration::from_secs(30);
    tokio::time::sleep(window).await;
    let renewals = *counted.lock().unwrap() as f64 / window.as_secs_f64();
    counter.abort();

    // Pods bound to the virtual nodes by name, created 50 at a time; a watch times Running.
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let running_after: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let watch = {
        let (created_at, running_after) = (created_at.clone(), running_after.clone());
        let cfg = watcher::Config::default()
            .labels(&format!("{}={PROVIDER}", minik8s_vnode::PROVIDER_LABEL));
        let api = pod_api.clone();
        tokio::spawn(async move {
            let stream = watcher::watcher(api, cfg);
            futures::pin_mut!(stream);
            let mut seen = std::collections::HashSet::new();
            while let Some(ev) = stream.next().await {
                let Ok(watcher::Event::Apply(p)) = ev else {
                    continue;
                };
                if p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
                    continue;
                }
                let name = p.name_any();
                if !seen.insert(name.clone()) {
                    continue;
                }
                if let Some(t) = created_at.lock().unwrap().get(&name) {
                    running_after.lock().unwrap().push(t.elapsed());
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let load_started = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(50));
    let mut tasks = Vec::new();
    for i in 0..pods {
        let permit = sem.clone().acquire_owned().await?;
        let (api, created_at) = (pod_api.clone(), created_at.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let name = format!("p-{i}");
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {minik8s_vnode::PROVIDER_LABEL: PROVIDER}},
                "spec": {"nodeName": format!("vn-{}", i % nodes),
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "c", "image": "example.invalid/x:1"}]},
            }))
            .expect("pod");
            created_at.lock().unwrap().insert(name, Instant::now());
            api.create(&PostParams::default(), &pod).await.map(|_| ())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while running_after.lock().unwrap().len() < pods {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {pods} pods Running",
            running_after.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_running = load_started.elapsed();
    watch.abort();
    let rss_loaded = rss_mib(host_pid);
    let watchers_loaded = watchers(&client).await?;
    let mut latencies = running_after.lock().unwrap().clone();
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(json!({
        "virtual_nodes": nodes,
        "registered_and_ready_s": (registered.as_secs_f64() * 10.0).round() / 10.0,
        "host_rss_mib": {"idle": rss_idle, "with_pods": rss_loaded},
        "apiserver_watchers": {"before_host": watchers_before, "with_host": watchers_after,
            "with_pods": watchers_loaded},
        "lease_renewals_per_s": (renewals * 10.0).round() / 10.0,
        "pods": {"count": pods, "create_to_running": percentiles(&mut latencies),
            "all_running_s": (all_running.as_secs_f64() * 10.0).round() / 10.0},
    }))
}

//! The function benchmark behind `fn-bench`: cold starts from zero to the first answer (next
//! to the pod start latency of the same node), warm invocations through the gateway against
//! direct calls to the pod (the gateway's overhead), sustained load from many clients, and
//! the same cold starts and overhead for a Knative Service (an image-based revision).

use crate::bench::{percentile, percentiles};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use minik8s_serverless::Function;
use minik8s_serverless::gateway::post;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const LABEL: &str = "serverless.minik8s.io/function";

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Cold starts.
    pub cold_starts: usize,
    /// Warm calls through the gateway and directly.
    pub warm_calls: usize,
    /// Concurrent clients for the sustained load.
    pub clients: usize,
    /// How long the sustained load lasts.
    pub load_for: Duration,
    /// Module functions rolled out at once (100).
    pub modules: usize,
}

async fn apply(fns: &Api<Function>, name: &str, scale: Value) -> anyhow::Result<()> {
    let add = "def handler(event):\n    return {\"sum\": event[\"x\"] + event[\"y\"]}\n";
    apply_code(fns, name, add, scale).await
}

/// Creates or updates a Python Function with `code` and `scale`.
pub(crate) async fn apply_code(
    fns: &Api<Function>,
    name: &str,
    code: &str,
    scale: Value,
) -> anyhow::Result<()> {
    apply_placed(fns, name, code, scale, "pod").await
}

/// Creates or updates a Python Function with `code`, `scale` and `placement`.
pub(crate) async fn apply_placed(
    fns: &Api<Function>,
    name: &str,
    code: &str,
    scale: Value,
    placement: &str,
) -> anyhow::Result<()> {
    let f = json!({
        "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "Function",
        "metadata": {"name": name},
        "spec": {"runtime": "python3", "source": {"inline": code}, "scale": scale,
            "placement": placement},
    });
    fns.patch(
        name,
        &PatchParams::apply("fn-bench").force(),
        &Patch::Apply(&f),
    )
    .await?;
    Ok(())
}

pub(crate) async fn url_of(fns: &Api<Function>, name: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(u) = fns.get(name).await?.status.and_then(|s| s.url) {
            return Ok(u);
        }
        anyhow::ensure!(Instant::now() < deadline, "function {name} has no URL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Warm calls through the gateway to function `warm` split 50/50 between two warm revisions
/// (the cost of the split); none on a server without revisions.
async fn split_calls(fns: &Api<Function>, calls: usize) -> anyhow::Result<Vec<Duration>> {
    let status = fns.get("warm").await?.status.unwrap_or_default();
    let Some(first) = status.latest_created_revision else {
        return Ok(Vec::new());
    };
    let v2 = "def handler(event):\n    return {\"sum\": event[\"x\"] + event[\"y\"], \"v\": 2}\n";
    apply_code(fns, "warm", v2, json!({"minScale": 1, "maxScale": 1})).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let second = loop {
        let s = fns.get("warm").await?.status.unwrap_or_default();
        match s.latest_ready_revision {
            Some(r) if r != first => break r,
            _ => {}
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the second revision never got ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let traffic = json!({"spec": {"traffic": [
        {"revisionName": first, "percent": 50}, {"revisionName": second, "percent": 50}]}});
    fns.patch("warm", &PatchParams::default(), &Patch::Merge(&traffic))
        .await?;
    while fns
        .get("warm")
        .await?
        .status
        .unwrap_or_default()
        .traffic
        .len()
        != 2
    {
        anyhow::ensure!(Instant::now() < deadline, "the split never took effect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = url_of(fns, "warm").await?;
    for _ in 0..20 {
        call(&url).await?;
    }
    let mut out = Vec::new();
    for _ in 0..calls {
        out.push(call(&url).await?);
    }
    Ok(out)
}

/// Waits until the function has no pods at all (scaled to zero and gone).
async fn wait_gone(pods: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    let lp = ListParams::default().labels(&format!("{LABEL}={name}"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pods.list(&lp).await?.items.is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "function {name} did not scale to zero"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

const EVENT: &str = r#"{"x":1,"y":2}"#;

pub(crate) async fn call(url: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let (code, body) = post(url, EVENT.into())
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    anyhow::ensure!(
        code.is_success(),
        "{code}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(started.elapsed())
}

/// Type of a kept client connection.
type Kept = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// One call on a kept connection (made, or made again, as needed).
async fn call_kept(conn: &mut Option<Kept>, url: &str) -> anyhow::Result<Duration> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let started = Instant::now();
    if conn.as_ref().is_none_or(|c| c.is_closed()) {
        let tcp = tokio::net::TcpStream::connect(authority).await?;
        tcp.set_nodelay(true)?;
        let (sender, driver) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(driver);
        *conn = Some(sender);
    }
    let sender = conn.as_mut().expect("made above");
    sender.ready().await?;
    let req = hyper::Request::post(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            EVENT.as_bytes(),
        )))?;
    let resp = sender.send_request(req).await?;
    let code = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await?
        .to_bytes();
    anyhow::ensure!(
        code.is_success(),
        "{code}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(started.elapsed())
}

/// The bases' memory (working set, bytes) summed from `metrics.k8s.io`.
async fn bases_memory(client: &kube::Client) -> anyhow::Result<f64> {
    let req = http::Request::get(
        "/apis/metrics.k8s.io/v1beta1/namespaces/minik8s-system/pods?labelSelector=serverless.minik8s.io%2Fbase%3Dtrue",
    )
    .body(Vec::new())?;
    let v: Value = client.request(req).await?;
    let mut total = 0.0;
    for item in v["items"].as_array().into_iter().flatten() {
        for c in item["containers"].as_array().into_iter().flatten() {
            let q = c["usage"]["memory"].as_str().unwrap_or("0");
            total += minik8s_types::Quantity::parse(q)
                .map(|q| q.millis() as f64 / 1000.0)
                .unwrap_or(0.0);
        }
    }
    Ok(total)
}

/// When the function's newest pod was first seen, bound and Running (by a watch).
#[derive(Clone, Debug, Default)]
struct Steps {
    created: Option<Instant>,
    bound: Option<Instant>,
    running: Option<Instant>,
}

async fn watch_steps(pods: Api<Pod>, function: &str, steps: Arc<std::sync::Mutex<Steps>>) {
    use futures::StreamExt;
    let cfg = kube::runtime::watcher::Config::default().labels(&format!("{LABEL}={function}"));
    let stream = kube::runtime::watcher(pods, cfg);
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let Ok(kube::runtime::watcher::Event::Apply(p)) = ev else {
            continue;
        };
        let now = Instant::now();
        let mut s = steps.lock().expect("steps");
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        s.created.get_or_insert(now);
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            s.bound.get_or_insert(now);
        }
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            s.running.get_or_insert(now);
        }
    }
}

/// Runs the whole benchmark against `minik8s up` with its node.
pub async fn run(
    binary: &std::path::Path,
    images: &[std::path::PathBuf],
    plan: Plan,
) -> anyhow::Result<Value> {
    crate::nodebench::around_node(binary, images, |client, _| async move {
        measure(client, plan).await
    })
    .await
}

async fn measure(client: kube::Client, plan: Plan) -> anyhow::Result<Value> {
    let fns: Api<Function> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");

    // Pod start latency on the same node, for comparison.
    let mut pod_start = crate::nodebench::pod_starts(client.clone(), 10).await?;

    // Cold starts: scale to zero after 1 s idle, wait until no pod is left, call.
    apply(
        &fns,
        "cold",
        json!({"minScale": 0, "maxScale": 1, "scaleToZeroAfterSeconds": 1}),
    )
    .await?;
    let url = url_of(&fns, "cold").await?;
    call(&url).await?; // pulls the runtime image once
    let mut cold = Vec::new();
    for _ in 0..plan.cold_starts {
        wait_gone(&pods, "cold").await?;
        cold.push(call(&url).await?);
    }

    // Module cold starts: the same function as a module loaded into a warm base. Each step
    // of the path is timed from the call's start by a watch of the function's pods: the pod
    // created (ReplicaSet), bound (scheduler), Running (loaded; the provider's status).
    let add = "def handler(event):\n    return {\"sum\": event[\"x\"] + event[\"y\"]}\n";
    apply_placed(
        &fns,
        "cold-module",
        add,
        json!({"minScale": 0, "maxScale": 1, "scaleToZeroAfterSeconds": 1}),
        "module",
    )
    .await?;
    let url = url_of(&fns, "cold-module").await?;
    call(&url).await?; // starts the bases (once)
    let steps = Arc::new(std::sync::Mutex::new(Steps::default()));
    let watch = tokio::spawn(watch_steps(pods.clone(), "cold-module", steps.clone()));
    let mut module_cold = Vec::new();
    let (mut created, mut bound, mut running) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.cold_starts {
        wait_gone(&pods, "cold-module").await?;
        let started = Instant::now();
        *steps.lock().expect("steps") = Steps::default();
        module_cold.push(call(&url).await?);
        let s = steps.lock().expect("steps").clone();
        for (list, at) in [
            (&mut created, s.created),
            (&mut bound, s.bound),
            (&mut running, s.running),
        ] {
            if let Some(at) = at {
                list.push(at.saturating_duration_since(started));
            }
        }
    }
    watch.abort();

    // Module rollout and density: three bases, then `modules` module functions (one pod
    // each) applied at once, timed until every module pod is Running; the bases' memory
    // (metrics.k8s.io working set) before and after gives the memory per loaded module.
    let bases: Api<Deployment> = Api::namespaced(client.clone(), "minik8s-system");
    bases
        .patch_scale(
            "function-bases",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let lp_bases = ListParams::default().labels("minik8s.io/vnode-provider=functions");
    let deadline = Instant::now() + Duration::from_secs(120);
    while nodes.list(&lp_bases).await?.items.len() < 3 {
        anyhow::ensure!(Instant::now() < deadline, "three bases did not come up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_gone(&pods, "cold-module").await?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let memory_before = bases_memory(&client).await?;
    let rollout_started = Instant::now();
    for i in 0..plan.modules {
        apply_placed(
            &fns,
            &format!("m-{i}"),
            add,
            json!({"minScale": 1, "maxScale": 1}),
            "module",
        )
        .await?;
    }
    let lp_modules = ListParams::default().labels("minik8s.io/vnode-provider=functions");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let running = pods
            .list(&lp_modules)
            .await?
            .items
            .iter()
            .filter(|p| {
                p.labels().get(LABEL).is_some_and(|f| f.starts_with("m-"))
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .count();
        if running == plan.modules {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {running} of {} modules Running",
            plan.modules
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rollout = rollout_started.elapsed();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let memory_after = bases_memory(&client).await?;
    for i in 0..plan.modules {
        let _ = fns.delete(&format!("m-{i}"), &Default::default()).await;
    }

    // Warm: one pod kept; through the gateway, then straight to the pod.
    apply(&fns, "warm", json!({"minScale": 1, "maxScale": 1})).await?;
    let url = url_of(&fns, "warm").await?;
    call(&url).await?;
    let mut via_gateway = Vec::new();
    for _ in 0..plan.warm_calls {
        via_gateway.push(call(&url).await?);
    }
    let lp = ListParams::default().labels(&format!("{LABEL}=warm"));
    let ip = pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .find_map(|p| p.status?.pod_ip);
    let ip = ip.ok_or_else(|| anyhow::anyhow!("the warm pod has no IP"))?;
    let direct_url = format!("http://{ip}:8080/");
    let mut direct = Vec::new();
    for _ in 0..plan.warm_calls {
        direct.push(call(&direct_url).await?);
    }
    let overhead_ms =
        (percentile(&mut via_gateway, 0.5) - percentile(&mut direct, 0.5)).as_secs_f64() * 1e3;
    let mut via_split = split_calls(&fns, plan.warm_calls).await?;
    let split_overhead_ms = (!via_split.is_empty()).then(|| {
        (percentile(&mut via_split, 0.5) - percentile(&mut direct, 0.5)).as_secs_f64() * 1e3
    });

    // Sustained load: clients calling back to back; the pods used are sampled.
    apply(
        &fns,
        "load",
        json!({"minScale": 1, "maxScale": 4, "scaleToZeroAfterSeconds": 60}),
    )
    .await?;
    let url = Arc::new(url_of(&fns, "load").await?);
    call(&url).await?;
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let kinds: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>> = Arc::default();
    let max_pods = Arc::new(AtomicI32::new(0));
    let until = Instant::now() + plan.load_for;
    let mut tasks = Vec::new();
    for _ in 0..plan.clients {
        let (url, ok, failed, kinds) = (url.clone(), ok.clone(), failed.clone(), kinds.clone());
        tasks.push(tokio::spawn(async move {
            // One keep-alive connection a client, as HTTP clients hold them (a connection a
            // request would spend the machine's ephemeral ports, not the gateway's time).
            let mut conn = None;
            while Instant::now() < until {
                match call_kept(&mut conn, &url).await {
                    Ok(_) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        let kind: String = e.to_string().chars().take(80).collect();
                        *kinds.lock().expect("kinds").entry(kind).or_default() += 1;
                    }
                }
            }
        }));
    }
    let sampler = {
        let (deployments, max_pods) = (deployments.clone(), max_pods.clone());
        tokio::spawn(async move {
            while Instant::now() < until {
                // Every revision of the function (one here): pods asked for in all.
                let lp = ListParams::default().labels(&format!("{LABEL}=load"));
                if let Ok(list) = deployments.list(&lp).await {
                    let n = list
                        .items
                        .iter()
                        .filter_map(|d| d.spec.as_ref()?.replicas)
                        .sum();
                    max_pods.fetch_max(n, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let started = Instant::now();
    for t in tasks {
        t.await?;
    }
    sampler.await?;
    let secs = started.elapsed().as_secs_f64();
    let gateway = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default()
        .to_owned();
    for name in ["cold", "cold-module", "warm", "load"] {
        let _ = fns.delete(name, &Default::default()).await;
    }
    let knative = knative(&client, &pods, &gateway, plan).await?;
    Ok(json!({
        "knative": knative,
        "pod_start_create_to_running": percentiles(&mut pod_start),
        "cold_start": {"samples": cold.len(), "latency": percentiles(&mut cold)},
        "module_rollout": {
            "modules": plan.modules,
            "apply_to_all_running_s": (rollout.as_secs_f64() * 100.0).round() / 100.0,
            "bases": 3,
            "bases_memory_mib": {"before": memory_before / 1048576.0, "after": memory_after / 1048576.0},
            "memory_per_module_kib": ((memory_after - memory_before) / plan.modules.max(1) as f64 / 1024.0).round(),
        },
        "module_cold_start": {
            "samples": module_cold.len(),
            "latency": percentiles(&mut module_cold),
            "pod_created": percentiles(&mut created),
            "pod_bound": percentiles(&mut bound),
            "pod_running": percentiles(&mut running),
        },
        "warm": {
            "through_gateway": percentiles(&mut via_gateway),
            "direct_to_pod": percentiles(&mut direct),
            "gateway_overhead_p50_ms": (overhead_ms * 1000.0).round() / 1000.0,
            "through_gateway_split_50_50": (!via_split.is_empty()).then(|| percentiles(&mut via_split)),
            "gateway_overhead_split_p50_ms": split_overhead_ms.map(|o| (o * 1000.0).round() / 1000.0),
        },
        "sustained": {
            "clients": plan.clients,
            "seconds": (secs * 10.0).round() / 10.0,
            "requests": ok.load(Ordering::Relaxed),
            "requests_per_second": (ok.load(Ordering::Relaxed) as f64 / secs).round(),
            "errors": failed.load(Ordering::Relaxed),
            "error_kinds": *kinds.lock().expect("kinds"),
            "max_pods": max_pods.load(Ordering::Relaxed),
        },
    }))
}

/// A GET of `/` for `host` at the gateway (`authority`), as the router sends a Knative
/// Route's requests: its time, once it answered 200.
async fn get_host(authority: &str, host: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let tcp = tokio::net::TcpStream::connect(authority).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, driver) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(driver);
    let req = hyper::Request::get("/")
        .header(hyper::header::HOST, host)
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    let code = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await?
        .to_bytes();
    anyhow::ensure!(
        code.is_success(),
        "{code}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(started.elapsed())
}

/// Applies Knative Service `name` (Knative's sample image) with the template's `annotations`
/// and waits until it is Ready.
async fn apply_ksvc(client: &kube::Client, name: &str, annotations: Value) -> anyhow::Result<()> {
    use minik8s_serverless::knative::KService;
    let api: Api<KService> = Api::namespaced(client.clone(), "default");
    let ksvc = json!({
        "apiVersion": "serving.knative.dev/v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"template": {"metadata": {"annotations": annotations},
            "spec": {"containers": [{"image": "ghcr.io/knative/helloworld-go:latest",
                "ports": [{"containerPort": 8080}],
                "env": [{"name": "TARGET", "value": "bench"}]}]}}},
    });
    api.patch(
        name,
        &PatchParams::apply("fn-bench").force(),
        &Patch::Apply(&ksvc),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = api.get(name).await?.status.is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "Knative Service {name} never Ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Knative Services on the same engine, in the same run as the pod functions: cold starts of
/// an image-based revision (Knative's sample, a Go server) through the gateway by host, with
/// Knative's shortest window (6 s) before each, and warm calls by host against the same calls
/// straight to the pod.
async fn knative(
    client: &kube::Client,
    pods: &Api<Pod>,
    gateway: &str,
    plan: Plan,
) -> anyhow::Result<Value> {
    use minik8s_serverless::knative::KService;
    apply_ksvc(
        client,
        "kcold",
        json!({"autoscaling.knative.dev/window": "6s", "autoscaling.knative.dev/max-scale": "1"}),
    )
    .await?;
    let host = "kcold.default.example.com";
    get_host(gateway, host).await?;
    let mut cold = Vec::new();
    for _ in 0..plan.cold_starts.min(10) {
        wait_gone(pods, "kcold").await?;
        cold.push(get_host(gateway, host).await?);
    }
    apply_ksvc(
        client,
        "kwarm",
        json!({"autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/max-scale": "1"}),
    )
    .await?;
    let host = "kwarm.default.example.com";
    get_host(gateway, host).await?;
    let mut by_host = Vec::new();
    for _ in 0..plan.warm_calls {
        by_host.push(get_host(gateway, host).await?);
    }
    let lp = ListParams::default().labels(&format!("{LABEL}=kwarm"));
    let ip = pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .find_map(|p| p.status?.pod_ip)
        .ok_or_else(|| anyhow::anyhow!("the warm Knative pod has no IP"))?;
    let direct_at = format!("{ip}:8080");
    let mut direct = Vec::new();
    for _ in 0..plan.warm_calls {
        direct.push(get_host(&direct_at, host).await?);
    }
    let overhead_ms =
        (percentile(&mut by_host, 0.5) - percentile(&mut direct, 0.5)).as_secs_f64() * 1e3;
    let api: Api<KService> = Api::namespaced(client.clone(), "default");
    for name in ["kcold", "kwarm"] {
        let _ = api.delete(name, &Default::default()).await;
    }
    Ok(json!({
        "cold_start": {"samples": cold.len(), "latency": percentiles(&mut cold)},
        "warm": {
            "through_gateway_by_host": percentiles(&mut by_host),
            "direct_to_pod": percentiles(&mut direct),
            "gateway_overhead_p50_ms": (overhead_ms * 1000.0).round() / 1000.0,
        },
    }))
}

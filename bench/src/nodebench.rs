//! The node benchmarks behind `node-bench`: pod start latency through the whole cluster
//! (create → Running as a watch sees it) next to the CRI floor measured directly on the same
//! containerd, and the proxy's full rule sync for many Services.

use crate::bench::{Server, percentiles};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams, WatchEvent, WatchParams};
use minik8s_kubelet::cri::{self, Cri};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// A benchmark pod, on node `node` when given (tolerating the edge nodes' taint).
fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "pods"}},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                                 "command": ["sleep", "3600"]}]},
    });
    if let Some(node) = node {
        p["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
        p["spec"]["tolerations"] =
            json!([{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]);
    }
    serde_json::from_value(p).expect("pod")
}

/// Creates `n` pods one after another, each once the previous is Running; returns each
/// create → Running latency as the watch saw it.
pub async fn pod_starts(client: kube::Client, n: usize) -> anyhow::Result<Vec<Duration>> {
    pod_starts_on(client, n, None).await
}

/// As [`pod_starts`], on node `node` when given.
pub async fn pod_starts_on(
    client: kube::Client,
    n: usize,
    node: Option<&str>,
) -> anyhow::Result<Vec<Duration>> {
    Ok(pod_starts_staged(client, n, node).await?.running)
}

/// Per pod, when the watch saw it bound to a node and when Running, from its create.
pub struct Starts {
    /// Create → `spec.nodeName` set (the scheduler's share).
    pub bound: Vec<Duration>,
    /// Create → phase Running.
    pub running: Vec<Duration>,
}

/// As [`pod_starts_on`], with the time each pod was seen bound.
pub async fn pod_starts_staged(
    client: kube::Client,
    n: usize,
    node: Option<&str>,
) -> anyhow::Result<Starts> {
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut watch = pods
        .watch(&WatchParams::default().labels("bench=pods"), "0")
        .await?
        .boxed();
    let mut samples = Vec::new();
    let mut bound = Vec::new();
    for i in 0..n {
        let name = format!("bench-{i}");
        let started = Instant::now();
        let mut seen_bound = None;
        pods.create(&PostParams::default(), &pod(&name, node))
            .await?;
        loop {
            let event = tokio::time::timeout(Duration::from_secs(60), watch.next())
                .await
                .map_err(|_| anyhow::anyhow!("pod {name} not Running after 60 s"))?
                .ok_or_else(|| anyhow::anyhow!("watch ended"))??;
            let (WatchEvent::Modified(p) | WatchEvent::Added(p)) = event else {
                continue;
            };
            if p.metadata.name.as_deref() != Some(name.as_str()) {
                continue;
            }
            if seen_bound.is_none() && p.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
                seen_bound = Some(started.elapsed());
            }
            if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                let at = started.elapsed();
                samples.push(at);
                bound.push(seen_bound.unwrap_or(at));
                break;
            }
        }
    }
    pods.delete_collection(
        &DeleteParams::default(),
        &kube::api::ListParams::default().labels("bench=pods"),
    )
    .await?;
    Ok(Starts {
        bound,
        running: samples,
    })
}

/// Sandbox + container start straight on the runtime, `n` times: the floor a kubelet sits on.
async fn cri_floor(socket: &Path, n: usize) -> anyhow::Result<Vec<Duration>> {
    let cri = Cri::connect(socket).await?;
    let mut samples = Vec::new();
    for i in 0..n {
        let uid = format!("floor-{i}-{}", std::process::id());
        let sandbox = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: uid.clone(),
                uid: uid.clone(),
                namespace: "bench".into(),
                attempt: 0,
            }),
            hostname: format!("floor-{i}"),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: format!("/minik8s-bench/{uid}"),
                ..Default::default()
            }),
            ..Default::default()
        };
        let started = Instant::now();
        let id = cri.run_sandbox(sandbox.clone()).await?;
        let container = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "c".into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: "docker.io/library/busybox:latest".into(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            ..Default::default()
        };
        let cid = cri.create_container(&id, container, sandbox).await?;
        cri.start_container(&cid).await?;
        loop {
            let st = cri.container_status(&cid).await?;
            if st.is_some_and(|s| s.state == cri::ContainerState::ContainerRunning as i32) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        samples.push(started.elapsed());
        cri.stop_sandbox(&id).await?;
        cri.remove_sandbox(&id).await?;
    }
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = h.path().join("minik8s-bench");
        if let Ok(children) = std::fs::read_dir(&dir) {
            for c in children.flatten() {
                let _ = std::fs::remove_dir(c.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    Ok(samples)
}

/// Starts `minik8s up` with its node in `dir` and waits until the node has registered; the
/// server and an admin client.
pub async fn with_node(
    binary: &Path,
    dir: &Path,
    images: &[std::path::PathBuf],
) -> anyhow::Result<(Server, kube::Client)> {
    let server = Server::start_with_node(binary, dir, images).await?;
    let client = minik8s_kubeconfig::client(&server.kubeconfig).await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while nodes.list(&Default::default()).await?.items.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "the node did not register");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((server, client))
}

/// Runs `measure` (given an admin client and the server's pid) against `minik8s up` with its
/// node in a fresh folder, then takes the node down.
pub async fn around_node<F, Fut>(
    binary: &Path,
    images: &[std::path::PathBuf],
    measure: F,
) -> anyhow::Result<Value>
where
    F: FnOnce(kube::Client, u32) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Value>>,
{
    let dir = tempfile::tempdir()?;
    let (server, client) = with_node(binary, dir.path(), images).await?;
    let result = measure(client, server.pid()).await;
    let down = std::process::Command::new(binary)
        .args(["down", "--data-dir"])
        .arg(dir.path())
        .output()?;
    drop(server);
    anyhow::ensure!(down.status.success(), "minik8s down failed");
    result
}

/// Pod start latency through `minik8s up` (with its node) and the CRI floor, in one run.
pub async fn pods(binary: &Path, images: &[std::path::PathBuf], n: usize) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let (server, client) = with_node(binary, dir.path(), images).await?;
    // One pod first, to warm the image and the caches.
    let _ = pod_starts(client.clone(), 1).await?;
    let Starts {
        mut bound,
        running: mut through_cluster,
    } = pod_starts_staged(client, n, None).await?;
    let socket = dir.path().join("node/containerd/containerd.sock");
    let mut floor = cri_floor(&socket, 10).await?;
    let down = std::process::Command::new(binary)
        .args(["down", "--data-dir"])
        .arg(dir.path())
        .output()?;
    drop(server);
    anyhow::ensure!(
        down.status.success(),
        "minik8s down failed: {}",
        String::from_utf8_lossy(&down.stderr)
    );
    Ok(json!({
        "pods": n,
        "create_to_running": percentiles(&mut through_cluster),
        "create_to_bound": percentiles(&mut bound),
        "cri_floor_sandbox_and_container": percentiles(&mut floor),
    }))
}

/// Renders and loads `services` Services × `endpoints` endpoints into a private network
/// namespace's iptables (twice: first load, then a sync with every endpoint moved).
pub async fn rules(services: usize, endpoints: usize) -> anyhow::Result<Value> {
    use minik8s_proxy::model::{Cluster, Endpoint, Protocol, ServicePort, render, service_chains};
    let ns = format!("mk8s-bench-{}", std::process::id());
    anyhow::ensure!(
        std::process::Command::new("ip")
            .args(["netns", "add", &ns])
            .status()?
            .success(),
        "ip netns add failed"
    );
    let model = |shift: usize| -> Vec<ServicePort> {
        (0..services)
            .map(|i| ServicePort {
                service: format!("default/svc-{i}"),
                port_name: String::new(),
                cluster_ip: Some(format!("10.96.{}.{}", i / 250, i % 250 + 1)),
                port: 80,
                protocol: Protocol::Tcp,
                node_port: None,
                affinity_seconds: None,
                external_local: false,
                internal_local: false,
                endpoints: (0..endpoints)
                    .map(|e| {
                        let n = i * endpoints + e + shift;
                        Endpoint {
                            ip: format!("10.244.{}.{}", n / 250, n % 250 + 2),
                            port: 8080,
                            local: true,
                        }
                    })
                    .collect(),
            })
            .collect()
    };
    let cluster = Cluster {
        pod_cidr: "10.244.0.0/16".into(),
    };
    let load = |text: String| -> anyhow::Result<()> {
        use std::io::Write;
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "iptables-restore", "--noflush", "-w"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())?;
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "iptables-restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    let mut results = HashMap::new();
    let started = Instant::now();
    let first = render(&cluster, &model(0), &[]);
    let render_first = started.elapsed();
    load(first.clone())?;
    results.insert("first_sync_ms", started.elapsed());
    results.insert("first_render_ms", render_first);
    let started = Instant::now();
    let second = render(&cluster, &model(1), &[]);
    let keep = service_chains(&second);
    let stale: Vec<(String, String)> = service_chains(&first)
        .into_iter()
        .filter(|c| !keep.contains(c))
        .collect();
    load(render(&cluster, &model(1), &stale))?;
    results.insert("changed_sync_ms", started.elapsed());
    let rules = first.lines().filter(|l| l.starts_with("-A")).count();
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &ns])
        .status();
    let ms = |d: &Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    Ok(json!({
        "services": services, "endpoints_per_service": endpoints, "rules": rules,
        "first_render_ms": ms(&results["first_render_ms"]),
        "first_sync_ms": ms(&results["first_sync_ms"]),
        "changed_sync_ms": ms(&results["changed_sync_ms"]),
    }))
}

//! `ha-bench`: the API on three apiservers (`minik8s up --no-node --storage etcd://…`, each
//! with its elected controllers) over a 3-member etcd (`hack/etcd-cluster.sh`, TLS) against
//! one apiserver on a 1-member etcd, measured by the same code in one run; then the failover
//! times on the three: writers through a client-side balancer while the apiserver they use is
//! SIGKILLed (the first started, whose controller manager leads), and the time until another
//! controller manager holds the Lease.

use crate::bench::{bench_cm, concurrent_creates, cpu_seconds, percentiles};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private etcd (`hack/etcd-cluster.sh`) in `dir`, stopped with its data on drop.
struct Etcd {
    dir: PathBuf,
    base: u16,
    members: u8,
    binary: PathBuf,
}

impl Etcd {
    fn script(&self, cmd: &str) -> std::process::Output {
        Command::new("bash")
            .arg(minik8s_conformance::node::repo_root().join("hack/etcd-cluster.sh"))
            .arg(cmd)
            .arg(&self.dir)
            .env("BASE_PORT", self.base.to_string())
            .env("MEMBERS", self.members.to_string())
            .env("MINIK8S", &self.binary)
            .env("PURGE", "1")
            .output()
            .expect("hack/etcd-cluster.sh runs")
    }

    /// Starts the members; returns them and the `etcd://…` endpoints.
    fn up(binary: &Path, dir: &Path, base: u16, members: u8) -> anyhow::Result<(Self, String)> {
        let etcd = Etcd {
            dir: dir.to_path_buf(),
            base,
            members,
            binary: binary.to_path_buf(),
        };
        let out = etcd.script("up");
        let endpoints = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        anyhow::ensure!(
            out.status.success() && endpoints.starts_with("etcd://"),
            "hack/etcd-cluster.sh up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((etcd, endpoints))
    }

    fn pids(&self) -> Vec<u32> {
        (1..=self.members)
            .filter_map(|n| {
                std::fs::read_to_string(self.dir.join(format!("etcd-cluster/m{n}.pid")))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.script("down");
    }
}

/// One `minik8s up --no-node` on etcd, killed on drop.
struct Apiserver {
    child: Child,
    kubeconfig: PathBuf,
    port: u16,
}

impl Apiserver {
    /// Starts an apiserver in `dir` on `storage`, with the shared keys of `pki` (the CA,
    /// service-account and front-proxy keys, the etcd client identity).
    async fn start(binary: &Path, dir: &Path, pki: &Path, storage: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join("pki"))?;
        for (_, file) in minik8s_kubeconfig::copycerts::FILES {
            if pki.join(file).exists() {
                std::fs::copy(pki.join(file), dir.join("pki").join(file))?;
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new(binary)
            .args(["up", "--no-node", "--no-functions", "--no-router"])
            .args(["--no-edge-registry", "--audit-level", "None"])
            .args(["--storage", storage, "--port", &port.to_string()])
            .arg("--data-dir")
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let kubeconfig = dir.join("admin.kubeconfig");
        let started = Instant::now();
        loop {
            if kubeconfig.exists()
                && let Ok(client) = minik8s_kubeconfig::client(&kubeconfig).await
                && client.apiserver_version().await.is_ok()
            {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "minik8s up did not answer in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Apiserver {
            child,
            kubeconfig,
            port,
        })
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    async fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(minik8s_kubeconfig::client_via(&self.kubeconfig, &self.url()).await?)
    }
}

impl Drop for Apiserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cm(name: &str) -> ConfigMap {
    bench_cm(name, "ha")
}

fn total_cpu(pids: &[u32]) -> f64 {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// The API figures of a set of apiservers: sequential creates on the first, concurrent
/// creates from `clients` spread over all of them (server CPU: every apiserver and etcd
/// member), GETs, and watch delivery from a create on the first to a watch on the last.
async fn measure(
    servers: &[Apiserver],
    pids: &[u32],
    ns: &str,
    n: usize,
    clients: usize,
) -> anyhow::Result<Value> {
    let first = servers[0].client().await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(first.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let api: Api<ConfigMap> = Api::namespaced(first.clone(), ns);
    let t0 = Instant::now();
    let cpu0 = total_cpu(pids);
    let mut seq = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        api.create(&PostParams::default(), &cm(&format!("s-{i:06}")))
            .await?;
        seq.push(t.elapsed());
    }
    let seq_rate = n as f64 / t0.elapsed().as_secs_f64();
    let seq_cpu = (total_cpu(pids) - cpu0) / n as f64 * 1000.0;

    let per = n.max(clients) / clients * 4;
    let mut conns = Vec::with_capacity(clients);
    for c in 0..clients {
        conns.push(servers[c % servers.len()].client().await?);
    }
    let cpu0 = total_cpu(pids);
    let (mut conc, took) = concurrent_creates(conns, ns, per, "ha").await?;
    let conc_rate = (per * clients) as f64 / took.as_secs_f64();
    let conc_cpu = (total_cpu(pids) - cpu0) / (per * clients) as f64 * 1000.0;

    let last: Api<ConfigMap> = Api::namespaced(servers[servers.len() - 1].client().await?, ns);
    let mut get = Vec::new();
    for i in 0..n.min(1000) {
        let t = Instant::now();
        last.get(&format!("s-{i:06}")).await?;
        get.push(t.elapsed());
    }
    let mut stream = futures::StreamExt::boxed(
        last.watch(&WatchParams::default().labels("w=1"), "0")
            .await?,
    );
    let mut watch = Vec::new();
    for i in 0..n.min(500) {
        let mut obj = cm(&format!("w-{i:06}"));
        obj.metadata
            .labels
            .get_or_insert_default()
            .insert("w".into(), "1".into());
        let t = Instant::now();
        api.create(&PostParams::default(), &obj).await?;
        loop {
            match futures::StreamExt::next(&mut stream).await {
                Some(Ok(WatchEvent::Added(o)))
                    if o.metadata.name.as_deref() == Some(&format!("w-{i:06}")) =>
                {
                    break;
                }
                Some(Ok(_)) => continue,
                other => anyhow::bail!("the watch ended: {other:?}"),
            }
        }
        watch.push(t.elapsed());
    }
    Ok(json!({
        "apiservers": servers.len(),
        "sequential_create": {"ops_per_s": seq_rate.round(), "latency": percentiles(&mut seq), "server_cpu_ms_per_op": (seq_cpu * 1000.0).round() / 1000.0},
        "concurrent_create": {"clients": clients, "ops_per_s": conc_rate.round(), "latency": percentiles(&mut conc), "server_cpu_ms_per_op": (conc_cpu * 1000.0).round() / 1000.0},
        "get_from_last": percentiles(&mut get),
        "watch_delivery_first_to_last": percentiles(&mut watch),
    }))
}

/// Writers through a balancer over `servers` while the first (the one the balancer uses, and
/// the first started, whose controller manager leads) is SIGKILLed: how long until each
/// writer's writes succeed again, how many failed, and how long until another controller
/// manager holds the Lease.
async fn failover(mut servers: Vec<Apiserver>, clients: usize) -> anyhow::Result<Value> {
    let addrs: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let lb = minik8s_balancer::start("127.0.0.1:0".parse()?, &addrs, shutdown.clone()).await?;
    let balanced = format!("https://{}", lb.addr());
    let leases: Api<Lease> = Api::namespaced(servers[1].client().await?, "kube-system");
    let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    let before = holder(leases.get("kube-controller-manager").await?);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killed_at = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
    let mut handles = Vec::new();
    for c in 0..clients {
        let client = minik8s_kubeconfig::client_via(&servers[0].kubeconfig, &balanced).await?;
        let (stop, killed_at) = (stop.clone(), killed_at.clone());
        handles.push(tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::namespaced(client, "default");
            let (mut failed, mut resumed) = (0usize, None::<Duration>);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let r = tokio::time::timeout(
                    Duration::from_secs(10),
                    api.create(&PostParams::default(), &cm(&format!("f{c:02}-{i:06}"))),
                )
                .await;
                let at = *killed_at.lock().unwrap();
                match (r, at) {
                    (Ok(Ok(_)), Some(k)) if resumed.is_none() => resumed = Some(k.elapsed()),
                    (Ok(Ok(_)), _) => {}
                    _ => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (failed, resumed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = servers.remove(0);
    *killed_at.lock().unwrap() = Some(Instant::now());
    let t = Instant::now();
    drop(first);
    let mut leader_after = None;
    while t.elapsed() < Duration::from_secs(40) {
        if let Ok(l) = leases.get("kube-controller-manager").await {
            let now = holder(l);
            if !now.is_empty() && now != before {
                leader_after = Some(t.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut resumed = Vec::new();
    let mut failed = 0;
    for h in handles {
        let (f, r) = h.await?;
        failed += f;
        resumed.extend(r);
    }
    shutdown.cancel();
    Ok(json!({
        "writers": clients,
        "writes_resumed_after_kill": percentiles(&mut resumed),
        "failed_requests": failed,
        "controller_leader_after_kill_s": leader_after.map(|d| (d.as_secs_f64() * 100.0).round() / 100.0),
    }))
}

/// Runs both setups and the failover, and returns the report.
pub async fn run(binary: &Path, n: usize, clients: usize) -> anyhow::Result<Value> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir()?;
    let one = {
        let base = dir.path().join("one");
        let (etcd, storage) = Etcd::up(binary, &base, 27790, 1)?;
        let server =
            Apiserver::start(binary, &base.join("a1"), &base.join("pki"), &storage).await?;
        let mut pids = etcd.pids();
        pids.push(server.child.id());
        measure(std::slice::from_ref(&server), &pids, "bench", n, clients).await?
    };
    let base = dir.path().join("three");
    let (etcd, storage) = Etcd::up(binary, &base, 27890, 3)?;
    let first = Apiserver::start(binary, &base.join("a1"), &base.join("pki"), &storage).await?;
    // The others share the first's keys (as `join --control-plane` copies them).
    let shared = base.join("a1/pki");
    let mut servers = vec![first];
    for name in ["a2", "a3"] {
        servers.push(Apiserver::start(binary, &base.join(name), &shared, &storage).await?);
    }
    let mut pids = etcd.pids();
    pids.extend(servers.iter().map(|s| s.child.id()));
    let three = measure(&servers, &pids, "bench", n, clients).await?;
    let failover = failover(servers, clients).await?;
    drop(etcd);
    Ok(json!({
        "one_apiserver_on_one_etcd_member": one,
        "three_apiservers_on_three_etcd_members": three,
        "failover_of_three": failover,
    }))
}

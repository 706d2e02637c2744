//! The API benchmark behind `api-bench`: starts `minik8s up` as its own process, drives it
//! with kube-rs clients over keep-alive connections and reads the server's CPU time and RSS
//! from `/proc`.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `q` quantile (nearest rank) of a set of durations; zero for none.
pub fn percentile(samples: &mut [Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
    samples[i]
}

/// Milliseconds at p50/p99 of a set of durations.
pub fn percentiles(samples: &mut [Duration]) -> Value {
    let mut at = |q: f64| (percentile(samples, q).as_secs_f64() * 1e6).round() / 1e3;
    json!({"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0)})
}

/// CPU seconds (user + system) a process has used so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After the command name: state is field 0, utime 11, stime 12 (clock ticks of 1/100 s).
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident set size of a process in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// Peak resident set size of a process in MiB (`VmHWM`).
pub fn peak_rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// A memory figure of `/proc/<pid>/status` (given in kB there) in MiB, one decimal.
fn status_mib(pid: u32, field: &str) -> f64 {
    kb_field_mib(&format!("/proc/{pid}/status"), field)
}

/// A `Name: N kB` line of a `/proc` file in MiB, one decimal (0 if missing).
fn kb_field_mib(file: &str, field: &str) -> f64 {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let kb = text
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    (kb / 1024.0 * 10.0).round() / 10.0
}

/// A process's memory as the honest measures have it, in MiB: `VmRSS` (which counts clean
/// pages of the binary the kernel may drop and share), `RssAnon` (its private, anonymous
/// memory: heap, stacks, pages it wrote) and `Pss` (its resident pages, each shared one
/// divided among the processes that map it).
pub fn memory(pid: u32) -> Value {
    json!({
        "vm_rss_mib": status_mib(pid, "VmRSS:"),
        "rss_anon_mib": status_mib(pid, "RssAnon:"),
        "pss_mib": kb_field_mib(&format!("/proc/{pid}/smaps_rollup"), "Pss:"),
    })
}

/// A memory cgroup of its own for a process under measure (cgroup v2, or v1's memory
/// controller where only that is mounted), removed on drop once its processes are gone.
pub struct Cgroup(std::path::PathBuf);

impl Cgroup {
    /// `<memory hierarchy>/<name>`; `None` where there is no memory controller to write.
    pub fn create(name: &str) -> Option<Cgroup> {
        let v2 = Path::new("/sys/fs/cgroup");
        let root = if v2.join("cgroup.controllers").exists() {
            let enabled = std::fs::read_to_string(v2.join("cgroup.subtree_control")).ok()?;
            if !enabled.split_whitespace().any(|c| c == "memory") {
                std::fs::write(v2.join("cgroup.subtree_control"), "+memory").ok()?;
            }
            v2.to_owned()
        } else {
            let v1 = v2.join("memory");
            if !v1.join("memory.usage_in_bytes").exists() {
                return None;
            }
            v1
        };
        let path = root.join(name);
        std::fs::create_dir_all(&path).ok()?;
        Some(Cgroup(path))
    }

    /// Its `cgroup.procs`: a process id written there moves the process in.
    pub fn procs(&self) -> std::path::PathBuf {
        self.0.join("cgroup.procs")
    }

    /// Its folder.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Its memory usage in MiB: anonymous memory and the page cache its processes' reads and
    /// writes brought in.
    pub fn memory_mib(&self) -> f64 {
        cgroup_memory_mib(&self.0)
    }
}

/// A cgroup folder's memory usage in MiB, one decimal (`memory.current`, or v1's
/// `memory.usage_in_bytes`; 0 if neither reads).
pub fn cgroup_memory_mib(cgroup: &Path) -> f64 {
    let bytes: f64 = ["memory.current", "memory.usage_in_bytes"]
        .iter()
        .find_map(|f| std::fs::read_to_string(cgroup.join(f)).ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    (bytes / 1048576.0 * 10.0).round() / 10.0
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A `minik8s up` child process, killed on drop.
pub struct Server {
    child: Child,
    /// The command that started it (`sh -c` around it when it starts in a cgroup).
    command: Vec<std::ffi::OsString>,
    /// Its admin kubeconfig.
    pub kubeconfig: std::path::PathBuf,
    /// Seconds from spawn until it answered.
    pub ready_after: Duration,
}

impl Server {
    /// Starts `minik8s up` on a free port with a fresh data folder and waits until it answers.
    pub async fn start(binary: &Path, dir: &Path) -> anyhow::Result<Self> {
        Self::start_in(binary, dir, None, &[]).await
    }

    /// As [`Server::start`] with `extra` flags, the process in `cgroup` (if any) from its
    /// first instruction.
    pub async fn start_in(
        binary: &Path,
        dir: &Path,
        cgroup: Option<&Cgroup>,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let flags: Vec<&str> = ["--no-node"].iter().chain(extra).copied().collect();
        Self::start_with(binary, dir, &flags, cgroup).await
    }

    /// Starts `minik8s up` with this machine's node (kubelet, containerd, proxy) and its local
    /// registry (on a free port) serving the given image archives; stop it with `minik8s down`.
    pub async fn start_with_node(
        binary: &Path,
        dir: &Path,
        images: &[std::path::PathBuf],
    ) -> anyhow::Result<Self> {
        let list = images
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let registry = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let gateway = std::net::TcpListener::bind("0.0.0.0:0")?.local_addr()?;
        Self::start_with(
            binary,
            dir,
            &[
                "--image",
                &list,
                "--registry",
                &registry.to_string(),
                "--gateway",
                &gateway.to_string(),
            ],
            None,
        )
        .await
    }

    async fn start_with(
        binary: &Path,
        dir: &Path,
        extra: &[&str],
        cgroup: Option<&Cgroup>,
    ) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut command: Vec<std::ffi::OsString> = Vec::new();
        if let Some(cg) = cgroup {
            // Into the cgroup before it starts, so that everything it allocates counts there.
            command.extend([
                "sh".into(),
                "-c".into(),
                r#"echo $$ > "$0" && exec "$@""#.into(),
            ]);
            command.push(cg.procs().into());
        }
        command.push(binary.into());
        command.push("up".into());
        command.extend(extra.iter().map(Into::into));
        command.push("--data-dir".into());
        command.push(dir.into());
        for a in ["--port", &port.to_string(), "--audit-level", "None"] {
            command.push(a.into());
        }
        let started = Instant::now();
        let child = spawn(&command)?;
        let kubeconfig = dir.join("admin.kubeconfig");
        let mut server = Server {
            ready_after: Duration::ZERO,
            child,
            command,
            kubeconfig,
        };
        server.wait_ready(Duration::from_secs(30)).await?;
        server.ready_after = started.elapsed();
        Ok(server)
    }

    /// Waits until it answers, at most `limit`.
    async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if self.kubeconfig.exists()
                && let Ok(client) = minik8s_kubeconfig::client(&self.kubeconfig).await
                && client.apiserver_version().await.is_ok()
            {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < limit,
                "minik8s up did not answer in {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// SIGKILLs it and starts it again on the same data folder and port; the time from the
    /// kill until it answered (at most `limit`).
    pub async fn kill_and_restart(&mut self, limit: Duration) -> anyhow::Result<Duration> {
        let killed = Instant::now();
        self.child.kill()?;
        self.child.wait()?;
        self.child = spawn(&self.command)?;
        self.wait_ready(limit).await?;
        Ok(killed.elapsed())
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Starts `command` with the server's environment: warnings only on stderr, unless
/// `MINIK8S_BENCH_LOG` sets the log filter (for a profile).
fn spawn(command: &[std::ffi::OsString]) -> std::io::Result<Child> {
    Command::new(&command[0])
        .args(&command[1..])
        .env(
            "RUST_LOG",
            std::env::var("MINIK8S_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The benchmarks' ConfigMap: `name`, labelled `bench: <bench>`, 200 bytes of data.
pub(crate) fn bench_cm(name: &str, bench: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"bench": bench}},
        "data": {"key": "x".repeat(200)},
    }))
    .expect("configmap")
}

fn cm(name: &str) -> ConfigMap {
    bench_cm(name, "api")
}

/// `per` creates of ConfigMaps `cNN-NNNNNN` in `ns` from each client at once (each its own
/// connection): every create's latency, and the wall time of the whole.
pub(crate) async fn concurrent_creates(
    clients: Vec<kube::Client>,
    ns: &str,
    per: usize,
    bench: &'static str,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        let ns = ns.to_owned();
        handles.push(tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::namespaced(client, &ns);
            let mut lat = Vec::with_capacity(per);
            for i in 0..per {
                let t = Instant::now();
                api.create(
                    &PostParams::default(),
                    &bench_cm(&format!("c{c:02}-{i:06}"), bench),
                )
                .await?;
                lat.push(t.elapsed());
            }
            Ok::<_, kube::Error>(lat)
        }));
    }
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await??);
    }
    Ok((lat, t0.elapsed()))
}

/// The Accept header `kubectl get` sends: a server-side Table, plain JSON as the fallback.
const KUBECTL_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// Runs every measurement and returns the report.
pub async fn run(binary: &Path, n: usize, clients: usize, linger: u64) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let server = Server::start(binary, dir.path()).await?;
    let pid = server.pid();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = rss_mib(pid);
    let idle_memory = memory(pid);
    let client = minik8s_kubeconfig::client(&server.kubeconfig).await?;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for name in ["seq", "conc", "watch"] {
        ns.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await?;
    }

    // Sequential creates.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "seq");
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        api.create(&PostParams::default(), &cm(&format!("cm-{i:06}")))
            .await?;
        lat.push(t.elapsed());
    }
    let seq_rate = n as f64 / t0.elapsed().as_secs_f64();
    let seq_cpu = (cpu_seconds(pid) - cpu0) / n as f64 * 1000.0;
    let seq = percentiles(&mut lat);

    // Concurrent creates from independent clients (each with its own connection).
    let per = n.max(clients) / clients * 4;
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(minik8s_kubeconfig::client(&server.kubeconfig).await?);
    }
    let cpu0 = cpu_seconds(pid);
    let (mut conc, took) = concurrent_creates(conns, "conc", per, "api").await?;
    let conc_rate = (per * clients) as f64 / took.as_secs_f64();
    let conc_cpu = (cpu_seconds(pid) - cpu0) / (per * clients) as f64 * 1000.0;

    // GET, update, LIST.
    let mut get = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        api.get(&format!("cm-{i:06}")).await?;
        get.push(t.elapsed());
    }
    let mut update = Vec::new();
    let cpu0 = cpu_seconds(pid);
    for i in 0..n.min(1000) {
        let mut o = api.get(&format!("cm-{i:06}")).await?;
        o.data
            .as_mut()
            .expect("data")
            .insert("key".into(), format!("v{i}"));
        let t = Instant::now();
        api.replace(&format!("cm-{i:06}"), &PostParams::default(), &o)
            .await?;
        update.push(t.elapsed());
    }
    let update_cpu = (cpu_seconds(pid) - cpu0) / n.min(1000) as f64 * 1000.0;
    // The same LIST without client-side decoding (the server's share).
    let mut list_raw = Vec::new();
    for _ in 0..10 {
        let req = http::Request::get("/api/v1/namespaces/seq/configmaps").body(Vec::new())?;
        let t = Instant::now();
        let body = client.request_text(req).await?;
        list_raw.push(t.elapsed());
        anyhow::ensure!(body.len() > n * 200, "short list body");
    }
    let mut list = Vec::new();
    let mut listed = 0;
    for _ in 0..10 {
        let t = Instant::now();
        listed = api.list(&ListParams::default()).await?.items.len();
        list.push(t.elapsed());
    }

    // The first page of `kubectl get` (a 500-row Table, as kubectl asks for it), then a warm
    // `kubectl get` of all `n` (four such pages, printed).
    let mut table = Vec::new();
    for _ in 0..20 {
        let req = http::Request::get("/api/v1/namespaces/seq/configmaps?limit=500")
            .header(http::header::ACCEPT, KUBECTL_TABLE)
            .body(Vec::new())?;
        let t = Instant::now();
        let body = client.request_text(req).await?;
        table.push(t.elapsed());
        anyhow::ensure!(
            body.contains("\"kind\":\"Table\"") && body.matches("\"cells\"").count() == 500.min(n),
            "the Table page is not 500 rows"
        );
    }
    let mut kubectl_get = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&server.kubeconfig)
            .args(["get", "configmaps", "-n", "seq", "--no-headers"])
            .stderr(Stdio::inherit())
            .output()?;
        kubectl_get.push(t.elapsed());
        anyhow::ensure!(
            out.status.success() && out.stdout.split(|b| *b == b'\n').count() > n,
            "kubectl get failed"
        );
    }
    // The first run warms kubectl's discovery cache.
    kubectl_get.remove(0);

    // Watch delivery: from the start of a create to the event arriving.
    let wapi: Api<ConfigMap> = Api::namespaced(client.clone(), "watch");
    let mut stream = wapi.watch(&WatchParams::default(), "0").await?.boxed();
    let mut watch = Vec::new();
    for i in 0..n.min(1000) {
        let t = Instant::now();
        wapi.create(&PostParams::default(), &cm(&format!("w-{i:06}")))
            .await?;
        loop {
            match stream.next().await {
                Some(Ok(WatchEvent::Added(o)))
                    if o.metadata.name.as_deref() == Some(&format!("w-{i:06}")) =>
                {
                    break;
                }
                Some(Ok(_)) => continue,
                other => anyhow::bail!("watch ended: {other:?}"),
            }
        }
        watch.push(t.elapsed());
    }

    let mut delete = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        api.delete(&format!("cm-{i:06}"), &DeleteParams::default())
            .await?;
        delete.push(t.elapsed());
    }
    // What the load leaves behind once it is over (jemalloc returns freed pages after 1 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after_memory = memory(pid);
    let mut lingering = Vec::new();
    for sample in 1..=linger / 30 {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let mut m = memory(pid);
        m["seconds_after_load"] = json!(5 + 30 * sample);
        lingering.push(m);
    }
    Ok(json!({
        "server_ready_ms": (server.ready_after.as_secs_f64() * 1e4).round() / 10.0,
        "idle_rss_mib": idle_rss,
        "sequential_create": {"ops_per_s": seq_rate.round(), "latency": seq, "server_cpu_ms_per_op": (seq_cpu * 1000.0).round() / 1000.0},
        "concurrent_create": {"clients": clients, "ops_per_s": conc_rate.round(), "latency": percentiles(&mut conc), "server_cpu_ms_per_op": (conc_cpu * 1000.0).round() / 1000.0},
        "get": percentiles(&mut get),
        "update": {"latency": percentiles(&mut update), "server_cpu_ms_per_op": (update_cpu * 1000.0).round() / 1000.0},
        "list": {"items": listed, "latency_typed_client": percentiles(&mut list), "latency_raw_body": percentiles(&mut list_raw)},
        "table_first_page_500": percentiles(&mut table),
        "kubectl_get_warm": {"items": n, "latency": percentiles(&mut kubectl_get)},
        "watch_delivery_from_request_start": percentiles(&mut watch),
        "delete": percentiles(&mut delete),
        "rss_after_mib": rss_mib(pid),
        "memory": {"idle": idle_memory, "after": after_memory, "later": lingering},
    }))
}

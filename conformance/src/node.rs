//! Real nodes for the conformance suite: a kubelet on its own private containerd (started from
//! Debian's packages), with the locally built images, torn down completely on drop.

use crate::Cluster;
use std::path::PathBuf;
use std::process::Command;
use tokio_util::sync::CancellationToken;

/// A running kubelet (with its runtime) and service proxy; everything they made is removed on
/// drop.
pub struct Node {
    cfg: minik8s_kubelet::Config,
    shutdown: CancellationToken,
    kubelet: CancellationToken,
    done: Option<std::sync::mpsc::Receiver<()>>,
    /// Closed when the proxy has stopped (it must not write rules after they are removed).
    proxy_done: Option<std::sync::mpsc::Receiver<()>>,
    /// The hosts file whose managed block the node's router writes, if it runs one.
    hosts_file: Option<PathBuf>,
    /// The node's name.
    pub name: String,
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// Builds (once) the local pause, busybox, Python function runtime and Knative sample image
/// archives; returns their paths.
pub fn images() -> Vec<PathBuf> {
    let root = repo_root();
    // A baseline binary is benchmarked with the images built from its own commit
    // (`MINIK8S_IMAGES=DIR`, taken as they are): its runtime image's tag differs.
    let dir = match std::env::var_os("MINIK8S_IMAGES") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = root.join("target/images");
            let status = std::process::Command::new("bash")
                .arg(root.join("hack/images.sh"))
                .arg(&dir)
                .status()
                .expect("hack/images.sh runs");
            assert!(status.success(), "building the local images failed");
            dir
        }
    };
    vec![
        dir.join("pause.tar"),
        dir.join("busybox.tar"),
        dir.join("function-python.tar"),
        dir.join("knative-helloworld.tar"),
    ]
}

/// One HTTP GET with a short timeout: the body, or `None`.
pub fn http_get(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n")
        .map(|(_, body)| body.trim().to_owned())
}

/// The bodies `addr` answers with over up to 60 s of GETs, stopping once all of `expected`
/// were seen (each backend answers with its own name).
pub fn answers_from(
    addr: &str,
    expected: &std::collections::BTreeSet<String>,
) -> std::collections::BTreeSet<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = std::collections::BTreeSet::new();
    while &seen != expected && std::time::Instant::now() < deadline {
        match http_get(addr) {
            Some(body) => {
                seen.insert(body);
            }
            None => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
    seen
}

impl Cluster {
    /// Waits (up to 60 s) until node `name` is Ready.
    pub fn wait_node_ready(&self, name: &str) {
        self.eventually_within(
            std::time::Duration::from_secs(60),
            &[
                "get",
                "node",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
            |s| s == "True",
        );
    }

    /// The cluster's local image registry (started on first use on a free loopback port),
    /// holding the local pause and busybox images.
    pub fn registry(&self) -> &minik8s_kubelet::registry::Registry {
        self.registry.get_or_init(|| {
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port");
            let (registry, rest) = self
                .block_on(minik8s_kubelet::registry::publish(
                    &self.dir().join("registry"),
                    addr,
                    &images(),
                ))
                .expect("the local registry (install it with hack/install-deps.sh --node)");
            assert!(
                rest.is_empty(),
                "archives the registry did not take: {rest:?}"
            );
            registry
        })
    }

    /// Runs a kubelet with `cfg` (as the node's own identity) until `shutdown`; the receiver
    /// hears when it has stopped.
    fn spawn_kubelet(
        &self,
        cfg: &minik8s_kubelet::Config,
        shutdown: CancellationToken,
    ) -> std::sync::mpsc::Receiver<()> {
        let kubeconfig =
            self.user_kubeconfig(&format!("system:node:{}", cfg.node_name), &["system:nodes"]);
        let (tx, rx) = std::sync::mpsc::channel();
        let cfg = cfg.clone();
        self.spawn(async move {
            let client = minik8s_kubeconfig::client(&kubeconfig)
                .await
                .expect("kubelet client");
            if let Err(e) = minik8s_kubelet::run(client, cfg, shutdown).await {
                eprintln!("kubelet: {e}");
            }
            let _ = tx.send(());
        });
        rx
    }

    /// Stops the node's kubelet and starts a new one on the same runtime and folders (its
    /// pods keep running throughout).
    pub fn restart_kubelet(&self, node: &mut Node) {
        node.stop_kubelet();
        node.kubelet = CancellationToken::new();
        node.done = Some(self.spawn_kubelet(&node.cfg, node.kubelet.clone()));
    }

    /// Starts a real node `name` (bridge `mk8s<index>`, pods in 10.244.<index>.0/24) with the
    /// kubelet's own identity, and waits until it is registered.
    pub fn run_node(&self, name: &str, index: u8) -> Node {
        self.run_node_with(name, index, None)
    }

    /// As [`Cluster::run_node`], with the node's HTTP router on port 80 of every address,
    /// listing its hosts in this machine's `/etc/hosts` (removed when the node goes down).
    pub fn run_routed_node(&self, name: &str, index: u8) -> Node {
        let ip = self.block_on(minik8s_kubelet::node::default_ip());
        let router = minik8s_proxy::router::Config {
            listen: ([0, 0, 0, 0], 80).into(),
            listen_tls: Some(([0, 0, 0, 0], 443).into()),
            node_ip: ip.parse().expect("the node's address"),
            hosts_file: Some("/etc/hosts".into()),
        };
        self.run_node_with(name, index, Some(router))
    }

    fn run_node_with(
        &self,
        name: &str,
        index: u8,
        router: Option<minik8s_proxy::router::Config>,
    ) -> Node {
        let hosts_file = router.as_ref().and_then(|r| r.hosts_file.clone());
        let root = self.dir().join(format!("node-{name}"));
        let mut cfg = minik8s_kubelet::Config::new(name, &root);
        cfg.runtime.bridge = format!("mk8s{index}");
        cfg.runtime.pod_cidr = format!("10.244.{index}.0/24");
        cfg.runtime.registry_mirror = Some(self.registry().addr().to_string());
        cfg.cgroup_root = format!("/minik8s-test/{name}");
        cfg.manifests = Some(root.join("manifests"));
        cfg.listen = ([0, 0, 0, 0], 0).into();
        cfg.client_ca = Some(self.ca_path().to_path_buf());
        let shutdown = CancellationToken::new();
        let kubelet = shutdown.child_token();
        let rx = self.spawn_kubelet(&cfg, kubelet.clone());
        let proxy_done = {
            // The cluster DNS: the kube-dns Service (once per cluster; applying is
            // idempotent), served by this node's proxy on its pod gateway address.
            self.block_on(minik8s_proxy::dns::install(self.client()))
                .expect("the kube-dns Service installs");
            self.block_on(minik8s_proxy::router::install(self.client()))
                .expect("the router's kind and role install");
            let kubeconfig = self.user_kubeconfig("system:kube-proxy", &[]);
            let mut proxy = minik8s_proxy::Config::new(name);
            proxy.dns = minik8s_proxy::dns::Config::gateway_of(&cfg.runtime.pod_cidr)
                .map(minik8s_proxy::dns::Config::on);
            proxy.router = router;
            let shutdown = shutdown.clone();
            let (stopped, proxy_done) = std::sync::mpsc::channel::<()>();
            self.spawn(async move {
                let _stopped = stopped;
                let client = minik8s_kubeconfig::client(&kubeconfig)
                    .await
                    .expect("proxy client");
                if let Err(e) = minik8s_proxy::run(client, proxy, shutdown).await {
                    eprintln!("proxy: {e}");
                }
            });
            proxy_done
        };
        // Made before waiting, so a node that never gets Ready is still torn down.
        let node = Node {
            cfg,
            kubelet,
            shutdown,
            done: Some(rx),
            proxy_done: Some(proxy_done),
            hosts_file,
            name: name.to_owned(),
        };
        self.wait_node_ready(name);
        node
    }
}

impl Node {
    /// The node's kubelet configuration.
    pub fn config(&self) -> &minik8s_kubelet::Config {
        &self.cfg
    }

    /// Tears the node down and returns what is left of it (nothing, when all went well).
    pub fn down(mut self) -> Vec<String> {
        self.shutdown.cancel();
        self.stop_kubelet();
        self.wait_proxy();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let cfg = self.cfg.clone();
        let hosts_file = self.hosts_file.take();
        rt.block_on(async {
            if let Err(e) = minik8s_proxy::iptables::cleanup().await {
                eprintln!("removing the proxy's rules: {e}");
            }
            if let Some(f) = &hosts_file
                && let Err(e) = minik8s_proxy::router::remove_hosts_block(f)
            {
                eprintln!("removing the hosts block: {e}");
            }
            if let Err(e) = minik8s_kubelet::down::down(&cfg).await {
                eprintln!("tearing down node {}: {e}", cfg.node_name);
            }
            let mut left = minik8s_kubelet::down::leftovers(&cfg).await;
            left.extend(minik8s_proxy::iptables::leftovers().await);
            left
        })
    }

    /// Waits (up to 30 s) for the proxy to stop after the node's shutdown: a sync in flight
    /// would otherwise write its chains again after they are removed.
    fn wait_proxy(&mut self) {
        if let Some(rx) = self.proxy_done.take() {
            // Closed (an error) when the proxy's task ends.
            let _ = rx.recv_timeout(std::time::Duration::from_secs(30));
        }
    }

    /// Stops the kubelet only (pods and runtime keep running).
    pub fn stop_kubelet(&mut self) {
        self.kubelet.cancel();
        if let Some(rx) = self.done.take() {
            let _ = rx.recv_timeout(std::time::Duration::from_secs(30));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.stop_kubelet();
        self.wait_proxy();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        if let Some(f) = &self.hosts_file {
            let _ = minik8s_proxy::router::remove_hosts_block(f);
        }
        rt.block_on(async {
            let _ = minik8s_proxy::iptables::cleanup().await;
            if let Err(e) = minik8s_kubelet::down::down(&self.cfg).await {
                eprintln!("tearing down node {}: {e}", self.name);
            }
        });
    }
}

/// The Python virtualenv of the conformance suite (made once by hack/pyclient.sh, with the
/// official Kubernetes client and `prometheus_client`): its python.
pub fn python() -> String {
    let out = Command::new("bash")
        .arg(repo_root().join("hack/pyclient.sh"))
        .output()
        .expect("hack/pyclient.sh runs");
    assert!(
        out.status.success(),
        "installing the Python packages failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One sample of a scraped metrics page.
#[derive(Clone, Debug)]
pub struct Sample {
    /// The family's name (a counter's without `_total`).
    pub family: String,
    /// The family's type (`counter`, `gauge`, `histogram`, …).
    pub kind: String,
    /// The sample's own name (`…_total`, `…_bucket`, …).
    pub name: String,
    /// Its labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// Parses an OpenMetrics page with the `prometheus_client` Python package's strict parser
/// (what Prometheus's own tooling accepts); panics with the parser's complaint otherwise.
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([fam.name, fam.type, s.name, s.labels, s.value])
print(json.dumps(out))
"#;
    let mut child = Command::new(python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(text.as_bytes()).expect("writing the page");
    }
    let out = child.wait_with_output().expect("python ends");
    assert!(
        out.status.success(),
        "not valid OpenMetrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    rows.into_iter()
        .map(|r| Sample {
            family: r[0].as_str().unwrap_or_default().to_owned(),
            kind: r[1].as_str().unwrap_or_default().to_owned(),
            name: r[2].as_str().unwrap_or_default().to_owned(),
            labels: serde_json::from_value(r[3].clone()).unwrap_or_default(),
            value: r[4].as_f64().unwrap_or(f64::NAN),
        })
        .collect()
}

/// Where cargo put the workspace's binaries (next to this test's own executable).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    // target/<profile>/deps/<test> → target/<profile>/<name>; a binary of this package is
    // in target/<profile> itself.
    let dir = exe.parent().expect("the executable's folder");
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("target folder")
    } else {
        dir
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test --workspace` (or `cargo build --bins`) builds it",
        path.display()
    );
    path
}

/// A node joined the way a second machine would: the `kubelet` and `kube-proxy` binaries
/// as their own processes with their own identities. Torn down on drop.
pub struct NodeProcess {
    cfg: minik8s_kubelet::Config,
    kubelet: Option<std::process::Child>,
    proxy: Option<std::process::Child>,
}

impl Cluster {
    /// Starts node `name` from the `kubelet` and `kube-proxy` binaries (bridge
    /// `mk8s<index>`, pods in 10.244.<index>.0/24) and waits until it is Ready.
    pub fn join_node(&self, name: &str, index: u8) -> NodeProcess {
        self.block_on(minik8s_proxy::dns::install(self.client()))
            .expect("the kube-dns Service installs");
        self.block_on(minik8s_proxy::router::install(self.client()))
            .expect("the router's kind and role install");
        let root = self.dir().join(format!("node-{name}"));
        let mut cfg = minik8s_kubelet::Config::new(name, &root);
        cfg.runtime.bridge = format!("mk8s{index}");
        cfg.runtime.pod_cidr = format!("10.244.{index}.0/24");
        cfg.cgroup_root = format!("/minik8s-test/{name}");
        let mirror = self.registry().addr().to_string();
        let kubelet = std::process::Command::new(bin("kubelet"))
            .arg("--kubeconfig")
            .arg(self.user_kubeconfig(&format!("system:node:{name}"), &["system:nodes"]))
            .args(["--node-name", name, "--root-dir"])
            .arg(&root)
            .args(["--pod-cidr", &cfg.runtime.pod_cidr])
            .args(["--bridge", &cfg.runtime.bridge])
            .args(["--cgroup-root", &cfg.cgroup_root])
            .args(["--listen", "0.0.0.0:0", "--registry-mirror", &mirror])
            .arg("--client-ca")
            .arg(self.ca_path())
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("the kubelet binary starts");
        let proxy = std::process::Command::new(bin("kube-proxy"))
            .arg("--kubeconfig")
            .arg(self.user_kubeconfig("system:kube-proxy", &[]))
            .args(["--node-name", name])
            .args(
                minik8s_proxy::dns::Config::gateway_of(&cfg.runtime.pod_cidr)
                    .map(|ip| vec!["--dns-listen".to_owned(), ip.to_string()])
                    .unwrap_or_default(),
            )
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("the kube-proxy binary starts");
        let node = NodeProcess {
            cfg,
            kubelet: Some(kubelet),
            proxy: Some(proxy),
        };
        self.wait_node_ready(name);
        node
    }
}

/// Sends SIGTERM and waits (up to 30 s) for the process to exit; whether it exited cleanly
/// (killed when it does not).
pub fn terminate(child: &mut std::process::Child) -> bool {
    let _ = std::process::Command::new("kill")
        .arg(child.id().to_string())
        .status();
    for _ in 0..300 {
        if let Ok(Some(status)) = child.try_wait() {
            return status.success();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// A TCP port free on every address now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl NodeProcess {
    /// Stops both processes (SIGTERM) and tears the node down; returns whether both exited
    /// cleanly and what is left of the node.
    pub fn down(mut self) -> (bool, Vec<String>) {
        let clean = self.stop();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let left = rt.block_on(async {
            if let Err(e) = minik8s_kubelet::down::down(&self.cfg).await {
                eprintln!("tearing down node {}: {e}", self.cfg.node_name);
            }
            let mut left = minik8s_kubelet::down::leftovers(&self.cfg).await;
            left.extend(minik8s_proxy::iptables::leftovers().await);
            left
        });
        (clean, left)
    }

    /// Stops the kubelet and the proxy, then removes the proxy's rules (`--cleanup`).
    fn stop(&mut self) -> bool {
        let mut clean = true;
        for child in [self.kubelet.take(), self.proxy.take()]
            .iter_mut()
            .flatten()
        {
            clean &= terminate(child);
        }
        let cleanup = std::process::Command::new(bin("kube-proxy"))
            .arg("--cleanup")
            .status()
            .is_ok_and(|s| s.success());
        clean && cleanup
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if self.kubelet.is_none() && self.proxy.is_none() {
            return;
        }
        self.stop();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _ = rt.block_on(minik8s_kubelet::down::down(&self.cfg));
    }
}

/// The environment that runs a process on libfaketime's clock, read from `file` (written
/// `+0` here; later `+300s`, `-300s` and so on step the wall clock; the monotonic clock is
/// left alone).
pub fn faketime(file: &std::path::Path) -> Vec<(&'static str, String)> {
    let lib = std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(|e| Some(e.ok()?.path().join("faketime/libfaketimeMT.so.1")))
        .find(|p| p.exists())
        .expect("libfaketime (hack/install-deps.sh installs it)");
    std::fs::write(file, "+0\n").expect("the clock file");
    vec![
        ("LD_PRELOAD", lib.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ]
}

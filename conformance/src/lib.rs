//! minik8s conformance: scenarios driven with the stock `kubectl` against a freshly started
//! apiserver. [`Cluster`] starts one in-process on a free loopback port with its own PKI,
//! store and kubectl cache, and runs kubectl against it.

pub mod machines;
pub mod node;

use minik8s_kubeconfig::{Identity, Pki, PkiOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tokio_util::sync::CancellationToken;

/// A running apiserver with an admin kubeconfig, stopped on drop.
pub struct Cluster {
    rt: tokio::runtime::Runtime,
    shutdown: CancellationToken,
    server: Option<minik8s_apiserver::Server>,
    config: minik8s_apiserver::Config,
    admin: PathBuf,
    _etcd: Option<minik8s_storage::testing::TestEtcd>,
    dir: tempfile::TempDir,
    registry: std::sync::OnceLock<minik8s_kubelet::registry::Registry>,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
}

/// The result of one kubectl run.
#[derive(Debug)]
pub struct Run {
    /// Exit status success.
    pub ok: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Run {
    fn from(o: Output) -> Self {
        Run {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Runs kubectl with `kubeconfig` and a private `home` (its cache), feeding `stdin`.
pub(crate) fn run_kubectl(
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Run {
    run_client(Path::new("kubectl"), kubeconfig, home, args, stdin, &[])
}

/// Runs a client program (kubectl of some version, helm) with `kubeconfig`, a private `home`
/// (its caches) and the variables `env`, feeding `stdin`.
pub(crate) fn run_client(
    program: &Path,
    kubeconfig: &Path,
    home: &Path,
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
) -> Run {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", plugin_path())
        .env("HOME", home)
        .env_remove("KUBECTL_EXTERNAL_DIFF")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} runs: {e}", program.display()));
    {
        let mut input = child.stdin.take().expect("stdin");
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).expect("stdin");
        }
    }
    Run::from(child.wait_with_output().expect("kubectl finishes"))
}

/// Runs `kubectl` (through `run`) until its output satisfies `done` (or `limit` passes);
/// returns it.
pub(crate) fn retry_kubectl(
    limit: std::time::Duration,
    args: &[&str],
    run: impl Fn(&[&str]) -> Run,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let r = run(args);
        if r.ok && done(&r.stdout) {
            return r.stdout;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl {args:?} never got there; last output:\n{}{}",
            r.stdout,
            r.stderr
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

impl Cluster {
    /// Starts an apiserver on the embedded store (or the given storage endpoint).
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts an apiserver on a private etcd (Debian's etcd-server, started here).
    pub fn start_etcd() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let etcd = rt
            .block_on(minik8s_storage::testing::TestEtcd::start())
            .expect("a private etcd (install it with hack/install-deps.sh)");
        let mut c = Self::start_with(Some(minik8s_storage::Endpoint::Etcd(vec![
            etcd.url.clone(),
        ])));
        c._etcd = Some(etcd);
        c
    }

    /// Starts an apiserver on the given storage (`None`: embedded in a temp folder).
    pub fn start_with(storage: Option<minik8s_storage::Endpoint>) -> Self {
        Self::start_on(storage, None, None)
    }

    /// Another apiserver on the same etcd as `other` (started with [`Self::start_etcd`]),
    /// with `other`'s CA, keys and identities (as a control-plane machine joining shares
    /// them) and its own serving certificate, advertised at `advertise` (`host:port`, what
    /// `default/kubernetes` lists for it).
    pub fn start_beside(other: &Cluster, advertise: &str) -> Self {
        Self::start_on(
            Some(other.config.storage.clone()),
            Some(advertise.to_owned()),
            Some(&other.dir.path().join("pki")),
        )
    }

    /// Starts an apiserver on `storage`, advertised at `advertise` (default: where it
    /// listens), with a copy of the PKI folder `shared_pki` when given.
    fn start_on(
        storage: Option<minik8s_storage::Endpoint>,
        advertise: Option<String>,
        shared_pki: Option<&Path>,
    ) -> Self {
        assert!(
            Command::new("kubectl")
                .arg("version")
                .arg("--client")
                .output()
                .is_ok(),
            "the stock kubectl is required on the PATH"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let pki_dir = dir.path().join("pki");
        if let Some(shared) = shared_pki {
            std::fs::create_dir_all(&pki_dir).expect("pki folder");
            for entry in std::fs::read_dir(shared).expect("shared pki").flatten() {
                if entry.path().is_file() {
                    std::fs::copy(entry.path(), pki_dir.join(entry.file_name())).expect("copy pki");
                }
            }
        }
        // The port is known only after binding; the serving cert names 127.0.0.1 whatever the port.
        let pki = Pki::init(PkiOptions {
            dir: pki_dir.clone(),
            cluster_name: "minik8s".into(),
            server: "https://127.0.0.1:0".into(),
            hostnames: vec![],
            ips: vec![],
        })
        .expect("PKI");
        pki.issue_serving_cert().expect("serving cert");
        for id in Identity::components("none") {
            if id.file == "apiserver-kubelet-client" {
                pki.ensure_identity(&id).expect("kubelet client identity");
            }
        }
        let shutdown = CancellationToken::new();
        let storage = storage
            .unwrap_or_else(|| minik8s_storage::Endpoint::Embedded(dir.path().join("store")));
        let config = minik8s_apiserver::Config {
            storage,
            etcd_tls: None,
            store_cache_bytes: minik8s_storage::DEFAULT_CACHE_BYTES,
            store_history_age: minik8s_storage::DEFAULT_HISTORY_AGE,
            listen: "127.0.0.1:0".parse().expect("addr"),
            advertise,
            tls_cert: pki_dir.join("apiserver.crt"),
            tls_key: pki_dir.join("apiserver.key"),
            client_ca: pki.ca_path(),
            token_file: None,
            service_cidr: "10.96.0.0/12".into(),
            node_ports: 30000..=32767,
            audit: Some((
                dir.path().join("audit.log"),
                minik8s_apiserver::serving::audit::Level::Metadata,
            )),
            // Short token lifetimes are allowed here so expiry can be tested.
            service_account_key: Some((pki.service_account_key().expect("sa key"), 1)),
            max_inflight: 400,
            request_timeout: std::time::Duration::from_secs(60),
            default_toleration_seconds: 300,
            // Quick, so a test sees a hand-written quota status put right.
            quota_resync: std::time::Duration::from_secs(2),
            kubelet_client: Some((
                pki_dir.join("apiserver-kubelet-client.crt"),
                pki_dir.join("apiserver-kubelet-client.key"),
            )),
            metric_resolution: minik8s_apiserver::apis::metrics::DEFAULT_RESOLUTION,
            front_proxy: Some(pki.front_proxy().expect("front proxy")),
            compaction_interval: minik8s_apiserver::store::compactor::DEFAULT_INTERVAL,
        };
        let admin = pki
            .ensure_identity(&Identity::admin())
            .expect("admin identity");
        let kubeconfig = dir.path().join("admin.kubeconfig");
        let mut c = Cluster {
            rt,
            shutdown,
            server: None,
            config,
            admin,
            _etcd: None,
            dir,
            registry: std::sync::OnceLock::new(),
            kubeconfig,
            url: String::new(),
        };
        c.serve();
        c
    }

    fn serve(&mut self) {
        let server = self
            .rt
            .block_on(minik8s_apiserver::start(
                self.config.clone(),
                self.shutdown.clone(),
            ))
            .expect("apiserver starts");
        self.url = format!("https://127.0.0.1:{}", server.addr.port());
        let text = std::fs::read_to_string(&self.admin).expect("kubeconfig");
        std::fs::write(
            &self.kubeconfig,
            text.replace("https://127.0.0.1:0", &self.url),
        )
        .expect("write kubeconfig");
        self.server = Some(server);
    }

    /// Stops the apiserver (closing its store) and starts it again on the same store; the
    /// new server listens on another port, and the kubeconfig is rewritten.
    pub fn restart(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.wait());
        }
        self.shutdown = CancellationToken::new();
        self.serve();
    }

    /// Stops the apiserver for good (what runs on the cluster's nodes keeps running).
    pub fn stop_apiserver(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.wait());
        }
    }

    /// The store the apiserver runs on (for tests that compact or inspect it).
    pub fn store(&self) -> minik8s_storage::Storage {
        self.server.as_ref().expect("running").api.store.clone()
    }

    /// Runs a future on the cluster's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// A kube-rs client with the admin identity.
    pub fn client(&self) -> kube::Client {
        self.rt
            .block_on(minik8s_kubeconfig::client(&self.kubeconfig))
            .expect("kube client")
    }

    /// The audit log's events so far.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Serves an admission webhook at `https://127.0.0.1:PORT/` with the apiserver's own
    /// serving certificate (so [`Cluster::ca_bundle`] verifies it) until the cluster stops.
    /// `answer` maps the AdmissionReview's `request` to its `response` (the uid is added).
    pub fn webhook(&self, answer: fn(&serde_json::Value) -> serde_json::Value) -> String {
        use axum::routing::post;
        let tls = minik8s_apiserver::serving::server::tls_config(
            &self.config.tls_cert,
            &self.config.tls_key,
            &self.config.client_ca,
        )
        .expect("webhook TLS");
        let listener = self
            .rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let app = axum::Router::new().route(
            "/",
            post(
                move |axum::Json(review): axum::Json<serde_json::Value>| async move {
                    let request = &review["request"];
                    let mut response = answer(request);
                    response["uid"] = request["uid"].clone();
                    axum::Json(serde_json::json!({
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": response,
                    }))
                },
            ),
        );
        self.rt.spawn(minik8s_apiserver::serving::server::serve(
            listener,
            tls,
            app,
            self.shutdown.clone(),
            tokio_util::task::TaskTracker::new(),
        ));
        format!("https://127.0.0.1:{port}/")
    }

    /// Starts every controller (as the admin) and `nodes` simulated nodes (`sim-0`, …,
    /// 4 cpu and 8Gi each), on the cluster's runtime until it stops.
    pub fn run_controllers(&self, nodes: usize) {
        self.run_controllers_except(&[], nodes);
    }

    /// As [`Cluster::run_controllers`], without the controllers named in `skip`.
    pub fn run_controllers_except(&self, skip: &[&str], nodes: usize) {
        let names: Vec<&str> = minik8s_controllers::manager::ALL
            .iter()
            .copied()
            .filter(|n| !skip.contains(n))
            .collect();
        self.run_named_controllers(&names, self.shutdown.clone());
        self.run_sim_nodes(nodes);
    }

    /// Runs the named controllers (as the admin) until `stop` (or the cluster) stops.
    pub fn run_named_controllers(&self, names: &[&str], stop: CancellationToken) {
        let c = self.client();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        // The cluster CA, for the root CA publisher (as `minik8s up` passes it).
        let settings = minik8s_controllers::manager::Settings {
            root_ca: std::fs::read_to_string(&self.config.client_ca).ok(),
            ..Default::default()
        };
        self.rt.spawn(async move {
            if let Err(e) = minik8s_controllers::manager::run_with(c, &names, settings, stop).await
            {
                eprintln!("controllers: {e:#}");
            }
        });
    }

    /// Runs a task on the cluster's runtime until it ends (or the runtime stops).
    pub fn spawn<F>(&self, task: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(task);
    }

    /// The token cancelled when the cluster stops.
    pub fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.shutdown.clone()
    }

    /// Registers `nodes` simulated nodes (test-only kubelets that run nothing).
    pub fn run_sim_nodes(&self, nodes: usize) {
        let client = self.client();
        let cfg = minik8s_controllers::simnodes::SimConfig {
            count: nodes,
            ..Default::default()
        };
        let shutdown = self.shutdown.clone();
        self.rt.spawn(async move {
            if let Err(e) = minik8s_controllers::simnodes::run(client, cfg, shutdown).await {
                eprintln!("simulated nodes: {e:#}");
            }
        });
    }

    /// Runs kubectl until its output satisfies `done` (or 60 s pass); returns the last output.
    pub fn eventually(&self, args: &[&str], done: impl Fn(&str) -> bool) -> String {
        self.eventually_within(std::time::Duration::from_secs(60), args, done)
    }

    /// Runs kubectl until its output satisfies `done` (or `limit` passes); returns it.
    pub fn eventually_within(
        &self,
        limit: std::time::Duration,
        args: &[&str],
        done: impl Fn(&str) -> bool,
    ) -> String {
        retry_kubectl(limit, args, |a| self.kubectl(a), done)
    }

    /// The cluster CA, base64-encoded as a webhook's `caBundle`.
    pub fn ca_bundle(&self) -> String {
        use base64::Engine;
        let pem = std::fs::read(&self.config.client_ca).expect("CA");
        base64::engine::general_purpose::STANDARD.encode(pem)
    }

    /// The cluster CA's certificate file.
    pub fn ca_path(&self) -> &Path {
        &self.config.client_ca
    }

    /// The cluster's private folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kubeconfig for another user (client certificate: CN = `user`, O = `groups`).
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> PathBuf {
        // KUBECONFIG is a `:`-separated list: keep `:` out of file names.
        let file = user.replace(':', "-");
        let pki = Pki::init(PkiOptions {
            dir: self.dir.path().join("pki"),
            cluster_name: "minik8s".into(),
            server: "https://127.0.0.1:0".into(),
            hostnames: vec![],
            ips: vec![],
        })
        .expect("PKI");
        let path = pki
            .ensure_identity(&Identity::new(&file, user, groups))
            .expect("identity");
        let text = std::fs::read_to_string(path).expect("kubeconfig");
        let out = self.dir.path().join(format!("{file}.kubeconfig"));
        std::fs::write(&out, text.replace("https://127.0.0.1:0", &self.url))
            .expect("write kubeconfig");
        out
    }

    /// Runs kubectl as the user of another kubeconfig.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Run {
        run_kubectl(kubeconfig, self.dir.path(), args, None)
    }

    /// Runs another client program (an upstream kubectl, helm) with the admin kubeconfig, a
    /// private home and the variables `env`, feeding `stdin`.
    pub fn client_program(
        &self,
        program: &Path,
        args: &[&str],
        stdin: Option<&str>,
        env: &[(&str, &str)],
    ) -> Run {
        run_client(program, &self.kubeconfig, self.dir.path(), args, stdin, env)
    }

    /// Runs kubectl with the admin kubeconfig and a private cache.
    pub fn kubectl(&self, args: &[&str]) -> Run {
        self.kubectl_stdin(args, None)
    }

    /// Runs kubectl with `stdin` as its standard input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Run {
        run_kubectl(&self.kubeconfig, self.dir.path(), args, stdin)
    }

    /// Runs kubectl and panics with its output unless it succeeds; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.kubectl(args);
        assert!(r.ok, "kubectl {args:?} failed:\n{}\n{}", r.stdout, r.stderr);
        r.stdout
    }

    /// Runs kubectl expecting failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let r = self.kubectl(args);
        assert!(
            !r.ok,
            "kubectl {args:?} should fail but printed:\n{}",
            r.stdout
        );
        r.stderr
    }

    /// Applies a manifest from a string with `kubectl <verb> -f -`.
    pub fn with_manifest(&self, verb: &[&str], manifest: &str) -> Run {
        let mut args: Vec<&str> = verb.to_vec();
        args.extend(["-f", "-"]);
        self.kubectl_stdin(&args, Some(manifest))
    }
}

/// A program of upstream's built from Go modules by `hack/upstream.sh` (`kubectl` of v1.34,
/// `helm`, `k9s`): in `MINIK8S_UPSTREAM_BIN`, or the repository's `target/upstream/bin`.
pub fn upstream_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("MINIK8S_UPSTREAM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| node::repo_root().join("target/upstream/bin"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `bash hack/upstream.sh {name}` (hack/test.sh does)",
        path.display()
    );
    path
}

/// The sum of whitespace-separated integers (one that is not counts as -1000: never a match).
fn sum_of(text: &str) -> i64 {
    text.split_whitespace()
        .map(|n| n.parse::<i64>().unwrap_or(-1000))
        .sum()
}

/// `PATH` with the workspace's binaries first, so kubectl finds the `kubectl-fn` plugin.
fn plugin_path() -> String {
    let bins = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(Path::to_path_buf))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!("{bins}:{}", std::env::var("PATH").unwrap_or_default())
}

impl Cluster {
    /// POSTs `body` to a function's `url` through the gateway: the answer's code and text (code
    /// 0 and the error when there was no answer).
    pub fn post(&self, url: &str, body: &str) -> (u16, String) {
        match self.block_on(minik8s_serverless::gateway::post(
            url,
            body.to_owned().into_bytes().into(),
        )) {
            Ok((code, text)) => (code.as_u16(), String::from_utf8_lossy(&text).into_owned()),
            Err(e) => (0, e),
        }
    }

    /// The sum of `field` (`.spec.replicas`, `.status.readyReplicas`) over the Deployments of a
    /// function's revisions, as kubectl prints them.
    pub fn function_sum(&self, function: &str, field: &str) -> i64 {
        sum_of(&self.function_field(function, field))
    }

    /// Waits until the function has revisions and `field` sums to `want` over their
    /// Deployments.
    pub fn wait_function_sum(&self, function: &str, field: &str, want: i64) {
        let label = format!("serverless.minik8s.io/function={function}");
        let jsonpath = format!("jsonpath={{.items[*]{field}}}");
        self.eventually(
            &["get", "deployments", "-l", &label, "-o", &jsonpath],
            |r| !r.trim().is_empty() && sum_of(r) == want,
        );
    }

    fn function_field(&self, function: &str, field: &str) -> String {
        let label = format!("serverless.minik8s.io/function={function}");
        let jsonpath = format!("jsonpath={{.items[*]{field}}}");
        self.ok(&["get", "deployments", "-l", &label, "-o", &jsonpath])
    }

    /// Installs the serverless CRDs and runs the function gateway (on a free port of every
    /// address) and the Function controller as the admin until the returned token (or the
    /// cluster) stops; Functions' URLs name the node's address.
    pub fn run_functions(&self) -> CancellationToken {
        let client = self.client();
        self.rt
            .block_on(minik8s_serverless::install(client.clone()))
            .expect("the serverless CRDs install");
        // As `minik8s up` runs them: as their own user, with the roles `install` binds.
        let kubeconfig = self.user_kubeconfig(minik8s_serverless::USER, &[]);
        let client = self
            .rt
            .block_on(minik8s_kubeconfig::client(&kubeconfig))
            .expect("the functions' client");
        let stop = self.shutdown.child_token();
        let token = stop.clone();
        self.rt.spawn(async move {
            let cfg = minik8s_serverless::Config {
                listen: "0.0.0.0:0".parse().expect("addr"),
                public_host: minik8s_kubelet::node::default_ip().await,
                bases: 2,
            };
            if let Err(e) = minik8s_serverless::serve(client, cfg, token).await {
                eprintln!("functions: {e}");
            }
        });
        stop
    }

    /// Runs one replica of the function-module controller (as `minik8s up` does: its own
    /// user, the kubelet endpoint on the node's address) until the returned token (or the
    /// cluster) stops. Call [`Cluster::run_functions`] first (it installs the roles).
    pub fn run_function_modules(&self, identity: &str) -> CancellationToken {
        let kubeconfig = self.user_kubeconfig(minik8s_serverless::modules::USER, &[]);
        let client = self
            .rt
            .block_on(minik8s_kubeconfig::client(&kubeconfig))
            .expect("the function modules' client");
        let stop = self.shutdown.child_token();
        let token = stop.clone();
        let mut cfg = minik8s_serverless::modules::Config::new(identity);
        cfg.client_ca = Some(self.ca_path().to_owned());
        self.rt.spawn(async move {
            cfg.address = minik8s_kubelet::node::default_ip().await;
            if let Err(e) = minik8s_serverless::modules::run(client, cfg, token).await {
                eprintln!("function modules: {e}");
            }
        });
        stop
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(registry) = self.registry.take() {
            self.rt.block_on(registry.stop());
        }
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.wait());
        }
    }
}

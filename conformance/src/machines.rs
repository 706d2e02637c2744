//! Several machines on one, for multi-node scenarios: the control plane is `minik8s init` on
//! this machine, and each other node is its own network namespace (its own interfaces,
//! routes and iptables, as another machine) on a shared L2 node network — the bridge
//! `mk8snet`, 10.250.0.0/24, this machine at 10.250.0.1 — running `minik8s join` exactly as
//! an operator would on a second machine. Only the network namespace differs (`nsenter
//! --net`, node recipe multi-node B): mounts and cgroups stay the machine's.

use crate::Run;
use crate::node::{bin, images, terminate};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The node network's bridge on this machine.
pub const BRIDGE: &str = "mk8snet";
/// This machine's address on the node network (where the apiserver is advertised).
pub const HOST_IP: &str = "10.250.0.1";
/// Where `hack/install-deps.sh --node` unpacks Debian's Docker Engine (not installed: its
/// package would start a system daemon and take over the machine's Docker).
pub const DOCKER_DIR: &str = "/opt/minik8s/docker";

fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ensure_bridge() {
    if !Path::new("/sys/class/net").join(BRIDGE).exists() {
        assert!(
            run("ip", &["link", "add", BRIDGE, "type", "bridge"]),
            "creating the node network bridge"
        );
    }
    run(
        "ip",
        &["addr", "add", &format!("{HOST_IP}/24"), "dev", BRIDGE],
    );
    assert!(run("ip", &["link", "set", BRIDGE, "up"]));
}

static FUNCTION_IMAGES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Every machine this process starts from now on also imports the function runtime image
/// (its Functions' pods may land anywhere).
pub fn import_function_images() {
    FUNCTION_IMAGES.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// The image archives every node imports (pause and busybox; and the function runtime
/// after [`import_function_images`]).
fn node_images() -> String {
    let all = FUNCTION_IMAGES.load(std::sync::atomic::Ordering::SeqCst);
    images()
        .iter()
        .take(if all { 3 } else { 2 })
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The `minik8s join` arguments `init` printed: the node's, and the control plane's when
/// it uploaded the shared keys.
struct Printed {
    node: Vec<String>,
    control_plane: Option<Vec<String>>,
}

/// Starts `minik8s init` in `dir/cp` and waits for its join command(s).
fn spawn_init(dir: &Path, port: u16, extra: &[String]) -> (Child, Printed) {
    let data = dir.join("cp");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("init.log"))
        .expect("log file");
    let mut child = Command::new(bin("minik8s"))
        .args(["init", "--data-dir"])
        .arg(&data)
        .args(["--bind", "0.0.0.0", "--port", &port.to_string()])
        .args(["--advertise-address", HOST_IP, "--node-name", "cp"])
        .args(["--no-registry", "--no-functions", "--no-router"])
        .args(["--image", &node_images()])
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("minik8s init starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(rest) = line.strip_prefix("minik8s join ") {
                let _ = tx.send(rest.split_whitespace().map(str::to_owned).collect());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(node) => {
            let control_plane = extra
                .iter()
                .any(|a| a == "--upload-certs")
                .then(|| rx.recv_timeout(Duration::from_secs(5)).ok())
                .flatten();
            (
                child,
                Printed {
                    node,
                    control_plane,
                },
            )
        }
        Err(_) => {
            let _ = child.kill();
            panic!(
                "minik8s init printed no join command; its log:\n{}",
                std::fs::read_to_string(dir.join("init.log")).unwrap_or_default()
            );
        }
    }
}

/// A control plane made with `minik8s init` (with its own node `cp` on this machine), torn
/// down with everything on drop.
pub struct InitCluster {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    extra: Vec<String>,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The `minik8s join` arguments `init` printed (server, token, CA pin).
    pub join: Vec<String>,
    /// The control-plane join `init --upload-certs` printed (with `--control-plane
    /// --certificate-key K`).
    pub control_plane_join: Option<Vec<String>>,
    /// The private etcd cluster's members when the cluster runs on one.
    etcd: Option<EtcdMembers>,
}

/// The members of a private 3-member etcd (`hack/etcd-cluster.sh`) for a cluster in
/// `data_dir`, listening on the node network at `base_port`+1..3: `up` (printing
/// `etcd://…`) or `down`.
fn etcd_cluster(data_dir: &Path, etcd: &EtcdMembers, args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(crate::node::repo_root().join("hack/etcd-cluster.sh"))
        .args(args)
        .arg(data_dir)
        .env("BASE_PORT", etcd.base_port.to_string())
        .env("ETCD_HOST", HOST_IP)
        .env("MEMBER_HOSTS", etcd.hosts.join(" "))
        .env("MEMBER_NETNS", etcd.netns.join(" "))
        .env("MINIK8S", bin("minik8s"))
        .output()
        .expect("hack/etcd-cluster.sh runs")
}

/// Where a cluster's etcd members run: member N at `hosts[N-1]`, in network namespace
/// `netns[N-1]` (`-`: this machine's), clients on `base_port`+N.
#[derive(Clone, Debug)]
struct EtcdMembers {
    base_port: u16,
    hosts: Vec<String>,
    netns: Vec<String>,
}

impl InitCluster {
    /// Runs `minik8s init` listening on `port` of every address, advertised on the node
    /// network, and waits for its join command.
    pub fn start(port: u16) -> Self {
        Self::start_with(port, &[])
    }

    /// As [`Self::start`], with more `init` arguments.
    pub fn start_with(port: u16, extra: &[&str]) -> Self {
        ensure_bridge();
        let dir = tempfile::tempdir().expect("temp dir");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (child, printed) = spawn_init(dir.path(), port, &extra);
        InitCluster {
            child: Some(child),
            kubeconfig: dir.path().join("cp/admin.kubeconfig"),
            dir,
            port,
            extra,
            join: printed.node,
            control_plane_join: printed.control_plane,
            etcd: None,
        }
    }

    /// As [`Self::start_with`], on a private 3-member etcd (`hack/etcd-cluster.sh`, members
    /// on this machine's node-network address from `etcd_base_port`+1, TLS from the
    /// cluster's CA), with `--upload-certs`: control-plane machines can join. The members
    /// stop with the cluster.
    pub fn start_on_etcd(port: u16, etcd_base_port: u16, extra: &[&str]) -> Self {
        ensure_bridge();
        let dir = tempfile::tempdir().expect("temp dir");
        let etcd = EtcdMembers {
            base_port: etcd_base_port,
            hosts: vec![HOST_IP.into(); 3],
            netns: vec!["-".into(); 3],
        };
        Self::start_on_members(dir, etcd, port, extra)
    }

    /// As [`Self::start_on_etcd`] with one member per machine: the first on this machine, and
    /// one in each of two machines `names` (indexes as [`Self::join_machine`]), made here and
    /// returned unjoined for [`Self::join_control_plane_on`]. Cutting a machine off its
    /// network cuts its member off too.
    pub fn start_with_members_on(
        port: u16,
        etcd_base_port: u16,
        names: [(&str, u8); 2],
    ) -> (Self, Vec<Machine>) {
        ensure_bridge();
        let dir = tempfile::tempdir().expect("temp dir");
        let machines: Vec<Machine> = names
            .iter()
            .map(|(name, index)| Machine::new(name, *index, dir.path()))
            .collect();
        let mut etcd = EtcdMembers {
            base_port: etcd_base_port,
            hosts: vec![HOST_IP.into()],
            netns: vec!["-".into()],
        };
        for m in &machines {
            etcd.hosts.push(m.ip.clone());
            etcd.netns.push(m.netns.clone());
        }
        (Self::start_on_members(dir, etcd, port, &[]), machines)
    }

    fn start_on_members(
        dir: tempfile::TempDir,
        etcd: EtcdMembers,
        port: u16,
        extra: &[&str],
    ) -> Self {
        let up = etcd_cluster(&dir.path().join("cp"), &etcd, &["up"]);
        let endpoints = String::from_utf8_lossy(&up.stdout).trim().to_owned();
        assert!(
            up.status.success() && endpoints.starts_with("etcd://"),
            "hack/etcd-cluster.sh up: {endpoints}\n{}",
            String::from_utf8_lossy(&up.stderr)
        );
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        extra.extend(["--storage".into(), endpoints, "--upload-certs".into()]);
        let (child, printed) = spawn_init(dir.path(), port, &extra);
        assert!(
            printed.control_plane.is_some(),
            "init --upload-certs printed no control-plane join"
        );
        InitCluster {
            child: Some(child),
            kubeconfig: dir.path().join("cp/admin.kubeconfig"),
            dir,
            port,
            extra,
            join: printed.node,
            control_plane_join: printed.control_plane,
            etcd: Some(etcd),
        }
    }

    /// SIGKILLs the `init` process (apiserver, controllers, and the control-plane node's
    /// kubelet and proxy; its containers keep running).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts `init` again on the same folder (after [`Self::kill9`]); returns once it has
    /// printed its join command (the apiserver serves again).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "init still runs");
        let (child, printed) = spawn_init(self.dir.path(), self.port, &self.extra);
        self.child = Some(child);
        self.join = printed.node;
        self.control_plane_join = printed.control_plane;
    }

    /// The cluster's private folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The control plane's data folder (PKI, store, manifests).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("cp")
    }

    /// The `init` process's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("init.log")).unwrap_or_default()
    }

    /// The join command's token.
    pub fn token(&self) -> &str {
        self.arg("--token")
    }

    /// The join command's CA pin.
    pub fn ca_hash(&self) -> &str {
        self.arg("--discovery-token-ca-cert-hash")
    }

    /// The join command's server.
    pub fn server(&self) -> &str {
        &self.join[0]
    }

    fn arg(&self, flag: &str) -> &str {
        let i = self.join.iter().position(|a| a == flag).expect(flag);
        &self.join[i + 1]
    }

    /// Runs `minik8s` (for `token` commands) against this cluster.
    pub fn minik8s(&self, args: &[&str]) -> Run {
        let out = Command::new(bin("minik8s"))
            .args(args)
            .arg("--data-dir")
            .arg(self.dir.path().join("cp"))
            .env("RUST_LOG", "warn")
            .output()
            .expect("minik8s runs");
        Run::from(out)
    }

    /// Runs kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Run {
        crate::run_kubectl(&self.kubeconfig, self.dir.path(), args, None)
    }

    /// Runs kubectl with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Run {
        crate::run_kubectl(&self.kubeconfig, self.dir.path(), args, Some(stdin))
    }

    /// Runs kubectl and panics unless it succeeds; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let r = self.kubectl(args);
        assert!(r.ok, "kubectl {args:?} failed:\n{}\n{}", r.stdout, r.stderr);
        r.stdout
    }

    /// Runs kubectl until its output satisfies `done` (or `limit` passes).
    pub fn eventually(
        &self,
        limit: Duration,
        args: &[&str],
        done: impl Fn(&str) -> bool,
    ) -> String {
        crate::retry_kubectl(limit, args, |a| self.kubectl(a), done)
    }

    /// A new machine `name` at 10.250.0.`index` (2..=254) that joins with the command `init`
    /// printed, plus `extra` arguments; waits until its Node is Ready.
    pub fn join_machine(&self, name: &str, index: u8) -> Machine {
        let mut m = Machine::new(name, index, self.dir.path());
        let mut args = self.join.clone();
        args.extend(m.node_args());
        m.child = Some(m.spawn_minik8s("join", &args));
        m.args = args;
        self.node_condition(name, "Ready", "True", Duration::from_secs(90));
        m
    }

    /// A new control-plane machine `name` at 10.250.0.`index` that joins with the
    /// control-plane command `init --upload-certs` printed: its apiserver (on the cluster's
    /// etcd, at the same port), controllers and node. Waits until its Node is Ready.
    pub fn join_control_plane(&self, name: &str, index: u8) -> Machine {
        let mut m = Machine::new(name, index, self.dir.path());
        self.join_control_plane_on(&mut m);
        m
    }

    /// As [`Self::join_control_plane`], on a machine made before (by
    /// [`Self::start_with_members_on`]).
    pub fn join_control_plane_on(&self, m: &mut Machine) {
        let mut args = self
            .control_plane_join
            .clone()
            .expect("a cluster started with --upload-certs");
        args.extend(m.node_args());
        m.child = Some(m.spawn_minik8s("join", &args));
        m.args = args;
        self.node_condition(&m.name, "Ready", "True", Duration::from_secs(120));
    }

    /// Runs a control-plane join that should fail on machine `name` with certificate key
    /// `key`; its output once it exits.
    pub fn failed_control_plane_join(&self, name: &str, index: u8, key: &str) -> Run {
        let m = Machine::new(name, index, self.dir.path());
        let mut args = self
            .control_plane_join
            .clone()
            .expect("a cluster started with --upload-certs");
        let at = args
            .iter()
            .position(|a| a == "--certificate-key")
            .expect("--certificate-key");
        args[at + 1] = key.to_owned();
        args.extend(["--discovery-timeout".into(), "10".into()]);
        args.extend(m.node_args());
        let out = m
            .command("join", &args)
            .output()
            .expect("minik8s join runs");
        Run::from(out)
    }

    /// Runs `hack/etcd-cluster.sh CMD` (`up`, `kill N`, `status`) on the cluster's etcd.
    pub fn etcd(&self, args: &[&str]) -> Run {
        let etcd = self.etcd.as_ref().expect("a cluster on etcd");
        Run::from(etcd_cluster(&self.data_dir(), etcd, args))
    }

    /// The etcd member (1-3) that leads now, from the members' own status.
    pub fn etcd_leader(&self) -> Option<u8> {
        let etcd = self.etcd.as_ref().expect("a cluster on etcd");
        let pki = self.data_dir().join("pki");
        for n in 1..=3u8 {
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!(
                    "--endpoints=https://{}:{}",
                    etcd.hosts[n as usize - 1],
                    etcd.base_port + n as u16
                ))
                .arg(format!("--cacert={}", pki.join("ca.crt").display()))
                .arg(format!(
                    "--cert={}",
                    pki.join("apiserver-etcd-client.crt").display()
                ))
                .arg(format!(
                    "--key={}",
                    pki.join("apiserver-etcd-client.key").display()
                ))
                .args(["--dial-timeout=1s", "--command-timeout=2s"])
                .args(["endpoint", "status", "-w", "json"])
                .output()
                .ok()?;
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                continue;
            };
            let status = &v[0]["Status"];
            if status["header"]["member_id"] == status["leader"] && !status["leader"].is_null() {
                return Some(n);
            }
        }
        None
    }

    /// The address of this machine's apiserver on the node network.
    pub fn server_at(&self, ip: &str) -> String {
        format!("https://{ip}:{}", self.port)
    }

    /// One more apiserver alone (`minik8s apiserver`) on this machine, listening on
    /// 127.0.0.1:`port`, on the cluster's etcd, with a copy of the control plane's PKI in a
    /// folder of its own and `env` set (a stepped clock, say); logs to `apiserver-PORT.log`.
    /// The caller stops it.
    pub fn extra_apiserver(&self, port: u16, env: &[(&'static str, String)]) -> Child {
        let at = self
            .extra
            .iter()
            .position(|a| a == "--storage")
            .expect("a cluster on etcd");
        let dir = self.dir.path().join(format!("apiserver-{port}"));
        std::fs::create_dir_all(&dir).expect("the apiserver's folder");
        let copied = Command::new("cp")
            .arg("-a")
            .arg(self.data_dir().join("pki"))
            .arg(&dir)
            .status()
            .expect("cp runs");
        assert!(copied.success(), "copying the PKI");
        let log = std::fs::File::create(dir.with_extension("log")).expect("its log");
        Command::new(bin("minik8s"))
            .args([
                "apiserver",
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .args(["--storage", &self.extra[at + 1], "--data-dir"])
            .arg(&dir)
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("minik8s apiserver starts")
    }

    /// Waits (up to `limit`) until Node `node`'s condition `condition` has status `want`.
    pub fn node_condition(&self, node: &str, condition: &str, want: &str, limit: Duration) {
        let path = format!("jsonpath={{.status.conditions[?(@.type==\"{condition}\")].status}}");
        self.eventually(limit, &["get", "node", node, "-o", &path], |s| s == want);
    }

    /// A new edge machine `name` at 10.250.0.`index`: its network namespace running the real
    /// `edgelet` (a copy of the binary in the machine's folder, which `edgectl upgrade` may
    /// replace) with its own containerd and pod subnet 10.88.`index`.0/24, plus `extra`
    /// flags. Not joined: the test runs `edgectl join` there.
    pub fn edge_machine(&self, name: &str, index: u8, extra: &[&str]) -> Machine {
        self.edge_machine_with(Machine::new(name, index, self.dir.path()), index, extra)
    }

    /// An edge machine whose pods run on Docker: a Docker daemon of its own (Debian's, with
    /// private data, state and socket, in the machine's network namespace), and its edgelet
    /// with `--runtime docker`.
    pub fn docker_edge_machine(&self, name: &str, index: u8, extra: &[&str]) -> Machine {
        let mut m = Machine::new(name, index, self.dir.path());
        let socket = m.start_docker();
        let mut args = vec!["--runtime", "docker", "--docker-socket", &socket];
        args.extend(extra);
        self.edge_machine_with(m, index, &args)
    }

    fn edge_machine_with(&self, mut m: Machine, index: u8, extra: &[&str]) -> Machine {
        let name = m.name.clone();
        let name = name.as_str();
        m.edge = true;
        let bin_dir = m.data_dir.join("bin");
        std::fs::create_dir_all(&bin_dir).expect("the machine's bin folder");
        std::fs::copy(bin("edgelet"), bin_dir.join("edgelet")).expect("copying the edgelet");
        let mut args = vec![
            "--data-dir".to_owned(),
            m.data_dir.join("edge").display().to_string(),
        ];
        if !extra.contains(&"--node-name") {
            args.extend(["--node-name".to_owned(), name.to_owned()]);
        }
        args.extend([
            "--node-ip".into(),
            m.ip.clone(),
            "--pod-cidr".into(),
            format!("10.88.{index}.0/24"),
            "--image".into(),
            node_images(),
            // Under the suite's cgroup, so a killed run's pods are swept (hack/test.sh).
            "--cgroup-root".into(),
            format!("/minik8s-test/{name}"),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        m.args = args;
        m.child = Some(m.spawn_edgelet());
        m.wait_edgelet();
        m
    }

    /// `edgectl [flags] join` on edge machine `m` with this cluster's registry, token and CA
    /// pin.
    pub fn edge_join(&self, m: &Machine, flags: &[&str]) -> Run {
        let registry = self.edge_registry();
        let mut args = flags.to_vec();
        args.extend([
            "join",
            &registry,
            "--token",
            self.token(),
            "--discovery-token-ca-cert-hash",
            self.ca_hash(),
        ]);
        m.edgectl(&args)
    }

    /// The edge registry's address (`edgectl join`'s first argument).
    pub fn edge_registry(&self) -> String {
        format!("{HOST_IP}:10360")
    }

    /// Runs a join that should fail on machine `name` (index as [`Self::join_machine`]) with
    /// the given server, token and pin; returns its output once it exits (with 20 s of
    /// discovery retries at most).
    pub fn failed_join(&self, name: &str, index: u8, token: &str, ca_hash: &str) -> Run {
        let m = Machine::new(name, index, self.dir.path());
        let mut args = vec![
            self.server().to_owned(),
            "--token".into(),
            token.into(),
            "--discovery-token-ca-cert-hash".into(),
            ca_hash.into(),
            "--discovery-timeout".into(),
            "3".into(),
            "--csr-timeout".into(),
            "20".into(),
        ];
        args.extend(m.node_args());
        let out = m
            .command("join", &args)
            .output()
            .expect("minik8s join runs");
        Run::from(out)
    }
}

impl Drop for InitCluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child);
        }
        let _ = Command::new(bin("minik8s"))
            .args(["down", "--node-name", "cp", "--data-dir"])
            .arg(self.dir.path().join("cp"))
            .env("RUST_LOG", "warn")
            .status();
        if let Some(etcd) = &self.etcd {
            etcd_cluster(&self.dir.path().join("cp"), etcd, &["down"]);
        }
        run("ip", &["link", "del", BRIDGE]);
    }
}

/// Another machine: a network namespace on the node network running `minik8s join`.
pub struct Machine {
    /// The node's name.
    pub name: String,
    /// Its address on the node network.
    pub ip: String,
    netns: String,
    data_dir: PathBuf,
    child: Option<Child>,
    args: Vec<String>,
    /// An edge machine (runs `edgelet`, not `minik8s join`).
    edge: bool,
    /// The machine's own Docker daemon (edge machines on Docker).
    docker: Option<Child>,
}

impl Machine {
    fn new(name: &str, index: u8, dir: &Path) -> Self {
        let netns = format!("mk8s-{name}");
        let ip = format!("10.250.0.{index}");
        let host_end = format!("mk8sv-{name}");
        // A namespace of an earlier run may outlive its deletion for a moment (its last
        // processes exiting), and with it its veth: deleting the host end removes both ends.
        run("ip", &["netns", "del", &netns]);
        run("ip", &["link", "del", &host_end]);
        assert!(run("ip", &["netns", "add", &netns]), "ip netns add {netns}");
        assert!(
            run(
                "ip",
                &[
                    "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns",
                    &netns
                ]
            ),
            "veth for {netns}"
        );
        assert!(run(
            "ip",
            &["link", "set", &host_end, "master", BRIDGE, "up"]
        ));
        let inside = |args: &[&str]| {
            let mut full = vec!["-n", netns.as_str()];
            full.extend(args);
            assert!(run("ip", &full), "ip {full:?}");
        };
        inside(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        inside(&["link", "set", "eth0", "up"]);
        inside(&["link", "set", "lo", "up"]);
        inside(&["route", "add", "default", "via", HOST_IP]);
        Machine {
            name: name.to_owned(),
            ip,
            data_dir: dir.join(name),
            netns,
            child: None,
            args: Vec::new(),
            edge: false,
            docker: None,
        }
    }

    /// The edgelet binary this edge machine runs.
    pub fn edgelet_bin(&self) -> PathBuf {
        self.data_dir.join("bin/edgelet")
    }

    fn spawn_edgelet(&self) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.join("edgelet.log"))
            .expect("log");
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg(self.edgelet_bin())
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the edgelet starts")
    }

    /// Runs `edgectl` inside the edge machine (its own HOME, so the remembered address is
    /// the machine's); its output.
    pub fn edgectl(&self, args: &[&str]) -> Run {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg(bin("edgectl"))
            .args(args)
            .env("HOME", &self.data_dir)
            .env_remove("XDG_CONFIG_HOME")
            .output()
            .expect("edgectl runs");
        Run::from(out)
    }

    /// Waits until the edgelet answers `edgectl` (its runtime started, its images imported).
    pub fn wait_edgelet(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let r = self.edgectl(&["--edgelet-address", "127.0.0.1:10351", "status"]);
            if r.ok {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the edgelet of {} does not answer: {}\n{}",
                self.name,
                r.stderr,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The edgelet's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Restarts the edge machine's edgelet with `extra` flags added (after [`Self::kill9`]
    /// or [`Self::stop`]).
    pub fn restart_with(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "the edgelet still runs");
        let saved = self.args.clone();
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.child = Some(self.spawn_edgelet());
        self.args = saved;
        self.wait_edgelet();
    }

    fn node_args(&self) -> Vec<String> {
        vec![
            "--node-name".into(),
            self.name.clone(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--node-ip".into(),
            self.ip.clone(),
            "--no-router".into(),
            "--image".into(),
            node_images(),
        ]
    }

    fn command(&self, sub: &str, args: &[String]) -> Command {
        let mut cmd = Command::new("nsenter");
        // Its own host name too (as another machine has; leader identities carry it).
        cmd.arg(format!("--net=/run/netns/{}", self.netns))
            .args([
                "unshare",
                "--uts",
                "--",
                "sh",
                "-c",
                "hostname \"$0\" && exec \"$@\"",
            ])
            .arg(&self.name)
            .arg(bin("minik8s"))
            .arg(sub)
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("RUST_BACKTRACE");
        cmd
    }

    fn spawn_minik8s(&self, sub: &str, args: &[String]) -> Child {
        std::fs::create_dir_all(&self.data_dir).expect("machine folder");
        let log = std::fs::File::create(self.data_dir.join("join.log")).expect("log");
        self.command(sub, args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("minik8s join starts")
    }

    /// Stops the node's processes (SIGTERM); whether they exited cleanly.
    pub fn stop(&mut self) -> bool {
        self.child.take().is_none_or(|mut c| terminate(&mut c))
    }

    /// The process id of the machine's Docker daemon, while it runs.
    pub fn docker_pid(&self) -> Option<u32> {
        self.docker.as_ref().map(Child::id)
    }

    /// The machine's Docker API socket (with [`InitCluster::docker_edge_machine`]).
    pub fn docker_socket(&self) -> PathBuf {
        self.data_dir.join("docker/docker.sock")
    }

    /// Runs the `docker` client against the machine's Docker daemon; its output.
    pub fn docker_cli(&self, args: &[&str]) -> Run {
        let out = Command::new("docker")
            .args(args)
            .env(
                "DOCKER_HOST",
                format!("unix://{}", self.docker_socket().display()),
            )
            .output()
            .expect("the docker client runs");
        Run::from(out)
    }

    /// Starts Debian's `dockerd` (unpacked by `hack/install-deps.sh --node`) in the machine's
    /// network namespace, with its data, state, socket and cgroups its own, without touching
    /// the host's iptables or any Docker the machine has; waits until it answers.
    fn start_docker(&mut self) -> String {
        let dir = self.data_dir.join("docker");
        std::fs::create_dir_all(&dir).expect("the docker folder");
        let dockerd = PathBuf::from(DOCKER_DIR).join("usr/sbin/dockerd");
        assert!(
            dockerd.exists(),
            "{} is missing: run hack/install-deps.sh --node",
            dockerd.display()
        );
        let socket = self.docker_socket();
        let log = std::fs::File::create(dir.join("dockerd.log")).expect("the dockerd log");
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg(&dockerd)
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("run"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("-H")
            .arg(format!("unix://{}", socket.display()))
            .args([
                "--bridge=none",
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
                "--userland-proxy=false",
                "--exec-opt",
                "native.cgroupdriver=cgroupfs",
                "--cgroup-parent",
                &format!("/minik8s-test/{}-docker", self.name),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dockerd starts");
        self.docker = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.docker_cli(&["version"]).ok {
            assert!(
                std::time::Instant::now() < deadline,
                "dockerd of {} does not answer: {}",
                self.name,
                std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        socket.display().to_string()
    }

    /// SIGKILLs the node's `minik8s join` process (its kubelet and proxy); the runtime and
    /// its containers keep running.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts `minik8s join` again with the same arguments (it finds its identity and adopts
    /// what the runtime runs).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the node still runs");
        if self.edge {
            self.child = Some(self.spawn_edgelet());
            self.wait_edgelet();
        } else {
            self.child = Some(self.spawn_minik8s("join", &self.args));
        }
    }

    /// Runs `program` inside the machine's network namespace; its output.
    pub fn exec(&self, program: &str, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.netns, program])
            .args(args)
            .output()
            .expect("ip netns exec")
    }

    /// Cuts (`false`) or restores (`true`) the machine's network link.
    pub fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        assert!(run(
            "ip",
            &["-n", &self.netns, "link", "set", "eth0", state]
        ));
        if up {
            run(
                "ip",
                &[
                    "-n",
                    &self.netns,
                    "route",
                    "replace",
                    "default",
                    "via",
                    HOST_IP,
                ],
            );
        }
    }

    /// The node's own kubeconfig (written by the TLS bootstrap, replaced on renewal).
    pub fn kubeconfig(&self) -> PathBuf {
        self.data_dir.join("kubelet.kubeconfig")
    }

    /// The node's containerd runtime folder (its socket and pid file).
    pub fn runtime_dir(&self) -> PathBuf {
        self.data_dir.join("node/containerd")
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the node's containerd.
    pub fn signal_runtime(&self, signal: &str) {
        let pid = std::fs::read_to_string(self.runtime_dir().join("containerd.pid"))
            .expect("containerd's pid file");
        assert!(run("kill", &[&format!("-{signal}"), pid.trim()]));
    }

    /// The join process's (or the edgelet's) log.
    pub fn log(&self) -> String {
        let file = if self.edge { "edgelet.log" } else { "join.log" };
        std::fs::read_to_string(self.data_dir.join(file)).unwrap_or_default()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.stop();
        if self.edge {
            // The edgelet's own arguments (its runtime among them), then `down`.
            let _ = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", self.netns))
                .arg(bin("edgelet"))
                .args(&self.args)
                .arg("down")
                .env("RUST_LOG", "warn")
                .status();
            if let Some(mut dockerd) = self.docker.take() {
                terminate(&mut dockerd);
            }
            run("ip", &["netns", "del", &self.netns]);
            return;
        }
        let _ = self
            .command(
                "down",
                &[
                    "--node-name".into(),
                    self.name.clone(),
                    "--data-dir".into(),
                    self.data_dir.display().to_string(),
                ],
            )
            .env("RUST_LOG", "warn")
            .status();
        run("ip", &["netns", "del", &self.netns]);
    }
}

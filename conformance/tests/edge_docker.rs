//! An edge machine whose pods run on Docker: a network namespace on the node network with a
//! Docker daemon of its own (Debian's `dockerd`, private data and socket) and the real
//! `edgelet --runtime docker`, joined with `edgectl join`. A Deployment with an init container
//! and two app containers that talk over 127.0.0.1 runs as the design's compose-style
//! containers (`<pod>.<container>`, a pause container holding the pod's network), another pod
//! calls it by its `app` label as a network alias, a crashing container backs off, `kubectl
//! logs` reads Docker's logs, `exec`, `attach` and `port-forward` reach the pod through the
//! Docker runtime's stream server, and a SIGKILLed edgelet restarts and adopts the running
//! containers without restarting them. A Docker daemon that is gone leaves the pod waiting
//! with Docker's message in its events and the edgelet up.
//!
//! The cluster runs a second edge-registry replica (`minik8s edge-registry`, the registry's
//! own identity) beside the one in `init`; with a second edge (on containerd) the replicas
//! hold one edge each by their Lease races, and when the second replica is SIGKILLed the
//! first takes its edge over: the Node stays, its pod keeps running unrestarted, and `kubectl
//! logs` reaches it through the new holder.

use minik8s_conformance::machines::{HOST_IP, InitCluster, Machine};
use minik8s_conformance::node::{bin, free_port, http_get};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WEB: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: page}
data: {text: served-from-docker}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {kubernetes.io/hostname: edge-d}
      tolerations: [{key: virtual-kubelet.io/provider, value: edge, effect: NoSchedule}]
      volumes:
      - {name: www, emptyDir: {}}
      - {name: page, configMap: {name: page}}
      initContainers:
      - name: init
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "echo init ran; echo \"$(cat /page/text) by init\" > /www/index.html"]
        volumeMounts: [{name: www, mountPath: /www}, {name: page, mountPath: /page}]
      containers:
      - name: server
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["httpd", "-f", "-p", "8080", "-h", "/www"]
        volumeMounts: [{name: www, mountPath: /www}]
      - name: client
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "while true; do echo \"local: $(wget -qO- http://127.0.0.1:8080/index.html)\"; sleep 1; done"]
"#;

const CALLER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: caller, labels: {app: caller}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: edge-d}
  tolerations: [{key: virtual-kubelet.io/provider, value: edge, effect: NoSchedule}]
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "while true; do echo \"by alias: $(wget -qO- http://web:8080/index.html)\"; sleep 1; done"]
"#;

const CRASH: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: edge-d}
  tolerations: [{key: virtual-kubelet.io/provider, value: edge, effect: NoSchedule}]
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo crashing now; exit 3"]
"#;

/// The Docker containers of the machine: `name state started-at id`, one per line.
fn containers(m: &Machine) -> Vec<(String, String, String, String)> {
    let r = m.docker_cli(&["ps", "-a", "--format", "{{.Names}}"]);
    assert!(r.ok, "docker ps: {}", r.stderr);
    let names: Vec<&str> = r.stdout.lines().filter(|l| !l.is_empty()).collect();
    if names.is_empty() {
        return Vec::new();
    }
    let mut args = vec![
        "inspect",
        "--format",
        "{{.Name}} {{.State.Status}} {{.State.StartedAt}} {{.Id}}",
    ];
    args.extend(names);
    let r = m.docker_cli(&args);
    r.stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((
                w.next()?.trim_start_matches('/').to_owned(),
                w.next()?.to_owned(),
                w.next()?.to_owned(),
                w.next()?.to_owned(),
            ))
        })
        .collect()
}

/// `kubectl` with the cluster's kubeconfig, as a command to adjust.
fn kubectl(c: &InitCluster, args: &[&str]) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.args(args)
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir());
    cmd
}

/// `exec` (output, stdin, exit code), `attach` and `port-forward` to the pod on Docker,
/// through the Docker runtime's own stream server.
fn docker_streams(c: &InitCluster, m: &Machine, pod: &str) {
    use std::io::{BufRead, BufReader};
    let served = c.ok(&["exec", pod, "-c", "server", "--", "cat", "/www/index.html"]);
    assert_eq!(served.trim(), "served-from-docker by init");
    let echoed = c.kubectl_stdin(
        &["exec", "-i", pod, "-c", "client", "--", "cat"],
        "typed in\n",
    );
    assert!(
        echoed.ok && echoed.stdout == "typed in\n",
        "{:?} {}",
        echoed.stdout,
        echoed.stderr
    );
    let code = kubectl(
        c,
        &["exec", pod, "-c", "client", "--", "sh", "-c", "exit 3"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .status()
    .expect("kubectl runs");
    assert_eq!(code.code(), Some(3), "kubectl exec's exit code");
    // attach: the client's next lines.
    let attached = Command::new("timeout")
        .arg("6")
        .arg("kubectl")
        .args(["attach", pod, "-c", "client"])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .output()
        .expect("kubectl attach runs");
    let text = String::from_utf8_lossy(&attached.stdout);
    assert!(
        text.contains("local: served-from-docker by init"),
        "attach printed {text:?}; {}",
        String::from_utf8_lossy(&attached.stderr)
    );
    // port-forward to the server's port.
    let log = c.dir().join("port-forward.log");
    let mut forward = kubectl(c, &["port-forward", &format!("pod/{pod}"), ":8080"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("the port-forward log"))
        .spawn()
        .expect("kubectl port-forward runs");
    let mut out = BufReader::new(forward.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // kubectl prints a line per connection: keep reading, or it fails writing.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let port: u16 = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("port-forward printed {line:?}"));
    let got = http_get(&format!("127.0.0.1:{port}"));
    let again = http_get(&format!("127.0.0.1:{port}"));
    let _ = forward.kill();
    let _ = forward.wait();
    assert_eq!(
        got.as_deref(),
        Some("served-from-docker by init"),
        "port-forward: {}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        m.log()
    );
    assert_eq!(again, got, "a second connection");
}

/// A registry replica process, killed when dropped (a failed test leaves none behind).
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a second edge-registry replica with the registry's identity and certificates
/// (serving edges on port 10361, its kubelet endpoint on a free port).
fn second_replica(c: &InitCluster) -> Replica {
    let pki = c.dir().join("cp/pki");
    let file = |f: &str| pki.join(f).display().to_string();
    let log = std::fs::File::create(c.dir().join("replica-2.log")).expect("the replica's log");
    let child = Command::new(bin("minik8s"))
        .arg("edge-registry")
        .args(["--kubeconfig", &file("edge-registry.kubeconfig")])
        .args(["--apiserver", c.server()])
        .args(["--ca", &file("ca.crt")])
        .args(["--tls", &file("apiserver.crt"), &file("apiserver.key")])
        .args([
            "--client",
            &file("edge-registry.crt"),
            &file("edge-registry.key"),
        ])
        .args(["--listen", &format!("{HOST_IP}:10361")])
        .args(["--identity", "replica-2", "--address", HOST_IP])
        .args(["--kubelet-listen", "0.0.0.0:0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the second replica starts");
    Replica(child)
}

/// The holder of each edge node's Lease.
fn holders(c: &InitCluster) -> BTreeMap<String, String> {
    c.ok(&[
        "get",
        "leases",
        "-n",
        "kube-node-lease",
        "-l",
        "minik8s.io/vnode-provider=edge,!minik8s.io/vnode-replica",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.holderIdentity}{\"\\n\"}{end}",
    ])
    .lines()
    .filter_map(|l| {
        let (node, holder) = l.split_once(' ')?;
        Some((node.to_owned(), holder.to_owned()))
    })
    .collect()
}

#[test]
fn pods_run_on_docker_as_compose_style_containers_and_survive_an_edgelet_kill() {
    let c = InitCluster::start(free_port());
    let mut replica = second_replica(&c);
    let mut m = c.docker_edge_machine("edge-d", 25, &[]);
    let joined = c.edge_join(&m, &["--edgelet-address", "127.0.0.1:10351"]);
    assert!(
        joined.ok,
        "join: {}\n{}\n{}",
        joined.stdout,
        joined.stderr,
        m.log()
    );
    c.node_condition("edge-d", "Ready", "True", Duration::from_secs(60));
    let runtime = c.ok(&[
        "get",
        "node",
        "edge-d",
        "-o",
        "jsonpath={.status.nodeInfo.containerRuntimeVersion}",
    ]);
    assert!(runtime.starts_with("docker://"), "{runtime}");

    // The Deployment: init first, then two containers sharing the pod's network.
    c.kubectl_stdin(&["apply", "-f", "-"], WEB);
    // Applied twice, unchanged.
    let again = c.kubectl_stdin(&["apply", "-f", "-"], WEB);
    assert!(again.stdout.contains("unchanged"), "{}", again.stdout);
    let pod = c
        .eventually(
            Duration::from_secs(120),
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[*].ready}{\"\\n\"}{end}",
            ],
            |o| o.trim().ends_with("Running true true"),
        )
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    // The design's names: `<pod>.<container>`, and the pause container holding the network.
    let names: Vec<String> = containers(&m).into_iter().map(|c| c.0).collect();
    for want in ["pause", "init", "server", "client"] {
        let name = format!("{pod}.{want}");
        assert!(names.contains(&name), "no container {name}: {names:?}");
    }
    let mode = m.docker_cli(&[
        "inspect",
        "--format",
        "{{.HostConfig.NetworkMode}}",
        &format!("{pod}.client"),
    ]);
    assert!(
        mode.stdout.trim().starts_with("container:"),
        "{}",
        mode.stdout
    );
    // Over 127.0.0.1, read through `kubectl logs` (Docker's own logs); the init container's
    // output too.
    let local = c.eventually(
        Duration::from_secs(30),
        &["logs", &pod, "-c", "client", "--tail", "1"],
        |o| o.contains("local: served-from-docker by init"),
    );
    assert!(local.lines().count() == 1, "{local}");
    let init = c.ok(&["logs", &pod, "-c", "init"]);
    assert_eq!(init.trim(), "init ran");

    docker_streams(&c, &m, &pod);

    // Another pod calls it by its `app` label, a network alias on the edge's Docker network.
    c.kubectl_stdin(&["apply", "-f", "-"], CALLER);
    c.eventually(
        Duration::from_secs(60),
        &["logs", "caller", "--tail", "1"],
        |o| o.contains("by alias: served-from-docker by init"),
    );

    // A crashing container restarts with back-off: CrashLoopBackOff, and the restarts slow.
    c.kubectl_stdin(&["apply", "-f", "-"], CRASH);
    c.eventually(
        Duration::from_secs(90),
        &[
            "get",
            "pod",
            "crash",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.waiting.reason}",
        ],
        |o| {
            let mut w = o.split_whitespace();
            w.next().and_then(|n| n.parse::<u32>().ok()).unwrap_or(0) >= 2
                && w.next() == Some("CrashLoopBackOff")
        },
    );
    let described = c.ok(&["describe", "pod", "crash"]);
    assert!(
        described.contains("Back-off restarting failed container"),
        "{described}"
    );
    assert!(
        c.ok(&["logs", "crash", "--previous"])
            .contains("crashing now")
    );

    // The edgelet SIGKILLed and restarted: it finds the pods' containers by their labels and
    // adopts them; none restarts.
    let before: Vec<_> = containers(&m)
        .into_iter()
        .filter(|c| c.0.starts_with(&pod) && c.1 == "running")
        .collect();
    assert_eq!(before.len(), 3, "{before:?}");
    m.kill9();
    std::thread::sleep(Duration::from_secs(2));
    m.restart();
    c.node_condition("edge-d", "Ready", "True", Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(12));
    let after: Vec<_> = containers(&m)
        .into_iter()
        .filter(|c| c.0.starts_with(&pod) && c.1 == "running")
        .collect();
    assert_eq!(
        before, after,
        "the pod's containers changed across the kill"
    );
    let restarts = c.ok(&[
        "get",
        "pod",
        &pod,
        "-o",
        "jsonpath={.status.phase} {.status.containerStatuses[*].restartCount}",
    ]);
    assert_eq!(restarts.trim(), "Running 0 0", "{restarts}");
    c.eventually(
        Duration::from_secs(30),
        &["logs", &pod, "-c", "client", "--tail", "1"],
        |o| o.contains("local: served-from-docker by init"),
    );

    registry_replica_killed(&c, &mut replica, &pod);

    // Docker gone: the node is NotReady with Docker's message; a new pod bound to it waits in
    // ContainerCreating with Docker's message in its events; the edgelet stays up and says so.
    let daemon = m.docker_pid().expect("dockerd runs");
    let _ = std::process::Command::new("kill")
        .arg(daemon.to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.docker_cli(&["version"]).ok {
        assert!(Instant::now() < deadline, "dockerd did not stop");
        std::thread::sleep(Duration::from_millis(200));
    }
    let ready = c.eventually(
        Duration::from_secs(60),
        &[
            "get",
            "node",
            "edge-d",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}: \
             {.status.conditions[?(@.type==\"Ready\")].message}",
        ],
        |o| o.starts_with("False:"),
    );
    assert!(
        ready.contains("container runtime") && ready.contains("docker"),
        "{ready}"
    );
    // Bound by name: the scheduler keeps new pods off a node that is not ready.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &CALLER.replace("name: caller", "name: late").replace(
            "nodeSelector: {kubernetes.io/hostname: edge-d}",
            "nodeName: edge-d",
        ),
    );
    let events = c.eventually(
        Duration::from_secs(60),
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=late",
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ],
        |o| o.contains("docker"),
    );
    assert!(
        events.contains("Failed") || events.contains("FailedCreatePodSandBox"),
        "{events}"
    );
    let waiting = c.eventually(
        Duration::from_secs(30),
        &[
            "get",
            "pod",
            "late",
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason}",
        ],
        |o| o == "Pending ContainerCreating",
    );
    assert_eq!(waiting, "Pending ContainerCreating", "{events}");
    assert!(
        m.edgectl(&["--edgelet-address", "127.0.0.1:10351", "status"])
            .ok,
        "the edgelet stopped with Docker: {}",
        m.log()
    );
}

/// A second edge (on containerd) joins; the two replicas hold one edge each; the second
/// replica is SIGKILLed and the first takes its edge over.
fn registry_replica_killed(c: &InitCluster, replica: &mut Replica, web: &str) {
    let e = c.edge_machine("edge-e", 26, &[]);
    let joined = c.edge_join(&e, &["--edgelet-address", "127.0.0.1:10351"]);
    assert!(joined.ok, "join: {}\n{}", joined.stderr, e.log());
    c.node_condition("edge-e", "Ready", "True", Duration::from_secs(60));
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &CALLER
            .replace("name: caller", "name: beacon")
            .replace("edge-d", "edge-e")
            .replace(
                "by alias: $(wget -qO- http://web:8080/index.html)",
                "beacon $(date +%s)",
            ),
    );
    c.eventually(
        Duration::from_secs(60),
        &["get", "pod", "beacon", "-o", "jsonpath={.status.phase}"],
        |o| o == "Running",
    );
    // One edge each: the replicas race for each Lease after a wait in proportion to what
    // they hold.
    let deadline = Instant::now() + Duration::from_secs(60);
    let held = loop {
        let h = holders(c);
        let theirs = h.values().filter(|v| v.as_str() == "replica-2").count();
        if h.len() == 2 && theirs == 1 {
            break h;
        }
        assert!(
            Instant::now() < deadline,
            "the replicas do not hold one edge each: {h:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let (lost, _) = held
        .iter()
        .find(|(_, holder)| holder.as_str() == "replica-2")
        .unwrap();
    let lost = lost.clone();
    let first = held
        .values()
        .find(|v| v.as_str() != "replica-2")
        .unwrap()
        .clone();
    let pod = if lost == "edge-d" { web } else { "beacon" };
    let restarts = |c: &InitCluster| {
        c.ok(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.containerStatuses[*].restartCount}",
        ])
    };
    let before = restarts(c);

    // SIGKILL: its Lease lapses (40 s) and the first replica takes the edge over.
    let _ = replica.0.kill();
    let _ = replica.0.wait();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(120);
    loop {
        let h = holders(c);
        if h.get(&lost) == Some(&first) {
            break;
        }
        assert!(Instant::now() < deadline, "{lost} not taken over: {h:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "{lost} taken over by the first replica {:.1} s after the second was killed",
        killed.elapsed().as_secs_f64()
    );
    c.node_condition(&lost, "Ready", "True", Duration::from_secs(60));
    let container = if pod == web { "client" } else { "main" };
    c.eventually(
        Duration::from_secs(30),
        &["logs", pod, "-c", container, "--tail", "1"],
        |o| !o.trim().is_empty(),
    );
    assert_eq!(restarts(c), before, "{pod} restarted across the takeover");
    assert_eq!(
        c.ok(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"]),
        "Running"
    );
    drop(e);
}

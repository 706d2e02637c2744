//! Edge nodes: two edge machines as network namespaces on the node network, each running the
//! real `edgelet` with its own containerd, joined with `edgectl join` (a bootstrap token and
//! the CA pin) to a control plane made with `minik8s init`, whose edge registry serves them as
//! virtual nodes. Pods spread over them, log, read a ConfigMap that follows changes, run init
//! containers and crash-loop as on any node; the node shows the edge's facts and pressure;
//! the link is cut for a minute with the edgelet SIGKILLed and restarted meanwhile, and
//! nothing is evicted or lost; `reset` leaves the containers running and `upgrade` swaps the
//! binary under running pods.

use minik8s_conformance::machines::{InitCluster, Machine};
use minik8s_conformance::node::{free_port, http_get, python, repo_root};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const WEB: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: greeting}
data: {text: hello}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 4
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {node-role.kubernetes.io/edge: ""}
      tolerations: [{key: virtual-kubelet.io/provider, value: edge, effect: NoSchedule}]
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
         labelSelector: {matchLabels: {app: web}}}
      volumes:
      - {name: work, emptyDir: {}}
      - {name: greeting, configMap: {name: greeting}}
      initContainers:
      - name: init
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "echo init done; echo prepared > /work/ready"]
        volumeMounts: [{name: work, mountPath: /work}]
      containers:
      - name: web
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "cat /work/ready; while true; do echo \"greeting: $(cat /config/text) edge-web-marker\"; sleep 1; done"]
        volumeMounts:
        - {name: work, mountPath: /work}
        - {name: greeting, mountPath: /config}
"#;

/// A pod pinned to edge node `node`.
fn pinned(name: &str, node: &str, command: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  tolerations: [{{key: virtual-kubelet.io/provider, value: edge, effect: NoSchedule}}]
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", {command:?}]
"#
    )
}

fn join(c: &InitCluster, m: &Machine) -> String {
    let r = c.edge_join(m, &["--edgelet-address", "127.0.0.1:10351"]);
    assert!(
        r.ok,
        "edgectl join on {} failed:\n{}\n{}\n{}",
        m.name,
        r.stdout,
        r.stderr,
        m.log()
    );
    r.stdout
}

/// `name node` of the web pods.
fn web_pods(c: &InitCluster) -> Vec<(String, String)> {
    c.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
    ])
    .lines()
    .filter_map(|l| {
        let mut w = l.split_whitespace();
        Some((w.next()?.to_owned(), w.next()?.to_owned()))
    })
    .collect()
}

/// `uid containerID restartCount` of the pods on `node`.
fn containers_on(c: &InitCluster, node: &str) -> BTreeSet<String> {
    c.ok(&[
        "get",
        "pods",
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.uid} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}{\"\\n\"}{end}",
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

/// How many processes of the web pods run in node `node`'s cgroups (seen from this machine;
/// the suite puts them under `/minik8s-test`).
fn web_processes(node: &str) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = e.path();
        let cmd = std::fs::read(p.join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains("edge-web-marker") {
            continue;
        }
        let cg = std::fs::read_to_string(p.join("cgroup")).unwrap_or_default();
        if cg.contains(&format!("/minik8s-test/{node}/")) {
            n += 1;
        }
    }
    n
}

fn restarts(c: &InitCluster, pod: &str) -> i64 {
    c.ok(&[
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.containerStatuses[0].restartCount}",
    ])
    .trim()
    .parse()
    .unwrap_or(0)
}

/// Calls edge-a's cloud-facing service from here: a peer of another protocol version, a
/// malformed or oversized message, another node's name, a pod of another node, a caller that
/// is not the registry, and a server that is not the node meant all get clear errors, and the
/// edgelet keeps answering.
fn bad_input_gets_error_replies(c: &InitCluster) {
    use minik8s_edge::proto::edgelet_client::EdgeletClient;
    use minik8s_edge::proto::{GetPodsRequest, Hello, PodRequest};
    let pki = c.data_dir().join("pki");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).unwrap();
    let client = |cert: &str, key: &str, node: &str| {
        let tls = minik8s_edge::tls::client_config(
            &read("ca.crt"),
            Some((&read(cert), &read(key))),
            Some(format!("system:node:{node}")),
        )
        .unwrap();
        let ch =
            minik8s_edge::tls::channel("10.250.0.21:10350", tls, Duration::from_secs(10)).unwrap();
        EdgeletClient::new(ch).max_encoding_message_size(64 << 20)
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cl = client("edge-registry.crt", "edge-registry.key", "edge-a");
        let hello = minik8s_edge::hello("edge-a");
        // A good call first, until the edgelet answers from here (under load its server may
        // still be starting after the join): the errors below are then the replies' own.
        let mut tries = 0;
        while let Err(e) = cl.get_pods(GetPodsRequest { hello: hello.clone() }).await {
            tries += 1;
            assert!(tries < 40, "edge-a's cloud-facing server does not answer: {e}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let e = cl
            .get_pods(GetPodsRequest {
                hello: Some(Hello { version: 1, node: "edge-a".into() }),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
        assert!(e.message().contains("v1") && e.message().contains("v2"), "{}", e.message());
        let e = cl
            .create_pod(PodRequest { hello: hello.clone(), pod: b"{not json".to_vec(), seq: 1 })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
        let e = cl
            .create_pod(PodRequest { hello: hello.clone(), pod: vec![b' '; 5 << 20], seq: 1 })
            .await
            .unwrap_err();
        assert!(
            matches!(e.code(), tonic::Code::ResourceExhausted | tonic::Code::OutOfRange),
            "{e:?}"
        );
        let e = cl
            .get_pods(GetPodsRequest { hello: minik8s_edge::hello("edge-b") })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{}", e.message());
        let other = br#"{"metadata":{"name":"x","namespace":"default","uid":"u-x"},"spec":{"nodeName":"edge-b","containers":[{"name":"c","image":"busybox"}]}}"#;
        let e = cl
            .create_pod(PodRequest { hello: hello.clone(), pod: other.to_vec(), seq: 1 })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{}", e.message());
        // Still answering.
        cl.get_pods(GetPodsRequest { hello: hello.clone() }).await.unwrap();
        // A stream for another node is refused; one for a pod the edge does not have gets
        // the kubelet's own 404.
        let e = cl
            .stream(futures::stream::iter([minik8s_edge::tunnel::opening(
                minik8s_edge::hello("edge-b"),
            )]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{}", e.message());
        let request = b"GET /containerLogs/default/nowhere/main HTTP/1.1\r\nHost: edge\r\nConnection: close\r\n\r\n";
        let frames = [
            minik8s_edge::tunnel::opening(hello.clone()),
            minik8s_edge::proto::StreamFrame { hello: None, data: request.to_vec() },
        ];
        let mut answer = cl.stream(futures::stream::iter(frames)).await.unwrap().into_inner();
        let mut text = Vec::new();
        while let Some(f) = futures::StreamExt::next(&mut answer).await {
            text.extend(f.unwrap().data);
        }
        let text = String::from_utf8_lossy(&text);
        assert!(
            text.starts_with("HTTP/1.1 404") && text.contains("pod default/nowhere is not on this node"),
            "{text}"
        );
        // Only the registry may call.
        let e = client("admin.crt", "admin.key", "edge-a")
            .get_pods(GetPodsRequest { hello: hello.clone() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{}", e.message());
        // The cloud refuses a server that is not the node it means.
        let e = client("edge-registry.crt", "edge-registry.key", "edge-b")
            .get_pods(GetPodsRequest { hello: hello.clone() })
            .await
            .unwrap_err();
        assert_ne!(e.code(), tonic::Code::Ok);
    });
}

/// A pod on edge-a for the streams: httpd on 8080, a container that logs what lands in
/// /tmp/say, one that answers its stdin.
const TOOLS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: tools, labels: {app: tools}}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: edge-a}
  tolerations: [{key: virtual-kubelet.io/provider, value: edge, effect: NoSchedule}]
  containers:
  - name: web
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www && echo edge-web > /www/index.html && exec httpd -f -p 8080 -h /www"]
  - name: clock
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo clock started; while true; do if [ -f /tmp/say ]; then cat /tmp/say; rm /tmp/say; fi; sleep 0.1; done"]
  - name: talk
    image: busybox
    imagePullPolicy: IfNotPresent
    stdin: true
    command: ["sh", "-c", "while read l; do echo heard:$l; done"]
"#;

/// Runs `kubectl args` with `stdin` written at once and kept open, until its output has
/// `want` (or 30 s pass); then kills it. Its stdout.
fn interactive(c: &InitCluster, program: &str, args: &[&str], stdin: &str, want: &str) -> String {
    use std::io::{Read, Write};
    let mut child = std::process::Command::new(program)
        .args(args)
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    let mut out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains(want) && Instant::now() < deadline {
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(200)) {
            got.extend(b);
        }
    }
    drop(input);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(
        got.contains(want),
        "{program} {args:?}: {want:?} not seen in {got:?}; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    got
}

/// `kubectl port-forward pod/tools :8080` until dropped; the local port.
struct Forward(std::process::Child, u16);

impl Forward {
    fn start(c: &InitCluster) -> Forward {
        use std::io::{BufRead, BufReader};
        let mut child = std::process::Command::new("kubectl")
            .args(["port-forward", "pod/tools", ":8080"])
            .env("KUBECONFIG", &c.kubeconfig)
            .env("HOME", c.dir())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(c.dir().join("port-forward.log")).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
        // kubectl prints a line per connection: keep reading, or it fails writing.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let port = line
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|r| r.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("port-forward printed {line:?}"));
        Forward(child, port)
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What an operator does first on an edge pod, over the edge link: `exec -it`, `cp` both
/// ways, `port-forward` with two connections at once, `logs -f` seeing a new line within
/// 1 s, `attach`; the same through the Python client's streams.
fn streams_over_the_link(c: &InitCluster) {
    use std::io::{Read, Write};
    c.kubectl_stdin(&["apply", "-f", "-"], TOOLS);
    c.eventually(
        Duration::from_secs(90),
        &["get", "pod", "tools", "-o", "jsonpath={.status.phase}"],
        |p| p == "Running",
    );
    // exec -it: a terminal (from `script`), what is typed reaches the shell and its answer
    // comes back.
    let typed = interactive(
        c,
        "script",
        &[
            "-qec",
            "kubectl exec -it tools -c web -- sh -c 'read x; echo got:$x'",
            "/dev/null",
        ],
        "over-the-link\n",
        "got:over-the-link",
    );
    println!("exec -it: {typed:?}");
    // exec -i without a terminal: stdin echoed by cat.
    let echoed = c.kubectl_stdin(
        &["exec", "-i", "tools", "-c", "web", "--", "cat"],
        "echo me\n",
    );
    assert!(echoed.ok && echoed.stdout == "echo me\n", "{echoed:?}");
    // The container's exit code crosses the link.
    let failed = c.kubectl(&["exec", "tools", "-c", "web", "--", "sh", "-c", "exit 7"]);
    assert!(
        !failed.ok && failed.stderr.contains("exit code 7"),
        "{}",
        failed.stderr
    );
    // cp both ways, 2 MB byte for byte.
    let big: Vec<u8> = (0..2_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let file = c.dir().join("edge-big.bin");
    std::fs::write(&file, &big).unwrap();
    c.ok(&[
        "cp",
        "-c",
        "web",
        file.to_str().unwrap(),
        "tools:/tmp/big.bin",
    ]);
    let back = c.dir().join("edge-big-back.bin");
    c.ok(&[
        "cp",
        "-c",
        "web",
        "tools:/tmp/big.bin",
        back.to_str().unwrap(),
    ]);
    assert!(
        std::fs::read(&back).unwrap() == big,
        "2 MB copied back unchanged"
    );
    // port-forward: one connection held open while a second is served, then the first.
    let fwd = Forward::start(c);
    let addr = format!("127.0.0.1:{}", fwd.1);
    let first = (0..10).find_map(|_| {
        let r = http_get(&addr);
        if r.is_none() {
            std::thread::sleep(Duration::from_millis(500));
        }
        r
    });
    let log = || std::fs::read_to_string(c.dir().join("port-forward.log")).unwrap_or_default();
    assert_eq!(first.as_deref(), Some("edge-web"), "{}", log());
    let mut held = std::net::TcpStream::connect(("127.0.0.1", fwd.1)).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    held.write_all(b"GET / HTTP/1.0\r\n").unwrap();
    assert_eq!(
        http_get(&format!("127.0.0.1:{}", fwd.1)).as_deref(),
        Some("edge-web")
    );
    held.write_all(b"\r\n").unwrap();
    let mut answer = String::new();
    held.read_to_string(&mut answer).unwrap();
    assert!(answer.ends_with("edge-web\n"), "{answer:?}");
    drop(fwd);
    // logs -f: a line written now is seen within 1 s.
    let mut follow = std::process::Command::new("kubectl")
        .args(["logs", "-f", "tools", "-c", "clock"])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0
                || tx
                    .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                    .is_err()
            {
                break;
            }
        }
    });
    let mut seen = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
    assert!(seen.contains("clock started"), "{seen:?}");
    c.ok(&[
        "exec",
        "tools",
        "-c",
        "clock",
        "--",
        "sh",
        "-c",
        "echo followed-line > /tmp/say",
    ]);
    let wrote = Instant::now();
    while !seen.contains("followed-line") && wrote.elapsed() < Duration::from_secs(5) {
        if let Ok(more) = rx.recv_timeout(Duration::from_millis(50)) {
            seen.push_str(&more);
        }
    }
    let took = wrote.elapsed();
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(seen.contains("followed-line"), "{seen:?}");
    println!("logs -f saw the new line {took:?} after it was written");
    assert!(took < Duration::from_secs(1), "logs -f took {took:?}");
    // attach to the container reading stdin.
    interactive(
        c,
        "kubectl",
        &["attach", "-i", "tools", "-c", "talk"],
        "to-attach\n",
        "heard:to-attach",
    );
    // The Python client's streams.
    let out = std::process::Command::new(python())
        .arg(repo_root().join("conformance/python/edge_streams.py"))
        .args(["default", "tools"])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    assert!(
        out.status.success(),
        "the Python client's streams failed:\n{report}"
    );
}

/// A Service of the tools pod's httpd, and a pod on the same edge calling it by name every
/// second (its log says what each call got).
const CALLER: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: tools-web}
spec:
  selector: {app: tools}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: caller}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: edge-a}
  tolerations: [{key: virtual-kubelet.io/provider, value: edge, effect: NoSchedule}]
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "while true; do echo \"call: $(wget -q -T 2 -O - http://tools-web.default.svc.cluster.local/ 2>&1)\"; sleep 1; done"]
"#;

/// A Service whose endpoint is on edge-a, called by name from a pod there, its variables set.
fn services_at_the_edge(c: &InitCluster) {
    c.kubectl_stdin(&["apply", "-f", "-"], CALLER);
    c.eventually(
        Duration::from_secs(90),
        &["get", "pod", "caller", "-o", "jsonpath={.status.phase}"],
        |p| p == "Running",
    );
    let ip = c.ok(&[
        "get",
        "service",
        "tools-web",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let env = c.ok(&["exec", "caller", "--", "env"]);
    for want in [
        format!("TOOLS_WEB_SERVICE_HOST={ip}"),
        "TOOLS_WEB_SERVICE_PORT=80".to_owned(),
        format!("TOOLS_WEB_PORT=tcp://{ip}:80"),
    ] {
        assert!(
            env.contains(&want),
            "{want} missing from the caller's env:\n{env}"
        );
    }
    c.eventually(
        Duration::from_secs(60),
        &["logs", "caller", "--tail", "1"],
        |l| l.trim() == "call: edge-web",
    );
    // The name resolves at the edge's own DNS, the machine's names too.
    // (busybox's nslookup also tries the other search domains and fails on those.)
    let looked = c
        .kubectl(&["exec", "caller", "--", "nslookup", "tools-web"])
        .stdout;
    assert!(
        looked.contains("tools-web.default.svc.cluster.local") && looked.contains(&ip),
        "{looked}"
    );
}

/// The exec processes with `marker` in their command line, seen from this machine.
fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains(marker)
        })
        .count()
}

#[test]
fn edge_nodes_join_run_pods_and_keep_them_through_an_outage() {
    let c = InitCluster::start(free_port());
    let mut a = c.edge_machine("edge-a", 21, &[]);
    let b = c.edge_machine("edge-b", 22, &[]);

    // Bad input first: a wrong token and a wrong pin are refused with kubeadm's messages,
    // and nothing is created.
    let wrong = b.edgectl(&[
        "join",
        &c.edge_registry(),
        "--token",
        "abcdef.0123456789abcdef",
        "--discovery-token-ca-cert-hash",
        c.ca_hash(),
    ]);
    assert!(!wrong.ok);
    assert!(
        wrong
            .stderr
            .contains("there is no JWS signed token in the cluster-info ConfigMap"),
        "{}",
        wrong.stderr
    );
    let pin = format!("sha256:{}", "0".repeat(64));
    let wrong = b.edgectl(&[
        "join",
        &c.edge_registry(),
        "--token",
        c.token(),
        "--discovery-token-ca-cert-hash",
        &pin,
    ]);
    assert!(!wrong.ok);
    assert!(
        wrong.stderr.contains("none of the public keys"),
        "{}",
        wrong.stderr
    );
    assert!(
        !c.kubectl(&["get", "node", "edge-b"]).ok,
        "a refused join made a Node"
    );

    // Join both; each is a Ready edge node with the virtual-kubelet taint.
    assert!(join(&c, &a).contains("has joined the cluster as edge-a"));
    join(&c, &b);
    c.node_condition("edge-a", "Ready", "True", Duration::from_secs(60));
    c.node_condition("edge-b", "Ready", "True", Duration::from_secs(60));
    let nodes = c.ok(&[
        "get",
        "nodes",
        "-l",
        "node-role.kubernetes.io/edge",
        "-o",
        "name",
    ]);
    assert_eq!(nodes.lines().count(), 2, "{nodes}");
    // A second join of a joined edge is refused and changes nothing.
    let again = a.edgectl(&[
        "join",
        &c.edge_registry(),
        "--token",
        c.token(),
        "--discovery-token-ca-cert-hash",
        c.ca_hash(),
    ]);
    assert!(
        !again.ok && again.stderr.contains("already joined"),
        "{}",
        again.stderr
    );
    // Another machine presenting a joined edge's name is refused.
    let impostor = c.edge_machine("edge-c", 23, &["--node-name", "edge-a"]);
    let r = impostor.edgectl(&[
        "join",
        &c.edge_registry(),
        "--token",
        c.token(),
        "--discovery-token-ca-cert-hash",
        c.ca_hash(),
    ]);
    assert!(
        !r.ok && r.stderr.contains("already joined from"),
        "{}",
        r.stderr
    );
    drop(impostor);

    bad_input_gets_error_replies(&c);

    // A Deployment for edge nodes spreads over both, init container first.
    c.kubectl_stdin(&["apply", "-f", "-"], WEB);
    let placed = c.eventually(
        Duration::from_secs(120),
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.status.phase} {.spec.nodeName}{\"\\n\"}{end}",
        ],
        |o| o.lines().filter(|l| l.starts_with("Running ")).count() == 4,
    );
    let on: BTreeSet<&str> = placed
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(on, BTreeSet::from(["edge-a", "edge-b"]), "{placed}");
    let pods = web_pods(&c);
    let (pod_a, _) = pods.iter().find(|(_, n)| n == "edge-a").cloned().unwrap();
    // `kubectl logs` of an edge pod (read from the edge's CRI log files), its init container's too.
    assert_eq!(c.ok(&["logs", &pod_a, "-c", "init"]).trim(), "init done");
    let log = c.eventually(
        Duration::from_secs(30),
        &["logs", &pod_a, "-c", "web"],
        |l| l.contains("greeting: hello"),
    );
    assert!(log.starts_with("prepared"), "{log}");
    // The ConfigMap's change reaches the file at the edge.
    c.ok(&[
        "patch",
        "configmap",
        "greeting",
        "-p",
        r#"{"data":{"text":"hola"}}"#,
    ]);
    c.eventually(
        Duration::from_secs(60),
        &["logs", &pod_a, "-c", "web", "--tail", "1"],
        |l| l.contains("greeting: hola"),
    );
    // The data sits in the edge's store as files, kind/namespace/name/key.
    let file = std::fs::read_to_string(
        c.dir()
            .join("edge-a/edge/store/volumes/configmaps/default/greeting/text"),
    )
    .unwrap_or_default();
    assert_eq!(file, "hola");

    streams_over_the_link(&c);
    services_at_the_edge(&c);

    // A crashing container shows CrashLoopBackOff, as on any node.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &pinned("crasher", "edge-a", "echo boom; exit 1"),
    );
    c.eventually(
        Duration::from_secs(120),
        &[
            "get",
            "pod",
            "crasher",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ],
        |r| r == "CrashLoopBackOff",
    );
    let events = c.ok(&["describe", "pod", "crasher"]);
    assert!(
        events.contains("Back-off restarting failed container"),
        "{events}"
    );
    // A pod the edge cannot run says why, as on any node.
    let missing = pinned("missing", "edge-b", "true")
        .replace("image: busybox", "image: minik8s.invalid/none:1")
        .replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: Never");
    c.kubectl_stdin(&["apply", "-f", "-"], &missing);
    c.eventually(
        Duration::from_secs(60),
        &[
            "get",
            "pod",
            "missing",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ],
        |r| r == "ErrImageNeverPull",
    );

    // DescribeNodeStatus values in `kubectl describe node`.
    let described = c.ok(&["describe", "node", "edge-a"]);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for want in [
        "node-role.kubernetes.io/edge",
        "node.minik8s.io/autonomy: true",
        "ExternalIP:  10.250.0.21",
        kernel.trim(),
        "containerd://",
        "MemoryPressure   False",
        "memory use ",
        "disk use ",
    ] {
        assert!(
            described.contains(want),
            "{want:?} missing from:\n{described}"
        );
    }

    // Memory pressure, simulated with the threshold flag.
    a.stop();
    a.restart_with(&["--memory-pressure-threshold", "1"]);
    c.node_condition("edge-a", "MemoryPressure", "True", Duration::from_secs(60));
    let described = c.ok(&["describe", "node", "edge-a"]);
    assert!(described.contains("(pressure above 1%)"), "{described}");
    a.stop();
    a.restart();
    c.node_condition("edge-a", "MemoryPressure", "False", Duration::from_secs(60));

    // Autonomy drill: the link down for a minute, and the edgelet SIGKILLed and restarted
    // meanwhile. Nothing is evicted or restarted but the crashing container; a pod deleted
    // in the cloud meanwhile goes from the edge at reconnect, one created meanwhile starts.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &pinned(
            "doomed",
            "edge-a",
            "trap 'exit 0' TERM; while true; do sleep 1; done",
        ),
    );
    c.eventually(
        Duration::from_secs(60),
        &["get", "pod", "doomed", "-o", "jsonpath={.status.phase}"],
        |p| p == "Running",
    );
    // The crasher's container changes by design; the others' must not.
    // The crasher's container changes by design, and the doomed pod goes; the others' must
    // not change.
    let crasher_uid = c.ok(&["get", "pod", "crasher", "-o", "jsonpath={.metadata.uid}"]);
    let doomed_uid = c.ok(&["get", "pod", "doomed", "-o", "jsonpath={.metadata.uid}"]);
    let before: BTreeSet<String> = containers_on(&c, "edge-a")
        .into_iter()
        .filter(|l| !l.starts_with(&crasher_uid) && !l.starts_with(&doomed_uid))
        .collect();
    let crashes_before = restarts(&c, "crasher");
    let web_before = web_processes("edge-a");
    assert!(web_before >= 1, "no web process found on edge-a");
    // An exec running when the link goes: it ends with an error, and its process ends at
    // the edge.
    let mut open_exec = std::process::Command::new("kubectl")
        .args([
            "exec",
            "-i",
            "tools",
            "-c",
            "web",
            "--",
            "sh",
            "-c",
            "echo exec-ready; cat; echo edge-exec-marker",
        ])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Running from both ends: its process at the edge, and its first output at kubectl (the
    // upgrade's answer came back over the link before the link goes).
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stdout = open_exec.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.trim() == "exec-ready" {
                let _ = ready_tx.send(());
            }
        }
    });
    assert!(
        ready_rx.recv_timeout(Duration::from_secs(20)).is_ok(),
        "the exec did not start"
    );
    let exec_deadline = Instant::now() + Duration::from_secs(20);
    while processes_with("edge-exec-marker") == 0 && Instant::now() < exec_deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        processes_with("edge-exec-marker") > 0,
        "the exec's process is not at the edge"
    );
    a.link(false);
    let cut = Instant::now();
    let outage_start = jiff::Timestamp::now();
    c.node_condition("edge-a", "Ready", "Unknown", Duration::from_secs(90));
    let taints = c.ok(&[
        "get",
        "node",
        "edge-a",
        "-o",
        "jsonpath={.spec.taints[*].key}",
    ]);
    assert!(
        taints.contains("node.kubernetes.io/unreachable"),
        "{taints}"
    );
    // Both ends see the link gone within the keep-alives (10 s + 10 s).
    let exec_end = Instant::now() + Duration::from_secs(60);
    let ended = loop {
        if let Some(st) = open_exec.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > exec_end {
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    if ended.is_none() {
        let _ = open_exec.kill();
    }
    let exec_out = open_exec.wait_with_output().unwrap();
    let _ = reader.join();
    println!(
        "the exec cut by the link loss ended after {:?}: {:?} {}",
        cut.elapsed(),
        exec_out.status,
        String::from_utf8_lossy(&exec_out.stderr)
    );
    assert!(
        ended.is_some_and(|s| !s.success()),
        "the exec did not end with an error when the link went"
    );
    // kubectl says why: the registry's end of the stream ends it with a Status on the error
    // channel when the link goes.
    assert!(
        String::from_utf8_lossy(&exec_out.stderr)
            .contains("the connection to node edge-a was lost before the stream ended"),
        "{}",
        String::from_utf8_lossy(&exec_out.stderr)
    );
    let gone_deadline = Instant::now() + Duration::from_secs(30);
    while processes_with("edge-exec-marker") > 0 && Instant::now() < gone_deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        processes_with("edge-exec-marker"),
        0,
        "the exec's process stayed at the edge"
    );
    c.ok(&["delete", "pod", "doomed", "--wait=false"]);
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &pinned("late", "edge-a", "while true; do sleep 1; done"),
    );
    let killed = jiff::Timestamp::now();
    a.kill9();
    std::thread::sleep(Duration::from_secs(2));
    a.restart();
    let restarted = jiff::Timestamp::now();
    // The edge goes on alone: its pods run and the crashing container is restarted there.
    let status = c.dir().join("edge-a/edge/store/pods");
    let edge_status = a.edgectl(&["status"]);
    assert!(edge_status.ok, "{}", edge_status.stderr);
    assert!(
        edge_status.stdout.contains("disconnected"),
        "{}",
        edge_status.stdout
    );
    while cut.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_secs(2));
    }
    assert_eq!(
        web_processes("edge-a"),
        web_before,
        "a web container stopped during the outage"
    );
    assert!(status.exists());
    let outage_end = jiff::Timestamp::now();
    let reconnect = Instant::now();
    a.link(true);
    c.eventually(
        Duration::from_secs(30),
        &["get", "pods", "-o", "name"],
        |o| !o.lines().any(|l| l == "pod/doomed"),
    );
    let gone_after = reconnect.elapsed();
    println!("the pod deleted during the outage was gone {gone_after:?} after reconnect");
    assert!(gone_after <= Duration::from_secs(5), "took {gone_after:?}");
    c.node_condition("edge-a", "Ready", "True", Duration::from_secs(60));
    // While the link was down, the caller kept reaching the Service by name (its endpoint on
    // the same edge), but for the seconds the edgelet (and with it the edge's DNS server) was
    // down: every call logged between the cut and the kill, and from 10 s after the restart
    // to the link's return, answered.
    let calls = c.ok(&[
        "logs",
        "caller",
        "--timestamps",
        "--since-time",
        &outage_start.to_string(),
    ]);
    let settled = restarted + jiff::SignedDuration::from_secs(10);
    let during: Vec<&str> = calls
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .is_some_and(|t| {
                    (t > outage_start && t < killed) || (t > settled && t < outage_end)
                })
        })
        .collect();
    let rules: Vec<String> = a
        .log()
        .lines()
        .filter(|l| l.contains("Service rules") || l.contains("edge DNS"))
        .map(str::to_owned)
        .collect();
    println!(
        "{} calls by name during the outage; edge-a's rules and DNS:\n{}",
        during.len(),
        rules.join("\n")
    );
    assert!(
        during.len() >= 20,
        "too few calls logged during the outage:\n{calls}"
    );
    assert!(
        during.iter().all(|l| l.ends_with("call: edge-web")),
        "calls failed during the outage:\n{}",
        during.join("\n")
    );
    c.eventually(
        Duration::from_secs(60),
        &["get", "pod", "late", "-o", "jsonpath={.status.phase}"],
        |p| p == "Running",
    );
    // Nothing evicted, nothing restarted but what crashed; the crasher restarted on its own.
    let after: BTreeSet<String> = c
        .eventually(
            Duration::from_secs(30),
            &[
                "get",
                "pods",
                "--field-selector",
                "spec.nodeName=edge-a",
                "-o",
                "name",
            ],
            |_| true,
        )
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(after.contains("pod/crasher"), "{after:?}");
    let now: BTreeSet<String> = containers_on(&c, "edge-a")
        .into_iter()
        .filter(|l| !l.starts_with(&crasher_uid))
        .collect();
    for line in &before {
        assert!(
            now.contains(line),
            "{line} changed over the outage; now {now:?}"
        );
    }
    let crashes_after = c.eventually(
        Duration::from_secs(30),
        &[
            "get",
            "pod",
            "crasher",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        |n| n.parse::<i64>().unwrap_or(0) > crashes_before,
    );
    println!("crasher restarts: {crashes_before} before the outage, {crashes_after} after");

    // Upgrade: the binary is swapped atomically and the edgelet restarts into it (same
    // process), its pods untouched.
    let new = c.dir().join("edgelet-new");
    std::fs::copy(minik8s_conformance::node::bin("edgelet"), &new).unwrap();
    let inode = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().ino()
    };
    let old_inode = inode(&a.edgelet_bin());
    let pid = a.pid();
    let before = containers_on(&c, "edge-a");
    let up = a.edgectl(&[
        "upgrade",
        "--component",
        "edgelet",
        "--from",
        &new.display().to_string(),
    ]);
    assert!(up.ok, "{}\n{}", up.stdout, up.stderr);
    assert!(up.stdout.contains("restarting"), "{}", up.stdout);
    assert_ne!(
        inode(&a.edgelet_bin()),
        old_inode,
        "the binary was not swapped"
    );
    std::thread::sleep(Duration::from_secs(3));
    let v = a.edgectl(&["version"]);
    assert!(v.ok, "{}", v.stderr);
    assert!(
        v.stdout.contains("edgelet: v") && v.stdout.contains("cloud:   v"),
        "{}",
        v.stdout
    );
    assert_eq!(a.pid(), pid);
    assert!(a.log().matches("edgelet started").count() >= 2);
    c.node_condition("edge-a", "Ready", "True", Duration::from_secs(30));
    let after = containers_on(&c, "edge-a");
    for line in before.iter().filter(|l| !l.starts_with(&crasher_uid)) {
        assert!(
            after.contains(line),
            "{line} changed over the upgrade; now {after:?}"
        );
    }

    // Reset: the Node goes, the containers keep running.
    let web_b = web_processes("edge-b");
    assert!(web_b >= 1);
    let r = b.edgectl(&["reset"]);
    assert!(r.ok, "{}", r.stderr);
    assert!(r.stdout.contains("keep running"), "{}", r.stdout);
    c.eventually(
        Duration::from_secs(30),
        &["get", "nodes", "-o", "name"],
        |o| !o.contains("node/edge-b"),
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(web_processes("edge-b"), web_b, "reset stopped containers");
    let st = b.edgectl(&["status"]);
    assert!(st.stdout.contains("not joined"), "{}", st.stdout);
}

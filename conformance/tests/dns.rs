//! The cluster DNS on a real node, as pods and the node use it: Services by short and full
//! names, headless Services following readiness, SRV for named ports, ExternalName, pod
//! records, PTR, the pod's resolv.conf and hosts file, malformed queries, and answers while
//! the apiserver is stopped.

use minik8s_conformance::Cluster;
use std::process::Command;

/// busybox's nslookup on the node, against `server`.
fn host_lookup(args: &[&str], server: &str) -> String {
    let out = Command::new("busybox")
        .arg("nslookup")
        .args(args)
        .arg(server)
        .output()
        .expect("busybox runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn exec(c: &Cluster, pod: &str, cmd: &[&str]) -> String {
    let mut args = vec!["exec", pod, "--"];
    args.extend(cmd);
    let r = c.kubectl(&args);
    format!("{}{}", r.stdout, r.stderr)
}

const APPS: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: busybox
        command: [sh, -c, 'mkdir -p /www && echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www']
        ports: [{name: http, containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: db}
spec:
  clusterIP: None
  selector: {app: db}
  ports: [{name: pg, port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  type: ExternalName
  externalName: web.default.svc.cluster.local
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, labels: {app: db}}
spec:
  hostname: db-0
  subdomain: db
  terminationGracePeriodSeconds: 1
  containers:
  - name: db
    image: busybox
    command: [sh, -c, 'touch /tmp/ready; exec sleep 3600']
    readinessProbe: {exec: {command: [test, -f, /tmp/ready]}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, labels: {app: db}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: db
    image: busybox
    command: [sh, -c, 'touch /tmp/ready; exec sleep 3600']
    readinessProbe: {exec: {command: [test, -f, /tmp/ready]}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: busybox, command: [sleep, '3600']}
";

#[test]
fn cluster_dns_answers_pods_and_the_node_and_outlives_the_apiserver() {
    let mut c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("d1", 9);
    // The kube-dns Service on the conventional address, with this node's server behind it.
    let svc = c.ok(&[
        "get",
        "service",
        "kube-dns",
        "-n",
        "kube-system",
        "-o",
        "jsonpath={.spec.clusterIP} {.spec.ports[*].port}/{.spec.ports[*].protocol}",
    ]);
    assert_eq!(svc, "10.96.0.10 53 53/UDP TCP");
    c.eventually(
        &[
            "get",
            "endpointslices",
            "-n",
            "kube-system",
            "-l",
            "kubernetes.io/service-name=kube-dns",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[0]}",
        ],
        |a| a == "10.244.9.1",
    );

    let r = c.with_manifest(&["apply"], APPS);
    assert!(r.ok, "{}", r.stderr);
    for pod in ["client", "db-0", "db-1"] {
        c.eventually(
            &["get", "pod", pod, "-o", "jsonpath={.status.phase}"],
            |p| p == "Running",
        );
    }
    c.eventually(
        &[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
        |r| r == "1",
    );
    let web_ip = c.ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]);

    // The pod's resolver settings and hosts file, as upstream's kubelet writes them.
    let resolv = exec(&c, "client", &["cat", "/etc/resolv.conf"]);
    assert!(resolv.contains("nameserver 10.96.0.10"), "{resolv}");
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("options ndots:5"), "{resolv}");
    let client_ip = c.ok(&["get", "pod", "client", "-o", "jsonpath={.status.podIP}"]);
    let hosts = exec(&c, "client", &["cat", "/etc/hosts"]);
    assert!(hosts.contains(&format!("{client_ip}\tclient")), "{hosts}");
    let hosts = exec(&c, "db-0", &["cat", "/etc/hosts"]);
    assert!(
        hosts.contains("\tdb-0.db.default.svc.cluster.local\tdb-0"),
        "{hosts}"
    );

    // Services by short, namespaced and full name, from a pod (through 10.96.0.10) ...
    // (busybox's nslookup applies the search path only to names without a dot; wget resolves
    // through the C library, which follows resolv.conf's search path and ndots.)
    for name in ["web", "web.default.svc.cluster.local"] {
        let got = exec(&c, "client", &["nslookup", name]);
        assert!(got.contains(&web_ip), "nslookup {name}: {got}");
    }
    for name in ["web", "web.default", "web.default.svc.cluster.local"] {
        let url = format!("http://{name}/");
        let page = exec(&c, "client", &["wget", "-qO-", "-T", "5", &url]);
        assert!(page.contains("hello-from-web"), "wget {url}: {page}");
    }

    // A headless Service: its ready pods' IPs, each also under its own name.
    let ip = |p: &str| c.ok(&["get", "pod", p, "-o", "jsonpath={.status.podIP}"]);
    let (db0, db1) = (ip("db-0"), ip("db-1"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = exec(&c, "client", &["nslookup", "db.default.svc.cluster.local"]);
        if got.contains(&db0) && got.contains(&db1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "headless: {got}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let got = exec(
        &c,
        "client",
        &["nslookup", "db-0.db.default.svc.cluster.local"],
    );
    assert!(got.contains(&db0), "{got}");
    // SRV for a named port: one record per endpoint of a headless Service; the Service's own
    // name and port for a ClusterIP one.
    let got = exec(
        &c,
        "client",
        &[
            "nslookup",
            "-type=srv",
            "_pg._tcp.db.default.svc.cluster.local",
        ],
    );
    assert!(
        got.contains("db-0.db.default.svc.cluster.local") && got.contains("5432"),
        "{got}"
    );
    let got = exec(
        &c,
        "client",
        &[
            "nslookup",
            "-type=srv",
            "_http._tcp.web.default.svc.cluster.local",
        ],
    );
    assert!(
        got.contains("web.default.svc.cluster.local") && got.contains(" 80 "),
        "{got}"
    );
    // A pod that becomes unready leaves the headless answer.
    exec(&c, "db-1", &["rm", "/tmp/ready"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = exec(&c, "client", &["nslookup", "db.default.svc.cluster.local"]);
        if got.contains(&db0) && !got.contains(&db1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "unready pod still answered: {got}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    // ExternalName: a CNAME (to a cluster name here, followed in the same answer).
    let got = exec(&c, "client", &["nslookup", "ext.default.svc.cluster.local"]);
    assert!(
        got.contains("canonical name = web.default.svc.cluster.local"),
        "{got}"
    );
    assert!(got.contains(&web_ip), "{got}");
    // Pod records and PTR.
    let dashed = format!("{}.default.pod.cluster.local", client_ip.replace('.', "-"));
    let got = exec(&c, "client", &["nslookup", &dashed]);
    assert!(got.contains(&client_ip), "{got}");
    let got = exec(&c, "client", &["nslookup", &web_ip]);
    assert!(got.contains("web.default.svc.cluster.local"), "PTR: {got}");
    // Missing names: NXDOMAIN.
    let got = exec(
        &c,
        "client",
        &["nslookup", "nope.default.svc.cluster.local"],
    );
    assert!(got.contains("NXDOMAIN"), "{got}");

    // From the node too, over UDP and TCP (busybox asks over UDP; dig-like TCP through the
    // test's own client below).
    let got = host_lookup(&["web.default.svc.cluster.local"], "10.96.0.10");
    assert!(got.contains(&web_ip), "{got}");
    let tcp = tcp_query("10.244.9.1:53", "web.default.svc.cluster.local");
    assert!(tcp.contains(&web_ip), "TCP answer: {tcp}");
    // Malformed queries: FORMERR, and the server keeps answering.
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .unwrap();
    sock.send_to(&[0xbe, 0xef, 0x01, 0x00, 0xff, 0xff, 0x00], "10.244.9.1:53")
        .unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = sock.recv_from(&mut buf).expect("an answer to garbage");
    assert!(
        n >= 4 && buf[0] == 0xbe && buf[1] == 0xef && buf[3] & 0x0f == 1,
        "FORMERR: {:?}",
        &buf[..n]
    );

    // The apiserver stops: the node's DNS keeps answering from what it knows.
    c.stop_apiserver();
    let got = host_lookup(&["web.default.svc.cluster.local"], "10.96.0.10");
    assert!(got.contains(&web_ip), "with the apiserver stopped: {got}");
    let got = host_lookup(&["db-0.db.default.svc.cluster.local"], "10.244.9.1");
    assert!(got.contains(&db0), "{got}");

    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// One A query over TCP (length-prefixed, as RFC 1035 4.2.2): the answer's addresses.
fn tcp_query(server: &str, name: &str) -> String {
    use std::io::{Read, Write};
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend(label.as_bytes());
    }
    q.extend([0, 0, 1, 0, 1]);
    let mut s = std::net::TcpStream::connect(server).expect("TCP to the DNS server");
    s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .unwrap();
    s.write_all(&(q.len() as u16).to_be_bytes()).unwrap();
    s.write_all(&q).unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).unwrap();
    let mut answer = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut answer).unwrap();
    // The A records' data: every 4-byte RDATA after a type-A/class-IN/ttl/len=4 header.
    let mut out = Vec::new();
    for i in 0..=answer.len().saturating_sub(14) {
        if answer[i..i + 4] == [0, 1, 0, 1] && answer[i + 8..i + 10] == [0, 4] {
            let ip = &answer[i + 10..i + 14];
            out.push(format!("{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3]));
        }
    }
    if out.is_empty() {
        return format!("no A record in {answer:?}");
    }
    out.join(" ")
}

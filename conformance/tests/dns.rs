//! The cluster DNS and the node's router on a real node, as pods and the node use them:
//! Services by short and full names, headless Services following readiness, SRV for named
//! ports, ExternalName, pod records, PTR, the pod's resolv.conf and hosts file, malformed
//! queries; the seed's `DNS` object (host + paths to two ports of one Service) from the node
//! and from a pod, edited and deleted, with bad input; an Ingress with two hosts; and answers
//! while the apiserver is stopped.

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
    let node = c.run_routed_node("d1", 9);
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
    // And the legacy Endpoints, step one of upstream's DNS debugging guide.
    c.eventually(
        &[
            "get",
            "endpoints",
            "kube-dns",
            "-n",
            "kube-system",
            "--no-headers",
        ],
        |row| row.contains("10.244.9.1:53"),
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

    router(&c);

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

/// The seed's two-port Service: one pod serving `one` on 8080 and `two` on 8081.
const SEED_APP: &str = "apiVersion: v1
kind: Pod
metadata: {name: two-ports, labels: {app: two-ports}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: busybox
    command: [sh, -c, 'mkdir -p /a /b && echo page-one > /a/index.html && echo page-two > /b/index.html && mkdir -p /a/deep && echo deep-one > /a/deep/index.html && httpd -p 8081 -h /b && exec httpd -f -p 8080 -h /a']
---
apiVersion: v1
kind: Service
metadata: {name: svc}
spec:
  selector: {app: two-ports}
  ports:
  - {name: a, port: 80, targetPort: 8080}
  - {name: b, port: 8080, targetPort: 8081}
";

/// The seed's dns.yaml.
const SEED_DNS: &str = "apiVersion: networking.minik8s.io/v1alpha1
kind: DNS
metadata: {name: seed}
spec:
  host: minik8s.io
  subpaths:
  - {path: /test1, service: svc, port: 80}
  - {path: /test2, service: svc, port: 8080}
";

fn curl(url: &str, extra: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-s", "-m", "5", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (body.trim().to_owned(), code.to_owned())
}

fn hosts_block() -> String {
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    hosts
        .split_once("# BEGIN minik8s")
        .map(|(_, rest)| {
            rest.split("# END minik8s")
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default()
}

fn router(c: &Cluster) {
    let r = c.with_manifest(&["apply"], SEED_APP);
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &["get", "pod", "two-ports", "-o", "jsonpath={.status.phase}"],
        |p| p == "Running",
    );
    let r = c.with_manifest(&["apply"], SEED_DNS);
    assert!(r.ok, "{}", r.stderr);
    let listed = c.ok(&["get", "dns", "seed", "--no-headers"]);
    assert!(listed.contains("minik8s.io"), "{listed}");
    // The PATHS column (`.spec.subpaths[*].path`) shows the first path, as upstream's table
    // convertor prints a JSONPath's first result, in both the plain and the wide table.
    for wide in [&[][..], &["-o", "wide"][..]] {
        let mut args = vec!["get", "dns", "seed"];
        args.extend(wide);
        let table = c.ok(&args);
        let header = table.lines().next().unwrap_or_default();
        assert!(header.contains("PATHS"), "{table}");
        assert!(table.contains("/test1"), "{table}");
        assert!(!table.contains("<none>"), "{table}");
    }
    // status.backends and Ready.
    c.eventually(
        &[
            "get",
            "dns",
            "seed",
            "-o",
            "jsonpath={.status.conditions[0].status}",
        ],
        |s| s == "True",
    );
    let svc_ip = c.ok(&["get", "service", "svc", "-o", "jsonpath={.spec.clusterIP}"]);
    let backends = c.ok(&["get", "dns", "seed", "-o", "jsonpath={.status.backends}"]);
    let backends: serde_json::Value = serde_json::from_str(&backends).unwrap();
    assert_eq!(
        backends,
        serde_json::json!([
            {"path": "/test1", "service": "svc", "port": 80, "clusterIP": svc_ip},
            {"path": "/test2", "service": "svc", "port": 8080, "clusterIP": svc_ip},
        ])
    );
    // From the node: the managed hosts block names the host, and the router answers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !hosts_block().contains("minik8s.io") {
        assert!(
            std::time::Instant::now() < deadline,
            "no hosts entry: {}",
            hosts_block()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (body, _) = curl("http://minik8s.io/test1", &[]);
        if body == "page-one" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "curl /test1: {body}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(curl("http://minik8s.io/test2", &[]).0, "page-two");
    // The prefix is stripped: /test1/deep/ is the pod's /deep/.
    assert_eq!(curl("http://minik8s.io/test1/deep/", &[]).0, "deep-one");
    // From a pod: the cluster DNS answers the host with the node's address.
    let page = exec(
        c,
        "client",
        &["wget", "-qO-", "-T", "5", "http://minik8s.io/test2"],
    );
    assert_eq!(page.trim(), "page-two");

    // Editing moves a path within a second.
    let moved = SEED_DNS.replace(
        "{path: /test2, service: svc, port: 8080}",
        "{path: /test2, service: svc, port: 80}",
    );
    let r = c.with_manifest(&["apply"], &moved);
    assert!(r.ok, "{}", r.stderr);
    let edited = std::time::Instant::now();
    loop {
        if curl("http://minik8s.io/test2", &[]).0 == "page-one" {
            break;
        }
        assert!(
            edited.elapsed() < std::time::Duration::from_secs(1),
            "the edit took over 1 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!("route moved in {:?}", edited.elapsed());

    // A path to a missing Service: 503 naming it, Ready=False; the other paths keep working.
    let broken = format!("{moved}  - {{path: /gone, service: nope, port: 80}}\n");
    let r = c.with_manifest(&["apply"], &broken);
    assert!(r.ok, "{}", r.stderr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (body, code) = curl("http://minik8s.io/gone", &[]);
        if code == "503" {
            assert_eq!(body, "service default/nope not found");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "/gone: {code} {body}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(curl("http://minik8s.io/test1", &[]).0, "page-one");
    c.eventually(
        &[
            "get",
            "dns",
            "seed",
            "-o",
            "jsonpath={.status.conditions[0].reason}: {.status.conditions[0].message}",
        ],
        |s| s == "BackendNotFound: /gone: service default/nope not found",
    );
    // Bad input is refused whole.
    let bad_path = SEED_DNS
        .replace("path: /test1", "path: test1")
        .replace("name: seed", "name: bad1");
    let r = c.with_manifest(&["apply"], &bad_path);
    assert!(
        !r.ok && r.stderr.contains("subpaths[0].path"),
        "{}",
        r.stderr
    );
    let duplicate = SEED_DNS
        .replace("path: /test2", "path: /test1")
        .replace("name: seed", "name: bad2");
    let r = c.with_manifest(&["create"], &duplicate);
    assert!(
        !r.ok && r.stderr.to_lowercase().contains("duplicate"),
        "{}",
        r.stderr
    );

    // The same host and path in a second object: the first keeps it; the second says why.
    let other = SEED_DNS.replace("name: seed", "name: other").replace(
        "{path: /test2, service: svc, port: 8080}",
        "{path: /mine, service: svc, port: 8080}",
    );
    let r = c.with_manifest(&["apply"], &other);
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &[
            "get",
            "dns",
            "other",
            "-o",
            "jsonpath={.status.conditions[0].reason}: {.status.conditions[0].message}",
        ],
        |s| s == "DuplicatePath: /test1: minik8s.io/test1 is already routed by default/seed",
    );
    assert_eq!(curl("http://minik8s.io/test1", &[]).0, "page-one");
    assert_eq!(curl("http://minik8s.io/mine", &[]).0, "page-two");
    c.ok(&["delete", "dns", "other"]);

    // An Ingress with two hosts through the same router, one of them over TLS with a
    // certificate from a Secret.
    let dir = c.dir().to_path_buf();
    let (crt, key) = (dir.join("a.crt"), dir.join("a.key"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
        ])
        .args([
            "-subj",
            "/CN=a.minik8s.test",
            "-addext",
            "subjectAltName=DNS:a.minik8s.test",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    c.ok(&[
        "create",
        "secret",
        "tls",
        "a-tls",
        &format!("--cert={}", crt.display()),
        &format!("--key={}", key.display()),
    ]);
    let ingress = "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: two-hosts}
spec:
  tls: [{hosts: [a.minik8s.test], secretName: a-tls}]
  rules:
  - host: a.minik8s.test
    http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: svc, port: {number: 80}}}}]
  - host: b.minik8s.test
    http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: svc, port: {name: b}}}}]
";
    let r = c.with_manifest(&["apply"], ingress);
    assert!(r.ok, "{}", r.stderr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if curl("http://a.minik8s.test/", &[]).0 == "page-one"
            && curl("http://b.minik8s.test/", &[]).0 == "page-two"
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ingress: {}",
            hosts_block()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let cacert = crt.display().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (body, code) = curl("https://a.minik8s.test/", &["--cacert", &cacert]);
        if body == "page-one" {
            break;
        }
        if std::time::Instant::now() >= deadline {
            let v = Command::new("curl")
                .args([
                    "-sv",
                    "-m",
                    "5",
                    "--cacert",
                    &cacert,
                    "https://a.minik8s.test/",
                ])
                .output()
                .expect("curl");
            panic!(
                "https: {code} {body}: {}",
                String::from_utf8_lossy(&v.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let node_ip = c.block_on(minik8s_kubelet::node::default_ip());
    c.eventually(
        &[
            "get",
            "ingress",
            "two-hosts",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[0].ip}",
        ],
        |ip| ip == node_ip,
    );
    let class = c.ok(&[
        "get",
        "ingressclass",
        "minik8s",
        "-o",
        "jsonpath={.metadata.annotations}",
    ]);
    assert!(class.contains("is-default-class"), "{class}");

    // Ingresses that are not the router's are left alone, as upstream's controllers leave
    // them: one of another class, and one without a class while the router's class is not the
    // default. They are not routed and their status is not written (a client updating it must
    // not meet the router's writes).
    let lb = |name: &str| {
        c.ok(&[
            "get",
            "ingress",
            name,
            "-o",
            "jsonpath={.status.loadBalancer.ingress[*].ip}",
        ])
    };
    let other = |name: &str, class: &str, host: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {{name: {name}}}
spec:
  {class}
  rules:
  - host: {host}
    http:
      paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: svc, port: {{number: 80}}}}}}}}]
"
        )
    };
    let mark = "ingressclass.kubernetes.io/is-default-class";
    c.ok(&["annotate", "ingressclass", "minik8s", &format!("{mark}-")]);
    for (name, class, host) in [
        ("other-class", "ingressClassName: other", "c.minik8s.test"),
        ("no-class", "# no class", "d.minik8s.test"),
    ] {
        let r = c.with_manifest(&["apply"], &other(name, class, host));
        assert!(r.ok, "{}", r.stderr);
    }
    // The router's own Ingress above had its address within seconds.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(
        lb("other-class"),
        "",
        "an Ingress of another class got a status"
    );
    assert_eq!(
        lb("no-class"),
        "",
        "a class-less Ingress got a status while minik8s is not the default class"
    );
    let block = hosts_block();
    assert!(
        !block.contains("c.minik8s.test") && !block.contains("d.minik8s.test"),
        "{block}"
    );
    // With the mark back, the class-less Ingress is the router's; the other class's still is not.
    c.ok(&[
        "annotate",
        "--overwrite",
        "ingressclass",
        "minik8s",
        &format!("{mark}=true"),
    ]);
    c.eventually(
        &[
            "get",
            "ingress",
            "no-class",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[*].ip}",
        ],
        |ip| ip == node_ip,
    );
    assert_eq!(lb("other-class"), "");
    c.ok(&["delete", "ingress", "other-class", "no-class"]);

    // Deleting the DNS object removes its hosts entry and its routes.
    c.ok(&["delete", "dns", "seed"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while hosts_block().contains("minik8s.io\n") || hosts_block().contains("minik8s.io ") {
        assert!(
            std::time::Instant::now() < deadline,
            "hosts entry kept: {}",
            hosts_block()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (_, code) = curl(
        "http://minik8s.io/test1",
        &["--resolve", &format!("minik8s.io:80:{node_ip}")],
    );
    assert_eq!(code, "404");
}

//! Knative Serving's API on a real node, as Knative users drive it with stock kubectl: the
//! getting-started Service applied unchanged (twice), Ready with the columns `kn` users know,
//! its URL answering through the node's router from the host and from a pod (and the
//! cluster-local name), an update making `hello-00002`, a 50/50 split answering from both,
//! a tag's URL reaching its revision, a rollback by traffic, and deletion taking everything
//! it made with it.

use minik8s_conformance::Cluster;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Knative's getting-started Service, as its documentation gives it.
const HELLO: &str = r#"apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: hello
spec:
  template:
    spec:
      containers:
        - image: ghcr.io/knative/helloworld-go:latest
          ports:
            - containerPort: 8080
          env:
            - name: TARGET
              value: "World"
"#;

/// A GET of `path` at `addr` (port 80 of the node: its router) for `host`: code and body.
fn get(addr: &str, host: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("the router answers");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    // A chunked answer: the chunks' data only.
    let body = if out
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut data = String::new();
        let mut rest = body.as_str();
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            data.push_str(&after[..n]);
            rest = after[n..].trim_start_matches("\r\n");
        }
        data
    } else {
        body
    };
    (code, body)
}

/// Calls `host` until it answers 200 with `want` (through a cold start, a route change).
fn answers(addr: &str, host: &str, want: &str) -> Duration {
    let started = Instant::now();
    loop {
        let (code, body) = get(addr, host, "/");
        if code == 200 && body == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{host} never answered {want:?}: last {code} {body:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn apply(c: &Cluster, manifest: &str) {
    let r = c.kubectl_stdin(&["apply", "-f", "-"], Some(manifest));
    assert!(r.ok, "{}", r.stderr);
}

fn field(c: &Cluster, kind: &str, name: &str, path: &str) -> String {
    c.ok(&["get", kind, name, "-o", &format!("jsonpath={{{path}}}")])
}

fn until(c: &Cluster, kind: &str, name: &str, path: &str, done: impl Fn(&str) -> bool) -> String {
    c.eventually(
        &["get", kind, name, "-o", &format!("jsonpath={{{path}}}")],
        done,
    )
}

/// The Service with `traffic` (YAML lines under `spec:`) and TARGET `target`.
fn hello(target: &str, traffic: &str) -> String {
    let mut s = HELLO.replace("value: \"World\"", &format!("value: \"{target}\""));
    if !traffic.is_empty() {
        s.push_str("  traffic:\n");
        s.push_str(traffic);
    }
    s
}

/// A server on `$PORT` that answers each GET after 300 ms with its pod's name and the most
/// requests it ever served at once.
const COUNTING: &str = r#"
import http.server, json, os, threading, time
lock = threading.Lock()
now = most = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global now, most
        with lock:
            now += 1
            most = max(most, now)
        time.sleep(0.3)
        with lock:
            seen = most
            now -= 1
        body = json.dumps({"pod": os.environ.get("HOSTNAME", ""), "most": seen}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("", int(os.environ["PORT"])), H).serve_forever()
"#;

/// Scale from zero with 20 requests held and all answered, `containerConcurrency: 1` kept by
/// every pod, `max-scale` kept, and back to zero after the window.
fn scale_from_zero(c: &Cluster, router: &str) {
    let manifest = slow(
        "        autoscaling.knative.dev/max-scale: \"3\"\n        autoscaling.knative.dev/window: \"6s\"\n",
        "      containerConcurrency: 1\n",
    );
    apply(c, &manifest);
    until(
        c,
        "ksvc",
        "slow",
        ".status.conditions[?(@.type==\"Ready\")].status",
        |s| s == "True",
    );
    // Idle for the window: no pods.
    let zero = Instant::now();
    c.eventually_within(
        Duration::from_secs(120),
        &[
            "get",
            "rev",
            "slow-00001",
            "-o",
            "jsonpath={.status.desiredReplicas} {.status.actualReplicas}",
        ],
        |r| r == "0 0",
    );
    c.eventually_within(
        Duration::from_secs(60),
        &[
            "get",
            "pods",
            "-l",
            "serving.knative.dev/configuration=slow",
            "-o",
            "name",
        ],
        |o| o.trim().is_empty(),
    );
    println!("slow-00001 at zero {:?} after Ready", zero.elapsed());
    let active = field(
        c,
        "rev",
        "slow-00001",
        ".status.conditions[?(@.type==\"Active\")].reason",
    );
    assert_eq!(active, "NoTraffic");

    // 20 at once from zero: held while pods start, every one answered, one at a time per pod.
    let started = Instant::now();
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..20)
            .map(|_| s.spawn(|| get(router, "slow.default.example.com", "/")))
            .collect();
        calls.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!("20 requests from zero answered in {:?}", started.elapsed());
    let mut pods = std::collections::BTreeSet::new();
    for (code, body) in &answers {
        assert_eq!(*code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            v["most"], 1,
            "a pod served two requests at once: {answers:?}"
        );
        pods.insert(v["pod"].as_str().unwrap_or_default().to_owned());
    }
    assert!(!pods.is_empty() && pods.len() <= 3, "{pods:?}");

    // And back to zero once idle for the window.
    c.eventually_within(
        Duration::from_secs(120),
        &[
            "get",
            "rev",
            "slow-00001",
            "-o",
            "jsonpath={.status.desiredReplicas}",
        ],
        |r| r == "0",
    );
}

/// A revision named by its template (`spec.template.metadata.name`, Knative's "bring your own
/// name"): made under that name; the same name on a changed pod spec fails the Configuration
/// in Knative's words and keeps serving the old one; a name without the Service's prefix is
/// refused; a template without a name goes on with the next number.
fn named_revisions(c: &Cluster, router: &str) {
    let named = |target: &str, name: &str| {
        hello(target, "").replace(
            "  template:\n",
            &format!("  template:\n    metadata:\n      name: {name}\n"),
        )
    };
    apply(c, &named("BYO", "hello-v3"));
    until(c, "ksvc", "hello", ".status.latestReadyRevisionName", |r| {
        r == "hello-v3"
    });
    answers(router, "hello.default.example.com", "Hello BYO!\n");
    let listed = c.ok(&["get", "rev", "-o", "name"]);
    assert!(
        listed.contains("revision.serving.knative.dev/hello-v3"),
        "{listed}"
    );

    apply(c, &named("Again", "hello-v3"));
    let why = c.eventually(
        &[
            "get",
            "ksvc",
            "hello",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"ConfigurationsReady\")].reason} {.status.conditions[?(@.type==\"ConfigurationsReady\")].message}",
        ],
        |s| s.starts_with("RevisionFailed"),
    );
    assert_eq!(
        why,
        "RevisionFailed Revision creation failed with message: revisions.serving.knative.dev \"hello-v3\" already exists."
    );
    assert_eq!(
        field(c, "ksvc", "hello", ".status.latestCreatedRevisionName"),
        "hello-v3"
    );
    assert_eq!(
        get(router, "hello.default.example.com", "/"),
        (200, "Hello BYO!\n".to_owned())
    );

    let r = c.kubectl_stdin(&["apply", "-f", "-"], Some(&named("X", "other-v1")));
    assert!(
        !r.ok
            && r.stderr.contains(
                "invalid value: \"other-v1\" must have prefix \"hello-\": spec.template.metadata.name"
            ),
        "{}",
        r.stderr
    );

    apply(c, &hello("Numbered", ""));
    until(c, "ksvc", "hello", ".status.latestReadyRevisionName", |r| {
        r == "hello-00003"
    });
    answers(router, "hello.default.example.com", "Hello Numbered!\n");
    let ready = field(
        c,
        "ksvc",
        "hello",
        ".status.conditions[?(@.type==\"Ready\")].status",
    );
    assert_eq!(ready, "True");
}

/// The `slow` Service (the COUNTING server) with the template's `annotations` and `spec`
/// lines before its containers (YAML, indented as they go).
fn slow(annotations: &str, spec: &str) -> String {
    let script = COUNTING.replace('\n', "\n              ");
    format!(
        r#"apiVersion: serving.knative.dev/v1
kind: Service
metadata:
  name: slow
spec:
  template:
    metadata:
      annotations:
{annotations}    spec:
{spec}      containers:
        - image: {image}
          command: ["/usr/bin/python3.11", "-u", "-c"]
          args:
            - |{script}
"#,
        image = minik8s_serverless::runtime::python_image(),
    )
}

/// The `slow` Service again with these annotations and no `containerConcurrency`; waits until
/// revision `revision` is Ready.
fn slow_with(c: &Cluster, annotations: &str, revision: &str) {
    let manifest = slow(annotations, "");
    apply(c, &manifest);
    until(c, "ksvc", "slow", ".status.latestReadyRevisionName", |r| {
        r == revision
    });
}

/// Knative's KPA beyond concurrency one: `containerConcurrency: 0` lets a pod take every
/// request at once (the target is an aim, not a limit), and the `rps` metric scales on
/// requests a second, a burst panicking it up before the stable window has seen it.
fn unlimited_and_rps(c: &Cluster, router: &str) {
    // No hard limit, a target of 2 and one pod at most: that pod takes all 20 at once.
    slow_with(
        c,
        "        autoscaling.knative.dev/max-scale: \"1\"\n        autoscaling.knative.dev/target: \"2\"\n        autoscaling.knative.dev/window: \"6s\"\n",
        "slow-00002",
    );
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..20)
            .map(|_| s.spawn(|| get(router, "slow.default.example.com", "/")))
            .collect();
        calls.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let most = answers
        .iter()
        .map(|(code, body)| {
            assert_eq!(*code, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            v["most"].as_i64().unwrap_or_default()
        })
        .max()
        .unwrap_or_default();
    assert!(
        most >= 10,
        "with containerConcurrency 0 one pod served at most {most} at once: {answers:?}"
    );
    println!("containerConcurrency 0: one pod served {most} requests at once");

    // Requests a second, 5 a pod aimed at (70 %: 3.5): a steady 20 a second from one pod
    // asks for six, capped at three, within the panic window.
    slow_with(
        c,
        "        autoscaling.knative.dev/metric: rps\n        autoscaling.knative.dev/target: \"5\"\n        autoscaling.knative.dev/max-scale: \"3\"\n        autoscaling.knative.dev/min-scale: \"1\"\n        autoscaling.knative.dev/window: \"10s\"\n",
        "slow-00003",
    );
    // The gateway's metrics show the autoscaler's state, as Knative's do.
    let url = field(c, "fn", "slow", ".status.url");
    let gateway = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let panic_mode = || {
        let (_, metrics) = get(&gateway, &gateway, "/metrics");
        metrics
            .lines()
            .find(|l| {
                l.starts_with("minik8s_function_panic_mode")
                    && l.contains("revision=\"slow-00003\"")
            })
            .map(|l| l.ends_with(" 1"))
    };
    assert_eq!(panic_mode(), Some(false), "before the load");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    let (panicked, scaled) = std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let (code, body) = get(router, "slow.default.example.com", "/");
                    assert_eq!(code, 200, "{body}");
                }
            });
        }
        let mut panicked = None;
        while panicked.is_none() && started.elapsed() < Duration::from_secs(20) {
            if panic_mode() == Some(true) {
                panicked = Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        c.eventually_within(
            Duration::from_secs(30),
            &[
                "get",
                "rev",
                "slow-00003",
                "-o",
                "jsonpath={.status.desiredReplicas}",
            ],
            |r| r == "3",
        );
        let scaled = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (panicked, scaled)
    });
    let panicked = panicked.expect("a burst of 20 a second on one pod never set panic mode");
    println!("rps metric: panic mode {panicked:?} and 3 pods {scaled:?} into a 20 rps load");
    // minScale 1 while routed; back down to it once quiet.
    c.eventually_within(
        Duration::from_secs(90),
        &[
            "get",
            "rev",
            "slow-00003",
            "-o",
            "jsonpath={.status.desiredReplicas}",
        ],
        |r| r == "1",
    );
}

/// Runs Knative's client, `kn` (built from Go modules by `hack/upstream.sh kn`), against the
/// cluster; panics with its output unless it succeeds.
fn kn_ok(c: &Cluster, args: &[&str]) -> String {
    let out = std::process::Command::new(minik8s_conformance::upstream_bin("kn"))
        .args(args)
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .output()
        .expect("kn runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kn {args:?}: {text}");
    text
}

/// `kn service create/update/list/describe/delete` and `kn revision list`, as Knative's
/// getting-started drives them.
fn kn(c: &Cluster, router: &str) {
    let created = kn_ok(
        c,
        &[
            "service",
            "create",
            "greeter",
            "--image",
            "ghcr.io/knative/helloworld-go:latest",
            "--port",
            "8080",
            "--env",
            "TARGET=kn",
        ],
    );
    assert!(
        created.contains("http://greeter.default.example.com"),
        "{created}"
    );
    answers(router, "greeter.default.example.com", "Hello kn!\n");
    let listed = kn_ok(c, &["service", "list"]);
    let row = listed
        .lines()
        .find(|l| l.starts_with("greeter "))
        .unwrap_or_default();
    assert!(
        row.contains("http://greeter.default.example.com") && row.contains("True"),
        "{listed}"
    );
    let updated = kn_ok(
        c,
        &["service", "update", "greeter", "--env", "TARGET=update"],
    );
    assert!(updated.contains("greeter-00002"), "{updated}");
    answers(router, "greeter.default.example.com", "Hello update!\n");
    let revisions = kn_ok(c, &["revision", "list"]);
    let names: Vec<&str> = revisions
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with("greeter-"))
        .collect();
    assert_eq!(names, ["greeter-00002", "greeter-00001"], "{revisions}");
    let described = kn_ok(c, &["service", "describe", "greeter"]);
    assert!(
        described.contains("greeter-00002") && described.contains("100%"),
        "{described}"
    );
    let deleted = kn_ok(c, &["service", "delete", "greeter"]);
    assert!(deleted.contains("successfully deleted"), "{deleted}");
}

#[test]
fn knative_hello_world_serves_updates_splits_tags_rolls_back_and_goes() {
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_routed_node("kn1", 11);
    let _functions = c.run_functions();
    let ip = c.block_on(minik8s_kubelet::node::default_ip());
    let router = format!("{ip}:80");

    // The getting-started manifest, applied twice: the second is unchanged.
    let file = c.dir().join("hello.yaml");
    std::fs::write(&file, HELLO).unwrap();
    let path = file.display().to_string();
    let first = c.ok(&["apply", "-f", &path]);
    assert!(
        first.contains("service.serving.knative.dev/hello created"),
        "{first}"
    );
    let again = c.ok(&["apply", "-f", &path]);
    assert!(again.contains("unchanged"), "{again}");

    until(
        &c,
        "ksvc",
        "hello",
        ".status.conditions[?(@.type==\"Ready\")].status",
        |s| s == "True",
    );
    let table = c.ok(&["get", "ksvc"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "URL",
            "LATESTCREATED",
            "LATESTREADY",
            "READY",
            "REASON"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row,
        [
            "hello",
            "http://hello.default.example.com",
            "hello-00001",
            "hello-00001",
            "True",
            "<none>"
        ],
        "{table}"
    );
    // What the Service made, by Knative's names.
    assert_eq!(
        field(
            &c,
            "configuration",
            "hello",
            ".status.latestReadyRevisionName"
        ),
        "hello-00001"
    );
    assert_eq!(
        field(&c, "route", "hello", ".status.url"),
        "http://hello.default.example.com"
    );
    assert_eq!(
        field(&c, "route", "hello", ".status.address.url"),
        "http://hello.default.svc.cluster.local"
    );
    let rev = c.ok(&["get", "rev"]);
    assert!(rev.lines().next().unwrap().contains("CONFIG NAME"), "{rev}");
    assert!(
        rev.lines()
            .any(|l| l.starts_with("hello-00001") && l.contains(" hello ") && l.contains("True")),
        "{rev}"
    );

    // Its URL answers from the host, through the node's router (the router lists its hosts
    // in the machine's hosts file, so the URL is used as it is).
    let cold = answers(&router, "hello.default.example.com", "Hello World!\n");
    println!("hello-00001 answered through the router after {cold:?}");
    let curl = std::process::Command::new("curl")
        .args(["-s", "--max-time", "30", "http://hello.default.example.com"])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "Hello World!\n");
    // Idle, nothing is rewritten: the reconcilers' applies that change nothing are not
    // written (two appliers on one Function once rewrote it hundreds of times a second).
    let mut versions = std::collections::BTreeSet::new();
    for _ in 0..10 {
        versions.insert(field(&c, "fn", "hello", ".metadata.resourceVersion"));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        versions.len() <= 3,
        "the idle Function was rewritten: {versions:?}"
    );

    // The gateway's path form, in the status's annotations, answers too.
    let gateway_url = field(
        &c,
        "ksvc",
        "hello",
        ".status.annotations.serverless\\.minik8s\\.io/gateway-url",
    );
    assert!(
        gateway_url.starts_with("http://") && gateway_url.ends_with("/function/default/hello"),
        "{gateway_url}"
    );
    let curl = std::process::Command::new("curl")
        .args(["-s", "--max-time", "30", &gateway_url])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "Hello World!\n");

    // And from a pod: the domain's name (the cluster DNS names the router) and the
    // cluster-local name (the Route's Service leads to the gateway).
    c.with_manifest(
        &["apply"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: caller}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    imagePullPolicy: IfNotPresent\n    command: [sleep, '3600']\n",
    );
    until(&c, "pod", "caller", ".status.phase", |p| p == "Running");
    for url in [
        "http://hello.default.example.com",
        "http://hello.default.svc.cluster.local",
        "http://hello.default",
    ] {
        let out = c.eventually(
            &["exec", "caller", "--", "wget", "-qO-", "-T", "30", url],
            |o| o.contains("Hello World!"),
        );
        assert_eq!(out.trim(), "Hello World!", "{url}");
    }

    // An update makes hello-00002, which takes all traffic once Ready.
    apply(&c, &hello("Knative", ""));
    until(
        &c,
        "ksvc",
        "hello",
        ".status.latestReadyRevisionName",
        |r| r == "hello-00002",
    );
    // The Route follows the Configuration (the Service shows both as they come).
    until(
        &c,
        "ksvc",
        "hello",
        ".status.traffic[0].revisionName",
        |r| r == "hello-00002",
    );
    answers(&router, "hello.default.example.com", "Hello Knative!\n");
    let traffic = field(&c, "ksvc", "hello", ".status.traffic");
    let traffic: serde_json::Value = serde_json::from_str(&traffic).unwrap();
    assert_eq!(
        traffic,
        serde_json::json!([{"revisionName": "hello-00002", "latestRevision": true, "percent": 100}])
    );
    let events = c.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=Configuration,involvedObject.name=hello",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ]);
    assert!(
        events.contains("RevisionCreated: Created Revision \"hello-00002\""),
        "{events}"
    );

    // 50/50 between the two: both answer.
    let split = "  - revisionName: hello-00001\n    percent: 50\n  - latestRevision: true\n    percent: 50\n";
    apply(&c, &hello("Knative", split));
    until(&c, "route", "hello", ".status.traffic[*].percent", |p| {
        p == "50 50"
    });
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..60 {
        let (code, body) = get(&router, "hello.default.example.com", "/");
        assert_eq!(code, 200, "{body}");
        *seen.entry(body).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.values().all(|n| *n >= 10), "{seen:?}");

    // A tag reaches its revision at its own URL, whatever its share.
    let tagged = "  - revisionName: hello-00001\n    percent: 0\n    tag: old\n  - latestRevision: true\n    percent: 100\n";
    apply(&c, &hello("Knative", tagged));
    let urls = until(&c, "ksvc", "hello", ".status.traffic[*].url", |u| {
        u.contains("http://old-hello.default.example.com")
    });
    assert_eq!(urls, "http://old-hello.default.example.com");
    answers(&router, "old-hello.default.example.com", "Hello World!\n");
    answers(&router, "hello.default.example.com", "Hello Knative!\n");
    let describe = c.ok(&["describe", "ksvc", "hello"]);
    assert!(
        describe.contains("RoutesReady") && describe.contains("ConfigurationsReady"),
        "{describe}"
    );

    // Rollback by traffic: everything to hello-00001 again.
    let back = "  - revisionName: hello-00001\n    percent: 100\n";
    apply(&c, &hello("Knative", back));
    until(
        &c,
        "route",
        "hello",
        ".status.traffic[0].revisionName",
        |r| r == "hello-00001",
    );
    // The gateway follows the Function's traffic within moments; then every call is v1's.
    answers(&router, "hello.default.example.com", "Hello World!\n");
    for _ in 0..10 {
        assert_eq!(
            get(&router, "hello.default.example.com", "/"),
            (200, "Hello World!\n".to_owned())
        );
    }

    // What Knative's webhook refuses is refused here too (422, naming the field), and the
    // Service stays as it was.
    let generation = field(&c, "ksvc", "hello", ".metadata.generation");
    let refused = |manifest: &str, want: &str| {
        let r = c.kubectl_stdin(&["apply", "-f", "-"], Some(manifest));
        assert!(!r.ok, "applied: {}", r.stdout);
        assert!(
            r.stderr.contains("is invalid") && r.stderr.contains(want),
            "{}",
            r.stderr
        );
    };
    refused(
        &hello(
            "Knative",
            "  - revisionName: hello-00001\n    percent: 50\n  - latestRevision: true\n    percent: 40\n",
        ),
        "spec.traffic: Invalid value: \"object\": Traffic targets sum to 90, want 100",
    );
    refused(
        &hello(
            "Knative",
            "  - revisionName: hello-00001\n    percent: 50\n    tag: a\n  - latestRevision: true\n    percent: 50\n    tag: a\n",
        ),
        "spec.traffic: Invalid value: \"object\": Multiple definitions for \"a\"",
    );
    refused(
        &hello(
            "Knative",
            "  - revisionName: hello-00001\n    latestRevision: true\n    percent: 100\n",
        ),
        "may not set revisionName \"hello-00001\" when latestRevision is true",
    );
    refused(
        "apiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: hello}\nspec:\n  template:\n    spec:\n      containers: []\n",
        "missing field(s): containers",
    );
    let annotated = |annotations: &str| {
        HELLO.replace(
            "  template:\n",
            &format!("  template:\n    metadata:\n      annotations:\n{annotations}"),
        )
    };
    refused(
        &annotated("        autoscaling.knative.dev/min-scale: \"-1\"\n"),
        "spec.template.metadata.annotations: Invalid value: \"object\": expected 0 <= -1 <= 2147483647: autoscaling.knative.dev/min-scale",
    );
    refused(
        &annotated(
            "        autoscaling.knative.dev/min-scale: \"3\"\n        autoscaling.knative.dev/max-scale: \"2\"\n",
        ),
        "max-scale=2 is less than min-scale=3: autoscaling.knative.dev/max-scale, autoscaling.knative.dev/min-scale",
    );
    refused(
        &annotated("        autoscaling.knative.dev/metric: cpu\n"),
        "invalid value: cpu: autoscaling.knative.dev/metric",
    );
    refused(
        &annotated("        autoscaling.knative.dev/window: 2s\n"),
        "expected 6s <= 2s <= 1h0m0s: autoscaling.knative.dev/window",
    );
    refused(
        &annotated("        autoscaling.knative.dev/target-utilization-percentage: \"200\"\n"),
        "expected 1 <= 200 <= 100: autoscaling.knative.dev/target-utilization-percentage",
    );
    assert_eq!(
        field(&c, "ksvc", "hello", ".metadata.generation"),
        generation
    );
    // A Revision is immutable.
    let edit = c.kubectl(&[
        "patch",
        "rev",
        "hello-00001",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"containerConcurrency":5}}"#,
    ]);
    assert!(
        !edit.ok && edit.stderr.contains("Immutable fields changed"),
        "{} {}",
        edit.stdout,
        edit.stderr
    );

    named_revisions(&c, &router);
    scale_from_zero(&c, &router);
    unlimited_and_rps(&c, &router);
    kn(&c, &router);

    // Deleting the Service takes what it made with it.
    c.ok(&["delete", "ksvc", "hello"]);
    c.ok(&["delete", "ksvc", "slow"]);
    for kind in ["configuration", "route", "revision", "fn"] {
        c.eventually(&["get", kind, "-o", "name"], |o| o.trim().is_empty());
    }
    c.eventually(&["get", "deployments", "-o", "name"], |o| {
        o.trim().is_empty()
    });
    drop(node);
}

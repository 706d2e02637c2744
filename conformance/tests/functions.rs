//! Functions on a real node, as users drive them: the seed's walk-through through `kubectl fn`
//! and plain HTTP (from the host and from a pod), scale 0 → 1 → N → 0, a code update under
//! load without a failed request, every bad input, deletion, and a gateway restart.

use minik8s_conformance::Cluster;
use std::time::{Duration, Instant};

const ADD: &str = "def handler(event):\n    return {\"sum\": event[\"x\"] + event[\"y\"]}\n";

fn register(c: &Cluster, name: &str, code: &str, extra: &[&str]) {
    let file = c.dir().join(format!("{name}.py"));
    std::fs::write(&file, code).unwrap();
    let mut args = vec!["fn", "register"];
    let path = file.display().to_string();
    args.push(&path);
    args.extend(extra);
    let out = c.ok(&args);
    assert!(out.contains("registered"), "{out}");
}

fn url(c: &Cluster, name: &str) -> String {
    c.eventually(&["get", "fn", name, "-o", "jsonpath={.status.url}"], |u| {
        u.starts_with("http://")
    })
}

#[test]
fn functions_register_invoke_scale_update_fail_cleanly_and_go() {
    // kubectl finds the plugin next to the test binaries (cargo test builds it).
    minik8s_conformance::node::bin("kubectl-fn");
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("f1", 6);
    let functions = c.run_functions();

    // The gateway and the controller run as their own user, with no more than they need;
    // users bound to `edit` manage functions (the aggregated roles `install` adds).
    let can = |args: &[&str]| c.kubectl(args).stdout.trim().to_string();
    let user = minik8s_serverless::USER;
    assert_eq!(
        can(&["auth", "can-i", "patch", "deployments/scale", "--as", user]),
        "yes"
    );
    assert_eq!(
        can(&["auth", "can-i", "list", "secrets", "--as", user]),
        "no"
    );
    assert_eq!(
        can(&["auth", "can-i", "create", "nodes", "--as", user]),
        "no"
    );
    c.ok(&[
        "create",
        "rolebinding",
        "dev-edit",
        "--clusterrole",
        "edit",
        "--user",
        "dev",
    ]);
    c.eventually(
        &["auth", "can-i", "create", "functions", "--as", "dev"],
        |o| o.trim() == "yes",
    );
    assert_eq!(
        can(&[
            "auth",
            "can-i",
            "list",
            "workflowruns",
            "--as",
            "dev",
            "-n",
            "other"
        ]),
        "no"
    );

    // The walk-through: register add.py, invoke it cold (0 → 1) and warm, over kubectl fn.
    register(&c, "add", ADD, &["--scale-to-zero-after", "5"]);
    c.eventually(
        &[
            "get",
            "fn",
            "add",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        |s| s == "True",
    );
    assert_eq!(
        c.function_sum("add", ".spec.replicas"),
        0,
        "a new function starts at zero"
    );
    let cold = Instant::now();
    assert_eq!(
        c.ok(&["fn", "invoke", "add", r#"{"x":1,"y":2}"#]).trim(),
        r#"{"sum": 3}"#
    );
    let cold = cold.elapsed();
    assert_eq!(c.function_sum("add", ".spec.replicas"), 1);
    assert_eq!(
        c.ok(&["fn", "invoke", "add", r#"{"x":2,"y":5}"#]).trim(),
        r#"{"sum": 7}"#
    );
    let table = c.ok(&["get", "fn", "add"]);
    assert!(
        table.contains("True") && table.contains("/function/default/add"),
        "{table}"
    );
    println!("cold start through kubectl fn: {cold:?}");

    // Plain HTTP from the host (curl, as the README says), and from a pod through the
    // gateway Service.
    let add = url(&c, "add");
    let curl = std::process::Command::new("curl")
        .args(["-sS", "-X", "POST", &add, "-d", r#"{"x":1,"y":2}"#])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&curl.stdout), r#"{"sum": 3}"#);
    assert_eq!(
        c.post(&add, r#"{"x":1,"y":2}"#),
        (200, r#"{"sum": 3}"#.into())
    );
    c.ok(&["run", "client", "--image=busybox", "--", "sleep", "3600"]);
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=60s",
    ]);
    // By the Service's ClusterIP: names for Services come with the cluster DNS (issue 18).
    let gateway_ip = c.ok(&[
        "get",
        "service",
        "gateway",
        "-n",
        "minik8s-system",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let gateway_url = format!("http://{gateway_ip}/function/default/add");
    let from_pod = c.ok(&[
        "exec",
        "client",
        "--",
        "wget",
        "-qO-",
        "-T",
        "10",
        "--header",
        "Content-Type: application/json",
        "--post-data",
        r#"{"x":1,"y":2}"#,
        &gateway_url,
    ]);
    assert_eq!(from_pod.trim(), r#"{"sum": 3}"#);

    // Idle for the period: back to zero.
    c.wait_function_sum("add", ".spec.replicas", 0);

    // Concurrent load on a slow function scales it 1 → N, never past maxScale.
    register(
        &c,
        "slow",
        "import time\ndef handler(event):\n    time.sleep(1)\n    return {\"ok\": True}\n",
        &["--max", "3", "--scale-to-zero-after", "30"],
    );
    let slow = url(&c, "slow");
    let seen_max = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut answers = Vec::new();
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let until = Instant::now() + Duration::from_secs(12);
            while Instant::now() < until {
                let r = c.function_sum("slow", ".spec.replicas");
                seen_max.fetch_max(r, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        let workers: Vec<_> = (0..6)
            .map(|_| s.spawn(|| (0..4).map(|_| c.post(&slow, "{}").0).collect::<Vec<u16>>()))
            .collect();
        for w in workers {
            answers.extend(w.join().unwrap());
        }
        watcher.join().unwrap();
    });
    assert!(
        answers.iter().all(|&a| a == 200),
        "answers under load: {answers:?}"
    );
    let max = seen_max.load(std::sync::atomic::Ordering::SeqCst);
    assert!((2..=3).contains(&max), "scaled to {max} pods (maxScale 3)");

    // A code update while a load loop runs: the new code answers, no request fails.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (failures, new_seen) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut failures = Vec::new();
            let mut new_seen = false;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (code, body) = c.post(&add, r#"{"x":1,"y":2}"#);
                if code != 200 {
                    failures.push((code, body));
                } else if body.contains("\"v\": 2") {
                    new_seen = true;
                }
            }
            (failures, new_seen)
        });
        std::thread::sleep(Duration::from_secs(1));
        register(
            &c,
            "add",
            "def handler(event):\n    return {\"sum\": event[\"x\"] + event[\"y\"], \"v\": 2}\n",
            &["--scale-to-zero-after", "5"],
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if c.post(&add, r#"{"x":1,"y":2}"#).1.contains("\"v\": 2") {
                std::thread::sleep(Duration::from_secs(2));
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        load.join().unwrap()
    });
    assert!(
        failures.is_empty(),
        "requests failed during the update: {failures:?}"
    );
    assert!(new_seen, "the new code never answered");

    // Bad input: each a clear error, the function keeps serving.
    let unknown = add.replace("/add", "/nope");
    let (code, body) = c.post(&unknown, "{}");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("not found"), "{body}");
    assert_eq!(c.post(&add, "not json").0, 400);
    let big = format!("\"{}\"", "x".repeat(6 * 1024 * 1024 + 10));
    assert_eq!(c.post(&add, &big).0, 413);
    let (code, body) = c.post(&add, r#"{"x":1}"#);
    assert_eq!(code, 500, "{body}");
    let err: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        err["error"].as_str().unwrap().contains("KeyError"),
        "{body}"
    );
    assert!(
        err["traceback"].as_str().unwrap().contains("Traceback"),
        "{body}"
    );
    assert_eq!(
        c.post(&add, r#"{"x":1,"y":1}"#).0,
        200,
        "the pod keeps serving"
    );
    let failed = c.kubectl(&["fn", "invoke", "add", r#"{"x":1}"#]);
    assert!(
        !failed.ok && failed.stderr.contains("KeyError"),
        "{}",
        failed.stderr
    );

    // A handler that never returns: 504 at timeoutSeconds, and its pod is recycled.
    register(
        &c,
        "stuck",
        "import time\ndef handler(event):\n    time.sleep(60)\n",
        &["--timeout", "2", "--min", "1"],
    );
    let stuck_url = url(&c, "stuck");
    let pod = c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "serverless.minik8s.io/function=stuck",
            "--field-selector",
            "status.phase=Running",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        |p| !p.is_empty() && !p.contains(' '),
    );
    c.wait_function_sum("stuck", ".status.readyReplicas", 1);
    let started = Instant::now();
    let (code, body) = c.post(&stuck_url, "{}");
    assert_eq!(code, 504, "{body}");
    assert!(body.contains("did not answer within 2 s"), "{body}");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "504 after {took:?}");
    c.eventually(
        &["get", "pods", &pod, "--ignore-not-found", "-o", "name"],
        |o| o.trim().is_empty(),
    );
    c.wait_function_sum("stuck", ".status.readyReplicas", 1);
    assert!(c.ok(&["fn", "delete", "stuck"]).contains("deleted"));

    // The module from a ConfigMap the user keeps (`source.configMapRef`); changing it rolls
    // the pods to the new code.
    let greet = |text: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: greet-code}}\ndata:\n  greet.py: |\n    def handler(event):\n        return {{\"{text}\": event[\"name\"]}}\n"
        )
    };
    assert!(c.with_manifest(&["apply"], &greet("hello")).ok);
    let made = c.with_manifest(
        &["apply"],
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Function\nmetadata: {name: greet}\n\
         spec:\n  handler: greet.handler\n  source: {configMapRef: {name: greet-code, key: greet.py}}\n",
    );
    assert!(made.ok, "{}", made.stderr);
    let (code, body) = c.post(&url(&c, "greet"), r#"{"name":"ada"}"#);
    assert_eq!((code, body.as_str()), (200, r#"{"hello": "ada"}"#));
    assert!(c.with_manifest(&["apply"], &greet("goodbye")).ok);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = c.post(&url(&c, "greet"), r#"{"name":"ada"}"#);
        assert_eq!(code, 200, "{body}");
        if body == r#"{"goodbye": "ada"}"# {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new ConfigMap never served: {body}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(c.ok(&["fn", "delete", "greet"]).contains("deleted"));
    assert!(
        c.ok(&["get", "configmap", "greet-code", "-o", "name"])
            .contains("greet-code"),
        "the user's ConfigMap is the user's"
    );

    // `runtime: image`: an image run as it is, serving the protocol on its own. The runtime
    // image itself qualifies: without a code volume it calls a module the image carries.
    let image = c.ok(&[
        "get",
        "deployments",
        "-l",
        "serverless.minik8s.io/function=add",
        "-o",
        "jsonpath={.items[0].spec.template.spec.containers[0].image}",
    ]);
    let made = c.with_manifest(
        &["apply"],
        &format!(
            "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Function\nmetadata: {{name: base}}\n\
             spec: {{runtime: image, image: \"{image}\", handler: os.path.basename}}\n"
        ),
    );
    assert!(made.ok, "{}", made.stderr);
    let (code, body) = c.post(&url(&c, "base"), r#""/srv/data/report.txt""#);
    assert_eq!((code, body.as_str()), (200, r#""report.txt""#));
    assert!(
        c.ok(&[
            "get",
            "configmaps",
            "-l",
            "serverless.minik8s.io/function=base",
            "-o",
            "name"
        ])
        .trim()
        .is_empty(),
        "an image function has no code ConfigMap"
    );
    assert!(c.ok(&["fn", "delete", "base"]).contains("deleted"));

    register(&c, "broken", "def handler(event)\n    return 1\n", &[]);
    let (code, body) = c.post(&url(&c, "broken"), "{}");
    assert_eq!(code, 502, "{body}");
    assert!(body.contains("SyntaxError"), "{body}");
    let reason = c.eventually(
        &[
            "get",
            "fn",
            "broken",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"SourceReady\")].message}",
        ],
        |m| m.contains("SyntaxError"),
    );
    assert!(reason.contains("SyntaxError"), "{reason}");

    // A queue at its limit answers 503 with Retry-After; the gateway keeps serving.
    let busy = c.with_manifest(
        &["apply"],
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Function\nmetadata: {name: busy}\n\
         spec:\n  source:\n    inline: |\n      import time\n      def handler(event):\n          time.sleep(3)\n          return 1\n\
         \x20 scale: {minScale: 1, maxScale: 1, queueLimit: 1}\n",
    );
    assert!(busy.ok, "{}", busy.stderr);
    let busy = url(&c, "busy");
    c.wait_function_sum("busy", ".status.readyReplicas", 1);
    let codes: Vec<u16> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..4).map(|_| s.spawn(|| c.post(&busy, "{}").0)).collect();
        calls.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(codes.contains(&503), "{codes:?}");
    assert!(codes.contains(&200), "{codes:?}");

    // Schema validation: bad specs are 422 and nothing is written.
    let bad = c.with_manifest(
        &["apply"],
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Function\nmetadata: {name: bad}\n\
         spec: {runtime: python3, source: {inline: x}, scale: {minScale: 5, maxScale: 2}}\n",
    );
    assert!(
        !bad.ok
            && bad
                .stderr
                .contains("minScale must not be greater than maxScale"),
        "{}",
        bad.stderr
    );
    let bad = c.with_manifest(
        &["apply"],
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Function\nmetadata: {name: bad}\n\
         spec: {runtime: cobol}\n",
    );
    assert!(
        !bad.ok && bad.stderr.contains("Unsupported value"),
        "{}",
        bad.stderr
    );
    assert!(c.fails(&["get", "fn", "bad"]).contains("NotFound"));

    // The gateway restarts with nothing lost that matters: it rebuilds from the API.
    functions.cancel();
    std::thread::sleep(Duration::from_millis(500));
    let _functions = c.run_functions();
    let add_after = c.eventually(&["get", "fn", "add", "-o", "jsonpath={.status.url}"], |u| {
        u.starts_with("http://") && u != add
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = c.post(&add_after, r#"{"x":2,"y":2}"#);
        if code == 200 {
            assert!(body.contains("\"sum\": 4"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "after a restart: {code} {body}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Deleting a Function leaves nothing behind.
    assert!(c.ok(&["fn", "delete", "add"]).contains("deleted"));
    c.eventually(
        &[
            "get",
            "functionrevisions,deployments,services,configmaps,pods",
            "-l",
            "serverless.minik8s.io/function=add",
            "-o",
            "name",
        ],
        |o| o.trim().is_empty(),
    );

    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

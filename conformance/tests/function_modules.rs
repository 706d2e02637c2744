//! Functions with `placement: module` on a real node: the function bases (pods of the Python
//! runtime in base mode) become virtual nodes, a module function's pods are scheduled onto
//! them and loaded into the bases' processes, and the gateway calls them there. Cold and warm
//! invocations, `kubectl get nodes`/`get pods -o wide`/`logs`, scale 0 → N → 0, a code update
//! under load with no failed request, code that does not import, and a base killed under load.

use minik8s_conformance::Cluster;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

const ADD: &str = "def handler(event):\n    print('adding', event['x'], event['y'])\n    return {\"sum\": event[\"x\"] + event[\"y\"]}\n";

fn register(c: &Cluster, name: &str, code: &str, extra: &[&str]) {
    let file = c.dir().join(format!("{name}.py"));
    std::fs::write(&file, code).unwrap();
    let path = file.display().to_string();
    let mut args = vec!["fn", "register", path.as_str(), "--placement", "module"];
    args.extend(extra);
    let out = c.ok(&args);
    assert!(out.contains("registered"), "{out}");
}

fn url(c: &Cluster, name: &str) -> String {
    c.eventually(&["get", "fn", name, "-o", "jsonpath={.status.url}"], |u| {
        u.starts_with("http://")
    })
}

/// `name node ip phase` of the function's pods.
fn module_pods(c: &Cluster, function: &str) -> Vec<Vec<String>> {
    c.ok(&[
        "get",
        "pods",
        "-l",
        &format!("serverless.minik8s.io/function={function}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP} {.status.phase}{\"\\n\"}{end}",
    ])
    .lines()
    .map(|l| l.split_whitespace().map(str::to_owned).collect())
    .collect()
}

fn base_nodes(c: &Cluster) -> Vec<String> {
    c.ok(&[
        "get",
        "nodes",
        "-l",
        "minik8s.io/vnode-provider=functions",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

#[test]
fn module_functions_load_into_bases_scale_update_and_survive_a_base() {
    minik8s_conformance::node::bin("kubectl-fn");
    let c = Cluster::start();
    c.run_controllers(0);
    let _node = c.run_node("fm1", 10);
    let _functions = c.run_functions();
    let modules = c.run_function_modules("modules-a");

    // The first module function makes the bases; each Ready base is a virtual node.
    register(&c, "add", ADD, &["--scale-to-zero-after", "5"]);
    let nodes = c.eventually_within(
        Duration::from_secs(120),
        &[
            "get",
            "nodes",
            "-l",
            "minik8s.io/vnode-provider=functions",
            "--no-headers",
        ],
        |o| o.lines().filter(|l| l.contains(" Ready ")).count() == 2,
    );
    assert!(nodes.contains("function-bases-"), "{nodes}");
    let taints = c.ok(&[
        "get",
        "nodes",
        "-l",
        "minik8s.io/vnode-provider=functions",
        "-o",
        "jsonpath={.items[0].spec.taints[0].key}",
    ]);
    assert_eq!(taints, "virtual-kubelet.io/provider");
    let capacity = c.ok(&[
        "get",
        "nodes",
        "-l",
        "minik8s.io/vnode-provider=functions",
        "-o",
        "jsonpath={.items[0].status.capacity.pods}",
    ]);
    assert_eq!(capacity, "50");
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

    // Cold (0 → 1: a module pod scheduled onto a base and loaded), then warm.
    let add = url(&c, "add");
    let cold = Instant::now();
    assert_eq!(
        c.post(&add, r#"{"x":1,"y":2}"#),
        (200, r#"{"sum": 3}"#.into())
    );
    let cold = cold.elapsed();
    println!("module cold start: {cold:?}");
    assert!(cold < Duration::from_secs(5), "cold start {cold:?}");
    let warm = Instant::now();
    assert_eq!(
        c.ok(&["fn", "invoke", "add", r#"{"x":2,"y":5}"#]).trim(),
        r#"{"sum": 7}"#
    );
    println!("warm call through kubectl fn: {:?}", warm.elapsed());
    let pods = module_pods(&c, "add");
    assert_eq!(pods.len(), 1, "{pods:?}");
    let bases = base_nodes(&c);
    assert!(
        bases.contains(&pods[0][1]),
        "the module pod is on a base: {pods:?} {bases:?}"
    );
    let base_ip = c.ok(&[
        "get",
        "pod",
        "-n",
        "minik8s-system",
        &pods[0][1],
        "-o",
        "jsonpath={.status.podIP}",
    ]);
    assert_eq!(pods[0][2], base_ip, "the module pod has its base's address");
    let wide = c.ok(&["get", "pods", "-o", "wide"]);
    assert!(wide.contains(&pods[0][1]), "{wide}");
    // kubectl logs: what the module printed, through the apiserver and the vnode endpoint.
    let logs = c.eventually(&["logs", &pods[0][0]], |l| l.contains("adding 2 5"));
    assert!(logs.contains("adding 1 2"), "{logs}");
    let described = c.ok(&["describe", "node", &pods[0][1]]);
    assert!(
        described.contains("virtual-kubelet.io/provider=functions:NoSchedule"),
        "{described}"
    );

    // Code that does not import: the module pod fails with Python's message, the Function
    // says so, the caller gets 502.
    register(&c, "broken", "def handler(:\n", &["--min", "1"]);
    let failed = c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "serverless.minik8s.io/function=broken",
            "-o",
            "jsonpath={.items[0].status.phase} {.items[0].status.reason}",
        ],
        |o| o == "Failed ModuleLoadFailed",
    );
    assert_eq!(failed, "Failed ModuleLoadFailed");
    let message = c.ok(&[
        "get",
        "pods",
        "-l",
        "serverless.minik8s.io/function=broken",
        "-o",
        "jsonpath={.items[0].status.containerStatuses[0].state.terminated.message}",
    ]);
    assert!(message.contains("SyntaxError"), "{message}");
    // The Function says so, its pods stop coming (no storm of failing pods), and a call is a
    // 502 with Python's message at once.
    let cond = c.eventually(
        &[
            "get",
            "fn",
            "broken",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"SourceReady\")].reason}",
        ],
        |r| r == "ImportError",
    );
    assert_eq!(cond, "ImportError");
    c.wait_function_sum("broken", ".spec.replicas", 0);
    std::thread::sleep(Duration::from_secs(2));
    let tried = c.ok(&[
        "get",
        "pods",
        "-l",
        "serverless.minik8s.io/function=broken",
        "-o",
        "name",
    ]);
    assert!(
        tried.lines().count() <= 3,
        "failing module pods kept coming: {tried}"
    );
    let broken = url(&c, "broken");
    let (code, body) = c.post(&broken, "{}");
    assert_eq!(code, 502, "{body}");
    assert!(body.contains("SyntaxError"), "{body}");
    c.ok(&["delete", "fn", "broken"]);

    // Concurrent load on a slow module scales it 1 → N, never past maxScale.
    register(
        &c,
        "slow",
        "import time\ndef handler(event):\n    time.sleep(1)\n    return {\"ok\": True}\n",
        &["--max", "3", "--scale-to-zero-after", "30"],
    );
    let slow = url(&c, "slow");
    let seen_max = AtomicI64::new(0);
    let mut answers = Vec::new();
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                seen_max.fetch_max(c.function_sum("slow", ".spec.replicas"), Ordering::SeqCst);
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
    let max = seen_max.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&max),
        "scaled to {max} module pods (maxScale 3)"
    );
    // Deleting the function unloads its modules.
    c.ok(&["delete", "fn", "slow"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while loaded_modules(&c).iter().any(|m| m.contains("\"slow\"")) {
        assert!(
            Instant::now() < deadline,
            "slow's modules stayed loaded: {:#?}\n{}",
            loaded_modules(&c),
            explain(&c, "slow")
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Idle for the period: back to zero, and the module is unloaded from its base.
    c.wait_function_sum("add", ".spec.replicas", 0);
    c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "serverless.minik8s.io/function=add",
            "-o",
            "name",
        ],
        |o| o.is_empty(),
    );

    // A code update under load: the new code answers, no request fails.
    assert_eq!(c.post(&add, r#"{"x":1,"y":2}"#).0, 200);
    let stop = AtomicBool::new(false);
    let (failures, new_seen) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut failures = Vec::new();
            let mut new_seen = false;
            while !stop.load(Ordering::SeqCst) {
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
            &["--scale-to-zero-after", "30"],
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if c.post(&add, r#"{"x":1,"y":2}"#).1.contains("\"v\": 2") {
                std::thread::sleep(Duration::from_secs(2));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::SeqCst);
        load.join().unwrap()
    });
    assert!(
        failures.is_empty(),
        "requests failed during the update: {failures:?}"
    );
    assert!(new_seen, "the new code never answered");

    // A base killed under load: its node goes, its module pods are recreated on the other
    // base, and callers see no failure (a failed call is retried once on another base).
    register(
        &c,
        "echo",
        "def handler(event):\n    return event\n",
        &["--min", "2", "--scale-to-zero-after", "600"],
    );
    let echo = url(&c, "echo");
    let deadline = Instant::now() + Duration::from_secs(60);
    let spread = loop {
        let p = module_pods(&c, "echo");
        if p.len() == 2
            && p.iter()
                .all(|x| x.get(3).map(String::as_str) == Some("Running"))
        {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "echo pods: {p:?}\n{}",
            explain(&c, "echo")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("echo's module pods: {spread:?}");
    let victim = spread[0][1].clone();
    let stop = AtomicBool::new(false);
    let (answers, took) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut answers = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                answers.push(c.post(&echo, r#"{"n":1}"#));
            }
            answers
        });
        std::thread::sleep(Duration::from_millis(500));
        let killed = Instant::now();
        c.ok(&[
            "delete",
            "pod",
            "-n",
            "minik8s-system",
            &victim,
            "--grace-period=0",
            "--force",
        ]);
        c.eventually(&["get", "nodes", "-o", "name"], |o| !o.contains(&victim));
        let gone = killed.elapsed();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let p = module_pods(&c, "echo");
            if p.len() == 2
                && p.iter()
                    .all(|x| x.get(3).map(String::as_str) == Some("Running") && x[1] != victim)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "echo pods not moved off {victim}: {p:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let moved = killed.elapsed();
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        (load.join().unwrap(), (gone, moved))
    });
    println!(
        "base {victim} killed: its node gone in {:?}, its module pods running elsewhere in {:?}",
        took.0, took.1
    );
    let failed: Vec<_> = answers.iter().filter(|(code, _)| *code != 200).collect();
    println!(
        "{} calls during the kill, {} failed",
        answers.len(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "calls failed while a base died: {failed:?}"
    );

    // A base serves one namespace: a module function of another namespace avoids the bases
    // holding `default`'s modules (Pending), and takes a base that holds none.
    c.ok(&["create", "namespace", "team-b"]);
    let file = c.dir().join("hello.py");
    std::fs::write(&file, "def handler(event):\n    return 'hello'\n").unwrap();
    c.ok(&[
        "fn",
        "register",
        &file.display().to_string(),
        "-n",
        "team-b",
        "--placement",
        "module",
        "--min",
        "1",
    ]);
    let why = c.eventually(
        &[
            "get",
            "events",
            "-n",
            "team-b",
            "--field-selector",
            "reason=FailedScheduling",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        |m| m.contains("node affinity"),
    );
    println!("team-b while every base holds default's modules: {why}");
    c.ok(&[
        "scale",
        "deployment",
        "function-bases",
        "-n",
        "minik8s-system",
        "--replicas=3",
    ]);
    let node = c.eventually(
        &[
            "get",
            "pods",
            "-n",
            "team-b",
            "-o",
            "jsonpath={range .items[?(@.status.phase==\"Running\")]}{.spec.nodeName} {end}",
        ],
        |o| !o.trim().is_empty(),
    );
    // Two namespaces' pods may be bound to a fresh base in the same instant, before it is
    // labelled: the base takes the first and refuses the other (Failed, BaseRefused), whose
    // replacement then avoids it. So look for the Running pod, not the first one.
    let node = node.split_whitespace().next().unwrap().to_owned();
    let label = c.eventually(
        &[
            "get",
            "node",
            &node,
            "-o",
            "jsonpath={.metadata.labels.serverless\\.minik8s\\.io/namespace}",
        ],
        |l| l == "team-b",
    );
    assert_eq!(label, "team-b");
    let hello = c.eventually(
        &[
            "get",
            "fn",
            "hello",
            "-n",
            "team-b",
            "-o",
            "jsonpath={.status.url}",
        ],
        |u| u.starts_with("http://"),
    );
    assert_eq!(c.post(&hello, "{}"), (200, "\"hello\"".into()));
    c.ok(&[
        "delete",
        "namespace",
        "team-b",
        "--wait=true",
        "--timeout=60s",
    ]);
    c.eventually(
        &["get", "node", &node, "-o", "jsonpath={.metadata.labels}"],
        |l| !l.contains("team-b"),
    );

    // Sharding: three replicas of `minik8s function-modules` (processes) share six bases two
    // each; one is SIGKILLed and the others take its bases over after the Lease lapses,
    // adopting the modules (none loaded again) with no module pod changing phase.
    modules.cancel();
    c.ok(&[
        "scale",
        "deployment",
        "function-bases",
        "-n",
        "minik8s-system",
        "--replicas=6",
    ]);
    // The autoscaler owns replicas: six through minScale.
    register(
        &c,
        "echo",
        "def handler(event):\n    return event\n",
        &["--min", "6", "--scale-to-zero-after", "600"],
    );
    let kubeconfig = c.user_kubeconfig(minik8s_serverless::modules::USER, &[]);
    let address = c.block_on(minik8s_kubelet::node::default_ip());
    let mut replicas: Vec<Replica> = ["r-a", "r-b", "r-c"]
        .iter()
        .map(|id| Replica::start(&kubeconfig, c.ca_path(), &address, id))
        .collect();
    let holders = || -> BTreeMap<String, String> {
        c.ok(&[
            "get",
            "leases",
            "-n",
            "kube-node-lease",
            "-l",
            "minik8s.io/vnode-provider=functions,!minik8s.io/vnode-replica",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.holderIdentity}{\"\\n\"}{end}",
        ])
        .lines()
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.trim().to_owned()))
        })
        .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    let shares = loop {
        let h = holders();
        let live: Vec<_> = h.values().filter(|x| x.starts_with("r-")).collect();
        if h.len() == 6 && live.len() == 6 {
            let mut shares = BTreeMap::new();
            for x in live {
                *shares.entry(x.clone()).or_insert(0) += 1;
            }
            break shares;
        }
        assert!(Instant::now() < deadline, "the six bases' leases: {h:?}");
        std::thread::sleep(Duration::from_millis(250));
    };
    println!("three replicas, six bases: {shares:?}");
    let (max, min) = (
        *shares.values().max().unwrap(),
        *shares.values().min().unwrap(),
    );
    assert_eq!(shares.len(), 3, "{shares:?}");
    assert!(max <= 2 * min, "max/min ≤ 2: {shares:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        let p = module_pods(&c, "echo");
        if p.len() == 6
            && p.iter()
                .all(|x| x.get(3).map(String::as_str) == Some("Running"))
        {
            break p;
        }
        if Instant::now() > deadline {
            let why = c.kubectl(&["get", "pods", "-l", "serverless.minik8s.io/function=echo", "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.reason} {.status.message}{\"\\n\"}{end}"]);
            let events = c.kubectl(&["get", "events", "-A"]);
            panic!("echo pods: {p:?}\n{}\n{}", why.stdout, events.stdout);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    // echo's modules (others may scale to zero meanwhile).
    let echo_modules = |c: &Cluster| -> Vec<String> {
        loaded_modules(c)
            .into_iter()
            .filter(|m| m.contains("\"echo\""))
            .collect()
    };
    let modules_before = echo_modules(&c);
    let victim = shares.iter().max_by_key(|(_, n)| **n).unwrap().0.clone();
    let victim_bases: Vec<String> = holders()
        .into_iter()
        .filter(|(_, h)| *h == victim)
        .map(|(b, _)| b)
        .collect();
    let i = ["r-a", "r-b", "r-c"]
        .iter()
        .position(|r| *r == victim)
        .unwrap();
    let killed = Instant::now();
    replicas[i].kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = holders();
        if victim_bases.iter().all(|b| {
            h.get(b)
                .is_some_and(|x| x.starts_with("r-") && *x != victim)
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "not taken over: {h:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = killed.elapsed();
    println!(
        "replica {victim} SIGKILLed: its {} bases taken over in {took:.1?} (lease 12 s, renew 3 s)",
        victim_bases.len()
    );
    assert!(
        took <= Duration::from_secs(12 + 3 + 5),
        "within the lease duration plus a renew: {took:?}"
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        module_pods(&c, "echo"),
        before,
        "no module pod changed phase or was replaced"
    );
    assert_eq!(
        echo_modules(&c),
        modules_before,
        "no module was loaded again"
    );
    assert_eq!(c.post(&echo, r#"{"n":2}"#), (200, r#"{"n": 2}"#.into()));
    drop(replicas);
}

/// Why the function's pods are as they are, and the cluster's warnings.
fn explain(c: &Cluster, function: &str) -> String {
    let why = c.kubectl(&[
        "get", "pods", "-l", &format!("serverless.minik8s.io/function={function}"), "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.reason} {.status.message} {.status.containerStatuses[0].state}{\"\\n\"}{end}",
    ]);
    let events = c.kubectl(&["get", "events", "-A", "--field-selector", "type=Warning"]);
    let all = c.kubectl(&["get", "pods", "-A", "-o", "wide"]);
    format!(
        "{}\n{}\n{}\n{:#?}",
        why.stdout,
        events.stdout,
        all.stdout,
        loaded_modules(c)
    )
}

/// Every module every base holds, with when it was loaded (a reload changes it).
fn loaded_modules(c: &Cluster) -> Vec<String> {
    let ips = c.ok(&[
        "get",
        "pods",
        "-n",
        "minik8s-system",
        "-l",
        "serverless.minik8s.io/base=true",
        "-o",
        "jsonpath={range .items[*]}{.status.podIP}{\"\\n\"}{end}",
    ]);
    let mut out = Vec::new();
    for ip in ips.lines() {
        let curl = std::process::Command::new("curl")
            .args(["-sS", &format!("http://{ip}:8080/modules")])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&curl.stdout).unwrap_or_default();
        for m in v["modules"].as_array().into_iter().flatten() {
            out.push(format!(
                "{ip} {} {} {}",
                m["name"], m["loadedAt"], m["pods"]
            ));
        }
    }
    out.sort();
    out
}

/// A `minik8s function-modules` process.
struct Replica(std::process::Child);

impl Replica {
    fn start(kubeconfig: &Path, ca: &Path, address: &str, identity: &str) -> Replica {
        let child = std::process::Command::new(minik8s_conformance::node::bin("minik8s"))
            .args(["function-modules", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--identity", identity, "--address", address])
            .args(["--lease-duration-seconds", "12", "--client-ca"])
            .arg(ca)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("minik8s function-modules starts");
        Replica(child)
    }

    /// SIGKILL: nothing is released.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

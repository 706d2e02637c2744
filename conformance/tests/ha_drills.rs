//! The HA drill (issue 30): three control-plane machines, each with one member of a 3-member
//! etcd, plus a worker, made with `minik8s init --storage etcd://… --upload-certs` (this machine, cp1) and
//! `minik8s join --control-plane` (cp2, cp3: network namespaces with their own host names),
//! and `minik8s join` (w1). A writer creates ConfigMaps through a client-side balancer over
//! the three apiservers the whole time, and a watch follows them, moving to the next
//! apiserver whenever its own goes away. Killed in turn (SIGKILL), each brought back after:
//! the machine whose apiserver the writer uses, the etcd leader, the machine whose controller
//! manager leads, and the machine running the workflow executor in the middle of a run (a
//! machine's kill takes its etcd member too); then one control-plane machine is cut off its
//! network with its member, leaving it without quorum. After each: no acknowledged write is lost
//! (each is there at the resourceVersion it was acknowledged with), a Deployment scales and
//! its Service answers, the workflow run finishes with each step run once (its invocation
//! ids), and the watch has seen every acknowledged write in order. The time each took to
//! recover is printed (README, "Several control-plane machines"). Then the API's history is
//! recorded under each fault again (a machine and its apiserver killed, the etcd leader
//! killed, a machine cut off, one more apiserver's clock stepped) and must be linearizable,
//! watches included.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use minik8s_conformance::machines::{self, InitCluster, Machine};
use minik8s_conformance::node::{faketime, free_port, http_get, terminate};
use minik8s_linearizability::record::{Recorder, Workload};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ETCD_BASE_PORT: u16 = 26790;

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 8080 -h /www"]
        resources: {requests: {cpu: 50m, memory: 16Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// What the writer saw: each acknowledged create (name, resourceVersion, when), and each
/// failure (when, why).
#[derive(Default)]
struct Ledger {
    acked: Vec<(String, u64, Instant)>,
    failed: Vec<(Instant, String)>,
}

/// Creates ConfigMaps `load-N` (label `drill=load`) one after another through `cms` until
/// `stop`, 50 ms apart, each with a 30 s limit.
async fn write_load(cms: Api<ConfigMap>, ledger: Arc<Mutex<Ledger>>, stop: Arc<AtomicBool>) {
    let mut n = 0u32;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let name = format!("load-{n:05}");
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"drill": "load"}},
            "data": {"n": n.to_string()},
        }))
        .expect("a ConfigMap");
        let result = tokio::time::timeout(
            Duration::from_secs(30),
            cms.create(&PostParams::default(), &cm),
        )
        .await;
        let now = Instant::now();
        {
            let mut ledger = ledger.lock().unwrap();
            match result {
                Ok(Ok(made)) => {
                    let rv = made
                        .metadata
                        .resource_version
                        .and_then(|v| v.parse().ok())
                        .expect("a numeric resourceVersion");
                    ledger.acked.push((name, rv, now));
                }
                Ok(Err(e)) => ledger.failed.push((now, format!("{name}: {e}"))),
                Err(_) => ledger
                    .failed
                    .push((now, format!("{name}: no answer in 30 s"))),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the watch saw: every added ConfigMap in order (name, resourceVersion), and each
/// move to another apiserver.
#[derive(Default)]
struct Seen {
    added: Vec<(String, u64)>,
    moves: Vec<(Instant, String)>,
    errors: Vec<String>,
}

/// Watches the load's ConfigMaps on one apiserver at a time (from the resourceVersion last
/// seen), moving to the next of `servers` whenever the stream breaks.
async fn follow(
    kubeconfig: PathBuf,
    servers: Vec<String>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) {
    let mut rv = "0".to_owned();
    let mut at = 0;
    while !stop.load(Ordering::SeqCst) {
        let server = &servers[at % servers.len()];
        let stream = match minik8s_kubeconfig::client_via(&kubeconfig, server).await {
            Ok(client) => {
                let cms: Api<ConfigMap> = Api::namespaced(client, "default");
                tokio::time::timeout(
                    Duration::from_secs(5),
                    cms.watch(
                        &WatchParams::default().labels("drill=load").timeout(290),
                        &rv,
                    ),
                )
                .await
            }
            Err(_) => {
                at += 1;
                continue;
            }
        };
        let Ok(Ok(stream)) = stream else {
            at += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.boxed();
        let mut last = Instant::now();
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if stop.load(Ordering::SeqCst) { return; }
                    // Writes land every 50 ms: a stream silent for 5 s has lost its server
                    // without a reset (a cut link), as a client's health check would find.
                    if last.elapsed() > Duration::from_secs(5) { break; }
                    continue;
                }
            };
            last = Instant::now();
            match next {
                Some(Ok(WatchEvent::Added(cm))) => {
                    let v = cm.metadata.resource_version.unwrap_or_default();
                    seen.lock()
                        .unwrap()
                        .added
                        .push((cm.metadata.name.unwrap_or_default(), v.parse().unwrap_or(0)));
                    rv = v;
                }
                Some(Ok(WatchEvent::Bookmark(b))) => rv = b.metadata.resource_version,
                Some(Ok(WatchEvent::Error(e))) => {
                    seen.lock().unwrap().errors.push(format!("{server}: {e:?}"));
                    break;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            }
        }
        seen.lock()
            .unwrap()
            .moves
            .push((Instant::now(), server.clone()));
        at += 1;
    }
}

/// The cluster, its machines, and the load running against it. (Fields drop in order: the
/// load, then the machines, then the cluster with its etcd and folder.)
struct Drill {
    rt: tokio::runtime::Runtime,
    cp2: Machine,
    cp3: Machine,
    w1: Machine,
    c: InitCluster,
    ledger: Arc<Mutex<Ledger>>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    report: Vec<String>,
    /// A client through the balancer over the three apiservers.
    balanced: kube::Client,
}

impl Drill {
    /// Runs kubectl through apiserver `ip` (the admin's credentials).
    fn at(&self, ip: &str, args: &[&str]) -> minik8s_conformance::Run {
        let server = self.c.server_at(ip);
        let mut full = vec!["--server", server.as_str(), "--request-timeout=20s"];
        full.extend(args);
        self.c.kubectl(&full)
    }

    /// Runs kubectl through the first apiserver of `ips` that answers it.
    fn any(&self, args: &[&str]) -> minik8s_conformance::Run {
        let mut last = None;
        for ip in ["10.250.0.1", "10.250.0.2", "10.250.0.3"] {
            let r = self.at(ip, args);
            if r.ok {
                return r;
            }
            last = Some(r);
        }
        last.expect("three apiservers")
    }

    fn eventually(&self, limit: Duration, args: &[&str], done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let r = self.any(args);
            if r.ok && done(&r.stdout) {
                return r.stdout;
            }
            if Instant::now() >= deadline {
                let placed = self.any(&["get", "nodes,pods", "-o", "wide"]);
                panic!(
                    "kubectl {args:?} never got there: {}\n{}\nnodes and pods:\n{}{}",
                    r.stdout, r.stderr, placed.stdout, placed.stderr
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The machine a leader identity (`HOST_suffix`) runs on.
    fn machine_of(identity: &str) -> &'static str {
        if identity.starts_with("cp2_") {
            "cp2"
        } else if identity.starts_with("cp3_") {
            "cp3"
        } else {
            "cp1"
        }
    }

    fn holder(&self, namespace: &str, lease: &str) -> String {
        self.any(&[
            "get",
            "lease",
            "-n",
            namespace,
            lease,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .stdout
    }

    /// SIGKILLs machine `name`: its minik8s (apiserver, controllers, kubelet, proxy) and its
    /// etcd member.
    fn kill(&mut self, name: &str) {
        let member = &name[2..];
        assert!(self.c.etcd(&["kill", member]).ok, "killing member {member}");
        match name {
            "cp1" => self.c.kill9(),
            "cp2" => self.cp2.kill9(),
            "cp3" => self.cp3.kill9(),
            other => panic!("no machine {other}"),
        }
    }

    /// Starts machine `name`'s etcd member and minik8s again and waits until its apiserver
    /// answers.
    fn restart(&mut self, name: &str) {
        let up = self.c.etcd(&["up"]);
        assert!(up.ok, "the member starts again: {}", up.stderr);
        let ip = match name {
            "cp1" => {
                self.c.restart();
                "10.250.0.1"
            }
            "cp2" => {
                self.cp2.restart();
                "10.250.0.2"
            }
            "cp3" => {
                self.cp3.restart();
                "10.250.0.3"
            }
            other => panic!("no machine {other}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.at(ip, &["get", "--raw", "/readyz"]).ok {
            assert!(Instant::now() < deadline, "{name} never came back");
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Records the workload in namespace `name` through each of `through` (a client, its
    /// callers, its watchers) for `length`, runs `fault` `at` into it, and checks the history:
    /// linearizable, and at least `calls` long.
    fn record(
        &mut self,
        name: &str,
        through: &[(kube::Client, usize, usize)],
        length: Duration,
        at: Duration,
        calls: usize,
        fault: impl FnOnce(&mut Drill),
    ) {
        assert!(self.any(&["create", "namespace", name]).ok);
        let recorder = Recorder::default();
        let until = Instant::now() + length;
        let runs: Vec<_> = through
            .iter()
            .map(|(client, clients, watchers)| {
                let workload = Workload {
                    clients: *clients,
                    watchers: *watchers,
                    namespace: name.into(),
                    ..Workload::default()
                };
                let (recorder, client) = (recorder.clone(), client.clone());
                self.rt
                    .spawn(async move { recorder.run(client, &workload, until).await })
            })
            .collect();
        std::thread::sleep(at);
        fault(self);
        for run in runs {
            self.rt.block_on(run).expect("the clients ran");
        }
        let history = recorder.take();
        let started = Instant::now();
        let violations = minik8s_linearizability::check(&history);
        let line = format!(
            "{name}: {}, checked in {:.1} s: {}",
            history.summary(),
            started.elapsed().as_secs_f64(),
            if violations.is_empty() {
                "linearizable".to_owned()
            } else {
                format!("{} violations", violations.len())
            }
        );
        println!("{line}");
        assert!(
            violations.is_empty(),
            "{name}: not linearizable:\n{}",
            minik8s_linearizability::describe(&violations)
        );
        assert!(
            history.len() >= calls,
            "{name}: only {} calls",
            history.len()
        );
        assert!(history.events() > 0, "{name}: no watch event");
        self.report.push(line);
    }

    /// The linearizability runs: the balancer's first control-plane machine SIGKILLed (its
    /// `init`: apiserver, controllers, node, and its etcd member), the etcd leader SIGKILLed, a control-plane machine cut off (with clients on
    /// its own apiserver too), and the wall clock of one more apiserver stepped five minutes
    /// forward and ten back.
    fn linearizable_under_faults(&mut self) {
        // Each run lasts SECONDS (MINIK8S_LINEARIZABILITY_SECONDS, 30 by default; the runs of
        // docs/reliability.md were longer); its fault comes a quarter in and lasts a quarter
        // (a half for the cut).
        let seconds: u64 = std::env::var("MINIK8S_LINEARIZABILITY_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30);
        let length = Duration::from_secs(seconds);
        let (at, lasts) = (length / 4, length / 4);
        // About 140 calls a second here with a fuzzer beside it: a floor, not a target.
        let calls = (seconds * 50) as usize;
        let balanced = self.balanced.clone();
        self.record(
            "lin-apiserver",
            &[(balanced.clone(), 4, 2)],
            length,
            at,
            calls,
            |d| {
                // The machine whose apiserver the balancer sends to first.
                d.kill("cp1");
                std::thread::sleep(lasts);
                d.restart("cp1");
            },
        );
        self.record(
            "lin-etcd-leader",
            &[(balanced.clone(), 4, 2)],
            length,
            at,
            calls,
            |d| {
                let leader = d.c.etcd_leader().expect("an etcd leader");
                assert!(d.c.etcd(&["kill", &leader.to_string()]).ok);
                std::thread::sleep(lasts);
                assert!(d.c.etcd(&["up"]).ok, "the member starts again");
            },
        );
        let cp3 = self
            .rt
            .block_on(minik8s_kubeconfig::client_via(
                &self.c.kubeconfig,
                &self.c.server_at("10.250.0.3"),
            ))
            .expect("a client");
        self.record(
            "lin-partition",
            &[(balanced.clone(), 5, 1), (cp3, 2, 1)],
            length,
            at,
            calls,
            |d| {
                d.cp3.link(false);
                std::thread::sleep(lasts * 2);
                d.cp3.link(true);
            },
        );
        let clock = self.c.dir().join("clock");
        let port = free_port();
        let mut extra = self.c.extra_apiserver(port, &faketime(&clock));
        let stepped = self
            .rt
            .block_on(minik8s_kubeconfig::client_via(
                &self.c.kubeconfig,
                &format!("https://127.0.0.1:{port}"),
            ))
            .expect("a client");
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.rt.block_on(stepped.apiserver_version()).is_err() {
            assert!(
                Instant::now() < deadline,
                "the extra apiserver never answered: {}",
                std::fs::read_to_string(self.c.dir().join(format!("apiserver-{port}.log")))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        self.record(
            "lin-clock",
            &[(stepped, 3, 1), (balanced, 2, 1)],
            length,
            at,
            calls,
            |_| {
                std::fs::write(&clock, "+300s\n").expect("a step forward");
                std::thread::sleep(lasts);
                std::fs::write(&clock, "-300s\n").expect("a step back");
            },
        );
        terminate(&mut extra);
    }

    /// Seconds from `since` to the first write acknowledged after it.
    fn writes_resumed(&self, since: Instant) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((_, _, at)) = self
                .ledger
                .lock()
                .unwrap()
                .acked
                .iter()
                .find(|(_, _, at)| *at > since)
            {
                return (*at - since).as_secs_f64();
            }
            assert!(
                Instant::now() < deadline,
                "no write acknowledged in 60 s; the failed ones: {:?}",
                self.failures_since(since)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn failures_since(&self, since: Instant) -> Vec<String> {
        self.ledger
            .lock()
            .unwrap()
            .failed
            .iter()
            .filter(|(at, _)| *at > since)
            .map(|(_, why)| why.clone())
            .collect()
    }

    /// The checks after each fault: every acknowledged write is there at its
    /// resourceVersion, the Deployment scales to `replicas` (returns how long that took),
    /// the Service answers on the worker, and the watch has seen every write acknowledged
    /// so far, in order.
    fn check(&self, replicas: u32) -> f64 {
        // Acknowledged writes.
        let acked: Vec<(String, u64)> = {
            let l = self.ledger.lock().unwrap();
            l.acked.iter().map(|(n, rv, _)| (n.clone(), *rv)).collect()
        };
        let stored = self.rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                for ip in ["10.250.0.1", "10.250.0.2", "10.250.0.3"] {
                    let server = self.c.server_at(ip);
                    let Ok(client) =
                        minik8s_kubeconfig::client_via(&self.c.kubeconfig, &server).await
                    else {
                        continue;
                    };
                    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
                    if let Ok(Ok(list)) = tokio::time::timeout(
                        Duration::from_secs(10),
                        cms.list(&ListParams::default().labels("drill=load")),
                    )
                    .await
                    {
                        return list
                            .items
                            .into_iter()
                            .map(|cm| {
                                (
                                    cm.metadata.name.unwrap_or_default(),
                                    cm.metadata
                                        .resource_version
                                        .and_then(|v| v.parse::<u64>().ok())
                                        .unwrap_or(0),
                                )
                            })
                            .collect::<std::collections::HashMap<_, _>>();
                    }
                }
                assert!(Instant::now() < deadline, "no apiserver lists");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        let lost: Vec<&(String, u64)> = acked
            .iter()
            .filter(|(n, rv)| stored.get(n) != Some(rv))
            .collect();
        assert!(
            lost.is_empty(),
            "acknowledged writes lost or changed: {lost:?}"
        );
        // The Deployment scales.
        let started = Instant::now();
        let want = replicas.to_string();
        assert!(
            self.any(&[
                "scale",
                "deployment",
                "web",
                &format!("--replicas={replicas}")
            ])
            .ok
        );
        self.eventually(
            Duration::from_secs(120),
            &[
                "get",
                "deployment",
                "web",
                "-o",
                "jsonpath={.status.readyReplicas}",
            ],
            |s| s == want,
        );
        let scaled = started.elapsed().as_secs_f64();
        // The Service answers on the worker's NodePort.
        let port = self
            .any(&[
                "get",
                "service",
                "web",
                "-o",
                "jsonpath={.spec.ports[0].nodePort}",
            ])
            .stdout;
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(&format!("{}:{port}", self.w1.ip)).is_none() {
            assert!(
                Instant::now() < deadline,
                "the Service does not answer on w1"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        // The watch saw every acknowledged write, in order.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen = self.seen.lock().unwrap();
            let names: std::collections::HashSet<&str> =
                seen.added.iter().map(|(n, _)| n.as_str()).collect();
            let missing: Vec<&str> = acked
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !names.contains(n))
                .collect();
            if missing.is_empty() {
                assert!(
                    seen.added.windows(2).all(|w| w[0].1 < w[1].1),
                    "the watch saw events out of order"
                );
                assert!(seen.errors.is_empty(), "watch errors: {:?}", seen.errors);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the watch missed {} acknowledged writes (first {:?}); it moved {:?} times",
                missing.len(),
                missing.first(),
                seen.moves.len()
            );
            drop(seen);
            std::thread::sleep(Duration::from_millis(300));
        }
        scaled
    }
}

fn log_function_code() -> &'static str {
    "import json, time\n\
     def handler(event, context):\n    step = len(event[\"trail\"])\n    print(json.dumps({\"step\": step, \"id\": context[\"invocation_id\"]}), flush=True)\n    if step == 2:\n        time.sleep(4)\n    return {\"trail\": event[\"trail\"] + [step]}\n"
}

#[test]
fn three_control_planes_survive_each_piece_killed_under_load() {
    machines::import_function_images();
    // One etcd member per control-plane machine (m1 here, m2 in cp2, m3 in cp3).
    let (c, machines) =
        InitCluster::start_with_members_on(free_port(), ETCD_BASE_PORT, [("cp2", 2), ("cp3", 3)]);
    let [mut cp2, mut cp3]: [Machine; 2] = machines.try_into().ok().expect("two machines");
    c.join_control_plane_on(&mut cp2);
    c.join_control_plane_on(&mut cp3);
    let w1 = c.join_machine("w1", 4);
    c.kubectl_stdin(&["apply", "-f", "-"], WEB);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let servers: Vec<String> = ["10.250.0.1", "10.250.0.2", "10.250.0.3"]
        .iter()
        .map(|ip| format!("{ip}:{}", c.server().rsplit(':').next().unwrap()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let balanced_client;
    {
        // The writer, through a client-side balancer over the three apiservers, as a
        // node's components are.
        let shutdown = tokio_util::sync::CancellationToken::new();
        let lb = rt
            .block_on(minik8s_balancer::start(
                "127.0.0.1:0".parse().unwrap(),
                &servers,
                shutdown.clone(),
            ))
            .expect("the balancer starts");
        let balanced = format!("https://{}", lb.addr());
        let client = rt
            .block_on(minik8s_kubeconfig::client_via(&c.kubeconfig, &balanced))
            .expect("a client through the balancer");
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        rt.spawn(write_load(cms, ledger.clone(), stop.clone()));
        balanced_client = client;
        let urls: Vec<String> = servers.iter().map(|s| format!("https://{s}")).collect();
        rt.spawn(follow(
            c.kubeconfig.clone(),
            urls,
            seen.clone(),
            stop.clone(),
        ));
        // Kept until the runtime drops.
        std::mem::forget(shutdown);
    }
    // Machines' Functions: the step logger of the workflow drill.
    let code = c.dir().join("log.py");
    std::fs::write(&code, log_function_code()).unwrap();
    let registered = c.kubectl(&[
        "fn",
        "register",
        &code.display().to_string(),
        "--min",
        "1",
        "--max",
        "1",
        "--scale-to-zero-after",
        "600",
    ]);
    assert!(registered.ok, "{}", registered.stderr);
    let mut d = Drill {
        rt,
        cp2,
        cp3,
        w1,
        c,
        ledger,
        seen,
        stop,
        report: Vec::new(),
        balanced: balanced_client,
    };
    d.eventually(
        Duration::from_secs(120),
        &[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
        |s| s == "2",
    );
    std::thread::sleep(Duration::from_secs(2));
    d.check(2);

    // 1. The apiserver the writer uses (cp1's, the balancer's first): SIGKILL its machine.
    let t = Instant::now();
    d.kill("cp1");
    let resumed = d.writes_resumed(t);
    let failed = d.failures_since(t);
    d.restart("cp1");
    let scaled = d.check(3);
    assert!(
        failed.len() <= 1,
        "more than one failed request: {failed:?}"
    );
    d.report.push(format!(
        "apiserver killed: writes resumed in {resumed:.2} s ({} failed); a Deployment scaled in {scaled:.1} s",
        failed.len()
    ));

    // 2. The etcd leader.
    let leader = d.c.etcd_leader().expect("an etcd leader");
    let t = Instant::now();
    assert!(d.c.etcd(&["kill", &leader.to_string()]).ok);
    std::thread::sleep(Duration::from_millis(200));
    let resumed = d.writes_resumed(t);
    let failed = d.failures_since(t);
    let scaled = d.check(2);
    assert!(d.c.etcd(&["up"]).ok, "the member starts again");
    assert!(
        failed.len() <= 1,
        "more than one failed request: {failed:?}"
    );
    d.report.push(format!(
        "etcd leader (m{leader}) killed: writes resumed in {resumed:.2} s ({} failed); a Deployment scaled in {scaled:.1} s",
        failed.len()
    ));

    // 3. The machine whose controller manager leads.
    let holder = d.holder("kube-system", "kube-controller-manager");
    let machine = Drill::machine_of(&holder);
    let t = Instant::now();
    d.kill(machine);
    let scaled = d.check(3);
    let taken = d.holder("kube-system", "kube-controller-manager");
    assert!(
        !taken.is_empty() && taken != holder,
        "another controller manager leads: {taken}"
    );
    let failed = d.failures_since(t);
    d.restart(machine);
    d.report.push(format!(
        "leading controller manager ({machine}) killed: a Deployment scaled in {scaled:.1} s ({} writes failed)",
        failed.len()
    ));

    // 4. The machine running the workflow executor, in the middle of a five-step run.
    d.eventually(
        Duration::from_secs(120),
        &[
            "get",
            "function",
            "log",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
        |s| s == "1",
    );
    let holder = d.holder("minik8s-system", "function-controllers");
    let machine = Drill::machine_of(&holder);
    assert_ne!(machine, "cp1", "cp1 runs no functions: {holder}");
    let chain: String = (0..5)
        .map(|i| {
            let next = if i < 4 {
                format!(", next: s{}", i + 1)
            } else {
                String::new()
            };
            format!("    - {{name: s{i}, type: Task, function: log{next}}}\n")
        })
        .collect();
    let run = format!(
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: WorkflowRun\nmetadata: {{name: drill}}\nspec:\n  input: {{trail: []}}\n  workflowSpec:\n    startAt: s0\n    steps:\n{chain}"
    );
    assert!(d.c.kubectl_stdin(&["apply", "-f", "-"], &run).ok);
    d.eventually(
        Duration::from_secs(60),
        &["get", "wfr", "drill", "-o", "jsonpath={.status.step}"],
        |s| s == "s2",
    );
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    d.kill(machine);
    d.eventually(
        Duration::from_secs(120),
        &["get", "wfr", "drill", "-o", "jsonpath={.status.phase}"],
        |s| s == "Succeeded",
    );
    let finished = t.elapsed().as_secs_f64();
    let output = d
        .any(&["get", "wfr", "drill", "-o", "jsonpath={.status.output}"])
        .stdout;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&output).unwrap_or_default(),
        serde_json::json!({"trail": [0, 1, 2, 3, 4]})
    );
    let failed = d.failures_since(t);
    d.restart(machine);
    let scaled = d.check(2);
    // (The plugin takes no --server: through the admin's kubeconfig, cp1, up again.)
    let deadline = Instant::now() + Duration::from_secs(60);
    let logs = loop {
        let r = d.c.kubectl(&["fn", "logs", "log"]);
        if r.ok && r.stdout.contains("\"step\": 4") {
            break r.stdout;
        }
        assert!(
            Instant::now() < deadline,
            "the function's logs: {}\n{}",
            r.stdout,
            r.stderr
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| l.split_once("] ").map(|(_, rest)| rest))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for step in 0..5 {
        let calls: Vec<&serde_json::Value> = lines.iter().filter(|l| l["step"] == step).collect();
        assert!(!calls.is_empty(), "step {step} ran: {logs}");
        assert!(
            calls.iter().all(|l| l["id"] == calls[0]["id"]),
            "step {step} ran once per invocation id: {logs}"
        );
        if step != 2 {
            assert_eq!(calls.len(), 1, "step {step} ran once: {logs}");
        }
    }
    d.report.push(format!(
        "workflow executor's machine ({machine}) killed at step s2: the run finished in {finished:.1} s, each step once; a Deployment scaled in {scaled:.1} s ({} writes failed)",
        failed.len()
    ));

    // 5. A control-plane machine cut off: its apiserver refuses writes (no etcd on its side),
    // everything else goes on; back on the network, it serves again.
    let t = Instant::now();
    d.cp3.link(false);
    let port = d.c.server().rsplit(':').next().unwrap().to_owned();
    let inside = |d: &Drill, name: &str| {
        d.cp3.exec(
            "kubectl",
            &[
                "--kubeconfig",
                &d.c.kubeconfig.display().to_string(),
                "--server",
                &format!("https://127.0.0.1:{port}"),
                "--request-timeout=70s",
                "create",
                "configmap",
                name,
            ],
        )
    };
    let started = Instant::now();
    let refused = inside(&d, "cut-off");
    let refused_in = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(
        !refused.status.success() && refused_in < 65.0,
        "a write on the cut-off machine: {stderr}"
    );
    let resumed = d.writes_resumed(Instant::now());
    // The cluster marks the machine's node not ready once its heartbeats stop for the grace
    // period; until then the scheduler may, as upstream's does, bind a new pod there, where it
    // could not start.
    d.eventually(
        Duration::from_secs(90),
        &[
            "get",
            "node",
            "cp3",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        |s| !s.is_empty() && s != "True",
    );
    let unready_in = t.elapsed().as_secs_f64();
    let scaled = d.check(3);
    d.cp3.link(true);
    let back = Instant::now();
    let deadline = back + Duration::from_secs(60);
    while !inside(&d, "rejoined").status.success() {
        assert!(Instant::now() < deadline, "cp3 never served writes again");
        std::thread::sleep(Duration::from_millis(500));
    }
    let failed = d.failures_since(t);
    d.report.push(format!(
        "cp3 cut off: its apiserver refused a write in {refused_in:.1} s ({}); elsewhere writes went on (next in {resumed:.2} s, {} failed); its node was marked not ready {unready_in:.0} s after the cut and a Deployment then scaled in {scaled:.1} s; back on the network it wrote again in {:.1} s",
        stderr.lines().last().unwrap_or_default(),
        failed.len(),
        back.elapsed().as_secs_f64()
    ));

    // 6. The API's history under each fault again, recorded by clients and watchers (as
    // informers) and checked for linearizability: each in a namespace of its own.
    d.linearizable_under_faults();

    d.stop.store(true, Ordering::SeqCst);
    let (acked, failed) = {
        let l = d.ledger.lock().unwrap();
        (l.acked.len(), l.failed.len())
    };
    let moves = d.seen.lock().unwrap().moves.len();
    println!(
        "HA drill: {acked} writes acknowledged, {failed} failed, the watch moved {moves} times"
    );
    for line in &d.report {
        println!("recovery: {line}");
    }
}

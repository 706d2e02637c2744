//! Virtual nodes (`minik8s-vnode`) against a real apiserver, scheduler and workload
//! controllers, with the library's fake provider (which runs nothing, as virtual-kubelet's
//! mock provider) behind them:
//!
//! - one replica serves several nodes: Nodes registered with the provider taint, pods of a
//!   Deployment scheduled onto them and Running, `kubectl logs` through the apiserver and the
//!   shared kubelet endpoint, graceful deletion finished by the provider's terminal status,
//!   a pod lost by the provider reported Failed and replaced, a pod force-deleted from the
//!   API deleted in the provider, a node gone from the provider gone from the API;
//! - three replicas share six nodes two each; one is killed (its runtime dropped: no
//!   release) and the others take its nodes over after the lease duration, adopting what
//!   runs (nothing created again, no pod changes phase); one stops cleanly and its nodes are
//!   taken over at once; every provider call is recorded, and no node's calls ever come from
//!   two replicas at overlapping times.
//!
//! Each replica runs on its own runtime, so killing one stops every task of it at once.

use minik8s_conformance::Cluster;
use minik8s_vnode::fake::{Backend, CallLog, Fake};
use minik8s_vnode::{Config, Discovered};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One replica of the virtual-node process, on a runtime of its own.
struct Replica {
    rt: Option<tokio::runtime::Runtime>,
    stop: CancellationToken,
    done: Option<tokio::task::JoinHandle<()>>,
    discover: mpsc::UnboundedSender<Discovered>,
}

impl Replica {
    fn start(
        kubeconfig: &Path,
        ca: &Path,
        cfg: Config,
        nodes: &[Arc<Backend>],
        log: &Arc<CallLog>,
    ) -> Replica {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt
            .block_on(minik8s_kubeconfig::client(kubeconfig))
            .expect("client");
        let (tx, rx) = mpsc::unbounded_channel();
        for b in nodes {
            let fake = Fake::new(b.clone(), &cfg.identity, Some(log.clone()));
            tx.send(Discovered::Up(
                minik8s_vnode::fake::info(&b.name, 10),
                Arc::new(fake),
            ))
            .unwrap();
        }
        let stop = CancellationToken::new();
        let mut cfg = cfg;
        cfg.client_ca = Some(ca.to_owned());
        let token = stop.clone();
        let done = rt.spawn(async move {
            if let Err(e) = minik8s_vnode::run(client, cfg, rx, None, token).await {
                eprintln!("vnode replica: {e}");
            }
        });
        Replica {
            rt: Some(rt),
            stop,
            done: Some(done),
            discover: tx,
        }
    }

    /// Stops cleanly (the Leases are released).
    fn stop(&mut self) {
        self.stop.cancel();
        if let (Some(rt), Some(done)) = (self.rt.as_ref(), self.done.take()) {
            let _ =
                rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), done).await });
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
    }

    /// Dies at once, as SIGKILL: every task stops where it is, nothing is released.
    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(identity: &str, fast: bool) -> Config {
    let mut cfg = Config::new("fake", identity);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.resync = Duration::from_secs(2);
    if fast {
        // Short Leases keep the test quick; the rules are the same at 40 s.
        cfg.lease_duration = Duration::from_secs(6);
        cfg.renew_interval = Duration::from_secs(2);
    }
    cfg
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: NAME}
spec:
  replicas: REPLICAS
  selector: {matchLabels: {app: NAME}}
  template:
    metadata:
      labels: {app: NAME, minik8s.io/vnode-provider: fake}
    spec:
      nodeSelector: {type: virtual-kubelet}
      tolerations:
      - {key: virtual-kubelet.io/provider, operator: Equal, value: fake, effect: NoSchedule}
      containers:
      - {name: main, image: example.invalid/app:1}
"#;

fn deployment(name: &str, replicas: usize) -> String {
    DEPLOYMENT
        .replace("NAME", name)
        .replace("REPLICAS", &replicas.to_string())
}

/// `name phase node` of every pod labelled `app=<app>`.
fn pods(c: &Cluster, app: &str) -> Vec<(String, String, String)> {
    let out = c.ok(&[
        "get",
        "pods",
        "-l",
        &format!("app={app}"),
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((
                w.next()?.to_owned(),
                w.next().unwrap_or("").to_owned(),
                w.next().unwrap_or("").to_owned(),
            ))
        })
        .collect()
}

fn running(c: &Cluster, app: &str, n: usize) -> Vec<(String, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = pods(c, app);
        if p.len() == n && p.iter().all(|(_, phase, _)| phase == "Running") {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "pods of {app} not all Running: {p:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The holder of each node Lease of the fake provider.
fn holders(c: &Cluster) -> BTreeMap<String, String> {
    let out = c.ok(&[
        "get",
        "leases",
        "-n",
        "kube-node-lease",
        "-l",
        "minik8s.io/vnode-provider=fake,!minik8s.io/vnode-replica",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.holderIdentity}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| {
            let (n, h) = l.split_once(' ')?;
            Some((n.to_owned(), h.trim().to_owned()))
        })
        .collect()
}

fn shares(holders: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for h in holders.values().filter(|h| !h.is_empty()) {
        *m.entry(h.clone()).or_insert(0) += 1;
    }
    m
}

#[test]
fn one_replica_serves_several_virtual_nodes() {
    let c = Cluster::start();
    c.run_named_controllers(
        &["scheduler", "replicaset", "deployment", "podgc"],
        c.shutdown_token(),
    );
    let log = Arc::new(CallLog::default());
    let backends: Vec<_> = (0..3).map(|i| Backend::new(&format!("vn-{i}"))).collect();
    let mut replica = Replica::start(
        &c.kubeconfig,
        c.ca_path(),
        config("r1", false),
        &backends,
        &log,
    );

    // The nodes: registered, Ready, tainted, labelled.
    let nodes = c.eventually(
        &["get", "nodes", "-l", "type=virtual-kubelet", "--no-headers"],
        |o| o.lines().filter(|l| l.contains(" Ready ")).count() == 3,
    );
    assert!(
        nodes.contains("vn-0") && nodes.contains("v1.33.0-minik8s-vnode"),
        "{nodes}"
    );
    let taints = c.ok(&["get", "node", "vn-1", "-o", "jsonpath={.spec.taints}"]);
    assert!(
        taints.contains("virtual-kubelet.io/provider") && taints.contains("NoSchedule"),
        "{taints}"
    );
    let lease = c.ok(&[
        "get",
        "lease",
        "-n",
        "kube-node-lease",
        "vn-2",
        "-o",
        "jsonpath={.spec.holderIdentity} {.spec.leaseDurationSeconds}",
    ]);
    assert_eq!(lease, "r1 40");

    // A Deployment's pods run on them.
    let applied = c.with_manifest(&["apply"], &deployment("web", 4));
    assert!(applied.ok, "{applied:?}");
    let p = running(&c, "web", 4);
    assert!(
        p.iter().all(|(_, _, node)| node.starts_with("vn-")),
        "{p:?}"
    );
    let total: usize = backends.iter().map(|b| b.running()).sum();
    assert_eq!(total, 4, "the provider runs every pod");
    let wide = c.ok(&["get", "pods", "-l", "app=web", "-o", "wide"]);
    assert!(
        wide.contains("10.255."),
        "pod IPs from the provider: {wide}"
    );

    // kubectl logs goes through the apiserver to the shared kubelet endpoint.
    let (pod, _, node) = p[0].clone();
    let logs = c.ok(&["logs", &pod, "--tail=2"]);
    assert_eq!(logs.lines().count(), 2, "{logs}");
    assert!(
        logs.contains(&format!("main of default/{pod} on {node}: line 3")),
        "{logs}"
    );

    // Graceful deletion: the provider stops it, then the pod is gone; it is replaced.
    c.ok(&["delete", "pod", &pod, "--wait=true", "--timeout=30s"]);
    assert!(c.fails(&["get", "pod", &pod]).contains("NotFound"));
    running(&c, "web", 4);
    let calls = log.calls();
    assert!(
        calls.iter().any(|k| k.call == "delete_pod"),
        "the provider was asked to delete"
    );

    // A pod the provider lost is reported Failed (and the ReplicaSet replaces it).
    let (lost, _, lost_node) = pods(&c, "web")[0].clone();
    let backend = backends.iter().find(|b| b.name == lost_node).unwrap();
    assert!(backend.lose("default", &lost));
    let reason = c.eventually(
        &[
            "get",
            "pod",
            &lost,
            "-o",
            "jsonpath={.status.phase} {.status.reason}",
            "--ignore-not-found",
        ],
        |o| o == "Failed NotFound" || o.is_empty(),
    );
    assert!(reason == "Failed NotFound" || reason.is_empty(), "{reason}");
    c.ok(&[
        "delete",
        "pod",
        &lost,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=30s",
    ]);

    // A pod force-deleted from the API is deleted in the provider at the next resync.
    let (forced, _, forced_node) = running(&c, "web", 4)[0].clone();
    let backend = backends
        .iter()
        .find(|b| b.name == forced_node)
        .unwrap()
        .clone();
    let before = backend.running();
    c.ok(&["delete", "pod", &forced, "--grace-period=0", "--force"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while backend.runs("default", &forced) {
        assert!(
            Instant::now() < deadline,
            "the dangling pod stayed in the provider"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(backend.running() <= before);

    // Nodes at capacity (10 pods each here): the rest stay Pending, as the scheduler says.
    c.ok(&["scale", "deployment", "web", "--replicas=32"]);
    // Wait for the settled state (30 Running, 2 unscheduled): a pod just created, or bound
    // but not started yet, is Pending too for a moment.
    let deadline = Instant::now() + Duration::from_secs(60);
    let pod = loop {
        let p = pods(&c, "web");
        let unscheduled: Vec<_> = p
            .iter()
            .filter(|(_, ph, node)| ph == "Pending" && node.is_empty())
            .collect();
        let started = p.iter().filter(|(_, ph, _)| ph == "Running").count();
        if p.len() == 32 && started == 30 && unscheduled.len() == 2 {
            break unscheduled[0].0.clone();
        }
        assert!(
            Instant::now() < deadline,
            "not 30 Running and 2 unscheduled: {p:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let why = c.eventually(&["describe", "pod", &pod], |d| d.contains("Too many pods"));
    assert!(why.contains("FailedScheduling"), "{why}");
    c.ok(&["scale", "deployment", "web", "--replicas=4"]);
    running(&c, "web", 4);

    // A node gone from its provider: the Node goes, its pods are rescheduled elsewhere.
    replica
        .discover
        .send(Discovered::Down("vn-0".into()))
        .unwrap();
    c.eventually(
        &["get", "nodes", "-l", "type=virtual-kubelet", "--no-headers"],
        |o| !o.contains("vn-0") && o.lines().count() == 2,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = pods(&c, "web");
        if p.len() == 4 && p.iter().all(|(_, ph, n)| ph == "Running" && n != "vn-0") {
            break;
        }
        assert!(Instant::now() < deadline, "pods not moved off vn-0: {p:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
    replica.stop();
    assert!(log.overlap().is_none());
}

#[test]
fn replicas_share_nodes_and_take_over_without_serving_one_node_twice() {
    let c = Cluster::start();
    c.run_named_controllers(
        &["scheduler", "replicaset", "deployment"],
        c.shutdown_token(),
    );
    let log = Arc::new(CallLog::default());
    let backends: Vec<_> = (0..6).map(|i| Backend::new(&format!("vs-{i}"))).collect();
    let mut replicas: HashMap<&str, Replica> = ["a", "b", "c"]
        .into_iter()
        .map(|id| {
            (
                id,
                Replica::start(
                    &c.kubeconfig,
                    c.ca_path(),
                    config(id, true),
                    &backends,
                    &log,
                ),
            )
        })
        .collect();

    // The six nodes are shared two each (the load-level wait before each race).
    let deadline = Instant::now() + Duration::from_secs(30);
    let start = loop {
        let h = holders(&c);
        if h.len() == 6 && h.values().all(|x| !x.is_empty()) {
            break h;
        }
        assert!(Instant::now() < deadline, "leases not all held: {h:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(1));
    let s = shares(&holders(&c));
    println!("shares after the start: {s:?} ({start:?})");
    let (max, min) = (*s.values().max().unwrap(), *s.values().min().unwrap());
    assert_eq!(s.len(), 3, "every replica holds some: {s:?}");
    assert!(max <= 2 * min, "max/min ≤ 2: {s:?}");

    let applied = c.with_manifest(&["apply"], &deployment("spread", 12));
    assert!(applied.ok, "{applied:?}");
    let before = running(&c, "spread", 12);
    let created: u32 = backends
        .iter()
        .map(|b| b.created.load(Ordering::Relaxed))
        .sum();
    assert_eq!(created, 12);

    // Watch every pod's phase from now on: none may change.
    let phases = |c: &Cluster| pods(c, "spread");

    // Kill the replica holding most (no release): the others take over after the lease
    // duration, adopting what runs.
    let victim = s.iter().max_by_key(|(_, n)| **n).unwrap().0.clone();
    let victims: Vec<String> = holders(&c)
        .into_iter()
        .filter(|(_, h)| *h == victim)
        .map(|(n, _)| n)
        .collect();
    let killed = Instant::now();
    replicas.get_mut(victim.as_str()).unwrap().kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = holders(&c);
        if victims
            .iter()
            .all(|n| h.get(n).is_some_and(|x| !x.is_empty() && *x != victim))
        {
            break;
        }
        assert!(Instant::now() < deadline, "not taken over: {h:?}");
        assert_eq!(phases(&c), before, "no pod changes while a replica is down");
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = killed.elapsed();
    println!(
        "killed replica {victim}: its {} nodes taken over in {took:.1?}",
        victims.len()
    );
    assert!(
        took >= Duration::from_secs(3),
        "not before the lease lapses: {took:?}"
    );
    assert!(
        took <= Duration::from_secs(6 + 2 + 3),
        "within the lease duration plus a renew: {took:?}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(phases(&c), before, "no pod changed phase");
    let created: u32 = backends
        .iter()
        .map(|b| b.created.load(Ordering::Relaxed))
        .sum();
    assert_eq!(created, 12, "adopted, not created again");

    // A clean stop releases at once: the take-over takes about a race.
    let s = shares(&holders(&c));
    let leaving = s.keys().next().unwrap().clone();
    let leaving_nodes: Vec<String> = holders(&c)
        .into_iter()
        .filter(|(_, h)| *h == leaving)
        .map(|(n, _)| n)
        .collect();
    let stopped = Instant::now();
    replicas.get_mut(leaving.as_str()).unwrap().stop();
    println!("replica {leaving} stopped in {:.1?}", stopped.elapsed());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = holders(&c);
        if leaving_nodes
            .iter()
            .all(|n| h.get(n).is_some_and(|x| !x.is_empty() && *x != leaving))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not taken over after a release: {h:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "stopped replica {leaving}: its {} nodes taken over in {:.1?}",
        leaving_nodes.len(),
        stopped.elapsed()
    );
    assert!(stopped.elapsed() < Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(phases(&c), before, "no pod changed phase");
    let created: u32 = backends
        .iter()
        .map(|b| b.created.load(Ordering::Relaxed))
        .sum();
    assert_eq!(created, 12, "adopted, not created again");

    // Pods still come and go through the last replica.
    c.ok(&["scale", "deployment", "spread", "--replicas=3"]);
    running(&c, "spread", 3);
    let total: usize = backends.iter().map(|b| b.running()).sum();
    assert_eq!(total, 3);

    drop(replicas);
    if let Some((a, b)) = log.overlap() {
        panic!("two replicas served {} at once: {a:?} and {b:?}", a.node);
    }
}

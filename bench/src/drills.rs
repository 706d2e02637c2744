//! Fault drills on a real multi-node cluster (`minik8s init` plus two joined machines), each
//! asserting what must survive and measuring how long recovery takes:
//!
//! 1. **Control plane crash**: SIGKILL `minik8s init` (apiserver, controllers, the control
//!    plane node's kubelet) under a write load, then start it again. No acknowledged write is
//!    lost, the Service keeps answering throughout (the nodes' rules stay), and the
//!    Deployment, its ReplicaSet and its HPA carry on with the same pods.
//! 2. **Kubelet crash**: SIGKILL a node's `minik8s join` (kubelet and proxy). Its pods keep
//!    serving; the restarted kubelet adopts them (same containers, no restarts).
//! 3. **Node failure**: a node loses its kubelet, proxy, containerd and network.
//!    It goes NotReady after the grace period, its pods are evicted once their toleration
//!    runs out and are recreated on the other nodes, and the Service's endpoints follow. When
//!    it comes back, its stale pods are cleaned up (API and runtime).
//!
//! `cargo run -p minik8s-bench --bin fault-drill` runs them and prints the report; the
//! conformance suite runs the same functions.

use minik8s_conformance::machines::{HOST_IP, InitCluster, Machine};
use minik8s_conformance::node::free_port;
use minik8s_conformance::node::http_get;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The node monitor grace period the drills' cluster runs with.
pub const GRACE: &str = "16s";
/// The pods' toleration of `unreachable` / `not-ready` NoExecute taints, in seconds.
pub const TOLERATION_SECONDS: u32 = 2;

const WEB: &str = r#"
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
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: TOL}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: TOL}
      containers:
      - name: web
        image: busybox
        # The machines have no registry (their images are imported): no pull attempt that
        # could only time out.
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 8080 -h /www"]
        resources: {requests: {cpu: 100m, memory: 32Mi}}
        readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// What a drill did and measured.
#[derive(Debug, Default)]
pub struct Report {
    /// The drill's name.
    pub drill: &'static str,
    /// What happened, in order.
    pub steps: Vec<String>,
    /// Measured recovery times.
    pub timings: Vec<(&'static str, Duration)>,
}

impl Report {
    fn step(&mut self, s: impl Into<String>) {
        let s = s.into();
        eprintln!("  [{}] {s}", self.drill);
        self.steps.push(s);
    }

    fn time(&mut self, what: &'static str, d: Duration) {
        eprintln!("  [{}] {what}: {} ms", self.drill, d.as_millis());
        self.timings.push((what, d));
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "drill: {}", self.drill)?;
        for s in &self.steps {
            writeln!(f, "  - {s}")?;
        }
        for (what, d) in &self.timings {
            writeln!(f, "  {what}: {:.2} s", d.as_secs_f64())?;
        }
        Ok(())
    }
}

/// The drills' cluster: the control plane (node `cp`) and machines `w1` and `w2`, running a
/// 4-replica web Deployment behind a NodePort Service and an HPA.
pub struct Drills {
    // The machines come first: they drop (and tear down) before the control plane, whose
    // folder holds theirs.
    /// The first joined machine.
    pub w1: Machine,
    /// The second joined machine.
    pub w2: Machine,
    /// The control plane.
    pub c: InitCluster,
    /// The Service's node port.
    pub node_port: String,
}

/// One pod of the web Deployment: name, uid, node, IP, container id, restarts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WebPod {
    /// Name.
    pub name: String,
    /// Uid.
    pub uid: String,
    /// Node.
    pub node: String,
    /// Pod IP.
    pub ip: String,
    /// The container's id.
    pub container: String,
    /// The container's restart count.
    pub restarts: String,
    /// Whether it is being deleted.
    pub deleting: bool,
}

impl Drills {
    /// Brings the cluster up with short timings and deploys the workload.
    pub fn start() -> Self {
        let c = InitCluster::start_with(free_port(), &["--node-monitor-grace-period", GRACE]);
        let w1 = c.join_machine("w1", 2);
        let w2 = c.join_machine("w2", 3);
        // The scheduler rebuilds its node view at most once a second: let it see both
        // machines before the pods come, so they spread over all three nodes.
        std::thread::sleep(Duration::from_secs(2));
        let web = WEB.replace("TOL", &TOLERATION_SECONDS.to_string());
        let r = c.kubectl_stdin(&["apply", "-f", "-"], &web);
        assert!(r.ok, "{}", r.stderr);
        let rolled = c.kubectl(&["rollout", "status", "deployment/web", "--timeout=90s"]);
        if !rolled.ok {
            for args in [
                &["get", "pods", "-A", "-o", "wide"][..],
                &["get", "nodes", "-o", "wide"],
                &["describe", "nodes"],
                &["get", "events", "-A"],
            ] {
                eprintln!(
                    "$ kubectl {}\n{}{}",
                    args.join(" "),
                    c.kubectl(args).stdout,
                    c.kubectl(args).stderr
                );
            }
            panic!("the web Deployment did not roll out: {}", rolled.stderr);
        }
        c.ok(&[
            "autoscale",
            "deployment",
            "web",
            "--min=4",
            "--max=6",
            "--cpu-percent=80",
        ]);
        let node_port = c.ok(&[
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ]);
        let d = Drills {
            c,
            w1,
            w2,
            node_port,
        };
        let nodes: BTreeSet<String> = d.pods().into_iter().map(|p| p.node).collect();
        assert_eq!(
            nodes.len(),
            3,
            "the pods spread over the three nodes: {nodes:?}"
        );
        d
    }

    /// The web pods now.
    pub fn pods(&self) -> Vec<WebPod> {
        let out = self.c.ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.status.podIP} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ]);
        let mut pods: Vec<WebPod> = out
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split(' ').collect();
                Some(WebPod {
                    name: w.first()?.to_string(),
                    uid: w.get(1)?.to_string(),
                    node: w.get(2)?.to_string(),
                    ip: w.get(3)?.to_string(),
                    container: w.get(4)?.to_string(),
                    restarts: w.get(5)?.to_string(),
                    deleting: w.get(6).is_some_and(|d| !d.is_empty()),
                })
            })
            .collect();
        pods.sort();
        pods
    }

    /// The names of the web pods that are Ready.
    fn ready_pods(&self) -> BTreeSet<String> {
        self.c
            .kubectl(&[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
            ])
            .stdout
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split(' ').collect();
                (w.get(1) == Some(&"True") && w.get(2).is_none_or(|d| d.is_empty()))
                    .then(|| w[0].to_owned())
            })
            .collect()
    }

    fn node_ready(&self, node: &str) -> String {
        self.c
            .kubectl(&[
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .stdout
    }

    fn wait(&self, limit: Duration, what: &str, done: impl Fn() -> bool) -> Duration {
        let started = Instant::now();
        while !done() {
            assert!(
                started.elapsed() < limit,
                "{what} did not happen within {} s",
                limit.as_secs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        started.elapsed()
    }

    /// Drill 1: the control plane is SIGKILLed under load and started again.
    pub fn control_plane_crash(&mut self) -> Report {
        let mut r = Report {
            drill: "control plane crash",
            ..Default::default()
        };
        let before = self.pods();
        let stop = Arc::new(AtomicBool::new(false));
        // A write load: ConfigMaps created one after another; only acknowledged ones count.
        let writer = {
            let stop = stop.clone();
            let kubeconfig = self.c.kubeconfig.clone();
            std::thread::spawn(move || write_load(&kubeconfig, &stop))
        };
        // The Service, probed through the NodePort of a joined node, all along.
        let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let prober = {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            let addr = format!("{}:{}", self.w1.ip, self.node_port);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match http_get(&addr) {
                        Some(_) => ok.fetch_add(1, Ordering::Relaxed),
                        None => failed.fetch_add(1, Ordering::Relaxed),
                    };
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        std::thread::sleep(Duration::from_secs(2));
        self.c.kill9();
        let killed = Instant::now();
        r.step("SIGKILLed minik8s init (apiserver, controllers, cp's kubelet) under a write load");
        std::thread::sleep(Duration::from_secs(3));
        let restarted = Instant::now();
        self.c.restart();
        r.step("started minik8s init again on the same data folder");
        self.wait(Duration::from_secs(60), "the apiserver serving", || {
            self.c.kubectl(&["get", "--raw", "/readyz"]).ok
        });
        r.time(
            "control plane back and serving (from restart)",
            restarted.elapsed(),
        );
        r.time("write outage (kill to serving)", killed.elapsed());
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        let acked = writer.join().expect("the writer");
        prober.join().expect("the prober");
        let stored: BTreeSet<String> = self
            .c
            .ok(&["get", "configmaps", "-l", "drill=writes", "-o", "name"])
            .lines()
            .map(|l| l.trim_start_matches("configmap/").to_owned())
            .collect();
        let lost: Vec<&String> = acked.iter().filter(|n| !stored.contains(*n)).collect();
        assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
        r.step(format!(
            "{} acknowledged writes, all stored after the restart",
            acked.len()
        ));
        let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
        assert!(ok > 20, "the prober ran ({ok} answers)");
        assert_eq!(
            failed,
            0,
            "the Service failed {failed} of {} probes",
            ok + failed
        );
        r.step(format!(
            "the Service answered all {ok} probes through a node's NodePort throughout"
        ));
        // The controllers resync and change nothing: same pods, one ReplicaSet, the HPA.
        std::thread::sleep(Duration::from_secs(5));
        self.c
            .ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
        let after = self.pods();
        let names = |p: &[WebPod]| p.iter().map(|p| p.uid.clone()).collect::<BTreeSet<_>>();
        assert_eq!(
            names(&after),
            names(&before),
            "the same pods before and after: {before:?} → {after:?}"
        );
        let rs = self
            .c
            .ok(&["get", "replicasets", "-l", "app=web", "-o", "name"]);
        assert_eq!(rs.lines().count(), 1, "one ReplicaSet: {rs}");
        let hpa = self.c.ok(&[
            "get",
            "hpa",
            "web",
            "-o",
            "jsonpath={.spec.minReplicas} {.status.desiredReplicas}",
        ]);
        assert!(hpa.starts_with("4 "), "the HPA carries on: {hpa}");
        r.step("the Deployment, its one ReplicaSet and its HPA carried on with the same 4 pods");
        r
    }

    /// Drill 2: a node's kubelet (and proxy) is SIGKILLed and started again.
    pub fn kubelet_crash(&mut self) -> Report {
        let mut r = Report {
            drill: "kubelet crash",
            ..Default::default()
        };
        let on_w1: Vec<WebPod> = self
            .pods()
            .into_iter()
            .filter(|p| p.node == self.w1.name)
            .collect();
        assert!(!on_w1.is_empty(), "pods on w1");
        self.w1.kill9();
        r.step(format!(
            "SIGKILLed w1's minik8s join (kubelet and proxy); {} pods there",
            on_w1.len()
        ));
        std::thread::sleep(Duration::from_secs(1));
        for p in &on_w1 {
            assert!(
                http_get(&format!("{}:8080", p.ip)).is_some_and(|b| b == p.name),
                "{} keeps serving while its kubelet is down",
                p.name
            );
        }
        r.step("its pods kept serving while the kubelet was down");
        let restarted = Instant::now();
        let restarted_at = jiff::Timestamp::now();
        self.w1.restart();
        // Back when it renews its Lease again.
        let back = self.wait(Duration::from_secs(60), "w1's kubelet heartbeat", || {
            self.c
                .kubectl(&[
                    "get",
                    "lease",
                    "-n",
                    "kube-node-lease",
                    "w1",
                    "-o",
                    "jsonpath={.spec.renewTime}",
                ])
                .stdout
                .parse::<jiff::Timestamp>()
                .is_ok_and(|t| t > restarted_at)
        });
        r.time("kubelet back (restart to heartbeat)", back);
        self.wait(Duration::from_secs(60), "w1's pods Ready again", || {
            let ready = self.ready_pods();
            on_w1.iter().all(|p| ready.contains(&p.name))
        });
        r.time(
            "kubelet adopt (restart to its pods Ready)",
            restarted.elapsed(),
        );
        let now: BTreeMap<String, WebPod> = self
            .pods()
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        for p in &on_w1 {
            let n = now.get(&p.name).expect("the pod is still there");
            assert_eq!(
                (&n.container, &n.restarts),
                (&p.container, &p.restarts),
                "{} was adopted, not restarted",
                p.name
            );
        }
        r.step("the restarted kubelet adopted every pod: same containers, no restarts");
        r
    }

    /// Drill 3: a whole node fails (kubelet, proxy and containerd killed, link down) and later
    /// comes back (a new containerd finds the containers its shims kept).
    pub fn node_failure(&mut self) -> Report {
        let mut r = Report {
            drill: "node failure",
            ..Default::default()
        };
        let on_w2: Vec<WebPod> = self
            .pods()
            .into_iter()
            .filter(|p| p.node == self.w2.name)
            .collect();
        assert!(!on_w2.is_empty(), "pods on w2");
        self.w2.kill9();
        self.w2.signal_runtime("KILL");
        self.w2.link(false);
        let failed = Instant::now();
        r.step(format!(
            "w2 failed: kubelet, proxy and containerd killed, link down ({} pods there)",
            on_w2.len()
        ));
        let detected = self.wait(Duration::from_secs(90), "w2 NotReady", || {
            self.node_ready("w2") == "Unknown"
        });
        r.time("node failure detected (Ready=Unknown)", detected);
        let gone = |d: &Drills| {
            let now = d.pods();
            on_w2
                .iter()
                .all(|p| now.iter().all(|n| n.uid != p.uid || n.deleting))
        };
        self.wait(Duration::from_secs(60), "w2's pods evicted", || gone(self));
        r.time("its pods evicted (from the failure)", failed.elapsed());
        self.wait(Duration::from_secs(90), "4 Ready pods elsewhere", || {
            let ready = self.ready_pods();
            ready.len() == 4 && on_w2.iter().all(|p| !ready.contains(&p.name))
        });
        r.time(
            "node failure to replacement pods Ready elsewhere",
            failed.elapsed(),
        );
        // The Service follows: its endpoints are the live pods, and it answers with them.
        let live: BTreeMap<String, String> = self
            .pods()
            .into_iter()
            .filter(|p| !p.deleting && p.node != "w2")
            .map(|p| (p.ip, p.name))
            .collect();
        let eps = self.c.ok(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "jsonpath={range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]} {end}",
        ]);
        let ready_eps: BTreeSet<String> = eps.split_whitespace().map(str::to_owned).collect();
        assert_eq!(
            ready_eps,
            live.keys().cloned().collect(),
            "the Service's ready endpoints are the live pods"
        );
        let names: BTreeSet<String> = live.values().cloned().collect();
        let seen = minik8s_conformance::node::answers_from(
            &format!("{HOST_IP}:{}", self.node_port),
            &names,
        );
        assert_eq!(seen, names, "the Service answers with the live pods");
        r.step("the Service's endpoints followed the pods to the live nodes");

        // w2 comes back: its kubelet cleans up the pods that were evicted meanwhile.
        self.w2.link(true);
        let back = Instant::now();
        self.w2.restart();
        let ready = self.wait(Duration::from_secs(60), "w2 Ready again", || {
            self.node_ready("w2") == "True"
        });
        r.time("node back (restart to Ready)", ready);
        let stale: BTreeSet<String> = on_w2.iter().map(|p| p.uid.clone()).collect();
        let socket = minik8s_kubelet::cri::socket_in(&self.w2.runtime_dir());
        self.wait(
            Duration::from_secs(60),
            "w2's stale pods cleaned up",
            || {
                let in_api = self.pods().iter().any(|p| stale.contains(&p.uid));
                !in_api && runtime_uids(&socket).is_disjoint(&stale)
            },
        );
        r.time("stale pods cleaned up (from the restart)", back.elapsed());
        r.step("the returning node removed its evicted pods from the API and its runtime");
        self.c
            .ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
        r
    }
}

/// The pod uids whose sandboxes a runtime holds.
fn runtime_uids(socket: &std::path::Path) -> BTreeSet<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let Ok(cri) = minik8s_kubelet::cri::Cri::connect(socket).await else {
            return BTreeSet::new();
        };
        cri.sandboxes(Default::default())
            .await
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| s.labels.get(minik8s_kubelet::cri::labels::POD_UID).cloned())
            .collect()
    })
}

/// Creates ConfigMaps `drill-<n>` until `stop`; returns the names the apiserver acknowledged.
fn write_load(kubeconfig: &std::path::Path, stop: &AtomicBool) -> Vec<String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut acked = Vec::new();
        let mut client = None;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if client.is_none() {
                client = minik8s_kubeconfig::client(kubeconfig).await.ok();
            }
            let Some(c) = client.clone() else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            n += 1;
            let name = format!("drill-{n}");
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"drill": "writes"}},
                "data": {"n": n.to_string()},
            }))
            .expect("a ConfigMap");
            let api: kube::Api<ConfigMap> = kube::Api::namespaced(c, "default");
            match tokio::time::timeout(Duration::from_secs(2), api.create(&Default::default(), &cm))
                .await
            {
                Ok(Ok(_)) => acked.push(name),
                _ => {
                    // Refused or unanswered: not acknowledged. A new connection next time.
                    client = None;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        acked
    })
}

//! Leader election between two real controller-manager processes (`minik8s
//! controller-manager`): one leads, killing it
//! (SIGKILL, no release) hands over within 15 s, and the Deployment it managed is never
//! over-created (pods ≤ replicas + maxSurge, one ReplicaSet per template).

use minik8s_conformance::Cluster;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Replica {
    child: Child,
}

impl Replica {
    fn start(kubeconfig: &std::path::Path, identity: &str) -> Replica {
        // `minik8s controller-manager` is the controller-manager binary's command.
        let child = Command::new(minik8s_conformance::node::bin("minik8s"))
            .args(["controller-manager", "--kubeconfig"])
            .arg(kubeconfig)
            .args(["--leader-elect-identity", identity])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("controller-manager starts");
        Replica { child }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn killing_the_leader_hands_over_within_15s_without_double_creation() {
    let c = Cluster::start();
    c.run_sim_nodes(2);
    let kubeconfig = c.user_kubeconfig("system:kube-controller-manager", &[]);
    let mut replicas = [
        Some(Replica::start(&kubeconfig, "cm-a")),
        Some(Replica::start(&kubeconfig, "cm-b")),
    ];
    let lease = [
        "get",
        "lease",
        "-n",
        "kube-system",
        "kube-controller-manager",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ];
    let holder = || c.kubectl(&lease).stdout;
    let first = c.eventually(&lease, |o| o == "cm-a" || o == "cm-b");

    // Watch the pod count the whole time: it must never pass replicas + maxSurge.
    let max_pods = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (max_pods, stop) = (max_pods.clone(), stop.clone());
        let kubeconfig = c.kubeconfig.clone();
        let home = c.dir().to_owned();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = Command::new("kubectl")
                    .args(["get", "pods", "-l", "app=web", "-o", "jsonpath={range .items[*]}{.metadata.name}={.metadata.deletionTimestamp}{\"\\n\"}{end}"])
                    .env("KUBECONFIG", &kubeconfig)
                    .env("HOME", &home)
                    .output()
                    .expect("kubectl");
                let text = String::from_utf8_lossy(&out.stdout);
                let live = text.lines().filter(|l| l.ends_with('=')).count();
                max_pods.fetch_max(live, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=4",
    ]);
    let status = c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert!(status.contains("successfully rolled out"), "{status}");

    // SIGKILL the leader: the other takes over within 15 s.
    let killed = Instant::now();
    let idx = usize::from(first == "cm-b");
    replicas[idx].take();
    let next = if first == "cm-a" { "cm-b" } else { "cm-a" };
    while holder() != next {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "no handover within 15 s (holder {})",
            holder()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let handover = killed.elapsed();
    eprintln!("handover after {handover:?}");

    // The new leader manages the same Deployment: a rollout and a scale complete, without
    // duplicate ReplicaSets or extra pods.
    c.ok(&["set", "image", "deployment/web", "busybox=busybox:1.36"]);
    let status = c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert!(status.contains("successfully rolled out"), "{status}");
    let sets = c.ok(&["get", "rs", "-l", "app=web", "-o", "name"]);
    assert_eq!(sets.lines().count(), 2, "{sets}");
    c.eventually(&["get", "pods", "-l", "app=web", "-o", "name"], |o| {
        o.lines().count() == 4
    });
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let max = max_pods.load(Ordering::Relaxed);
    assert!(
        max <= 4 + 1,
        "{max} pods at once for 4 replicas with maxSurge 1"
    );
    drop(replicas);
}

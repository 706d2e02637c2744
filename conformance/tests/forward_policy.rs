//! A node beside Docker: a running Docker sets the `FORWARD` policy to `DROP` and loads
//! `br_netfilter` (so traffic between two pods of one bridge passes `FORWARD` too). Pods must
//! still reach each other and Services. This binary holds one test, so the policy it sets
//! meets no other test's traffic (cargo runs test binaries one after another).

use minik8s_conformance::Cluster;
use minik8s_conformance::node::http_get;
use std::process::Command;

/// Sets `FORWARD`'s policy (and `br_netfilter`'s iptables call) as Docker does, and puts both
/// back on drop, whatever the test did.
struct DockerLikeForwarding {
    policy: String,
    bridge_nf: Option<String>,
}

const BRIDGE_NF: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

impl DockerLikeForwarding {
    fn set() -> Self {
        let out = Command::new("iptables")
            .args(["-w", "-S", "FORWARD", "1"])
            .output()
            .expect("iptables runs");
        let policy = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(2)
            .unwrap_or("ACCEPT")
            .to_owned();
        let bridge_nf = std::fs::read_to_string(BRIDGE_NF).ok();
        if bridge_nf.is_some() {
            std::fs::write(BRIDGE_NF, "1").expect("turn on br_netfilter's iptables call");
        }
        let ok = Command::new("iptables")
            .args(["-w", "-P", "FORWARD", "DROP"])
            .status()
            .expect("iptables runs")
            .success();
        assert!(ok, "setting the FORWARD policy to DROP");
        DockerLikeForwarding { policy, bridge_nf }
    }
}

impl Drop for DockerLikeForwarding {
    fn drop(&mut self) {
        let _ = Command::new("iptables")
            .args(["-w", "-P", "FORWARD", &self.policy])
            .status();
        if let Some(v) = &self.bridge_nf {
            let _ = std::fs::write(BRIDGE_NF, v.trim());
        }
    }
}

fn jsonpath(c: &Cluster, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend(["-o", &p]);
    c.ok(&args)
}

#[test]
fn pods_reach_pods_and_services_when_docker_has_set_forward_to_drop() {
    let _policy = DockerLikeForwarding::set();
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("fw1", 41);

    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=2",
        "--",
        "sh",
        "-c",
        "hostname > /www/index.html; exec httpd -f -p 8080 -h /www",
    ]);
    c.ok(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ]);
    c.ok(&[
        "run",
        "client",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sleep",
        "3600",
    ]);
    c.ok(&[
        "wait",
        "--for=condition=Available",
        "deployment/web",
        "--timeout=120s",
    ]);
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=120s",
    ]);

    // The node reaches each pod (OUTPUT, not FORWARD: the guard must not have broken it).
    let ips = jsonpath(&c, &["pods", "-l", "app=web"], "{.items[*].status.podIP}");
    let ips: Vec<&str> = ips.split_whitespace().collect();
    assert_eq!(ips.len(), 2, "two web pods: {ips:?}");
    for ip in &ips {
        let body = (0..50)
            .find_map(|_| {
                http_get(&format!("{ip}:8080")).or_else(|| {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    None
                })
            })
            .unwrap_or_default();
        assert!(body.starts_with("web-"), "the node reaches {ip}: {body:?}");
    }

    // What the client pod fetches from `url`.
    let fetch = |url: &str| c.ok(&["exec", "client", "--", "wget", "-T", "5", "-qO-", url]);
    // Pod to pod across the bridge (FORWARD with br_netfilter) and pod to the ClusterIP (DNAT,
    // then FORWARD), with the policy DROP.
    for ip in &ips {
        let got = fetch(&format!("http://{ip}:8080/"));
        assert!(got.starts_with("web-"), "client reaches pod {ip}: {got:?}");
    }
    let vip = jsonpath(&c, &["service", "web"], "{.spec.clusterIP}");
    let got = fetch(&format!("http://{vip}/"));
    assert!(
        got.starts_with("web-"),
        "client reaches the Service: {got:?}"
    );
    // And by name, through the cluster DNS.
    let got = fetch("http://web.default.svc.cluster.local/");
    assert!(
        got.starts_with("web-"),
        "client reaches the Service by name: {got:?}"
    );

    let left = node.down();
    assert!(left.is_empty(), "the node left {left:?}");
}

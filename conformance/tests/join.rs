//! A node joins the way a second machine would: the `kubelet` and `kube-proxy` binaries, as
//! their own processes with their own identities, against the cluster's apiserver.

use minik8s_conformance::Cluster;
use minik8s_conformance::node::answers_from;

#[test]
fn a_node_joins_with_its_own_kubelet_and_proxy_processes() {
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.join_node("n2", 2);
    assert!(
        c.ok(&[
            "get",
            "node",
            "n2",
            "-o",
            "jsonpath={.status.nodeInfo.containerRuntimeVersion}"
        ])
        .starts_with("containerd://")
    );

    // A Deployment runs there, behind a ClusterIP the node's own proxy programs.
    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=2",
        "--",
        "sh",
        "-c",
        "hostname > /www/index.html; echo serving; exec httpd -f -p 8080 -h /www",
    ]);
    c.ok(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ]);
    c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let pods: std::collections::BTreeSet<String> = c
        .ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(pods.len(), 2);
    let ips = c.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].status.podIP}",
    ]);
    assert!(
        ips.split_whitespace().all(|ip| ip.starts_with("10.244.2.")),
        "pod IPs on the joined node's bridge: {ips}"
    );
    let vip = c.ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let seen = answers_from(&format!("{vip}:80"), &pods);
    assert_eq!(seen, pods, "the ClusterIP reaches both pods");

    // Logs and exec go through the joined kubelet's server.
    let first = pods.iter().next().unwrap();
    assert_eq!(c.ok(&["logs", first]), "serving\n");
    assert_eq!(
        c.ok(&["exec", first, "--", "cat", "/www/index.html"]),
        format!("{first}\n")
    );

    // SIGTERM stops both processes cleanly; the teardown leaves nothing behind.
    c.ok(&["delete", "deployment", "web"]);
    let (clean, left) = node.down();
    assert!(clean, "the kubelet and kube-proxy exit cleanly on SIGTERM");
    assert!(left.is_empty(), "left behind: {left:?}");
}

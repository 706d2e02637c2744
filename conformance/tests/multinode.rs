//! Several nodes made only with `minik8s init` and `minik8s join`: the control plane on this
//! machine and two machines as network namespaces on one L2 node network (each with its own
//! routes and iptables), joined with a bootstrap token and a CA pin. Pods spread, talk across
//! nodes directly and through Services, NodePorts answer on every node, and `kubectl drain`
//! and `kubectl delete node` move the work; bad tokens and pins are refused and leave nothing.

use minik8s_conformance::machines::InitCluster;
use minik8s_conformance::node::free_port;
use std::collections::BTreeSet;
use std::time::Duration;

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: busybox
        # The machines have no registry (their images are imported): no pull attempt that
        # could only time out.
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "mkdir -p /www; hostname > /www/index.html; exec httpd -f -p 8080 -h /www"]
        resources: {requests: {cpu: 200m, memory: 64Mi}}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// `name node ip` of every pod of the Deployment.
fn placement(c: &InitCluster) -> Vec<(String, String, String)> {
    c.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP}{\"\\n\"}{end}",
    ])
    .lines()
    .filter_map(|l| {
        let mut w = l.split_whitespace();
        Some((
            w.next()?.to_owned(),
            w.next()?.to_owned(),
            w.next().unwrap_or("").to_owned(),
        ))
    })
    .collect()
}

#[test]
fn machines_join_with_a_token_and_share_pods_services_and_maintenance() {
    let c = InitCluster::start(free_port());

    // Refused joins, each with the reason, leaving no Node and no CSR behind.
    let unknown = c.failed_join("bad1", 11, "abcdef.0123456789abcdef", c.ca_hash());
    assert!(
        !unknown.ok
            && unknown.stderr.contains(
                "there is no JWS signed token in the cluster-info ConfigMap. This token id \"abcdef\" is invalid for this cluster, or it has expired"
            ),
        "unknown token: {}",
        unknown.stderr
    );
    let wrong_pin = format!("sha256:{}", "0".repeat(64));
    let pinned = c.failed_join("bad2", 12, c.token(), &wrong_pin);
    assert!(
        !pinned.ok
            && pinned.stderr.contains(
                "cluster CA found in cluster-info ConfigMap is invalid: none of the public keys"
            ),
        "wrong CA pin: {}",
        pinned.stderr
    );
    let short = c.minik8s(&["token", "create", "--ttl", "2s", "--description", "short"]);
    assert!(short.ok, "{}", short.stderr);
    let short = short.stdout.trim().to_owned();
    let short_id = short.split('.').next().unwrap().to_owned();
    assert!(c.minik8s(&["token", "list"]).stdout.contains(&short));
    std::thread::sleep(Duration::from_secs(3));
    let expired = c.failed_join("bad3", 13, &short, c.ca_hash());
    assert!(
        !expired.ok
            && expired.stderr.contains(&format!(
                "This token id \"{short_id}\" is invalid for this cluster, or it has expired"
            )),
        "expired token: {}",
        expired.stderr
    );
    // The token cleaner deleted the expired token's Secret.
    c.eventually(
        Duration::from_secs(10),
        &["get", "secrets", "-n", "kube-system", "-o", "name"],
        |s| !s.contains(&format!("bootstrap-token-{short_id}")),
    );
    assert_eq!(c.ok(&["get", "nodes", "-o", "name"]).trim(), "node/cp");
    assert_eq!(c.ok(&["get", "csr", "-o", "name"]).trim(), "");

    // Two machines join with the command init printed.
    let mut w1 = c.join_machine("w1", 2);
    let w2 = c.join_machine("w2", 3);
    // Their kubelets and proxies reach the control plane through the node's balancer.
    assert!(
        w1.log().contains("apiserver balancer listening"),
        "{}",
        w1.log()
    );
    let cidrs: BTreeSet<String> = c
        .ok(&["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"])
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(cidrs.len(), 3, "each node has its own pod CIDR: {cidrs:?}");
    assert!(
        cidrs
            .iter()
            .all(|c| c.starts_with("10.244.") && c.ends_with(".0/24"))
    );
    let csrs = c.ok(&["get", "csr"]);
    assert_eq!(
        csrs.lines()
            .filter(
                |l| l.contains("kubernetes.io/kube-apiserver-client-kubelet")
                    && l.contains("system:bootstrap:")
                    && l.contains("Approved,Issued")
            )
            .count(),
        2,
        "both nodes' CSRs were approved and issued:\n{csrs}"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "node",
            "w1",
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}"
        ]),
        w1.ip
    );

    // A Deployment spreads over the three nodes (once the scheduler's node view, rebuilt at
    // most once a second, has the second machine).
    std::thread::sleep(Duration::from_secs(2));
    let r = c.kubectl_stdin(&["apply", "-f", "-"], WEB);
    assert!(r.ok, "{}", r.stderr);
    c.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let pods = placement(&c);
    let nodes: BTreeSet<&str> = pods.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(nodes.len(), 3, "one pod per node: {pods:?}");
    let names: BTreeSet<String> = pods.iter().map(|(n, _, _)| n.clone()).collect();

    // Pod to pod across nodes, directly by pod IP.
    let (from, from_node, _) = pods.iter().find(|(_, n, _)| n == "w1").unwrap().clone();
    for (name, node, ip) in &pods {
        if node == &from_node {
            continue;
        }
        let got = c.ok(&[
            "exec",
            &from,
            "--",
            "wget",
            "-qO-",
            "-T",
            "5",
            &format!("http://{ip}:8080/"),
        ]);
        assert_eq!(got.trim(), name, "{from} on w1 reaches {name} on {node}");
    }
    // Pod to Service across nodes, by its DNS name: every backend answers.
    let mut seen = BTreeSet::new();
    for _ in 0..40 {
        let r = c.kubectl(&[
            "exec",
            &from,
            "--",
            "wget",
            "-qO-",
            "-T",
            "5",
            "http://web/",
        ]);
        if r.ok {
            seen.insert(r.stdout.trim().to_owned());
        }
        if seen == names {
            break;
        }
    }
    assert_eq!(seen, names, "the Service reaches the pods on every node");
    // The `kubernetes` Service's endpoint is the control plane's node address, not loopback,
    // so pods can reach the API through it (upstream's sample-apiserver spec shows that on one
    // node; from a pod on another machine it is not checked here yet).
    let endpoint = c.ok(&[
        "get",
        "endpoints",
        "kubernetes",
        "-o",
        "jsonpath={.subsets[0].addresses[0].ip}",
    ]);
    assert!(
        !endpoint.is_empty() && !endpoint.starts_with("127."),
        "{endpoint}"
    );
    // A NodePort answers on every node, with every backend behind it.
    let port = c.ok(&[
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]);
    for ip in [minik8s_conformance::machines::HOST_IP, &w1.ip, &w2.ip] {
        let seen = minik8s_conformance::node::answers_from(&format!("{ip}:{port}"), &names);
        assert_eq!(seen, names, "NodePort {port} on {ip}");
    }

    // Drain w2: its pod is evicted and replaced on another node; the node is cordoned.
    let drained = c.ok(&[
        "drain",
        "w2",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=60s",
    ]);
    assert!(drained.contains("node/w2 drained"), "{drained}");
    assert_eq!(
        c.ok(&["get", "node", "w2", "-o", "jsonpath={.spec.unschedulable}"]),
        "true"
    );
    c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let after = placement(&c);
    assert!(
        after.len() == 3 && after.iter().all(|(_, n, _)| n != "w2"),
        "nothing runs on the drained node: {after:?}"
    );
    c.ok(&["uncordon", "w2"]);

    // Delete w1: its pods leave the API and are recreated on the nodes that remain.
    let on_w1: Vec<String> = after
        .iter()
        .filter(|(_, n, _)| n == "w1")
        .map(|(p, _, _)| p.clone())
        .collect();
    assert!(!on_w1.is_empty(), "{after:?}");
    c.ok(&["delete", "node", "w1"]);
    c.eventually(
        Duration::from_secs(60),
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector=status.phase=Running",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
        ],
        |s| {
            let lines: Vec<&str> = s.lines().collect();
            lines.len() == 3
                && lines.iter().all(|l| !l.ends_with(" w1"))
                && on_w1.iter().all(|p| !s.contains(p.as_str()))
        },
    );
    assert!(
        c.kubectl(&["get", "node", "w1"])
            .stderr
            .contains("NotFound"),
        "the deleted node stays deleted while its kubelet runs"
    );

    // The machines' processes stop cleanly on SIGTERM.
    assert!(w1.stop(), "w1's minik8s join exits cleanly:\n{}", w1.log());
    drop(w2);
}

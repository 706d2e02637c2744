//! Several control-plane machines on one etcd (issue 30), made as an operator would:
//! `minik8s init --storage etcd://… --upload-certs` on this machine over a private 3-member
//! etcd (`hack/etcd-cluster.sh`), and a second control-plane machine (a network namespace on
//! the node network) joined with the printed `minik8s join … --control-plane --certificate-key
//! K`. A wrong key and an expired one are refused with kubeadm's messages, and
//! `init --upload-certs` on the embedded store is refused with the reason. Both apiservers
//! serve the same objects at the same resourceVersions and are listed in default/kubernetes.
//! One controller manager leads. When the first machine is SIGKILLed, the second carries on
//! alone: writes go on, its controllers take the lead (a Deployment created afterwards runs; the dead node is marked
//! unreachable), and its node stays Ready through its balancer.

use minik8s_conformance::machines::InitCluster;
use minik8s_conformance::node::{bin, free_port};
use std::process::Command;
use std::time::{Duration, Instant};

/// Port base of this test's etcd members (clients on BASE+1..3, peers on BASE+11..13).
const ETCD_BASE_PORT: u16 = 25790;

const AFTER: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: after}
spec:
  replicas: 1
  selector: {matchLabels: {app: after}}
  template:
    metadata: {labels: {app: after}}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {kubernetes.io/hostname: cp2}
      containers:
      - name: c
        image: busybox
        imagePullPolicy: IfNotPresent
        command: ["sleep", "3600"]
"#;

#[test]
fn init_upload_certs_refuses_the_embedded_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(bin("minik8s"))
        .args(["init", "--upload-certs", "--no-node", "--data-dir"])
        .arg(dir.path())
        .args(["--port", &free_port().to_string()])
        .output()
        .expect("minik8s init runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("--upload-certs")
            && stderr.contains("the cluster's store is embedded")
            && stderr.contains("--storage etcd://"),
        "init --upload-certs on the embedded store: {stderr}"
    );
    assert!(
        !dir.path().join("store").exists(),
        "nothing was started: {:?}",
        std::fs::read_dir(dir.path()).map(|d| d.count())
    );
}

#[test]
fn a_second_control_plane_joins_on_etcd_and_carries_on_alone() {
    let mut c = InitCluster::start_on_etcd(free_port(), ETCD_BASE_PORT, &[]);
    let cp_join = c.control_plane_join.clone().expect("a control-plane join");
    let key = cp_join.last().expect("the certificate key").clone();
    assert_eq!(key.len(), 64, "a hex 32-byte key: {cp_join:?}");

    // A wrong key opens nothing and writes nothing.
    let wrong = c.failed_control_plane_join("cpbad", 21, &"ab".repeat(32));
    assert!(
        !wrong.ok
            && wrong.stderr.contains(
                "error decoding secret data with provided key: cipher: message authentication failed"
            ),
        "wrong key: {}",
        wrong.stderr
    );
    assert!(!c.dir().join("cpbad/pki/ca.key").exists());

    // The right key: a second apiserver, controllers and node on machine cp2.
    let started = Instant::now();
    let cp2 = c.join_control_plane("cp2", 2);
    println!(
        "control-plane machine cp2 joined (its node Ready) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Its node's kubeconfig names the node's client-side balancer, as a k3s agent's does.
    let node_kubeconfig = std::fs::read_to_string(cp2.kubeconfig()).expect("cp2's kubeconfig");
    assert!(
        node_kubeconfig.contains("server: https://127.0.0.1:6444"),
        "{node_kubeconfig}"
    );
    let server2 = c.server_at(&cp2.ip);
    let at2 = |c: &InitCluster, args: &[&str]| {
        let mut full = vec!["--server", server2.as_str()];
        full.extend(args);
        c.kubectl(&full)
    };
    c.ok(&["create", "configmap", "from-one", "--from-literal=a=1"]);
    let rv1 = c.ok(&[
        "get",
        "configmap",
        "from-one",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    let seen = at2(
        &c,
        &[
            "get",
            "configmap",
            "from-one",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    );
    assert!(seen.ok, "cp2's apiserver: {}", seen.stderr);
    assert_eq!(seen.stdout, rv1, "one store, one resourceVersion");
    c.eventually(
        Duration::from_secs(40),
        &[
            "get",
            "endpointslice",
            "kubernetes",
            "-o",
            "jsonpath={.endpoints[*].addresses[*]}",
        ],
        |s| s.contains("10.250.0.1") && s.contains(&cp2.ip),
    );

    // The keys expire with their token: once the garbage collector follows the token's
    // deletion, the key opens nothing and the join says what to do.
    let owner = c.ok(&[
        "get",
        "secret",
        "-n",
        "kube-system",
        "kubeadm-certs",
        "-o",
        "jsonpath={.metadata.ownerReferences[0].name}",
    ]);
    assert!(owner.starts_with("bootstrap-token-"), "owner: {owner}");
    let ttl = c.ok(&[
        "get",
        "secret",
        "-n",
        "kube-system",
        &owner,
        "-o",
        "jsonpath={.data.expiration}",
    ]);
    assert!(!ttl.is_empty(), "the certificates' token expires");
    c.ok(&["delete", "secret", "-n", "kube-system", &owner]);
    c.eventually(
        Duration::from_secs(30),
        &[
            "get",
            "secret",
            "-n",
            "kube-system",
            "kubeadm-certs",
            "--ignore-not-found",
            "-o",
            "name",
        ],
        |s| s.is_empty(),
    );
    let expired = c.failed_control_plane_join("cpold", 22, &key);
    assert!(
        !expired.ok
            && expired.stderr.contains(
                "Secret \"kubeadm-certs\" was not found in the \"kube-system\" Namespace. This Secret might have expired. Please, run `minik8s upload-certs`"
            ),
        "expired key: {}",
        expired.stderr
    );
    let again = c.minik8s(&["upload-certs"]);
    let new_key = again.stdout.lines().last().unwrap_or_default().to_owned();
    assert!(
        again.ok && new_key.len() == 64 && new_key != key,
        "upload-certs: {}\n{}",
        again.stdout,
        again.stderr
    );
    c.ok(&["get", "secret", "-n", "kube-system", "kubeadm-certs"]);

    // One controller manager leads: the first machine's, which started first.
    let holder = |c: &InitCluster| {
        at2(
            c,
            &[
                "get",
                "lease",
                "-n",
                "kube-system",
                "kube-controller-manager",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        )
        .stdout
    };
    let first_leader = holder(&c);
    assert!(!first_leader.is_empty(), "the controller managers elect");

    // The first machine dies: apiserver, controllers and its node's kubelet at once.
    c.kill9();
    let died = Instant::now();
    let write = at2(
        &c,
        &["create", "configmap", "after-kill", "--from-literal=a=1"],
    );
    assert!(write.ok, "a write through cp2: {}", write.stderr);
    let apply = {
        let mut cmd = Command::new("kubectl");
        cmd.args(["--server", &server2, "apply", "-f", "-"])
            .env("KUBECONFIG", &c.kubeconfig)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(AFTER.as_bytes())
            .expect("manifest");
        child.wait_with_output().expect("kubectl apply")
    };
    assert!(
        apply.status.success(),
        "{}",
        String::from_utf8_lossy(&apply.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = at2(
            &c,
            &[
                "get",
                "deployment",
                "after",
                "-o",
                "jsonpath={.status.readyReplicas}",
            ],
        );
        if r.stdout == "1" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the Deployment made after the kill never ran: {}\n{}\ncp2's log:\n{}",
            r.stderr,
            at2(&c, &["get", "pods", "-o", "wide"]).stdout,
            cp2.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "after the first machine's SIGKILL: a new Deployment ready through cp2 in {:.1} s",
        died.elapsed().as_secs_f64()
    );
    let second_leader = holder(&c);
    assert!(
        !second_leader.is_empty() && second_leader != first_leader,
        "cp2's controller manager took the lead from {first_leader}: {second_leader}"
    );
    // The node lifecycle controller, now cp2's, marks the dead machine's node unreachable;
    // cp2's own node stays Ready.
    let deadline = Instant::now() + Duration::from_secs(90);
    let ready = |node: &str| {
        at2(
            &c,
            &[
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
        )
        .stdout
    };
    while ready("cp") != "Unknown" {
        assert!(
            Instant::now() < deadline,
            "the dead machine's node was never marked unreachable"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(ready("cp2"), "True", "cp2's node stays Ready");
}

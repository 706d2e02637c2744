//! Certificates of joined nodes and of anyone else: a node renews its client certificate
//! before it expires (a CSR of its own, approved as `selfnodeclient`) and keeps working on the
//! new one, and so does an edge node, both its certificates; `kubectl certificate
//! approve|deny` decide other CSRs, which the signer issues as
//! upstream's `kube-apiserver-client` signer; requests without credentials reach
//! `cluster-info` and nothing else.

use base64::Engine;
use minik8s_conformance::machines::{HOST_IP, InitCluster};
use minik8s_conformance::node::free_port;
use std::time::{Duration, Instant};

/// The client certificate in a kubeconfig.
fn client_cert(kubeconfig: &std::path::Path) -> String {
    let text = std::fs::read_to_string(kubeconfig).unwrap_or_default();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("client-certificate-data:"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn csr_manifest(name: &str, signer: &str, request_pem: &str) -> String {
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\nspec:\n  request: {}\n  signerName: {signer}\n  usages: [digital signature, client auth]\n  expirationSeconds: 3600\n",
        base64::engine::general_purpose::STANDARD.encode(request_pem)
    )
}

#[test]
fn nodes_renew_their_certificates_and_other_csrs_are_decided_with_kubectl() {
    let port = free_port();
    let c = InitCluster::start_with(port, &["--cluster-signing-duration", "40s"]);
    let server = format!("https://{HOST_IP}:{port}");

    // Anonymous (kube-rs with no credentials): cluster-info yes, anything else 401.
    let anonymous = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{server}\", insecure-skip-tls-verify: true}}\nusers:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: anonymous}}\ncurrent-context: c\n"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (info, secrets) = rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kc = kube::config::Kubeconfig::from_yaml(&anonymous).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        use k8s_openapi::api::core::v1::{ConfigMap, Secret};
        let info = kube::Api::<ConfigMap>::namespaced(client.clone(), "kube-public")
            .get("cluster-info")
            .await;
        let secrets = kube::Api::<Secret>::namespaced(client, "kube-system")
            .list(&Default::default())
            .await;
        (info, secrets)
    });
    let info = info.expect("anonymous users read cluster-info");
    assert!(
        info.data
            .unwrap_or_default()
            .keys()
            .any(|k| k.starts_with("jws-kubeconfig-"))
    );
    match secrets {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 401, "{e:?}"),
        other => panic!("anonymous users may read nothing else: {other:?}"),
    }

    // Tokens: create, list, delete.
    let t = c.minik8s(&["token", "create", "--description", "spare"]);
    assert!(t.ok, "{}", t.stderr);
    let token = t.stdout.trim().to_owned();
    let id = token.split('.').next().unwrap().to_owned();
    assert!(c.minik8s(&["token", "list"]).stdout.contains(&token));
    let deleted = c.minik8s(&["token", "delete", &id]);
    assert!(
        deleted.ok && deleted.stdout.contains(&id),
        "{}",
        deleted.stderr
    );
    assert!(!c.minik8s(&["token", "list"]).stdout.contains(&token));

    // A node with 40 s certificates renews at 70–90 % of their life and keeps working.
    let w1 = c.join_machine("w1", 2);
    let first = client_cert(&w1.kubeconfig());
    assert!(!first.is_empty());
    let started = Instant::now();
    while client_cert(&w1.kubeconfig()) == first {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the node never renewed its certificate:\n{}",
            w1.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let csrs = c.ok(&["get", "csr"]);
    assert!(
        csrs.lines()
            .any(|l| l.contains("system:node:w1") && l.contains("Approved,Issued")),
        "the renewal CSR is the node's own, approved and issued:\n{csrs}"
    );
    // Past the first certificate's expiry, the node still heartbeats and runs pods.
    std::thread::sleep(Duration::from_secs(15));
    c.ok(&[
        "run",
        "after-renewal",
        "--image=busybox",
        "--overrides={\"spec\":{\"nodeName\":\"w1\"}}",
        "--",
        "sleep",
        "3600",
    ]);
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/after-renewal",
        "--timeout=60s",
    ]);
    assert_eq!(
        c.ok(&[
            "get",
            "node",
            "w1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"
        ]),
        "True"
    );

    // An edge node renews both its certificates through the edge registry (the client one
    // it calls the registry with, the serving one the cloud checks when it calls the edge),
    // and the cloud still reaches it past the first ones' expiry: a pod runs there and
    // `kubectl exec` crosses the link.
    let edge = c.edge_machine("edge-r", 24, &[]);
    let joined = c.edge_join(&edge, &[]);
    assert!(joined.ok, "{}\n{}", joined.stderr, edge.log());
    let pki = c.dir().join("edge-r/edge/store/pki");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).unwrap_or_default();
    let (client0, serving0) = (read("client.crt"), read("serving.crt"));
    assert!(!client0.is_empty() && !serving0.is_empty());
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: at-the-edge}\nspec:\n  nodeSelector: {kubernetes.io/hostname: edge-r}\n  tolerations: [{key: virtual-kubelet.io/provider, operator: Exists}]\n  containers: [{name: c, image: busybox, imagePullPolicy: IfNotPresent, command: [sleep, '3600']}]\n",
    );
    let started = Instant::now();
    while read("client.crt") == client0 || read("serving.crt") == serving0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the edge did not renew both certificates:\n{}",
            edge.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(15));
    c.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/at-the-edge",
        "--timeout=60s",
    ]);
    c.node_condition("edge-r", "Ready", "True", Duration::from_secs(30));
    assert_eq!(
        c.ok(&["exec", "at-the-edge", "--", "echo", "renewed"])
            .trim(),
        "renewed"
    );
    assert!(
        edge.log().contains("renewed the node's certificates"),
        "{}",
        edge.log()
    );
    drop(edge);

    // Other CSRs: approved with kubectl and issued, or denied.
    let (alice_key, alice_req) = minik8s_kubeconfig::csr::new_request("alice", &["devs"]).unwrap();
    let (_, bob_req) = minik8s_kubeconfig::csr::new_request("bob", &[]).unwrap();
    for (name, req) in [("alice", &alice_req), ("bob", &bob_req)] {
        let r = c.kubectl_stdin(
            &["create", "-f", "-"],
            &csr_manifest(name, "kubernetes.io/kube-apiserver-client", req),
        );
        assert!(r.ok, "{}", r.stderr);
    }
    let pending = c.ok(&["get", "csr", "alice"]);
    assert!(
        pending.contains("minik8s-admin") && pending.contains("Pending") && pending.contains("60m"),
        "{pending}"
    );
    assert!(
        c.ok(&["certificate", "approve", "alice"])
            .contains("approved")
    );
    assert!(c.ok(&["certificate", "deny", "bob"]).contains("denied"));
    c.eventually(Duration::from_secs(20), &["get", "csr", "alice"], |s| {
        s.contains("Approved,Issued")
    });
    let bob = c.ok(&["get", "csr", "bob"]);
    assert!(bob.contains("Denied") && !bob.contains("Issued"), "{bob}");
    let cert = c.ok(&[
        "get",
        "csr",
        "alice",
        "-o",
        "jsonpath={.status.certificate}",
    ]);
    let cert = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(cert)
            .unwrap(),
    )
    .unwrap();
    let ca = std::fs::read_to_string(c.data_dir().join("pki/ca.crt")).unwrap();
    let kubeconfig = c.dir().join("alice.kubeconfig");
    minik8s_kubeconfig::Kubeconfig::new(
        "minik8s",
        &server,
        &ca,
        "alice",
        minik8s_kubeconfig::Kubeconfig::cert_user(&cert, &alice_key),
    )
    .write(&kubeconfig)
    .unwrap();
    let whoami = std::process::Command::new("kubectl")
        .args(["auth", "whoami"])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", c.dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&whoami.stdout);
    assert!(
        whoami.status.success() && text.contains("alice") && text.contains("devs"),
        "{text}{}",
        String::from_utf8_lossy(&whoami.stderr)
    );
    // A decision stands: an approved CSR cannot be denied.
    let r = c.kubectl(&["certificate", "deny", "alice", "--force"]);
    assert!(!r.ok, "denying an approved CSR must fail: {}", r.stdout);
    drop(w1);
}

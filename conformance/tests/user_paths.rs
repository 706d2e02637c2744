//! What users do first on a real node, done the way they do it: the official Python client
//! from PyPI (typed models without `kind`, watches, `create_from_yaml`, the dynamic client,
//! `kubernetes.stream` exec), busybox's network tools inside a pod, and a pod whose sandbox
//! cannot be created. One test, so only one node (and one proxy) runs at a time.

use minik8s_conformance::Cluster;
use minik8s_conformance::node::{python, repo_root};
use std::process::Command;

#[test]
fn the_python_client_busybox_tools_and_sandbox_failures_behave_as_upstream() {
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("u1", 5);

    // The official Python client's documented usage, as a pytest file.
    let out = Command::new(python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(repo_root().join("conformance/python/test_client.py"))
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .output()
        .expect("pytest runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    assert!(
        out.status.success(),
        "the Python client suite failed:\n{report}"
    );

    // busybox's wget (with upstream's options), nc and nslookup work inside a pod.
    c.ok(&[
        "run",
        "web",
        "--image=busybox",
        "--",
        "httpd",
        "-f",
        "-p",
        "8080",
        "-h",
        "/www",
    ]);
    c.ok(&[
        "run",
        "dns",
        "--image=busybox",
        "--",
        "sh",
        "-c",
        "echo 'web.example.test 10.1.2.3' > /tmp/dnsd.conf && exec dnsd -c /tmp/dnsd.conf -p 53",
    ]);
    for pod in ["web", "dns"] {
        c.ok(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{pod}"),
            "--timeout=90s",
        ]);
    }
    // `kubectl describe` shows what the scheduler and the kubelet did, as upstream's.
    let described = c.ok(&["describe", "pod", "web"]);
    let events = described
        .split("Events:")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    for line in [
        "Successfully assigned default/web to u1",
        "Created container: web",
        "Started container web",
    ] {
        assert!(events.contains(line), "{line:?} not in:\n{described}");
    }
    assert!(
        events.contains("already present on machine") || events.contains("Successfully pulled"),
        "{described}"
    );
    // The node keeps the labels it registered with after its status applies.
    assert_eq!(
        c.ok(&[
            "get",
            "node",
            "u1",
            "-o",
            "jsonpath={.metadata.labels.kubernetes\\.io/hostname}"
        ]),
        "u1"
    );
    // The proxy subresource of nodes, pods and services, as upstream's.
    let pods = c.ok(&["get", "--raw", "/api/v1/nodes/u1/proxy/pods"]);
    let pods: serde_json::Value = serde_json::from_str(&pods).expect("a PodList");
    assert!(
        pods["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == "web"),
        "{pods}"
    );
    let summary = c.ok(&["get", "--raw", "/api/v1/nodes/u1/proxy/stats/summary"]);
    assert!(summary.contains("\"nodeName\":\"u1\""), "{summary}");
    assert_eq!(
        c.ok(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/web:8080/proxy/"
        ]),
        "hello\n"
    );
    // Links in HTML pages come back through the proxy, as upstream's transport rewrites them.
    c.ok(&[
        "exec",
        "web",
        "--",
        "sh",
        "-c",
        "echo '<a href=\"/rewriteme\">test</a>' > /www/links.html",
    ]);
    assert_eq!(
        c.ok(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/web:8080/proxy/links.html"
        ]),
        "<a href=\"/api/v1/namespaces/default/pods/web:8080/proxy/rewriteme\">test</a>\n"
    );
    c.ok(&["expose", "pod", "web", "--port=80", "--target-port=8080"]);
    c.eventually(
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/services/web:80/proxy/index.html",
        ],
        |o| o == "hello\n",
    );
    let ip = c.ok(&["get", "pod", "web", "-o", "jsonpath={.status.podIP}"]);
    for url in [
        "http://127.0.0.1:8080/",
        "http://localhost:8080/",
        &format!("http://{ip}:8080/"),
    ] {
        let got = c.ok(&["exec", "web", "--", "wget", "-T", "5", "-qO-", url]);
        assert_eq!(got, "hello\n", "wget {url}");
    }
    let got = c.ok(&[
        "exec",
        "web",
        "--",
        "sh",
        "-c",
        "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 127.0.0.1 8080",
    ]);
    assert!(
        got.starts_with("HTTP/1.") && got.ends_with("hello\n"),
        "nc: {got}"
    );
    let dns_ip = c.ok(&["get", "pod", "dns", "-o", "jsonpath={.status.podIP}"]);
    let got = c.ok(&[
        "exec",
        "web",
        "--",
        "nslookup",
        "-type=a",
        "web.example.test",
        &dns_ip,
    ]);
    assert!(got.contains("10.1.2.3"), "nslookup: {got}");

    // A pod whose sandbox the runtime refuses (a sysctl value the kernel rejects) stays
    // Pending in ContainerCreating, with a FailedCreatePodSandBox event naming the cause.
    let created = c.with_manifest(
        &["create"],
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nosandbox"},
            "spec": {"securityContext": {"sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "not-a-number"}]},
                     "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "60"]}]}}"#,
    );
    assert!(created.ok, "{}", created.stderr);
    let described = c.eventually(&["describe", "pod", "nosandbox"], |o| {
        o.contains("FailedCreatePodSandBox")
    });
    assert!(
        described.contains("Failed to create pod sandbox"),
        "{described}"
    );
    assert_eq!(
        c.ok(&[
            "get",
            "pod",
            "nosandbox",
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason}"
        ]),
        "Pending ContainerCreating"
    );

    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

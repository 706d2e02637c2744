//! Every component's Prometheus `/metrics`, scraped as a monitoring setup does (curl with the
//! admin certificate, or plain HTTP for the proxy's port) and read with the
//! `prometheus_client` package's strict OpenMetrics parser: the apiserver (its own series,
//! and in `init`'s single process the controller manager's and the proxy's), a separate
//! controller manager on its secure port, each kubelet's `/metrics` and `/metrics/resource`,
//! and a joined node's proxy on 10249. Request counters move with requests; a client without
//! the `system:monitoring` role gets 403.

use minik8s_conformance::machines::InitCluster;
use minik8s_conformance::node::{Sample, bin, free_port, parse_metrics};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `curl` of an HTTPS URL with the admin certificate (`auth`: `Some(token)` sends a bearer
/// token instead); (HTTP code, body).
fn curl(pki: &Path, url: &str, token: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-k", "-w", "\n%{http_code}", url]);
    match token {
        Some(t) => {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        None => {
            cmd.arg("--cert")
                .arg(pki.join("admin.crt"))
                .arg("--key")
                .arg(pki.join("admin.key"));
        }
    }
    let out = cmd.output().expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn scrape(pki: &Path, url: &str) -> Vec<Sample> {
    let (code, body) = curl(pki, url, None);
    assert_eq!(code, 200, "{url}: {body}");
    parse_metrics(&body)
}

/// The sum of the samples named `name` whose labels include `with`.
fn sum(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

fn families(samples: &[Sample]) -> std::collections::BTreeSet<String> {
    samples.iter().map(|s| s.family.clone()).collect()
}

#[test]
fn every_component_serves_prometheus_metrics_to_permitted_scrapers() {
    let c = InitCluster::start(free_port());
    let w1 = c.join_machine("w1", 2);
    let pki = c.data_dir().join("pki");
    let server = c.server().to_owned();
    let api = format!("{server}/metrics");

    // The apiserver: valid text, its series, and in init's process the controllers' and
    // the proxy's.
    let before = scrape(&pki, &api);
    let have = families(&before);
    for f in [
        "apiserver_request",
        "apiserver_request_duration_seconds",
        "apiserver_current_inflight_requests",
        "apiserver_longrunning_requests",
        "apiserver_registered_watchers",
        "apiserver_storage_objects",
        "etcd_request_duration_seconds",
        "workqueue_adds",
        "workqueue_work_duration_seconds",
        "workqueue_retries",
        "workqueue_depth",
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "kubeproxy_sync_proxy_rules_iptables_total",
    ] {
        assert!(
            have.contains(f),
            "{f} missing from the apiserver's families: {have:?}"
        );
    }
    assert!(
        sum(&before, "apiserver_registered_watchers", &[("kind", "Pod")]) >= 1.0,
        "the controllers and kubelets watch pods"
    );
    assert!(
        sum(
            &before,
            "apiserver_storage_objects",
            &[("resource", "namespaces")]
        ) >= 4.0
    );
    // The request counter moves with requests.
    let lists = |s: &[Sample]| {
        sum(
            s,
            "apiserver_request_total",
            &[
                ("verb", "LIST"),
                ("resource", "configmaps"),
                ("code", "200"),
            ],
        )
    };
    for _ in 0..3 {
        c.ok(&["get", "configmaps", "-A"]);
    }
    let after = scrape(&pki, &api);
    assert!(
        lists(&after) >= lists(&before) + 3.0,
        "{} → {}",
        lists(&before),
        lists(&after)
    );

    // Without the system:monitoring role: 403, with upstream's message; with it: 200.
    c.ok(&["create", "serviceaccount", "scraper"]);
    let token = c.ok(&["create", "token", "scraper"]).trim().to_owned();
    let (code, body) = curl(&pki, &api, Some(&token));
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"forbidden: User \"system:serviceaccount:default:scraper\" cannot get path \"/metrics\""#),
        "{body}"
    );
    c.ok(&[
        "create",
        "clusterrolebinding",
        "scraper",
        "--clusterrole=system:monitoring",
        "--serviceaccount=default:scraper",
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, body) = curl(&pki, &api, Some(&token));
        if code == 200 {
            parse_metrics(&body);
            break;
        }
        assert!(Instant::now() < deadline, "{code}: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Each kubelet: its own series, and the resource metrics of a running pod.
    let r = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: busy}\nspec:\n  nodeName: cp\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox, imagePullPolicy: IfNotPresent, command: [sleep, '3600']}\n",
    );
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        Duration::from_secs(60),
        &["get", "pod", "busy", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    let port = c.ok(&[
        "get",
        "node",
        "cp",
        "-o",
        "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
    ]);
    let kubelet = format!("https://127.0.0.1:{port}");
    let k = scrape(&pki, &format!("{kubelet}/metrics"));
    assert!(
        sum(&k, "kubelet_running_pods", &[]) >= 1.0,
        "{:?}",
        families(&k)
    );
    assert!(sum(&k, "kubelet_started_containers_total", &[]) >= 1.0);
    assert!(sum(&k, "kubelet_pod_worker_duration_seconds_count", &[]) >= 1.0);
    let res = scrape(&pki, &format!("{kubelet}/metrics/resource"));
    assert!(sum(&res, "node_memory_working_set_bytes", &[]) > 0.0);
    let busy = [
        ("pod", "busy"),
        ("namespace", "default"),
        ("container", "c"),
    ];
    assert!(
        res.iter()
            .any(|s| s.name == "container_cpu_usage_seconds_total"
                && busy
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))),
        "{:?}",
        families(&res)
    );
    let (code, _) = curl(&pki, &format!("{kubelet}/metrics"), Some(&token));
    assert_eq!(code, 401, "the kubelet takes client certificates only");

    // A separate controller manager on its secure port (delegated authorisation).
    let cm_port = free_port();
    let mut cm = Command::new(bin("minik8s"))
        .arg("controller-manager")
        .arg(format!(
            "--kubeconfig={}",
            pki.join("controller-manager.kubeconfig").display()
        ))
        // The namespace controller has work at once (every cluster has namespaces); the
        // controllers reconcile objects, so a kind with none counts no items.
        .arg("--controllers=namespace")
        .arg(format!("--secure-port={cm_port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--client-ca-file={}", pki.join("ca.crt").display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(c.dir().join("cm.log")).unwrap())
        .spawn()
        .expect("controller manager starts");
    let cm_url = format!("https://127.0.0.1:{cm_port}/metrics");
    let deadline = Instant::now() + Duration::from_secs(30);
    let cm_samples = loop {
        let (code, body) = curl(&pki, &cm_url, None);
        if code == 200 {
            let s = parse_metrics(&body);
            if sum(&s, "workqueue_adds_total", &[("name", "namespace")]) >= 1.0 {
                break s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{code}: {body}\n{}",
            std::fs::read_to_string(c.dir().join("cm.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        sum(
            &cm_samples,
            "leader_election_master_status",
            &[("name", "kube-controller-manager")]
        ),
        1.0
    );
    assert!(
        !families(&cm_samples).contains("apiserver_request"),
        "only the controller manager's series"
    );
    let (code, _) = curl(&pki, &cm_url, Some(&token));
    assert_eq!(code, 401, "client certificates only");
    let _ = Command::new("kill")
        .args(["-TERM", &cm.id().to_string()])
        .status();
    let _ = cm.wait();

    // A joined node's proxy: plain HTTP on its loopback, as upstream's 10249.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = w1.exec("curl", &["-sS", "http://127.0.0.1:10249/metrics"]);
        if out.status.success() {
            let p = parse_metrics(&String::from_utf8_lossy(&out.stdout));
            if sum(&p, "kubeproxy_sync_proxy_rules_duration_seconds_count", &[]) >= 1.0 {
                assert!(
                    sum(
                        &p,
                        "kubeproxy_sync_proxy_rules_iptables_total",
                        &[("table", "nat")]
                    ) > 0.0
                );
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

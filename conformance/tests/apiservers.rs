//! Several apiservers on one etcd (issue 30): they serve the same resourceVersions (etcd's
//! revision), a watch resumes on another apiserver from the resourceVersion it had and misses
//! nothing, and `default/kubernetes` lists every live apiserver from their Leases in
//! `kube-system` (upstream's lease endpoint reconciler), dropping one that stops or whose
//! lease expires.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, WatchEvent, WatchParams};
use minik8s_conformance::Cluster;
use std::time::Duration;

fn create(c: &Cluster, name: &str) -> String {
    c.ok(&[
        "create",
        "configmap",
        name,
        &format!("--from-literal=v={name}"),
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ])
}

const ENDPOINTS: [&str; 5] = [
    "get",
    "endpoints",
    "kubernetes",
    "-o",
    "jsonpath={.subsets[0].addresses[*].ip}",
];

const SLICE: [&str; 7] = [
    "get",
    "endpointslices",
    "kubernetes",
    "-n",
    "default",
    "-o",
    "jsonpath={.endpoints[*].addresses[0]}",
];

#[test]
fn two_apiservers_on_one_etcd_share_revisions_watches_and_the_kubernetes_endpoints() {
    let a = Cluster::start_etcd();
    let port = a.url.rsplit(':').next().expect("port").to_owned();
    let b = Cluster::start_beside(&a, &format!("127.0.0.2:{port}"));

    // The same resourceVersions on both: etcd's revision.
    let first = create(&a, "first");
    assert_eq!(
        b.ok(&[
            "get",
            "configmap",
            "first",
            "-o",
            "jsonpath={.metadata.resourceVersion}"
        ]),
        first
    );

    // Writes through A after `first`; a watch on B from `first`'s resourceVersion sees each
    // of them, in order, at the resourceVersion A acknowledged.
    let written: Vec<(String, String)> = (0..5)
        .map(|i| {
            let name = format!("cm-{i}");
            let rv = create(&a, &name);
            (name, rv)
        })
        .collect();
    let cms: Api<ConfigMap> = Api::namespaced(b.client(), "default");
    let seen = b.block_on(async {
        let stream = cms
            .watch(&WatchParams::default().timeout(10), &first)
            .await
            .expect("a watch on B from A's resourceVersion");
        let mut stream = Box::pin(stream);
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while seen.len() < written.len() {
            let next = tokio::time::timeout_at(deadline, stream.next()).await;
            match next {
                Ok(Some(Ok(WatchEvent::Added(cm)))) => seen.push((
                    cm.metadata.name.unwrap_or_default(),
                    cm.metadata.resource_version.unwrap_or_default(),
                )),
                Ok(Some(Ok(WatchEvent::Bookmark(_)))) => {}
                Ok(Some(other)) => panic!("unexpected watch event: {other:?}"),
                Ok(None) | Err(_) => break,
            }
        }
        seen
    });
    assert_eq!(seen, written, "the watch resumed on B");

    // Both apiservers are in default/kubernetes, from their leases.
    let both = |o: &str| o == "127.0.0.1 127.0.0.2";
    a.eventually(&ENDPOINTS, both);
    b.eventually(&SLICE, both);
    let leases = a.ok(&[
        "get",
        "leases",
        "-n",
        "kube-system",
        "-l",
        "apiserver.kubernetes.io/identity=kube-apiserver",
        "-o",
        "name",
    ]);
    assert_eq!(leases.lines().count(), 2, "{leases}");

    // An apiserver whose lease is not renewed (here one that never runs: its lease written
    // by hand, renewed now) is listed until the lease expires, then dropped and its lease
    // deleted.
    let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ");
    let lease = format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: apiserver-gone\n  namespace: kube-system\n  labels:\n    apiserver.kubernetes.io/identity: kube-apiserver\n  annotations:\n    minik8s.io/advertise-address: 127.0.0.3:{port}\nspec:\n  holderIdentity: apiserver-gone\n  leaseDurationSeconds: 15\n  renewTime: {now}\n"
    );
    let applied = a.kubectl_stdin(&["apply", "-f", "-"], Some(&lease));
    assert!(applied.ok, "{}", applied.stderr);
    a.eventually(&ENDPOINTS, |o| o == "127.0.0.1 127.0.0.2 127.0.0.3");
    a.eventually(&ENDPOINTS, both);
    a.eventually(&["get", "leases", "-n", "kube-system", "-o", "name"], |o| {
        !o.contains("apiserver-gone")
    });

    // B stopping takes itself out at once (its lease deleted).
    drop(b);
    a.eventually_within(Duration::from_secs(15), &ENDPOINTS, |o| o == "127.0.0.1");
    a.eventually(&SLICE, |o| o == "127.0.0.1");
}

/// The nodes' client-side balancer (`minik8s_balancer`) over two apiservers sharing a CA:
/// clients on it (kubectl, and a kube-rs client holding its connection) go on when the
/// first apiserver stops, with at most one failed request, and the balancer marks it down.
#[test]
fn clients_on_the_balancer_fail_over_when_an_apiserver_stops() {
    let mut a = Cluster::start_etcd();
    let port = a.url.rsplit(':').next().expect("port").to_owned();
    let b = Cluster::start_beside(&a, &format!("127.0.0.2:{port}"));
    let host_port = |url: &str| url.trim_start_matches("https://").to_owned();
    let servers = [host_port(&a.url), host_port(&b.url)];
    let stop = tokio_util::sync::CancellationToken::new();
    let lb = a
        .block_on(minik8s_balancer::start(
            "127.0.0.1:0".parse().expect("addr"),
            &servers,
            stop.clone(),
        ))
        .expect("the balancer starts");
    // The admin's kubeconfig, pointed at the balancer (both serving certificates name
    // 127.0.0.1 and come from the one CA).
    let kubeconfig = a.dir().join("balanced.kubeconfig");
    let text = std::fs::read_to_string(&a.kubeconfig).expect("kubeconfig");
    std::fs::write(
        &kubeconfig,
        text.replace(&a.url, &format!("https://{}", lb.addr())),
    )
    .expect("write kubeconfig");
    let kubectl = |args: &[&str]| {
        std::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("kubectl")
    };
    let made = kubectl(&["create", "configmap", "before", "--from-literal=v=1"]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let client = a
        .block_on(minik8s_kubeconfig::client(&kubeconfig))
        .expect("client");
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    a.block_on(cms.get("before"))
        .expect("kube-rs through the balancer");

    a.stop_apiserver();
    // kubectl (a new connection each run) goes to the second apiserver at once.
    let started = std::time::Instant::now();
    let after = kubectl(&["create", "configmap", "after", "--from-literal=v=2"]);
    assert!(
        after.status.success(),
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failing over took {:?}",
        started.elapsed()
    );
    // The kube-rs client whose connection went to the stopped apiserver: at most one
    // request fails.
    let failed = (0..10)
        .filter(|_| a.block_on(cms.get("after")).is_err())
        .count();
    assert!(
        failed <= 1,
        "{failed} of 10 requests failed after the failover"
    );
    let servers = lb.servers();
    assert!(!servers[0].healthy && servers[1].healthy, "{servers:?}");
    let got = kubectl(&["get", "configmap", "before", "-o", "jsonpath={.data.v}"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout), "1");
    stop.cancel();
    drop(b);
}

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

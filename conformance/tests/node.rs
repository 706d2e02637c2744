//! A real node: the kubelet on a private containerd runs pods as real containers, with the
//! stock kubectl driving the cluster.

use minik8s_conformance::Cluster;

fn jsonpath(c: &Cluster, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend(["-o", &p]);
    c.ok(&args)
}

#[test]
fn a_real_node_runs_pods_as_containers_and_reports_them_as_upstream() {
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("n1", 1);

    // The node is Ready with the machine's real capacity and runtime.
    let cpus = std::thread::available_parallelism()
        .unwrap()
        .get()
        .to_string();
    assert_eq!(
        jsonpath(&c, &["node", "n1"], "{.status.capacity.cpu}"),
        cpus
    );
    assert!(
        jsonpath(
            &c,
            &["node", "n1"],
            "{.status.nodeInfo.containerRuntimeVersion}"
        )
        .starts_with("containerd://")
    );
    assert_eq!(
        jsonpath(&c, &["node", "n1"], "{.status.capacity.pods}"),
        "110"
    );

    // A busybox pod runs, gets an address on the node's bridge, and reports its container.
    c.ok(&[
        "run",
        "hello",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sh",
        "-c",
        "echo hello from a pod; sleep 3600",
    ]);
    c.eventually(
        &["get", "pod", "hello", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    let ip = jsonpath(&c, &["pod", "hello"], "{.status.podIP}");
    assert!(ip.starts_with("10.244.1."), "pod IP {ip}");
    let id = jsonpath(
        &c,
        &["pod", "hello"],
        "{.status.containerStatuses[0].containerID}",
    );
    assert!(id.starts_with("containerd://"), "{id}");
    assert_eq!(
        jsonpath(
            &c,
            &["pod", "hello"],
            "{.status.conditions[?(@.type==\"Ready\")].status}"
        ),
        "True"
    );

    // restartPolicy Never: a failing container ends the pod Failed with its exit code; a
    // succeeding one Succeeded.
    c.ok(&[
        "run",
        "fails",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    c.ok(&[
        "run",
        "works",
        "--image=busybox",
        "--restart=Never",
        "--",
        "true",
    ]);
    c.eventually(
        &["get", "pod", "fails", "-o", "jsonpath={.status.phase}"],
        |s| s == "Failed",
    );
    assert_eq!(
        jsonpath(
            &c,
            &["pod", "fails"],
            "{.status.containerStatuses[0].state.terminated.exitCode}"
        ),
        "3"
    );
    c.eventually(
        &["get", "pod", "works", "-o", "jsonpath={.status.phase}"],
        |s| s == "Succeeded",
    );

    // A crashing container restarts with a growing restartCount and CrashLoopBackOff.
    c.ok(&[
        "run",
        "crash",
        "--image=busybox",
        "--",
        "sh",
        "-c",
        "exit 1",
    ]);
    c.eventually_within(
        std::time::Duration::from_secs(90),
        &[
            "get",
            "pod",
            "crash",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        |s| s.parse::<u32>().unwrap_or(0) >= 2,
    );
    c.eventually(
        &[
            "get",
            "pod",
            "crash",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ],
        |s| s == "CrashLoopBackOff",
    );

    // Two containers share localhost and an emptyDir; a ConfigMap and a Secret are mounted
    // and visible as env. The results land in a hostPath folder the test reads.
    let out = c.dir().join("out");
    std::fs::create_dir_all(&out).unwrap();
    c.ok(&["create", "configmap", "cfg", "--from-literal=greeting=hi"]);
    c.ok(&[
        "create",
        "secret",
        "generic",
        "sec",
        "--from-literal=password=s3cret",
    ]);
    let manifest = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "pair"}},
  "spec": {{"volumes": [{{"name": "shared", "emptyDir": {{}}}}, {{"name": "cfg", "configMap": {{"name": "cfg"}}}},
                      {{"name": "sec", "secret": {{"secretName": "sec"}}}},
                      {{"name": "out", "hostPath": {{"path": "{out}"}}}}],
    "containers": [
      {{"name": "web", "image": "busybox", "command": ["sh", "-c",
        "echo \"$GREETING $PASSWORD $POD\" > /shared/env; cat /cfg/greeting /sec/password > /shared/files; exec httpd -f -p 8080 -h /shared"],
        "env": [{{"name": "GREETING", "valueFrom": {{"configMapKeyRef": {{"name": "cfg", "key": "greeting"}}}}}},
                {{"name": "PASSWORD", "valueFrom": {{"secretKeyRef": {{"name": "sec", "key": "password"}}}}}},
                {{"name": "POD", "valueFrom": {{"fieldRef": {{"fieldPath": "metadata.name"}}}}}}],
        "volumeMounts": [{{"name": "shared", "mountPath": "/shared"}}, {{"name": "cfg", "mountPath": "/cfg"}},
                         {{"name": "sec", "mountPath": "/sec"}}]}},
      {{"name": "peer", "image": "busybox", "command": ["sh", "-c",
        "until wget -qO /out/over-localhost http://127.0.0.1:8080/env; do sleep 0.2; done; cp /shared/files /out/files; exec sleep 3600"],
        "volumeMounts": [{{"name": "shared", "mountPath": "/shared"}}, {{"name": "out", "mountPath": "/out"}}]}}]}}}}"#,
        out = out.display()
    );
    let r = c.with_manifest(&["apply"], &manifest);
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &["get", "pod", "pair", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !out.join("files").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(
        std::fs::read_to_string(out.join("over-localhost")).unwrap_or_default(),
        "hi s3cret pair\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("files")).unwrap_or_default(),
        "his3cret"
    );

    // Deleting a pod stops its container within the grace period and removes it.
    let start = std::time::Instant::now();
    c.ok(&["delete", "pod", "hello", "--grace-period=2"]);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "deletion took {:?}",
        start.elapsed()
    );
    assert!(c.fails(&["get", "pod", "hello"]).contains("NotFound"));
    // Tearing the node down leaves no bridge, netns, mount, cgroup, process or chain of ours.
    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

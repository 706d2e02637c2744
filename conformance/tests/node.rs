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

    // Deleting a pod stops its container within the grace period and removes it.
    let start = std::time::Instant::now();
    c.ok(&["delete", "pod", "hello", "--grace-period=2"]);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "deletion took {:?}",
        start.elapsed()
    );
    assert!(c.fails(&["get", "pod", "hello"]).contains("NotFound"));
    drop(node);
}

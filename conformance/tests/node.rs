//! A real node: the kubelet on a private containerd runs pods as real containers, with the
//! stock kubectl driving the cluster.

use minik8s_conformance::Cluster;
use minik8s_conformance::node::{answers_from, http_get};

fn jsonpath(c: &Cluster, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend(["-o", &p]);
    c.ok(&args)
}

#[test]
fn a_real_node_runs_pods_as_containers_and_reports_them_as_upstream() {
    let mut c = Cluster::start();
    c.run_controllers(0);
    let mut node = c.run_node("n1", 1);

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

    // A privileged container runs: its sandbox is made privileged too, as upstream's kubelet
    // does (containerd refuses a privileged container in an unprivileged sandbox).
    let r = c.with_manifest(
        &["apply"],
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox",
              "command": ["sh", "-c", "ls /dev/kmsg && sleep 3600"],
              "securityContext": {"privileged": true}}]}}"#,
    );
    assert!(r.ok, "{r:?}");
    c.eventually(
        &["get", "pod", "root", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    c.ok(&["delete", "pod", "root", "--wait=false"]);

    // kubectl logs shows what the container printed; -f follows it until it ends.
    assert_eq!(c.ok(&["logs", "hello"]), "hello from a pod\n");
    c.ok(&[
        "run",
        "counter",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4; do echo line $i; sleep 1; done",
    ]);
    c.eventually(
        &["get", "pod", "counter", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    let followed = c.ok(&["logs", "-f", "counter"]);
    assert_eq!(
        followed, "line 1\nline 2\nline 3\nline 4\n",
        "logs -f follows until the container ends"
    );
    assert_eq!(c.ok(&["logs", "counter", "--tail=1"]), "line 4\n");
    assert!(
        c.ok(&["logs", "counter", "--timestamps"])
            .lines()
            .all(|l| l.contains("Z line "))
    );
    // Output without a final newline is shown too, followed or not (upstream's projected
    // volume spec reads `cat a && cat b` output this way).
    c.ok(&[
        "run",
        "unterminated",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sh",
        "-c",
        "printf one && sleep 1 && printf two",
    ]);
    c.eventually(
        &[
            "get",
            "pod",
            "unterminated",
            "-o",
            "jsonpath={.status.phase}",
        ],
        |s| s == "Succeeded",
    );
    assert_eq!(c.ok(&["logs", "unterminated"]), "onetwo");
    assert_eq!(c.ok(&["logs", "-f", "unterminated"]), "onetwo");

    // kubectl exec runs commands in the container (WebSocket v5 through the apiserver to the
    // kubelet, SPDY from there to the runtime), with stdin, and reports the exit code.
    assert_eq!(
        c.ok(&["exec", "hello", "--", "sh", "-c", "echo hi"]),
        "hi\n"
    );
    let piped = c.kubectl_stdin(
        &["exec", "-i", "hello", "--", "cat"],
        Some("through stdin\n"),
    );
    assert_eq!(piped.stdout, "through stdin\n", "{}", piped.stderr);
    // That was kubectl's default protocol, WebSocket v5, with no fall back to SPDY; stdout
    // and stderr stay apart.
    let traced = c.kubectl_stdin(
        &[
            "exec",
            "-i",
            "-v=6",
            "hello",
            "--",
            "sh",
            "-c",
            "cat; echo to-stderr >&2",
        ],
        Some("v5 stdin\n"),
    );
    assert_eq!(traced.stdout, "v5 stdin\n", "{}", traced.stderr);
    assert!(
        traced.stderr.contains("websocket.go")
            && !traced.stderr.to_lowercase().contains("fallback")
            && traced.stderr.contains("to-stderr"),
        "{}",
        traced.stderr
    );
    let failed = c.kubectl(&["exec", "hello", "--", "sh", "-c", "exit 7"]);
    assert!(
        !failed.ok && failed.stderr.contains("exit code 7"),
        "{}",
        failed.stderr
    );

    let tty = c.kubectl_stdin(
        &["exec", "-it", "hello", "--", "sh", "-c", "echo interactive"],
        Some(""),
    );
    assert!(
        tty.ok && tty.stdout.contains("interactive"),
        "{} {}",
        tty.stdout,
        tty.stderr
    );

    // kubectl cp, both ways (tar through exec).
    let local = c.dir().join("note.txt");
    std::fs::write(&local, "copied\n").unwrap();
    c.ok(&["cp", local.to_str().unwrap(), "hello:/tmp/note.txt"]);
    assert_eq!(
        c.ok(&["exec", "hello", "--", "cat", "/tmp/note.txt"]),
        "copied\n"
    );
    let back = c.dir().join("back.txt");
    c.ok(&["cp", "hello:/tmp/note.txt", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "copied\n");
    // A few megabytes both ways, byte for byte.
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let big_file = c.dir().join("big.bin");
    std::fs::write(&big_file, &big).unwrap();
    c.ok(&["cp", big_file.to_str().unwrap(), "hello:/tmp/big.bin"]);
    let big_back = c.dir().join("big-back.bin");
    c.ok(&["cp", "hello:/tmp/big.bin", big_back.to_str().unwrap()]);
    assert!(
        std::fs::read(&big_back).unwrap() == big,
        "3 MB copied back unchanged"
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
        "echo crashing; exit 1",
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
    assert_eq!(
        c.ok(&["logs", "crash", "--previous"]),
        "crashing\n",
        "the previous container's log"
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

    // A Deployment of 3 httpd pods behind a ClusterIP Service answers from the host and from
    // another pod, and traffic reaches all 3; a NodePort answers on localhost.
    c.ok(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=3",
        "--",
        "sh",
        "-c",
        "hostname > /www/index.html; exec httpd -f -p 8080 -h /www",
    ]);
    c.ok(&[
        "expose",
        "deployment",
        "web",
        "--port=80",
        "--target-port=8080",
    ]);
    c.ok(&[
        "expose",
        "deployment",
        "web",
        "--name=web-np",
        "--type=NodePort",
        "--port=80",
        "--target-port=8080",
    ]);
    c.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let vip = jsonpath(&c, &["service", "web"], "{.spec.clusterIP}");
    let node_port = jsonpath(&c, &["service", "web-np"], "{.spec.ports[0].nodePort}");
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
    assert_eq!(pods.len(), 3);
    let seen = answers_from(&format!("{vip}:80"), &pods);
    assert_eq!(seen, pods, "the ClusterIP reaches every pod");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut via_node_port = None;
    while via_node_port.is_none() && std::time::Instant::now() < deadline {
        via_node_port = http_get(&format!("127.0.0.1:{node_port}"));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(
        via_node_port.as_ref().is_some_and(|b| pods.contains(b)),
        "NodePort on localhost: {via_node_port:?}"
    );
    let from_pod = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "client"}},
  "spec": {{"volumes": [{{"name": "out", "hostPath": {{"path": "{out}"}}}}],
    "containers": [{{"name": "c", "image": "busybox", "command": ["sh", "-c",
      "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do wget -qO- http://{vip}/ >> /out/via-service; done; exec sleep 3600"],
      "volumeMounts": [{{"name": "out", "mountPath": "/out"}}]}}]}}}}"#,
        out = out.display()
    );
    let r = c.with_manifest(&["apply"], &from_pod);
    assert!(r.ok, "{}", r.stderr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let answers = loop {
        let text = std::fs::read_to_string(out.join("via-service")).unwrap_or_default();
        if text.lines().count() >= 20 || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    let from_pod: std::collections::BTreeSet<String> = answers.lines().map(str::to_owned).collect();
    assert!(
        from_pod.len() >= 2 && from_pod.is_subset(&pods),
        "a pod reaches the service's pods: {answers:?}"
    );

    // kubectl port-forward serves a pod's httpd on a local port, over kubectl's default
    // protocol (SPDY tunnelled in WebSocket), with no fall back.
    let target = pods.iter().next().unwrap().clone();
    let mut forward = std::process::Command::new("kubectl")
        .args([
            "port-forward",
            "-v=6",
            &format!("pod/{target}"),
            "18080:8080",
        ])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("HOME", c.dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut forwarded = None;
    while forwarded.is_none() && std::time::Instant::now() < deadline {
        forwarded = http_get("127.0.0.1:18080");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let _ = forward.kill();
    let forward_out = forward.wait_with_output().unwrap();
    let forward_log = String::from_utf8_lossy(&forward_out.stderr);
    assert_eq!(
        forwarded.as_deref(),
        Some(target.as_str()),
        "port-forward: {forward_log}"
    );
    assert!(
        forward_log.contains("negotiated protocol: portforward.k8s.io")
            && !forward_log.to_lowercase().contains("fallback"),
        "{forward_log}"
    );

    // kubectl top shows the pods' and the node's CPU and memory (metrics.k8s.io from the
    // kubelet's CRI stats).
    let top = c.eventually(&["top", "pods", "-l", "app=web", "--no-headers"], |s| {
        s.lines().count() == 3
    });
    for line in top.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert!(
            cols.len() == 3 && cols[1].ends_with('m') && cols[2].ends_with("Mi"),
            "top pods: {line}"
        );
        assert!(
            cols[2]
                .trim_end_matches("Mi")
                .parse::<u64>()
                .is_ok_and(|m| m > 0)
                || cols[2] == "0Mi",
            "{line}"
        );
    }
    let nodes = c.eventually(&["top", "nodes", "--no-headers"], |s| s.contains("n1"));
    assert!(
        nodes.split_whitespace().any(|w| w.ends_with('%')),
        "top nodes: {nodes}"
    );

    // A restarted kubelet adopts the running containers: same container ids, no restarts.
    let ids = || {
        jsonpath(
            &c,
            &["pods", "-l", "app=web"],
            "{.items[*].status.containerStatuses[0].containerID}",
        )
    };
    let before = ids();
    c.restart_kubelet(&mut node);
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(
        ids(),
        before,
        "the restarted kubelet left the running containers alone"
    );
    assert_eq!(
        jsonpath(
            &c,
            &["pods", "-l", "app=web"],
            "{.items[*].status.containerStatuses[0].restartCount}"
        ),
        "0 0 0"
    );
    assert!(http_get(&format!("{vip}:80")).is_some_and(|b| pods.contains(&b)));

    // A failing readiness probe keeps a pod Running but not Ready and out of its Service's
    // endpoints; a failing liveness probe restarts the container.
    let probed = |name: &str, readiness: &str, liveness: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}", "labels": {{"app": "probed"}}}},
  "spec": {{"terminationGracePeriodSeconds": 2,
    "containers": [{{"name": "web", "image": "busybox", "command": ["httpd", "-f", "-p", "8080", "-h", "/www"],
    "ports": [{{"name": "http", "containerPort": 8080}}],
    "readinessProbe": {readiness}, "livenessProbe": {liveness}}}]}}}}"#
        )
    };
    let http_ok = r#"{"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}"#;
    let tcp_ok = r#"{"tcpSocket": {"port": 8080}, "periodSeconds": 1}"#;
    let never = r#"{"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 1}"#;
    for (name, readiness, liveness) in [
        ("ready", http_ok, tcp_ok),
        ("unready", never, tcp_ok),
        ("unlive", http_ok, never),
    ] {
        let r = c.with_manifest(&["apply"], &probed(name, readiness, liveness));
        assert!(r.ok, "{}", r.stderr);
    }
    c.ok(&["create", "service", "clusterip", "probed", "--tcp=80:8080"]);
    c.ok(&[
        "patch",
        "service",
        "probed",
        "-p",
        r#"{"spec": {"selector": {"app": "probed"}}}"#,
    ]);
    c.eventually(
        &[
            "get",
            "pod",
            "ready",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        |s| s == "True",
    );
    let ready_ip = jsonpath(&c, &["pod", "ready"], "{.status.podIP}");
    c.eventually(
        &[
            "get",
            "pod",
            "unlive",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        |s| s.parse::<u32>().unwrap_or(0) >= 1,
    );
    assert_eq!(
        jsonpath(&c, &["pod", "unready"], "{.status.phase}"),
        "Running"
    );
    assert_eq!(
        jsonpath(
            &c,
            &["pod", "unready"],
            "{.status.conditions[?(@.type==\"Ready\")].status}"
        ),
        "False"
    );
    c.eventually(
        &[
            "get",
            "endpoints",
            "probed",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ],
        |s| s == ready_ip,
    );

    // Init containers run first, in order; the app container sees what they left.
    let init = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "init"}},
  "spec": {{"restartPolicy": "Never", "volumes": [{{"name": "work", "emptyDir": {{}}}}, {{"name": "out", "hostPath": {{"path": "{out}"}}}}],
    "initContainers": [
      {{"name": "first", "image": "busybox", "command": ["sh", "-c", "echo one > /work/log"], "volumeMounts": [{{"name": "work", "mountPath": "/work"}}]}},
      {{"name": "second", "image": "busybox", "command": ["sh", "-c", "echo two >> /work/log"], "volumeMounts": [{{"name": "work", "mountPath": "/work"}}]}}],
    "containers": [{{"name": "main", "image": "busybox", "command": ["sh", "-c", "cp /work/log /out/init-log"],
      "volumeMounts": [{{"name": "work", "mountPath": "/work"}}, {{"name": "out", "mountPath": "/out"}}]}}]}}}}"#,
        out = out.display()
    );
    let r = c.with_manifest(&["apply"], &init);
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &["get", "pod", "init", "-o", "jsonpath={.status.phase}"],
        |s| s == "Succeeded",
    );
    assert_eq!(
        std::fs::read_to_string(out.join("init-log")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        jsonpath(
            &c,
            &["pod", "init"],
            "{.status.initContainerStatuses[*].state.terminated.reason}"
        ),
        "Completed Completed"
    );
    // Init containers that exited successfully are ready, as upstream marks them.
    assert_eq!(
        jsonpath(
            &c,
            &["pod", "init"],
            "{.status.initContainerStatuses[*].ready}"
        ),
        "true true"
    );

    // A pod bound straight to the node whose host port another pod holds is rejected by the
    // kubelet as upstream's: Failed with reason NodePorts, and a NodePorts event.
    let host_port = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: n1\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, 1d]\n    ports: [{{containerPort: 21017, hostPort: 21017}}]\n"
        )
    };
    assert!(c.with_manifest(&["create"], &host_port("holder")).ok);
    c.eventually(
        &["get", "pod", "holder", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    assert!(c.with_manifest(&["create"], &host_port("clash")).ok);
    c.eventually(
        &[
            "get",
            "pod",
            "clash",
            "-o",
            "jsonpath={.status.phase}/{.status.reason}/{.status.message}",
        ],
        |s| s == "Failed/NodePorts/Pod Predicate NodePorts failed",
    );
    c.eventually(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=clash,reason=NodePorts",
            "-o",
            "name",
        ],
        |s| !s.is_empty(),
    );
    c.ok(&["delete", "pod", "holder", "clash", "--grace-period=1"]);

    // Images come from the local registry through the CRI's PullImage: a tag pushed only
    // there is pulled by its docker.io name; a missing one waits in ErrImagePull and then
    // ImagePullBackOff.
    let archive = minik8s_conformance::node::repo_root().join("target/images/busybox.tar");
    c.block_on(c.registry().copy(
        &format!(
            "docker-archive:{}:docker.io/library/busybox:latest",
            archive.display()
        ),
        "library/webapp:v2",
    ))
    .expect("pushing to the local registry");
    c.ok(&[
        "run",
        "pulled",
        "--image=webapp:v2",
        "--image-pull-policy=Always",
        "--restart=Never",
        "--",
        "sh",
        "-c",
        "echo pulled; sleep 3600",
    ]);
    c.eventually(
        &["get", "pod", "pulled", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    let image_id = jsonpath(
        &c,
        &["pod", "pulled"],
        "{.status.containerStatuses[0].imageID}",
    );
    // A repo digest of the pulled manifest (the same content as busybox, so either name).
    assert!(
        image_id.starts_with("docker.io/library/") && image_id.contains("@sha256:"),
        "{image_id}"
    );
    assert_eq!(c.ok(&["logs", "pulled"]), "pulled\n");
    c.ok(&["run", "missing", "--image=webapp:nope", "--restart=Never"]);
    c.eventually(
        &[
            "get",
            "pod",
            "missing",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ],
        |s| s == "ErrImagePull",
    );
    c.eventually(
        &[
            "get",
            "pod",
            "missing",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
        ],
        |s| s == "ImagePullBackOff",
    );
    assert_eq!(
        jsonpath(&c, &["pod", "missing"], "{.status.phase}"),
        "Pending"
    );
    c.ok(&["delete", "pod", "pulled", "missing", "--grace-period=1"]);

    // A static pod runs from its manifest and is mirrored into the API; deleting the mirror
    // leaves the pod running and brings the mirror back; removing the manifest stops it.
    let manifests = node.config().manifests.clone().unwrap();
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("static-web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\n  labels: {app: static}\n\
         spec:\n  containers:\n  - name: web\n    image: busybox\n    imagePullPolicy: IfNotPresent\n\
         \x20   command: [sh, -c, 'echo static; exec httpd -f -p 8080 -h /www']\n",
    )
    .unwrap();
    c.eventually(
        &[
            "get",
            "pod",
            "static-web-n1",
            "-o",
            "jsonpath={.status.phase}",
        ],
        |s| s == "Running",
    );
    let mirror = jsonpath(
        &c,
        &["pod", "static-web-n1"],
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.metadata.annotations.kubernetes\\.io/config\\.source}",
    );
    assert_eq!(mirror, "Node/n1 file");
    let static_ip = jsonpath(&c, &["pod", "static-web-n1"], "{.status.podIP}");
    assert_eq!(
        http_get(&format!("{static_ip}:8080")).as_deref(),
        Some("hello")
    );
    assert_eq!(c.ok(&["logs", "static-web-n1"]), "static\n");
    let first = jsonpath(
        &c,
        &["pod", "static-web-n1"],
        "{.status.containerStatuses[0].containerID} {.metadata.uid}",
    );
    let (container, mirror_uid) = first.split_once(' ').unwrap();
    // --wait=false: the kubelet makes the mirror again under the same name at once, and
    // kubectl's wait (an informer on that name) can list the new mirror and then wait for a
    // DELETED event that never comes; the uid check below is the real wait.
    c.ok(&["delete", "pod", "static-web-n1", "--wait=false"]);
    c.eventually(
        &[
            "get",
            "pod",
            "static-web-n1",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        |s| !s.is_empty() && s != mirror_uid,
    );
    c.eventually(
        &[
            "get",
            "pod",
            "static-web-n1",
            "-o",
            "jsonpath={.status.containerStatuses[0].containerID}",
        ],
        |s| s == container,
    );
    std::fs::remove_file(manifests.join("static-web.yaml")).unwrap();
    c.eventually(&["get", "pods", "-o", "name"], |s| {
        !s.contains("static-web")
    });
    assert!(
        http_get(&format!("{static_ip}:8080")).is_none(),
        "the static pod stopped with its manifest"
    );

    // Deleting a pod runs its preStop hook, then stops it within its grace period.
    let hooked = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "hooked"}},
  "spec": {{"terminationGracePeriodSeconds": 5, "volumes": [{{"name": "out", "hostPath": {{"path": "{out}"}}}}],
    "containers": [{{"name": "main", "image": "busybox", "command": ["sleep", "3600"],
      "lifecycle": {{"preStop": {{"exec": {{"command": ["sh", "-c", "echo stopping > /out/pre-stop"]}}}}}},
      "volumeMounts": [{{"name": "out", "mountPath": "/out"}}]}}]}}}}"#,
        out = out.display()
    );
    let r = c.with_manifest(&["apply"], &hooked);
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &["get", "pod", "hooked", "-o", "jsonpath={.status.phase}"],
        |s| s == "Running",
    );
    c.ok(&["delete", "pod", "hooked"]);
    assert_eq!(
        std::fs::read_to_string(out.join("pre-stop")).unwrap_or_default(),
        "stopping\n"
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
    // With the apiserver gone, Services keep working: the rules stay in place.
    c.stop_apiserver();
    for _ in 0..5 {
        assert!(
            http_get(&format!("{vip}:80")).is_some_and(|b| pods.contains(&b)),
            "the ClusterIP answers without an apiserver"
        );
    }

    // Tearing the node down leaves no bridge, netns, mount, cgroup, process or chain of ours.
    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

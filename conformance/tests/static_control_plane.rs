//! The control plane as static pods (`minik8s init --static-control-plane`): the kubelet runs
//! the apiserver and the controller manager from manifests, from the locally built
//! control-plane image; their mirror pods show in kube-system; a killed apiserver comes back
//! within seconds; an edited manifest replaces the pod with the new setting, visible in the
//! container's cgroup.

use minik8s_conformance::machines::InitCluster;
use minik8s_conformance::node::free_port;
use minik8s_conformance::node::{bin, repo_root};
use std::time::{Duration, Instant};

/// The pid of the process whose command line starts with `args` (one such process).
fn pid_of(args: &[&str]) -> Option<u32> {
    let want = args.join("\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .starts_with(&want)
            .then_some(pid)
    })
}

const APISERVER: [&str; 2] = ["/usr/local/bin/minik8s", "apiserver"];

/// The memory limit of a process's cgroup (v1 or v2), in bytes.
fn memory_limit(pid: u32) -> Option<u64> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else {
            continue;
        };
        if let Ok(text) = std::fs::read_to_string(&file) {
            return text.trim().parse().ok();
        }
    }
    None
}

fn ready(c: &InitCluster) -> bool {
    c.kubectl(&["get", "--raw", "/readyz"]).ok
}

#[test]
fn the_kubelet_runs_restarts_and_reconfigures_a_static_control_plane() {
    let images = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("bash")
        .arg(repo_root().join("hack/control-plane-image.sh"))
        .arg(bin("minik8s"))
        .arg(images.path())
        .status()
        .expect("hack/control-plane-image.sh runs");
    assert!(status.success(), "building the control-plane image");
    let archive = images.path().join("control-plane.tar");
    let c = InitCluster::start_with(
        free_port(),
        &[
            "--static-control-plane",
            "--control-plane-image",
            archive.to_str().unwrap(),
        ],
    );

    // Mirror pods of both static pods, Running on the node, from the image.
    let pods = c.eventually(
        Duration::from_secs(60),
        &[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.containers[0].image} {.metadata.annotations.kubernetes\\.io/config\\.mirror}{\"\\n\"}{end}",
        ],
        |s| {
            ["kube-apiserver-cp", "kube-controller-manager-cp"]
                .iter()
                .all(|p| s.lines().any(|l| l.starts_with(&format!("{p} Running docker.io/minik8s/control-plane:"))))
        },
    );
    assert!(
        pods.lines().all(|l| l.split_whitespace().count() == 4),
        "mirror pods carry the config.mirror annotation:\n{pods}"
    );
    // The controller manager in its pod works: a Deployment gets its pod.
    c.ok(&[
        "create",
        "deployment",
        "hello",
        "--image=busybox",
        "--",
        "sleep",
        "3600",
    ]);
    c.ok(&["rollout", "status", "deployment/hello", "--timeout=60s"]);

    // Kill drill: SIGKILL the apiserver's process; the kubelet restarts its container.
    let pid = pid_of(&APISERVER).expect("the apiserver's process");
    let killed = Instant::now();
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    while !ready(&c) || pid_of(&APISERVER) == Some(pid) {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the apiserver did not come back within 20 s:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "drill: SIGKILLed the static apiserver; serving again after {} ms",
        killed.elapsed().as_millis()
    );
    c.eventually(
        Duration::from_secs(30),
        &[
            "get",
            "pod",
            "-n",
            "kube-system",
            "kube-apiserver-cp",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        |s| s.parse::<u32>().is_ok_and(|n| n >= 1),
    );

    // Edit drill: a lower memory limit in the manifest replaces the pod; the new container's
    // cgroup has it.
    let manifest = c.data_dir().join("manifests/kube-apiserver.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("\"memory\": \"1Gi\""), "{text}");
    let before = pid_of(&APISERVER).expect("the apiserver's process");
    assert_eq!(memory_limit(before), Some(1 << 30));
    let edited = Instant::now();
    std::fs::write(
        &manifest,
        text.replace("\"memory\": \"1Gi\"", "\"memory\": \"768Mi\""),
    )
    .unwrap();
    loop {
        let now = pid_of(&APISERVER);
        if now.is_some_and(|p| p != before && memory_limit(p) == Some(768 << 20)) && ready(&c) {
            break;
        }
        assert!(
            edited.elapsed() < Duration::from_secs(60),
            "the edited manifest was not applied within 60 s:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "drill: edited the apiserver's manifest (memory 1Gi → 768Mi); serving with the new cgroup limit after {} ms",
        edited.elapsed().as_millis()
    );
    c.eventually(
        Duration::from_secs(30),
        &[
            "get",
            "pod",
            "-n",
            "kube-system",
            "kube-apiserver-cp",
            "-o",
            "jsonpath={.spec.containers[0].resources.limits.memory}",
        ],
        |s| s == "768Mi",
    );
    // The cluster's state survived both: the Deployment is still there and available.
    c.ok(&["rollout", "status", "deployment/hello", "--timeout=60s"]);
}

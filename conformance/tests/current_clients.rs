//! The everyday kubectl verbs as users drive them, with the machine's kubectl and with
//! upstream's v1.34 kubectl (built from Go modules by `hack/upstream.sh`), against a cluster
//! with a real node. (Helm's life cycle is `helm.rs`: one node per test binary, so each checks
//! that its node leaves nothing behind.)

use minik8s_conformance::node::http_get;
use minik8s_conformance::{Cluster, Run, upstream_bin};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One kubectl binary in one namespace.
struct Kubectl<'a> {
    c: &'a Cluster,
    bin: PathBuf,
    ns: String,
}

impl Kubectl<'_> {
    fn with(&self, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
        let mut all = vec!["-n", self.ns.as_str()];
        all.extend_from_slice(args);
        self.c.client_program(&self.bin, &all, stdin, env)
    }

    fn run(&self, args: &[&str]) -> Run {
        self.with(args, None, &[])
    }

    fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args);
        assert!(
            r.ok,
            "{} {args:?} failed:\n{}\n{}",
            self.bin.display(),
            r.stdout,
            r.stderr
        );
        r.stdout
    }

    fn apply(&self, verb: &[&str], manifest: &str) -> Run {
        let mut args = verb.to_vec();
        args.extend(["-f", "-"]);
        self.with(&args, Some(manifest), &[])
    }

    /// Runs until stdout satisfies `done` (60 s at most).
    fn eventually(&self, args: &[&str], done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.run(args);
            if r.ok && done(&r.stdout) {
                return r.stdout;
            }
            assert!(
                Instant::now() < deadline,
                "{args:?} never got there:\n{}{}",
                r.stdout,
                r.stderr
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

const APP: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: busybox
        command: [sh, -c, 'hostname > /www/index.html; exec httpd -f -p 8080 -h /www']
        ports:
        - containerPort: 8080
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: fast
"#;

fn everyday_verbs(k: &Kubectl) {
    let version = k.ok(&["version", "--client"]);
    eprintln!(
        "{}: {}",
        k.bin.display(),
        version.lines().next().unwrap_or("")
    );
    k.c.ok(&["create", "namespace", &k.ns]);

    // apply, twice: created, then unchanged.
    let r = k.apply(&["apply"], APP);
    assert!(
        r.ok && r.stdout.contains("deployment.apps/web created")
            && r.stdout.contains("configmap/settings created"),
        "{r:?}"
    );
    let r = k.apply(&["apply"], APP);
    assert!(
        r.ok && r.stdout.contains("deployment.apps/web unchanged")
            && r.stdout.contains("configmap/settings unchanged"),
        "{r:?}"
    );

    // wait
    let out = k.ok(&[
        "wait",
        "--for=condition=Available",
        "deployment/web",
        "--timeout=120s",
    ]);
    assert!(out.contains("deployment.apps/web condition met"), "{out}");

    // apply --server-side: the field manager is kubectl's, a second apply changes the value.
    let ssa = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  k: one\n";
    let r = k.apply(&["apply", "--server-side"], ssa);
    assert!(
        r.ok && r.stdout.contains("configmap/ssa serverside-applied"),
        "{r:?}"
    );
    let managers = k.ok(&[
        "get",
        "configmap",
        "ssa",
        "-o",
        "jsonpath={range .metadata.managedFields[*]}{.manager}/{.operation} {end}",
    ]);
    assert!(managers.contains("kubectl/Apply"), "{managers}");
    let r = k.apply(&["apply", "--server-side"], &ssa.replace("one", "two"));
    assert!(r.ok, "{r:?}");
    assert_eq!(
        k.ok(&["get", "configmap", "ssa", "-o", "jsonpath={.data.k}"]),
        "two"
    );

    // diff: exit 1 with the change shown; exit 0 and nothing printed without one.
    let r = k.apply(&["diff"], &APP.replace("mode: fast", "mode: slow"));
    assert!(
        !r.ok && r.stdout.contains("-  mode: fast") && r.stdout.contains("+  mode: slow"),
        "{r:?}"
    );
    let r = k.apply(&["diff"], APP);
    assert!(r.ok && r.stdout.trim().is_empty(), "{r:?}");

    // edit, through the editor kubectl runs (KUBE_EDITOR).
    let r = k.with(
        &["edit", "configmap/settings"],
        None,
        &[(
            "KUBE_EDITOR",
            "sed -i -e 's/^  mode: fast$/  mode: edited/'",
        )],
    );
    assert!(
        r.ok && r.stdout.contains("configmap/settings edited"),
        "{r:?}"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "configmap",
            "settings",
            "-o",
            "jsonpath={.data.mode}"
        ]),
        "edited"
    );

    // explain, from the server's OpenAPI.
    let out = k.ok(&["explain", "deployment.spec.replicas"]);
    assert!(
        out.contains("replicas") && out.contains("<integer>"),
        "{out}"
    );

    // auth whoami
    let out = k.ok(&["auth", "whoami"]);
    assert!(
        out.contains("minik8s-admin") && out.contains("system:masters"),
        "{out}"
    );

    // rollout: status, restart (a new revision), history, undo.
    let out = k.ok(&["rollout", "status", "deployment/web", "--timeout=120s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    let out = k.ok(&["rollout", "restart", "deployment/web"]);
    assert!(out.contains("deployment.apps/web restarted"), "{out}");
    let out = k.ok(&["rollout", "status", "deployment/web", "--timeout=120s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    let history = k.ok(&["rollout", "history", "deployment/web"]);
    assert!(
        history.contains("REVISION") && history.lines().any(|l| l.starts_with('2')),
        "{history}"
    );
    let out = k.ok(&["rollout", "undo", "deployment/web"]);
    assert!(out.contains("rolled back"), "{out}");
    k.ok(&["rollout", "status", "deployment/web", "--timeout=120s"]);

    // events: the deployment controller's and the scheduler's, in upstream's columns.
    let out = k.eventually(&["events"], |s| {
        s.contains("ScalingReplicaSet") && s.contains("Scheduled")
    });
    assert!(
        out.lines()
            .next()
            .is_some_and(|h| h.split_whitespace().collect::<Vec<_>>()
                == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]),
        "{out}"
    );
    let out = k.ok(&["events", "--for", "deployment/web"]);
    assert!(out.contains("ScalingReplicaSet"), "{out}");

    // exec, with and without stdin.
    let pod = k
        .eventually(
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "--field-selector=status.phase=Running",
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ],
            |s| s.split_whitespace().count() == 1,
        )
        .trim()
        .to_owned();
    k.ok(&[
        "wait",
        "--for=condition=Ready",
        &format!("pod/{pod}"),
        "--timeout=60s",
    ]);
    assert_eq!(
        k.ok(&["exec", &pod, "--", "cat", "/www/index.html"]).trim(),
        pod
    );
    let r = k.with(&["exec", "-i", &pod, "--", "cat"], Some("piped in\n"), &[]);
    assert!(r.ok && r.stdout == "piped in\n", "{r:?}");

    // cp, both ways.
    let local = k.c.dir().join(format!("{}-note.txt", k.ns));
    std::fs::write(&local, "a note for the pod\n").unwrap();
    k.ok(&[
        "cp",
        local.to_str().unwrap(),
        &format!("{pod}:/tmp/note.txt"),
    ]);
    let back = k.c.dir().join(format!("{}-back.txt", k.ns));
    k.ok(&[
        "cp",
        &format!("{pod}:/tmp/note.txt"),
        back.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "a note for the pod\n"
    );

    // port-forward to the Deployment, on a port kubectl picks.
    port_forward(k, "deployment/web", &pod);

    // logs -f follows a running container to its end.
    k.ok(&[
        "run",
        "logger",
        "--image=busybox",
        "--restart=Never",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4 5; do echo line $i; sleep 1; done",
    ]);
    k.eventually(
        &["get", "pod", "logger", "-o", "jsonpath={.status.phase}"],
        |s| s != "Pending",
    );
    let out = k.ok(&["logs", "-f", "logger"]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["line 1", "line 2", "line 3", "line 4", "line 5"],
        "{out}"
    );

    // debug: an ephemeral container in the running pod.
    k.ok(&[
        "debug",
        &pod,
        "--image=busybox",
        "-c",
        "debugger",
        "--",
        "sh",
        "-c",
        "echo debugging $(hostname); sleep 600",
    ]);
    k.eventually(
        &[
            "get",
            "pod",
            &pod,
            "-o",
            "jsonpath={.status.ephemeralContainerStatuses[?(@.name==\"debugger\")].state.running.startedAt}",
        ],
        |s| !s.is_empty(),
    );
    // Pods carry metadata.generation (1.33): the ephemeral container was a spec change.
    assert_eq!(
        k.ok(&["get", "pod", &pod, "-o", "jsonpath={.metadata.generation}"]),
        "2"
    );
    let out = k.eventually(&["logs", &pod, "-c", "debugger"], |s| {
        s.contains("debugging")
    });
    assert_eq!(out.trim(), format!("debugging {pod}"));

    // run --rm -i: stdin reaches the command, its output comes back, and the pod is gone
    // after. As upstream's e2e test of it, the command reads stdin first: one that exits at
    // once may end before kubectl attaches (upstream's race too), and its output is lost.
    let r = k.with(
        &[
            "run",
            "once",
            "--rm",
            "-i",
            "--restart=Never",
            "--image=busybox",
            "--",
            "sh",
            "-c",
            "cat && echo 'stdin closed'",
        ],
        Some("abcd1234"),
        &[],
    );
    assert!(
        r.ok && r.stdout.contains("abcd1234") && r.stdout.contains("stdin closed"),
        "{r:?}"
    );
    k.eventually(&["get", "pods", "-o", "name"], |s| !s.contains("pod/once"));

    // delete the namespace (and everything in it).
    k.c.ok(&["delete", "namespace", &k.ns, "--wait=false"]);
}

/// `kubectl port-forward TARGET :8080`: reads the local port kubectl picked from its output
/// and GETs through it; `want` is what the pod answers.
fn port_forward(k: &Kubectl, target: &str, want: &str) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(&k.bin)
        .args(["-n", &k.ns, "port-forward", target, ":8080"])
        .env("KUBECONFIG", &k.c.kubeconfig)
        .env("HOME", k.c.dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl port-forward runs");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    // "Forwarding from 127.0.0.1:PORT -> 8080"
    let port = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned);
    let got = port.and_then(|p| http_get(&format!("127.0.0.1:{p}")));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        got.as_deref(),
        Some(want),
        "port-forward printed {line:?}; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn everyday_kubectl_verbs_work_with_the_machines_kubectl_and_upstreams_v1_34() {
    let upstream = upstream_bin("kubectl");
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("verbs", 42);
    for (label, bin) in [("machine", PathBuf::from("kubectl")), ("v1-34", upstream)] {
        let k = Kubectl {
            c: &c,
            bin,
            ns: format!("verbs-{label}"),
        };
        everyday_verbs(&k);
    }
    let left = node.down();
    assert!(left.is_empty(), "the node left {left:?}");
}

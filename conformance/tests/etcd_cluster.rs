//! The private 3-member etcd of `hack/etcd-cluster.sh` under `minik8s up --storage etcd://…`
//! (issue 30's first slice): the members speak TLS only, with certificates from the cluster
//! CA, and the apiserver reaches them with its own client certificate. With one member
//! SIGKILLed (the leader) writes go on; with quorum lost the apiserver answers 503 with a clear
//! message well within its request timeout and `/readyz` fails on `etcd`; with the members
//! back, writes go on and no acknowledged write is lost; `down` leaves nothing running.

use minik8s_conformance::node::{bin, free_port, repo_root, terminate};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Port base of this test's members (clients on BASE+1..3, peers on BASE+11..13).
const BASE_PORT: &str = "24790";

fn script(dir: &Path, args: &[&str]) -> Output {
    Command::new("bash")
        .arg(repo_root().join("hack/etcd-cluster.sh"))
        .args(args)
        .arg(dir)
        .env("BASE_PORT", BASE_PORT)
        .env("MINIK8S", bin("minik8s"))
        .output()
        .expect("hack/etcd-cluster.sh runs")
}

/// The members, stopped (and their data removed) on drop.
struct EtcdCluster {
    dir: PathBuf,
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        let _ = script(&self.dir, &["down"]);
    }
}

/// `minik8s up` without a node, stopped on drop.
struct Up {
    child: Child,
    kubeconfig: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// On a failed assertion, prints the last lines of `minik8s up`'s log: a dead apiserver
/// otherwise shows only as "connection refused".
struct LogOnPanic(PathBuf);

impl Drop for LogOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.0).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- the last lines of {}:\n{}",
                self.0.display(),
                lines[lines.len().saturating_sub(60)..].join("\n")
            );
        }
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new("kubectl")
        .args(args)
        .arg("--request-timeout=30s")
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("kubectl runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn etcdctl(dir: &Path, args: &[&str]) -> Output {
    let pki = dir.join("pki");
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--cacert={}", pki.join("ca.crt").display()))
        .arg(format!(
            "--cert={}",
            pki.join("apiserver-etcd-client.crt").display()
        ))
        .arg(format!(
            "--key={}",
            pki.join("apiserver-etcd-client.key").display()
        ))
        .args(["--dial-timeout=2s", "--command-timeout=3s"])
        .args(args)
        .output()
        .expect("etcdctl runs")
}

/// The member (1-3) that leads now.
fn leader(dir: &Path, endpoints: &[String]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for (i, e) in endpoints.iter().enumerate() {
            let o = etcdctl(dir, &["--endpoints", e, "endpoint", "status", "-w", "json"]);
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
            let s = &v[0]["Status"];
            if s["leader"].is_u64() && s["leader"] == s["header"]["member_id"] {
                return i + 1;
            }
        }
        assert!(Instant::now() < deadline, "no etcd member leads");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Creates ConfigMap `name`; `Ok` with its resourceVersion once acknowledged.
fn create(kubeconfig: &Path, name: &str) -> Result<String, String> {
    let o = kubectl(
        kubeconfig,
        &[
            "create",
            "configmap",
            name,
            &format!("--from-literal=v={name}"),
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
    );
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(text(&o))
    }
}

#[test]
fn an_apiserver_on_a_three_member_tls_etcd_survives_a_member_and_reports_lost_quorum() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("data");
    let up = script(&dir, &["up"]);
    assert!(up.status.success(), "etcd-cluster.sh up: {}", text(&up));
    let cluster = EtcdCluster { dir: dir.clone() };
    let storage = String::from_utf8_lossy(&up.stdout).trim().to_owned();
    assert!(
        storage.starts_with("etcd://") && storage.split(',').count() == 3,
        "up prints the endpoints: {storage:?}"
    );
    let endpoints: Vec<String> = storage["etcd://".len()..]
        .split(',')
        .map(|h| format!("https://{h}"))
        .collect();
    // `up` again is harmless and prints the same endpoints.
    let again = script(&dir, &["up"]);
    assert!(again.status.success(), "up twice: {}", text(&again));
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), storage);
    // TLS only: without a client certificate the members refuse.
    let plain = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &endpoints[0], "--dial-timeout=2s"])
        .arg(format!("--cacert={}", dir.join("pki/ca.crt").display()))
        .args(["get", "x"])
        .output()
        .expect("etcdctl");
    assert!(
        !plain.status.success(),
        "a client without a certificate was served"
    );

    let port = free_port();
    let log = std::fs::File::create(tmp.path().join("up.log")).expect("log");
    let _log_on_panic = LogOnPanic(tmp.path().join("up.log"));
    let child = Command::new(bin("minik8s"))
        .args([
            "up",
            "--no-node",
            "--no-functions",
            "--no-router",
            "--data-dir",
        ])
        .arg(&dir)
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--storage", &storage])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("minik8s up starts");
    let mut up = Up {
        child,
        kubeconfig: dir.join("admin.kubeconfig"),
    };
    let started = Instant::now();
    while !(up.kubeconfig.exists()
        && kubectl(&up.kubeconfig, &["get", "ns", "default"])
            .status
            .success())
    {
        if let Ok(Some(status)) = up.child.try_wait() {
            panic!(
                "minik8s up exited ({status}):\n{}",
                std::fs::read_to_string(tmp.path().join("up.log")).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the apiserver never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let mut acknowledged: Vec<(String, String)> = Vec::new();
    for i in 0..5 {
        let name = format!("before-{i}");
        let rv = create(&up.kubeconfig, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        acknowledged.push((name, rv));
    }
    // The objects are in this etcd, under the apiserver's keys.
    let keys = etcdctl(
        &dir,
        &[
            "--endpoints",
            &endpoints.join(","),
            "get",
            "--prefix",
            "--keys-only",
            "/registry/core/configmaps/default/before-",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&keys.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
        5,
        "{}",
        text(&keys)
    );

    // The leader SIGKILLed: the other two elect one, and writes go on.
    let first = leader(&dir, &endpoints);
    let killed = script(&dir, &["kill", &first.to_string()]);
    assert!(killed.status.success(), "{}", text(&killed));
    let mut failures = Vec::new();
    for i in 0..10 {
        let name = format!("one-down-{i}");
        // A request on the dead member's connection may fail once; the next must not.
        match create(&up.kubeconfig, &name).or_else(|e| {
            failures.push(e);
            create(&up.kubeconfig, &name)
        }) {
            Ok(rv) => acknowledged.push((name, rv)),
            Err(e) => panic!("{name} failed twice with one member down: {e}"),
        }
    }
    assert!(
        failures.len() <= 1,
        "more than one failed write with a member down: {failures:?}"
    );
    eprintln!(
        "leader m{first} killed: 10 writes, {} failed once and went through on retry",
        failures.len()
    );

    // Quorum lost (a second member killed): a write fails with 503 and a clear message well
    // within the request timeout, and /readyz fails on etcd.
    let second = (1..=3).find(|n| *n != first).expect("another member");
    let killed = script(&dir, &["kill", &second.to_string()]);
    assert!(killed.status.success(), "{}", text(&killed));
    let asked = Instant::now();
    let o = kubectl(
        &up.kubeconfig,
        &[
            "create",
            "configmap",
            "no-quorum",
            "--from-literal=v=x",
            "-v=6",
        ],
    );
    let took = asked.elapsed();
    assert!(!o.status.success(), "a write without quorum succeeded");
    let out = text(&o);
    assert!(
        out.contains("503") && out.contains("etcd is unavailable"),
        "the answer without quorum: {out}"
    );
    assert!(took < Duration::from_secs(20), "the write took {took:?}");
    eprintln!("quorum lost: a write answered 503 in {took:?}");
    let ready = kubectl(&up.kubeconfig, &["get", "--raw", "/readyz?verbose"]);
    let ready_text = text(&ready);
    assert!(!ready.status.success(), "/readyz passed without quorum");
    assert!(
        ready_text.contains("[-]etcd failed"),
        "/readyz without quorum: {ready_text}"
    );

    // The members back (`up` starts those not running): writes go on.
    let back = script(&dir, &["up"]);
    assert!(back.status.success(), "{}", text(&back));
    let restarted = Instant::now();
    let deadline = restarted + Duration::from_secs(30);
    let mut resumed = None;
    let mut i = 0;
    while acknowledged.len() < 20 {
        let name = format!("after-{i}");
        match create(&up.kubeconfig, &name) {
            Ok(rv) => {
                resumed.get_or_insert_with(|| restarted.elapsed());
                acknowledged.push((name, rv));
                i += 1;
            }
            Err(e) => {
                if Instant::now() >= deadline {
                    let exited = up.child.try_wait().ok().flatten();
                    panic!(
                        "writes did not resume with the members back: {e}\nminik8s up exited: {exited:?}"
                    );
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }

    eprintln!("members back: writes resumed {resumed:?} after `up`");
    // Every acknowledged write is there, at the resourceVersion it was acknowledged with.
    for (name, rv) in &acknowledged {
        let o = kubectl(
            &up.kubeconfig,
            &[
                "get",
                "configmap",
                name,
                "-o",
                "jsonpath={.metadata.resourceVersion} {.data.v}",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("{rv} {name}"),
            "{name}: {}",
            text(&o)
        );
    }

    drop(up);
    drop(cluster);
    // Nothing of it is left running.
    let left = Command::new("pgrep")
        .args([
            "-f",
            &format!("etcd --name m. --data-dir {}", dir.display()),
        ])
        .output()
        .expect("pgrep");
    assert!(
        left.stdout.is_empty(),
        "etcd members left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

//! The API's history checked for linearizability (issue 52's CI run): four clients create,
//! read, update on the versions they saw, delete and list three ConfigMaps against
//! `minik8s up` on its embedded store, which is SIGKILLed and restarted in the middle; the
//! checker must find the history linearizable. Then the same workload against an apiserver in
//! its deliberately broken mode (some GETs served stale) must be refused, or the checker
//! proves nothing.

use minik8s_conformance::node::{bin, free_port, terminate};
use minik8s_linearizability::record::{Recorder, Workload};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `minik8s up` without a node on `dir` and `port`, stopped on drop.
struct Up {
    child: Child,
    dir: PathBuf,
    port: u16,
    broken: bool,
}

impl Up {
    fn start(dir: &Path, port: u16, broken: bool) -> Up {
        let up = Up {
            child: spawn(dir, port, broken),
            dir: dir.to_owned(),
            port,
            broken,
        };
        up.wait_ready();
        up
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        loop {
            let ok = self.kubeconfig().exists()
                && Command::new("kubectl")
                    .args(["get", "ns", "default", "--request-timeout=5s"])
                    .env("KUBECONFIG", self.kubeconfig())
                    .output()
                    .is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "minik8s up never answered: {}",
                std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGKILL, then the same command again on the same folder; how long until it answered.
    fn kill_and_restart(&mut self) -> Duration {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let started = Instant::now();
        self.child = spawn(&self.dir, self.port, self.broken);
        self.wait_ready();
        started.elapsed()
    }
}

/// `minik8s up` on its embedded store in `dir`, logging next to it.
fn spawn(dir: &Path, port: u16, broken: bool) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.with_extension("log"))
        .expect("log");
    let mut cmd = Command::new(bin("minik8s"));
    cmd.args([
        "up",
        "--no-node",
        "--no-functions",
        "--no-router",
        "--data-dir",
    ])
    .arg(dir)
    .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(log);
    if broken {
        cmd.env("MINIK8S_TEST_BREAK_READS", "stale");
    }
    cmd.spawn().expect("minik8s up starts")
}

impl Drop for Up {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

#[test]
fn the_api_history_is_linearizable_through_a_sigkill_and_the_checker_refuses_stale_reads() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let rt = runtime();
    let workload = Workload::default();

    // 40 s of calls; `minik8s up` SIGKILLed and restarted 15 s in.
    let mut up = Up::start(&tmp.path().join("store"), free_port(), false);
    let client = rt
        .block_on(minik8s_kubeconfig::client(&up.kubeconfig()))
        .expect("a client");
    let recorder = Recorder::default();
    let until = Instant::now() + Duration::from_secs(40);
    let running = {
        let recorder = recorder.clone();
        let workload = workload.clone();
        rt.spawn(async move { recorder.run(client, &workload, until).await })
    };
    std::thread::sleep(Duration::from_secs(15));
    let back_in = up.kill_and_restart();
    rt.block_on(running).expect("the clients ran");
    let history = recorder.take();
    let checked = Instant::now();
    let violations = minik8s_linearizability::check(&history.ops, &history.lists);
    println!(
        "{} calls ({} lists, {} unanswered; up back {back_in:?} after its SIGKILL), checked in {:?}",
        history.len(),
        history.lists.len(),
        history.unanswered(),
        checked.elapsed()
    );
    assert!(
        violations.is_empty(),
        "not linearizable: {}",
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(history.len() >= 500, "only {} calls", history.len());
    assert!(
        history
            .ops
            .iter()
            .any(|o| matches!(o.output, minik8s_linearizability::Output::Written { .. })),
        "no write acknowledged"
    );
    drop(up);

    // The broken mode: some GETs served from an older version. The checker must say so.
    let broken = Up::start(&tmp.path().join("broken"), free_port(), true);
    let client = rt
        .block_on(minik8s_kubeconfig::client(&broken.kubeconfig()))
        .expect("a client");
    let recorder = Recorder::default();
    let until = Instant::now() + Duration::from_secs(15);
    rt.block_on(recorder.run(client, &workload, until));
    let history = recorder.take();
    let violations = minik8s_linearizability::check(&history.ops, &history.lists);
    println!(
        "broken mode: {} calls, {} violations; the first: {}",
        history.len(),
        violations.len(),
        violations
            .first()
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    assert!(
        !violations.is_empty(),
        "the checker passed a history with stale reads ({} calls)",
        history.len()
    );
}

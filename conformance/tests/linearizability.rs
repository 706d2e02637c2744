//! The API's history checked for linearizability: four clients create, read, update on the
//! versions they saw, delete and list three ConfigMaps, and two watchers follow them as
//! informers do, against `minik8s up` on its embedded store. It is SIGKILLed and restarted in
//! the middle of one run, and its clock is stepped five minutes forward and then ten back
//! (libfaketime) in the middle of another; the checker must find both histories
//! linearizable. Then the same workload against an apiserver in each of its deliberately
//! broken modes (some GETs served stale; some watch events left out) must be refused, or the
//! checker proves nothing.

use minik8s_conformance::node::{bin, faketime, free_port, terminate};
use minik8s_linearizability::History;
use minik8s_linearizability::record::{Recorder, Workload};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `minik8s up` without a node on `dir` and `port`, stopped on drop.
struct Up {
    child: Child,
    dir: PathBuf,
    port: u16,
    env: Vec<(&'static str, String)>,
}

impl Up {
    fn start(dir: &Path, port: u16, env: Vec<(&'static str, String)>) -> Up {
        let up = Up {
            child: spawn(dir, port, &env),
            dir: dir.to_owned(),
            port,
            env,
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
        self.child = spawn(&self.dir, self.port, &self.env);
        self.wait_ready();
        started.elapsed()
    }
}

/// `minik8s up` on its embedded store in `dir` with `env`, logging next to it.
fn spawn(dir: &Path, port: u16, env: &[(&str, String)]) -> Child {
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
    .envs(env.iter().map(|(k, v)| (k, v)))
    .stdout(Stdio::null())
    .stderr(log);
    cmd.spawn().expect("minik8s up starts")
}

/// Records `workload` through `client` for `length`, running `fault` `at` into it; the
/// history and what `fault` returned.
fn record<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    client: kube::Client,
    workload: &Workload,
    length: Duration,
    at: Duration,
    fault: impl FnOnce() -> T,
) -> (History, T) {
    let recorder = Recorder::default();
    let until = Instant::now() + length;
    let running = {
        let recorder = recorder.clone();
        let workload = workload.clone();
        rt.spawn(async move { recorder.run(client, &workload, until).await })
    };
    std::thread::sleep(at);
    let out = fault();
    rt.block_on(running).expect("the clients ran");
    (recorder.take(), out)
}

/// Checks `history`; prints what it was, and panics with the violations unless `linearizable`
/// says what the checker must find.
fn checked(what: &str, history: &History, linearizable: bool) {
    let started = Instant::now();
    let violations = minik8s_linearizability::check(history);
    println!(
        "{what}: {}, {} violations, checked in {:?}{}",
        history.summary(),
        violations.len(),
        started.elapsed(),
        violations
            .first()
            .map(|v| format!("; the first: {v}"))
            .unwrap_or_default()
    );
    if linearizable {
        assert!(
            violations.is_empty(),
            "{what}: not linearizable: {}",
            minik8s_linearizability::describe(&violations)
        );
        assert!(
            history
                .ops
                .iter()
                .any(|o| matches!(o.output, minik8s_linearizability::Output::Written { .. })),
            "{what}: no write acknowledged"
        );
        assert!(history.events() > 0, "{what}: no watch event delivered");
    } else {
        assert!(
            !violations.is_empty(),
            "{what}: the checker passed a broken history ({} calls)",
            history.len()
        );
    }
}

fn kubectl(up: &Up, args: &[&str]) {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", up.kubeconfig())
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
fn the_api_history_is_linearizable_through_a_sigkill_and_clock_steps_and_the_checker_refuses_broken_reads()
 {
    let tmp = tempfile::tempdir().expect("temp dir");
    let rt = runtime();
    let clock = tmp.path().join("clock");
    let mut up = Up::start(&tmp.path().join("store"), free_port(), faketime(&clock));
    let client = rt
        .block_on(minik8s_kubeconfig::client(&up.kubeconfig()))
        .expect("a client");

    // 40 s of calls; `minik8s up` SIGKILLed and restarted 15 s in.
    let workload = Workload::default();
    let (history, back_in) = record(
        &rt,
        client.clone(),
        &workload,
        Duration::from_secs(40),
        Duration::from_secs(15),
        || up.kill_and_restart(),
    );
    println!("minik8s up answered {back_in:?} after its SIGKILL");
    checked("SIGKILL of minik8s up", &history, true);
    assert!(history.len() >= 5_000, "only {} calls", history.len());

    // 25 s of calls on other keys; the clock five minutes forward 5 s in, ten minutes back
    // 12 s in.
    kubectl(&up, &["create", "namespace", "clock"]);
    let workload = Workload {
        namespace: "clock".into(),
        ..Workload::default()
    };
    let (history, ()) = record(
        &rt,
        client,
        &workload,
        Duration::from_secs(25),
        Duration::from_secs(5),
        || {
            std::fs::write(&clock, "+300s\n").expect("a step forward");
            std::thread::sleep(Duration::from_secs(7));
            std::fs::write(&clock, "-300s\n").expect("a step back");
        },
    );
    checked("clock steps of minik8s up", &history, true);
    assert!(history.len() >= 5_000, "only {} calls", history.len());
    drop(up);

    // The broken modes: some GETs served from an older version; some watch events left out.
    // The checker must say so.
    for mode in ["stale", "drop-events"] {
        let broken = Up::start(
            &tmp.path().join(mode),
            free_port(),
            vec![("MINIK8S_TEST_BREAK_READS", mode.into())],
        );
        let client = rt
            .block_on(minik8s_kubeconfig::client(&broken.kubeconfig()))
            .expect("a client");
        let workload = Workload::default();
        let (history, ()) = record(
            &rt,
            client,
            &workload,
            Duration::from_secs(15),
            Duration::ZERO,
            || {},
        );
        checked(&format!("broken mode {mode}"), &history, false);
    }
}

//! GPUJobs on a real Slurm (Debian's slurmctld, slurmd and munge, started privately by
//! `hack/slurm.sh`) reached through a real sshd login node: the seed's matrix-add job, GPUs
//! held and queued, every bad input of the issue, deletion while running, and a controller
//! restart while a job runs. The node's two GPUs are stand-ins (see `hack/slurm.sh`).

use minik8s_conformance::Cluster;
use minik8s_conformance::node::repo_root;
use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Stops the private Slurm when the test ends.
struct Slurm;

impl Slurm {
    fn up(kubeconfig: &std::path::Path) -> Slurm {
        let out = Command::new("bash")
            .arg(repo_root().join("hack/slurm.sh"))
            .arg("up")
            .env("KUBECONFIG", kubeconfig)
            .output()
            .expect("hack/slurm.sh runs");
        assert!(
            out.status.success(),
            "hack/slurm.sh up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Slurm
    }

    /// Runs a Slurm command on this machine (as the login node would).
    fn run(args: &[&str]) -> String {
        let out = Command::new(args[0])
            .args(&args[1..])
            .env("SLURM_CONF", repo_root().join("target/slurm/slurm.conf"))
            .output()
            .expect("slurm command");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_root().join("hack/slurm.sh"))
            .arg("down")
            .status();
    }
}

const MATRIX_ADD: &str = r#"
apiVersion: gpu.minik8s.io/v1alpha1
kind: GPUJob
metadata: {name: matrix-add}
spec:
  partition: gpu
  nodes: 1
  tasksPerNode: 1
  cpusPerTask: 1
  gpus: 1
  timeLimit: "00:05:00"
  source:
    inline:
      add.c: |
        #include <stdio.h>
        int main(void) { int a[4]={1,2,3,4}, b[4]={5,6,7,8}; FILE *f = fopen("result", "w"); for (int i=0;i<4;i++) fprintf(f, "%d ", a[i]+b[i]); fprintf(f, "\n"); return fclose(f); }
  build: "gcc add.c -o add"
  run: "./add"
  resultFile: result
"#;

fn job(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: gpu.minik8s.io/v1alpha1\nkind: GPUJob\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    )
}

fn field(c: &Cluster, name: &str, path: &str) -> String {
    c.ok(&["get", "gj", name, "-o", &format!("jsonpath={path}")])
}

fn wait_phase(c: &Cluster, name: &str, want: &str, limit: Duration) -> BTreeSet<String> {
    let deadline = Instant::now() + limit;
    let mut seen = BTreeSet::new();
    loop {
        let phase = field(c, name, "{.status.phase}");
        if !phase.is_empty() {
            seen.insert(phase.clone());
        }
        if phase == want {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {phase}, not {want}: {}",
            c.ok(&["get", "gj", name, "-o", "jsonpath={.status}"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn gpujobs_run_on_slurm_over_ssh_queue_fail_cleanly_and_survive_a_restart() {
    let c = Cluster::start();
    c.block_on(minik8s_gpu::install(c.client()))
        .expect("CRD installed");
    let _slurm = Slurm::up(&c.kubeconfig);
    let controller = |stop: tokio_util::sync::CancellationToken| {
        c.spawn(minik8s_gpu::controller::run(
            c.client(),
            c.dir().join("gpu"),
            stop,
        ))
    };
    let mut stop = c.shutdown_token().child_token();
    controller(stop.clone());
    c.eventually(&["get", "crd", "gpujobs.gpu.minik8s.io"], |_| true);

    // Every version of a job a watch delivers: a client that waits for the phase change must
    // read the result with it (upstream's Job writes its terminal condition with its final
    // status in one update).
    let versions: Arc<Mutex<Vec<(String, String, bool)>>> = Arc::default();
    {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let versions = versions.clone();
        let jobs: kube::Api<minik8s_gpu::GPUJob> = kube::Api::default_namespaced(c.client());
        c.spawn(async move {
            let mut stream = watcher(jobs, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(j)) = stream.next().await {
                let status = j.status.clone().unwrap_or_default();
                let name = kube::ResourceExt::name_any(&j);
                let phase = status.phase.unwrap_or_default();
                versions
                    .lock()
                    .unwrap()
                    .push((name, phase, status.result.is_some()));
            }
        });
    }

    // The seed's job: built and run through Slurm with one GPU; the result in status and in
    // the ConfigMap.
    let r = c.with_manifest(&["apply"], MATRIX_ADD);
    assert!(r.ok, "{}", r.stderr);
    let seen = wait_phase(&c, "matrix-add", "Succeeded", Duration::from_secs(60));
    assert!(
        seen.iter()
            .any(|p| ["Submitted", "Queued", "Running"].contains(&p.as_str())),
        "phases seen: {seen:?}"
    );
    assert_eq!(
        field(&c, "matrix-add", "{.status.result}").trim(),
        "6 8 10 12"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let watched = loop {
        let watched = versions.lock().unwrap().clone();
        let seen = watched
            .iter()
            .any(|(n, p, _)| n == "matrix-add" && p == "Succeeded");
        if seen || Instant::now() > deadline {
            break watched;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let succeeded: Vec<_> = watched
        .iter()
        .filter(|(n, p, _)| n == "matrix-add" && p == "Succeeded")
        .collect();
    assert!(
        !succeeded.is_empty(),
        "the watch saw matrix-add succeed: {watched:?}"
    );
    assert!(
        succeeded.iter().all(|(_, _, result)| *result),
        "a version said Succeeded without its result: {watched:?}"
    );
    assert_eq!(
        field(&c, "matrix-add", "{.status.slurmState} {.status.exitCode}"),
        "COMPLETED 0"
    );
    for f in [
        "slurmJobId",
        "submitTime",
        "startTime",
        "endTime",
        "duration",
    ] {
        assert!(
            !field(&c, "matrix-add", &format!("{{.status.{f}}}")).is_empty(),
            "{f}"
        );
    }
    assert_eq!(
        c.ok(&[
            "get",
            "configmap",
            "matrix-add-result",
            "-o",
            "jsonpath={.data.result}"
        ]),
        "6 8 10 12 \n"
    );
    let table = c.ok(&["get", "gpujobs"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PHASE",
            "SLURM-ID",
            "PARTITION",
            "GPUS",
            "DURATION",
            "AGE"
        ]
    );
    assert!(c.ok(&["get", "gj", "--no-headers"]).contains("Succeeded"));

    // One job holds both GPUs; a second asking for two waits (Resources) until it ends.
    let r = c.with_manifest(&["apply"], &job("hog", "  gpus: 2\n  run: \"sleep 6\"\n"));
    assert!(r.ok, "{}", r.stderr);
    wait_phase(&c, "hog", "Running", Duration::from_secs(30));
    let r = c.with_manifest(
        &["apply"],
        &job("second", "  gpus: 2\n  run: \"echo second\"\n"),
    );
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &[
            "get",
            "gj",
            "second",
            "-o",
            "jsonpath={.status.phase} {.status.reason}",
        ],
        |s| s == "Queued Resources",
    );
    assert_eq!(field(&c, "hog", "{.status.phase}"), "Running");
    wait_phase(&c, "second", "Succeeded", Duration::from_secs(60));
    assert_eq!(field(&c, "second", "{.status.result}").trim(), "second");

    // More GPUs than any node has, and a partition that does not exist: sbatch's message.
    let r = c.with_manifest(&["apply"], &job("greedy", "  gpus: 3\n  run: \"true\"\n"));
    assert!(r.ok, "{}", r.stderr);
    wait_phase(&c, "greedy", "Failed", Duration::from_secs(20));
    let msg = field(&c, "greedy", "{.status.reason}: {.status.message}");
    assert!(
        msg.starts_with("SubmitFailed: ")
            && msg.contains("Requested node configuration is not available"),
        "{msg}"
    );
    let r = c.with_manifest(
        &["apply"],
        &job("lost", "  partition: nope\n  run: \"true\"\n"),
    );
    assert!(r.ok, "{}", r.stderr);
    wait_phase(&c, "lost", "Failed", Duration::from_secs(20));
    let msg = field(&c, "lost", "{.status.message}");
    assert!(msg.contains("invalid partition specified: nope"), "{msg}");

    // The schema: negative counts and an empty run are 422; unknown fields 400 when strict,
    // pruned otherwise.
    let neg = c.with_manifest(&["apply"], &job("neg", "  gpus: -1\n  run: x\n"));
    assert!(
        !neg.ok
            && neg.stderr.contains("spec.gpus")
            && neg.stderr.contains("greater than or equal to 0"),
        "{}",
        neg.stderr
    );
    let empty = c.with_manifest(&["apply"], &job("empty", "  run: \"\"\n"));
    assert!(
        !empty.ok && empty.stderr.contains("spec.run"),
        "{}",
        empty.stderr
    );
    let strict = c.with_manifest(
        &["apply", "--validate=strict"],
        &job("odd", "  run: \"true\"\n  bogus: 1\n"),
    );
    assert!(
        !strict.ok && strict.stderr.contains("unknown field \"spec.bogus\""),
        "{}",
        strict.stderr
    );
    let lax = c.with_manifest(
        &["apply", "--validate=false"],
        &job("odd", "  run: \"true\"\n  bogus: 1\n"),
    );
    assert!(lax.ok, "{}", lax.stderr);
    assert_eq!(field(&c, "odd", "{.spec.bogus}"), "");

    // A failing build, a failing program, and a time limit.
    let r = c.with_manifest(
        &["apply"],
        &job(
            "badbuild",
            "  source: {inline: {x.c: \"int main( {\"}}\n  build: gcc x.c -o x\n  run: ./x\n",
        ),
    );
    assert!(r.ok, "{}", r.stderr);
    let r = c.with_manifest(&["apply"], &job("exits", "  run: \"echo out; exit 3\"\n"));
    assert!(r.ok, "{}", r.stderr);
    let r = c.with_manifest(
        &["apply"],
        &job("slow", "  timeLimit: \"1\"\n  run: \"sleep 600\"\n"),
    );
    assert!(r.ok, "{}", r.stderr);
    wait_phase(&c, "badbuild", "Failed", Duration::from_secs(30));
    assert_eq!(field(&c, "badbuild", "{.status.reason}"), "BuildFailed");
    let stderr = field(&c, "badbuild", "{.status.stderr}");
    assert!(
        stderr.contains("x.c") && stderr.contains("error"),
        "{stderr}"
    );
    wait_phase(&c, "exits", "Failed", Duration::from_secs(30));
    assert_eq!(
        field(&c, "exits", "{.status.exitCode} {.status.reason}"),
        "3 Error"
    );
    assert_eq!(field(&c, "exits", "{.status.stdout}").trim(), "out");

    // An unreachable login node: Pending with ClusterReachable=False, until it answers.
    let key = c.ok(&[
        "get",
        "secret",
        "-n",
        "gpu-system",
        "slurm-default",
        "-o",
        "jsonpath={.data}",
    ]);
    let data: serde_json::Value = serde_json::from_str(&key).unwrap();
    let mut flaky = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "slurm-flaky", "namespace": "gpu-system"}, "data": data});
    let dead_port = minik8s_conformance::node::free_port();
    use base64::Engine;
    flaky["data"]["port"] =
        serde_json::json!(base64::engine::general_purpose::STANDARD.encode(dead_port.to_string()));
    let r = c.kubectl_stdin(&["apply", "-f", "-"], Some(&flaky.to_string()));
    assert!(r.ok, "{}", r.stderr);
    let r = c.with_manifest(
        &["apply"],
        &job("far", "  cluster: flaky\n  run: \"echo back\"\n"),
    );
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &[
            "get",
            "gj",
            "far",
            "-o",
            "jsonpath={.status.phase} {.status.conditions[?(@.type==\"ClusterReachable\")].status}",
        ],
        |s| s == "Pending False",
    );
    flaky["data"]["port"] = data["port"].clone();
    let r = c.kubectl_stdin(&["apply", "-f", "-"], Some(&flaky.to_string()));
    assert!(r.ok, "{}", r.stderr);
    wait_phase(&c, "far", "Succeeded", Duration::from_secs(60));
    assert_eq!(
        field(
            &c,
            "far",
            "{.status.conditions[?(@.type==\"ClusterReachable\")].status}"
        ),
        "True"
    );

    // Deleting a running job cancels it and removes its folder.
    let r = c.with_manifest(&["apply"], &job("doomed", "  run: \"sleep 600\"\n"));
    assert!(r.ok, "{}", r.stderr);
    wait_phase(&c, "doomed", "Running", Duration::from_secs(30));
    let uid = c.ok(&["get", "gj", "doomed", "-o", "jsonpath={.metadata.uid}"]);
    let folder = repo_root().join("target/slurm/jobs").join(&uid);
    assert!(folder.is_dir());
    c.ok(&["delete", "gj", "doomed", "--timeout=30s"]);
    // Cancelled: gone from the queue once Slurm has ended it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !Slurm::run(&["squeue", "-h", "--name", &uid, "-o", "%i"])
        .trim()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the Slurm job is still queued");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        Slurm::run(&["squeue", "-h", "--states=all", "--name", &uid, "-o", "%T"])
            .contains("CANCELLED"),
        "scancel ended it"
    );
    assert!(!folder.exists(), "{} removed", folder.display());

    // A controller restart while a job runs: the new one follows the same Slurm job. (It runs
    // longer than the controller's longest look-again interval, 8 s for a job that has not
    // changed, or Running may never be seen before it ends.)
    let r = c.with_manifest(
        &["apply"],
        &job("survivor", "  run: \"sleep 12; echo done\"\n"),
    );
    assert!(r.ok, "{}", r.stderr);
    wait_phase(&c, "survivor", "Running", Duration::from_secs(30));
    let id = field(&c, "survivor", "{.status.slurmJobId}");
    stop.cancel();
    std::thread::sleep(Duration::from_secs(1));
    // Back as two controllers (two control-plane machines): one leads, the other stands by,
    // and the job is still one Slurm job.
    stop = c.shutdown_token().child_token();
    controller(stop.clone());
    controller(stop.clone());
    wait_phase(&c, "survivor", "Succeeded", Duration::from_secs(60));
    let holder = c.ok(&[
        "get",
        "lease",
        "-n",
        "gpu-system",
        minik8s_gpu::controller::LEASE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(!holder.is_empty(), "no GPUJob controller leads");
    assert_eq!(field(&c, "survivor", "{.status.slurmJobId}"), id);
    let uid = c.ok(&["get", "gj", "survivor", "-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(
        Slurm::run(&["squeue", "-h", "--states=all", "--name", &uid, "-o", "%i"]).trim(),
        id,
        "one Slurm job"
    );

    // The time limit (Slurm counts in minutes).
    wait_phase(&c, "slow", "Failed", Duration::from_secs(150));
    assert_eq!(
        field(&c, "slow", "{.status.reason} {.status.slurmState}"),
        "TIMEOUT TIMEOUT"
    );
}

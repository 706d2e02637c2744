//! Workflows on a real node, as users drive them with stock kubectl and `kubectl fn wf`: the
//! seed's shape (a function computes from `params`, a Choice routes on its result), Parallel,
//! retry, catch, Fail, every validation error, the columns, deletion, and a crash of the
//! process running the workflow controller in the middle of a run.

use minik8s_conformance::Cluster;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The serverless process; killed if the test ends early (a failed assertion).
struct Serverless(Child);

impl Drop for Serverless {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The serverless process (gateway, Function and Workflow controllers), as its own user.
fn start_serverless(c: &Cluster, host: &str) -> Serverless {
    let kubeconfig = c.user_kubeconfig(minik8s_serverless::USER, &[]);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(c.dir().join("serverless.log"))
        .unwrap();
    Command::new(minik8s_conformance::node::bin("function-gateway"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--listen", "0.0.0.0:0", "--public-host", host])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(Serverless)
        .expect("function-gateway starts")
}

fn register(c: &Cluster, name: &str, code: &str, extra: &[&str]) {
    let file = c.dir().join(format!("{name}.py"));
    std::fs::write(&file, code).unwrap();
    let path = file.display().to_string();
    let mut args = vec!["fn", "register", path.as_str()];
    args.extend(extra);
    assert!(c.ok(&args).contains("registered"));
}

/// Waits for a run to end: its phase, and its status after a colon when it failed (so a
/// failed assertion shows why).
fn ended(c: &Cluster, run: &str) -> String {
    let phase = c.eventually_within(
        Duration::from_secs(90),
        &["get", "workflowrun", run, "-o", "jsonpath={.status.phase}"],
        |p| p == "Succeeded" || p == "Failed",
    );
    if phase == "Failed" {
        eprintln!("{run}: {}", field(c, "wfr", run, ".status"));
    }
    phase
}

fn field(c: &Cluster, kind: &str, name: &str, path: &str) -> String {
    c.ok(&["get", kind, name, "-o", &format!("jsonpath={{{path}}}")])
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

const SEED: &str = "apiVersion: serverless.minik8s.io/v1alpha1
kind: Workflow
metadata: {name: add-then-branch}
spec:
  startAt: add
  params: {x: 3, \"y\": 9}   # kubectl reads YAML 1.1: a bare `y` key is `true`
  steps:
  - {name: add, type: Task, function: add, next: check}
  - name: check
    type: Choice
    choices:
    - {condition: \"input.sum > 10\", next: big}
    default: small
  - {name: big, type: Task, function: double}
  - {name: small, type: Task, function: negate}
";

#[test]
fn workflows_branch_retry_catch_validate_and_survive_a_crash() {
    minik8s_conformance::node::bin("kubectl-fn");
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("w1", 7);
    c.block_on(minik8s_serverless::install(c.client()))
        .expect("the serverless CRDs install");
    let host = c.block_on(minik8s_kubelet::node::default_ip());
    let mut serverless = start_serverless(&c, &host);

    let warm = ["--min", "1", "--scale-to-zero-after", "600"];
    register(
        &c,
        "add",
        "def handler(event):\n    return {\"sum\": event[\"x\"] + event[\"y\"]}\n",
        &warm,
    );
    register(
        &c,
        "double",
        "def handler(event):\n    return event[\"sum\"] * 2\n",
        &warm,
    );
    register(
        &c,
        "negate",
        "def handler(event):\n    return -event[\"sum\"]\n",
        &warm,
    );
    register(
        &c,
        "flaky",
        "calls = 0\ndef handler(event):\n    global calls\n    calls += 1\n    if calls < 3:\n        raise RuntimeError(f\"call {calls} fails\")\n    return {\"calls\": calls}\n",
        &["--max", "1"],
    );
    register(
        &c,
        "boom",
        "def handler(event):\n    raise ValueError(\"bad input\")\n",
        &[],
    );

    // The seed's shape: applying the Workflow with params runs it (3 + 9 = 12 > 10 → double).
    let applied = c.with_manifest(&["apply"], SEED);
    assert!(applied.ok, "{}", applied.stderr);
    // As users drive a new kind: applied again it is unchanged, `kubectl explain` knows it,
    // and a bad manifest is a 422 that writes nothing.
    let again = c.with_manifest(&["apply"], SEED);
    assert!(
        again.stdout.contains("unchanged"),
        "{}{}",
        again.stdout,
        again.stderr
    );
    let explained = c.ok(&["explain", "workflow.spec.steps"]);
    assert!(
        explained.contains("startAt") || explained.contains("function"),
        "{explained}"
    );
    let bad = c.with_manifest(
        &["apply"],
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Workflow\nmetadata: {name: bad-shape}\nspec: {startAt: a, steps: {a: 1}}\n",
    );
    assert!(
        !bad.ok && bad.stderr.contains("Invalid value"),
        "{}",
        bad.stderr
    );
    assert!(
        c.fails(&["get", "workflow", "bad-shape"])
            .contains("NotFound")
    );
    assert_eq!(ended(&c, "add-then-branch-1"), "Succeeded");
    assert_eq!(
        field(&c, "wfr", "add-then-branch-1", ".status.output"),
        "24"
    );
    let steps = json(&field(&c, "wfr", "add-then-branch-1", ".status.steps"));
    let names: Vec<&str> = steps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["add", "check", "big"]);
    assert_eq!(steps[0]["output"], serde_json::json!({"sum": 12}));
    assert_eq!(steps[1]["type"], "Choice");
    // Started again with other inputs, it takes the other branch.
    let run1 = c.with_manifest(
        &["apply"],
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: WorkflowRun\nmetadata: {name: run-1}\n\
         spec: {workflowRef: {name: add-then-branch}, input: {x: 1, \"y\": 2}}\n",
    );
    assert!(run1.ok, "{}", run1.stderr);
    assert_eq!(ended(&c, "run-1"), "Succeeded");
    assert_eq!(field(&c, "wfr", "run-1", ".status.output"), "-3");
    assert_eq!(
        c.ok(&[
            "fn",
            "wf",
            "start",
            "add-then-branch",
            "--input",
            r#"{"x":20,"y":1}"#,
            "--wait"
        ])
        .trim(),
        "42"
    );
    let runs = c.ok(&["fn", "wf", "runs", "add-then-branch"]);
    assert_eq!(
        runs.lines().filter(|l| l.contains("Succeeded")).count(),
        3,
        "{runs}"
    );
    let timeline = c.ok(&["fn", "wf", "describe", "run-1"]);
    for want in [
        "Phase:     Succeeded",
        "add",
        "Task",
        "check",
        "Choice",
        "small",
        "(end)",
    ] {
        assert!(timeline.contains(want), "{want}: {timeline}");
    }
    // The columns.
    let table = c.ok(&["get", "workflowruns"]);
    let header = table.lines().next().unwrap();
    for col in ["NAME", "PHASE", "STEP", "DURATION", "AGE"] {
        assert!(header.contains(col), "{table}");
    }
    assert!(
        table.contains("run-1") && table.contains("Succeeded"),
        "{table}"
    );
    let wf = c.eventually(&["get", "workflow", "add-then-branch"], |t| {
        t.lines()
            .nth(1)
            .is_some_and(|l| l.split_whitespace().collect::<Vec<_>>()[1..4] == ["True", "4", "3"])
    });
    assert!(wf.lines().next().unwrap().contains("STEPS"), "{wf}");

    // Parallel: two branches at once, their outputs in branch order.
    let run = |name: &str, spec: &str| {
        let made = c.with_manifest(
            &["apply"],
            &format!(
                "apiVersion: serverless.minik8s.io/v1alpha1\nkind: WorkflowRun\nmetadata: {{name: {name}}}\nspec:\n{spec}"
            ),
        );
        assert!(made.ok, "{}", made.stderr);
        ended(&c, name)
    };
    let phase = run(
        "fan",
        "  input: {x: 2, \"y\": 5}\n  workflowSpec:\n    startAt: both\n    steps:\n    - name: both\n      type: Parallel\n      branches:\n      - startAt: a\n        steps: [{name: a, type: Task, function: add}]\n      - startAt: p\n        steps: [{name: p, type: Pass, output: 'input.x * 10'}]\n",
    );
    assert_eq!(phase, "Succeeded");
    assert_eq!(
        json(&field(&c, "wfr", "fan", ".status.output")),
        serde_json::json!([{"sum": 7}, 20])
    );

    // Retry: fails twice, then succeeds.
    let phase = run(
        "retry",
        "  workflowSpec:\n    startAt: f\n    steps: [{name: f, type: Task, function: flaky, retry: {maxAttempts: 3, backoffSeconds: 0.1}}]\n",
    );
    assert_eq!(phase, "Succeeded");
    assert_eq!(field(&c, "wfr", "retry", ".status.steps[0].attempts"), "3");
    assert_eq!(
        json(&field(&c, "wfr", "retry", ".status.output")),
        serde_json::json!({"calls": 3})
    );

    // Catch: the error is routed to a step that gets {"error", "cause"}.
    let phase = run(
        "caught",
        "  workflowSpec:\n    startAt: f\n    steps:\n    - {name: f, type: Task, function: boom, catch: handle}\n    - {name: handle, type: Pass, output: '\"handled \" + input.error + \" (\" + input.cause + \")\"'}\n",
    );
    assert_eq!(phase, "Succeeded");
    assert_eq!(
        field(&c, "wfr", "caught", ".status.output"),
        "handled ValueError (ValueError: bad input)"
    );
    // Uncaught, the run fails with the function's error.
    let phase = run(
        "uncaught",
        "  workflowSpec:\n    startAt: f\n    steps: [{name: f, type: Task, function: boom}]\n",
    );
    assert_eq!(phase, "Failed");
    assert_eq!(field(&c, "wfr", "uncaught", ".status.error"), "ValueError");

    // Fail.
    let phase = run(
        "failing",
        "  workflowSpec:\n    startAt: reject\n    steps: [{name: reject, type: Fail, error: Rejected, cause: the input was refused}]\n",
    );
    assert_eq!(phase, "Failed");
    assert_eq!(field(&c, "wfr", "failing", ".status.error"), "Rejected");
    assert_eq!(
        field(&c, "wfr", "failing", ".status.cause"),
        "the input was refused"
    );

    // A large output (over 64 KiB) goes into a ConfigMap owned by the run; the object stays
    // small and the next step still gets it.
    register(
        &c,
        "big",
        "def handler(event):\n    return {\"blob\": \"x\" * 100000}\n",
        &[],
    );
    let phase = run(
        "large",
        "  workflowSpec:\n    startAt: make\n    steps:\n    - {name: make, type: Task, function: big, next: size}\n    - {name: size, type: Pass, output: 'size(input.blob)'}\n",
    );
    assert_eq!(phase, "Succeeded");
    assert_eq!(field(&c, "wfr", "large", ".status.output"), "100000");
    let held = field(&c, "wfr", "large", ".status.steps[0].outputRef");
    assert!(!held.is_empty(), "the large output is referenced");
    assert_eq!(
        field(&c, "configmap", &held, ".metadata.ownerReferences[0].name"),
        "large"
    );
    assert_eq!(field(&c, "configmap", &held, ".data.value").len(), 100_011);

    // Validation: each error is the Workflow's Ready=False naming the step, and its runs fail
    // at once with that message.
    let invalid = [
        (
            "bad-next",
            "[{name: a, type: Task, function: add, next: nowhere}]",
            "step a: next names no step",
        ),
        (
            "bad-unreachable",
            "[{name: a, type: Pass}, {name: lost, type: Pass}]",
            "step lost: unreachable",
        ),
        (
            "bad-choice",
            "[{name: a, type: Choice}]",
            "step a: a Choice needs choices or a default",
        ),
        (
            "bad-cel",
            "[{name: a, type: Choice, choices: [{condition: 'input.sum >', next: a}]}]",
            "step a: condition",
        ),
        (
            "bad-function",
            "[{name: a, type: Task, function: ghost}]",
            "step a: function \"ghost\" does not exist",
        ),
    ];
    for (name, steps, message) in invalid {
        let made = c.with_manifest(
            &["apply"],
            &format!(
                "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Workflow\nmetadata: {{name: {name}}}\nspec:\n  startAt: a\n  steps: {steps}\n"
            ),
        );
        assert!(made.ok, "{}", made.stderr);
        let got = c.eventually(
            &[
                "get",
                "workflow",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].message}",
            ],
            |m| m.starts_with("False "),
        );
        assert!(got.contains(message), "{name}: {got}");
    }
    let started = Instant::now();
    let failed = c.kubectl(&["fn", "wf", "start", "bad-next", "--wait"]);
    assert!(
        !failed.ok
            && failed.stderr.contains("InvalidWorkflow")
            && failed.stderr.contains("step a: next names no step"),
        "{}",
        failed.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // A loop through a Choice ends at maxSteps.
    let phase = run(
        "looping",
        "  workflowSpec:\n    startAt: a\n    maxSteps: 20\n    steps:\n    - {name: a, type: Pass, next: b}\n    - {name: b, type: Choice, choices: [{condition: 'true', next: a}]}\n",
    );
    assert_eq!(phase, "Failed");
    assert_eq!(
        field(&c, "wfr", "looping", ".status.error"),
        "MaxStepsExceeded"
    );

    // Metrics of runs by phase, steps and transitions.
    let url = field(&c, "fn", "add", ".status.url");
    let base = url.split("/function/").next().unwrap().to_owned();
    let metrics = c.block_on(async {
        let rest = base.strip_prefix("http://").unwrap();
        let mut s = tokio::net::TcpStream::connect(rest).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {rest}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    });
    for want in [
        "minik8s_workflow_runs_total{phase=\"Succeeded\"}",
        "minik8s_workflow_runs_total{phase=\"Failed\"}",
        "minik8s_workflow_step_duration_seconds_count{type=\"Task\"}",
        "minik8s_workflow_transitions_total",
    ] {
        assert!(metrics.contains(want), "{want}: {metrics}");
    }

    // Deleting a Workflow deletes its runs.
    c.ok(&["delete", "workflow", "add-then-branch"]);
    c.eventually(
        &[
            "get",
            "workflowruns",
            "-l",
            "serverless.minik8s.io/workflow=add-then-branch",
            "-o",
            "name",
        ],
        |o| o.trim().is_empty(),
    );

    // A crash in the middle of a five-step chain: SIGKILL the process running the workflow
    // controller while step 2 is in flight; after a restart the run completes, and every
    // step but that one ran exactly once (the function's own log says so).
    register(
        &c,
        "log",
        "import json, time\n\
         def handler(event, context):\n    step = len(event[\"trail\"])\n    print(json.dumps({\"step\": step, \"id\": context[\"invocation_id\"]}), flush=True)\n    if step == 2:\n        time.sleep(4)\n    return {\"trail\": event[\"trail\"] + [step]}\n",
        &["--min", "1", "--max", "1", "--scale-to-zero-after", "600"],
    );
    let chain: String = (0..5)
        .map(|i| {
            let next = if i < 4 {
                format!(", next: s{}", i + 1)
            } else {
                String::new()
            };
            format!("    - {{name: s{i}, type: Task, function: log{next}}}\n")
        })
        .collect();
    let made = c.with_manifest(
        &["apply"],
        &format!(
            "apiVersion: serverless.minik8s.io/v1alpha1\nkind: WorkflowRun\nmetadata: {{name: crash}}\nspec:\n  input: {{trail: []}}\n  workflowSpec:\n    startAt: s0\n    steps:\n{chain}"
        ),
    );
    assert!(made.ok, "{}", made.stderr);
    c.eventually_within(
        Duration::from_secs(90),
        &["get", "wfr", "crash", "-o", "jsonpath={.status.step}"],
        |s| s == "s2",
    );
    std::thread::sleep(Duration::from_millis(500));
    serverless.0.kill().expect("SIGKILL");
    serverless.0.wait().unwrap();
    assert_eq!(field(&c, "wfr", "crash", ".status.phase"), "Running");
    let mut serverless = start_serverless(&c, &host);
    assert_eq!(ended(&c, "crash"), "Succeeded");
    assert_eq!(
        json(&field(&c, "wfr", "crash", ".status.output")),
        serde_json::json!({"trail": [0, 1, 2, 3, 4]})
    );
    let logs = c.ok(&["fn", "logs", "log"]);
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| l.split_once("] ").map(|(_, rest)| rest))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for step in 0..5 {
        let calls: Vec<&serde_json::Value> = lines.iter().filter(|l| l["step"] == step).collect();
        if step == 2 {
            assert!(!calls.is_empty(), "{logs}");
            assert!(
                calls.iter().all(|l| l["id"] == calls[0]["id"]),
                "a step run again keeps its invocation id: {logs}"
            );
        } else {
            assert_eq!(calls.len(), 1, "step {step} ran once: {logs}");
        }
    }

    // A clean stop on SIGTERM.
    Command::new("kill")
        .args(["-TERM", &serverless.0.id().to_string()])
        .status()
        .unwrap();
    assert!(
        serverless.0.wait().unwrap().success(),
        "function-gateway stops cleanly on SIGTERM"
    );
    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

//! Function revisions and traffic on a real node, as users drive them with stock kubectl and
//! `kubectl fn`: v1 → v2 (all traffic to v2 once it is Ready), a broken v3 that takes no
//! traffic, a 90/10 split measured over 2,000 calls, tag URLs, a rollback under a load loop,
//! a Workflow step pinned to a tag, the revision label of the metrics, every bad traffic
//! input, deletion of a revision that takes traffic, and garbage collection of old revisions.

use minik8s_conformance::Cluster;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A version of the function: it answers `{"v": N}`.
fn version(n: u32) -> String {
    format!("def handler(event):\n    return {{\"v\": {n}}}\n")
}

fn register(c: &Cluster, code: &str, extra: &[&str]) {
    let file = c.dir().join("add.py");
    std::fs::write(&file, code).unwrap();
    let path = file.display().to_string();
    let mut args = vec!["fn", "register", path.as_str()];
    args.extend(extra);
    let out = c.ok(&args);
    assert!(out.contains("registered"), "{out}");
}

fn field(c: &Cluster, kind: &str, name: &str, path: &str) -> String {
    c.ok(&["get", kind, name, "-o", &format!("jsonpath={{{path}}}")])
}

/// Waits until `kind/name`'s `path` satisfies `done`.
fn until(c: &Cluster, kind: &str, name: &str, path: &str, done: impl Fn(&str) -> bool) -> String {
    c.eventually(
        &["get", kind, name, "-o", &format!("jsonpath={{{path}}}")],
        done,
    )
}

/// Calls `url` until `n` answers in a row are `want` (every answer must be a 200).
fn settles_on(c: &Cluster, url: &str, want: &str, n: usize) -> Duration {
    let started = Instant::now();
    let mut in_a_row = 0;
    while in_a_row < n {
        let (code, body) = c.post(url, "{}");
        assert_eq!(code, 200, "{body}");
        in_a_row = if body == want { in_a_row + 1 } else { 0 };
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never settled on {want}: last {body}"
        );
    }
    started.elapsed()
}

/// Runs `during` while a loop calls `url`: the answers that were not 200.
fn under_load(c: &Cluster, url: &str, during: impl FnOnce()) -> (Vec<(u16, String)>, usize) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let load = s.spawn(|| {
            let (mut failed, mut calls) = (Vec::new(), 0);
            while !stop.load(Ordering::SeqCst) {
                let (code, body) = c.post(url, "{}");
                calls += 1;
                if code != 200 {
                    failed.push((code, body));
                }
            }
            (failed, calls)
        });
        during();
        stop.store(true, Ordering::SeqCst);
        load.join().unwrap()
    })
}

#[test]
fn revisions_split_tag_roll_back_pin_refuse_bad_traffic_and_collect() {
    minik8s_conformance::node::bin("kubectl-fn");
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("r1", 11);
    let _functions = c.run_functions();
    let warm = ["--scale-to-zero-after", "600"];

    // v1, then v2: two revisions, all traffic on v2 once it is Ready.
    register(&c, &version(1), &warm);
    until(&c, "fn", "add", ".status.latestCreatedRevision", |r| {
        r == "add-00001"
    });
    let url = until(&c, "fn", "add", ".status.url", |u| u.starts_with("http://"));
    assert_eq!(c.post(&url, "{}"), (200, r#"{"v": 1}"#.into()));
    until(
        &c,
        "fnrev",
        "add-00001",
        ".status.conditions[?(@.type==\"Ready\")].status",
        |s| s == "True",
    );
    register(&c, &version(2), &warm);
    until(&c, "fn", "add", ".status.latestReadyRevision", |r| {
        r == "add-00002"
    });
    let traffic = until(&c, "fn", "add", ".status.traffic", |t| {
        t.contains("add-00002")
    });
    let traffic: serde_json::Value = serde_json::from_str(&traffic).unwrap();
    assert_eq!(
        traffic,
        serde_json::json!([{"revisionName": "add-00002", "latestRevision": true, "percent": 100}])
    );
    settles_on(&c, &url, r#"{"v": 2}"#, 20);
    let table = c.ok(&["get", "fnrev"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "FUNCTION",
            "GENERATION",
            "READY",
            "REPLICAS",
            "TRAFFIC",
            "AGE"
        ],
        "{table}"
    );
    let row = table.lines().find(|l| l.starts_with("add-00002")).unwrap();
    assert!(row.contains("100%") && row.contains("True"), "{table}");
    let listed = c.ok(&["fn", "revisions", "add"]);
    assert!(
        listed.contains("add-00001") && listed.contains("add-00002"),
        "{listed}"
    );
    println!("{table}");

    // A broken v3 takes no traffic: calls go on succeeding on v2 while it fails.
    let (failed, calls) = under_load(&c, &url, || {
        register(&c, "def handler(event)\n    return 3\n", &warm);
        let reason = until(
            &c,
            "fnrev",
            "add-00003",
            ".status.conditions[?(@.type==\"Ready\")].reason",
            |r| r == "ImportError",
        );
        assert_eq!(reason, "ImportError");
    });
    assert!(failed.is_empty(), "{calls} calls, failed: {failed:?}");
    let message = field(
        &c,
        "fnrev",
        "add-00003",
        ".status.conditions[?(@.type==\"Ready\")].message",
    );
    assert!(message.contains("SyntaxError"), "{message}");
    assert_eq!(
        field(&c, "fn", "add", ".status.latestCreatedRevision"),
        "add-00003"
    );
    assert_eq!(
        field(&c, "fn", "add", ".status.latestReadyRevision"),
        "add-00002"
    );
    until(
        &c,
        "fn",
        "add",
        ".status.conditions[?(@.type==\"Ready\")].reason",
        |r| r == "RevisionFailed",
    );
    until(&c, "deployment", "fn-add-00003", ".spec.replicas", |r| {
        r == "0"
    });
    assert_eq!(c.post(&url, "{}"), (200, r#"{"v": 2}"#.into()));

    // 90/10 with tags, by kubectl fn: measured over 2,000 calls.
    let out = c.ok(&[
        "fn",
        "traffic",
        "add",
        "--to",
        "add-00001=90,add-00002=10",
        "--tag",
        "add-00001=stable,add-00002=canary",
    ]);
    assert!(out.contains("add-00001=90"), "{out}");
    until(&c, "fn", "add", ".status.traffic[*].percent", |p| {
        p == "90 10"
    });
    let (mut v1, mut v2) = (0, 0);
    for _ in 0..2000 {
        let (code, body) = c.post(&url, "{}");
        assert_eq!(code, 200, "{body}");
        match body.as_str() {
            r#"{"v": 1}"# => v1 += 1,
            r#"{"v": 2}"# => v2 += 1,
            other => panic!("answered {other}"),
        }
    }
    let share = v1 as f64 / 2000.0;
    println!("90/10 split over 2,000 calls: {v1} to add-00001, {v2} to add-00002");
    assert!((share - 0.9).abs() <= 0.03, "{v1} of 2000 to add-00001");

    // Tags: by URL and by header, whatever the share.
    let tag_urls = field(&c, "fn", "add", ".status.traffic[*].url");
    assert!(
        tag_urls.contains("/function/default/add@stable"),
        "{tag_urls}"
    );
    for _ in 0..20 {
        assert_eq!(
            c.post(&format!("{url}@canary"), "{}"),
            (200, r#"{"v": 2}"#.into())
        );
    }
    let curl = std::process::Command::new("curl")
        .args(["-sS", "-X", "POST", &url, "-H", "X-Function-Tag: stable"])
        .args(["-d", "{}", "-D", "-"])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&curl.stdout);
    assert!(
        text.contains(r#"{"v": 1}"#)
            && text
                .to_lowercase()
                .contains("x-function-revision: add-00001"),
        "{text}"
    );
    assert_eq!(c.ok(&["fn", "invoke", "add@canary"]).trim(), r#"{"v": 2}"#);
    let (code, body) = c.post(&format!("{url}@nope"), "{}");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("no tag nope"), "{body}");

    // The gateway's metrics carry the revision.
    let metrics_url = url.replace("/function/default/add", "/metrics");
    let metrics = std::process::Command::new("curl")
        .args(["-sS", &metrics_url])
        .output()
        .expect("curl runs");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("minik8s_function_requests_total")
                && l.contains("revision=\"add-00001\"")),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(
            |l| l.starts_with("minik8s_function_request_duration_seconds_count")
                && l.contains("revision=\"add-00002\"")
        ),
        "{metrics}"
    );

    // A Workflow step pinned to a tag records the revision that answered.
    let wf = c.with_manifest(
        &["apply"],
        "apiVersion: serverless.minik8s.io/v1alpha1\nkind: Workflow\nmetadata: {name: pinned}\n\
         spec:\n  startAt: a\n  steps:\n  - {name: a, type: Task, function: add@canary}\n",
    );
    assert!(wf.ok, "{}", wf.stderr);
    let output = c.ok(&["fn", "wf", "start", "pinned", "--wait"]);
    assert_eq!(output.trim(), r#"{"v":2}"#);
    let revisions = c.ok(&[
        "get",
        "workflowruns",
        "-l",
        "serverless.minik8s.io/workflow=pinned",
        "-o",
        "jsonpath={.items[*].status.steps[*].revision}",
    ]);
    assert_eq!(revisions.trim(), "add-00002");

    // Rollback: a traffic change, under a load loop, with no failed request and no pod
    // restarted; instant while v1 is warm.
    let v1_pods = || {
        c.ok(&[
            "get",
            "pods",
            "-l",
            "serverless.minik8s.io/revision=add-00001",
            "--field-selector",
            "status.phase=Running",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
    };
    let before = v1_pods();
    assert!(!before.is_empty(), "v1 is warm");
    let mut took = Duration::ZERO;
    let (failed, calls) = under_load(&c, &url, || {
        std::thread::sleep(Duration::from_millis(500));
        let started = Instant::now();
        c.ok(&["fn", "traffic", "add", "--to", "add-00001=100"]);
        settles_on(&c, &url, r#"{"v": 1}"#, 50);
        took = started.elapsed();
    });
    assert!(failed.is_empty(), "{calls} calls, failed: {failed:?}");
    println!(
        "rollback to add-00001 (warm): {took:?} from the traffic change to 50 answers in a row"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Every pod v1 had still runs: none was restarted or replaced (the autoscaler may add
    // one, as all the load now goes to v1, or finish one started under the 90/10 split).
    let after = v1_pods();
    for pod in before.split_whitespace() {
        assert!(
            after.split_whitespace().any(|p| p == pod),
            "the rollback restarted {pod}: before {before:?}, after {after:?}"
        );
    }
    // And all are of the one ReplicaSet (the same pod template): nothing rolled out.
    let replica_set = |pod: &str| pod.rsplit_once('-').map(|(rs, _)| rs.to_owned());
    let sets: std::collections::BTreeSet<_> =
        after.split_whitespace().filter_map(replica_set).collect();
    assert_eq!(sets.len(), 1, "v1's pods after the rollback: {after:?}");
    // The revision that lost its traffic says so: its old share and tag do not linger.
    until(&c, "fnrev", "add-00002", ".status.traffic", str::is_empty);
    let share = field(&c, "fnrev", "add-00001", ".status.traffic");
    assert!(share.starts_with("100%"), "add-00001 takes {share}");
    let listed = c.ok(&["fn", "revisions", "add"]);
    assert!(!listed.contains("@canary"), "{listed}");

    // Bad input: each a clear error, and traffic stays as it was.
    let patch = |traffic: &str| {
        c.kubectl(&[
            "patch",
            "fn",
            "add",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"traffic":{traffic}}}}}"#),
        ])
    };
    let bad = patch(
        r#"[{"revisionName":"add-00001","percent":90},{"revisionName":"add-00002","percent":20}]"#,
    );
    assert!(
        !bad.ok
            && bad.stderr.contains("spec.traffic")
            && bad.stderr.contains("traffic percentages must sum to 100"),
        "{}",
        bad.stderr
    );
    let bad = c.kubectl(&["fn", "traffic", "add", "--to", "add-00001=50"]);
    assert!(
        !bad.ok && bad.stderr.contains("must sum to 100"),
        "{}",
        bad.stderr
    );
    let bad = patch(
        r#"[{"revisionName":"add-00001","percent":50,"tag":"a"},{"revisionName":"add-00002","percent":50,"tag":"a"}]"#,
    );
    assert!(
        !bad.ok
            && bad
                .stderr
                .contains("a tag may name only one traffic target"),
        "{}",
        bad.stderr
    );
    let bad = patch(r#"[{"revisionName":"add-00001","percent":100,"tag":"Not_A_Label"}]"#);
    assert!(
        !bad.ok && bad.stderr.contains("spec.traffic[0].tag"),
        "{}",
        bad.stderr
    );
    let bad = patch(r#"[{"percent":100}]"#);
    assert!(
        !bad.ok
            && bad
                .stderr
                .contains("names either a revisionName or latestRevision"),
        "{}",
        bad.stderr
    );
    assert_eq!(field(&c, "fn", "add", ".status.traffic[*].percent"), "100");
    // A revision that does not exist: Ready=False/RevisionMissing, calls stay on v1.
    assert!(patch(r#"[{"revisionName":"add-00042","percent":100}]"#).ok);
    until(
        &c,
        "fn",
        "add",
        ".status.conditions[?(@.type==\"Ready\")].reason",
        |r| r == "RevisionMissing",
    );
    assert_eq!(
        field(&c, "fn", "add", ".status.traffic[0].revisionName"),
        "add-00001"
    );
    assert_eq!(c.post(&url, "{}"), (200, r#"{"v": 1}"#.into()));
    let described = c.ok(&["describe", "fn", "add"]);
    assert!(described.contains("add-00042"), "{described}");

    // Revisions are the controller's: users bound to `edit` read and delete them only.
    c.ok(&[
        "create",
        "rolebinding",
        "dev-edit",
        "--clusterrole",
        "edit",
        "--user",
        "dev",
    ]);
    let can = |verb: &str| {
        c.kubectl(&["auth", "can-i", verb, "functionrevisions", "--as", "dev"])
            .stdout
            .trim()
            .to_string()
    };
    c.eventually(
        &[
            "auth",
            "can-i",
            "delete",
            "functionrevisions",
            "--as",
            "dev",
        ],
        |o| o.trim() == "yes",
    );
    assert_eq!(can("create"), "no");
    assert_eq!(can("patch"), "no");
    assert_eq!(can("list"), "yes");

    // Deleting a revision that takes traffic: it stays and serves until its traffic moves,
    // and says why, naming the Function.
    // (Ready stays False while the latest revision, v3, does not load, as Knative's.)
    c.ok(&["fn", "traffic", "add", "--to", "add-00001=100"]);
    until(
        &c,
        "fn",
        "add",
        ".status.conditions[?(@.type==\"Ready\")].reason",
        |r| r == "RevisionFailed",
    );
    c.ok(&["delete", "fnrev", "add-00001", "--wait=false"]);
    let why = c.eventually(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=add-00001,reason=DeletionBlocked",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        |m| !m.is_empty(),
    );
    assert!(why.contains("Function default/add"), "{why}");
    assert_eq!(c.post(&url, "{}"), (200, r#"{"v": 1}"#.into()));
    let described = c.ok(&["describe", "fnrev", "add-00001"]);
    assert!(described.contains("DeletionBlocked"), "{described}");
    c.ok(&["fn", "traffic", "add", "--to", "add-00002=100"]);
    c.eventually(&["get", "fnrev,deployment,configmap", "-o", "name"], |o| {
        !o.contains("add-00001")
    });
    settles_on(&c, &url, r#"{"v": 2}"#, 10);

    // Garbage collection: beyond the limit, the oldest revisions taking no traffic go with
    // their Deployments and code; the one taking traffic and the latest stay.
    assert!(
        c.kubectl(&[
            "patch",
            "fn",
            "add",
            "--type=merge",
            "-p",
            r#"{"spec":{"revisionHistoryLimit":1}}"#
        ])
        .ok
    );
    for n in 4..=6 {
        register(&c, &version(n), &["--scale-to-zero-after", "5"]);
        let want = format!("add-{n:05}");
        until(&c, "fn", "add", ".status.latestReadyRevision", |r| {
            r == want
        });
    }
    let left = c.eventually(
        &[
            "get",
            "fnrev",
            "-l",
            "serverless.minik8s.io/function=add",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        |o| o == "add-00002 add-00005 add-00006",
    );
    assert_eq!(left, "add-00002 add-00005 add-00006");
    c.eventually(&["get", "deployment,configmap", "-o", "name"], |o| {
        !o.contains("add-00003") && !o.contains("add-00004")
    });
    let events = c.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=add,reason=RevisionDeleted",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(events.contains("revisionHistoryLimit"), "{events}");
    assert_eq!(c.post(&url, "{}"), (200, r#"{"v": 2}"#.into()));

    // Deleting the Function leaves nothing behind.
    assert!(c.ok(&["fn", "delete", "add"]).contains("deleted"));
    c.eventually(
        &[
            "get",
            "functionrevisions,deployments,services,configmaps,pods",
            "-l",
            "serverless.minik8s.io/function=add",
            "-o",
            "name",
        ],
        |o| o.trim().is_empty(),
    );
    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

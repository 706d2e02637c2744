//! The HorizontalPodAutoscaler on a real node: busybox pods that burn CPU (request 100m,
//! limit 200m) scale a Deployment 1 → 4 within a minute of the load starting and back to 1
//! when it stops, across a restart of the HPA controller in the middle of the scale-down
//! window; `kubectl top` shows the limit the loop spins at; status, conditions, events,
//! `kubectl get hpa` and `kubectl describe hpa` read as upstream's; `kubectl autoscale`, a
//! memory target, a custom resource's `scale`, a missing target and a custom metric.

use minik8s_conformance::Cluster;
use serde_json::Value;
use std::time::{Duration, Instant};

const HPA: &str = "horizontalpodautoscaling";

fn json(c: &Cluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&c.ok(&all)).expect("kubectl -o json")
}

fn replicas(c: &Cluster, deployment: &str) -> i64 {
    json(c, &["get", "deployment", deployment])["spec"]["replicas"]
        .as_i64()
        .unwrap_or(-1)
}

fn condition(hpa: &Value, kind: &str) -> (String, String, String) {
    let c = hpa["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or_default();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("status"), s("reason"), s("message"))
}

/// Waits (up to `limit`) until the HPA's condition `kind` has `status` and `reason` (and the
/// HPA satisfies `also`).
fn wait_condition_and(
    c: &Cluster,
    hpa: &str,
    (kind, status, reason): (&str, &str, &str),
    limit: u64,
    also: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(limit);
    loop {
        let h = json(c, &["get", "hpa", hpa]);
        let (s, r, _) = condition(&h, kind);
        if s == status && r == reason && also(&h) {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "hpa {hpa}: {kind} never became {status}/{reason}: {}",
            h["status"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits (up to `limit`) until the HPA's condition `kind` has `status` and `reason`.
fn wait_condition(
    c: &Cluster,
    hpa: &str,
    kind: &str,
    status: &str,
    reason: &str,
    limit: u64,
) -> Value {
    wait_condition_and(c, hpa, (kind, status, reason), limit, |_| true)
}

fn burner(name: &str, load: &str, extra: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: burn
        image: busybox
        command: [sh, -c, 'while true; do if [ -e /load/stop ]; then sleep 1; fi; done']
        resources: {{requests: {{cpu: 100m}}, limits: {{cpu: 200m}}}}
        volumeMounts: [{{name: load, mountPath: /load}}]
      volumes: [{{name: load, hostPath: {{path: {load}}}}}]
{extra}"
    )
}

const BURN_HPA: &str = "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: burn}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: burn}
  minReplicas: 1
  maxReplicas: 4
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 45}
";

const MEMORY: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: mem}
spec:
  replicas: 1
  selector: {matchLabels: {app: mem}}
  template:
    metadata: {labels: {app: mem}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: hold
        image: busybox
        command: [sh, -c, 'dd if=/dev/zero of=/fill/f bs=1M count=48 2>/dev/null; sleep 3600']
        resources: {requests: {memory: 64Mi, cpu: 10m}, limits: {memory: 128Mi}}
        volumeMounts: [{name: fill, mountPath: /fill}]
      volumes: [{name: fill, emptyDir: {medium: Memory}}]
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: mem}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: mem}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: memory, target: {type: Utilization, averageUtilization: 50}}
";

const ODD: &str = "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: missing}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: nope}
  maxReplicas: 3
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: custom}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: idle}
  maxReplicas: 3
  metrics:
  - type: Pods
    pods:
      metric: {name: requests_per_second}
      target: {type: AverageValue, averageValue: '10'}
";

const SCALABLE: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: scalables.hpa.minik8s.test}
spec:
  group: hpa.minik8s.test
  names: {kind: Scalable, plural: scalables, singular: scalable}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
";

#[test]
fn hpa_scales_on_real_metrics_keeps_its_decision_across_a_restart_and_reads_as_upstream() {
    let c = Cluster::start();
    // Every controller but the HPA's, which runs on its own token so it can be restarted.
    c.run_controllers_except(&[HPA], 0);
    let mut hpa_stop = c.shutdown_token().child_token();
    c.run_named_controllers(&[HPA], hpa_stop.clone());
    let node = c.run_node("h1", 8);

    // The load switch: a host folder every burner mounts; the loops idle once `stop` exists.
    let load = c.dir().join("load");
    std::fs::create_dir_all(&load).unwrap();
    let load_path = load.display().to_string();

    // Everything at once: the burners and their HPA, an idle Deployment for `kubectl
    // autoscale`, the memory HPA, a missing target, a custom metric and a custom resource.
    let r = c.with_manifest(&["apply"], &burner("burn", &load_path, ""));
    assert!(r.ok, "{}", r.stderr);
    let r = c.with_manifest(&["apply"], BURN_HPA);
    assert!(r.ok, "{}", r.stderr);
    c.ok(&[
        "create",
        "deployment",
        "idle",
        "--image=busybox",
        "--",
        "sleep",
        "3600",
    ]);
    c.ok(&[
        "set",
        "resources",
        "deployment",
        "idle",
        "--requests=cpu=100m",
    ]);
    let out = c.ok(&[
        "autoscale",
        "deployment",
        "idle",
        "--cpu-percent=50",
        "--min=1",
        "--max=4",
    ]);
    assert!(out.contains("autoscaled"), "{out}");
    for manifest in [MEMORY, ODD, SCALABLE] {
        let r = c.with_manifest(&["apply"], manifest);
        assert!(r.ok, "{}", r.stderr);
    }

    // A target that does not exist: AbleToScale=False, FailedGetScale.
    let h = wait_condition(&c, "missing", "AbleToScale", "False", "FailedGetScale", 30);
    let (_, _, message) = condition(&h, "AbleToScale");
    assert_eq!(
        message,
        "the HPA controller was unable to get the target's current scale: deployments.apps \"nope\" not found"
    );
    // A Pods metric, with no custom metrics API: ScalingActive=False, FailedGetPodsMetric.
    let h = wait_condition(
        &c,
        "custom",
        "ScalingActive",
        "False",
        "FailedGetPodsMetric",
        60,
    );
    let (_, _, message) = condition(&h, "ScalingActive");
    assert!(
        message.starts_with("the HPA was unable to compute the replica count: unable to get metric requests_per_second"),
        "{message}"
    );

    // A custom resource with a scale subresource is a target like any other: below min, it
    // is raised to min.
    c.eventually(&["get", "crd", "scalables.hpa.minik8s.test"], |_| true);
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: hpa.minik8s.test/v1\nkind: Scalable\nmetadata: {name: s}\nspec: {replicas: 1}\n",
    );
    assert!(r.ok, "{}", r.stderr);
    c.ok(&[
        "patch",
        "scalable",
        "s",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":1,"selector":"app=idle"}}"#,
    ]);
    let r = c.with_manifest(
        &["apply"],
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: s}\nspec:\n  scaleTargetRef: {apiVersion: hpa.minik8s.test/v1, kind: Scalable, name: s}\n  minReplicas: 2\n  maxReplicas: 3\n",
    );
    assert!(r.ok, "{}", r.stderr);
    c.eventually(
        &["get", "scalable", "s", "-o", "jsonpath={.spec.replicas}"],
        |r| r == "2",
    );
    let events = c.eventually(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=s,reason=SuccessfulRescale",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        |m| !m.is_empty(),
    );
    assert_eq!(
        events,
        "New size: 2; reason: Current number of replicas below Spec.MinReplicas"
    );

    // The load starts when the first burner runs; within 60 s the Deployment asks for 4.
    c.eventually(
        &[
            "get",
            "pods",
            "-l",
            "app=burn",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ],
        |p| p == "Running",
    );
    let started = Instant::now();
    let mut most = 0;
    loop {
        let n = replicas(&c, "burn");
        most = most.max(n);
        if n == 4 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not scaled up within 60 s (replicas {n}): {}",
            json(&c, &["get", "hpa", "burn"])["status"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("scaled 1 → 4 in {:?}", started.elapsed());
    let events = c.eventually(
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=burn,reason=SuccessfulRescale",
            "-o",
            "jsonpath={.items[*].message}",
        ],
        |m| !m.is_empty(),
    );
    assert_eq!(
        events,
        "New size: 4; reason: cpu resource utilization (percentage of request) above target"
    );

    // kubectl top: a loop limited to 200m spins at about 200m.
    let top = c.eventually_within(
        Duration::from_secs(90),
        &["top", "pods", "-l", "app=burn", "--no-headers"],
        |s| {
            s.lines().count() == 4
                && s.lines().all(|l| {
                    let cpu = l.split_whitespace().nth(1).unwrap_or_default();
                    cpu.trim_end_matches('m')
                        .parse::<u32>()
                        .is_ok_and(|m| (170..=215).contains(&m))
                })
        },
    );
    eprintln!("{top}");
    // The metrics say when and over what they were measured: a 15 s window (the first of a
    // new pod may be shorter), ending within the last resolution or two.
    let metrics: Value = serde_json::from_str(&c.ok(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=app%3Dburn",
    ]))
    .unwrap();
    for m in metrics["items"].as_array().unwrap() {
        let window = m["window"].as_str().unwrap();
        let secs: f64 = window.trim_end_matches('s').parse().unwrap_or(0.0);
        assert!((1.0..=16.0).contains(&secs), "window {window}");
        let at: jiff::Timestamp = m["timestamp"].as_str().unwrap().parse().unwrap();
        let age = jiff::Timestamp::now().duration_since(at).as_secs_f64();
        assert!(
            (-1.0..=32.0).contains(&age),
            "timestamp {at} is {age} s old"
        );
    }

    // Status as upstream: replicas, the metric, the conditions; never more than max.
    // (Once every pod counts: right after the scale-up the new pods are still starting.)
    let h = wait_condition_and(
        &c,
        "burn",
        ("ScalingLimited", "True", "TooManyReplicas"),
        90,
        |h| h["status"]["currentReplicas"] == 4,
    );
    assert_eq!(h["status"]["currentReplicas"], 4);
    assert_eq!(h["status"]["desiredReplicas"], 4);
    assert!(h["status"]["lastScaleTime"].is_string());
    let current = &h["status"]["currentMetrics"][0];
    assert_eq!(current["type"], "Resource");
    assert_eq!(current["resource"]["name"], "cpu");
    let utilization = current["resource"]["current"]["averageUtilization"]
        .as_i64()
        .unwrap();
    assert!(utilization > 50, "{current}");
    assert_eq!(
        condition(&h, "ScalingActive"),
        (
            "True".into(),
            "ValidMetricFound".into(),
            "the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)".into()
        )
    );
    assert_eq!(condition(&h, "AbleToScale").0, "True");
    assert_eq!(
        condition(&h, "ScalingLimited").2,
        "the desired replica count is more than the maximum replica count"
    );
    let row = c.ok(&["get", "hpa", "burn", "--no-headers"]);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "Deployment/burn", "{row}");
    assert!(
        cols[2] == "cpu:" && cols[3].ends_with("%/50%") && cols[3] != "<unknown>/50%",
        "TARGETS: {row}"
    );
    assert_eq!(&cols[4..7], ["1", "4", "4"], "{row}");
    let described = c.ok(&["describe", "hpa", "burn"]);
    for want in [
        "Reference:",
        "Deployment/burn",
        "resource cpu on pods  (as a percentage of request):",
        "Min replicas:",
        "Max replicas:",
        "AbleToScale",
        "ScalingActive   True    ValidMetricFound",
        "ScalingLimited  True    TooManyReplicas",
        "SuccessfulRescale",
        "New size: 4; reason: cpu resource utilization (percentage of request) above target",
    ] {
        assert!(
            described.contains(want),
            "describe lacks {want:?}:\n{described}"
        );
    }

    // kubectl autoscale made a working HPA: the idle pod's CPU against 50 %.
    let row = c.eventually_within(
        Duration::from_secs(90),
        &["get", "hpa", "idle", "--no-headers"],
        |r| r.contains("cpu: 0%/50%"),
    );
    assert!(row.contains("Deployment/idle"), "{row}");
    assert_eq!(replicas(&c, "idle"), 1);
    // The memory HPA scaled on memory (each pod holds ~48Mi of its 64Mi request).
    let deadline = Instant::now() + Duration::from_secs(90);
    while replicas(&c, "mem") < 2 {
        assert!(
            Instant::now() < deadline,
            "memory HPA: {}",
            json(&c, &["get", "hpa", "mem"])["status"]
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let h = json(&c, &["get", "hpa", "mem"]);
    assert_eq!(
        h["status"]["currentMetrics"][0]["resource"]["name"],
        "memory"
    );
    assert!(
        h["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
            .as_i64()
            .is_some_and(|u| u > 50),
        "{}",
        h["status"]
    );
    let row = c.ok(&["get", "hpa", "mem", "--no-headers"]);
    assert!(row.contains("memory: ") && row.contains("%/50%"), "{row}");

    // The load stops. The first low recommendation puts the pending decision into the HPA's
    // history annotation: high recommendations until t4, then 1. "High" is 4 or more: the
    // recommendations are the raw ones, before maxReplicas (16 while four pods burn at 200 %),
    // and the way down may pass through any value or none (a 4 only when one sample's window
    // half covers the load).
    std::fs::write(load.join("stop"), "").unwrap();
    let annotation = "autoscaling.minik8s.io/history";
    let deadline = Instant::now() + Duration::from_secs(90);
    let t4 = loop {
        let h = json(&c, &["get", "hpa", "burn"]);
        let text = h["metadata"]["annotations"][annotation]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            let recs = v["r"].as_array().cloned().unwrap_or_default();
            let value = |r: &Value| r[0].as_i64().unwrap_or_default();
            let high = recs
                .iter()
                .filter(|r| value(r) >= 4)
                .filter_map(|r| r[1].as_i64())
                .max();
            if let Some(t4) = high
                && recs.iter().any(|r| value(r) < 4)
            {
                break t4;
            }
        }
        if Instant::now() >= deadline {
            // Everything the decision was made from, to tell a stale metric from a stuck loop.
            let metrics = c.kubectl(&[
                "get",
                "--raw",
                "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods",
            ]);
            let stopped = c.kubectl(&["exec", "deploy/burn", "--", "ls", "/load"]);
            panic!(
                "no low recommendation at {}: metadata {}\nstatus {}\npod metrics {}\n/load: {} {}",
                jiff::Timestamp::now(),
                h["metadata"],
                h["status"],
                metrics.stdout,
                stopped.stdout,
                stopped.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let now = || jiff::Timestamp::now().as_second();
    // Restart the HPA controller 30 s after the last high recommendation (15 s before the
    // 45 s window lets the scale-down happen). A controller that forgot the history would
    // start a new window and wait until 75 s; one that remembers scales down at 45-60 s.
    while now() < t4 + 30 {
        assert_eq!(
            replicas(&c, "burn"),
            4,
            "scaled down before the window ended"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    hpa_stop.cancel();
    std::thread::sleep(Duration::from_secs(1));
    hpa_stop = c.shutdown_token().child_token();
    c.run_named_controllers(&[HPA], hpa_stop.clone());
    eprintln!("HPA controller restarted {} s after t4", now() - t4);
    let down_at = loop {
        let n = replicas(&c, "burn");
        assert!(n <= 4, "flapped up to {n}");
        if n == 1 {
            break now();
        }
        assert!(
            now() < t4 + 70,
            "not scaled down 70 s after the last high recommendation: {}",
            json(&c, &["get", "hpa", "burn"])["status"]
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let waited = down_at - t4;
    eprintln!("scaled 4 → 1 {waited} s after the last high recommendation");
    assert!(
        (44..=66).contains(&waited),
        "scale-down {waited} s after the last high recommendation (window 45 s)"
    );
    // And it stays down: no flapping after the restart.
    for _ in 0..20 {
        assert_eq!(replicas(&c, "burn"), 1, "flapped after scaling down");
        std::thread::sleep(Duration::from_millis(500));
    }
    let h = json(&c, &["get", "hpa", "burn"]);
    let last_scale: jiff::Timestamp = h["status"]["lastScaleTime"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(last_scale.as_second() >= t4 + 44, "{}", h["status"]);
    let events = c.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=burn,reason=SuccessfulRescale",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        events.contains("New size: 1; reason: All metrics below target"),
        "{events}"
    );
    // Rescales with different messages stay separate events, as upstream's recorder keeps
    // them: describe shows the way up and the way down.
    let described = c.ok(&["describe", "hpa", "burn"]);
    for want in [
        "New size: 4; reason: cpu resource utilization (percentage of request) above target",
        "New size: 1; reason: All metrics below target",
    ] {
        assert!(
            described.contains(want),
            "describe lacks {want:?}:\n{described}"
        );
    }
    // With nothing pending any more, the history annotation goes away.
    c.eventually(
        &[
            "get",
            "hpa",
            "burn",
            "-o",
            "jsonpath={.metadata.annotations.autoscaling\\.minik8s\\.io/history}",
        ],
        |a| a.is_empty(),
    );

    hpa_stop.cancel();
    let left = node.down();
    assert!(left.is_empty(), "left behind: {left:?}");
}

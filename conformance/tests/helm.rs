//! A Helm 3 chart's whole life cycle (Helm built from Go modules by `hack/upstream.sh`) against
//! a cluster with a real node: install with a CRD and a pre-install hook, `helm test`, upgrade,
//! rollback, uninstall, and `helm template | kubectl apply` giving the same objects.

use minik8s_conformance::{Cluster, Run, upstream_bin};
use std::path::PathBuf;

/// The chart the project keeps for Helm's life cycle.
fn chart() -> PathBuf {
    minik8s_conformance::node::repo_root().join("conformance/helm/demo")
}

fn helm(c: &Cluster, args: &[&str]) -> Run {
    c.client_program(&upstream_bin("helm"), args, None, &[])
}

fn helm_ok(c: &Cluster, args: &[&str]) -> String {
    let r = helm(c, args);
    assert!(r.ok, "helm {args:?} failed:\n{}\n{}", r.stdout, r.stderr);
    r.stdout
}

fn jsonpath(c: &Cluster, ns: &str, what: &[&str], path: &str) -> String {
    let mut args = vec!["-n", ns, "get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend(["-o", &p]);
    c.ok(&args)
}

/// The release's objects (kind/name, sorted) and its Deployment's pod template.
fn release_objects(c: &Cluster, ns: &str, release: &str) -> (String, String) {
    let selector = format!("app.kubernetes.io/instance={release}");
    let mut names: Vec<String> = c
        .ok(&[
            "-n",
            ns,
            "get",
            "deployments,services,configmaps,widgets",
            "-l",
            &selector,
            "-o",
            "name",
        ])
        .lines()
        .map(str::to_owned)
        .collect();
    names.sort();
    let template = jsonpath(
        c,
        ns,
        &["deployment", &format!("{release}-demo")],
        "{.spec.template}",
    );
    (names.join(" "), template)
}

#[test]
fn a_helm_chart_installs_tests_upgrades_rolls_back_and_uninstalls() {
    let c = Cluster::start();
    c.run_controllers(0);
    let node = c.run_node("helm", 43);
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let ns = "charts";

    // install: the CRD from crds/ first, the pre-install hook Job to completion, then the rest.
    let out = helm_ok(
        &c,
        &[
            "install",
            "demo1",
            chart,
            "-n",
            ns,
            "--create-namespace",
            "--wait",
            "--timeout",
            "180s",
        ],
    );
    assert!(
        out.contains("STATUS: deployed") && out.contains("REVISION: 1"),
        "{out}"
    );
    assert!(
        c.ok(&["get", "crd", "widgets.demo.minik8s.io", "-o", "name"])
            .contains("widgets"),
        "the chart's CRD is installed"
    );
    assert_eq!(
        jsonpath(
            &c,
            ns,
            &["job", "demo1-demo-pre-install"],
            "{.status.succeeded}"
        ),
        "1",
        "the pre-install hook ran to completion"
    );
    let hook_pod = jsonpath(
        &c,
        ns,
        &["pods", "-l", "job-name=demo1-demo-pre-install"],
        "{.items[0].metadata.name}",
    );
    assert_eq!(
        c.ok(&["-n", ns, "logs", &hook_pod]).trim(),
        "pre-install of demo1"
    );
    assert_eq!(
        jsonpath(&c, ns, &["widget", "demo1-demo"], "{.spec.size}"),
        "1"
    );
    assert_eq!(
        jsonpath(
            &c,
            ns,
            &["deployment", "demo1-demo"],
            "{.status.readyReplicas}"
        ),
        "1"
    );
    let list = helm_ok(&c, &["list", "-n", ns]);
    assert!(
        list.contains("demo1") && list.contains("deployed"),
        "{list}"
    );

    // helm test: a pod that reaches the Service by name and checks the page.
    let out = helm_ok(&c, &["test", "demo1", "-n", ns, "--timeout", "120s"]);
    assert!(out.contains("Phase:          Succeeded"), "{out}");

    // upgrade: a new message rolls the pods; the test checks the new page.
    let out = helm_ok(
        &c,
        &[
            "upgrade",
            "demo1",
            chart,
            "-n",
            ns,
            "--set",
            "message=second release",
            "--wait",
            "--timeout",
            "180s",
        ],
    );
    assert!(out.contains("REVISION: 2"), "{out}");
    assert_eq!(
        jsonpath(&c, ns, &["configmap", "demo1-demo"], "{.data.index\\.html}"),
        "second release"
    );
    let out = helm_ok(&c, &["test", "demo1", "-n", ns, "--timeout", "120s"]);
    assert!(out.contains("Phase:          Succeeded"), "{out}");

    // rollback to revision 1: the first message again, as revision 3.
    let out = helm_ok(
        &c,
        &[
            "rollback",
            "demo1",
            "1",
            "-n",
            ns,
            "--wait",
            "--timeout",
            "180s",
        ],
    );
    assert!(out.contains("Rollback was a success"), "{out}");
    assert_eq!(
        jsonpath(&c, ns, &["configmap", "demo1-demo"], "{.data.index\\.html}"),
        "hello from helm"
    );
    let history = helm_ok(&c, &["history", "demo1", "-n", ns]);
    assert_eq!(
        history
            .lines()
            .filter(|l| l.trim_start().starts_with(|ch: char| ch.is_ascii_digit()))
            .count(),
        3,
        "{history}"
    );
    let out = helm_ok(&c, &["test", "demo1", "-n", ns, "--timeout", "120s"]);
    assert!(out.contains("Phase:          Succeeded"), "{out}");

    // helm template | kubectl apply gives the same objects as helm install.
    let installed = release_objects(&c, ns, "demo1");
    let rendered = helm_ok(&c, &["template", "demo1", chart, "-n", "rendered"]);
    c.ok(&["create", "namespace", "rendered"]);
    let r = c.kubectl_stdin(&["-n", "rendered", "apply", "-f", "-"], Some(&rendered));
    assert!(r.ok, "{r:?}");
    assert_eq!(release_objects(&c, "rendered", "demo1"), installed);

    // uninstall: the release's objects go; the CRD stays, as Helm leaves crds/ alone.
    let out = helm_ok(
        &c,
        &[
            "uninstall",
            "demo1",
            "-n",
            ns,
            "--wait",
            "--timeout",
            "120s",
        ],
    );
    assert!(out.contains("release \"demo1\" uninstalled"), "{out}");
    c.eventually(
        &[
            "-n",
            ns,
            "get",
            "deployments,services,configmaps,widgets",
            "-l",
            "app.kubernetes.io/instance=demo1",
            "-o",
            "name",
        ],
        |s| s.trim().is_empty(),
    );
    assert!(helm_ok(&c, &["list", "-n", ns]).lines().count() == 1);
    c.ok(&["get", "crd", "widgets.demo.minik8s.io"]);

    let left = node.down();
    assert!(left.is_empty(), "the node left {left:?}");
}

//! The serverless binaries' command lines: `kubectl-fn` (the kubectl plugin), `crdgen` and
//! `function-gateway`.

use std::process::Command;

#[test]
fn kubectl_fn_names_its_verbs_and_fails_clearly_without_a_cluster() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-fn"))
        .arg("--help")
        .output()
        .expect("kubectl-fn runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for verb in [
        "register",
        "invoke",
        "list",
        "logs",
        "delete",
        "--namespace",
    ] {
        assert!(help.contains(verb), "{verb} missing from:\n{help}");
    }
    // No kubeconfig: an error and a non-zero exit, no panic.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-fn"))
        .arg("list")
        .env("KUBECONFIG", dir.path().join("missing"))
        .env("HOME", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("kubectl-fn runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error:"));
}

#[test]
fn crdgen_prints_the_function_crd_and_the_gateway_names_its_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_crdgen"))
        .output()
        .expect("crdgen runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("name: functions.serverless.minik8s.io"),
        "{text}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_function-gateway"))
        .arg("--help")
        .output()
        .expect("function-gateway runs");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--kubeconfig", "--listen", "--public-host"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

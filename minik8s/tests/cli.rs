//! The `minik8s` command line refuses bad input with a clear message before it touches
//! anything (and building this test makes cargo build the binary the conformance suite runs).

use std::process::Command;

fn minik8s(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_minik8s"))
        .args(args)
        .env("RUST_LOG", "off")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("minik8s runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn join_refuses_malformed_tokens_and_pins() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let (ok, err) = minik8s(&[
        "join",
        "127.0.0.1:1",
        "--token",
        "not-a-token",
        "--discovery-token-ca-cert-hash",
        "sha256:00",
        "--data-dir",
        data,
    ]);
    assert!(!ok && err.contains("is not a bootstrap token"), "{err}");
    let (ok, err) = minik8s(&[
        "join",
        "127.0.0.1:1",
        "--token",
        "abcdef.0123456789abcdef",
        "--discovery-token-ca-cert-hash",
        "sha256:00",
        "--data-dir",
        data,
    ]);
    assert!(
        !ok && err.contains("invalid --discovery-token-ca-cert-hash \"sha256:00\""),
        "{err}"
    );
    // Nothing was written for a join that never started.
    assert!(!dir.path().join("kubelet.kubeconfig").exists());
}

#[test]
fn token_commands_say_where_the_cluster_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, err) = minik8s(&["token", "list", "--data-dir", dir.path().to_str().unwrap()]);
    assert!(!ok && err.contains("admin.kubeconfig"), "{err}");
    let (ok, err) = minik8s(&["token", "create", "BAD", "--data-dir", "/nonexistent"]);
    assert!(!ok && !err.is_empty(), "{err}");
}

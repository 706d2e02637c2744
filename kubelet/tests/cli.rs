//! The `kubelet` binary's command line.

#[test]
fn the_kubelet_binary_names_its_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubelet"))
        .arg("--help")
        .output()
        .expect("the kubelet binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--kubeconfig",
        "--node-name",
        "--pod-cidr",
        "--pod-manifest-path",
        "--registry-mirror",
        "--client-ca",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    // Without an identity it refuses to start, with a clear message and no panic.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubelet"))
        .args(["--node-name", "x"])
        .env_remove("KUBECONFIG")
        .output()
        .expect("the kubelet binary runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kubeconfig"));
}

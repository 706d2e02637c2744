//! The `kube-proxy` binary's command line.

#[test]
fn the_proxy_binary_requires_an_identity_unless_cleaning_up() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kube-proxy"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("the kube-proxy binary runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--kubeconfig"));
}

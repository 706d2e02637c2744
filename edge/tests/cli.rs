//! The `edgelet` and `edgectl` binaries' command lines.

#[test]
fn the_edgelet_says_its_version_and_names_its_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgelet"))
        .arg("--version")
        .output()
        .expect("the edgelet binary runs");
    assert!(out.status.success());
    // `edgectl upgrade` checks a new binary by this line.
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with("edgelet v"), "{said}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgelet"))
        .arg("--help")
        .output()
        .expect("the edgelet binary runs");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--data-dir",
        "--node-name",
        "--pod-cidr",
        "--memory-pressure-threshold",
        "--disk-pressure-threshold",
        "--disk-path",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn edgectl_without_an_edgelet_says_where_it_looked() {
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgectl"))
        .args(["--edgelet-address", "127.0.0.1:1", "status"])
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .output()
        .expect("edgectl runs");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the edgelet at 127.0.0.1:1"),
        "{err}"
    );
    // The address is remembered for the next command.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_edgectl"))
        .arg("version")
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .output()
        .expect("edgectl runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("edgectl: v"), "{text}");
    assert!(text.contains("127.0.0.1:1"), "{text}");
}

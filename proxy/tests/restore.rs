//! The golden rule sets load into a real iptables (in a private network namespace, so the
//! machine's own tables are untouched).

fn netns(name: &str) -> impl Drop {
    struct Ns(String);
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }
    let ok = std::process::Command::new("ip")
        .args(["netns", "add", name])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "creating network namespace {name} (the suite runs as root)"
    );
    Ns(name.to_owned())
}

fn golden(file: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    std::fs::read_to_string(path).unwrap()
}

fn restore(ns: &str, rules: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "iptables-restore", "--noflush", "-w"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("iptables-restore runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn rendered_rules_load_into_a_real_iptables_in_one_transaction() {
    let ns = format!("mk8s-proxy-{}", std::process::id());
    let _guard = netns(&ns);
    let nat = || {
        let saved = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "iptables-save", "-t", "nat"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&saved.stdout).into_owned()
    };
    let services = golden("services.txt");
    let out = restore(&ns, &services);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = nat();
    assert!(text.contains("-A KUBE-SERVICES -d 10.96.0.10/32"), "{text}");
    // The next sync has no services left: every per-service chain is gone with them.
    let out = restore(&ns, &golden("stale.txt"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cluster = minik8s_proxy::model::Cluster {
        pod_cidr: "10.244.0.0/16".into(),
    };
    let stale = minik8s_proxy::model::service_chains(&services);
    let out = restore(&ns, &minik8s_proxy::model::render(&cluster, &[], &stale));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = nat();
    assert!(
        !text.contains("KUBE-SVC-") && !text.contains("KUBE-SEP-"),
        "{text}"
    );
}

//! `fault-drill`: runs the fault drills (control plane crash under load, kubelet crash, node
//! failure) on a fresh multi-node cluster of this machine (`minik8s init` plus two machines as
//! network namespaces) and prints what each did and how long recovery took. Needs root and the
//! workspace's binaries (`cargo build --bins`).

fn main() {
    let only: Vec<String> = std::env::args().skip(1).collect();
    let wants = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    let mut d = minik8s_bench::drills::Drills::start();
    let mut reports = Vec::new();
    if wants("control-plane") {
        reports.push(d.control_plane_crash());
    }
    if wants("kubelet") {
        reports.push(d.kubelet_crash());
    }
    if wants("node") {
        reports.push(d.node_failure());
    }
    println!(
        "fault drills (node monitor grace {}, pod tolerations {} s)",
        minik8s_bench::drills::GRACE,
        minik8s_bench::drills::TOLERATION_SECONDS
    );
    for r in reports {
        print!("{r}");
    }
}

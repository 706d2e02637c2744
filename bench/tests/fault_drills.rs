//! The fault drills (`conformance/src/drills.rs`, also the `fault-drill` command) on a fresh
//! multi-node cluster with short timings: a control plane crash under load, a kubelet crash,
//! and a node failure, each asserting what must survive; the report prints the recovery
//! times the README lists.

#[test]
fn the_cluster_survives_control_plane_kubelet_and_node_failures() {
    let mut d = minik8s_bench::drills::Drills::start();
    let reports = [d.control_plane_crash(), d.kubelet_crash(), d.node_failure()];
    for r in &reports {
        println!("{r}");
    }
}

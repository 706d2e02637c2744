//! The rendered rule set, compared with checked-in golden files (`UPDATE_GOLDEN=1` rewrites
//! them after an intended change).

use minik8s_proxy::model::{Cluster, Endpoint, Protocol, ServicePort, render, service_chains};

fn port(service: &str, ip: &str, port: u16, endpoints: &[(&str, u16, bool)]) -> ServicePort {
    ServicePort {
        service: service.into(),
        port_name: String::new(),
        cluster_ip: Some(ip.into()),
        port,
        protocol: Protocol::Tcp,
        node_port: None,
        affinity_seconds: None,
        external_local: false,
        internal_local: false,
        endpoints: endpoints
            .iter()
            .map(|(ip, port, local)| Endpoint {
                ip: (*ip).into(),
                port: *port,
                local: *local,
            })
            .collect(),
    }
}

fn check(name: &str, text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        text,
        want,
        "{} differs (UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

#[test]
fn cluster_ips_node_ports_affinity_local_policy_and_empty_services_render_as_upstream() {
    let cluster = Cluster {
        pod_cidr: "10.244.0.0/16".into(),
    };
    let web = port(
        "default/web",
        "10.96.0.10",
        80,
        &[
            ("10.244.0.2", 8080, true),
            ("10.244.0.3", 8080, true),
            ("10.244.1.2", 8080, false),
        ],
    );
    let mut sticky = port(
        "default/sticky",
        "10.96.0.11",
        80,
        &[("10.244.0.4", 8080, true)],
    );
    sticky.node_port = Some(30080);
    sticky.affinity_seconds = Some(10800);
    let mut local = port(
        "apps/local",
        "10.96.0.12",
        53,
        &[("10.244.1.5", 5353, false)],
    );
    local.protocol = Protocol::Udp;
    local.port_name = "dns".into();
    local.node_port = Some(30053);
    local.external_local = true;
    let mut empty = port("default/empty", "10.96.0.13", 80, &[]);
    empty.node_port = Some(30081);
    let mut headless = port("default/headless", "None", 80, &[("10.244.0.9", 80, true)]);
    headless.cluster_ip = None;
    check(
        "services.txt",
        &render(&cluster, &[web, sticky, local, empty, headless], &[]),
    );
}

#[test]
fn chains_of_services_that_are_gone_are_flushed_and_deleted_in_the_same_transaction() {
    let cluster = Cluster {
        pod_cidr: "10.244.0.0/16".into(),
    };
    let before = render(
        &cluster,
        &[port(
            "default/old",
            "10.96.0.20",
            80,
            &[("10.244.0.7", 80, true)],
        )],
        &[],
    );
    let stale = service_chains(&before);
    assert_eq!(
        stale.len(),
        2,
        "one service chain and one endpoint chain: {stale:?}"
    );
    check("stale.txt", &render(&cluster, &[], &stale));
}

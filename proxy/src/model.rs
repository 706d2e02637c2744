//! The proxy's pure model: Services and their endpoints as plain data, and the one function
//! that renders the whole rule set as `iptables-restore` input. No I/O here, so the rules are
//! tested as text (golden files).

use std::fmt::Write;

/// The transport of a service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// From the API's string (default TCP).
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            _ => Protocol::Tcp,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// One backend of a service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// Pod IP.
    pub ip: String,
    /// Target port.
    pub port: u16,
    /// Whether it runs on this node (for `externalTrafficPolicy: Local`).
    pub local: bool,
}

/// One port of one Service, with its ready endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// `namespace/name`.
    pub service: String,
    /// The port's name (may be empty).
    pub port_name: String,
    /// The ClusterIP (`None` for headless services, which get no rules).
    pub cluster_ip: Option<String>,
    /// The service port.
    pub port: u16,
    /// Transport.
    pub protocol: Protocol,
    /// The NodePort, if any.
    pub node_port: Option<u16>,
    /// ClientIP session affinity timeout in seconds, if set.
    pub affinity_seconds: Option<u32>,
    /// `externalTrafficPolicy: Local`.
    pub external_local: bool,
    /// `internalTrafficPolicy: Local`: ClusterIP traffic goes to this node's endpoints only.
    pub internal_local: bool,
    /// Ready endpoints.
    pub endpoints: Vec<Endpoint>,
}

/// What the rules need to know about the cluster.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The pod range (traffic from outside it to a ClusterIP is masqueraded).
    pub pod_cidr: String,
}

/// `ns/name:port` as upstream names a service port.
fn port_id(sp: &ServicePort) -> String {
    if sp.port_name.is_empty() {
        sp.service.clone()
    } else {
        format!("{}:{}", sp.service, sp.port_name)
    }
}

/// Upstream's chain-name hash: base32 of SHA-256, first 16 characters.
fn hash(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in digest.as_ref() {
        buffer = (buffer << 8) | u32::from(*byte);
        bits += 8;
        while bits >= 5 && out.len() < 16 {
            out.push(ALPHABET[((buffer >> (bits - 5)) & 31) as usize] as char);
            bits -= 5;
        }
    }
    out
}

/// The service port's chain.
pub fn svc_chain(sp: &ServicePort) -> String {
    format!(
        "KUBE-SVC-{}",
        hash(&format!("{}{}", port_id(sp), sp.protocol.name()))
    )
}

/// The NodePort's chain (masquerade, then the service chain).
pub fn ext_chain(sp: &ServicePort) -> String {
    format!(
        "KUBE-EXT-{}",
        hash(&format!("{}{}", port_id(sp), sp.protocol.name()))
    )
}

/// An endpoint's chain.
pub fn sep_chain(sp: &ServicePort, ep: &Endpoint) -> String {
    format!(
        "KUBE-SEP-{}",
        hash(&format!(
            "{}{}{}:{}",
            port_id(sp),
            sp.protocol.name(),
            ep.ip,
            ep.port
        ))
    )
}

/// The chains every sync owns besides the per-service ones: (table, chain).
pub const BASE_CHAINS: [(&str, &str); 7] = [
    ("nat", "KUBE-SERVICES"),
    ("nat", "KUBE-NODEPORTS"),
    ("nat", "KUBE-POSTROUTING"),
    ("nat", "KUBE-MARK-MASQ"),
    ("filter", "KUBE-SERVICES"),
    ("filter", "KUBE-EXTERNAL-SERVICES"),
    ("filter", "KUBE-FORWARD"),
];

/// The jumps from the kernel's chains into ours: (table, hook, rule after `-A hook`).
pub const JUMPS: [(&str, &str, &str); 7] = [
    (
        "nat",
        "PREROUTING",
        "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "nat",
        "OUTPUT",
        "-m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "nat",
        "POSTROUTING",
        "-m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
    ),
];

/// Renders the full rule set. `stale` names per-service chains of an earlier sync that are
/// gone now: they are declared (flushed) and deleted in the same transaction.
pub fn render(cluster: &Cluster, services: &[ServicePort], stale: &[(String, String)]) -> String {
    let mut services: Vec<&ServicePort> =
        services.iter().filter(|s| s.cluster_ip.is_some()).collect();
    services.sort_by(|a, b| {
        (&a.service, &a.port_name, a.protocol).cmp(&(&b.service, &b.port_name, b.protocol))
    });
    let mut filter = String::new();
    let mut nat = String::new();
    let mut nat_chains: Vec<String> = Vec::new();
    let _ = writeln!(
        filter,
        "-A KUBE-EXTERNAL-SERVICES -m mark --mark 0x8000/0x8000 -m comment --comment \"kubernetes firewall for dropping marked packets\" -j DROP"
    );
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"
    );
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT"
    );
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    let _ = writeln!(nat, "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000");
    let _ = writeln!(
        nat,
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN"
    );
    let _ = writeln!(nat, "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000");
    let _ = writeln!(
        nat,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
    for sp in &services {
        let ip = sp.cluster_ip.as_deref().unwrap_or_default();
        let proto = sp.protocol.name();
        let id = port_id(sp);
        let svc = svc_chain(sp);
        if sp.endpoints.is_empty() {
            let _ = writeln!(
                filter,
                "-A KUBE-SERVICES -d {ip}/32 -p {proto} -m comment --comment \"{id} has no endpoints\" -m {proto} --dport {} -j REJECT --reject-with icmp-port-unreachable",
                sp.port
            );
            if let Some(np) = sp.node_port {
                let _ = writeln!(
                    filter,
                    "-A KUBE-EXTERNAL-SERVICES -m addrtype --dst-type LOCAL -p {proto} -m comment --comment \"{id} has no endpoints\" -m {proto} --dport {np} -j REJECT --reject-with icmp-port-unreachable"
                );
            }
            continue;
        }
        nat_chains.push(svc.clone());
        let _ = writeln!(
            nat,
            "-A KUBE-SERVICES -d {ip}/32 -p {proto} -m comment --comment \"{id} cluster IP\" -m {proto} --dport {} -j {svc}",
            sp.port
        );
        let _ = writeln!(
            nat,
            "-A {svc} ! -s {} -d {ip}/32 -p {proto} -m comment --comment \"{id} cluster IP\" -m {proto} --dport {} -j KUBE-MARK-MASQ",
            cluster.pod_cidr, sp.port
        );
        if let Some(np) = sp.node_port {
            let ext = ext_chain(sp);
            nat_chains.push(ext.clone());
            let _ = writeln!(
                nat,
                "-A KUBE-NODEPORTS -p {proto} -m comment --comment \"{id}\" -m {proto} --dport {np} -j {ext}"
            );
            let _ = writeln!(
                nat,
                "-A {ext} -m comment --comment \"masquerade traffic for {id} external destinations\" -j KUBE-MARK-MASQ"
            );
            if sp.external_local {
                let local: Vec<&Endpoint> = sp.endpoints.iter().filter(|e| e.local).collect();
                if local.is_empty() {
                    let _ = writeln!(
                        nat,
                        "-A {ext} -m comment --comment \"{id} has no local endpoints\" -j KUBE-MARK-DROP"
                    );
                } else {
                    spread(&mut nat, &ext, sp, &local);
                }
            } else {
                let _ = writeln!(nat, "-A {ext} -j {svc}");
            }
        }
        let all: Vec<&Endpoint> = sp
            .endpoints
            .iter()
            .filter(|e| e.local || !sp.internal_local)
            .collect();
        if all.is_empty() {
            let _ = writeln!(
                nat,
                "-A {svc} -m comment --comment \"{id} has no local endpoints\" -j KUBE-MARK-DROP"
            );
        } else {
            spread(&mut nat, &svc, sp, &all);
        }
        for ep in &sp.endpoints {
            let sep = sep_chain(sp, ep);
            nat_chains.push(sep.clone());
            let _ = writeln!(
                nat,
                "-A {sep} -s {}/32 -m comment --comment \"{id}\" -j KUBE-MARK-MASQ",
                ep.ip
            );
            let recent = match sp.affinity_seconds {
                Some(_) => {
                    format!(" -m recent --set --name {sep} --mask 255.255.255.255 --rsource")
                }
                None => String::new(),
            };
            let _ = writeln!(
                nat,
                "-A {sep} -p {proto} -m comment --comment \"{id}\"{recent} -m {proto} -j DNAT --to-destination {}:{}",
                ep.ip, ep.port
            );
        }
    }
    let _ = writeln!(
        nat,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    nat_chains.sort();
    nat_chains.dedup();
    let mut out = String::new();
    out.push_str("*filter\n");
    for (t, c) in BASE_CHAINS {
        if t == "filter" {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
    }
    for (t, c) in stale.iter().filter(|(t, _)| t == "filter") {
        let _ = (t, writeln!(out, ":{c} - [0:0]"));
    }
    out.push_str(&filter);
    for (_, c) in stale.iter().filter(|(t, _)| t == "filter") {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n*nat\n");
    for (t, c) in BASE_CHAINS {
        if t == "nat" {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
    }
    let _ = writeln!(out, ":KUBE-MARK-DROP - [0:0]");
    for c in &nat_chains {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    for (_, c) in stale.iter().filter(|(t, _)| t == "nat") {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    let _ = writeln!(out, "-A KUBE-MARK-DROP -j MARK --or-mark 0x8000");
    out.push_str(&nat);
    for (_, c) in stale.iter().filter(|(t, _)| t == "nat") {
        let _ = writeln!(out, "-X {c}");
    }
    out.push_str("COMMIT\n");
    out
}

/// Spreads traffic of `chain` over `endpoints` with upstream's probabilities (1/n, 1/(n-1),
/// …, last unconditional), after the session-affinity checks.
fn spread(out: &mut String, chain: &str, sp: &ServicePort, endpoints: &[&Endpoint]) {
    let id = port_id(sp);
    if let Some(seconds) = sp.affinity_seconds {
        for ep in endpoints {
            let sep = sep_chain(sp, ep);
            let _ = writeln!(
                out,
                "-A {chain} -m comment --comment \"{id} -> {}:{}\" -m recent --name {sep} --rcheck --seconds {seconds} --reap -j {sep}",
                ep.ip, ep.port
            );
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let sep = sep_chain(sp, ep);
        let left = n - i;
        if left > 1 {
            let _ = writeln!(
                out,
                "-A {chain} -m comment --comment \"{id} -> {}:{}\" -m statistic --mode random --probability {:.11} -j {sep}",
                ep.ip,
                ep.port,
                1.0 / left as f64
            );
        } else {
            let _ = writeln!(
                out,
                "-A {chain} -m comment --comment \"{id} -> {}:{}\" -j {sep}",
                ep.ip, ep.port
            );
        }
    }
}

/// The per-service chains (`KUBE-SVC-*`, `KUBE-EXT-*`, `KUBE-SEP-*`) named in a rendering.
pub fn service_chains(rendered: &str) -> Vec<(String, String)> {
    let mut table = String::new();
    let mut out = Vec::new();
    for line in rendered.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_owned();
        } else if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split(' ').next().unwrap_or_default();
            if ["KUBE-SVC-", "KUBE-EXT-", "KUBE-SEP-"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                out.push((table.clone(), name.to_owned()));
            }
        }
    }
    out
}

//! The cluster's names, as the Kubernetes DNS specification (and CoreDNS's `kubernetes`
//! plugin) gives them, built from Services, EndpointSlices and Pods, and the answer to a
//! question about them. Pure: the server ([`super::server`]) encodes what [`Zone::answer`]
//! decides.
//!
//! - `<svc>.<ns>.svc.<domain>`: A with the ClusterIP; for a headless Service, its ready
//!   endpoints' IPs (all of them with `publishNotReadyAddresses`); CNAME for ExternalName.
//! - `<endpoint>.<svc>.<ns>.svc.<domain>` for a headless Service's endpoints: the endpoint's
//!   hostname (a pod whose `subdomain` is the Service) or its dashed IP.
//! - `_<port>._<proto>.<svc>.<ns>.svc.<domain>`: SRV for named ports (to the Service, or to
//!   each endpoint of a headless one).
//! - `a-b-c-d.<ns>.pod.<domain>`: A a.b.c.d.
//! - PTR for Service IPs, endpoint IPs and pod IPs.
//! - Extra hosts (the `DNS` kind's hosts) answer with the node's address.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;

/// The TTL of every cluster record (CoreDNS's `kubernetes` default).
pub const TTL: u32 = 5;

/// One record's data.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Data {
    /// An IPv4 address.
    A(Ipv4Addr),
    /// An alias (a name, without the trailing dot).
    Cname(String),
    /// A service location: port, weight and target name.
    Srv {
        /// The port.
        port: u16,
        /// Its share among the records of the name (percent).
        weight: u16,
        /// The target name.
        target: String,
    },
    /// A reverse name.
    Ptr(String),
}

/// The record type asked for, as far as the zone distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A.
    A,
    /// AAAA (never present: the cluster is IPv4).
    Aaaa,
    /// CNAME.
    Cname,
    /// SRV.
    Srv,
    /// PTR.
    Ptr,
    /// ANY.
    Any,
    /// Anything else (TXT, MX, …): the name's existence only.
    Other,
}

impl Data {
    fn matches(&self, kind: Kind) -> bool {
        matches!(
            (self, kind),
            (_, Kind::Any)
                | (Data::A(_), Kind::A)
                | (Data::Cname(_), Kind::Cname)
                | (Data::Srv { .. }, Kind::Srv)
                | (Data::Ptr(_), Kind::Ptr)
        )
    }
}

/// What the zone says about a question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Records of the name (owner name, data); extra records for SRV targets.
    Records {
        /// The answer section.
        answers: Vec<(String, Data)>,
        /// The additional section.
        additional: Vec<(String, Data)>,
    },
    /// The name exists but has no record of that type (NOERROR, SOA in authority).
    NoData,
    /// The name does not exist in the zone (NXDOMAIN, SOA in authority).
    NxDomain,
    /// Not the zone's: ask the upstream resolvers.
    Forward,
}

/// A Service as the zone needs it.
#[derive(Clone, Debug, Default)]
pub struct Service {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The ClusterIP (`None` for headless or ExternalName).
    pub cluster_ip: Option<Ipv4Addr>,
    /// `spec.externalName` of an ExternalName Service.
    pub external_name: Option<String>,
    /// Named ports: (name, protocol in lower case, port).
    pub ports: Vec<(String, String, u16)>,
    /// Whether not-ready endpoints are published.
    pub publish_not_ready: bool,
}

/// An endpoint of a Service (from its EndpointSlices).
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Namespace of the Service.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The address.
    pub ip: Ipv4Addr,
    /// `hostname`, if set.
    pub hostname: Option<String>,
    /// Ready.
    pub ready: bool,
    /// The slice's ports: (name, protocol in lower case, port).
    pub ports: Vec<(String, String, u16)>,
}

/// A pod as the zone needs it: namespace and IP.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Namespace.
    pub namespace: String,
    /// The pod's IP.
    pub ip: Ipv4Addr,
}

/// Every cluster name with its records.
#[derive(Clone, Debug, Default)]
pub struct Zone {
    /// Built from the cluster's objects (the default zone, before the informers have listed,
    /// is not).
    synced: bool,
    domain: String,
    names: HashMap<String, Vec<Data>>,
    /// Names that exist without records (empty non-terminals such as `<ns>.svc.<domain>`).
    exists: HashSet<String>,
    ptr: HashMap<Ipv4Addr, String>,
}

fn dashed(ip: Ipv4Addr) -> String {
    ip.to_string().replace('.', "-")
}

impl Zone {
    /// The zone for `domain` (like `cluster.local`), from the cluster's objects; `hosts` are
    /// extra names answered with `node` (the `DNS` kind's hosts).
    pub fn build(
        domain: &str,
        services: &[Service],
        endpoints: &[Endpoint],
        pods: &[Pod],
        hosts: &[String],
        node: Option<Ipv4Addr>,
    ) -> Zone {
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        let mut z = Zone {
            synced: true,
            domain: domain.clone(),
            ..Default::default()
        };
        let mut by_service: BTreeMap<(&str, &str), Vec<&Endpoint>> = BTreeMap::new();
        for e in endpoints {
            by_service
                .entry((e.namespace.as_str(), e.service.as_str()))
                .or_default()
                .push(e);
        }
        for p in pods {
            let name = format!("{}.{}.pod.{domain}", dashed(p.ip), p.namespace);
            z.ptr.entry(p.ip).or_insert(name);
        }
        for s in services {
            let fqdn = format!("{}.{}.svc.{domain}", s.name, s.namespace).to_ascii_lowercase();
            z.exists.insert(fqdn.clone());
            if let Some(target) = &s.external_name {
                z.add(&fqdn, Data::Cname(target.trim_end_matches('.').to_owned()));
                continue;
            }
            if let Some(ip) = s.cluster_ip {
                z.add(&fqdn, Data::A(ip));
                z.ptr.insert(ip, fqdn.clone());
                for (port, proto, number) in &s.ports {
                    let srv = format!("_{port}._{proto}.{fqdn}");
                    z.add(
                        &srv,
                        Data::Srv {
                            port: *number,
                            weight: 100,
                            target: fqdn.clone(),
                        },
                    );
                }
                continue;
            }
            // Headless: the endpoints themselves.
            let eps: Vec<&&Endpoint> = by_service
                .get(&(s.namespace.as_str(), s.name.as_str()))
                .into_iter()
                .flatten()
                .filter(|e| e.ready || s.publish_not_ready)
                .collect();
            let mut seen = HashSet::new();
            let mut srv: BTreeMap<String, Vec<(u16, String)>> = BTreeMap::new();
            for e in &eps {
                if !seen.insert(e.ip) {
                    continue;
                }
                let host = e.hostname.clone().unwrap_or_else(|| dashed(e.ip));
                let own = format!("{host}.{fqdn}").to_ascii_lowercase();
                z.add(&fqdn, Data::A(e.ip));
                z.add(&own, Data::A(e.ip));
                z.ptr.insert(e.ip, own.clone());
                for (port, proto, number) in &e.ports {
                    if port.is_empty() {
                        continue;
                    }
                    srv.entry(format!("_{port}._{proto}.{fqdn}"))
                        .or_default()
                        .push((*number, own.clone()));
                }
            }
            for (name, targets) in srv {
                let weight = (100 / targets.len().max(1)) as u16;
                for (port, target) in targets {
                    z.add(
                        &name,
                        Data::Srv {
                            port,
                            weight,
                            target,
                        },
                    );
                }
            }
        }
        if let Some(node) = node {
            for h in hosts {
                z.add(&h.trim_end_matches('.').to_ascii_lowercase(), Data::A(node));
            }
        }
        // Every name's parents within the zone exist (empty non-terminals).
        let parents: Vec<String> = z.names.keys().chain(z.exists.iter()).cloned().collect();
        for name in parents {
            let mut rest = name.as_str();
            while let Some((_, parent)) = rest.split_once('.') {
                if parent.len() < domain.len() || !in_zone(parent, &domain) {
                    break;
                }
                z.exists.insert(parent.to_owned());
                rest = parent;
            }
        }
        z.exists.insert(domain.clone());
        for v in z.names.values_mut() {
            v.sort();
            v.dedup();
        }
        z
    }

    fn add(&mut self, name: &str, data: Data) {
        self.names.entry(name.to_owned()).or_default().push(data);
    }

    /// Whether the zone was built from the cluster (not the empty one before the first list).
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The zone's domain (`cluster.local`).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The answer to `name` (lower case, without the trailing dot) and `kind`.
    pub fn answer(&self, name: &str, kind: Kind) -> Answer {
        if let Some(ip) = reverse(name) {
            return match self.ptr.get(&ip) {
                Some(target) if matches!(kind, Kind::Ptr | Kind::Any) => Answer::Records {
                    answers: vec![(name.to_owned(), Data::Ptr(target.clone()))],
                    additional: vec![],
                },
                Some(_) => Answer::NoData,
                None => Answer::Forward,
            };
        }
        if let Some(records) = self.names.get(name) {
            // A CNAME answers every type but CNAME-less ones (RFC 1034 3.6.2).
            if let Some(Data::Cname(target)) = records.iter().find(|d| matches!(d, Data::Cname(_)))
            {
                let mut answers = vec![(name.to_owned(), Data::Cname(target.clone()))];
                if kind != Kind::Cname
                    && let Answer::Records { answers: more, .. } = self.answer(target, kind)
                {
                    answers.extend(more);
                }
                return Answer::Records {
                    answers,
                    additional: vec![],
                };
            }
            let answers: Vec<(String, Data)> = records
                .iter()
                .filter(|d| d.matches(kind))
                .map(|d| (name.to_owned(), d.clone()))
                .collect();
            if answers.is_empty() {
                return Answer::NoData;
            }
            let mut additional = Vec::new();
            for (_, d) in &answers {
                if let Data::Srv { target, .. } = d {
                    for a in self.names.get(target).into_iter().flatten() {
                        if matches!(a, Data::A(_)) {
                            additional.push((target.clone(), a.clone()));
                        }
                    }
                }
            }
            return Answer::Records {
                answers,
                additional,
            };
        }
        if !in_zone(name, &self.domain) {
            return Answer::Forward;
        }
        // `a-b-c-d.<ns>.pod.<domain>`, for any namespace (CoreDNS's `pods insecure`).
        if let Some(ip) = pod_name(name, &self.domain) {
            return if matches!(kind, Kind::A | Kind::Any) {
                Answer::Records {
                    answers: vec![(name.to_owned(), Data::A(ip))],
                    additional: vec![],
                }
            } else {
                Answer::NoData
            };
        }
        if self.exists.contains(name) {
            Answer::NoData
        } else {
            Answer::NxDomain
        }
    }
}

fn in_zone(name: &str, domain: &str) -> bool {
    name == domain
        || name
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// The IP of `a-b-c-d.<ns>.pod.<domain>`.
fn pod_name(name: &str, domain: &str) -> Option<Ipv4Addr> {
    let rest = name.strip_suffix(domain)?.strip_suffix(".pod.")?;
    let (dashed, ns) = rest.split_once('.')?;
    if ns.is_empty() || ns.contains('.') {
        return None;
    }
    dashed.replace('-', ".").parse().ok()
}

/// The IPv4 address of a `d.c.b.a.in-addr.arpa` name.
fn reverse(name: &str) -> Option<Ipv4Addr> {
    let rest = name.strip_suffix(".in-addr.arpa")?;
    let parts: Vec<u8> = rest
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    match parts[..] {
        [d, c, b, a] => Some(Ipv4Addr::new(a, b, c, d)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn zone() -> Zone {
        let services = vec![
            Service {
                namespace: "default".into(),
                name: "web".into(),
                cluster_ip: Some(ip("10.96.0.20")),
                ports: vec![("http".into(), "tcp".into(), 80)],
                ..Default::default()
            },
            Service {
                namespace: "default".into(),
                name: "db".into(),
                ports: vec![("pg".into(), "tcp".into(), 5432)],
                ..Default::default()
            },
            Service {
                namespace: "default".into(),
                name: "ext".into(),
                external_name: Some("example.org.".into()),
                ..Default::default()
            },
        ];
        let ep = |addr: &str, host: Option<&str>, ready: bool| Endpoint {
            namespace: "default".into(),
            service: "db".into(),
            ip: ip(addr),
            hostname: host.map(str::to_owned),
            ready,
            ports: vec![("pg".into(), "tcp".into(), 5433)],
        };
        let endpoints = vec![
            ep("10.244.1.5", Some("db-0"), true),
            ep("10.244.1.6", None, true),
            ep("10.244.1.7", None, false),
        ];
        let pods = vec![Pod {
            namespace: "default".into(),
            ip: ip("10.244.1.9"),
        }];
        Zone::build(
            "cluster.local",
            &services,
            &endpoints,
            &pods,
            &["minik8s.io".into()],
            Some(ip("192.168.1.10")),
        )
    }

    fn a(answer: Answer) -> Vec<String> {
        match answer {
            Answer::Records { answers, .. } => answers
                .into_iter()
                .map(|(n, d)| match d {
                    Data::A(ip) => format!("{n} A {ip}"),
                    Data::Cname(t) => format!("{n} CNAME {t}"),
                    Data::Srv {
                        port,
                        weight,
                        target,
                    } => format!("{n} SRV {weight} {port} {target}"),
                    Data::Ptr(t) => format!("{n} PTR {t}"),
                })
                .collect(),
            other => vec![format!("{other:?}")],
        }
    }

    #[test]
    fn services_headless_srv_pods_ptr_and_misses_follow_the_dns_spec() {
        let z = zone();
        assert_eq!(
            a(z.answer("web.default.svc.cluster.local", Kind::A)),
            ["web.default.svc.cluster.local A 10.96.0.20"]
        );
        // No AAAA in an IPv4 cluster: the name exists, NODATA.
        assert_eq!(
            z.answer("web.default.svc.cluster.local", Kind::Aaaa),
            Answer::NoData
        );
        assert_eq!(
            a(z.answer("_http._tcp.web.default.svc.cluster.local", Kind::Srv)),
            ["_http._tcp.web.default.svc.cluster.local SRV 100 80 web.default.svc.cluster.local"]
        );
        // Headless: the ready endpoints only, each under its own name too.
        assert_eq!(
            a(z.answer("db.default.svc.cluster.local", Kind::A)),
            [
                "db.default.svc.cluster.local A 10.244.1.5",
                "db.default.svc.cluster.local A 10.244.1.6"
            ]
        );
        assert_eq!(
            a(z.answer("db-0.db.default.svc.cluster.local", Kind::A)),
            ["db-0.db.default.svc.cluster.local A 10.244.1.5"]
        );
        assert_eq!(
            a(z.answer("10-244-1-6.db.default.svc.cluster.local", Kind::A)),
            ["10-244-1-6.db.default.svc.cluster.local A 10.244.1.6"]
        );
        assert_eq!(
            a(z.answer("_pg._tcp.db.default.svc.cluster.local", Kind::Srv)),
            [
                "_pg._tcp.db.default.svc.cluster.local SRV 50 5433 10-244-1-6.db.default.svc.cluster.local",
                "_pg._tcp.db.default.svc.cluster.local SRV 50 5433 db-0.db.default.svc.cluster.local"
            ]
        );
        assert_eq!(
            a(z.answer("ext.default.svc.cluster.local", Kind::A)),
            ["ext.default.svc.cluster.local CNAME example.org"]
        );
        assert_eq!(
            a(z.answer("10-244-1-9.default.pod.cluster.local", Kind::A)),
            ["10-244-1-9.default.pod.cluster.local A 10.244.1.9"]
        );
        assert_eq!(
            a(z.answer("20.0.96.10.in-addr.arpa", Kind::Ptr)),
            ["20.0.96.10.in-addr.arpa PTR web.default.svc.cluster.local"]
        );
        assert_eq!(
            a(z.answer("5.1.244.10.in-addr.arpa", Kind::Ptr)),
            ["5.1.244.10.in-addr.arpa PTR db-0.db.default.svc.cluster.local"]
        );
        assert_eq!(
            a(z.answer("9.1.244.10.in-addr.arpa", Kind::Ptr)),
            ["9.1.244.10.in-addr.arpa PTR 10-244-1-9.default.pod.cluster.local"]
        );
        // Misses: NXDOMAIN in the zone, NODATA for its empty non-terminals, the rest forwarded.
        assert_eq!(
            z.answer("nope.default.svc.cluster.local", Kind::A),
            Answer::NxDomain
        );
        assert_eq!(
            z.answer(
                "web.default.svc.cluster.local.default.svc.cluster.local",
                Kind::A
            ),
            Answer::NxDomain
        );
        assert_eq!(
            z.answer("default.svc.cluster.local", Kind::A),
            Answer::NoData
        );
        assert_eq!(z.answer("example.org", Kind::A), Answer::Forward);
        assert_eq!(z.answer("1.2.3.4.in-addr.arpa", Kind::Ptr), Answer::Forward);
        // The DNS kind's hosts answer with the node's address.
        assert_eq!(
            a(z.answer("minik8s.io", Kind::A)),
            ["minik8s.io A 192.168.1.10"]
        );
    }
}

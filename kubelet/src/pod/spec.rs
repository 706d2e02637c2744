//! The pod spec in the runtime's terms: the sandbox config and each container's config
//! (command, env, mounts, resources → cgroup limits, security context).

use crate::cri::{self, labels};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use minik8s_types::Quantity;
use std::collections::HashMap;
use std::path::Path;

/// Where a node keeps things for its pods.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The node's name.
    pub node: String,
    /// Pod folders (`<root>/pods/<uid>`) and logs (`<root>/logs/…`).
    pub root: std::path::PathBuf,
    /// The cgroup every pod's cgroup sits under (e.g. `/minik8s/<node>`).
    pub cgroup_root: String,
    /// The cluster DNS servers (`ClusterFirst` pods' nameservers; none: as `Default`).
    pub cluster_dns: Vec<String>,
    /// The cluster domain (`cluster.local`).
    pub cluster_domain: String,
}

impl Layout {
    /// The pod's folder (volumes live under it).
    pub fn pod_dir(&self, uid: &str) -> std::path::PathBuf {
        self.root.join("pods").join(uid)
    }

    /// The pod's log folder, named as upstream (`<ns>_<name>_<uid>`).
    pub fn log_dir(&self, pod: &Pod) -> std::path::PathBuf {
        self.root.join("logs").join(format!(
            "{}_{}_{}",
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            pod.uid().unwrap_or_default()
        ))
    }
}

/// Labels identifying the pod on its runtime objects.
pub fn pod_labels(pod: &Pod, node: &str) -> HashMap<String, String> {
    HashMap::from([
        (labels::POD_NAME.to_owned(), pod.name_any()),
        (
            labels::POD_NAMESPACE.to_owned(),
            pod.namespace().unwrap_or_default(),
        ),
        (labels::POD_UID.to_owned(), pod.uid().unwrap_or_default()),
        (labels::NODE.to_owned(), node.to_owned()),
    ])
}

/// The pod's ephemeral containers (`kubectl debug`) as containers: an `EphemeralContainer`
/// has a `Container`'s fields (less ports, probes and resources, which the API refuses), plus
/// `targetContainerName`, which the runtime needs not.
pub fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter_map(|e| {
            serde_json::to_value(e)
                .and_then(serde_json::from_value::<Container>)
                .ok()
        })
        .collect()
}

/// Whether the pod shares the node's network.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The pod's namespaces: the node's network with `hostNetwork`, else the pod's own; IPC
/// shared in the pod; a PID namespace per container.
fn namespaces(pod: &Pod) -> cri::NamespaceOption {
    let network = if host_network(pod) {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    cri::NamespaceOption {
        network: network as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// The node's own resolver settings (`/etc/resolv.conf`): nameservers, search domains and
/// options.
pub fn host_resolv(text: &str) -> cri::DnsConfig {
    let mut c = cri::DnsConfig::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => c.servers.extend(words.next().map(str::to_owned)),
            Some("search") | Some("domain") => {
                c.searches = words.map(str::to_owned).collect();
            }
            Some("options") => c.options.extend(words.map(str::to_owned)),
            _ => {}
        }
    }
    c
}

/// The pod's resolver settings by `dnsPolicy`, as upstream's kubelet writes them:
/// `ClusterFirst` (the default; `Default` for host-network pods) uses the cluster DNS with the
/// search path `<ns>.svc.<domain> svc.<domain> <domain>` then the node's, and `ndots:5`;
/// `ClusterFirstWithHostNet` does so for host-network pods too; `Default` is the node's own;
/// `None` is only `dnsConfig`, which the other policies merge in.
pub fn dns_config(pod: &Pod, layout: &Layout, host: &cri::DnsConfig) -> cri::DnsConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster = !layout.cluster_dns.is_empty()
        && match policy {
            "ClusterFirstWithHostNet" => true,
            "ClusterFirst" => !host_network(pod),
            _ => false,
        };
    let mut c = if cluster {
        let ns = pod.namespace().unwrap_or_default();
        let domain = &layout.cluster_domain;
        let mut searches = vec![
            format!("{ns}.svc.{domain}"),
            format!("svc.{domain}"),
            domain.clone(),
        ];
        searches.extend(host.searches.iter().cloned());
        cri::DnsConfig {
            servers: layout.cluster_dns.clone(),
            searches,
            options: vec!["ndots:5".into()],
        }
    } else if policy == "None" {
        cri::DnsConfig::default()
    } else {
        host.clone()
    };
    if let Some(extra) = &spec.dns_config {
        c.servers
            .extend(extra.nameservers.iter().flatten().cloned());
        c.searches.extend(extra.searches.iter().flatten().cloned());
        for o in extra.options.iter().flatten() {
            let text = match &o.value {
                Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                None => o.name.clone().unwrap_or_default(),
            };
            let key = text.split(':').next().unwrap_or_default().to_owned();
            c.options
                .retain(|x| x.split(':').next().unwrap_or_default() != key);
            c.options.push(text);
        }
    }
    // resolv.conf's limits (glibc): 3 nameservers, 32 search domains.
    c.servers.truncate(3);
    c.searches.dedup();
    c.searches.truncate(32);
    c
}

/// The pod's host name, as upstream's `GeneratePodHostNameAndDomain`: `spec.hostname`, else
/// the pod's name cut to 63 characters without a trailing '-' or '.'.
pub fn pod_hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    match spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
    {
        Some(h) => h,
        None => {
            let name = pod.name_any();
            let cut: String = name.chars().take(63).collect();
            cut.trim_end_matches(['-', '.']).to_owned()
        }
    }
}

/// The pod's `/etc/hosts`, as upstream's kubelet writes it: localhost, the pod's own name (as
/// `<hostname>.<subdomain>.<ns>.svc.<domain>` too when it has a subdomain), and `hostAliases`.
pub fn hosts_file(pod: &Pod, pod_ip: &str, domain: &str) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let hostname = pod_hostname(pod);
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        Some(sub) => {
            let ns = pod.namespace().unwrap_or_default();
            out.push_str(&format!(
                "{pod_ip}\t{hostname}.{sub}.{ns}.svc.{domain}\t{hostname}\n"
            ));
        }
        None => out.push_str(&format!("{pod_ip}\t{hostname}\n")),
    }
    let aliases = spec.host_aliases.unwrap_or_default();
    if !aliases.is_empty() {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            out.push_str(&format!(
                "{}\t{}\n",
                a.ip,
                a.hostnames.unwrap_or_default().join("\t")
            ));
        }
    }
    out
}

/// The sandbox config for attempt `attempt` of the pod.
pub fn sandbox_config(pod: &Pod, layout: &Layout, attempt: u32) -> cri::PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let host = host_resolv(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default());
    let uid = pod.uid().unwrap_or_default();
    let hostname = pod_hostname(pod);
    let ports = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp as i32,
                Some("SCTP") => cri::Protocol::Sctp as i32,
                _ => cri::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let mut sandbox_labels: HashMap<String, String> = pod.labels().clone().into_iter().collect();
    sandbox_labels.extend(pod_labels(pod, &layout.node));
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: pod.name_any(),
            uid: uid.clone(),
            namespace: pod.namespace().unwrap_or_default(),
            attempt,
        }),
        // A host-network pod shares the node's UTS namespace too, so it keeps the node's
        // host name (runc refuses to set one without a private UTS namespace).
        hostname: if host_network(pod) {
            String::new()
        } else {
            hostname
        },
        dns_config: Some(dns_config(pod, layout, &host)),
        log_directory: layout.log_dir(pod).display().to_string(),
        port_mappings: ports,
        labels: sandbox_labels,
        annotations: pod.annotations().clone().into_iter().collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("{}/pod{uid}", layout.cgroup_root),
            // The pod's namespaced sysctls, set in its sandbox as upstream does.
            sysctls: spec
                .security_context
                .iter()
                .flat_map(|s| s.sysctls.iter().flatten())
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(pod)),
                // As upstream's kubelet (determinePodSandboxPrivilege): a sandbox is
                // privileged when one of its containers is, or the runtime refuses that
                // container ("no privileged container allowed in sandbox").
                privileged: privileged(pod),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether any container of the pod (init, app or ephemeral) asks to be privileged.
fn privileged(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let is = |sc: Option<&k8s_openapi::api::core::v1::SecurityContext>| {
        sc.and_then(|s| s.privileged).unwrap_or(false)
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| is(c.security_context.as_ref()))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| is(c.security_context.as_ref()))
}

fn quantity(c: &Container, which: &str, name: &str) -> Option<Quantity> {
    let r = c.resources.as_ref()?;
    let map = if which == "limits" {
        r.limits.as_ref()?
    } else {
        r.requests.as_ref()?
    };
    Quantity::parse(&map.get(name)?.0).ok()
}

/// cgroup limits from the container's requests and limits, as upstream computes them.
pub fn resources(c: &Container) -> cri::LinuxContainerResources {
    const PERIOD: i64 = 100_000;
    let request_cpu = quantity(c, "requests", "cpu").or_else(|| quantity(c, "limits", "cpu"));
    let shares = request_cpu.map_or(2, |q| ((q.millis() * 1024) / 1000).max(2) as i64);
    let quota = quantity(c, "limits", "cpu").map_or(0, |q| {
        ((q.millis() * PERIOD as i128) / 1000).max(1000) as i64
    });
    let memory = quantity(c, "limits", "memory").map_or(0, |q| q.units() as i64);
    cri::LinuxContainerResources {
        cpu_period: if quota > 0 { PERIOD } else { 0 },
        cpu_quota: quota,
        cpu_shares: shares,
        memory_limit_in_bytes: memory,
        ..Default::default()
    }
}

/// A command or its args with `$(VAR)` expanded from the container's environment and `$$`
/// unescaped, as upstream's `ExpandContainerCommandAndArgs`.
fn expand_all(words: Option<&[String]>, envs: &[cri::KeyValue]) -> Vec<String> {
    let vars: std::collections::BTreeMap<String, String> = envs
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    words
        .unwrap_or_default()
        .iter()
        .map(|w| super::env::expand(w, &vars))
        .collect()
}

/// The container config for attempt `attempt` of container `c`.
/// Where a container writes its termination message (upstream's default
/// `/dev/termination-log`).
pub fn termination_path(c: &Container) -> &str {
    match c.termination_message_path.as_deref() {
        Some(p) if !p.is_empty() => p,
        _ => "/dev/termination-log",
    }
}

/// The CRI configuration of a container.
pub fn container_config(
    pod: &Pod,
    c: &Container,
    attempt: u32,
    envs: Vec<cri::KeyValue>,
    mounts: Vec<cri::Mount>,
    node: &str,
) -> cri::ContainerConfig {
    let mut container_labels = pod_labels(pod, node);
    container_labels.insert(labels::CONTAINER_NAME.to_owned(), c.name.clone());
    let security = c.security_context.as_ref();
    let pod_security = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let run_as_user = security
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_security.and_then(|s| s.run_as_user))
        .map(|value| cri::Int64Value { value });
    let run_as_group = security
        .and_then(|s| s.run_as_group)
        .or_else(|| pod_security.and_then(|s| s.run_as_group))
        .map(|value| cri::Int64Value { value });
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: expand_all(c.command.as_deref(), &envs),
        args: expand_all(c.args.as_deref(), &envs),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels: container_labels,
        annotations: [
            (
                super::observed::TERMINATION_PATH.to_owned(),
                termination_path(c).to_owned(),
            ),
            (
                super::observed::TERMINATION_POLICY.to_owned(),
                c.termination_message_policy
                    .clone()
                    .unwrap_or_else(|| "File".into()),
            ),
        ]
        .into(),
        log_path: Path::new(&c.name)
            .join(format!("{attempt}.log"))
            .display()
            .to_string(),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources(c)),
            security_context: Some(cri::LinuxContainerSecurityContext {
                privileged: security.and_then(|s| s.privileged).unwrap_or(false),
                run_as_user,
                run_as_group,
                // allowPrivilegeEscalation: false is no_new_privs (upstream's
                // AddNoNewPrivileges: only an explicit false sets it).
                no_new_privs: security.and_then(|s| s.allow_privilege_escalation) == Some(false),
                readonly_rootfs: security
                    .and_then(|s| s.read_only_root_filesystem)
                    .unwrap_or(false),
                namespace_options: Some(namespaces(pod)),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use std::collections::BTreeMap;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop"}, "spec": spec}))
        .unwrap()
    }

    fn layout() -> Layout {
        Layout {
            node: "n".into(),
            root: "/tmp".into(),
            cgroup_root: "/x".into(),
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
        }
    }

    #[test]
    fn dns_policies_write_resolv_conf_as_upstream() {
        let host =
            host_resolv("# host\nnameserver 192.168.1.1\nsearch corp.example\noptions edns0\n");
        assert_eq!(host.servers, ["192.168.1.1"]);
        let c = dns_config(
            &pod(serde_json::json!({"containers": []})),
            &layout(),
            &host,
        );
        assert_eq!(c.servers, ["10.96.0.10"]);
        assert_eq!(
            c.searches,
            [
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(c.options, ["ndots:5"]);
        // Host network: ClusterFirst means the node's; ClusterFirstWithHostNet the cluster's.
        let hn = pod(serde_json::json!({"hostNetwork": true, "containers": []}));
        assert_eq!(dns_config(&hn, &layout(), &host), host);
        let hn2 = pod(
            serde_json::json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "containers": []}),
        );
        assert_eq!(dns_config(&hn2, &layout(), &host).servers, ["10.96.0.10"]);
        let default = pod(serde_json::json!({"dnsPolicy": "Default", "containers": []}));
        assert_eq!(dns_config(&default, &layout(), &host), host);
        // None: only dnsConfig; dnsConfig options replace same-named ones elsewhere.
        let none = pod(serde_json::json!({"dnsPolicy": "None", "containers": [],
            "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["a.example"],
                          "options": [{"name": "ndots", "value": "2"}, {"name": "rotate"}]}}));
        let c = dns_config(&none, &layout(), &host);
        assert_eq!(
            (c.servers, c.searches, c.options),
            (
                vec!["1.1.1.1".to_owned()],
                vec!["a.example".to_owned()],
                vec!["ndots:2".to_owned(), "rotate".to_owned()]
            )
        );
        let merged = pod(serde_json::json!({"containers": [],
            "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}}));
        assert_eq!(dns_config(&merged, &layout(), &host).options, ["ndots:1"]);
    }

    #[test]
    fn hosts_files_name_the_pod_as_upstream() {
        let plain = hosts_file(
            &pod(serde_json::json!({"containers": []})),
            "10.244.1.5",
            "cluster.local",
        );
        assert!(plain.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(plain.ends_with("10.244.1.5\tweb-1\n"), "{plain}");
        let sub = hosts_file(
            &pod(
                serde_json::json!({"hostname": "db-0", "subdomain": "db", "containers": [],
                "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["a.test", "b.test"]}]}),
            ),
            "10.244.1.6",
            "cluster.local",
        );
        assert!(
            sub.contains("10.244.1.6\tdb-0.db.shop.svc.cluster.local\tdb-0\n"),
            "{sub}"
        );
        assert!(
            sub.ends_with("# Entries added by HostAliases.\n10.1.2.3\ta.test\tb.test\n"),
            "{sub}"
        );
    }

    #[test]
    fn requests_and_limits_become_cpu_shares_quota_and_a_memory_limit() {
        let c = Container {
            name: "x".into(),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Q("250m".into()))])),
                limits: Some(BTreeMap::from([
                    ("cpu".into(), Q("500m".into())),
                    ("memory".into(), Q("64Mi".into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = resources(&c);
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.cpu_period),
            (256, 50_000, 100_000)
        );
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        let none = resources(&Container::default());
        assert_eq!(
            (none.cpu_shares, none.cpu_quota, none.memory_limit_in_bytes),
            (2, 0, 0)
        );
    }
}

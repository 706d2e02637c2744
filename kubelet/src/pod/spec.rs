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

/// The sandbox config for attempt `attempt` of the pod.
pub fn sandbox_config(pod: &Pod, layout: &Layout, attempt: u32) -> cri::PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    let hostname = spec.hostname.clone().unwrap_or_else(|| pod.name_any());
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
        hostname: hostname.chars().take(63).collect(),
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
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
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

/// The container config for attempt `attempt` of container `c`.
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
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels: container_labels,
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

//! The control plane as static pods (kubeadm's model): `minik8s init --static-control-plane`
//! writes manifests for `kube-apiserver` and `kube-controller-manager` (the scheduler runs
//! inside it) into the node's manifest folder. The kubelet runs them as host-network
//! containers from a locally built image holding the `minik8s` binary
//! (`hack/control-plane-image.sh`), with the data folder (PKI, store) mounted at the same
//! path; it restarts them when they die and replaces them when their manifest changes.

use crate::{UpConfig, UpError};
use serde_json::json;
use std::path::PathBuf;

/// The image the control plane runs from.
#[derive(Clone, Debug)]
pub struct StaticPlane {
    /// The image archive (docker archive) the node imports.
    pub archive: PathBuf,
    /// Its reference (the archive's tag).
    pub image: String,
}

/// The binary's path inside the image.
pub const BINARY: &str = "/usr/local/bin/minik8s";

fn pod(
    name: &str,
    image: &str,
    command: Vec<String>,
    memory: &str,
    data: &str,
) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "kube-system",
                     "labels": {"component": name, "tier": "control-plane"}},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 10,
            "containers": [{
                "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
                "command": command,
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"memory": memory}},
                "volumeMounts": [{"name": "data", "mountPath": data}],
            }],
            "volumes": [{"name": "data", "hostPath": {"path": data, "type": "DirectoryOrCreate"}}],
        },
    })
}

/// The two manifests for `cfg`: (file name, manifest).
pub fn manifests(cfg: &UpConfig, plane: &StaticPlane) -> Vec<(&'static str, serde_json::Value)> {
    let data = cfg.data_dir.display().to_string();
    let mut apiserver = vec![
        BINARY.to_owned(),
        "apiserver".into(),
        format!("--data-dir={data}"),
        format!("--bind={}", cfg.bind),
        format!("--port={}", cfg.port),
        format!("--node-name={}", cfg.node_name),
        format!("--audit-level={:?}", cfg.audit_level),
        format!(
            "--etcd-compaction-interval={}s",
            cfg.compaction_interval.as_secs()
        ),
        format!("--store-cache-mib={}", cfg.store_cache_mib),
        format!("--store-history-age={}s", cfg.store_history_age.as_secs()),
    ];
    match &cfg.storage {
        Some(minik8s_storage::Endpoint::Etcd(urls)) => {
            let hosts: Vec<&str> = urls
                .iter()
                .map(|u| u.trim_start_matches("http://"))
                .collect();
            apiserver.push(format!("--storage=etcd://{}", hosts.join(",")));
        }
        Some(minik8s_storage::Endpoint::Embedded(dir)) => {
            apiserver.push(format!("--storage=embedded://{}", dir.display()));
        }
        None => {}
    }
    if !cfg.hosts.is_empty() {
        apiserver.push(format!("--host={}", cfg.hosts.join(",")));
    }
    if !cfg.ips.is_empty() {
        let ips: Vec<String> = cfg.ips.iter().map(|i| i.to_string()).collect();
        apiserver.push(format!("--ip={}", ips.join(",")));
    }
    let pki = cfg.data_dir.join("pki");
    let manager = vec![
        BINARY.to_owned(),
        "controller-manager".into(),
        format!(
            "--kubeconfig={}",
            pki.join("controller-manager.kubeconfig").display()
        ),
        format!(
            "--cluster-signing-cert-file={}",
            pki.join("ca.crt").display()
        ),
        format!("--root-ca-file={}", pki.join("ca.crt").display()),
        format!(
            "--cluster-signing-key-file={}",
            pki.join("ca.key").display()
        ),
        format!("--client-ca-file={}", pki.join("ca.crt").display()),
        format!(
            "--node-monitor-grace-period={}s",
            cfg.node_monitor_grace.as_secs()
        ),
        format!(
            "--cluster-signing-duration={}s",
            cfg.signing_duration.as_secs()
        ),
        format!(
            "--cluster-cidr={}/{}",
            cfg.node_ipam.network, cfg.node_ipam.prefix
        ),
        format!("--node-cidr-mask-size={}", cfg.node_ipam.node_prefix),
    ];
    vec![
        (
            "kube-apiserver.yaml",
            pod("kube-apiserver", &plane.image, apiserver, "1Gi", &data),
        ),
        (
            "kube-controller-manager.yaml",
            pod(
                "kube-controller-manager",
                &plane.image,
                manager,
                "512Mi",
                &data,
            ),
        ),
    ]
}

/// Writes the manifests into the node's manifest folder, keeping any already there (an
/// operator's edits survive a restart of `init`).
pub fn write_manifests(cfg: &UpConfig, plane: &StaticPlane) -> Result<(), UpError> {
    let dir = cfg.data_dir.join("manifests");
    std::fs::create_dir_all(&dir).map_err(|source| UpError::Io {
        path: dir.clone(),
        source,
    })?;
    for (file, manifest) in manifests(cfg, plane) {
        let path = dir.join(file);
        if path.exists() {
            continue;
        }
        let text = serde_json::to_string_pretty(&manifest).expect("a manifest");
        std::fs::write(&path, text).map_err(|source| UpError::Io { path, source })?;
    }
    Ok(())
}

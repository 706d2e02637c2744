//! Cluster PKI and kubeconfig files for minik8s: a cluster CA that is created once and kept,
//! the apiserver's serving certificate, one client certificate per identity (CN = user,
//! O = groups) and a kubeconfig for each identity that stock kubectl and kube-rs accept.

pub mod copycerts;
pub mod csr;
mod error;
pub mod insecure;
pub mod join;
pub mod kubeconfig;
mod pki;
pub mod process;

pub use error::{Error, Result};
pub use kubeconfig::Kubeconfig;
pub use pki::{
    ETCD_CLIENT, EtcdCerts, FRONT_PROXY_CLIENT, FrontProxy, Identity, Pki, PkiOptions, ServingCert,
};

/// Builds a kube `Client` from a kubeconfig file: the one way every minik8s component and
/// test connects to the apiserver.
pub async fn client(path: &std::path::Path) -> Result<kube::Client, ClientError> {
    // kube's rustls needs a process-wide crypto provider; installing twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

/// As [`client`], reaching the apiserver at `server` (`https://host:port`) instead of the
/// kubeconfig's own URL (a node's client-side balancer): the CA and credentials are the
/// kubeconfig's.
pub async fn client_via(path: &std::path::Path, server: &str) -> Result<kube::Client, ClientError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut kc = kube::config::Kubeconfig::read_from(path)?;
    for named in &mut kc.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            cluster.server = Some(server.to_owned());
        }
    }
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    Ok(kube::Client::try_from(config)?)
}

/// Points every cluster of the kubeconfig file at `server` (`https://host:port`), keeping
/// its CA and credentials: a node's kubeconfig names its client-side balancer.
pub fn set_server(path: &std::path::Path, server: &str) -> Result<(), ClientError> {
    let write = |e: &dyn std::fmt::Display| ClientError::Write(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| write(&e))?;
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| write(&e))?;
    if let Some(clusters) = kc.get_mut("clusters").and_then(|c| c.as_sequence_mut()) {
        for named in clusters {
            if let Some(cluster) = named.get_mut("cluster").and_then(|c| c.as_mapping_mut()) {
                cluster.insert("server".into(), server.into());
            }
        }
    }
    let yaml = serde_yaml::to_string(&kc).map_err(|e| write(&e))?;
    pki::write_private(path, yaml.as_bytes()).map_err(|e| write(&e))?;
    Ok(())
}

/// Why a client could not be built from a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The file could not be read or parsed.
    #[error("reading kubeconfig")]
    Read(#[from] kube::config::KubeconfigError),
    /// The client could not be set up (TLS, URL).
    #[error("building the client")]
    Build(#[from] kube::Error),
    /// The kubeconfig could not be written back.
    #[error("writing kubeconfig: {0}")]
    Write(String),
}

//! Cluster PKI and kubeconfig files for minik8s: a cluster CA that is created once and kept,
//! the apiserver's serving certificate, one client certificate per identity (CN = user,
//! O = groups) and a kubeconfig for each identity that stock kubectl and kube-rs accept.

mod error;
mod kubeconfig;
mod pki;

pub use error::{Error, Result};
pub use kubeconfig::Kubeconfig;
pub use pki::{Identity, Pki, PkiOptions, ServingCert};

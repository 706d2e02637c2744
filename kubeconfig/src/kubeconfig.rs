//! The kubeconfig file format (the subset minik8s writes), serialised as YAML.

use crate::{Error, Result};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A kubeconfig with one cluster, one user and one context, all named after the cluster.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct Kubeconfig {
    /// Always `v1`.
    pub api_version: String,
    /// Always `Config`.
    pub kind: String,
    /// The clusters.
    pub clusters: Vec<NamedCluster>,
    /// The users.
    pub users: Vec<NamedUser>,
    /// The contexts.
    pub contexts: Vec<NamedContext>,
    /// The context used by default.
    pub current_context: String,
}

/// A named cluster entry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NamedCluster {
    /// Its name.
    pub name: String,
    /// Where it is.
    pub cluster: Cluster,
}

/// How to reach a cluster.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct Cluster {
    /// The apiserver's URL.
    pub server: String,
    /// The cluster CA, PEM, base64.
    pub certificate_authority_data: String,
}

/// A named user entry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NamedUser {
    /// Its name.
    pub name: String,
    /// Its credentials.
    pub user: User,
}

/// A user's credentials: a client certificate and key, or a bearer token.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct User {
    /// Client certificate, PEM, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_certificate_data: Option<String>,
    /// Client key, PEM, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_key_data: Option<String>,
    /// A bearer token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// A named context entry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NamedContext {
    /// Its name.
    pub name: String,
    /// Which cluster and user.
    pub context: Context,
}

/// A cluster and user pair.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Context {
    /// The cluster's name.
    pub cluster: String,
    /// The user's name.
    pub user: String,
}

fn b64(pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(pem)
}

impl Kubeconfig {
    /// A kubeconfig for `user` on `cluster` at `server`, trusting `ca_pem`, with the given credentials.
    pub fn new(cluster: &str, server: &str, ca_pem: &str, user_name: &str, user: User) -> Self {
        let context = format!("{user_name}@{cluster}");
        Kubeconfig {
            api_version: "v1".into(),
            kind: "Config".into(),
            clusters: vec![NamedCluster {
                name: cluster.into(),
                cluster: Cluster {
                    server: server.into(),
                    certificate_authority_data: b64(ca_pem),
                },
            }],
            users: vec![NamedUser {
                name: user_name.into(),
                user,
            }],
            contexts: vec![NamedContext {
                name: context.clone(),
                context: Context {
                    cluster: cluster.into(),
                    user: user_name.into(),
                },
            }],
            current_context: context,
        }
    }

    /// Credentials from a client certificate and key in PEM.
    pub fn cert_user(cert_pem: &str, key_pem: &str) -> User {
        User {
            client_certificate_data: Some(b64(cert_pem)),
            client_key_data: Some(b64(key_pem)),
            token: None,
        }
    }

    /// Writes the file with mode 0600.
    pub fn write(&self, path: &Path) -> Result<()> {
        let yaml = serde_yaml::to_string(self).map_err(|source| Error::Yaml {
            path: path.into(),
            source,
        })?;
        crate::pki::write_private(path, yaml.as_bytes())
    }
}

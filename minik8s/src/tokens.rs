//! `minik8s token create|list|delete` and the `cluster-info` ConfigMap joining nodes read:
//! bootstrap tokens are `bootstrap.kubernetes.io/token` Secrets in `kube-system`, as kubeadm
//! makes them.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use minik8s_types::bootstrap::{
    self, CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, KUBECONFIG_KEY, NAMESPACE, NODE_GROUP, SECRET_TYPE,
    Token, TokenSecret,
};
use serde_json::json;

/// Why a token command failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The argument is neither a token nor a token id.
    #[error(
        "{0:?} is not a bootstrap token or token id ([a-z0-9]{{6}} or [a-z0-9]{{6}}.[a-z0-9]{{16}})"
    )]
    BadToken(String),
    /// A CA certificate could not be read.
    #[error(transparent)]
    Pki(#[from] minik8s_kubeconfig::Error),
    /// The cluster-info ConfigMap is unusable.
    #[error(transparent)]
    ClusterInfo(#[from] minik8s_kubeconfig::join::JoinError),
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> TokenError {
    let what = what.into();
    move |source| TokenError::Api { what, source }
}

/// Creates a node bootstrap token (authentication and signing, group
/// `system:bootstrappers:kubeadm:default-node-token`) valid for `ttl_seconds` (0: forever).
pub async fn create(
    client: Client,
    token: Option<Token>,
    ttl_seconds: i64,
    description: &str,
) -> Result<Token, TokenError> {
    create_secret(client, token, ttl_seconds, description, true).await
}

/// Creates a token that neither authenticates nor signs, only expiring after `ttl_seconds`:
/// objects it owns are collected with it (kubeadm's token for `kubeadm-certs`).
pub async fn create_unusable(
    client: Client,
    ttl_seconds: i64,
    description: &str,
) -> Result<Token, TokenError> {
    create_secret(client, None, ttl_seconds, description, false).await
}

async fn create_secret(
    client: Client,
    token: Option<Token>,
    ttl_seconds: i64,
    description: &str,
    usable: bool,
) -> Result<Token, TokenError> {
    let token = token.unwrap_or_else(Token::generate);
    let expiration = (ttl_seconds > 0).then(|| {
        (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(ttl_seconds))
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    });
    let secret = TokenSecret {
        token: Some(token.clone()),
        expiration,
        description: description.to_owned(),
        authentication: usable,
        signing: usable,
        extra_groups: if usable {
            vec![NODE_GROUP.to_owned()]
        } else {
            Vec::new()
        },
    };
    let obj: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": token.secret_name(), "namespace": NAMESPACE},
        "type": SECRET_TYPE,
        "data": secret.data(),
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client, NAMESPACE)
        .create(&PostParams::default(), &obj)
        .await
        .map_err(api_err(format!("creating bootstrap token {}", token.id)))?;
    Ok(token)
}

/// One row of `token list`.
#[derive(Clone, Debug)]
pub struct Listed {
    /// The whole token.
    pub token: String,
    /// Time left, or `<forever>`.
    pub ttl: String,
    /// The expiration time, or `<never>`.
    pub expires: String,
    /// `authentication,signing`.
    pub usages: String,
    /// The description.
    pub description: String,
    /// The extra groups.
    pub groups: String,
}

/// Every bootstrap token.
pub async fn list(client: Client) -> Result<Vec<Listed>, TokenError> {
    let secrets = Api::<Secret>::namespaced(client, NAMESPACE)
        .list(&ListParams::default().fields(&format!("type={SECRET_TYPE}")))
        .await
        .map_err(api_err("listing bootstrap tokens"))?;
    let now = jiff::Timestamp::now();
    let mut out = Vec::new();
    for s in secrets.items {
        let Some(t) = serde_json::to_value(&s)
            .ok()
            .and_then(|v| TokenSecret::from_secret(&v))
        else {
            continue;
        };
        let Some(token) = &t.token else { continue };
        let (ttl, expires) = match &t.expiration {
            None => ("<forever>".to_owned(), "<never>".to_owned()),
            Some(e) => match e.parse::<jiff::Timestamp>() {
                Ok(at) if at > now => {
                    let left = (at - now).get_seconds();
                    let ttl = if left >= 3600 {
                        format!("{}h", left / 3600)
                    } else {
                        format!("{}m", left / 60)
                    };
                    (ttl, e.clone())
                }
                _ => ("<invalid>".to_owned(), e.clone()),
            },
        };
        let mut usages = Vec::new();
        if t.authentication {
            usages.push("authentication");
        }
        if t.signing {
            usages.push("signing");
        }
        out.push(Listed {
            token: token.to_string(),
            ttl,
            expires,
            usages: usages.join(","),
            description: if t.description.is_empty() {
                "<none>".into()
            } else {
                t.description.clone()
            },
            groups: t.extra_groups.join(","),
        });
    }
    Ok(out)
}

/// Deletes a token given as `<id>` or `<id>.<secret>`.
pub async fn delete(client: Client, which: &str) -> Result<String, TokenError> {
    let id = match Token::parse(which) {
        Some(t) => t.id,
        None if which.len() == 6
            && which
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) =>
        {
            which.to_owned()
        }
        None => return Err(TokenError::BadToken(which.to_owned())),
    };
    let name = format!("{}{id}", bootstrap::SECRET_PREFIX);
    Api::<Secret>::namespaced(client, NAMESPACE)
        .delete(&name, &DeleteParams::default())
        .await
        .map_err(api_err(format!("deleting bootstrap token {id}")))?;
    Ok(id)
}

/// Publishes `kube-public/cluster-info` (the server joining nodes use and the CA) and lets
/// anonymous users read it (kubeadm's `kubeadm:bootstrap-signer-clusterinfo` Role).
pub async fn publish_cluster_info(
    client: Client,
    server: &str,
    ca_pem: &str,
) -> Result<(), TokenError> {
    let pp = PatchParams::apply("minik8s-init").force();
    let kubeconfig = minik8s_kubeconfig::join::cluster_info_kubeconfig(server, ca_pem);
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CLUSTER_INFO, "namespace": CLUSTER_INFO_NAMESPACE},
        "data": {KUBECONFIG_KEY: kubeconfig},
    });
    Api::<ConfigMap>::namespaced(client.clone(), CLUSTER_INFO_NAMESPACE)
        .patch(CLUSTER_INFO, &pp, &Patch::Apply(&cm))
        .await
        .map_err(api_err("publishing cluster-info"))?;
    grant_get(
        client,
        CLUSTER_INFO_NAMESPACE,
        "kubeadm:bootstrap-signer-clusterinfo",
        ("configmaps", CLUSTER_INFO),
        &[("User", "system:anonymous")],
    )
    .await
    .map_err(api_err("granting anonymous reads of cluster-info"))?;
    Ok(())
}

/// A Role `role` in `namespace` allowing `get` of one object (resource, name), bound to
/// `subjects` (kind, name), both applied as `init`.
pub async fn grant_get(
    client: Client,
    namespace: &str,
    role: &str,
    (resource, name): (&str, &str),
    subjects: &[(&str, &str)],
) -> kube::Result<()> {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let pp = PatchParams::apply("minik8s-init").force();
    let body = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": role, "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": [resource], "resourceNames": [name], "verbs": ["get"]}],
    });
    Api::<Role>::namespaced(client.clone(), namespace)
        .patch(role, &pp, &Patch::Apply(&body))
        .await?;
    let subjects: Vec<_> = subjects
        .iter()
        .map(|(kind, name)| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}))
        .collect();
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": role, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": subjects,
    });
    Api::<RoleBinding>::namespaced(client, namespace)
        .patch(role, &pp, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// Waits (up to `timeout`) until the bootstrap signer has signed cluster-info with `token`,
/// so a join started at once finds the signature.
pub async fn wait_signed(client: Client, token: &Token, timeout: std::time::Duration) {
    let api = Api::<ConfigMap>::namespaced(client, CLUSTER_INFO_NAMESPACE);
    let key = format!("{}{}", bootstrap::JWS_PREFIX, token.id);
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if let Ok(cm) = api.get(CLUSTER_INFO).await
            && cm.data.is_some_and(|d| d.contains_key(&key))
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tracing::warn!(token = %token.id, "cluster-info is not signed with the new token yet (is the bootstrapsigner controller running?)");
}

/// The join command for `token`: the server cluster-info names, and the CA's pin.
pub async fn join_command(client: Client, token: &Token) -> Result<String, TokenError> {
    let cm = Api::<ConfigMap>::namespaced(client, CLUSTER_INFO_NAMESPACE)
        .get(CLUSTER_INFO)
        .await
        .map_err(api_err(
            "reading cluster-info (was the cluster made with `minik8s init`?)",
        ))?;
    let kubeconfig = cm
        .data
        .unwrap_or_default()
        .remove(KUBECONFIG_KEY)
        .unwrap_or_default();
    let (server, ca) = minik8s_kubeconfig::join::cluster_of(&kubeconfig)?;
    let hash = minik8s_kubeconfig::csr::ca_hash(&ca)?;
    Ok(format!(
        "minik8s join {server} --token {token} --discovery-token-ca-cert-hash {hash}"
    ))
}

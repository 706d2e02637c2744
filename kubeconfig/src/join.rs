//! Joining a cluster with a bootstrap token, as `kubeadm join` and the kubelet's TLS
//! bootstrap do:
//!
//! 1. **Discovery**: read `kube-public/cluster-info` anonymously without trusting the server
//!    yet, check the token's detached JWS over its kubeconfig (only someone who knows the
//!    token could have signed it) and the CA's public-key pin, then trust that CA.
//! 2. **TLS bootstrap**: authenticated by the token, post a CSR for `system:node:<name>` to
//!    the `kubernetes.io/kube-apiserver-client-kubelet` signer, wait until it is approved and
//!    issued, and write the node's own kubeconfig.

use crate::csr;
use crate::{Kubeconfig, kubeconfig::User};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use minik8s_types::bootstrap::{
    CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, JWS_PREFIX, KUBECONFIG_KEY, Token, verify_detached,
};
use std::path::Path;
use std::time::Duration;

/// Why a join failed; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The server could not be reached or answered with an error.
    #[error("reading cluster-info from {server}: {reason}")]
    Discovery {
        /// The server.
        server: String,
        /// What went wrong.
        reason: String,
    },
    /// cluster-info holds no signature for this token (unknown, expired or not for signing).
    #[error(
        "there is no JWS signed token in the cluster-info ConfigMap. This token id {0:?} is invalid for this cluster, or it has expired. Use \"minik8s token create\" on the control-plane node to create a new valid token"
    )]
    UnknownToken(String),
    /// The signature does not verify with this token.
    #[error(
        "failed to verify JWS signature of received cluster info object, can't trust this API Server"
    )]
    BadSignature,
    /// The CA is not the pinned one.
    #[error(
        "cluster CA found in cluster-info ConfigMap is invalid: none of the public keys \"{found}\" are pinned"
    )]
    CaNotPinned {
        /// The CA's own pin.
        found: String,
    },
    /// No pin was given, or one in the wrong form.
    #[error("invalid --discovery-token-ca-cert-hash {0:?}: want sha256:<64 hex digits>")]
    BadPin(String),
    /// The cluster-info kubeconfig is unusable.
    #[error("the cluster-info kubeconfig is invalid: {0}")]
    BadClusterInfo(String),
    /// The CSR was refused or failed.
    #[error("the node's certificate request {name} was {outcome}: {message}")]
    Refused {
        /// The CSR's name.
        name: String,
        /// `denied` or `failed`.
        outcome: &'static str,
        /// The condition's message.
        message: String,
    },
    /// The CSR was not issued in time.
    #[error(
        "the node's certificate request {0} was not issued in time (is the controller manager running its csrapproving and csrsigning controllers?)"
    )]
    Timeout(String),
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A certificate, key or kubeconfig could not be made or written.
    #[error(transparent)]
    Pki(#[from] crate::Error),
    /// A client could not be built.
    #[error(transparent)]
    Client(#[from] crate::ClientError),
}

/// What discovery found and verified: where the cluster is and the CA to trust.
#[derive(Clone, Debug)]
pub struct Discovery {
    /// The apiserver URL the join was given.
    pub server: String,
    /// The cluster's CA (PEM), checked against the pin.
    pub ca_pem: String,
}

/// Checks the pins' form (`sha256:<hex>`), lower-casing them.
pub fn parse_pins(pins: &[String]) -> Result<Vec<String>, JoinError> {
    if pins.is_empty() {
        return Err(JoinError::BadPin(String::new()));
    }
    pins.iter()
        .map(|p| {
            let hex = p.strip_prefix("sha256:").unwrap_or("");
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(format!("sha256:{}", hex.to_ascii_lowercase()))
            } else {
                Err(JoinError::BadPin(p.clone()))
            }
        })
        .collect()
}

/// The server and the CA (PEM) of a cluster-info kubeconfig.
pub fn cluster_of(kubeconfig: &str) -> Result<(String, String), JoinError> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| JoinError::BadClusterInfo(e.to_string()))?;
    let cluster = kc
        .clusters
        .into_iter()
        .next()
        .and_then(|c| c.cluster)
        .ok_or_else(|| JoinError::BadClusterInfo("no cluster".into()))?;
    let ca_b64 = cluster
        .certificate_authority_data
        .ok_or_else(|| JoinError::BadClusterInfo("no certificate-authority-data".into()))?;
    use base64::Engine;
    let ca_pem = base64::engine::general_purpose::STANDARD
        .decode(ca_b64.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            JoinError::BadClusterInfo("certificate-authority-data is not base64 PEM".into())
        })?;
    Ok((cluster.server.unwrap_or_default(), ca_pem))
}

/// Checks a cluster-info ConfigMap's `data` against the token and the pins; returns the CA.
pub fn verify_cluster_info(
    data: &std::collections::BTreeMap<String, String>,
    token: &Token,
    pins: &[String],
) -> Result<String, JoinError> {
    let kubeconfig = data
        .get(KUBECONFIG_KEY)
        .ok_or_else(|| JoinError::BadClusterInfo("no kubeconfig key".into()))?;
    let jws = data
        .get(&format!("{JWS_PREFIX}{}", token.id))
        .ok_or_else(|| JoinError::UnknownToken(token.id.clone()))?;
    if !verify_detached(kubeconfig, jws, token) {
        return Err(JoinError::BadSignature);
    }
    let (_, ca_pem) = cluster_of(kubeconfig)?;
    let found = csr::ca_hash(&ca_pem)?;
    if !pins.contains(&found) {
        return Err(JoinError::CaNotPinned { found });
    }
    Ok(ca_pem)
}

async fn client_of(kubeconfig_yaml: &str) -> Result<kube::Client, crate::ClientError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(30));
    Ok(kube::Client::try_from(config)?)
}

/// Discovery: reads cluster-info from `server` without trusting it, and verifies it. While
/// the server cannot be reached or has no signature for the token yet (the signer adds one
/// within a second of the token's creation), it tries again until `timeout`, as kubeadm does.
pub async fn discover(
    server: &str,
    token: &Token,
    pins: &[String],
    timeout: Duration,
) -> Result<Discovery, JoinError> {
    let pins = parse_pins(pins)?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match discover_once(server, token, &pins).await {
            Err(e @ (JoinError::UnknownToken(_) | JoinError::Discovery { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tracing::info!(reason = %e, "cluster-info not usable yet; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

async fn discover_once(
    server: &str,
    token: &Token,
    pins: &[String],
) -> Result<Discovery, JoinError> {
    let insecure = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: discovery\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: discovery\n  context:\n    cluster: discovery\n    user: anonymous\ncurrent-context: discovery\n"
    );
    let client = client_of(&insecure).await?;
    let cm = Api::<ConfigMap>::namespaced(client, CLUSTER_INFO_NAMESPACE)
        .get(CLUSTER_INFO)
        .await
        .map_err(|e| JoinError::Discovery {
            server: server.to_owned(),
            reason: e.to_string(),
        })?;
    let ca_pem = verify_cluster_info(&cm.data.unwrap_or_default(), token, pins)?;
    Ok(Discovery {
        server: server.to_owned(),
        ca_pem,
    })
}

/// A client trusting the discovered CA, authenticated by `user`.
pub async fn client(d: &Discovery, user_name: &str, user: User) -> Result<kube::Client, JoinError> {
    let kc = Kubeconfig::new("minik8s", &d.server, &d.ca_pem, user_name, user);
    let yaml = serde_yaml::to_string(&kc).map_err(|e| JoinError::BadClusterInfo(e.to_string()))?;
    Ok(client_of(&yaml).await?)
}

/// Posts a kubelet client CSR for `node` with `client` (the bootstrap token's, or the node's
/// own when renewing) and waits up to `timeout` for the certificate. Returns `(cert, key)` PEM.
pub async fn request_node_certificate(
    client: kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<(String, String), JoinError> {
    let (key, request) = csr::new_request(&format!("system:node:{node}"), &["system:nodes"])?;
    let cert = submit_request(
        client,
        node,
        &request,
        "kubernetes.io/kube-apiserver-client-kubelet",
        &["digital signature", "client auth"],
        timeout,
        None,
    )
    .await?;
    Ok((cert, key))
}

/// Posts the certificate request `request` (PEM) for `node` to `signer` with `usages`,
/// approves it with `approver` when given (a serving CSR, which nothing approves on its own),
/// and waits up to `timeout` for the certificate (PEM).
pub async fn submit_request(
    client: kube::Client,
    node: &str,
    request: &str,
    signer: &str,
    usages: &[&str],
    timeout: Duration,
    approver: Option<(&kube::Client, &str)>,
) -> Result<String, JoinError> {
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("node-csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.as_bytes().to_vec()),
            signer_name: signer.into(),
            usages: Some(usages.iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|source| JoinError::Api {
            what: "posting the node's certificate request",
            source,
        })?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, node, signer, "posted the node's certificate request");
    if let Some((approver, why)) = approver {
        let patch = serde_json::json!({"status": {"conditions": [{"type": "Approved", "status": "True",
            "reason": "AutoApproved", "message": why}]}});
        Api::<CertificateSigningRequest>::all(approver.clone())
            .patch_approval(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map_err(|source| JoinError::Api {
                what: "approving the node's certificate request",
                source,
            })?;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let now = api.get(&name).await.map_err(|source| JoinError::Api {
            what: "reading the node's certificate request",
            source,
        })?;
        let status = now.status.unwrap_or_default();
        for c in status.conditions.unwrap_or_default() {
            let outcome = match c.type_.as_str() {
                "Denied" => "denied",
                "Failed" => "failed",
                _ => continue,
            };
            return Err(JoinError::Refused {
                name,
                outcome,
                message: c.message.unwrap_or_default(),
            });
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            let cert = String::from_utf8(cert.0).map_err(|_| {
                JoinError::BadClusterInfo("the issued certificate is not PEM".into())
            })?;
            return Ok(cert);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(JoinError::Timeout(name));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes the node's kubeconfig (its own certificate, mode 0600).
pub fn write_node_kubeconfig(
    path: &Path,
    d: &Discovery,
    node: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<(), JoinError> {
    Kubeconfig::new(
        "minik8s",
        &d.server,
        &d.ca_pem,
        &format!("system:node:{node}"),
        Kubeconfig::cert_user(cert_pem, key_pem),
    )
    .write(path)?;
    Ok(())
}

/// The kubeconfig of the `cluster-info` ConfigMap: the server and the CA, no credentials.
pub fn cluster_info_kubeconfig(server: &str, ca_pem: &str) -> String {
    use base64::Engine;
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    certificate-authority-data: {}\n    server: {server}\ncontexts: []\ncurrent-context: \"\"\nusers: []\npreferences: {{}}\n",
        base64::engine::general_purpose::STANDARD.encode(ca_pem)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use minik8s_types::bootstrap::sign_detached;
    use std::collections::BTreeMap;

    #[test]
    fn cluster_info_is_trusted_only_with_the_token_and_the_pin() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::Pki::init(crate::PkiOptions {
            dir: dir.path().into(),
            cluster_name: "t".into(),
            server: "https://127.0.0.1:6443".into(),
            hostnames: vec![],
            ips: vec![],
        })
        .unwrap();
        let kc = cluster_info_kubeconfig("https://10.0.0.1:6443", pki.ca_pem());
        let token = Token::parse("abcdef.0123456789abcdef").unwrap();
        let pin = csr::ca_hash(pki.ca_pem()).unwrap();
        let data = BTreeMap::from([
            (KUBECONFIG_KEY.to_owned(), kc.clone()),
            (
                "jws-kubeconfig-abcdef".to_owned(),
                sign_detached(&kc, &token),
            ),
        ]);
        assert_eq!(
            verify_cluster_info(&data, &token, std::slice::from_ref(&pin)).unwrap(),
            pki.ca_pem()
        );
        let other = Token::parse("zzzzzz.0123456789abcdef").unwrap();
        assert!(matches!(
            verify_cluster_info(&data, &other, std::slice::from_ref(&pin)),
            Err(JoinError::UnknownToken(_))
        ));
        let wrong_secret = Token::parse("abcdef.0123456789abcdee").unwrap();
        assert!(matches!(
            verify_cluster_info(&data, &wrong_secret, std::slice::from_ref(&pin)),
            Err(JoinError::BadSignature)
        ));
        let wrong_pin = format!("sha256:{}", "0".repeat(64));
        assert!(matches!(
            verify_cluster_info(&data, &token, &[wrong_pin]),
            Err(JoinError::CaNotPinned { .. })
        ));
        assert!(parse_pins(&["sha256:abc".into()]).is_err());
        assert!(parse_pins(&[]).is_err());
        assert_eq!(
            parse_pins(&[pin.to_uppercase().replace("SHA256", "sha256")]).unwrap(),
            [pin]
        );
    }
}

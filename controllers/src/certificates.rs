//! The CertificateSigningRequest controllers, as upstream's:
//!
//! - `csrapproving` approves kubelet client CSRs (signer
//!   `kubernetes.io/kube-apiserver-client-kubelet`, subject `system:node:<name>` in
//!   `system:nodes`, client usages, no SANs) once a SubjectAccessReview says the requester may
//!   `create certificatesigningrequests/nodeclient` (a bootstrap token) or
//!   `…/selfnodeclient` (a node renewing its own certificate).
//! - `csrsigning` signs approved CSRs of the built-in signers with the cluster CA
//!   (`kube-apiserver-client-kubelet`, `kube-apiserver-client`, `kubelet-serving`); a request
//!   that breaks its signer's rules gets `Failed` with reason `SignerValidationFailure`.

use crate::driver::Driver;
use base64::Engine;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, ResourceExt};
use minik8s_kubeconfig::csr::{Request, Signer, parse_request};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Signer of kubelets' client certificates.
pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Signer of other clients' certificates.
pub const CLIENT: &str = "kubernetes.io/kube-apiserver-client";
/// Signer of kubelets' serving certificates.
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

/// Where the signing controller finds the cluster CA and how long its certificates last.
#[derive(Clone, Debug)]
pub struct SigningConfig {
    /// The CA certificate (`--cluster-signing-cert-file`).
    pub cert: PathBuf,
    /// The CA key (`--cluster-signing-key-file`).
    pub key: PathBuf,
    /// The longest validity it grants (`--cluster-signing-duration`, upstream 1 year).
    pub duration: Duration,
}

fn conditions(csr: &CertificateSigningRequest) -> Vec<&str> {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| cs.iter().map(|c| c.type_.as_str()).collect())
        .unwrap_or_default()
}

fn request_pem(csr: &CertificateSigningRequest) -> String {
    String::from_utf8_lossy(&csr.spec.request.0).into_owned()
}

fn usages(csr: &CertificateSigningRequest) -> Vec<String> {
    csr.spec.usages.clone().unwrap_or_default()
}

/// Why a request does not fit a kubelet's client or serving certificate; `None` if it does.
fn node_subject(req: &Request) -> Option<String> {
    if req.organizations != ["system:nodes"] {
        return Some("subject organization is not system:nodes".into());
    }
    if !req.common_name.starts_with("system:node:") || req.common_name.len() == 12 {
        return Some("subject common name does not begin with system:node:".into());
    }
    None
}

/// Whether `usages` are only from `allowed` and include `required`.
fn usages_fit(usages: &[String], allowed: &[&str], required: &str) -> Option<String> {
    if let Some(u) = usages.iter().find(|u| !allowed.contains(&u.as_str())) {
        return Some(format!("usage {u:?} is not allowed"));
    }
    if !usages.iter().any(|u| u == required) {
        return Some(format!("{required:?} usage is required"));
    }
    None
}

/// Why a request breaks its signer's rules (upstream's `ValidateKubeletClientCSR` and
/// friends); `None` when it may be signed.
pub fn signer_violation(signer: &str, req: &Request, usages: &[String]) -> Option<String> {
    let client = ["digital signature", "key encipherment", "client auth"];
    match signer {
        KUBELET_CLIENT => node_subject(req)
            .or_else(|| {
                (!req.dns_names.is_empty() || !req.ips.is_empty() || req.other_names)
                    .then(|| "subject alternative names are not allowed".to_owned())
            })
            .or_else(|| usages_fit(usages, &client, "client auth")),
        CLIENT => usages_fit(usages, &client, "client auth"),
        KUBELET_SERVING => node_subject(req)
            .or_else(|| {
                req.other_names
                    .then(|| "only DNS and IP subject alternative names are allowed".to_owned())
            })
            .or_else(|| {
                (req.dns_names.is_empty() && req.ips.is_empty())
                    .then(|| "at least one DNS or IP subject alternative name is required".into())
            })
            .or_else(|| {
                usages_fit(
                    usages,
                    &["digital signature", "key encipherment", "server auth"],
                    "server auth",
                )
            }),
        _ => Some(format!("{signer} is not a signer of this controller")),
    }
}

/// Runs the approver until `shutdown`.
pub async fn run_approver(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    Driver::<CertificateSigningRequest>::new("csrapproving", &informers)
        .await
        .run(approve, Arc::new(client), shutdown)
        .await;
}

/// Approves one kubelet client CSR its requester may create (upstream's csrapproving).
async fn approve(
    csr: Arc<CertificateSigningRequest>,
    client: Arc<Client>,
) -> crate::Result<Action> {
    let client = client.as_ref();
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let done = conditions(&csr);
    if csr.spec.signer_name != KUBELET_CLIENT
        || done.iter().any(|c| *c == "Approved" || *c == "Denied")
    {
        return Ok(Action::await_change());
    }
    let Ok(req) = parse_request(&request_pem(&csr)) else {
        return Ok(Action::await_change());
    };
    if signer_violation(KUBELET_CLIENT, &req, &usages(&csr)).is_some() {
        return Ok(Action::await_change());
    }
    let user = csr.spec.username.clone().unwrap_or_default();
    let own = user == req.common_name;
    let sub = if own { "selfnodeclient" } else { "nodeclient" };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.clone()),
            groups: csr.spec.groups.clone(),
            uid: csr.spec.uid.clone(),
            extra: csr.spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                subresource: Some(sub.into()),
                verb: Some("create".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    if !answer.status.is_some_and(|s| s.allowed) {
        tracing::debug!(csr = %csr.name_any(), %user, "not approving: the requester may not create {sub}");
        return Ok(Action::await_change());
    }
    let message = if own {
        "Auto approving self kubelet client certificate after SubjectAccessReview."
    } else {
        "Auto approving kubelet client certificate after SubjectAccessReview."
    };
    let mut conds: Vec<serde_json::Value> = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .filter_map(|c| serde_json::to_value(c).ok())
                .collect()
        })
        .unwrap_or_default();
    conds.push(json!({"type": "Approved", "status": "True", "reason": "AutoApproved",
                      "message": message, "lastUpdateTime": crate::util::rfc3339(jiff::Timestamp::now())}));
    let patch = json!({"metadata": {"resourceVersion": csr.resource_version()},
                       "status": {"conditions": conds}});
    match api
        .patch_subresource(
            "approval",
            &csr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(csr = %csr.name_any(), %user, "approved a kubelet client certificate")
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// Runs the signer until `shutdown`.
pub async fn run_signer(
    client: Client,
    cfg: SigningConfig,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let signer = match Signer::load(&cfg.cert, &cfg.key) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::error!(error = %e, "the CSR signer cannot load the cluster CA; no certificate will be issued");
            return;
        }
    };
    let ctx = Arc::new(SignCtx {
        client,
        cfg,
        signer,
    });
    Driver::<CertificateSigningRequest>::new("csrsigning", &informers)
        .await
        .run(sign, ctx, shutdown)
        .await;
}

struct SignCtx {
    client: Client,
    cfg: SigningConfig,
    signer: Arc<Signer>,
}

/// Issues (or refuses) the certificate of one approved CSR of a signer it serves.
async fn sign(csr: Arc<CertificateSigningRequest>, ctx: Arc<SignCtx>) -> crate::Result<Action> {
    let (client, cfg, signer) = (&ctx.client, &ctx.cfg, &ctx.signer);
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let done = conditions(&csr);
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    if ![KUBELET_CLIENT, CLIENT, KUBELET_SERVING].contains(&csr.spec.signer_name.as_str())
        || !done.contains(&"Approved")
        || done.contains(&"Denied")
        || done.contains(&"Failed")
        || issued
    {
        return Ok(Action::await_change());
    }
    let pem = request_pem(&csr);
    let usages = usages(&csr);
    let outcome = parse_request(&pem)
        .map_err(|e| e.to_string())
        .and_then(
            |req| match signer_violation(&csr.spec.signer_name, &req, &usages) {
                Some(why) => Err(why),
                None => Ok(()),
            },
        )
        .and_then(|()| {
            let max = cfg.duration.as_secs() as i64;
            let secs = csr
                .spec
                .expiration_seconds
                .map_or(max, |s| i64::from(s).min(max));
            signer.sign(&pem, &usages, secs).map_err(|e| e.to_string())
        });
    let status = match &outcome {
        Ok(cert) => {
            json!({"certificate": base64::engine::general_purpose::STANDARD.encode(cert)})
        }
        Err(why) => json!({"conditions": [{
            "type": "Failed", "status": "True", "reason": "SignerValidationFailure",
            "message": why, "lastUpdateTime": crate::util::rfc3339(jiff::Timestamp::now()),
        }]}),
    };
    let patch = json!({"metadata": {"resourceVersion": csr.resource_version()}, "status": status});
    match api
        .patch_status(
            &csr.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => match outcome {
            Ok(_) => {
                tracing::info!(csr = %csr.name_any(), signer = %csr.spec.signer_name, "issued a certificate")
            }
            Err(why) => tracing::info!(csr = %csr.name_any(), %why, "refused to sign"),
        },
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cn: &str) -> Request {
        Request {
            common_name: cn.into(),
            organizations: vec!["system:nodes".into()],
            ..Default::default()
        }
    }

    fn u(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_signer_keeps_to_its_rules() {
        let client = u(&["digital signature", "client auth"]);
        assert_eq!(
            signer_violation(KUBELET_CLIENT, &node("system:node:n1"), &client),
            None
        );
        assert!(signer_violation(KUBELET_CLIENT, &node("alice"), &client).is_some());
        let mut other_org = node("system:node:n1");
        other_org.organizations = vec!["system:masters".into()];
        assert!(signer_violation(KUBELET_CLIENT, &other_org, &client).is_some());
        let mut sans = node("system:node:n1");
        sans.dns_names = vec!["n1".into()];
        assert!(signer_violation(KUBELET_CLIENT, &sans, &client).is_some());
        assert!(
            signer_violation(
                KUBELET_CLIENT,
                &node("system:node:n1"),
                &u(&["server auth"])
            )
            .is_some()
        );
        // Serving certificates need a SAN and server auth.
        let serving = u(&["digital signature", "server auth"]);
        assert!(signer_violation(KUBELET_SERVING, &node("system:node:n1"), &serving).is_some());
        assert_eq!(signer_violation(KUBELET_SERVING, &sans, &serving), None);
        // Other clients: any subject, client usages.
        assert_eq!(signer_violation(CLIENT, &Request::default(), &client), None);
        assert!(signer_violation("example.com/x", &Request::default(), &client).is_some());
    }
}

//! Bootstrap tokens' two controllers, as upstream's:
//!
//! - `bootstrapsigner` keeps one detached JWS per signing token in the `kube-public/cluster-info`
//!   ConfigMap (`jws-kubeconfig-<id>`), so a joining node that knows a token can check that the
//!   cluster's kubeconfig (its server and CA) really comes from this cluster;
//! - `tokencleaner` deletes bootstrap token Secrets once they expire.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use minik8s_types::bootstrap::{
    CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, JWS_PREFIX, KUBECONFIG_KEY, NAMESPACE, SECRET_TYPE,
    TokenSecret, sign_detached,
};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The bootstrap token Secrets (kube-system, by type).
fn token_secrets(client: &Client, informers: &crate::informer::Informers) -> Store<Secret> {
    crate::informer::start(
        Api::<Secret>::namespaced(client.clone(), NAMESPACE),
        watcher::Config::default().fields(&format!("type={SECRET_TYPE}")),
        informers.tasks(),
        informers.shutdown(),
    )
}

fn decoded(secret: &Secret) -> Option<TokenSecret> {
    TokenSecret::from_secret(&serde_json::to_value(secret).ok()?)
}

/// The `jws-kubeconfig-<id>` entries `cluster-info` should hold for `kubeconfig`: one per
/// unexpired token that allows signing.
pub fn wanted_signatures(
    kubeconfig: &str,
    tokens: &[TokenSecret],
    now: i64,
) -> BTreeMap<String, String> {
    tokens
        .iter()
        .filter(|t| t.signing && !t.expired(now))
        .filter_map(|t| t.token.as_ref())
        .map(|t| {
            (
                format!("{JWS_PREFIX}{}", t.id),
                sign_detached(kubeconfig, t),
            )
        })
        .collect()
}

/// Runs the bootstrap signer until `shutdown`.
pub async fn run_signer(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let secrets = token_secrets(&client, &informers);
    let configmaps = crate::informer::start(
        Api::<ConfigMap>::namespaced(client.clone(), CLUSTER_INFO_NAMESPACE),
        watcher::Config::default().fields(&format!("metadata.name={CLUSTER_INFO}")),
        informers.tasks(),
        &shutdown,
    );
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), CLUSTER_INFO_NAMESPACE);
    loop {
        if let Err(e) = sign_pass(&api, &secrets, &configmaps).await {
            tracing::warn!(error = %e, "bootstrap signer pass failed");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

async fn sign_pass(
    api: &Api<ConfigMap>,
    secrets: &Store<Secret>,
    configmaps: &Store<ConfigMap>,
) -> crate::Result<()> {
    let Some(cm) = configmaps
        .state()
        .into_iter()
        .find(|c| c.name_any() == CLUSTER_INFO)
    else {
        return Ok(());
    };
    let data = cm.data.clone().unwrap_or_default();
    let Some(kubeconfig) = data.get(KUBECONFIG_KEY) else {
        return Ok(());
    };
    let tokens: Vec<TokenSecret> = secrets.state().iter().filter_map(|s| decoded(s)).collect();
    let wanted = wanted_signatures(kubeconfig, &tokens, jiff::Timestamp::now().as_second());
    let current: BTreeMap<String, String> = data
        .iter()
        .filter(|(k, _)| k.starts_with(JWS_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if wanted == current {
        return Ok(());
    }
    let mut patch = serde_json::Map::new();
    for k in current.keys().filter(|k| !wanted.contains_key(*k)) {
        patch.insert(k.clone(), serde_json::Value::Null);
    }
    for (k, v) in &wanted {
        patch.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    let body = serde_json::json!({
        "metadata": {"resourceVersion": cm.resource_version()},
        "data": patch,
    });
    match api
        .patch(CLUSTER_INFO, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => {
            tracing::info!(tokens = wanted.len(), "signed the cluster-info ConfigMap");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Runs the token cleaner until `shutdown`.
pub async fn run_cleaner(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let secrets = token_secrets(&client, &informers);
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    loop {
        let now = jiff::Timestamp::now().as_second();
        for s in secrets.state() {
            if s.metadata.deletion_timestamp.is_some()
                || !decoded(&s).is_some_and(|t| t.expired(now))
            {
                continue;
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: s.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&s.name_any(), &dp).await {
                Ok(_) => {
                    tracing::info!(secret = %s.name_any(), "deleted an expired bootstrap token")
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(secret = %s.name_any(), error = %e, "deleting an expired bootstrap token")
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minik8s_types::bootstrap::{Token, verify_detached};

    #[test]
    fn only_unexpired_signing_tokens_sign() {
        let t = |id: &str, signing: bool, exp: Option<&str>| TokenSecret {
            token: Token::parse(&format!("{id}.0123456789abcdef")),
            signing,
            expiration: exp.map(str::to_owned),
            ..Default::default()
        };
        let now = "2026-06-01T00:00:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_second();
        let tokens = [
            t("aaaaaa", true, None),
            t("bbbbbb", false, None),
            t("cccccc", true, Some("2026-01-01T00:00:00Z")),
            t("dddddd", true, Some("2027-01-01T00:00:00Z")),
        ];
        let wanted = wanted_signatures("kc", &tokens, now);
        assert_eq!(
            wanted.keys().collect::<Vec<_>>(),
            ["jws-kubeconfig-aaaaaa", "jws-kubeconfig-dddddd"]
        );
        let a = Token::parse("aaaaaa.0123456789abcdef").unwrap();
        assert!(verify_detached("kc", &wanted["jws-kubeconfig-aaaaaa"], &a));
    }
}

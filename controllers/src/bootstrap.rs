//! Bootstrap tokens' two controllers, as upstream's:
//!
//! - `bootstrapsigner` keeps one detached JWS per signing token in the `kube-public/cluster-info`
//!   ConfigMap (`jws-kubeconfig-<id>`), so a joining node that knows a token can check that the
//!   cluster's kubeconfig (its server and CA) really comes from this cluster;
//! - `tokencleaner` deletes bootstrap token Secrets once they expire.

use crate::driver::Driver;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use minik8s_types::bootstrap::{
    CLUSTER_INFO, CLUSTER_INFO_NAMESPACE, JWS_PREFIX, KUBECONFIG_KEY, NAMESPACE, SECRET_TYPE,
    TokenSecret, sign_detached,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What selects bootstrap token Secrets (in kube-system).
fn token_secrets() -> watcher::Config {
    watcher::Config::default().fields(&format!("type={SECRET_TYPE}"))
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

/// Runs the bootstrap signer until `shutdown`: `cluster-info` is signed again when it or a
/// token changes, and when a signing token expires.
pub async fn run_signer(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), CLUSTER_INFO_NAMESPACE);
    let cluster_info = watcher::Config::default().fields(&format!("metadata.name={CLUSTER_INFO}"));
    Driver::filtered("bootstrapsigner", &informers, configmaps, cluster_info)
        .watches_api(
            Api::<Secret>::namespaced(client.clone(), NAMESPACE),
            token_secrets(),
            |_| Some(ObjectRef::new(CLUSTER_INFO).within(CLUSTER_INFO_NAMESPACE)),
        )
        .run(sign, Arc::new(client), shutdown)
        .await;
}

/// Signs `cluster-info` with every unexpired signing token (and drops other signatures).
async fn sign(cm: Arc<ConfigMap>, client: Arc<Client>) -> crate::Result<Action> {
    let data = cm.data.clone().unwrap_or_default();
    let Some(kubeconfig) = data.get(KUBECONFIG_KEY) else {
        return Ok(Action::await_change());
    };
    let secrets = Api::<Secret>::namespaced(client.as_ref().clone(), NAMESPACE)
        .list(&ListParams::default().fields(&format!("type={SECRET_TYPE}")))
        .await?;
    let tokens: Vec<TokenSecret> = secrets.items.iter().filter_map(decoded).collect();
    let now = jiff::Timestamp::now().as_second();
    let wanted = wanted_signatures(kubeconfig, &tokens, now);
    // A signature goes when its token expires.
    let next = tokens
        .iter()
        .filter(|t| t.signing && !t.expired(now))
        .filter_map(|t| t.expiration.as_deref()?.parse::<jiff::Timestamp>().ok())
        .map(|at| (at.as_second() - now).max(1) as u64)
        .min()
        .map_or(Action::await_change(), |secs| {
            Action::requeue(Duration::from_secs(secs))
        });
    let current: BTreeMap<String, String> = data
        .iter()
        .filter(|(k, _)| k.starts_with(JWS_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if wanted == current {
        return Ok(next);
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
    let api = Api::<ConfigMap>::namespaced(client.as_ref().clone(), CLUSTER_INFO_NAMESPACE);
    match api
        .patch(CLUSTER_INFO, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => {
            tracing::info!(tokens = wanted.len(), "signed the cluster-info ConfigMap");
            Ok(next)
        }
        // It changed meanwhile: its new version comes through the watch.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

/// Runs the token cleaner until `shutdown`.
pub async fn run_cleaner(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    Driver::filtered("tokencleaner", &informers, secrets, token_secrets())
        .run(clean, Arc::new(client), shutdown)
        .await;
}

/// Deletes a bootstrap token Secret once it expires.
async fn clean(s: Arc<Secret>, client: Arc<Client>) -> crate::Result<Action> {
    let Some(token) = decoded(&s) else {
        return Ok(Action::await_change());
    };
    let now = jiff::Timestamp::now().as_second();
    if s.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if !token.expired(now) {
        return Ok(
            match token
                .expiration
                .as_deref()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            {
                Some(at) => {
                    Action::requeue(Duration::from_secs((at.as_second() - now).max(1) as u64))
                }
                None => Action::await_change(),
            },
        );
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: s.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match Api::<Secret>::namespaced(client.as_ref().clone(), NAMESPACE)
        .delete(&s.name_any(), &dp)
        .await
    {
        Ok(_) => tracing::info!(secret = %s.name_any(), "deleted an expired bootstrap token"),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
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

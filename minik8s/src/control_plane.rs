//! More control-plane machines on one etcd, as kubeadm's HA topology with external etcd:
//! `init --upload-certs` publishes the cluster's storage and the keys every control plane
//! shares (sealed with a certificate key, in Secret `kube-system/kubeadm-certs` owned by a
//! two-hour bootstrap token, so both expire together); `join --control-plane
//! --certificate-key K` verifies the cluster with the token and the CA pin, opens the keys,
//! and runs an apiserver, controller manager and the other control components on this
//! machine against the same etcd, beside the machine's node.

use crate::tokens::{self, TokenError};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use minik8s_kubeconfig::copycerts::{self, CopyError};
use minik8s_types::bootstrap::{NAMESPACE, NODE_GROUP};
use serde_json::json;
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;

/// The ConfigMap in `kube-system` naming the cluster's storage (key [`STORAGE_KEY`]):
/// `embedded` or `etcd://…`. Joining control planes read it with their bootstrap token.
pub const CONFIG: &str = "minik8s-config";
/// The storage's key in [`CONFIG`].
pub const STORAGE_KEY: &str = "storage";
const CONFIG_ROLE: &str = "minik8s:minik8s-config";
/// The file in a joined control-plane machine's data folder naming the cluster's storage:
/// a restart finds its keys and storage there instead of joining again.
const JOINED: &str = "control-plane-storage";
const MANAGER: &str = "minik8s-init";

/// Why a control-plane step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A token.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// Sealing or opening the shared keys.
    #[error(transparent)]
    Copy(#[from] CopyError),
    /// The shared keys are gone (expired with their token, or never uploaded).
    #[error(
        "error downloading the secret: Secret \"kubeadm-certs\" was not found in the \"kube-system\" Namespace. This Secret might have expired. Please, run `minik8s upload-certs` on a control plane to generate a new one"
    )]
    CertsGone,
    /// The cluster keeps its state in one process's embedded store.
    #[error(
        "the cluster's store is embedded in its first control-plane machine's process (`minik8s init` without --storage), which no other machine can share: more control-plane machines need the cluster on an etcd cluster (hack/etcd-cluster.sh, then `minik8s init --storage etcd://…`)"
    )]
    Embedded,
    /// The cluster was not made by `minik8s init` (no storage ConfigMap).
    #[error(
        "kube-system/minik8s-config is missing: control-plane machines join a cluster made with `minik8s init --storage etcd://…`"
    )]
    NoConfig,
}

fn api(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { what, source }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Publishes the cluster's storage (`embedded` or `etcd://…`) for joining control planes,
/// readable by bootstrap tokens and nodes (as kubeadm's `kubeadm-config` ConfigMap).
pub async fn publish_config(client: Client, storage: &str) -> Result<(), Error> {
    let pp = PatchParams::apply(MANAGER).force();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG, "namespace": NAMESPACE},
        "data": {STORAGE_KEY: storage},
    });
    Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .patch(CONFIG, &pp, &Patch::Apply(&cm))
        .await
        .map_err(api("publishing kube-system/minik8s-config"))?;
    tokens::grant_get(
        client,
        NAMESPACE,
        CONFIG_ROLE,
        ("configmaps", CONFIG),
        &[("Group", NODE_GROUP), ("Group", "system:nodes")],
    )
    .await
    .map_err(api("granting reads to joining control planes"))
}

/// The cluster's storage as published by `init`.
pub async fn cluster_storage(client: Client) -> Result<String, Error> {
    match Api::<ConfigMap>::namespaced(client, NAMESPACE)
        .get(CONFIG)
        .await
    {
        Ok(cm) => cm
            .data
            .and_then(|mut d| d.remove(STORAGE_KEY))
            .ok_or(Error::NoConfig),
        Err(e) if is_not_found(&e) => Err(Error::NoConfig),
        Err(e) => Err(api("reading kube-system/minik8s-config")(e)),
    }
}

/// Seals the shared keys of the PKI folder `pki_dir` under `key` (hex) into Secret
/// `kube-system/kubeadm-certs`, owned by a new bootstrap token that expires in two hours
/// (the garbage collector deletes the Secret with it), and lets bootstrap tokens read it.
/// Refused when the cluster's store is embedded.
pub async fn upload_certs(client: Client, pki_dir: &Path, key: &str) -> Result<(), Error> {
    let aes = copycerts::parse_key(key)?;
    if cluster_storage(client.clone()).await? == "embedded" {
        return Err(Error::Embedded);
    }
    let token = tokens::create_unusable(
        client.clone(),
        copycerts::TTL_SECONDS,
        copycerts::TOKEN_DESCRIPTION,
    )
    .await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    let owner = secrets
        .get(&token.secret_name())
        .await
        .map_err(api("reading the certificates' token"))?;
    let data: serde_json::Map<String, serde_json::Value> = copycerts::seal_dir(pki_dir, &aes)?
        .into_iter()
        .map(|(k, v)| {
            (
                k,
                serde_json::to_value(ByteString(v)).expect("bytes as base64"),
            )
        })
        .collect();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": copycerts::SECRET, "namespace": NAMESPACE,
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Secret",
                "name": token.secret_name(), "uid": owner.metadata.uid,
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "type": "Opaque",
        "data": data,
    });
    secrets
        .patch(
            copycerts::SECRET,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(api("storing kube-system/kubeadm-certs"))?;
    tokens::grant_get(
        client,
        NAMESPACE,
        copycerts::ROLE,
        ("secrets", copycerts::SECRET),
        &[("Group", NODE_GROUP)],
    )
    .await
    .map_err(api("granting reads to joining control planes"))
}

/// Opens the shared keys with `key` (hex) and writes them into the PKI folder `pki_dir`.
pub async fn download_certs(
    client: Client,
    key: &str,
    pki_dir: &Path,
) -> Result<Vec<PathBuf>, Error> {
    let aes = copycerts::parse_key(key)?;
    let secret = match Api::<Secret>::namespaced(client, NAMESPACE)
        .get(copycerts::SECRET)
        .await
    {
        Ok(s) => s,
        Err(e) if is_not_found(&e) => return Err(Error::CertsGone),
        Err(e) => return Err(api("error downloading the secret")(e)),
    };
    let data = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    Ok(copycerts::open_into(&data, &aes, pki_dir)?)
}

/// What a control-plane join needs besides the node's join.
pub struct ControlPlaneJoin {
    /// The certificate key `init --upload-certs` printed.
    pub certificate_key: String,
    /// The control plane to run here; its storage is filled in from the cluster's.
    pub up: crate::UpConfig,
}

/// `join --control-plane`: verifies the cluster with the token and the CA pin, checks it runs
/// on etcd, opens the shared keys into this machine's PKI folder, then runs the control plane
/// (apiserver on the cluster's etcd, controllers, elected where one must lead) and this
/// machine's node (as a plain join) until `shutdown`.
pub async fn join(
    node: crate::join::JoinConfig,
    mut plane: ControlPlaneJoin,
    shutdown: CancellationToken,
    ready: impl FnOnce(),
) -> anyhow::Result<()> {
    use anyhow::Context;
    let pki = plane.up.data_dir.join("pki");
    let marker = plane.up.data_dir.join(JOINED);
    let storage = match std::fs::read_to_string(&marker) {
        // Restarted on a machine that joined before: its keys and storage are here (the
        // certificate key may have been replaced, and the token may have expired, since).
        Ok(storage) if pki.join("ca.key").exists() => {
            tracing::info!(storage = %storage.trim(), "already joined as a control plane");
            storage.trim().to_owned()
        }
        _ => {
            let client = crate::join::verified_client(&node).await?;
            let storage = cluster_storage(client.clone()).await?;
            if storage == "embedded" {
                return Err(Error::Embedded.into());
            }
            let written = download_certs(client, &plane.certificate_key, &pki).await?;
            tracing::info!(
                files = written.len(),
                "[download-certs] the shared keys are in place"
            );
            std::fs::write(&marker, &storage)
                .with_context(|| format!("writing {}", marker.display()))?;
            storage
        }
    };
    plane.up.storage = Some(
        storage
            .parse()
            .with_context(|| format!("the cluster's storage {storage:?}"))?,
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    let up = minik8s_task::spawn(
        "up",
        crate::up(plane.up, shutdown.clone(), move |admin| {
            let _ = tx.send(admin.to_path_buf());
        }),
    );
    if rx.await.is_err() {
        return Ok(up.await.context("the control plane")??);
    }
    tracing::info!("this machine's apiserver answers; joining its node");
    let node_run = crate::join::run(node, shutdown.clone(), ready);
    let result = node_run.await;
    shutdown.cancel();
    up.await.context("the control plane")??;
    Ok(result?)
}

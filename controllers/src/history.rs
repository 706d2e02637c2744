//! ControllerRevision history of a workload's pod template, shared by the DaemonSet and
//! StatefulSet controllers (upstream's `controller/history`): one revision per distinct
//! template, named `<owner>-<hash>`, labelled like the template, holding the patch
//! `{"spec": {"template": {…, "$patch": "replace"}}}` that `kubectl rollout undo` applies. The
//! template in use always has the highest `revision`; returning to an older template bumps
//! its revision instead of copying it. The oldest revisions beyond the history limit go.

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// The label naming a pod's (and a ControllerRevision's) template hash.
pub const HASH_LABEL: &str = "controller-revision-hash";

/// The revision name of `owner`'s template with this hash.
pub fn name(owner: &str, hash: &str) -> String {
    format!("{owner}-{hash}")
}

/// The revisions `owner` controls, oldest first.
pub fn of<K: Resource>(
    owner: &K,
    revisions: &Store<ControllerRevision>,
) -> Vec<Arc<ControllerRevision>> {
    let ns = owner.meta().namespace.clone().unwrap_or_default();
    let uid = owner.meta().uid.clone().unwrap_or_default();
    let mut mine: Vec<Arc<ControllerRevision>> = revisions
        .state()
        .into_iter()
        .filter(|r| r.namespace().as_deref() == Some(ns.as_str()))
        .filter(|r| crate::util::controller_of(&r.metadata).is_some_and(|o| o.uid == uid))
        .collect();
    mine.sort_by_key(|r| r.revision);
    mine
}

/// The pod template a revision holds.
pub fn template(rev: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = rev.data.as_ref()?.0.pointer("/spec/template")?.clone();
    if let Some(m) = t.as_object_mut() {
        m.remove("$patch");
    }
    serde_json::from_value(t).ok()
}

/// Makes the revision of `template` (with `hash`) the newest of `owner`'s, creating it if
/// needed, and trims the history to `limit` older revisions.
pub async fn ensure<K>(
    client: &Client,
    owner: &K,
    template: &PodTemplateSpec,
    hash: &str,
    limit: i32,
    revisions: &Store<ControllerRevision>,
) -> crate::Result<()>
where
    K: Resource<DynamicType = ()>,
{
    let ns = owner.meta().namespace.clone().unwrap_or_default();
    let owner_name = owner.meta().name.clone().unwrap_or_default();
    let mine = of(owner, revisions);
    let newest = mine.last().map_or(0, |r| r.revision);
    let name = name(&owner_name, hash);
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    match mine.iter().find(|r| r.name_any() == name) {
        Some(r) if r.revision == newest => {}
        Some(r) => {
            let patch = json!({"revision": newest + 1});
            api.patch(
                &r.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
        None => {
            let mut labels = template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            labels.insert(HASH_LABEL.into(), hash.into());
            let mut data =
                json!({"spec": {"template": go_encoding(serde_json::to_value(template)?)}});
            data["spec"]["template"]["$patch"] = json!("replace");
            let rev: ControllerRevision = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels,
                             "ownerReferences": [crate::util::owner_ref(owner)]},
                "data": data,
                "revision": newest + 1,
            }))?;
            match api.create(&PostParams::default(), &rev).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let limit = limit.max(0) as usize;
    let old: Vec<&Arc<ControllerRevision>> = mine.iter().filter(|r| r.name_any() != name).collect();
    if old.len() > limit {
        for r in old.iter().take(old.len() - limit) {
            let _ = api.delete(&r.name_any(), &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// A pod template as Go's encoding writes it, which clients compare revisions' data with byte
/// for byte (upstream's `daemon.Match` marshals the DaemonSet's template): the template's
/// `metadata.creationTimestamp` is `null` and every container has `resources`, even empty.
fn go_encoding(mut template: serde_json::Value) -> serde_json::Value {
    if template.get("metadata").is_none_or(|m| !m.is_object()) {
        template["metadata"] = json!({});
    }
    template["metadata"]["creationTimestamp"] = serde_json::Value::Null;
    for list in ["containers", "initContainers"] {
        if let Some(cs) = template
            .pointer_mut(&format!("/spec/{list}"))
            .and_then(serde_json::Value::as_array_mut)
        {
            for c in cs {
                if c.get("resources").is_none() {
                    c["resources"] = json!({});
                }
            }
        }
    }
    template
}

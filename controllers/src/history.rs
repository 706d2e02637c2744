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
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), &ns);
    let mut data = json!({"spec": {"template": go_encoding(serde_json::to_value(template)?)}});
    data["spec"]["template"]["$patch"] = json!("replace");
    // The revisions of this template are those holding its data, whatever their names (a
    // client may have made one), as upstream's `Match`.
    let (current, old): (Vec<&Arc<ControllerRevision>>, Vec<&Arc<ControllerRevision>>) = mine
        .iter()
        .partition(|r| r.data.as_ref().map(|d| &d.0) == Some(&data));
    let next = old.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    match current.split_last() {
        // Several: the newest stays, the others go (upstream's dedup).
        Some((keep, extra)) => {
            for r in extra {
                match api.delete(&r.name_any(), &DeleteParams::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if keep.revision < next {
                let patch = json!({"revision": next});
                api.patch(
                    &keep.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            }
        }
        None => {
            let mut labels = template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            labels.insert(HASH_LABEL.into(), hash.into());
            // A name taken by other data (a collision) gets a counter, as upstream's
            // collisionCount changes the hash.
            for attempt in 0..8u32 {
                let rev_name = match attempt {
                    0 => name(&owner_name, hash),
                    n => name(&owner_name, &crate::util::hash_of(&(hash, n))[..10]),
                };
                let rev: ControllerRevision = serde_json::from_value(json!({
                    "metadata": {"name": rev_name, "labels": labels,
                                 "ownerReferences": [crate::util::owner_ref(owner)]},
                    "data": data,
                    "revision": next,
                }))?;
                match api.create(&PostParams::default(), &rev).await {
                    Ok(_) => break,
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        // Ours already (the informer lagged), or another template's: try on.
                        match api.get_opt(&rev_name).await? {
                            Some(r) if r.data.as_ref().map(|d| &d.0) == Some(&data) => break,
                            _ => continue,
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    let limit = limit.max(0) as usize;
    if old.len() > limit {
        for r in old.iter().take(old.len() - limit) {
            let _ = api.delete(&r.name_any(), &DeleteParams::default()).await;
        }
    }
    Ok(())
}

/// A pod template as Go's encoding writes it, which clients compare revisions' data with byte
/// for byte (upstream's `daemon.Match` marshals the DaemonSet's template): every container
/// has `resources`, even empty. (Since 1.33's `omitzero`, an unset `creationTimestamp` is
/// left out, as here.)
fn go_encoding(mut template: serde_json::Value) -> serde_json::Value {
    if template.get("metadata").is_none_or(|m| !m.is_object()) {
        template["metadata"] = json!({});
    }
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

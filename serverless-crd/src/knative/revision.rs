//! The Revision reconciler: a Knative Revision reports the Function revision of its name
//! (made from the same template): `ResourcesAvailable`, `ContainerHealthy` and `Ready` once a
//! pod of it was ready (or why it never will be), `Active` while it has pods, and its actual
//! and desired replicas, as Knative's revision controller reports them.

use super::types::{ContainerStatus, RevisionStatus};
use super::{Ctx, KRevision, condition};
use crate::reconcile::{Error, api};
use crate::revision::find;
use crate::types::FunctionRevision;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// The Knative Revision of the same name as `r`.
pub(crate) fn of_function_revision(r: Arc<FunctionRevision>) -> Option<ObjectRef<KRevision>> {
    Some(ObjectRef::new(&r.name_any()).within(&r.namespace()?))
}

pub(crate) async fn reconcile(r: Arc<KRevision>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = r.name_any();
    let ns = r.namespace().unwrap_or_default();
    let Some(fr) = ctx.fn_revisions.get(&ObjectRef::new(&name).within(&ns)) else {
        return Ok(Action::await_change());
    };
    let old = r.status.clone().unwrap_or_default();
    let fs = fr.status.clone().unwrap_or_default();
    let ready = find(&fs.conditions, "Ready");
    let (status, reason, message) = match ready {
        Some(c) if c.status == "True" => ("True", None, None),
        Some(c) if c.status == "False" => (
            "False",
            Some(c.reason.clone()).filter(|r| !r.is_empty()),
            Some(c.message.clone()).filter(|m| !m.is_empty()),
        ),
        _ => ("Unknown", Some("Deploying".to_owned()), None),
    };
    let same = |kind: &str| {
        condition(
            &old.conditions,
            kind,
            status,
            reason.as_deref(),
            message.clone(),
        )
    };
    let active = if fs.replicas > 0 {
        condition(&old.conditions, "Active", "True", None, None)
    } else {
        condition(
            &old.conditions,
            "Active",
            "False",
            Some("NoTraffic"),
            Some("The target is not receiving traffic.".into()),
        )
    };
    let next = RevisionStatus {
        observed_generation: r.metadata.generation,
        conditions: vec![
            active,
            same("ContainerHealthy"),
            same("Ready"),
            same("ResourcesAvailable"),
        ],
        container_statuses: r
            .spec
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| ContainerStatus {
                name: Some(if !c.name.is_empty() {
                    c.name.clone()
                } else if r.spec.containers.len() == 1 {
                    "user-container".to_owned()
                } else {
                    format!("user-container-{i}")
                }),
                image_digest: None,
            })
            .collect(),
        actual_replicas: Some(fs.ready_replicas),
        desired_replicas: Some(fs.replicas),
    };
    if r.status.as_ref() != Some(&next) {
        Api::<KRevision>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": next})),
            )
            .await
            .map_err(api("writing the Revision's status"))?;
    }
    Ok(Action::await_change())
}

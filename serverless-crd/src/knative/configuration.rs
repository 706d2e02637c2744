//! The Configuration reconciler: the Configuration runs as a Function of its name (runtime
//! `container`, the revision template as the pod, scale from Knative's annotations); each
//! revision the Function controller makes of it shows as a Knative Revision of the same name;
//! the status names the latest created and latest ready revisions, as Knative's
//! configuration controller reports them.

use super::types::ConfigurationStatus;
use super::{
    CONFIGURATION_GENERATION, CONFIGURATION_LABEL, Ctx, KConfiguration, KRevision, SERVICE_LABEL,
    condition,
};
use crate::reconcile::{Error, api};
use crate::revision::{find, is_ready};
use crate::runtime::FUNCTION_LABEL;
use crate::types::{Function, FunctionRevision};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const MANAGER: &str = "knative-configuration-controller";

/// Knative's autoscaling annotations on a revision template.
pub const MIN_SCALE: &str = "autoscaling.knative.dev/min-scale";
/// The most pods (0: no limit).
pub const MAX_SCALE: &str = "autoscaling.knative.dev/max-scale";
/// Requests per pod the autoscaler aims at.
pub const TARGET: &str = "autoscaling.knative.dev/target";
/// How long the autoscaler looks back (`60s`): the idle time before scaling to zero.
pub const WINDOW: &str = "autoscaling.knative.dev/window";

/// What the autoscaler measures (`concurrency` or `rps`).
pub const METRIC: &str = "autoscaling.knative.dev/metric";
/// The share of the target aimed at, in percent.
pub const TARGET_UTILIZATION: &str = "autoscaling.knative.dev/target-utilization-percentage";

/// Knative's default target (`container-concurrency-target-default`).
const DEFAULT_TARGET: f64 = 100.0;
/// Knative's default `requests-per-second-target-default`.
const DEFAULT_RPS_TARGET: f64 = crate::types::DEFAULT_RPS_TARGET;
/// Knative's default `container-concurrency-target-percentage` (and target utilization).
const DEFAULT_UTILIZATION: f64 = 0.7;
/// What "no limit" on pods comes to here.
const UNLIMITED_SCALE: i64 = 1000;
/// Knative's default request timeout (`revision-timeout-seconds`).
const DEFAULT_TIMEOUT: i64 = 300;
/// Revisions kept that take no traffic (Knative's `min-non-active-revisions` is 20).
const HISTORY: i32 = 20;

/// Seconds of a Go-style duration (`60s`, `2m`, `1m30s`), or `None`.
fn seconds(d: &str) -> Option<i64> {
    let mut total = 0i64;
    let mut number = String::new();
    for ch in d.trim().chars() {
        if ch.is_ascii_digit() {
            number.push(ch);
            continue;
        }
        let n: i64 = number.parse().ok()?;
        number.clear();
        total += match ch {
            'h' => n * 3600,
            'm' => n * 60,
            's' => n,
            _ => return None,
        };
    }
    if !number.is_empty() {
        return None;
    }
    Some(total)
}

/// The Function's `scale` for a revision template, as Knative's KPA resolves it: the metric
/// (`concurrency` or `rps`), its target (the annotation's, capped by `containerConcurrency`,
/// else `containerConcurrency`, else 100 requests or 200 a second) times the target
/// utilization (70 %), `containerConcurrency` as the hard limit a pod (0: none), the stable
/// window, and the bounds.
pub fn scale(template: &Value) -> Value {
    let ann = &template["metadata"]["annotations"];
    let int = |key: &str| ann[key].as_str().and_then(|v| v.trim().parse::<i64>().ok());
    let float = |key: &str| ann[key].as_str().and_then(|v| v.trim().parse::<f64>().ok());
    let min = int(MIN_SCALE).unwrap_or(0).max(0);
    let max = match int(MAX_SCALE).unwrap_or(0) {
        0 => UNLIMITED_SCALE,
        n => n,
    }
    .max(min.max(1));
    let concurrency = template["spec"]["containerConcurrency"]
        .as_i64()
        .unwrap_or(0)
        .max(0);
    let rps = ann[METRIC].as_str() == Some("rps");
    let mut total = match (rps, concurrency) {
        (true, _) => DEFAULT_RPS_TARGET,
        (false, 0) => DEFAULT_TARGET,
        (false, n) => n as f64,
    };
    if let Some(t) = float(TARGET) {
        total = if !rps && concurrency > 0 {
            t.min(concurrency as f64)
        } else {
            t
        };
    }
    let utilization = float(TARGET_UTILIZATION).map_or(DEFAULT_UTILIZATION, |p| p / 100.0);
    let target = (total * utilization).max(0.01);
    let window = ann[WINDOW].as_str().and_then(seconds).unwrap_or(60);
    json!({"minScale": min, "maxScale": max,
        "targetConcurrency": total.ceil().max(1.0) as i64,
        "containerConcurrency": concurrency,
        "metric": if rps { "rps" } else { "concurrency" },
        "target": target,
        "windowSeconds": window,
        "scaleToZeroAfterSeconds": window})
}

/// The Configurations whose Function made `r`.
pub(crate) fn of_function_revision(r: Arc<FunctionRevision>) -> Option<ObjectRef<KConfiguration>> {
    let function = r.labels().get(FUNCTION_LABEL)?;
    Some(ObjectRef::new(function).within(&r.namespace()?))
}

pub(crate) async fn reconcile(c: Arc<KConfiguration>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = c.name_any();
    let ns = c.namespace().unwrap_or_default();
    let owner = c
        .controller_owner_ref(&())
        .expect("a stored Configuration has a uid");
    let template = serde_json::to_value(&c.spec.template).unwrap_or_default();
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    labels.insert(CONFIGURATION_LABEL.to_owned(), name.clone());
    if let Some(service) = c.labels().get(SERVICE_LABEL) {
        labels.insert(SERVICE_LABEL.to_owned(), service.clone());
    }
    let image = template["spec"]["containers"][0]["image"].clone();
    let timeout = template["spec"]["timeoutSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_TIMEOUT)
        .max(1);
    let function = json!({
        "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "Function",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": [owner]},
        "spec": {"runtime": "container", "image": image, "template": template,
            "timeoutSeconds": timeout, "scale": scale(&template),
            "revisionHistoryLimit": HISTORY},
    });
    let pp = PatchParams::apply(MANAGER).force();
    // As the apply left it: the Function controller has made the revision of this template
    // once it observed this generation.
    let applied = Api::<Function>::namespaced(ctx.client.clone(), &ns)
        .patch(&name, &pp, &Patch::Apply(&function))
        .await
        .map_err(api("applying the Configuration's Function"))?;
    let observed =
        applied.status.as_ref().and_then(|s| s.observed_generation) == applied.metadata.generation;

    // A Knative Revision for each of the Function's revisions; none for those it removed.
    let made: Vec<Arc<FunctionRevision>> = ctx
        .fn_revisions
        .state()
        .into_iter()
        .filter(|r| {
            r.namespace().as_deref() == Some(ns.as_str())
                && r.labels().get(FUNCTION_LABEL) == Some(&name)
        })
        .collect();
    let status = applied.status.clone().unwrap_or_default();
    let revisions: Api<KRevision> = Api::namespaced(ctx.client.clone(), &ns);
    for r in &made {
        let rev = r.name_any();
        if ctx
            .revisions
            .get(&ObjectRef::new(&rev).within(&ns))
            .is_some()
        {
            continue;
        }
        let latest = status.latest_created_revision.as_deref() == Some(rev.as_str());
        let generation = if latest {
            c.metadata.generation.unwrap_or(1)
        } else {
            r.spec.generation
        };
        let frozen = r.spec.template.clone().unwrap_or_default();
        let mut rl: BTreeMap<String, String> = frozen["metadata"]["labels"]
            .as_object()
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        rl.extend(labels.clone());
        rl.insert(CONFIGURATION_GENERATION.to_owned(), generation.to_string());
        // Knative's revisions always carry annotations (clients such as `kn` add to them):
        // the template's, and when the revision's routing state was set.
        let mut annotations = frozen["metadata"]["annotations"].clone();
        if !annotations.is_object() {
            annotations = json!({});
        }
        annotations["serving.knative.dev/routingStateModified"] = json!(
            jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        );
        let revision = json!({
            "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
            "metadata": {"name": rev, "namespace": ns, "labels": rl,
                "annotations": annotations,
                "ownerReferences": [owner]},
            "spec": frozen["spec"],
        });
        let revision: KRevision = match serde_json::from_value(revision) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(revision = %rev, error = %e, "a revision's template does not parse");
                continue;
            }
        };
        match revisions.create(&PostParams::default(), &revision).await {
            Ok(_) => ctx.recorder.normal(
                &c.object_ref(&()),
                "RevisionCreated",
                format!("Created Revision \"{rev}\""),
            ),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(api("creating a Revision")(e)),
        }
    }
    for r in ctx.revisions.state() {
        let mine = r.namespace().as_deref() == Some(ns.as_str())
            && r.labels().get(CONFIGURATION_LABEL) == Some(&name);
        if mine && !made.iter().any(|m| m.name_any() == r.name_any()) {
            match revisions
                .delete(&r.name_any(), &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api("deleting a collected Revision")(e)),
            }
        }
    }

    // The status: the latest created and ready revisions; Ready when they are the same.
    let old = c.status.clone().unwrap_or_default();
    let latest_created = status.latest_created_revision.clone();
    let latest_ready = made
        .iter()
        .filter(|r| is_ready(r))
        .max_by_key(|r| crate::revision::order(&name, r))
        .map(|r| r.name_any())
        .or(status.latest_ready_revision.clone());
    // A revision name the template brings that a revision of another pod spec has already
    // (Knative's `CheckNameAvailability`): no revision for this generation.
    let taken = crate::revision::chosen_name(Some(&template)).filter(|n| {
        ctx.fn_revisions
            .get(&ObjectRef::new(n).within(&ns))
            .is_some_and(|r| crate::revision::name_taken(&r, &name, Some(&template)))
    });
    let failed = latest_created.as_deref().and_then(|n| {
        let r = made.iter().find(|r| r.name_any() == n)?;
        let c = find(&r.status.as_ref()?.conditions, "Ready")?;
        (c.status == "False").then(|| c.message.clone())
    });
    let ready = match (&latest_created, &latest_ready, failed) {
        _ if let Some(n) = taken => condition(
            &old.conditions,
            "Ready",
            "False",
            Some("RevisionFailed"),
            Some(format!(
                "Revision creation failed with message: revisions.serving.knative.dev \"{n}\" already exists."
            )),
        ),
        _ if !observed => condition(
            &old.conditions,
            "Ready",
            "Unknown",
            Some("OutOfDate"),
            Some("the revision of this template is being made".into()),
        ),
        (Some(c), Some(r), _) if c == r => condition(&old.conditions, "Ready", "True", None, None),
        (Some(c), _, Some(message)) => condition(
            &old.conditions,
            "Ready",
            "False",
            Some("RevisionFailed"),
            Some(format!("Revision \"{c}\" failed with message: {message}.")),
        ),
        _ => condition(&old.conditions, "Ready", "Unknown", None, None),
    };
    let next = ConfigurationStatus {
        observed_generation: c.metadata.generation,
        conditions: vec![ready],
        latest_created_revision_name: latest_created,
        latest_ready_revision_name: latest_ready,
    };
    if c.status.as_ref() != Some(&next) {
        Api::<KConfiguration>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": next})),
            )
            .await
            .map_err(api("writing the Configuration's status"))?;
    }
    let settled = observed
        && next.latest_created_revision_name.is_some()
        && next.latest_created_revision_name == next.latest_ready_revision_name;
    Ok(if settled {
        Action::await_change()
    } else {
        Action::requeue(Duration::from_secs(2))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knative_annotations_become_the_function_scale_as_the_kpa_resolves_them() {
        let t = json!({"metadata": {"annotations": {MIN_SCALE: "1", MAX_SCALE: "3",
            TARGET: "10", WINDOW: "1m30s"}}, "spec": {"containers": []}});
        assert_eq!(
            scale(&t),
            json!({"minScale": 1, "maxScale": 3, "targetConcurrency": 10,
                "containerConcurrency": 0, "metric": "concurrency", "target": 7.0,
                "windowSeconds": 90, "scaleToZeroAfterSeconds": 90})
        );
        // A hard limit of one: the target is 70 % of it, and no pod gets two requests.
        let hard = json!({"spec": {"containerConcurrency": 1}});
        assert_eq!(scale(&hard)["targetConcurrency"], 1);
        assert_eq!(scale(&hard)["containerConcurrency"], 1);
        assert_eq!(scale(&hard)["target"], 0.7);
        assert_eq!(scale(&hard)["maxScale"], UNLIMITED_SCALE);
        assert_eq!(scale(&hard)["scaleToZeroAfterSeconds"], 60);
        // A target above the hard limit is capped by it.
        let capped = json!({"metadata": {"annotations": {TARGET: "50"}},
            "spec": {"containerConcurrency": 10}});
        assert_eq!(scale(&capped)["target"], 7.0);
        // Unlimited by default, aiming at 70 of Knative's 100.
        let plain = json!({"spec": {}});
        assert_eq!(scale(&plain)["containerConcurrency"], 0);
        assert_eq!(scale(&plain)["target"], 70.0);
        // Requests a second: 200 by default, or the annotation's, at the utilization given.
        let rps = json!({"metadata": {"annotations": {METRIC: "rps", TARGET: "20",
            TARGET_UTILIZATION: "50"}}, "spec": {"containerConcurrency": 5}});
        assert_eq!(scale(&rps)["metric"], "rps");
        assert_eq!(scale(&rps)["target"], 10.0);
        let rps_default = json!({"metadata": {"annotations": {METRIC: "rps"}}});
        assert_eq!(scale(&rps_default)["target"], 140.0);
        assert_eq!(seconds("2m"), Some(120));
        assert_eq!(seconds("6"), None);
    }
}

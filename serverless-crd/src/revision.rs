//! Revisions and traffic, as Knative Serving's Configuration → Revision → Route for this
//! project's Functions.
//!
//! - Every change to what a Function runs (code, handler, runtime, image, env, resources,
//!   timeout, placement) makes an immutable [`FunctionRevision`] `<function>-00001`, `-00002`,
//!   … with a frozen copy of the code (a ConfigMap owned by the revision). Scale settings and
//!   traffic are not part of a revision.
//! - Each revision runs as its own Deployment `fn-<revision>` (owned by the revision) and
//!   scales 0 → N → 0 on its own traffic (the gateway's autoscaler). A revision after the
//!   first starts with one pod, so that it proves it can serve before it takes traffic.
//! - A revision is `Ready` once a pod of it was ready (it stays Ready at zero), and `Ready=False`
//!   for good when its code does not load: it then takes no traffic and has no pods.
//! - The Function's `spec.traffic` is resolved into `status.traffic` with every target's
//!   revision named; the gateway splits calls by it. With no `traffic`, all calls go to the
//!   latest ready revision (the latest created while none has been ready).
//! - Revisions that take traffic carry the [`FINALIZER`]: deleting one leaves it serving until
//!   its traffic moves, and says so (an event and its `Ready` message naming the Function).
//! - Revisions taking no traffic beyond the newest `revisionHistoryLimit` are deleted (with
//!   their Deployments and code, by their owner references).

use crate::reconcile::{Error, api, condition, hash};
use crate::runtime::{CODE_HASH, FUNCTION_LABEL, RUNTIME_PORT, python_image};
use crate::types::{
    ConfigMapKey, Function, FunctionRevision, FunctionRevisionSpec, FunctionRevisionStatus,
    Placement, REVISION_LABEL, Runtime, TrafficTarget,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// Kept on a revision while it takes traffic: deleting it waits until its traffic moves.
pub const FINALIZER: &str = "serverless.minik8s.io/traffic";
/// The replicas a revision's Deployment is created with (the first revision of a function:
/// `minScale`; later ones at least 1, to become Ready before they take traffic).
pub const INITIAL_SCALE: &str = "serverless.minik8s.io/initial-scale";

/// The name of revision `n` of `function`.
pub fn revision_name(function: &str, n: u32) -> String {
    format!("{function}-{n:05}")
}

/// The number of a revision of `function` (`add-00012` → 12).
pub fn revision_number(function: &str, revision: &str) -> Option<u32> {
    let n = revision.strip_prefix(function)?.strip_prefix('-')?;
    (n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
}

/// Where a revision of `function` stands among its siblings, oldest first: by the Function's
/// generation it was made at, then by its number (a name the user chose has none).
pub fn order(function: &str, r: &FunctionRevision) -> (i64, u32) {
    (
        r.spec.generation,
        revision_number(function, &r.name_any()).unwrap_or(0),
    )
}

/// The revision name a Knative template brings (`spec.template.metadata.name`), if any.
pub fn chosen_name(template: Option<&Value>) -> Option<&str> {
    template?["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
}

/// Whether revision `existing`, of the name `template` brings, cannot be that template's
/// revision: it belongs to another function, or runs another pod spec (Knative's
/// `CheckNameAvailability`; annotations alone may differ).
pub fn name_taken(existing: &FunctionRevision, function: &str, template: Option<&Value>) -> bool {
    let frozen = existing.spec.template.as_ref().map(|t| &t["spec"]);
    existing.spec.function != function || frozen != template.map(|t| &t["spec"])
}

/// The name of a revision's Deployment (and of its code ConfigMap).
pub fn deployment_name(revision: &str) -> String {
    format!("fn-{revision}")
}

/// The module file the handler names (`main.handler` → `main.py`).
pub fn module_file(handler: &str) -> String {
    let module = handler.rsplit_once('.').map_or("main", |(m, _)| m);
    format!("{}.py", module.replace('.', "/"))
}

/// What a revision of `f` with `code` would run (its code not yet placed), and its hash.
pub fn spec_for(f: &Function, code: Option<&str>) -> FunctionRevisionSpec {
    let s = &f.spec;
    let mut spec = FunctionRevisionSpec {
        function: f.name_any(),
        generation: f.metadata.generation.unwrap_or(0),
        code_hash: String::new(),
        runtime: s.runtime,
        image: s.image.clone(),
        template: s.template.clone(),
        code: None,
        handler: s.handler.clone(),
        env: s.env.clone(),
        resources: s.resources.clone(),
        timeout_seconds: s.timeout_seconds,
        placement: s.placement,
    };
    let env = serde_json::to_string(&spec.env).unwrap_or_default();
    let resources = serde_json::to_string(&spec.resources).unwrap_or_default();
    let runtime = serde_json::to_string(&spec.runtime).unwrap_or_default();
    let placement = serde_json::to_string(&spec.placement).unwrap_or_default();
    let template = spec
        .template
        .as_ref()
        .map(Value::to_string)
        .unwrap_or_default();
    spec.code_hash = hash(&[
        code.unwrap_or_default(),
        &template,
        &spec.handler,
        spec.image.as_deref().unwrap_or_default(),
        &env,
        &resources,
        &runtime,
        &placement,
        &spec.timeout_seconds.to_string(),
    ]);
    spec
}

/// A condition of `type_` in `conditions`, if any.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a revision became ready (it then stays so, at zero too).
pub fn is_ready(r: &FunctionRevision) -> bool {
    r.status
        .as_ref()
        .and_then(|s| find(&s.conditions, "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Python's message when the revision's code does not load (it never will: it is frozen).
pub fn load_error(r: &FunctionRevision) -> Option<String> {
    r.status
        .as_ref()
        .and_then(|s| find(&s.conditions, "Ready"))
        .filter(|c| c.status == "False" && c.reason == "ImportError")
        .map(|c| c.message.clone())
}

/// Why `spec.traffic` could not be resolved.
#[derive(Debug, PartialEq, Eq)]
pub enum Unresolved {
    /// A `revisionName` that is not a revision of the function.
    RevisionMissing(String),
    /// `latestRevision: true` while no revision exists yet.
    NoRevision,
}

/// Resolves a function's `traffic` into targets that all name a revision: `latest` is the
/// latest ready revision (or the latest created while none has been ready), `exists` tells
/// whether a revision of the function exists, and tags get their URL under `url`.
pub fn resolve(
    traffic: &[TrafficTarget],
    latest: Option<&str>,
    exists: impl Fn(&str) -> bool,
    url: &str,
) -> Result<Vec<TrafficTarget>, Unresolved> {
    if traffic.is_empty() {
        let latest = latest.ok_or(Unresolved::NoRevision)?;
        return Ok(vec![TrafficTarget {
            revision_name: Some(latest.to_owned()),
            latest_revision: Some(true),
            percent: Some(100),
            ..TrafficTarget::default()
        }]);
    }
    traffic
        .iter()
        .map(|t| {
            let revision = match (&t.revision_name, t.latest_revision) {
                (Some(name), _) if exists(name) => name.clone(),
                (Some(name), _) => return Err(Unresolved::RevisionMissing(name.clone())),
                (None, _) => latest.ok_or(Unresolved::NoRevision)?.to_owned(),
            };
            Ok(TrafficTarget {
                revision_name: Some(revision),
                latest_revision: Some(t.latest_revision.unwrap_or(false)),
                percent: t.percent.or(Some(0)),
                url: t.tag.as_ref().map(|tag| format!("{url}@{tag}")),
                tag: t.tag.clone(),
            })
        })
        .collect()
}

/// What a revision shows in its TRAFFIC column: `90%`, `10% @canary`, `@stable`; `None` when
/// it takes none and has no tag.
pub fn traffic_of(resolved: &[TrafficTarget], revision: &str) -> Option<String> {
    let mine: Vec<&TrafficTarget> = resolved
        .iter()
        .filter(|t| t.revision_name.as_deref() == Some(revision))
        .collect();
    let percent: i64 = mine.iter().filter_map(|t| t.percent).sum();
    let tags: Vec<String> = mine
        .iter()
        .filter_map(|t| t.tag.as_ref().map(|t| format!("@{t}")))
        .collect();
    if percent == 0 && tags.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    if percent > 0 {
        parts.push(format!("{percent}%"));
    }
    parts.extend(tags);
    Some(parts.join(" "))
}

/// Picks a target by weight for a number `roll` in `0..100`: the revision it names.
pub fn pick(resolved: &[TrafficTarget], roll: u32) -> Option<&str> {
    let mut left = roll as i64;
    for t in resolved {
        let p = t.percent.unwrap_or(0);
        if p <= 0 {
            continue;
        }
        if left < p {
            return t.revision_name.as_deref();
        }
        left -= p;
    }
    None
}

/// The revision a tag names.
pub fn tagged<'a>(resolved: &'a [TrafficTarget], tag: &str) -> Option<&'a str> {
    resolved
        .iter()
        .find(|t| t.tag.as_deref() == Some(tag))
        .and_then(|t| t.revision_name.as_deref())
}

/// Makes revision `name` of `f` running `spec`, with its frozen `code` (python3) in a ConfigMap
/// it owns, starting with `initial` pods.
pub async fn create(
    client: &Client,
    f: &Function,
    name: &str,
    mut spec: FunctionRevisionSpec,
    code: Option<&str>,
    initial: i32,
) -> Result<FunctionRevision, Error> {
    let ns = f.namespace().unwrap_or_default();
    let function = f.name_any();
    let owner = f
        .controller_owner_ref(&())
        .expect("a stored Function has a uid");
    let key = module_file(&spec.handler);
    if spec.runtime == Runtime::Python3 {
        spec.code = Some(ConfigMapKey {
            name: deployment_name(name),
            key: key.clone(),
        });
    }
    let mut revision = FunctionRevision::new(name, spec);
    revision.metadata.namespace = Some(ns.clone());
    revision.metadata.owner_references = Some(vec![owner]);
    revision.metadata.labels = Some(
        [
            (FUNCTION_LABEL.to_owned(), function.clone()),
            (REVISION_LABEL.to_owned(), name.to_owned()),
        ]
        .into(),
    );
    revision.metadata.annotations = Some([(INITIAL_SCALE.to_owned(), initial.to_string())].into());
    let revisions: Api<FunctionRevision> = Api::namespaced(client.clone(), &ns);
    let made = revisions
        .create(&PostParams::default(), &revision)
        .await
        .map_err(api("creating a revision"))?;
    if made.spec.runtime == Runtime::Python3 {
        let owner = made
            .controller_owner_ref(&())
            .expect("a stored revision has a uid");
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": deployment_name(name), "namespace": ns,
                "ownerReferences": [owner],
                "labels": {FUNCTION_LABEL: function, REVISION_LABEL: name}},
            "data": {key: code.unwrap_or_default()},
        });
        let cm: ConfigMap = serde_json::from_value(cm).expect("a ConfigMap");
        match Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &cm)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(api("freezing a revision's code")(e)),
        }
    }
    Ok(made)
}

/// The port a revision's pods serve calls on: a Knative container's `containerPort` (the
/// first container that has one), else [`RUNTIME_PORT`].
pub fn serving_port(template: Option<&Value>) -> i32 {
    template
        .and_then(|t| t["spec"]["containers"].as_array())
        .into_iter()
        .flatten()
        .find_map(|c| c["ports"][0]["containerPort"].as_i64())
        .and_then(|p| i32::try_from(p).ok())
        .unwrap_or(RUNTIME_PORT)
}

/// The pod template of a Knative revision (runtime `container`), as Knative's revision
/// controller makes it without its queue proxy: the user's pod spec, the serving container
/// named `user-container` when unnamed and given `PORT`, a TCP readiness probe on its port
/// unless it has a probe of its own, images used as present (Knative runs digests resolved
/// at the revision's creation, which never change under it), and the template's labels and
/// annotations on the pods.
fn container_template(r: &FunctionRevision, template: &Value) -> Value {
    let spec = &r.spec;
    let name = r.name_any();
    let port = serving_port(Some(template));
    let mut pod = template["spec"].clone();
    if !pod.is_object() {
        pod = json!({});
    }
    let serving = pod["containers"]
        .as_array()
        .and_then(|cs| cs.iter().position(|c| c["ports"].is_array()))
        .unwrap_or(0);
    let count = pod["containers"].as_array().map_or(0, Vec::len);
    if let Some(containers) = pod["containers"].as_array_mut() {
        for (i, c) in containers.iter_mut().enumerate() {
            if c["name"].as_str().is_none_or(str::is_empty) {
                c["name"] = json!(if count == 1 {
                    "user-container".to_owned()
                } else {
                    format!("user-container-{i}")
                });
            }
            if c.get("imagePullPolicy").is_none() {
                c["imagePullPolicy"] = json!("IfNotPresent");
            }
            if i != serving {
                continue;
            }
            let mut env = c["env"].as_array().cloned().unwrap_or_default();
            if !env.iter().any(|e| e["name"] == "PORT") {
                env.push(json!({"name": "PORT", "value": port.to_string()}));
            }
            for (k, v) in [
                ("K_REVISION", name.clone()),
                ("K_CONFIGURATION", spec.function.clone()),
            ] {
                if !env.iter().any(|e| e["name"] == k) {
                    env.push(json!({"name": k, "value": v}));
                }
            }
            c["env"] = json!(env);
            if c["ports"][0]["containerPort"].is_null() {
                c["ports"] = json!([{"name": "http1", "containerPort": port}]);
            }
            if c.get("readinessProbe").is_none() {
                c["readinessProbe"] = json!({"tcpSocket": {"port": port},
                    "periodSeconds": 1, "failureThreshold": 3, "successThreshold": 1});
            }
        }
    }
    for k in [
        "containerConcurrency",
        "timeoutSeconds",
        "responseStartTimeoutSeconds",
        "idleTimeoutSeconds",
    ] {
        if let Some(o) = pod.as_object_mut() {
            o.remove(k);
        }
    }
    if pod.get("enableServiceLinks").is_none() {
        pod["enableServiceLinks"] = json!(false);
    }
    pod["terminationGracePeriodSeconds"] = json!(spec.timeout_seconds + 2);
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels[FUNCTION_LABEL] = json!(spec.function);
    labels[REVISION_LABEL] = json!(name);
    let mut annotations = template["metadata"]["annotations"].clone();
    if !annotations.is_object() {
        annotations = json!({});
    }
    annotations[CODE_HASH] = json!(spec.code_hash);
    json!({"metadata": {"labels": labels, "annotations": annotations}, "spec": pod})
}

/// The pod template of a revision.
fn template(r: &FunctionRevision) -> Value {
    let spec = &r.spec;
    let name = r.name_any();
    if let (Runtime::Container, Some(t)) = (spec.runtime, &spec.template) {
        return container_template(r, t);
    }
    let mut env = vec![
        json!({"name": "FUNCTION_HANDLER", "value": spec.handler}),
        json!({"name": "FUNCTION_TIMEOUT_SECONDS", "value": spec.timeout_seconds.to_string()}),
    ];
    env.extend(
        spec.env
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or(Value::Null)),
    );
    let (image, volumes, mounts) = match (&spec.runtime, &spec.code) {
        (Runtime::Python3, Some(code)) => (
            python_image(),
            json!([{"name": "code", "configMap": {"name": code.name,
                "items": [{"key": code.key, "path": module_file(&spec.handler)}]}}]),
            json!([{"name": "code", "mountPath": "/code", "readOnly": true}]),
        ),
        (Runtime::Python3, None) => (python_image(), json!([]), json!([])),
        (Runtime::Image | Runtime::Container, _) => {
            (spec.image.clone().unwrap_or_default(), json!([]), json!([]))
        }
    };
    let mut container = json!({
        "name": "function",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": RUNTIME_PORT}],
        "env": env,
        "volumeMounts": mounts,
    });
    if spec.runtime == Runtime::Python3 && spec.placement == Placement::Pod {
        // Ready once the code has loaded (the runtime's /healthz is 503 while it does not):
        // a revision is Ready, and takes traffic, only then.
        container["readinessProbe"] = json!({
            "httpGet": {"path": "/healthz", "port": RUNTIME_PORT},
            "periodSeconds": 1, "failureThreshold": 1,
        });
    }
    if let Some(res) = &spec.resources {
        container["resources"] = serde_json::to_value(res).unwrap_or(Value::Null);
    }
    let mut template = json!({
        "metadata": {
            "labels": {FUNCTION_LABEL: spec.function, REVISION_LABEL: name},
            "annotations": {CODE_HASH: spec.code_hash},
        },
        "spec": {
            "containers": [container],
            "volumes": volumes,
            // A pod being removed gets no new requests from the gateway and finishes the one
            // in hand (the runtime exits after it on SIGTERM) within the function's timeout.
            "terminationGracePeriodSeconds": spec.timeout_seconds + 2,
            "enableServiceLinks": false,
        },
    });
    if spec.placement == Placement::Module {
        crate::modules::module_template(&mut template, &r.namespace().unwrap_or_default());
    }
    template
}

/// What the revision controller needs.
pub(crate) struct Ctx {
    pub client: Client,
    pub functions: Store<Function>,
    pub recorder: minik8s_events::Recorder,
}

/// Reconciles one revision: its Deployment, whether it is Ready (or never will be), its
/// share of traffic, and the finalizer that keeps it while it takes traffic.
pub(crate) async fn reconcile(r: Arc<FunctionRevision>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = r.namespace().unwrap_or_default();
    let name = r.name_any();
    let revisions: Api<FunctionRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let function = ctx
        .functions
        .get(&ObjectRef::new(&r.spec.function).within(&ns))
        .filter(|f| {
            r.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == f.metadata.uid.as_ref())
        });
    let resolved = function
        .as_ref()
        .and_then(|f| f.status.as_ref())
        .map_or(&[][..], |s| s.traffic.as_slice());
    let traffic = traffic_of(resolved, &name);
    let routed = traffic.is_some();
    let has_finalizer = r.finalizers().iter().any(|f| f == FINALIZER);
    if routed != has_finalizer {
        let mut finalizers: Vec<String> = r
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        if routed {
            finalizers.push(FINALIZER.to_owned());
        }
        let patch = json!({"metadata": {"finalizers": finalizers,
            "resourceVersion": r.resource_version()}});
        match revisions
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                return Ok(Action::requeue(Duration::from_millis(100)));
            }
            Err(e) => return Err(api("updating a revision's finalizers")(e)),
        }
    }
    if r.metadata.deletion_timestamp.is_some() {
        if routed {
            let f = r.spec.function.as_str();
            ctx.recorder.warning(
                &r.object_ref(&()),
                "DeletionBlocked",
                format!(
                    "revision {name} takes {} of Function {ns}/{f}'s traffic: it is deleted once \
                     the Function's traffic no longer names it (kubectl fn traffic {f} --to …)",
                    traffic.as_deref().unwrap_or_default()
                ),
            );
        }
        return Ok(Action::requeue(Duration::from_secs(5)));
    }

    // Its Deployment, made once (a revision never changes); replicas are the autoscaler's.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let child = deployment_name(&name);
    let deployment = match deployments
        .get_opt(&child)
        .await
        .map_err(api("reading a revision's Deployment"))?
    {
        Some(d) => d,
        None => {
            let owner = r
                .controller_owner_ref(&())
                .expect("a stored revision has a uid");
            let initial: i32 = r
                .annotations()
                .get(INITIAL_SCALE)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let initial = if load_error(&r).is_some() { 0 } else { initial };
            let d: Deployment = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": child, "namespace": ns, "ownerReferences": [owner],
                    "labels": {FUNCTION_LABEL: r.spec.function, REVISION_LABEL: name}},
                "spec": {
                    "replicas": initial,
                    "selector": {"matchLabels": {REVISION_LABEL: name}},
                    "template": template(&r),
                    "strategy": {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 0}},
                },
            }))
            .expect("a Deployment");
            match deployments.create(&PostParams::default(), &d).await {
                Ok(d) => {
                    ctx.recorder.normal(
                        &r.object_ref(&()),
                        "Created",
                        format!("Deployment {child} with {initial} pod(s)"),
                    );
                    d
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Ok(Action::requeue(Duration::from_millis(200)));
                }
                Err(e) => return Err(api("creating a revision's Deployment")(e)),
            }
        }
    };
    let ds = deployment.status.clone().unwrap_or_default();
    let replicas = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(0);

    // Ready: once a pod was ready. Never: when the code does not load (frozen, so for good).
    let old = r.status.clone().unwrap_or_default();
    let has_pods = replicas > 0 || ds.replicas.unwrap_or(0) > 0;
    let failed = match load_error(&r) {
        Some(m) => Some(m),
        None if !is_ready(&r) && has_pods => load_failure(&ctx.client, &r).await?,
        None => None,
    };
    let ready_now = ds.ready_replicas.unwrap_or(0) > 0;
    let (status, reason, message) = match (&failed, is_ready(&r) || ready_now) {
        (Some(m), _) => (false, "ImportError", m.clone()),
        (None, true) => (true, "Ready", "a pod of it served".to_owned()),
        (None, false) => (
            false,
            "NotYetReady",
            "no pod of it has been ready yet".to_owned(),
        ),
    };
    if failed.is_some() && replicas != 0 {
        // Its pods would only fail again.
        deployments
            .patch_scale(
                &child,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .map_err(api("scaling a revision whose code does not load to zero"))?;
        ctx.recorder.warning(
            &r.object_ref(&()),
            "ImportError",
            format!("the code does not load, scaled to zero: {}", message),
        );
    }
    let mut conditions = Vec::new();
    let ready = condition(&old.conditions, "Ready", status, reason, message, None);
    if !status && reason == "NotYetReady" {
        // Unknown rather than False: it may still come up.
        conditions.push(Condition {
            status: "Unknown".into(),
            ..ready
        });
    } else {
        conditions.push(ready);
    }
    let next = FunctionRevisionStatus {
        replicas: ds.replicas.unwrap_or(0),
        ready_replicas: ds.ready_replicas.unwrap_or(0),
        traffic,
        conditions,
    };
    if r.status.as_ref() != Some(&next) {
        let became_ready = status && !is_ready(&r);
        let patch = json!({"metadata": {"resourceVersion": r.resource_version()}, "status": next});
        match revisions
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                return Ok(Action::requeue(Duration::from_millis(100)));
            }
            Err(e) => return Err(api("writing a revision's status")(e)),
        }
        if became_ready {
            ctx.recorder
                .normal(&r.object_ref(&()), "Ready", "a pod of it is ready");
        }
    }
    // Pods coming up are looked at again soon (their `/healthz` says why they are not ready);
    // a revision at zero waits for a change (its Deployment's and pods' watches).
    let settled = status || failed.is_some() || !has_pods;
    Ok(if settled {
        Action::requeue(Duration::from_secs(30))
    } else {
        Action::requeue(Duration::from_millis(500))
    })
}

/// Python's message when a pod of the revision reports that its code does not load: a module
/// pod `ModuleLoadFailed`, or a running pod whose `/healthz` says so.
async fn load_failure(client: &Client, r: &FunctionRevision) -> Result<Option<String>, Error> {
    if r.spec.runtime != Runtime::Python3 {
        // Only the Python runtime loads code it can report on.
        return Ok(None);
    }
    let ns = r.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("{REVISION_LABEL}={}", r.name_any())))
        .await
        .map_err(api("listing a revision's pods"))?;
    for p in list.items {
        let Some(status) = p.status.as_ref() else {
            continue;
        };
        if status.reason.as_deref() == Some("ModuleLoadFailed") {
            return Ok(Some(status.message.clone().unwrap_or_default()));
        }
        let running = status.phase.as_deref() == Some("Running");
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let module = p
            .labels()
            .get(minik8s_vnode::PROVIDER_LABEL)
            .is_some_and(|v| v == crate::modules::PROVIDER);
        let Some(ip) = status
            .pod_ip
            .as_deref()
            .filter(|_| running && !ready && !module)
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
        else {
            continue;
        };
        let addr = std::net::SocketAddr::new(ip, RUNTIME_PORT as u16);
        let health = crate::modules::request(addr, hyper::Method::GET, "/healthz", None).await;
        if let Ok((_, body)) = health
            && body.get("sourceReady") == Some(&json!(false))
        {
            let e = body["error"].as_str().unwrap_or_default();
            return Ok(Some(e.to_owned()));
        }
    }
    Ok(None)
}

/// Deletes the revisions of `f` beyond its history limit: of those that take no traffic and
/// are neither the latest created nor the latest ready, the newest `revisionHistoryLimit`
/// are kept. Returns the names deleted.
pub async fn collect_garbage(
    client: &Client,
    f: &Function,
    revisions: &[Arc<FunctionRevision>],
    keep: &[&str],
) -> Result<Vec<String>, Error> {
    let name = f.name_any();
    let limit = f.spec.revision_history_limit.max(0) as usize;
    let mut idle: Vec<((i64, u32), String)> = revisions
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .filter(|r| !keep.contains(&r.name_any().as_str()))
        .map(|r| (order(&name, r), r.name_any()))
        .collect();
    idle.sort();
    let excess = idle.len().saturating_sub(limit);
    let api_: Api<FunctionRevision> =
        Api::namespaced(client.clone(), &f.namespace().unwrap_or_default());
    let mut deleted = Vec::new();
    for (_, r) in idle.into_iter().take(excess) {
        match api_.delete(&r, &DeleteParams::background()).await {
            Ok(_) => deleted.push(r),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api("deleting an old revision")(e)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(rev: Option<&str>, latest: bool, percent: i64, tag: Option<&str>) -> TrafficTarget {
        TrafficTarget {
            revision_name: rev.map(str::to_owned),
            latest_revision: latest.then_some(true),
            percent: Some(percent),
            tag: tag.map(str::to_owned),
            url: None,
        }
    }

    #[test]
    fn revisions_are_numbered_per_function() {
        assert_eq!(revision_name("add", 1), "add-00001");
        assert_eq!(revision_name("add", 123456), "add-123456");
        assert_eq!(revision_number("add", "add-00012"), Some(12));
        assert_eq!(revision_number("add", "add-x-00012"), None);
        assert_eq!(revision_number("add", "addx-00012"), None);
        assert_eq!(revision_number("add", "add-12"), None);
    }

    #[test]
    fn named_revisions_sort_by_generation_and_a_changed_pod_spec_may_not_take_a_name() {
        let rev = |name: &str, function: &str, generation: i64, target: &str| -> FunctionRevision {
            serde_json::from_value(json!({
                "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "FunctionRevision",
                "metadata": {"name": name},
                "spec": {"function": function, "generation": generation, "codeHash": "h",
                    "runtime": "container", "handler": "", "timeoutSeconds": 300,
                    "template": {"metadata": {"name": name, "annotations": {"a": "1"}},
                        "spec": {"containers": [{"image": "i", "env": [{"name": "T", "value": target}]}]}}},
            }))
            .expect("a revision")
        };
        let mut all = [
            rev("hello-v3", "hello", 4, "BYO"),
            rev("hello-00002", "hello", 2, "x"),
            rev("hello-00010", "hello", 7, "y"),
            rev("hello-00001", "hello", 1, "w"),
        ];
        all.sort_by_key(|r| order("hello", r));
        let names: Vec<String> = all.iter().map(|r| r.name_any()).collect();
        assert_eq!(
            names,
            ["hello-00001", "hello-00002", "hello-v3", "hello-00010"]
        );

        let byo = &all[2];
        let same = byo.spec.template.clone();
        assert_eq!(chosen_name(same.as_ref()), Some("hello-v3"));
        assert!(!name_taken(byo, "hello", same.as_ref()));
        // Annotations alone may differ; the pod spec may not, nor the function.
        let mut annotated = same.clone().unwrap();
        annotated["metadata"]["annotations"]["a"] = json!("2");
        assert!(!name_taken(byo, "hello", Some(&annotated)));
        let mut changed = same.clone().unwrap();
        changed["spec"]["containers"][0]["env"][0]["value"] = json!("Again");
        assert!(name_taken(byo, "hello", Some(&changed)));
        assert!(name_taken(byo, "other", same.as_ref()));
        assert_eq!(chosen_name(Some(&json!({"metadata": {}}))), None);
    }

    #[test]
    fn traffic_resolves_to_named_revisions_or_says_why_not() {
        let exists = |r: &str| r == "add-00001" || r == "add-00002";
        let url = "http://gw/function/default/add";
        let all = resolve(&[], Some("add-00002"), exists, url).unwrap();
        assert_eq!(
            all,
            vec![TrafficTarget {
                revision_name: Some("add-00002".into()),
                latest_revision: Some(true),
                percent: Some(100),
                ..Default::default()
            }]
        );
        assert_eq!(resolve(&[], None, exists, url), Err(Unresolved::NoRevision));
        let split = [
            target(Some("add-00001"), false, 90, Some("stable")),
            target(None, true, 10, Some("canary")),
        ];
        let got = resolve(&split, Some("add-00002"), exists, url).unwrap();
        assert_eq!(got[1].revision_name.as_deref(), Some("add-00002"));
        assert_eq!(
            got[0].url.as_deref(),
            Some("http://gw/function/default/add@stable")
        );
        assert_eq!(tagged(&got, "canary"), Some("add-00002"));
        assert_eq!(tagged(&got, "nope"), None);
        assert_eq!(
            traffic_of(&got, "add-00001").as_deref(),
            Some("90% @stable")
        );
        assert_eq!(traffic_of(&got, "add-00003"), None);
        let missing = [target(Some("add-00009"), false, 100, None)];
        assert_eq!(
            resolve(&missing, Some("add-00002"), exists, url),
            Err(Unresolved::RevisionMissing("add-00009".into()))
        );
    }

    #[test]
    fn picks_split_by_weight_over_every_roll() {
        let split = [
            target(Some("a"), false, 90, None),
            target(Some("t"), false, 0, Some("t")),
            target(Some("b"), false, 10, None),
        ];
        let picks: Vec<&str> = (0..100).map(|r| pick(&split, r).unwrap()).collect();
        assert_eq!(picks.iter().filter(|p| **p == "a").count(), 90);
        assert_eq!(picks.iter().filter(|p| **p == "b").count(), 10);
        assert_eq!(pick(&[], 5), None);
        // As the gateway rolls: 10,000 calls at 90/10 land within ±2 %.
        let split = [
            target(Some("a"), false, 90, None),
            target(Some("b"), false, 10, None),
        ];
        let a = (0..10_000)
            .filter(|_| pick(&split, rand::random_range(0..100)) == Some("a"))
            .count();
        assert!((8_800..=9_200).contains(&a), "{a} of 10,000");
    }

    #[test]
    fn what_runs_changes_the_hash_and_scale_does_not() {
        let f: Function = serde_json::from_value(json!({
            "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "Function",
            "metadata": {"name": "add", "namespace": "default", "generation": 1},
            "spec": {"source": {"inline": "x"}}}))
        .unwrap();
        let base = spec_for(&f, Some("x")).code_hash;
        assert_ne!(base, spec_for(&f, Some("y")).code_hash);
        let mut g = f.clone();
        g.spec.scale.max_scale = 3;
        g.spec.revision_history_limit = 2;
        assert_eq!(base, spec_for(&g, Some("x")).code_hash);
        g.spec.timeout_seconds = 5;
        assert_ne!(base, spec_for(&g, Some("x")).code_hash);
        let mut h = f.clone();
        h.spec.env = vec![k8s_openapi::api::core::v1::EnvVar {
            name: "A".into(),
            value: Some("1".into()),
            value_from: None,
        }];
        assert_ne!(base, spec_for(&h, Some("x")).code_hash);
    }
}

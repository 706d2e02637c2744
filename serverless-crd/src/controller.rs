//! The Function controller: a Function becomes a code ConfigMap (inline source), a Deployment
//! of the runtime image mounting the code, and a Service, all owned by the Function so that
//! deleting it removes them. A change of code or handler rolls the pods (the code's hash is a
//! template annotation). Replicas belong to the autoscaler: the controller sets them only when
//! it creates the Deployment (`minScale`), and never again.

use crate::types::{Function, FunctionStatus, Placement, Runtime};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_controllers::driver::Driver;
use minik8s_controllers::informer::Informers;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The invocation server the Python runtime image runs (with the base, its hash tags the
/// image).
pub const PYTHON_SERVER: &str = include_str!("../runtime/server.py");
/// The base mode of the same server (function modules loaded on request).
pub const PYTHON_BASE: &str = include_str!("../runtime/base.py");

/// The runtime image of `python3` functions and of bases, as `hack/images.sh` builds and
/// tags it: `minik8s/function-python:py-<first 12 hex digits of the SHA-256 of the server
/// followed by the base>`.
pub fn python_image() -> String {
    let both = [PYTHON_SERVER.as_bytes(), PYTHON_BASE.as_bytes()].concat();
    let digest = ring::digest::digest(&ring::digest::SHA256, &both);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("minik8s/function-python:py-{}", &hex[..12])
}
/// The label that names a pod's function.
pub const FUNCTION_LABEL: &str = "serverless.minik8s.io/function";
/// The template annotation that changes with the code (rolls the pods).
pub const CODE_HASH: &str = "serverless.minik8s.io/code-hash";
/// The port the runtime serves on.
pub const RUNTIME_PORT: i32 = 8080;
const MANAGER: &str = "function-controller";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// Wraps an API error with what was being done.
pub(crate) fn api(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { what, source }
}

/// What the controller needs.
pub struct Config {
    /// The gateway's base URL as users reach it (`http://<node address>:<port>`).
    pub gateway_url: String,
    /// How many bases the bases' Deployment starts with (made with the first module function).
    pub bases: i32,
}

struct Ctx {
    client: Client,
    cfg: Config,
}

/// The name of a function's children (ConfigMap, Deployment, Service).
pub fn child_name(function: &str) -> String {
    format!("fn-{function}")
}

/// The module file the handler names (`main.handler` → `main.py`).
fn module_file(handler: &str) -> String {
    let module = handler.rsplit_once('.').map_or("main", |(m, _)| m);
    format!("{}.py", module.replace('.', "/"))
}

fn owner(f: &Function) -> OwnerReference {
    f.controller_owner_ref(&())
        .expect("a stored Function has a uid")
}

/// A condition, keeping its last transition time while its status stays the same.
pub(crate) fn condition(
    old: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let kept = old.iter().find(|c| c.type_ == type_ && c.status == status);
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: kept
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| Time(jiff::Timestamp::now())),
    }
}

/// A short stable hash (FNV-1a) of some strings (code and handler for the template annotation; names).
pub(crate) fn hash(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}

/// The Deployment's pod template for a function.
fn template(f: &Function, code_hash: &str) -> Value {
    let name = f.name_any();
    let spec = &f.spec;
    let mut env = vec![
        json!({"name": "FUNCTION_HANDLER", "value": spec.handler}),
        json!({"name": "FUNCTION_TIMEOUT_SECONDS", "value": spec.timeout_seconds.to_string()}),
    ];
    env.extend(
        spec.env
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or(Value::Null)),
    );
    let (image, volumes, mounts) = match spec.runtime {
        Runtime::Python3 => {
            let (cm, key) = match spec.source.as_ref().and_then(|s| s.config_map_ref.as_ref()) {
                Some(r) => (r.name.clone(), r.key.clone()),
                None => (child_name(&name), module_file(&spec.handler)),
            };
            (
                python_image(),
                json!([{"name": "code", "configMap": {"name": cm,
                    "items": [{"key": key, "path": module_file(&spec.handler)}]}}]),
                json!([{"name": "code", "mountPath": "/code", "readOnly": true}]),
            )
        }
        Runtime::Image => (spec.image.clone().unwrap_or_default(), json!([]), json!([])),
    };
    let mut container = json!({
        "name": "function",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"name": "http", "containerPort": RUNTIME_PORT}],
        "env": env,
        "volumeMounts": mounts,
    });
    if let Some(r) = &spec.resources {
        container["resources"] = serde_json::to_value(r).unwrap_or(Value::Null);
    }
    let mut template = json!({
        "metadata": {
            "labels": {FUNCTION_LABEL: name},
            "annotations": {CODE_HASH: code_hash},
        },
        "spec": {
            "containers": [container],
            "volumes": volumes,
            // A pod being removed gets no new requests from the gateway and finishes the one
            // in hand (the runtime exits after it on SIGTERM) within the function's timeout.
            "terminationGracePeriodSeconds": f.spec.timeout_seconds + 2,
            "enableServiceLinks": false,
        },
    });
    if spec.placement == Placement::Module {
        crate::modules::module_template(&mut template, &f.namespace().unwrap_or_default());
    }
    template
}

async fn reconcile(f: Arc<Function>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = f.name_any();
    let ns = f.namespace().unwrap_or_default();
    let child = child_name(&name);
    let owner = owner(&f);
    let pp = PatchParams::apply(MANAGER).force();

    // The code: inline source as a ConfigMap of our own; a configMapRef is read where it is.
    let code = match f.spec.source.as_ref() {
        Some(s) if s.config_map_ref.is_some() => {
            let r = s.config_map_ref.as_ref().expect("checked");
            let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
            cms.get_opt(&r.name)
                .await
                .map_err(api("reading the source ConfigMap"))?
                .and_then(|cm| cm.data.and_then(|d| d.get(&r.key).cloned()))
        }
        Some(s) => s.inline.clone(),
        None => None,
    };
    if f.spec.runtime == Runtime::Python3
        && f.spec
            .source
            .as_ref()
            .and_then(|s| s.config_map_ref.as_ref())
            .is_none()
    {
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": child, "namespace": ns, "ownerReferences": [owner],
                "labels": {FUNCTION_LABEL: name}},
            "data": {module_file(&f.spec.handler): code.clone().unwrap_or_default()},
        });
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
            .patch(&child, &pp, &Patch::Apply(&cm))
            .await
            .map_err(api("applying the code ConfigMap"))?;
    }
    let code_hash = hash(&[
        code.as_deref().unwrap_or_default(),
        &f.spec.handler,
        f.spec.image.as_deref().unwrap_or_default(),
    ]);

    // Module functions run in the bases (made with the first of them).
    if f.spec.placement == Placement::Module {
        crate::modules::ensure_bases(&ctx.client, ctx.cfg.bases)
            .await
            .map_err(api("making the function bases"))?;
    }

    // The Deployment: created with minScale replicas; afterwards only its template changes.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let template = template(&f, &code_hash);
    let selector = json!({"matchLabels": {FUNCTION_LABEL: name}});
    let existing = deployments
        .get_opt(&child)
        .await
        .map_err(api("reading the Deployment"))?;
    let deployment = match existing {
        None => {
            let d: Deployment = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": child, "namespace": ns, "ownerReferences": [owner],
                    "labels": {FUNCTION_LABEL: name}},
                "spec": {
                    "replicas": f.spec.scale.min_scale,
                    "selector": selector,
                    "template": template,
                    // New pods come up before old ones go: a code update drops no request.
                    "strategy": {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 0}},
                },
            }))
            .expect("a Deployment");
            match deployments.create(&PostParams::default(), &d).await {
                Ok(d) => d,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    return Ok(Action::requeue(Duration::from_millis(200)));
                }
                Err(e) => return Err(api("creating the Deployment")(e)),
            }
        }
        Some(_) => deployments
            .patch(
                &child,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": template}})),
            )
            .await
            .map_err(api("updating the Deployment"))?,
    };

    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": child, "namespace": ns, "ownerReferences": [owner],
            "labels": {FUNCTION_LABEL: name}},
        "spec": {"selector": {FUNCTION_LABEL: name},
            "ports": [{"name": "http", "port": 80, "targetPort": RUNTIME_PORT}]},
    });
    Api::<Service>::namespaced(ctx.client.clone(), &ns)
        .patch(&child, &pp, &Patch::Apply(&svc))
        .await
        .map_err(api("applying the Service"))?;

    // Status: replicas from the Deployment, the URL, and conditions.
    let ds = deployment.status.clone().unwrap_or_default();
    let old = f.status.clone().unwrap_or_default();
    let source_missing = f.spec.runtime == Runtime::Python3 && code.is_none();
    let mut conditions = Vec::new();
    let mut set = |type_: &str, status: bool, reason: &str, message: String| {
        conditions.push(condition(
            &old.conditions,
            type_,
            status,
            reason,
            message,
            f.metadata.generation,
        ));
    };
    // SourceReady: known missing here; an import error is reported by the gateway, which
    // keeps its condition (False with the Python message) until the code changes. A module
    // function learns it from its module pods (`ModuleLoadFailed`).
    let module_failed = match f.spec.placement {
        Placement::Module => module_load_failure(&ctx.client, &ns, &name, &code_hash).await?,
        Placement::Pod => None,
    };
    let import_failed = old
        .conditions
        .iter()
        .find(|c| {
            c.type_ == "SourceReady"
                && c.status == "False"
                && c.reason == "ImportError"
                && old.observed_generation == f.metadata.generation
        })
        .map(|c| c.message.clone())
        .or(module_failed);
    if import_failed.is_some() && f.spec.placement == Placement::Module {
        // Its pods would only fail again: none until the code changes (the gateway answers
        // 502 with Python's message meanwhile, and the autoscaler leaves it at zero).
        let scale = deployment
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(0);
        if scale != 0 {
            deployments
                .patch_scale(
                    &child,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": 0}})),
                )
                .await
                .map_err(api("scaling a function whose module does not load to zero"))?;
        }
    }
    match (source_missing, &import_failed) {
        (true, _) => set(
            "SourceReady",
            false,
            "SourceMissing",
            "the function has no source (spec.source.inline or a ConfigMap key that exists)".into(),
        ),
        (false, Some(m)) => set("SourceReady", false, "ImportError", m.clone()),
        (false, None) => set("SourceReady", true, "SourceLoaded", String::new()),
    }
    let ready = !source_missing && import_failed.is_none();
    set(
        "Ready",
        ready,
        if ready { "Ready" } else { "SourceNotReady" },
        if ready {
            "the function answers at its URL (scaling from zero on the first request)".into()
        } else {
            "the function's source is not ready".into()
        },
    );
    let status = FunctionStatus {
        url: Some(format!("{}/function/{ns}/{name}", ctx.cfg.gateway_url)),
        replicas: ds.replicas.unwrap_or(0),
        ready_replicas: ds.ready_replicas.unwrap_or(0),
        observed_generation: f.metadata.generation,
        conditions,
        last_cold_start_millis: old.last_cold_start_millis,
    };
    if f.status.as_ref() != Some(&status) {
        // Pinned to the version read: the gateway writes status too (a source that does not
        // import, the last cold start), and a stale view must not overwrite it; a conflict
        // is retried on a fresh read.
        let functions: Api<Function> = Api::namespaced(ctx.client.clone(), &ns);
        let patch =
            json!({"metadata": {"resourceVersion": f.resource_version()}, "status": status});
        match functions
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Ok(Action::requeue(Duration::from_millis(100)));
            }
            Err(e) => return Err(api("writing the Function's status")(e)),
        }
    }
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Python's message when a module pod of the function's current code failed to load.
async fn module_load_failure(
    client: &Client,
    ns: &str,
    name: &str,
    code_hash: &str,
) -> Result<Option<String>, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("{FUNCTION_LABEL}={name}")))
        .await
        .map_err(api("listing the function's module pods"))?;
    Ok(list.items.into_iter().find_map(|p| {
        let status = p.status.as_ref()?;
        (status.reason.as_deref() == Some("ModuleLoadFailed")
            && p.annotations().get(CODE_HASH).map(String::as_str) == Some(code_hash))
        .then(|| status.message.clone().unwrap_or_default())
    }))
}

/// Runs the Function controller until `shutdown`.
pub async fn run(client: Client, cfg: Config, shutdown: CancellationToken) {
    let tasks = TaskTracker::new();
    let informers = Informers::new(client.clone(), tasks.clone(), shutdown.clone());
    let driver = Driver::<Function>::new("function", &informers).await;
    // A change to a ConfigMap a function's `source.configMapRef` names rolls its pods.
    let store = driver.store();
    let referring = move |cm: ConfigMap| {
        let (ns, name) = (cm.namespace(), cm.name_any());
        store
            .state()
            .into_iter()
            .filter(|f| {
                f.namespace() == ns
                    && f.spec
                        .source
                        .as_ref()
                        .and_then(|s| s.config_map_ref.as_ref())
                        .is_some_and(|r| r.name == name)
            })
            .map(|f| ObjectRef::from_obj(&*f))
            .collect::<Vec<_>>()
    };
    driver
        .owns_api(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default().labels(FUNCTION_LABEL),
        )
        .watches_api(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
            referring,
        )
        // A module pod that fails to load tells its Function.
        .watches_api(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(&format!(
                "{}={}",
                minik8s_vnode::PROVIDER_LABEL,
                crate::modules::PROVIDER
            )),
            |p: Pod| {
                let failed =
                    p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("ModuleLoadFailed");
                let function = p.labels().get(FUNCTION_LABEL).cloned();
                failed
                    .then(|| Some(ObjectRef::new(&function?).within(&p.namespace()?)))
                    .flatten()
            },
        )
        .run(reconcile, Arc::new(Ctx { client, cfg }), shutdown)
        .await;
    tasks.close();
    tasks.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handlers_name_their_module_file_and_code_changes_change_the_hash() {
        assert_eq!(module_file("main.handler"), "main.py");
        assert_eq!(module_file("add.handler"), "add.py");
        assert_eq!(module_file("handler"), "main.py");
        assert_ne!(hash(&["a", "main.handler"]), hash(&["b", "main.handler"]));
        assert_ne!(hash(&["ab", "c"]), hash(&["a", "bc"]));
    }
}

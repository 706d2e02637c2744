//! The Function controller: every change to what a Function runs becomes an immutable
//! revision (see [`crate::revision`], which runs each as a Deployment of its own); the
//! Function's `traffic` is resolved over its revisions into `status.traffic`, which the
//! gateway splits calls by; old revisions beyond `revisionHistoryLimit` go. A Service
//! `fn-<function>` selects all its pods. Replicas belong to the autoscaler.

use crate::reconcile::{Error, api, condition};
use crate::revision::{self, Unresolved};
use crate::runtime::FUNCTION_LABEL;
use crate::types::{
    Function, FunctionRevision, FunctionStatus, Placement, REVISION_LABEL, Runtime,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_controllers::driver::Driver;
use minik8s_controllers::informer::Informers;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const MANAGER: &str = "function-controller";

/// What the controller needs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The gateway's base URL as users reach it (`http://<node address>:<port>`).
    pub gateway_url: String,
    /// How many bases the bases' Deployment starts with (made with the first module function).
    pub bases: i32,
}

struct Ctx {
    client: Client,
    cfg: Config,
    revisions: Store<FunctionRevision>,
    recorder: minik8s_events::Recorder,
}

/// The name of a function's children (ConfigMap, Deployment, Service).
pub fn child_name(function: &str) -> String {
    format!("fn-{function}")
}

/// The code a function names: its inline source, or the key of the ConfigMap it refers to.
async fn read_code(client: &Client, f: &Function) -> Result<Option<String>, Error> {
    let ns = f.namespace().unwrap_or_default();
    Ok(match f.spec.source.as_ref() {
        Some(s) if s.config_map_ref.is_some() => {
            let r = s.config_map_ref.as_ref().expect("checked");
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            cms.get_opt(&r.name)
                .await
                .map_err(api("reading the source ConfigMap"))?
                .and_then(|cm| cm.data.and_then(|d| d.get(&r.key).cloned()))
        }
        Some(s) => s.inline.clone(),
        None => None,
    })
}

/// The revisions of `f` (owned by it), oldest first.
fn revisions_of(store: &Store<FunctionRevision>, f: &Function) -> Vec<Arc<FunctionRevision>> {
    let name = f.name_any();
    let mut list: Vec<((i64, u32), Arc<FunctionRevision>)> = store
        .state()
        .into_iter()
        .filter(|r| r.namespace() == f.namespace() && r.spec.function == name)
        .filter(|r| {
            r.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == f.metadata.uid.as_ref())
        })
        .map(|r| (revision::order(&name, &r), r))
        .collect();
    list.sort_by_key(|(n, _)| *n);
    list.into_iter().map(|(_, r)| r).collect()
}

async fn reconcile(f: Arc<Function>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = f.name_any();
    let ns = f.namespace().unwrap_or_default();
    let pp = PatchParams::apply(MANAGER).force();
    let code = read_code(&ctx.client, &f).await?;
    let source_missing = f.spec.runtime == Runtime::Python3 && code.is_none();

    // A new revision when what runs changed (never for scale or traffic).
    let mut revisions = revisions_of(&ctx.revisions, &f);
    let latest_created = revisions.last().cloned();
    if !source_missing {
        let spec = revision::spec_for(&f, code.as_deref());
        if latest_created
            .as_ref()
            .is_none_or(|r| r.spec.code_hash != spec.code_hash)
        {
            let n = revisions
                .iter()
                .filter_map(|r| revision::revision_number(&name, &r.name_any()))
                .chain(
                    f.status
                        .as_ref()
                        .and_then(|s| s.latest_created_revision.as_deref())
                        .and_then(|r| revision::revision_number(&name, r)),
                )
                .max()
                .unwrap_or(0)
                + 1;
            // A Knative template may name its revision (checked by the CRD's rules to start
            // with the Configuration's name).
            let chosen = revision::chosen_name(f.spec.template.as_ref());
            let rev = chosen.map_or_else(|| revision::revision_name(&name, n), str::to_owned);
            let min = f.spec.scale.min_scale.max(0);
            // Knative's revisions start with one pod too (its `initial-scale` is 1): Ready
            // says the revision can serve before a request comes.
            let initial = if latest_created.is_some() || f.spec.runtime == Runtime::Container {
                min.max(1)
            } else {
                min
            };
            let existing =
                chosen.and_then(|_| ctx.revisions.get(&ObjectRef::new(&rev).within(&ns)));
            match existing {
                Some(r) if revision::name_taken(&r, &name, f.spec.template.as_ref()) => {
                    ctx.recorder.warning(
                        &f.object_ref(&()),
                        "RevisionNameTaken",
                        format!("the revision name {rev:?} is taken by a revision of another template; a changed template needs a new name"),
                    );
                }
                // The named revision of this pod spec is there (only annotations changed).
                Some(_) => {}
                None => {
                    match revision::create(&ctx.client, &f, &rev, spec, code.as_deref(), initial)
                        .await
                    {
                        Ok(made) => {
                            ctx.recorder.normal(
                                &f.object_ref(&()),
                                "RevisionCreated",
                                format!("revision {rev} (generation {})", made.spec.generation),
                            );
                            revisions.push(Arc::new(made));
                        }
                        Err(Error::Api {
                            source: kube::Error::Api(s),
                            ..
                        }) if s.code == 409 => {
                            // Made already; our view of revisions lags.
                            return Ok(Action::requeue(Duration::from_millis(200)));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
    let latest_created = revisions.last().cloned();

    // Module functions run in the bases (made with the first of them).
    if f.spec.placement == Placement::Module {
        crate::modules::ensure_bases(&ctx.client, ctx.cfg.bases)
            .await
            .map_err(api("making the function bases"))?;
    }

    // One Service for all the function's pods (in-cluster callers that bypass the gateway).
    let child = child_name(&name);
    let owner = f
        .controller_owner_ref(&())
        .expect("a stored Function has a uid");
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": child, "namespace": ns, "ownerReferences": [owner],
            "labels": {FUNCTION_LABEL: name}},
        "spec": {"selector": {FUNCTION_LABEL: name},
            "ports": [{"name": "http", "port": 80,
                "targetPort": revision::serving_port(f.spec.template.as_ref())}]},
    });
    Api::<Service>::namespaced(ctx.client.clone(), &ns)
        .patch(&child, &pp, &Patch::Apply(&svc))
        .await
        .map_err(api("applying the Service"))?;
    let old = f.status.clone().unwrap_or_default();
    if old.latest_created_revision.is_none() {
        // Before revisions a function had one Deployment and code ConfigMap of its own.
        for result in [
            Api::<Deployment>::namespaced(ctx.client.clone(), &ns)
                .delete(&child, &DeleteParams::background())
                .await
                .map(|_| ()),
            Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
                .delete(&child, &DeleteParams::background())
                .await
                .map(|_| ()),
        ] {
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(api("removing the Deployment of before revisions")(e)),
            }
        }
    }

    // Traffic: over the latest ready revision (the latest created while none was ready).
    let latest_ready = revisions.iter().rev().find(|r| revision::is_ready(r));
    let latest = latest_ready
        .or(latest_created.as_ref())
        .map(|r| r.name_any());
    let url = format!("{}/function/{ns}/{name}", ctx.cfg.gateway_url);
    let resolved = revision::resolve(
        &f.spec.traffic,
        latest.as_deref(),
        |r| revisions.iter().any(|x| x.name_any() == r),
        &url,
    );
    let traffic = match &resolved {
        Ok(t) => t.clone(),
        Err(_) => old.traffic.clone(),
    };

    // Old revisions that take no traffic go, beyond the history limit.
    let mut keep: Vec<&str> = traffic
        .iter()
        .filter_map(|t| t.revision_name.as_deref())
        .chain(
            f.spec
                .traffic
                .iter()
                .filter_map(|t| t.revision_name.as_deref()),
        )
        .collect();
    let created_name = latest_created.as_ref().map(|r| r.name_any());
    let ready_name = latest_ready.map(|r| r.name_any());
    keep.extend(created_name.as_deref());
    keep.extend(ready_name.as_deref());
    for gone in revision::collect_garbage(&ctx.client, &f, &revisions, &keep).await? {
        ctx.recorder.normal(
            &f.object_ref(&()),
            "RevisionDeleted",
            format!(
                "revision {gone}: beyond revisionHistoryLimit ({})",
                f.spec.revision_history_limit
            ),
        );
    }

    // Status: replicas over the revisions, the URL, and conditions.
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
    let created_failed = latest_created
        .as_ref()
        .and_then(|r| revision::load_error(r));
    match (source_missing, &created_failed) {
        (true, _) => set(
            "SourceReady",
            false,
            "SourceMissing",
            "the function has no source (spec.source.inline or a ConfigMap key that exists)".into(),
        ),
        (false, Some(m)) => set("SourceReady", false, "ImportError", m.clone()),
        (false, None) => set("SourceReady", true, "SourceLoaded", String::new()),
    }
    let routed_failed = traffic.iter().find_map(|t| {
        let r = revisions
            .iter()
            .find(|r| Some(r.name_any().as_str()) == t.revision_name.as_deref())?;
        revision::load_error(r).map(|e| (r.name_any(), e))
    });
    match (&resolved, &routed_failed, &created_failed) {
        (Err(Unresolved::RevisionMissing(r)), _, _) => set(
            "Ready",
            false,
            "RevisionMissing",
            format!(
                "spec.traffic names revision {r}, which does not exist; traffic stays as it was"
            ),
        ),
        (Err(Unresolved::NoRevision), _, _) => set(
            "Ready",
            false,
            if source_missing {
                "SourceNotReady"
            } else {
                "NoRevision"
            },
            "the function has no revision to route to yet".into(),
        ),
        (Ok(_), Some((r, e)), _) => set(
            "Ready",
            false,
            "SourceNotReady",
            format!("revision {r}, which takes traffic, does not load: {e}"),
        ),
        (Ok(_), None, Some(e)) => set(
            "Ready",
            false,
            "RevisionFailed",
            format!(
                "revision {} does not load ({e}); calls go to {}",
                created_name.as_deref().unwrap_or_default(),
                traffic
                    .iter()
                    .filter_map(|t| t.revision_name.as_deref())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        (Ok(_), None, None) => set(
            "Ready",
            true,
            "Ready",
            "the function answers at its URL (scaling from zero on the first request)".into(),
        ),
    }
    let (replicas, ready_replicas) = revisions
        .iter()
        .filter_map(|r| r.status.as_ref())
        .fold((0, 0), |(a, b), s| (a + s.replicas, b + s.ready_replicas));
    let status = FunctionStatus {
        url: Some(url),
        replicas,
        ready_replicas,
        observed_generation: f.metadata.generation,
        conditions,
        last_cold_start_millis: old.last_cold_start_millis,
        latest_created_revision: created_name,
        latest_ready_revision: ready_name,
        traffic,
    };
    if f.status.as_ref() != Some(&status) {
        // The event says what the Ready condition now says, once per time it goes missing.
        let ready = revision::find(&status.conditions, "Ready");
        let was_missing =
            revision::find(&old.conditions, "Ready").is_some_and(|c| c.reason == "RevisionMissing");
        if let Some(c) = ready.filter(|c| c.reason == "RevisionMissing" && !was_missing) {
            ctx.recorder
                .warning(&f.object_ref(&()), "RevisionMissing", c.message.clone());
        }
        // Pinned to the version read: the gateway writes status too (the last cold start),
        // and a stale view must not overwrite it; a conflict is retried on a fresh read.
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

/// Runs the Function and revision controllers until `shutdown`.
pub async fn run(client: Client, cfg: Config, shutdown: CancellationToken) {
    let tasks = TaskTracker::new();
    let informers = Informers::new(client.clone(), tasks.clone(), shutdown.clone());
    let recorder = minik8s_events::Recorder::new(client.clone(), MANAGER, None);
    let revisions = Driver::<FunctionRevision>::new("function-revision", &informers).await;
    let functions = Driver::<Function>::new("function", &informers).await;
    let revision_store = revisions.store();
    let function_store = functions.store();
    let knative_client = client.clone();
    let knative_gateway = cfg.gateway_url.clone();
    let knative_functions = function_store.clone();
    let knative_revisions = revision_store.clone();
    let knative_shutdown = shutdown.clone();
    // A change to a ConfigMap a function's `source.configMapRef` names makes a revision.
    let store = function_store.clone();
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
    let functions = functions
        .owns::<FunctionRevision>()
        .watches_api(
            Api::<ConfigMap>::all(client.clone()),
            watcher::Config::default(),
            referring,
        )
        .run(
            reconcile,
            Arc::new(Ctx {
                client: client.clone(),
                cfg,
                revisions: revision_store.clone(),
                recorder: recorder.clone(),
            }),
            shutdown.clone(),
        );
    // A revision follows its Deployment, its pods, and its Function's traffic.
    let of_function = {
        let store = revision_store.clone();
        move |f: Arc<Function>| {
            store
                .state()
                .into_iter()
                .filter(|r| r.namespace() == f.namespace() && r.spec.function == f.name_any())
                .map(|r| ObjectRef::from_obj(&*r))
                .collect::<Vec<_>>()
        }
    };
    let revisions = revisions
        .owns_api(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default().labels(REVISION_LABEL),
        )
        .watches::<Function, _>(of_function)
        .watches_api(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(REVISION_LABEL),
            |p: Pod| {
                let revision = p.labels().get(REVISION_LABEL).cloned();
                Some(ObjectRef::new(&revision?).within(&p.namespace()?))
            },
        )
        .run(
            revision::reconcile,
            Arc::new(revision::Ctx {
                client,
                functions: function_store,
                recorder,
            }),
            shutdown,
        );
    // Knative Serving's kinds, on the same informers and stores.
    let knative = async {
        let Some(gateway) = crate::knative::Gateway::from_url(&knative_gateway) else {
            tracing::error!(url = %knative_gateway, "the gateway's URL does not parse; no Knative Serving");
            return;
        };
        crate::knative::run(
            knative_client,
            &informers,
            gateway,
            knative_functions,
            knative_revisions,
            knative_shutdown,
        )
        .await;
    };
    tokio::join!(functions, revisions, knative);
    tasks.close();
    tasks.wait().await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn handlers_name_their_module_file_and_code_changes_change_the_hash() {
        use crate::reconcile::hash;
        use crate::revision::module_file;
        assert_eq!(module_file("main.handler"), "main.py");
        assert_eq!(module_file("add.handler"), "add.py");
        assert_eq!(module_file("handler"), "main.py");
        assert_ne!(hash(&["a", "main.handler"]), hash(&["b", "main.handler"]));
        assert_ne!(hash(&["ab", "c"]), hash(&["a", "bc"]));
    }
}

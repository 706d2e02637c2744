//! The Workflow and WorkflowRun controllers.
//!
//! - A Workflow is checked (its `Ready` condition names the first bad step); applying one with
//!   `params` starts the run `<name>-<generation>`. Its runs are owned by it.
//! - A WorkflowRun that has not ended is executed by a task of this process: each completed
//!   step is appended to `status.steps` (one JSON patch) before the next starts, so a process
//!   that restarts resumes every unfinished run after its last recorded step. Functions are
//!   called through the gateway in this process, with an invocation id that is the same when
//!   a step is run again.

use super::engine::{self, Halt, Host, Run, StepError, seconds_between};
use super::types::{Phase, StepRecord, Workflow, WorkflowRun};
use crate::gateway::Gateway;
use bytes::Bytes;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_controllers::driver::Driver;
use minik8s_controllers::informer::Informers;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The label naming a run's Workflow.
pub const WORKFLOW_LABEL: &str = "serverless.minik8s.io/workflow";
/// Whether a value is kept in a ConfigMap rather than in the run's status.
fn too_large(v: &Value) -> bool {
    v.to_string().len() > INLINE_LIMIT
}

/// How long a step waits for a function whose queue is full.
const BACKPRESSURE_FOR: Duration = Duration::from_secs(60);
/// How long this process remembers the runs it ended (longer than its cache can lag).
const REMEMBER_ENDED: Duration = Duration::from_secs(600);
/// Values larger than this (serialized) go into a ConfigMap owned by the run.
pub const INLINE_LIMIT: usize = 64 * 1024;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

/// The workflow metrics on the gateway's `/metrics`.
#[derive(Clone)]
pub struct Metrics {
    runs: Family<PhaseLabels, Counter>,
    steps: Family<TypeLabels, Histogram>,
    transitions: Counter,
}

impl Metrics {
    /// The metrics, registered in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let runs = Family::<PhaseLabels, Counter>::default();
        let steps = Family::<TypeLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.0005, 2.0, 18))) as fn() -> Histogram,
        );
        let transitions = Counter::default();
        registry.register(
            "minik8s_workflow_runs",
            "Runs that ended, by phase",
            runs.clone(),
        );
        registry.register(
            "minik8s_workflow_step_duration_seconds",
            "Executed steps' durations, by type",
            steps.clone(),
        );
        registry.register(
            "minik8s_workflow_transitions",
            "Steps executed",
            transitions.clone(),
        );
        Metrics {
            runs,
            steps,
            transitions,
        }
    }
}

struct Ctx {
    client: Client,
    gateway: Arc<Gateway>,
    metrics: Metrics,
    /// Runs (by uid) being executed by this process.
    running: Mutex<HashSet<String>>,
    /// Runs (by uid) this process ended lately, with when: the cache may not show it yet.
    ended: Mutex<HashMap<String, Instant>>,
    runs: Store<WorkflowRun>,
    workflows: Store<Workflow>,
    shutdown: CancellationToken,
}

pub use crate::reconcile::Error;
use crate::reconcile::{api, condition, hash};

async fn reconcile_workflow(wf: Arc<Workflow>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = wf.namespace().unwrap_or_default();
    let name = wf.name_any();
    let generation = wf.metadata.generation;
    let checked = engine::check(&wf.spec, &|f| ctx.gateway.has_function(&ns, f));
    let runs = ctx
        .runs
        .state()
        .iter()
        .filter(|r| {
            r.namespace().as_deref() == Some(ns.as_str())
                && r.labels().get(WORKFLOW_LABEL) == Some(&name)
        })
        .count() as i64;
    let old = wf.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.steps = wf.spec.steps.len() as i64;
    status.runs = runs;
    status.observed_generation = generation;
    let ok = checked.is_ok();
    let message = checked.err().unwrap_or_default();
    let reason = if ok { "Valid" } else { "InvalidDefinition" };
    status.conditions = vec![condition(
        &old.conditions,
        "Ready",
        ok,
        reason,
        message,
        generation,
    )];

    // Applying a Workflow with params starts a run of that generation (once).
    if let Some(params) = &wf.spec.params
        && old.params_generation != generation
    {
        let run_name = format!("{name}-{}", generation.unwrap_or(1));
        let run: WorkflowRun = serde_json::from_value(json!({
            "apiVersion": "serverless.minik8s.io/v1alpha1", "kind": "WorkflowRun",
            "metadata": {"name": run_name, "namespace": ns,
                "labels": {WORKFLOW_LABEL: name}, "ownerReferences": [owner(&*wf)]},
            "spec": {"workflowRef": {"name": name}, "input": params},
        }))
        .expect("a WorkflowRun");
        match Api::<WorkflowRun>::namespaced(ctx.client.clone(), &ns)
            .create(&PostParams::default(), &run)
            .await
        {
            Ok(_) => status.runs += 1,
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(api("starting the params run")(e)),
        }
        status.params_generation = generation;
    }
    if status != old {
        Api::<Workflow>::namespaced(ctx.client.clone(), &ns)
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .map_err(api("writing the Workflow's status"))?;
    }
    // A definition naming a Function that does not exist yet is looked at again soon.
    Ok(Action::requeue(if ok {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(3)
    }))
}

fn owner<K: Resource<DynamicType = ()>>(o: &K) -> OwnerReference {
    o.controller_owner_ref(&())
        .expect("a stored object has a uid")
}

async fn reconcile_run(run: Arc<WorkflowRun>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let finished = run.status.as_ref().is_some_and(|s| s.phase.finished());
    let uid = run.uid().unwrap_or_default();
    if finished || ctx.ended.lock().expect("ended").contains_key(&uid) {
        return Ok(Action::await_change());
    }
    if !ctx.running.lock().expect("running").insert(uid.clone()) {
        return Ok(Action::await_change());
    }
    let ctx2 = ctx.clone();
    minik8s_task::spawn("workflow-run", async move {
        let ctx = ctx2;
        tokio::select! {
            _ = execute(&ctx, &run) => {
                let mut ended = ctx.ended.lock().expect("ended");
                let now = Instant::now();
                ended.retain(|_, at| now.duration_since(*at) < REMEMBER_ENDED);
                ended.insert(uid.clone(), now);
            }
            _ = ctx.shutdown.cancelled() => {}
        }
        ctx.running.lock().expect("running").remove(&uid);
    });
    Ok(Action::await_change())
}

/// The writes of one run's execution.
struct RunHost<'a> {
    ctx: &'a Ctx,
    api: Api<WorkflowRun>,
    ns: String,
    name: String,
    owner: OwnerReference,
    /// When the run started (for its duration).
    start_time: String,
    /// One status write at a time (Parallel branches end together).
    writes: tokio::sync::Mutex<()>,
    /// The run's end was written (with its last step's record).
    ended: std::sync::atomic::AtomicBool,
}

/// A function's failure as a step error: the exception's type as the name when the function
/// raised one (`KeyError: 'y'` → `KeyError`), else what the gateway saw.
fn task_error(code: u16, text: &str) -> StepError {
    let message = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| text.to_owned());
    let exception = message.split_once(':').map(|(t, _)| t).filter(|t| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    });
    let error = match (code, exception) {
        (500, Some(t)) => t.to_owned(),
        (404, _) => "FunctionNotFound".into(),
        (504, _) => "Timeout".into(),
        (503, _) => "Unavailable".into(),
        (502, _) => "FunctionUnavailable".into(),
        _ => format!("Function{code}"),
    };
    StepError {
        error,
        cause: message,
    }
}

impl RunHost<'_> {
    /// A large value goes into a ConfigMap owned by the run, named from `key`: its name.
    async fn stash(&self, what: &str, key: &[&str], value: &Value) -> Result<String, Halt> {
        let cm_name = format!("{}-{}", self.name, &hash(key)[..10]);
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": cm_name, "namespace": self.ns, "ownerReferences": [self.owner],
                "labels": {"serverless.minik8s.io/workflowrun": self.name}},
            "data": {"value": value.to_string()}});
        Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &self.ns)
            .patch(
                &cm_name,
                &PatchParams::apply("workflow-controller").force(),
                &Patch::Apply(&cm),
            )
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => Halt::Stopped("the run was deleted".into()),
                e => Halt::Failed(StepError {
                    error: "OutputTooLarge".into(),
                    cause: format!("keeping a {what} of {} bytes: {e}", value.to_string().len()),
                }),
            })?;
        Ok(cm_name)
    }

    /// Writes a status patch, again while the API fails (it may be restarting); a deleted
    /// run stops the execution.
    async fn write(&self, patch: Patch<Value>) -> Result<(), Halt> {
        let mut pause = Duration::from_millis(50);
        loop {
            match self
                .api
                .patch_status(&self.name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(Halt::Stopped("the run was deleted".into()));
                }
                // Refused for good (not a conflict or overload): trying again would not help.
                Err(kube::Error::Api(s))
                    if (400..500).contains(&s.code) && ![409, 429].contains(&s.code) =>
                {
                    tracing::error!(run = %self.name, status = %s.message, "the run's status write was refused");
                    return Err(Halt::Stopped(format!("writing the status: {}", s.message)));
                }
                Err(e) => {
                    tracing::warn!(run = %self.name, error = %e, "writing the run's status; again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

impl Host for RunHost<'_> {
    async fn invoke(
        &self,
        function: &str,
        input: &Value,
        id: &str,
    ) -> (Result<Value, StepError>, Option<String>) {
        let body = Bytes::from(input.to_string());
        // A function whose queue is full pushes back (503): the step waits its turn rather
        // than fail, for as long as a call may take.
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        let answer = loop {
            match self
                .ctx
                .gateway
                .call(&self.ns, function, body.clone(), id)
                .await
            {
                Err(f) if f.code.as_u16() == 503 && started.elapsed() < BACKPRESSURE_FOR => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                other => break other,
            }
        };
        match answer {
            Ok(a) if a.code.is_success() => (
                serde_json::from_slice(&a.body).map_err(|e| StepError {
                    error: "InvalidOutput".into(),
                    cause: format!("{function} answered what is not JSON: {e}"),
                }),
                Some(a.revision),
            ),
            Ok(a) => (
                Err(task_error(
                    a.code.as_u16(),
                    &String::from_utf8_lossy(&a.body),
                )),
                Some(a.revision),
            ),
            Err(f) => (Err(task_error(f.code.as_u16(), &f.message)), None),
        }
    }

    async fn record(&self, mut record: StepRecord, step: Option<&str>) -> Result<(), Halt> {
        let _one = self.writes.lock().await;
        if let Some(v) = record.input.take_if(|v| too_large(v)) {
            let key = [&*record.path, &record.name, &record.start_time, "input"];
            record.input_ref = Some(self.stash("input", &key, &v).await?);
        }
        if let Some(v) = record.output.take_if(|v| too_large(v)) {
            let key = [&*record.path, &record.name, &record.start_time, "output"];
            record.output_ref = Some(self.stash("output", &key, &v).await?);
        }
        self.ctx.metrics.transitions.inc();
        if let Some(s) = seconds_between(&record.start_time, &record.end_time) {
            self.ctx
                .metrics
                .steps
                .get_or_create(&TypeLabels {
                    r#type: format!("{:?}", record.type_),
                })
                .observe(s);
        }
        // The last top-level step ends the run: its end goes in the same write.
        let ending = record.path.is_empty() && record.next.is_none();
        let end = ending.then(|| match &record.error {
            Some(e) => Err(StepError {
                error: e.clone(),
                cause: record.cause.clone().unwrap_or_default(),
            }),
            None => Ok(record.output.clone().unwrap_or(Value::Null)),
        });
        let output_ref = record.output_ref.clone();
        let mut ops = vec![json!({"op": "add", "path": "/status/steps/-", "value": record})];
        if let Some(s) = step {
            ops.push(json!({"op": "add", "path": "/status/step", "value": s}));
        }
        let phase = match end {
            Some(result) => {
                let (fields, phase) = self.ending(result, output_ref);
                for (k, v) in fields {
                    ops.push(json!({"op": "add", "path": format!("/status/{k}"), "value": v}));
                }
                ops.push(json!({"op": "add", "path": "/status/step", "value": null}));
                Some(phase)
            }
            None => None,
        };
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(ops)).expect("a JSON patch");
        self.write(Patch::Json(patch)).await?;
        if let Some(phase) = phase {
            self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
            self.ctx
                .metrics
                .runs
                .get_or_create(&PhaseLabels { phase })
                .inc();
        }
        Ok(())
    }

    async fn output(&self, record: &StepRecord) -> Result<Value, Halt> {
        let Some(cm) = &record.output_ref else {
            return Ok(record.output.clone().unwrap_or(Value::Null));
        };
        let got = Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &self.ns)
            .get(cm)
            .await
            .map_err(|e| Halt::Stopped(format!("reading {cm}: {e}")))?;
        let text = got
            .data
            .and_then(|d| d.get("value").cloned())
            .unwrap_or_default();
        serde_json::from_str(&text).map_err(|e| Halt::Stopped(format!("reading {cm}: {e}")))
    }
}

/// Executes (or resumes) a run until it ends, the run goes, or the process stops.
async fn execute(ctx: &Ctx, cached: &WorkflowRun) {
    let ns = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    let api: Api<WorkflowRun> = Api::namespaced(ctx.client.clone(), &ns);
    // A run already under way (a restart) is read from the API: its records must be the
    // latest. A new one is as the cache shows it.
    let run = if cached
        .status
        .as_ref()
        .is_some_and(|s| s.phase != Phase::Pending)
    {
        match api.get_opt(&name).await {
            Ok(Some(r)) if r.uid() == cached.uid() => r,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(run = %name, error = %e, "reading the run");
                return;
            }
        }
    } else {
        cached.clone()
    };
    let status = run.status.clone().unwrap_or_default();
    if status.phase.finished() {
        return;
    }
    let host = RunHost {
        ctx,
        api: api.clone(),
        ns: ns.clone(),
        name: name.clone(),
        owner: owner(&run),
        start_time: status.start_time.clone().unwrap_or_else(engine::now),
        writes: tokio::sync::Mutex::new(()),
        ended: Default::default(),
    };

    // The definition: the run's own, or its Workflow's (which comes to own the run).
    let mut adopt = None;
    let definition = match (&run.spec.workflow_spec, &run.spec.workflow_ref) {
        (Some(spec), _) => Ok(spec.clone()),
        (None, Some(r)) => {
            let cached = ctx.workflows.get(&ObjectRef::new(&r.name).within(&ns));
            let found = match cached {
                Some(wf) => Ok(Some((*wf).clone())),
                None => {
                    Api::<Workflow>::namespaced(ctx.client.clone(), &ns)
                        .get_opt(&r.name)
                        .await
                }
            };
            match found {
                Ok(Some(wf)) => {
                    if run.owner_references().is_empty() {
                        adopt = Some(json!({"metadata": {"ownerReferences": [owner(&wf)],
                            "labels": {WORKFLOW_LABEL: r.name}}}));
                    }
                    Ok(wf.spec)
                }
                Ok(None) => Err(format!("workflow {:?} not found", r.name)),
                Err(e) => {
                    tracing::warn!(run = %name, error = %e, "reading the workflow");
                    return;
                }
            }
        }
        (None, None) => Err("the run names no workflow (workflowRef or workflowSpec)".into()),
    };
    ctx.gateway.ready().await;
    let checked = definition.and_then(|spec| {
        engine::check(&spec, &|f| ctx.gateway.has_function(&ns, f)).map(|c| (spec, c))
    });
    let (spec, chain) = match checked {
        Ok(c) => c,
        Err(message) => {
            let e = StepError {
                error: "InvalidWorkflow".into(),
                cause: message,
            };
            host.finish(Err(e)).await;
            return;
        }
    };
    // Writes off the steps' path: the run's owner (done when it is done), and its start (the
    // first step's record waits for it, holding the status writes until then).
    let adopting = async {
        if let Some(patch) = adopt
            && let Err(e) = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
        {
            tracing::warn!(run = %name, error = %e, "owning the run by its Workflow");
        }
    };
    let starting = async {
        if status.phase == Phase::Pending {
            let first = host.writes.lock().await;
            let patch = json!({"status": {"phase": Phase::Running, "startTime": host.start_time,
                "step": spec.start_at, "steps": []}});
            // A failure shows again at the first record (a deleted run stops there).
            let _ = host.write(Patch::Merge(patch)).await;
            drop(first);
        }
    };
    let uid = run.uid().unwrap_or_default();
    let walk = Run::new(&host, &uid, status.steps.clone(), spec.max_steps);
    let input = run.spec.input.clone().unwrap_or_else(|| json!({}));
    let walking = async {
        // The start's write takes the lock first.
        tokio::task::yield_now().await;
        walk.walk(String::new(), &chain, input).await
    };
    let ((), (), result) = tokio::join!(adopting, starting, walking);
    match result {
        Ok(output) => host.finish(Ok(output)).await,
        Err(Halt::Failed(e)) => host.finish(Err(e)).await,
        Err(Halt::Stopped(why)) => tracing::info!(run = %name, %why, "the run stopped"),
    }
}

impl RunHost<'_> {
    /// The status fields of a run's end (a large output already in `output_ref`), and the
    /// phase.
    fn ending(
        &self,
        result: Result<Value, StepError>,
        output_ref: Option<String>,
    ) -> (serde_json::Map<String, Value>, String) {
        let end = engine::now();
        let mut fields = serde_json::Map::new();
        if let Some(d) = seconds_between(&self.start_time, &end) {
            fields.insert("duration".into(), json!(format!("{:.3}s", d.max(0.0))));
        }
        fields.insert("completionTime".into(), json!(end));
        let phase = match result {
            Ok(output) => {
                match output_ref {
                    Some(cm) => fields.insert("outputRef".into(), json!(cm)),
                    None => fields.insert("output".into(), output),
                };
                Phase::Succeeded
            }
            Err(e) => {
                fields.insert("error".into(), json!(e.error));
                fields.insert("cause".into(), json!(e.cause));
                Phase::Failed
            }
        };
        fields.insert("phase".into(), json!(phase));
        (fields, format!("{phase:?}"))
    }

    /// Records how a run ended, unless its last step's record did.
    async fn finish(&self, result: Result<Value, StepError>) {
        if self.ended.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut output_ref = None;
        let mut result = result;
        if let Ok(output) = &result
            && too_large(output)
        {
            match self.stash("output", &["run", "output"], output).await {
                Ok(cm) => output_ref = Some(cm),
                Err(Halt::Failed(e)) => result = Err(e),
                Err(Halt::Stopped(_)) => return,
            }
        }
        let (mut fields, phase) = self.ending(result, output_ref);
        fields.insert("step".into(), Value::Null);
        fields.insert("startTime".into(), json!(self.start_time));
        if self
            .write(Patch::Merge(json!({"status": fields})))
            .await
            .is_ok()
        {
            self.ctx
                .metrics
                .runs
                .get_or_create(&PhaseLabels { phase })
                .inc();
        }
    }
}

/// Runs the Workflow and WorkflowRun controllers until `shutdown`; functions are called
/// through `gateway`.
pub async fn run(
    client: Client,
    gateway: Arc<Gateway>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let tasks = TaskTracker::new();
    let informers = Informers::new(client.clone(), tasks.clone(), shutdown.clone());
    let runs = Driver::<WorkflowRun>::new("workflowrun", &informers).await;
    let workflows = Driver::<Workflow>::new("workflow", &informers).await;
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        gateway,
        metrics,
        running: Mutex::default(),
        ended: Mutex::default(),
        runs: runs.store(),
        workflows: workflows.store(),
        shutdown: shutdown.clone(),
    });
    let store = workflows.store();
    let in_namespace = move |ns: Option<String>| {
        store
            .state()
            .into_iter()
            .filter(|w| w.namespace() == ns)
            .map(|w| ObjectRef::from_obj(&*w))
            .collect::<Vec<_>>()
    };
    let workflows = workflows
        // A Function that comes or goes may make its namespace's Workflows valid or not.
        .watches_api(
            Api::<crate::Function>::all(client.clone()),
            watcher::Config::default(),
            move |f| in_namespace(f.namespace()),
        )
        .with(|c| {
            // A run's Workflow counts it (their metadata only: statuses change with every
            // step and are not needed here), and its count need not follow each change.
            c.watches_stream(
                watcher(
                    Api::<kube::core::PartialObjectMeta<WorkflowRun>>::all(client),
                    watcher::Config::default().labels(WORKFLOW_LABEL),
                )
                .touched_objects(),
                |r| {
                    let ns = r.namespace();
                    r.labels().get(WORKFLOW_LABEL).map(|w| {
                        ObjectRef::<Workflow>::new(w).within(ns.as_deref().unwrap_or_default())
                    })
                },
            )
            .with_config(
                kube::runtime::controller::Config::default().debounce(Duration::from_millis(300)),
            )
        });
    tokio::join!(
        runs.run(reconcile_run, ctx.clone(), shutdown.clone()),
        workflows.run(reconcile_workflow, ctx, shutdown),
    );
    tasks.close();
    tasks.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_failures_become_named_step_errors() {
        let e = task_error(500, r#"{"error": "KeyError: 'y'", "traceback": "..."}"#);
        assert_eq!(
            (e.error.as_str(), e.cause.as_str()),
            ("KeyError", "KeyError: 'y'")
        );
        assert_eq!(
            task_error(504, r#"{"error": "did not answer"}"#).error,
            "Timeout"
        );
        assert_eq!(
            task_error(404, "function x not found").error,
            "FunctionNotFound"
        );
        assert_eq!(
            task_error(500, r#"{"error": "a b: c"}"#).error,
            "Function500"
        );
    }
}

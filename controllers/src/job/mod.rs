//! The Job controller (batch/v1): runs up to `parallelism` pods at a time until
//! `completions` have succeeded, counts failures (pod failures, and container restarts under
//! `restartPolicy: OnFailure`) against `backoffLimit`, stops at `activeDeadlineSeconds`,
//! honours `suspend`, writes the Complete/Failed conditions (preceded by SuccessCriteriaMet /
//! FailureTarget as upstream since 1.31) and deletes finished Jobs after
//! `ttlSecondsAfterFinished`. A `podFailurePolicy` decides what a failed pod means
//! ([`policy`]). Indexed Jobs give each pod a completion index (annotation, label, hostname
//! and `JOB_COMPLETION_INDEX`), track `completedIndexes`, limit failures per index
//! (`backoffLimitPerIndex`, `maxFailedIndexes`, `failedIndexes`) and may succeed early by
//! their `successPolicy` ([`indexes`]). Pods are recreated at once: there is no backoff delay
//! between attempts here.
//!
//! Counts never go down: a finished pod that is deleted stays counted, because status keeps
//! the highest count seen (upstream uses a tracking finalizer for the same end).

pub mod indexes;
pub mod policy;

use crate::driver::Driver;
use crate::expectations::Expectations;
use crate::util::{self, controller_of, owner_ref};
use crate::{Error, Result};
use indexes::Indexes;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use policy::Action as Failure;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How a Job ended, with upstream's condition reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// It succeeded: `CompletionsReached`, or `SuccessPolicy`.
    Complete(String, String),
    /// It failed: `BackoffLimitExceeded`, `DeadlineExceeded`, `PodFailurePolicy`,
    /// `MaxFailedIndexesExceeded` or `FailedIndexes`.
    Failed(String, String),
}

impl Finish {
    fn failed(reason: &str, message: &str) -> Self {
        Finish::Failed(reason.into(), message.into())
    }
}

/// The indexes of an Indexed Job that are done.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IndexState {
    /// Indexes whose pod succeeded (`completedIndexes`).
    pub succeeded: Indexes,
    /// Indexes that failed for good (`failedIndexes`, with `backoffLimitPerIndex`).
    pub failed: Indexes,
}

/// What the Job's pods add up to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// Pods running or pending (not terminal, not being deleted), most valuable first (the
    /// ReplicaSet's ranking), so surplus pods are taken from the end.
    pub active: Vec<String>,
    /// Active pods that are Ready.
    pub ready: usize,
    /// Succeeded pods (never fewer than the status already says).
    pub succeeded: i32,
    /// Failed pods plus restarts under OnFailure (never fewer than the status says); pods
    /// the pod failure policy ignores are not counted.
    pub failed: i32,
    /// Pods being deleted.
    pub terminating: usize,
    /// The message of a failed pod that matched a `FailJob` rule.
    pub fail_job: Option<String>,
}

/// Counts the owned pods, keeping the status counts as a floor.
pub fn count(job: &Job, pods: &[&Pod]) -> Counts {
    let status = job.status.as_ref();
    let mut c = Counts::default();
    let mut active: Vec<&Pod> = Vec::new();
    let (mut succeeded, mut failed) = (0, 0);
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            c.terminating += 1;
        }
        match util::phase(p) {
            "Succeeded" => succeeded += 1,
            "Failed" => match policy::action(job, p) {
                Failure::Ignore => {}
                Failure::FailJob(message) => {
                    failed += 1;
                    c.fail_job.get_or_insert(message);
                }
                Failure::FailIndex | Failure::Count => failed += 1,
            },
            _ if p.metadata.deletion_timestamp.is_none() => {
                active.push(p);
                c.ready += usize::from(util::is_ready(p));
            }
            _ => {}
        }
        if p.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("OnFailure") {
            failed += p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum::<i32>());
        }
    }
    active.sort_by_key(|p| std::cmp::Reverse(crate::replicaset::value(p)));
    c.active = active.iter().map(|p| p.name_any()).collect();
    c.succeeded = succeeded.max(status.and_then(|s| s.succeeded).unwrap_or(0));
    c.failed = failed.max(status.and_then(|s| s.failed).unwrap_or(0));
    c
}

/// The Job's condition of type `ty` if it is True.
fn condition<'a>(job: &'a Job, ty: &str) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty && c.status == "True")
}

/// The backoff limit: the spec's, else upstream's default (6, or unlimited when failures
/// are limited per index).
fn backoff_limit(job: &Job) -> i32 {
    let spec = job.spec.as_ref();
    spec.and_then(|s| s.backoff_limit).unwrap_or(
        match spec.and_then(|s| s.backoff_limit_per_index) {
            Some(_) => i32::MAX,
            None => 6,
        },
    )
}

/// Whether the Job has finished, and how, given its counts, how long it has run and (for an
/// Indexed Job) its done indexes, in upstream's order: earlier decisions, the pod failure
/// policy, the backoff limit, the deadline, failed indexes, the success policy, completions.
pub fn finished(
    job: &Job,
    c: &Counts,
    running_for: Option<Duration>,
    indexed: Option<&IndexState>,
) -> Option<Finish> {
    let spec = job.spec.as_ref()?;
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    if let Some(met) = condition(job, "SuccessCriteriaMet") {
        return Some(Finish::Complete(text(&met.reason), text(&met.message)));
    }
    if let Some(target) = condition(job, "FailureTarget") {
        return Some(Finish::Failed(text(&target.reason), text(&target.message)));
    }
    if let Some(message) = &c.fail_job {
        return Some(Finish::failed("PodFailurePolicy", message));
    }
    if c.failed > backoff_limit(job) {
        return Some(Finish::failed(
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        ));
    }
    if let (Some(deadline), Some(ran)) = (spec.active_deadline_seconds, running_for)
        && ran >= Duration::from_secs(deadline.max(0) as u64)
    {
        return Some(Finish::failed(
            "DeadlineExceeded",
            "Job was active longer than specified deadline",
        ));
    }
    if let Some(state) = indexed {
        let completions = spec.completions.unwrap_or(0);
        if spec.backoff_limit_per_index.is_some() {
            let failed = state.failed.len() as i32;
            if spec.max_failed_indexes.is_some_and(|m| failed > m) {
                return Some(Finish::failed(
                    "MaxFailedIndexesExceeded",
                    "Job has exceeded the specified maximal number of failed indexes",
                ));
            }
            if failed > 0 && failed + state.succeeded.len() as i32 >= completions {
                return Some(Finish::failed("FailedIndexes", "Job has failed indexes"));
            }
        }
        if let Some(message) = policy::success(job, completions, &state.succeeded) {
            return Some(Finish::Complete("SuccessPolicy".into(), message));
        }
    }
    let done = match spec.completions {
        Some(n) => c.succeeded >= n,
        // A work queue: done once one pod succeeded and none still runs.
        None => c.succeeded > 0 && c.active.is_empty(),
    };
    done.then(|| {
        Finish::Complete(
            "CompletionsReached".into(),
            "Reached expected number of succeeded pods".into(),
        )
    })
}

/// The done indexes of an Indexed Job: those in its status and those its pods show.
pub fn index_state(job: &Job, pods: &[&Pod]) -> IndexState {
    let spec = job.spec.as_ref();
    let completions = spec.and_then(|s| s.completions).unwrap_or(0);
    let status = job.status.as_ref();
    let mut succeeded = Indexes::parse(
        status
            .and_then(|s| s.completed_indexes.as_deref())
            .unwrap_or_default(),
        completions,
    );
    let mut failed = Indexes::parse(
        status
            .and_then(|s| s.failed_indexes.as_deref())
            .unwrap_or_default(),
        completions,
    );
    let per_index = spec.and_then(|s| s.backoff_limit_per_index);
    for p in pods {
        let Some(i) = indexes::of(p, completions) else {
            continue;
        };
        match util::phase(p) {
            "Succeeded" => {
                succeeded.0.insert(i);
            }
            "Failed" if per_index.is_some() => {
                let gone = match policy::action(job, p) {
                    Failure::FailIndex => true,
                    Failure::Count | Failure::FailJob(_) => {
                        per_index.is_some_and(|limit| indexes::failure_count(p) >= limit)
                    }
                    Failure::Ignore => false,
                };
                if gone {
                    failed.0.insert(i);
                }
            }
            _ => {}
        }
    }
    failed.0.retain(|i| !succeeded.contains(*i));
    IndexState { succeeded, failed }
}

/// How many pods should be active now.
pub fn wanted_active(job: &Job, c: &Counts) -> usize {
    let Some(spec) = job.spec.as_ref() else {
        return 0;
    };
    if spec.suspend == Some(true) {
        return 0;
    }
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    let want = match spec.completions {
        Some(n) => parallelism.min((n - c.succeeded).max(0)),
        None if c.succeeded > 0 => 0,
        None => parallelism,
    };
    want as usize
}

/// The pod a Job creates from its template; for an Indexed Job, the pod of `index` after
/// `failures` counted failures of that index (upstream's name, annotations, label, hostname
/// and `JOB_COMPLETION_INDEX`).
pub fn pod_from_template(job: &Job, index: Option<(i32, i32)>) -> Result<Pod> {
    let template = job
        .spec
        .as_ref()
        .map(|s| &s.template)
        .ok_or_else(|| Error::Invalid("job has no template".into()))?;
    let mut meta = template.metadata.clone().unwrap_or_default();
    meta.name = Some(format!("{}-{}", job.name_any(), util::random_suffix()));
    meta.generate_name = None;
    meta.namespace = job.namespace();
    meta.owner_references = Some(vec![owner_ref(job)]);
    let mut spec = template.spec.clone();
    if let Some((i, failures)) = index {
        meta.name = Some(format!("{}-{i}-{}", job.name_any(), util::random_suffix()));
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(indexes::INDEX.into(), i.to_string());
        if job
            .spec
            .as_ref()
            .is_some_and(|s| s.backoff_limit_per_index.is_some())
        {
            annotations.insert(indexes::FAILURE_COUNT.into(), failures.to_string());
        }
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(indexes::INDEX.into(), i.to_string());
        if let Some(spec) = spec.as_mut() {
            if spec.hostname.as_deref().is_none_or(str::is_empty) {
                spec.hostname = Some(format!("{}-{i}", job.name_any()));
            }
            let containers = spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten());
            for c in containers {
                let env = c.env.get_or_insert_with(Vec::new);
                if !env.iter().any(|e| e.name == indexes::ENV) {
                    env.push(serde_json::from_value(json!({"name": indexes::ENV,
                        "valueFrom": {"fieldRef": {"fieldPath":
                            format!("metadata.annotations['{}']", indexes::INDEX)}}}))?);
                }
            }
        }
    }
    Ok(Pod {
        metadata: meta,
        spec,
        status: None,
    })
}

/// What an Indexed Job does with its pods: the active pods to delete (an index done or held
/// twice, or the Job stopping) and the indexes to start, each with its failures so far.
fn indexed_plan(
    job: &Job,
    pods: &[&Pod],
    c: &Counts,
    state: &IndexState,
    stop: bool,
) -> (Vec<String>, Vec<Option<(i32, i32)>>) {
    let Some(spec) = job.spec.as_ref() else {
        return (vec![], vec![]);
    };
    let completions = spec.completions.unwrap_or(0);
    let stop = stop || spec.suspend == Some(true);
    let by_name: std::collections::HashMap<String, &Pod> =
        pods.iter().map(|p| (p.name_any(), *p)).collect();
    let mut delete = Vec::new();
    let mut kept: BTreeMap<i32, String> = BTreeMap::new();
    for name in &c.active {
        let index = by_name.get(name).and_then(|p| indexes::of(p, completions));
        match index {
            Some(i)
                if !stop
                    && !state.succeeded.contains(i)
                    && !state.failed.contains(i)
                    && !kept.contains_key(&i) =>
            {
                kept.insert(i, name.clone());
            }
            _ => delete.push(name.clone()),
        }
    }
    if stop {
        return (delete, vec![]);
    }
    // Under podReplacementPolicy Failed, an index waits until its terminating pod is gone.
    let waits = spec.pod_replacement_policy.as_deref() == Some("Failed");
    let mut blocked = HashSet::new();
    let mut failures: BTreeMap<i32, i32> = BTreeMap::new();
    for p in pods {
        let Some(i) = indexes::of(p, completions) else {
            continue;
        };
        let phase = util::phase(p);
        if waits
            && p.metadata.deletion_timestamp.is_some()
            && !matches!(phase, "Succeeded" | "Failed")
        {
            blocked.insert(i);
        }
        if phase == "Failed" {
            let counted = i32::from(policy::action(job, p) != Failure::Ignore);
            let n = indexes::failure_count(p) + counted;
            let entry = failures.entry(i).or_insert(0);
            *entry = (*entry).max(n);
        }
    }
    let parallelism = spec.parallelism.unwrap_or(1).max(0) as usize;
    let room = parallelism.saturating_sub(kept.len());
    let create = (0..completions)
        .filter(|i| {
            !state.succeeded.contains(*i)
                && !state.failed.contains(*i)
                && !kept.contains_key(i)
                && !blocked.contains(i)
        })
        .take(room)
        .map(|i| Some((i, failures.get(&i).copied().unwrap_or(0))))
        .collect();
    (delete, create)
}

/// The condition a Job already has as True, by type.
fn has_condition(job: &Job, ty: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == ty && c.status == "True"))
}

/// When the Job finished, if it did.
fn finish_time(job: &Job) -> Option<jiff::Timestamp> {
    let status = job.status.as_ref()?;
    if let Some(t) = &status.completion_time {
        return Some(t.0);
    }
    status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// Context shared by reconciles.
pub struct Ctx {
    /// The API client.
    pub client: Client,
    /// All pods, from an informer.
    pub pods: Store<Pod>,
    /// Creations and deletions not yet seen by the informer.
    pub expectations: Expectations,
    /// Records the Job's events.
    pub recorder: minik8s_events::Recorder,
}

/// Reconciles one Job.
pub async fn reconcile(job: Arc<Job>, ctx: Arc<Ctx>) -> Result<Action> {
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = job.namespace().unwrap_or_default();
    let uid = job.uid().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let now = jiff::Timestamp::now();
    if has_condition(&job, "Complete") || has_condition(&job, "Failed") {
        return expire(&jobs, &job, now).await;
    }
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    // Adopt matching orphans and release pods that no longer match, as upstream's.
    // (The API always sets a Job's selector; without one, only the pods it controls count.)
    let owned = match job.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        Some(sel) => {
            let selector = util::Selector::new(sel);
            util::claim_pods(&pods_api, pods, &selector, owner_ref(job.as_ref())).await?
        }
        None => pods
            .into_iter()
            .filter(|p| controller_of(&p.metadata).is_some_and(|o| o.uid == uid))
            .collect(),
    };
    let refs: Vec<&Pod> = owned.iter().map(AsRef::as_ref).collect();
    let known: HashSet<String> = owned.iter().map(|p| p.name_any()).collect();
    let settled = ctx
        .expectations
        .satisfied(&uid, |n| match n.strip_prefix('-') {
            Some(d) => !known.contains(d),
            None => known.contains(n),
        });
    if !settled {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let mut counts = count(&job, &refs);
    let indexed = job.spec.as_ref().and_then(|s| s.completion_mode.as_deref()) == Some("Indexed");
    let state = indexed.then(|| index_state(&job, &refs));
    if let Some(state) = &state {
        counts.succeeded = state.succeeded.len() as i32;
    }
    let start = job
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0);
    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
    let start = if suspended {
        start
    } else {
        start.or(Some(now))
    };
    let running_for = start.map(|s| Duration::from_secs((now - s).get_seconds().max(0) as u64));
    let finish = finished(&job, &counts, running_for, state.as_ref());
    let want = match &finish {
        Some(_) => 0,
        None => wanted_active(&job, &counts),
    };
    let mut active = counts.active.clone();
    let (extra, create) = match &state {
        Some(state) => indexed_plan(&job, &refs, &counts, state, finish.is_some()),
        None if active.len() > want => (active[want..].to_vec(), vec![]),
        None => (vec![], vec![None; want - active.len()]),
    };
    active.retain(|n| !extra.contains(n));
    if !extra.is_empty() {
        ctx.expectations
            .expect(&uid, extra.iter().map(|n| format!("-{n}")));
        for n in extra {
            match pods_api.delete(&n, &DeleteParams::background()).await {
                Ok(_) => ctx.recorder.normal(
                    &job.object_ref(&()),
                    "SuccessfulDelete",
                    format!("Deleted pod: {n}"),
                ),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    ctx.expectations.forget(&uid, &format!("-{n}"));
                    return Err(e.into());
                }
            }
        }
    } else {
        for index in create {
            let pod = pod_from_template(&job, index)?;
            let name = pod.name_any();
            ctx.expectations.expect(&uid, [name.clone()]);
            if let Err(e) = pods_api.create(&PostParams::default(), &pod).await {
                ctx.expectations.forget(&uid, &name);
                ctx.recorder.warning(
                    &job.object_ref(&()),
                    "FailedCreate",
                    format!("Error creating: {}", util::api_message(&e)),
                );
                return Err(e.into());
            }
            ctx.recorder.normal(
                &job.object_ref(&()),
                "SuccessfulCreate",
                format!("Created pod: {name}"),
            );
            active.push(name);
        }
    }
    let status = status_of(
        &job,
        &counts,
        active.len(),
        start,
        finish.as_ref(),
        state.as_ref(),
        now,
    );
    let mut stored = status.clone();
    if let Some(m) = stored.as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    let changed = serde_json::to_value(job.status.clone().unwrap_or_default())? != stored;
    if changed {
        // The Job's end, said once as upstream: Completed, or the failure's reason.
        let ended = |t: &str| {
            status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == t && c["status"] == "True")
                .filter(|_| !has_condition(&job, t))
        };
        if ended("Complete").is_some() {
            ctx.recorder
                .normal(&job.object_ref(&()), "Completed", "Job completed");
        } else if let Some(c) = ended("Failed") {
            ctx.recorder.warning(
                &job.object_ref(&()),
                c["reason"].as_str().unwrap_or("Failed"),
                c["message"].as_str().unwrap_or_default(),
            );
        }
        jobs.patch_status(
            &job.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
    }
    // Deadlines pass without any event, and informers may lag the trigger: look again soon
    // (a finished Job then waits for its TTL).
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Deletes a finished Job once its TTL is over, or waits for it.
async fn expire(jobs: &Api<Job>, job: &Job, now: jiff::Timestamp) -> Result<Action> {
    let Some(ttl) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
        return Ok(Action::await_change());
    };
    let Some(done) = finish_time(job) else {
        return Ok(Action::await_change());
    };
    let left = ttl as i64 - (now - done).get_seconds();
    if left > 0 {
        return Ok(Action::requeue(Duration::from_secs(left as u64)));
    }
    match jobs
        .delete(&job.name_any(), &DeleteParams::background())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(Action::await_change())
}

/// The Job's status for its counts, as a JSON object (the shape `JobStatus` serializes to).
pub fn status_of(
    job: &Job,
    c: &Counts,
    active: usize,
    start: Option<jiff::Timestamp>,
    finish: Option<&Finish>,
    indexed: Option<&IndexState>,
    now: jiff::Timestamp,
) -> Value {
    let mut status = serde_json::Map::new();
    let mut conditions: Vec<Value> = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .filter_map(|c| serde_json::to_value(c).ok())
                .collect()
        })
        .unwrap_or_default();
    let mut set = |ty: &str, status: &str, reason: &str, message: &str| {
        let fresh = json!({"type": ty, "status": status, "reason": reason, "message": message,
            "lastProbeTime": util::rfc3339(now), "lastTransitionTime": util::rfc3339(now)});
        match conditions.iter_mut().find(|c| c["type"] == ty) {
            Some(c) if c["status"] == status => {}
            Some(c) => *c = fresh,
            None => conditions.push(fresh),
        }
    };
    let suspended = job.spec.as_ref().and_then(|s| s.suspend) == Some(true);
    if suspended {
        set("Suspended", "True", "JobSuspended", "Job suspended");
    } else if has_condition(job, "Suspended") {
        set("Suspended", "False", "JobResumed", "Job resumed");
    }
    // Terminal conditions wait until no pod still runs, as upstream does.
    let settled = active == 0 && c.terminating == 0;
    match finish {
        Some(Finish::Complete(reason, message)) => {
            set("SuccessCriteriaMet", "True", reason, message);
            if settled {
                set("Complete", "True", reason, message);
                status.insert("completionTime".into(), json!(util::rfc3339(now)));
            }
        }
        Some(Finish::Failed(reason, message)) => {
            set("FailureTarget", "True", reason, message);
            if settled {
                set("Failed", "True", reason, message);
            }
        }
        None => {}
    }
    // `start` is the stored startTime when there is one; a finished Job is not reconciled
    // again, so completionTime is written once.
    if let Some(s) = start {
        status.insert("startTime".into(), json!(util::rfc3339(s)));
    }
    // Zero is written as null, so the merge patch removes a count that was there.
    status.insert(
        "active".into(),
        if active > 0 {
            json!(active)
        } else {
            Value::Null
        },
    );
    status.insert("ready".into(), json!(c.ready));
    if c.succeeded > 0 {
        status.insert("succeeded".into(), json!(c.succeeded));
    }
    if c.failed > 0 {
        status.insert("failed".into(), json!(c.failed));
    }
    if let Some(state) = indexed {
        status.insert(
            "completedIndexes".into(),
            json!(state.succeeded.to_string()),
        );
        if job
            .spec
            .as_ref()
            .is_some_and(|s| s.backoff_limit_per_index.is_some())
        {
            status.insert("failedIndexes".into(), json!(state.failed.to_string()));
        }
    }
    status.insert("terminating".into(), json!(c.terminating));
    if !conditions.is_empty() {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    status.insert(
        "uncountedTerminatedPods".into(),
        job.status
            .as_ref()
            .and_then(|s| s.uncounted_terminated_pods.as_ref())
            .map(|u| serde_json::to_value(u).unwrap_or_default())
            .unwrap_or(json!({})),
    );
    Value::Object(status)
}

/// Runs the Job controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let pods = informers.all::<Pod>().await;
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        pods,
        expectations: Expectations::default(),
        recorder: minik8s_events::Recorder::new(client.clone(), "job-controller", None),
    });
    let driver = Driver::<Job>::new("job", &informers).await;
    let jobs = driver.store();
    driver
        // Upstream's --concurrent-job-syncs.
        .workers(5)
        .owns::<Pod>()
        .watches::<Pod, _>(util::orphan_owners(jobs, |j: &Job| {
            j.spec.as_ref()?.selector.clone()
        }))
        .run(reconcile, ctx, shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete() -> Finish {
        Finish::Complete(
            "CompletionsReached".into(),
            "Reached expected number of succeeded pods".into(),
        )
    }

    fn job(completions: Option<i32>, parallelism: i32) -> Job {
        serde_json::from_value(json!({"metadata": {"name": "j", "namespace": "default", "uid": "u1"},
            "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": 2,
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}))
        .unwrap()
    }

    fn pod(name: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": {"phase": phase}}))
            .unwrap()
    }

    #[test]
    fn completions_bound_parallelism_and_success_finishes() {
        let j = job(Some(3), 2);
        let none = count(&j, &[]);
        assert_eq!(wanted_active(&j, &none), 2);
        let (a, b, s) = (
            pod("a", "Running"),
            pod("b", "Succeeded"),
            pod("c", "Succeeded"),
        );
        let c = count(&j, &[&a, &b, &s]);
        assert_eq!((c.active.len(), c.succeeded), (1, 2));
        // One completion left: one pod, and the running one covers it.
        assert_eq!(wanted_active(&j, &c), 1);
        assert_eq!(finished(&j, &c, None, None), None);
        let d = pod("d", "Succeeded");
        let c = count(&j, &[&b, &s, &d]);
        assert_eq!(finished(&j, &c, None, None), Some(complete()));
        assert_eq!(wanted_active(&j, &c), 0);
    }

    #[test]
    fn failures_beyond_the_backoff_limit_and_deadlines_fail_the_job() {
        let j = job(Some(1), 1);
        let f: Vec<Pod> = (0..3).map(|i| pod(&format!("f{i}"), "Failed")).collect();
        let refs: Vec<&Pod> = f.iter().collect();
        let c = count(&j, &refs);
        assert_eq!(
            finished(&j, &c, None, None)
                .map(|f| matches!(f, Finish::Failed(r, _) if r == "BackoffLimitExceeded")),
            Some(true)
        );
        let mut j = job(Some(1), 1);
        j.spec.as_mut().unwrap().active_deadline_seconds = Some(5);
        let c = count(&j, &[]);
        assert_eq!(finished(&j, &c, Some(Duration::from_secs(4)), None), None);
        assert!(matches!(
            finished(&j, &c, Some(Duration::from_secs(5)), None),
            Some(Finish::Failed(r, _)) if r == "DeadlineExceeded"
        ));
    }

    #[test]
    fn counts_never_drop_below_the_status_and_work_queues_finish_on_first_success() {
        let mut j = job(None, 3);
        j.status = Some(serde_json::from_value(json!({"succeeded": 1})).unwrap());
        let c = count(&j, &[]);
        assert_eq!(c.succeeded, 1);
        assert_eq!(wanted_active(&j, &c), 0);
        assert_eq!(finished(&j, &c, None, None), Some(complete()));
        let status = status_of(
            &j,
            &c,
            0,
            None,
            Some(&complete()),
            None,
            jiff::Timestamp::now(),
        );
        let types: Vec<&str> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["SuccessCriteriaMet", "Complete"]);
    }

    fn indexed_job(extra: serde_json::Value) -> Job {
        let mut v = json!({"metadata": {"name": "ix", "namespace": "default", "uid": "u2"},
            "spec": {"completions": 4, "parallelism": 2, "completionMode": "Indexed",
                "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}});
        for (k, val) in extra.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn indexed_pod(index: i32, failures: i32, phase: &str, code: i32) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": format!("ix-{index}-{failures}"), "namespace": "default",
            "annotations": {indexes::INDEX: index.to_string(), indexes::FAILURE_COUNT: failures.to_string()}},
            "status": {"phase": phase, "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "",
                "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": code}}}]}}))
        .unwrap()
    }

    #[test]
    fn indexed_pods_carry_their_index_and_the_lowest_pending_indexes_start() {
        let j = indexed_job(json!({"backoffLimitPerIndex": 1}));
        let pod = pod_from_template(&j, Some((3, 1))).unwrap();
        let meta = &pod.metadata;
        assert!(meta.name.as_deref().unwrap().starts_with("ix-3-"));
        assert_eq!(meta.annotations.as_ref().unwrap()[indexes::INDEX], "3");
        assert_eq!(
            meta.annotations.as_ref().unwrap()[indexes::FAILURE_COUNT],
            "1"
        );
        assert_eq!(meta.labels.as_ref().unwrap()[indexes::INDEX], "3");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("ix-3"));
        let env = spec.containers[0].env.as_ref().unwrap();
        assert_eq!(env[0].name, "JOB_COMPLETION_INDEX");

        // Index 0 succeeded, index 1 failed once (one retry left), index 3 failed twice.
        let (ok0, f1, f3a, f3b) = (
            indexed_pod(0, 0, "Succeeded", 0),
            indexed_pod(1, 0, "Failed", 1),
            indexed_pod(3, 0, "Failed", 1),
            indexed_pod(3, 1, "Failed", 1),
        );
        let pods = [&ok0, &f1, &f3a, &f3b];
        let state = index_state(&j, &pods);
        assert_eq!(state.succeeded.to_string(), "0");
        assert_eq!(state.failed.to_string(), "3");
        let c = count(&j, &pods);
        assert_eq!(c.failed, 3);
        let (delete, create) = indexed_plan(&j, &pods, &c, &state, false);
        assert!(delete.is_empty());
        assert_eq!(create, [Some((1, 1)), Some((2, 0))]);
    }

    #[test]
    fn indexed_jobs_end_by_failed_indexes_success_policy_or_pod_failure_policy() {
        let j = indexed_job(json!({"backoffLimitPerIndex": 0, "maxFailedIndexes": 0}));
        let f0 = indexed_pod(0, 0, "Failed", 1);
        let state = index_state(&j, &[&f0]);
        let c = count(&j, &[&f0]);
        assert!(
            matches!(finished(&j, &c, None, Some(&state)), Some(Finish::Failed(r, _)) if r == "MaxFailedIndexesExceeded")
        );

        let j = indexed_job(json!({"successPolicy": {"rules": [{"succeededIndexes": "0"}]}}));
        let ok0 = indexed_pod(0, 0, "Succeeded", 0);
        let state = index_state(&j, &[&ok0]);
        let c = count(&j, &[&ok0]);
        assert_eq!(
            finished(&j, &c, None, Some(&state)),
            Some(Finish::Complete(
                "SuccessPolicy".into(),
                "Matched rules at index 0".into()
            ))
        );

        let j = indexed_job(json!({"podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1]}}]}}));
        let f = indexed_pod(2, 0, "Failed", 1);
        let c = count(&j, &[&f]);
        assert!(
            matches!(finished(&j, &c, None, None), Some(Finish::Failed(r, m))
            if r == "PodFailurePolicy" && m.ends_with("failed with exit code 1 matching FailJob rule at index 0"))
        );
    }

    /// Reconcile against a mock API: the requests it makes for a given pod store.
    fn reconcile_with(job: Job, pods: Vec<Pod>) -> crate::testing::Calls {
        let m = crate::testing::mock(crate::testing::echo);
        let calls = m.calls.clone();
        let ctx = Arc::new(Ctx {
            client: m.client.clone(),
            pods: crate::testing::store(pods),
            expectations: Expectations::default(),
            recorder: minik8s_events::Recorder::new(m.client.clone(), "job-controller", None),
        });
        m.run(reconcile(Arc::new(job), ctx)).unwrap();
        calls
    }

    fn owned(name: &str, phase: &str) -> Pod {
        let mut p = pod(name, phase);
        p.metadata.namespace = Some("default".into());
        p.metadata.owner_references = Some(vec![owner_ref(&job(Some(3), 2))]);
        p
    }

    #[test]
    fn reconcile_creates_parallelism_pods_then_completes_on_a_mock_api() {
        let calls = reconcile_with(job(Some(3), 2), vec![]);
        let created = crate::testing::matching(&calls, "POST", "/namespaces/default/pods");
        assert_eq!(created.len(), 2);
        assert_eq!(
            created[0].body["metadata"]["ownerReferences"][0]["uid"],
            "u1"
        );
        let status = crate::testing::matching(&calls, "PATCH", "/jobs/j/status");
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].body["status"]["active"], 2);
        assert!(status[0].body["status"]["startTime"].is_string());

        // Three succeeded pods: no creation, and the Job completes.
        let done = vec![
            owned("a", "Succeeded"),
            owned("b", "Succeeded"),
            owned("c", "Succeeded"),
        ];
        let calls = reconcile_with(job(Some(3), 2), done);
        assert!(crate::testing::matching(&calls, "POST", "/pods").is_empty());
        let status = crate::testing::matching(&calls, "PATCH", "/jobs/j/status");
        let types: Vec<&str> = status[0].body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["SuccessCriteriaMet", "Complete"]);
        assert_eq!(status[0].body["status"]["succeeded"], 3);
    }
}

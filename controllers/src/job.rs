//! The Job controller (batch/v1, NonIndexed): runs up to `parallelism` pods at a time until
//! `completions` have succeeded, counts failures (pod failures, and container restarts under
//! `restartPolicy: OnFailure`) against `backoffLimit`, stops at `activeDeadlineSeconds`,
//! honours `suspend`, writes the Complete/Failed conditions (preceded by SuccessCriteriaMet /
//! FailureTarget as upstream since 1.31) and deletes finished Jobs after
//! `ttlSecondsAfterFinished`.
//!
//! Counts never go down: a finished pod that is deleted stays counted, because status keeps
//! the highest count seen (upstream uses a tracking finalizer for the same end).

use crate::driver::Driver;
use crate::expectations::Expectations;
use crate::util::{self, controller_of, owner_ref};
use crate::{Error, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How a Job ended, with upstream's condition reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// All completions succeeded.
    Complete,
    /// It failed: `BackoffLimitExceeded` or `DeadlineExceeded`, with a message.
    Failed(&'static str, String),
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
    /// Failed pods plus restarts under OnFailure (never fewer than the status says).
    pub failed: i32,
    /// Pods being deleted.
    pub terminating: usize,
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
            "Failed" => failed += 1,
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

/// Whether the Job has finished, and how, given its counts and how long it has run.
pub fn finished(job: &Job, c: &Counts, running_for: Option<Duration>) -> Option<Finish> {
    let spec = job.spec.as_ref()?;
    let backoff = spec.backoff_limit.unwrap_or(6);
    if c.failed > backoff {
        return Some(Finish::Failed(
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit".into(),
        ));
    }
    if let (Some(deadline), Some(ran)) = (spec.active_deadline_seconds, running_for)
        && ran >= Duration::from_secs(deadline.max(0) as u64)
    {
        return Some(Finish::Failed(
            "DeadlineExceeded",
            "Job was active longer than specified deadline".into(),
        ));
    }
    let done = match spec.completions {
        Some(n) => c.succeeded >= n,
        // A work queue: done once one pod succeeded and none still runs.
        None => c.succeeded > 0 && c.active.is_empty(),
    };
    done.then_some(Finish::Complete)
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

/// The pod a Job creates from its template.
pub fn pod_from_template(job: &Job) -> Result<Pod> {
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
    Ok(Pod {
        metadata: meta,
        spec: template.spec.clone(),
        status: None,
    })
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
    let counts = count(&job, &refs);
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
    let finish = finished(&job, &counts, running_for);
    let want = match &finish {
        Some(_) => 0,
        None => wanted_active(&job, &counts),
    };
    let mut active = counts.active.clone();
    if active.len() > want {
        let extra: Vec<String> = active.split_off(want);
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
    } else if active.len() < want {
        for _ in active.len()..want {
            let pod = pod_from_template(&job)?;
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
    let status = status_of(&job, &counts, active.len(), start, finish.as_ref(), now);
    let changed = serde_json::to_value(job.status.clone().unwrap_or_default())? != status;
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
        Some(Finish::Complete) => {
            set(
                "SuccessCriteriaMet",
                "True",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            );
            if settled {
                set(
                    "Complete",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                );
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
    if active > 0 {
        status.insert("active".into(), json!(active));
    }
    status.insert("ready".into(), json!(c.ready));
    if c.succeeded > 0 {
        status.insert("succeeded".into(), json!(c.succeeded));
    }
    if c.failed > 0 {
        status.insert("failed".into(), json!(c.failed));
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
        assert_eq!(finished(&j, &c, None), None);
        let d = pod("d", "Succeeded");
        let c = count(&j, &[&b, &s, &d]);
        assert_eq!(finished(&j, &c, None), Some(Finish::Complete));
        assert_eq!(wanted_active(&j, &c), 0);
    }

    #[test]
    fn failures_beyond_the_backoff_limit_and_deadlines_fail_the_job() {
        let j = job(Some(1), 1);
        let f: Vec<Pod> = (0..3).map(|i| pod(&format!("f{i}"), "Failed")).collect();
        let refs: Vec<&Pod> = f.iter().collect();
        let c = count(&j, &refs);
        assert_eq!(
            finished(&j, &c, None).map(|f| matches!(f, Finish::Failed("BackoffLimitExceeded", _))),
            Some(true)
        );
        let mut j = job(Some(1), 1);
        j.spec.as_mut().unwrap().active_deadline_seconds = Some(5);
        let c = count(&j, &[]);
        assert_eq!(finished(&j, &c, Some(Duration::from_secs(4))), None);
        assert!(matches!(
            finished(&j, &c, Some(Duration::from_secs(5))),
            Some(Finish::Failed("DeadlineExceeded", _))
        ));
    }

    #[test]
    fn counts_never_drop_below_the_status_and_work_queues_finish_on_first_success() {
        let mut j = job(None, 3);
        j.status = Some(serde_json::from_value(json!({"succeeded": 1})).unwrap());
        let c = count(&j, &[]);
        assert_eq!(c.succeeded, 1);
        assert_eq!(wanted_active(&j, &c), 0);
        assert_eq!(finished(&j, &c, None), Some(Finish::Complete));
        let status = status_of(
            &j,
            &c,
            0,
            None,
            Some(&Finish::Complete),
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

//! The CronJob controller: creates a Job from `jobTemplate` at each time of `schedule` (UTC;
//! see [`crate::cron`]), named `<cronjob>-<minutes since the epoch>` as upstream so a time is
//! never run twice, honouring `suspend`, `startingDeadlineSeconds` and `concurrencyPolicy`
//! (Allow, Forbid, Replace). It keeps `status.active`, `lastScheduleTime` and
//! `lastSuccessfulTime`, and deletes finished Jobs beyond the history limits.

use crate::cron::Schedule;
use crate::driver::Driver;
use crate::util::{self, controller_of, owner_ref};
use crate::{Error, Result};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Most missed times looked at; beyond that only the latest counts (upstream warns at 100).
const MAX_MISSED: usize = 100;

/// The latest scheduled time in `(since, now]`, unless it is older than the starting deadline.
pub fn due(
    schedule: &Schedule,
    since: Timestamp,
    now: Timestamp,
    starting_deadline: Option<i64>,
) -> Option<Timestamp> {
    let (mut latest, complete) = latest_in(schedule, since, now);
    if !complete {
        // Many missed times: look back from now in widening windows for the last one.
        for secs in [61, 3_601, 86_401, 32 * 86_400, 367 * 86_400] {
            let Ok(from) = now.checked_sub(jiff::SignedDuration::from_secs(secs)) else {
                break;
            };
            if from <= since {
                break;
            }
            if let (Some(t), true) = latest_in(schedule, from, now) {
                latest = Some(t);
                break;
            }
        }
    }
    let latest = latest?;
    match starting_deadline {
        Some(d) if (now - latest).get_seconds() > d => None,
        _ => Some(latest),
    }
}

/// The last scheduled time in `(from, now]` among the first [`MAX_MISSED`], and whether
/// that covered the whole interval.
fn latest_in(schedule: &Schedule, from: Timestamp, now: Timestamp) -> (Option<Timestamp>, bool) {
    let mut latest = None;
    let mut t = from;
    for _ in 0..MAX_MISSED {
        match schedule.next_after(t) {
            Some(next) if next <= now => {
                latest = Some(next);
                t = next;
            }
            _ => return (latest, true),
        }
    }
    (latest, false)
}

/// The name of the Job for a scheduled time.
pub fn job_name(cronjob: &str, scheduled: Timestamp) -> String {
    format!("{cronjob}-{}", scheduled.as_second() / 60)
}

/// Whether a Job has finished, and whether it succeeded.
pub fn outcome(job: &Job) -> Option<bool> {
    let conds = job.status.as_ref()?.conditions.as_ref()?;
    conds
        .iter()
        .filter(|c| c.status == "True")
        .find_map(|c| match c.type_.as_str() {
            "Complete" => Some(true),
            "Failed" => Some(false),
            _ => None,
        })
}

/// The finished Jobs to delete: the oldest beyond each history limit.
pub fn beyond_history(jobs: &[&Job], successful: usize, failed: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (wanted, keep) in [(true, successful), (false, failed)] {
        let mut done: Vec<&&Job> = jobs.iter().filter(|j| outcome(j) == Some(wanted)).collect();
        done.sort_by_key(|j| j.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let extra = done.len().saturating_sub(keep);
        out.extend(done.iter().take(extra).map(|j| j.name_any()));
    }
    out
}

/// The Job a CronJob creates for a scheduled time.
pub fn job_for(cj: &CronJob, scheduled: Timestamp) -> Result<Job> {
    let template = cj
        .spec
        .as_ref()
        .map(|s| &s.job_template)
        .ok_or_else(|| Error::Invalid("cronjob has no jobTemplate".into()))?;
    let mut meta = template.metadata.clone().unwrap_or_default();
    meta.name = Some(job_name(&cj.name_any(), scheduled));
    meta.namespace = cj.namespace();
    meta.owner_references = Some(vec![owner_ref(cj)]);
    meta.annotations.get_or_insert_default().insert(
        "batch.kubernetes.io/cronjob-scheduled-timestamp".into(),
        util::rfc3339(scheduled),
    );
    Ok(Job {
        metadata: meta,
        spec: template.spec.clone(),
        status: None,
    })
}

struct Ctx {
    client: Client,
    jobs: Store<Job>,
    recorder: minik8s_events::Recorder,
}

async fn reconcile(cj: Arc<CronJob>, ctx: Arc<Ctx>) -> Result<Action> {
    if cj.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = cj.namespace().unwrap_or_default();
    let uid = cj.uid().unwrap_or_default();
    let spec = cj
        .spec
        .as_ref()
        .ok_or_else(|| Error::Invalid("no spec".into()))?;
    let jobs_api: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let cronjobs: Api<CronJob> = Api::namespaced(ctx.client.clone(), &ns);
    let schedule = Schedule::parse(&spec.schedule).map_err(|e| Error::Invalid(e.to_string()))?;
    let owned: Vec<Arc<Job>> = ctx
        .jobs
        .state()
        .into_iter()
        .filter(|j| {
            j.namespace().as_deref() == Some(ns.as_str())
                && controller_of(&j.metadata).is_some_and(|o| o.uid == uid)
        })
        .collect();
    let mut active: Vec<String> = owned
        .iter()
        .filter(|j| outcome(j).is_none() && j.metadata.deletion_timestamp.is_none())
        .map(|j| j.name_any())
        .collect();
    let now = Timestamp::now();
    let last = cj
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .map(|t| t.0);
    let created = cj.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let mut scheduled = None;
    if spec.suspend != Some(true)
        && let Some(t) = due(
            &schedule,
            last.unwrap_or(created),
            now,
            spec.starting_deadline_seconds,
        )
    {
        let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
        let run = match policy {
            "Forbid" => active.is_empty(),
            "Replace" => {
                for name in active.drain(..) {
                    match jobs_api.delete(&name, &DeleteParams::background()).await {
                        Ok(_) => ctx.recorder.normal(
                            &cj.object_ref(&()),
                            "SuccessfulDelete",
                            format!("Deleted job {name}"),
                        ),
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                true
            }
            _ => true,
        };
        if run {
            let job = job_for(&cj, t)?;
            match jobs_api.create(&PostParams::default(), &job).await {
                Ok(created) => ctx.recorder.normal(
                    &cj.object_ref(&()),
                    "SuccessfulCreate",
                    format!("Created job {}", created.name_any()),
                ),
                // Created before (a lagging informer or a restart): the time is done.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    ctx.recorder.warning(
                        &cj.object_ref(&()),
                        "FailedCreate",
                        format!("Error creating job: {}", util::api_message(&e)),
                    );
                    return Err(e.into());
                }
            }
            let name = job_name(&cj.name_any(), t);
            if !active.contains(&name) {
                active.push(name);
            }
            scheduled = Some(t);
        }
    }
    let last_success = owned
        .iter()
        .filter(|j| outcome(j) == Some(true))
        .filter_map(|j| j.status.as_ref()?.completion_time.as_ref().map(|t| t.0))
        .max();
    let refs: Vec<serde_json::Value> = active
        .iter()
        .map(|n| {
            let uid = owned
                .iter()
                .find(|j| j.name_any() == *n)
                .and_then(|j| j.uid());
            json!({"apiVersion": "batch/v1", "kind": "Job", "namespace": ns, "name": n, "uid": uid})
        })
        .collect();
    let mut status =
        json!({"active": if refs.is_empty() { serde_json::Value::Null } else { json!(refs) }});
    if let Some(t) = scheduled.or(last) {
        status["lastScheduleTime"] = json!(util::rfc3339(t));
    }
    if let Some(t) = last_success {
        status["lastSuccessfulTime"] = json!(util::rfc3339(t));
    }
    let current = serde_json::to_value(cj.status.clone().unwrap_or_default())?;
    let differs = ["active", "lastScheduleTime", "lastSuccessfulTime"]
        .iter()
        .any(|k| current.get(k).unwrap_or(&serde_json::Value::Null) != &status[k]);
    if differs {
        cronjobs
            .patch_status(
                &cj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await?;
    }
    let jobs: Vec<&Job> = owned.iter().map(AsRef::as_ref).collect();
    for name in beyond_history(
        &jobs,
        spec.successful_jobs_history_limit.unwrap_or(3).max(0) as usize,
        spec.failed_jobs_history_limit.unwrap_or(1).max(0) as usize,
    ) {
        match jobs_api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => ctx.recorder.normal(
                &cj.object_ref(&()),
                "SuccessfulDelete",
                format!("Deleted job {name}"),
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Wake for the next time, and meanwhile notice Jobs finishing (for history and status).
    let next = schedule
        .next_after(now)
        .map(|t| (t - now).get_seconds().max(1) as u64)
        .unwrap_or(3600);
    Ok(Action::requeue(Duration::from_secs(next.min(10))))
}

/// Runs the CronJob controller until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let jobs = informers.all::<Job>().await;
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        jobs,
        recorder: minik8s_events::Recorder::new(client.clone(), "cronjob-controller", None),
    });
    Driver::<CronJob>::new("cronjob", &informers)
        .await
        // Upstream's --concurrent-cron-job-syncs.
        .workers(5)
        .owns::<Job>()
        .run(reconcile, ctx, shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn due_picks_the_latest_missed_time_within_the_deadline() {
        let every = Schedule::parse("*/10 * * * *").unwrap();
        let since = ts("2026-01-01T10:00:00Z");
        assert_eq!(due(&every, since, ts("2026-01-01T10:09:59Z"), None), None);
        assert_eq!(
            due(&every, since, ts("2026-01-01T10:35:00Z"), None),
            Some(ts("2026-01-01T10:30:00Z"))
        );
        // Missed by more than the starting deadline: skipped.
        assert_eq!(
            due(&every, since, ts("2026-01-01T10:35:00Z"), Some(60)),
            None
        );
        // Long downtime: the latest time still wins.
        assert_eq!(
            due(&every, since, ts("2026-03-01T00:05:00Z"), None),
            Some(ts("2026-03-01T00:00:00Z"))
        );
        assert_eq!(
            job_name("backup", ts("2026-01-01T10:30:00Z")),
            format!("backup-{}", ts("2026-01-01T10:30:00Z").as_second() / 60)
        );
    }

    #[test]
    fn history_limits_delete_the_oldest_finished_jobs() {
        let job = |name: &str, created: &str, cond: Option<&str>| -> Job {
            serde_json::from_value(json!({"metadata": {"name": name, "creationTimestamp": created},
                "status": {"conditions": cond.map(|c| vec![json!({"type": c, "status": "True"})])}}))
            .unwrap()
        };
        let jobs = [
            job("a", "2026-01-01T00:00:00Z", Some("Complete")),
            job("b", "2026-01-01T00:01:00Z", Some("Complete")),
            job("c", "2026-01-01T00:02:00Z", Some("Failed")),
            job("d", "2026-01-01T00:03:00Z", Some("Failed")),
            job("e", "2026-01-01T00:04:00Z", None),
        ];
        let refs: Vec<&Job> = jobs.iter().collect();
        assert_eq!(beyond_history(&refs, 1, 1), ["a", "c"]);
        assert!(beyond_history(&refs, 3, 3).is_empty());
    }

    #[test]
    fn reconcile_creates_the_due_job_once_on_a_mock_api() {
        let created = util::rfc3339(Timestamp::now() - jiff::SignedDuration::from_secs(90));
        let cj: CronJob = serde_json::from_value(json!({
            "metadata": {"name": "tick", "namespace": "default", "uid": "cj1", "creationTimestamp": created},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}}))
        .unwrap();
        let m = crate::testing::mock(crate::testing::echo);
        let calls = m.calls.clone();
        let ctx = Arc::new(Ctx {
            client: m.client.clone(),
            jobs: crate::testing::store(Vec::<Job>::new()),
            recorder: minik8s_events::Recorder::new(m.client.clone(), "cronjob-controller", None),
        });
        m.run(reconcile(Arc::new(cj), ctx)).unwrap();
        let jobs = crate::testing::matching(&calls, "POST", "/namespaces/default/jobs");
        assert_eq!(jobs.len(), 1, "only the latest missed minute runs");
        let name = jobs[0].body["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(name.starts_with("tick-"), "{name}");
        let status = crate::testing::matching(&calls, "PATCH", "/cronjobs/tick/status");
        assert_eq!(status[0].body["status"]["active"][0]["name"], name.as_str());
        assert!(status[0].body["status"]["lastScheduleTime"].is_string());
    }
}

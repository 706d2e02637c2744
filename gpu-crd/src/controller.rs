//! The GPUJob controller: each job becomes one Slurm batch job on its cluster's login node.
//!
//! - A job gets a finalizer first, so deleting it cancels its Slurm job (`scancel`) and
//!   removes its folder on the cluster before the object goes.
//! - Submission is idempotent: the Slurm job is named by the object's uid, and before
//!   anything is submitted the controller looks for a job of that name in a read of Slurm's
//!   jobs started after it decided to submit. A controller that died between `sbatch` and recording the id finds it
//!   there instead of submitting again; a recorded id is followed as it is.
//! - Sources (inline or from a ConfigMap) and the batch script are written into
//!   `<workDir>/<uid>` and submitted in one SSH session; `sbatch`'s refusal (a partition that
//!   does not exist, more GPUs than any node has) fails the job with its message.
//! - Jobs are followed with `scontrol -o show job` (there is no slurmdbd for `sacct` on the
//!   project's Slurm; finished jobs stay visible for `MinJobAge`): one read of all jobs per
//!   cluster serves every GPUJob polled within half a second, each polled every second at
//!   first and backing off to 8 s while nothing changes; each Slurm state maps to a phase and
//!   reason (see [`crate::slurm::phase_of`]).
//! - When it ends, the tails of stdout, stderr and the result go into the status, and the
//!   result (the `resultFile`, else stdout) into the ConfigMap `<job>-result` owned by the job
//!   (at most 1 MiB; beyond that it is cut and annotated `gpu.minik8s.io/truncated`). A failed
//!   build is `Failed`/`BuildFailed` with the compiler's output as stderr.
//! - An unreachable login node leaves the job as it is with `ClusterReachable=False`, retried
//!   every 5 s; the condition turns True when the node answers again.

use crate::slurm::{self, Job};
use crate::ssh::{self, Login, Target};
use crate::types::{GPUJob, GPUJobStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use minik8s_controllers::driver::Driver;
use minik8s_controllers::informer::Informers;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The finalizer that cancels a job's Slurm job and removes its folder.
pub const FINALIZER: &str = "gpu.minik8s.io/slurm-cleanup";

/// The namespace of the clusters' Secrets (`slurm-<cluster>`).
pub const SECRET_NAMESPACE: &str = "gpu-system";

/// The annotation on a result ConfigMap whose result was cut at 1 MiB.
pub const TRUNCATED: &str = "gpu.minik8s.io/truncated";

/// How long one SSH command may take.
const SSH_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a reconcile failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("api: {0}")]
    Kube(#[from] kube::Error),
    /// Talking to the login node failed.
    #[error(transparent)]
    Ssh(#[from] ssh::Error),
    /// A status could not be serialised.
    #[error("serialization: {0}")]
    Json(#[from] serde_json::Error),
}

/// What reconciles share.
pub struct Ctx {
    client: Client,
    /// The clusters' Secrets (`gpu-system`), watched.
    secrets: Store<Secret>,
    /// Clusters by name, with the Secret's resourceVersion they were made from.
    logins: tokio::sync::Mutex<HashMap<String, (String, Arc<Cluster>)>>,
    /// Polls in a row without a change, by job uid (for the back-off).
    quiet: Mutex<HashMap<String, u32>>,
    /// Where key files go.
    dir: PathBuf,
}

/// The Lease (in [`SECRET_NAMESPACE`]) whose holder runs the controller.
pub const LEASE: &str = "gpujob-controller";

/// Runs the controller while this process holds the [`LEASE`], until `shutdown`: with a
/// controller on every control-plane machine, one submits and polls jobs and the others
/// stand by, taking over within 15 s of its death (`minik8s_controllers::leader`). Key files
/// live under `dir`.
pub async fn run(client: Client, dir: PathBuf, shutdown: CancellationToken) {
    let mut cfg =
        minik8s_controllers::leader::Config::new(LEASE, minik8s_controllers::leader::identity());
    cfg.namespace = SECRET_NAMESPACE.into();
    minik8s_controllers::leader::run(client.clone(), cfg, shutdown, move |leading| {
        lead(client.clone(), dir.clone(), leading)
    })
    .await
}

/// Runs the controller until `shutdown` (leadership lost, or the process stopping).
async fn lead(client: Client, dir: PathBuf, shutdown: CancellationToken) {
    let tasks = TaskTracker::new();
    let informers = Informers::new(client.clone(), tasks.clone(), shutdown.clone());
    let secrets = minik8s_controllers::informer::start(
        Api::<Secret>::namespaced(client.clone(), SECRET_NAMESPACE),
        watcher::Config::default(),
        &tasks,
        &shutdown,
    );
    // The Secrets are known before the first job is looked at.
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = secrets.wait_until_ready() => {}
    }
    let ctx = Arc::new(Ctx {
        secrets,
        client: client.clone(),
        logins: tokio::sync::Mutex::new(HashMap::new()),
        quiet: Mutex::new(HashMap::new()),
        dir,
    });
    Driver::<GPUJob>::new("gpujob", &informers)
        .await
        // A failure is the login node's or Slurm's: give it time.
        .first_retry(Duration::from_secs(2))
        .run(reconcile, ctx.clone(), shutdown)
        .await;
    let clusters: Vec<Arc<Cluster>> = ctx
        .logins
        .lock()
        .await
        .values()
        .map(|(_, c)| c.clone())
        .collect();
    for c in clusters {
        c.login.close().await;
    }
    tasks.close();
    tasks.wait().await;
}

impl Ctx {
    /// The cluster named `cluster`, from its Secret (`Err`: why there is none).
    async fn login(&self, cluster: &str) -> Result<Result<Arc<Cluster>, String>, Error> {
        let name = format!("slurm-{cluster}");
        let key = ObjectRef::new(&name).within(SECRET_NAMESPACE);
        let Some(secret) = self.secrets.get(&key) else {
            return Ok(Err(format!(
                "no Slurm cluster {cluster:?}: the Secret {SECRET_NAMESPACE}/{name} does not exist (hack/slurm.sh up registers one)"
            )));
        };
        let version = secret.resource_version().unwrap_or_default();
        // Made once per Secret version, under the lock, so concurrent jobs share one
        // connection instead of each opening its own.
        let mut logins = self.logins.lock().await;
        if let Some((v, c)) = logins.get(cluster)
            && *v == version
        {
            return Ok(Ok(c.clone()));
        }
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        let target = match Target::from_data(&data) {
            Ok(t) => t,
            Err(e) => return Ok(Err(e.to_string())),
        };
        if let Some((_, old)) = logins.get(cluster) {
            old.login.close().await;
        }
        let login = Login::new(target, self.dir.join(cluster))?;
        // Opens the shared connection (an unreachable node shows up when it is used).
        let _ = login.run("true", None, SSH_TIMEOUT).await;
        let c = Arc::new(Cluster {
            login,
            jobs: tokio::sync::Mutex::new(None),
        });
        logins.insert(cluster.to_owned(), (version, c.clone()));
        Ok(Ok(c))
    }

    /// The next poll interval of `uid`: 1 s, doubling to 8 s while nothing changes.
    fn next_poll(&self, uid: &str, changed: bool) -> Duration {
        let mut q = self.quiet.lock().expect("quiet");
        let n = q.entry(uid.to_owned()).or_default();
        *n = if changed { 0 } else { (*n + 1).min(3) };
        Duration::from_secs(1 << *n)
    }

    fn forget(&self, uid: &str) {
        self.quiet.lock().expect("quiet").remove(uid);
    }
}

/// A Slurm cluster: its login node and its last look at the jobs.
pub struct Cluster {
    login: Login,
    jobs: tokio::sync::Mutex<Option<Arc<Snapshot>>>,
}

/// Every job Slurm knows (`scontrol -o show job`), read in one SSH command for all GPUJobs.
pub struct Snapshot {
    /// When the read started (it shows every job submitted before).
    at: Instant,
    records: Vec<BTreeMap<String, String>>,
}

impl Snapshot {
    /// The record of job `id`.
    pub fn by_id(&self, id: &str) -> Option<&BTreeMap<String, String>> {
        self.records
            .iter()
            .find(|r| r.get("JobId").map(String::as_str) == Some(id))
    }

    /// The id of the (first) job named `name`.
    pub fn by_name(&self, name: &str) -> Option<String> {
        self.records
            .iter()
            .filter(|r| r.get("JobName").map(String::as_str) == Some(name))
            .filter_map(|r| r.get("JobId").cloned())
            .min_by_key(|id| id.parse::<u64>().unwrap_or(u64::MAX))
    }
}

impl Cluster {
    /// Slurm's jobs as read after `fresh_after`: concurrent callers share one read.
    async fn jobs(&self, fresh_after: Instant) -> Result<Arc<Snapshot>, Error> {
        let mut cached = self.jobs.lock().await;
        if let Some(s) = cached.as_ref()
            && s.at >= fresh_after
        {
            return Ok(s.clone());
        }
        let at = Instant::now();
        let out = self
            .login
            .run("scontrol -o show job", None, SSH_TIMEOUT)
            .await?;
        let records = out
            .stdout
            .lines()
            .map(slurm::parse_record)
            .filter(|r| r.contains_key("JobId"))
            .collect();
        let snap = Arc::new(Snapshot { at, records });
        *cached = Some(snap.clone());
        Ok(snap)
    }
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// A Slurm time (local, as Slurm prints it) as RFC 3339.
pub fn slurm_time(t: &str) -> Option<String> {
    let dt: jiff::civil::DateTime = t.parse().ok()?;
    let z = dt.to_zoned(jiff::tz::TimeZone::system()).ok()?;
    Some(z.timestamp().to_string())
}

/// A duration as Go prints it (`12s`, `3m4s`, `1h0m5s`).
pub fn go_duration(secs: i64) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

fn duration_between(start: Option<&str>, end: Option<&str>) -> Option<String> {
    let start: jiff::Timestamp = start?.parse().ok()?;
    let end: jiff::Timestamp = match end {
        Some(e) => e.parse().ok()?,
        None => jiff::Timestamp::now(),
    };
    Some(go_duration((end - start).get_seconds().max(0)))
}

fn reachable(status: &mut GPUJobStatus, ok: bool, reason: &str, message: &str) {
    let value = if ok { "True" } else { "False" };
    let existing = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == "ClusterReachable");
    match existing {
        Some(c) if c.status == value && c.reason == reason => {
            c.message = message.to_owned();
        }
        Some(c) => {
            c.status = value.into();
            c.reason = reason.into();
            c.message = message.to_owned();
            c.last_transition_time = Time(jiff::Timestamp::now());
        }
        None => status.conditions.push(Condition {
            type_: "ClusterReachable".into(),
            status: value.into(),
            reason: reason.into(),
            message: message.to_owned(),
            last_transition_time: Time(jiff::Timestamp::now()),
            observed_generation: None,
        }),
    }
}

async fn write_status(api: &Api<GPUJob>, name: &str, status: &GPUJobStatus) -> Result<(), Error> {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": status})),
    )
    .await?;
    Ok(())
}

async fn reconcile(job: Arc<GPUJob>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let uid = job.uid().unwrap_or_default();
    let api: Api<GPUJob> = Api::namespaced(ctx.client.clone(), &ns);
    let cluster = job
        .spec
        .cluster
        .clone()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "default".into());
    let has_finalizer = job.finalizers().iter().any(|f| f == FINALIZER);
    if job.metadata.deletion_timestamp.is_some() {
        if has_finalizer {
            if let Ok(c) = ctx.login(&cluster).await? {
                cleanup(&c, &job).await?;
            }
            let rest: Vec<&String> = job
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .collect();
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"finalizers": rest}})),
            )
            .await?;
            ctx.forget(&uid);
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        let mut list: Vec<String> = job.finalizers().to_vec();
        list.push(FINALIZER.into());
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": list, "resourceVersion": job.resource_version()}})),
        )
        .await?;
        return Ok(Action::await_change());
    }
    let mut status = job.status.clone().unwrap_or_default();
    if status.finished() {
        ctx.forget(&uid);
        return Ok(Action::await_change());
    }
    let slurm_cluster = match ctx.login(&cluster).await? {
        Ok(l) => l,
        Err(message) => {
            let before = status.clone();
            status.phase.get_or_insert_with(|| "Pending".into());
            reachable(&mut status, false, "NoCluster", &message);
            if status != before {
                write_status(&api, &name, &status).await?;
            }
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    };
    let step = match &status.slurm_job_id {
        None => submit(&ctx, &api, &job, &slurm_cluster, status.clone()).await,
        Some(id) => follow(&ctx, &api, &job, &slurm_cluster, id, status.clone()).await,
    };
    match step {
        Err(Error::Ssh(e @ ssh::Error::Unreachable { .. })) => {
            let before = status.clone();
            status.phase.get_or_insert_with(|| "Pending".into());
            reachable(&mut status, false, "Unreachable", &e.to_string());
            if status != before {
                write_status(&api, &name, &status).await?;
            }
            Ok(Action::requeue(Duration::from_secs(5)))
        }
        other => other,
    }
}

/// Cancels the job's Slurm job (if any) and removes its folder.
async fn cleanup(cluster: &Cluster, job: &GPUJob) -> Result<(), Error> {
    let login = &cluster.login;
    let uid = job.uid().unwrap_or_default();
    let dir = format!("{}/{uid}", login.target().work_dir);
    let id = job.status.as_ref().and_then(|s| s.slurm_job_id.clone());
    // By name too: a submission whose id was never recorded.
    let cancel = match id {
        Some(id) => format!("scancel {id}; scancel --name={uid}"),
        None => format!("scancel --name={uid}"),
    };
    let out = login
        .run(
            &format!("{cancel}; rm -rf {}", slurm::quote(&dir)),
            None,
            SSH_TIMEOUT,
        )
        .await?;
    tracing::info!(job = %job.name_any(), code = out.code, "cancelled and cleaned up");
    Ok(())
}

/// The job's files: the inline ones and those of its ConfigMap.
async fn sources(
    client: &Client,
    job: &GPUJob,
) -> Result<Result<BTreeMap<String, Vec<u8>>, String>, Error> {
    let mut files: BTreeMap<String, Vec<u8>> = job
        .spec
        .source
        .inline
        .iter()
        .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
        .collect();
    if let Some(r) = &job.spec.source.config_map_ref {
        let api: Api<ConfigMap> =
            Api::namespaced(client.clone(), &job.namespace().unwrap_or_default());
        let Some(cm) = api.get_opt(&r.name).await? else {
            return Ok(Err(format!("configmap {:?} not found", r.name)));
        };
        for (k, v) in cm.data.unwrap_or_default() {
            files.insert(k, v.into_bytes());
        }
        for (k, v) in cm.binary_data.unwrap_or_default() {
            files.insert(k, v.0);
        }
    }
    if let Some(bad) = files.keys().find(|k| !slurm::valid_file_name(k)) {
        return Ok(Err(format!(
            "source file name {bad:?} is not a plain file name"
        )));
    }
    Ok(Ok(files))
}

async fn submit(
    ctx: &Ctx,
    api: &Api<GPUJob>,
    job: &GPUJob,
    cluster: &Cluster,
    mut status: GPUJobStatus,
) -> Result<Action, Error> {
    let login = &cluster.login;
    let name = job.name_any();
    let uid = job.uid().unwrap_or_default();
    let dir = format!("{}/{uid}", login.target().work_dir);
    // A job of this name already in Slurm was submitted by an earlier run of the controller
    // (a read that started now shows every job submitted before).
    let found = cluster.jobs(Instant::now()).await?.by_name(&uid);
    reachable(&mut status, true, "Connected", "the login node answers");
    if let Some(id) = found {
        tracing::info!(job = %name, slurm = %id, "re-attached to the job submitted before");
        status.slurm_job_id = Some(id);
        status.phase = Some("Submitted".into());
        write_status(api, &name, &status).await?;
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let files = match sources(&ctx.client, job).await? {
        Ok(f) => f,
        Err(message) => {
            status.phase = Some("Failed".into());
            status.reason = Some("InvalidSource".into());
            status.message = Some(message);
            write_status(api, &name, &status).await?;
            return Ok(Action::await_change());
        }
    };
    let batch = slurm::batch_script(&job.spec, &uid, &dir);
    let script = slurm::submit_script(&dir, &files, &batch);
    let out = login.run("sh -s", Some(&script), SSH_TIMEOUT).await?;
    match slurm::parse_job_id(&out.stdout).filter(|_| out.code == 0) {
        Some(id) => {
            tracing::info!(job = %name, slurm = %id, "submitted");
            status.slurm_job_id = Some(id);
            status.phase = Some("Submitted".into());
            status.submit_time = Some(now());
            write_status(api, &name, &status).await?;
            Ok(Action::requeue(Duration::from_millis(300)))
        }
        None => {
            // sbatch refused it: nothing runs, and the folder goes.
            let _ = login
                .run(&format!("rm -rf {}", slurm::quote(&dir)), None, SSH_TIMEOUT)
                .await;
            let message = out.stderr.trim().to_owned();
            tracing::info!(job = %name, %message, "sbatch refused the job");
            status.phase = Some("Failed".into());
            status.reason = Some("SubmitFailed".into());
            status.message = Some(if message.is_empty() {
                format!("sbatch printed no job id: {}", out.stdout.trim())
            } else {
                message
            });
            write_status(api, &name, &status).await?;
            Ok(Action::await_change())
        }
    }
}

async fn follow(
    ctx: &Ctx,
    api: &Api<GPUJob>,
    job: &GPUJob,
    cluster: &Cluster,
    id: &str,
    mut status: GPUJobStatus,
) -> Result<Action, Error> {
    let login = &cluster.login;
    let name = job.name_any();
    let uid = job.uid().unwrap_or_default();
    let before = status.clone();
    // One read of every job serves all the GPUJobs polled within half a second.
    let snap = cluster
        .jobs(Instant::now() - Duration::from_millis(500))
        .await?;
    let record = match snap.by_id(id) {
        Some(r) => Some(r.clone()),
        // Not in that read (it may predate the submission): ask for this job.
        None => {
            let out = login
                .run(&format!("scontrol -o show job {id}"), None, SSH_TIMEOUT)
                .await?;
            (out.code == 0).then(|| slurm::parse_record(out.stdout.lines().next().unwrap_or("")))
        }
    };
    reachable(&mut status, true, "Connected", "the login node answers");
    let Some(sj) = record.as_ref().and_then(Job::from_record) else {
        status.phase = Some("Failed".into());
        status.reason = Some("Lost".into());
        status.message = Some(format!("Slurm no longer knows job {id}"));
        write_status(api, &name, &status).await?;
        return Ok(Action::await_change());
    };
    let (phase, reason) = slurm::phase_of(&sj);
    status.slurm_state = Some(sj.state.clone());
    status.submit_time = sj
        .submit
        .as_deref()
        .and_then(slurm_time)
        .or(status.submit_time);
    status.start_time = sj.start.as_deref().and_then(slurm_time);
    if slurm::ended(&sj) {
        status.end_time = sj.end.as_deref().and_then(slurm_time);
        finish(ctx, job, cluster, &sj, phase, reason, &mut status).await?;
        status.duration =
            duration_between(status.start_time.as_deref(), status.end_time.as_deref());
        write_status(api, &name, &status).await?;
        ctx.forget(&uid);
        return Ok(Action::await_change());
    }
    status.phase = Some(phase.into());
    status.reason = reason;
    status.message = None;
    if phase == "Running" {
        status.duration = duration_between(status.start_time.as_deref(), None);
    }
    let changed = status.phase != before.phase
        || status.reason != before.reason
        || status.slurm_state != before.slurm_state;
    if status != before {
        write_status(api, &name, &status).await?;
    }
    Ok(Action::requeue(ctx.next_poll(&uid, changed)))
}

/// Reads the ended job's outputs into the status and the result ConfigMap.
async fn finish(
    ctx: &Ctx,
    job: &GPUJob,
    cluster: &Cluster,
    sj: &Job,
    phase: &str,
    reason: Option<String>,
    status: &mut GPUJobStatus,
) -> Result<(), Error> {
    let login = &cluster.login;
    let uid = job.uid().unwrap_or_default();
    let dir = format!("{}/{uid}", login.target().work_dir);
    let result_name = job
        .spec
        .result_file
        .clone()
        .filter(|f| !f.is_empty())
        .unwrap_or_else(|| "stdout".into());
    // stdout is read from its start when it is the result (its status tail is then the end
    // of what was read), else its tail.
    let stdout_is_result = result_name == "stdout";
    let mut wanted: Vec<(&str, usize, bool)> = vec![
        if stdout_is_result {
            ("stdout", slurm::RESULT_LIMIT + 1, true)
        } else {
            ("stdout", slurm::STATUS_TAIL, false)
        },
        ("stderr", slurm::STATUS_TAIL, false),
        (slurm::BUILD_FAILED, 64, false),
    ];
    if !stdout_is_result {
        wanted.push((result_name.as_str(), slurm::RESULT_LIMIT + 1, true));
    }
    let out = login
        .run(
            "sh -s",
            Some(&slurm::fetch_script(&dir, &wanted)),
            SSH_TIMEOUT,
        )
        .await?;
    let got = slurm::parse_fetched(&out.stdout);
    let text = |f: &str| {
        got.get(f)
            .map(|(_, d)| slurm::tail_text(d, slurm::STATUS_TAIL))
    };
    status.stdout = text("stdout");
    status.stderr = text("stderr");
    // A signal shows as 128 + its number, as shells report it.
    status.exit_code = Some(if sj.exit.1 != 0 {
        128 + sj.exit.1
    } else {
        sj.exit.0
    });
    status.phase = Some(phase.into());
    status.reason = reason;
    status.message = match (phase, status.reason.as_deref()) {
        ("Failed", Some("Error")) => Some(format!("the program exited with code {}", sj.exit.0)),
        ("Failed", Some("TIMEOUT")) => Some("the job reached its time limit".into()),
        ("Failed", Some(r)) => Some(format!("Slurm ended the job: {r}")),
        ("Cancelled", _) => Some("the job was cancelled in Slurm".into()),
        _ => None,
    };
    if let Some((_, code)) = got.get(slurm::BUILD_FAILED) {
        status.phase = Some("Failed".into());
        status.reason = Some("BuildFailed".into());
        let code: i32 = String::from_utf8_lossy(code).trim().parse().unwrap_or(1);
        status.exit_code = Some(code);
        status.message = Some(format!(
            "the build exited with code {code}; its output is in stderr"
        ));
    }
    // The result: the result file, else stdout (read from its start).
    let result = got
        .get(result_name.as_str())
        .map(|(size, data)| (*size, data.clone()));
    if let Some((size, data)) = result
        && status.phase.as_deref() == Some("Succeeded")
    {
        status.result = Some(slurm::tail_text(&data, slurm::STATUS_TAIL));
        let cm_name = format!("{}-result", job.name_any());
        write_result(ctx, job, &cm_name, size, &data).await?;
        status.result_config_map = Some(cm_name);
    }
    Ok(())
}

async fn write_result(
    ctx: &Ctx,
    job: &GPUJob,
    name: &str,
    size: u64,
    data: &[u8],
) -> Result<(), Error> {
    let truncated = data.len() > slurm::RESULT_LIMIT || size as usize > slurm::RESULT_LIMIT;
    let kept = &data[..data.len().min(slurm::RESULT_LIMIT)];
    let owner = job.controller_owner_ref(&()).expect("a named object");
    let mut cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "ownerReferences": [owner],
                     "labels": {"gpu.minik8s.io/job": job.name_any()}},
    });
    match std::str::from_utf8(kept) {
        Ok(t) => cm["data"] = json!({"result": t}),
        Err(_) => {
            use base64::Engine;
            cm["binaryData"] =
                json!({"result": base64::engine::general_purpose::STANDARD.encode(kept)});
        }
    }
    if truncated {
        cm["metadata"]["annotations"] =
            json!({TRUNCATED: format!("the result has {size} bytes; the first 1 MiB is kept")});
    }
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default())
        .patch(
            name,
            &PatchParams::apply("gpujob-controller").force(),
            &Patch::Apply(&cm),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_read_as_upstream_prints_them() {
        assert_eq!(go_duration(5), "5s");
        assert_eq!(go_duration(184), "3m4s");
        assert_eq!(go_duration(3605), "1h0m5s");
        assert!(slurm_time("2026-11-24T14:54:13").is_some());
        assert_eq!(slurm_time("Unknown"), None);
        assert_eq!(
            duration_between(Some("2026-11-24T14:54:13Z"), Some("2026-11-24T14:54:25Z")).as_deref(),
            Some("12s")
        );
    }
}

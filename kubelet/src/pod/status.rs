//! The pod's status as upstream's kubelet reports it, computed from the spec, the runtime's
//! view and the pod's [`State`]: phase, conditions, IPs and container statuses.

use super::observed::{ContainerRun, Observed, Run};
use super::plan::{RestartPolicy, Shape, State, backoff_left};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::HashMap;

/// Why a container could not be created or started (reason, message), by container name.
pub type Failures = HashMap<String, (String, String)>;

/// What the worker learnt besides the runtime's view: start failures and probe verdicts, by
/// container name.
pub struct Reports<'a> {
    /// Start failures.
    pub failures: &'a Failures,
    /// Probe verdicts of running containers.
    pub probes: &'a HashMap<String, super::probe::Verdict>,
}

fn time(ns: i64) -> Option<Time> {
    (ns > 0).then(|| Time(jiff::Timestamp::from_nanosecond(ns as i128).unwrap_or_default()))
}

fn terminated(run: &ContainerRun) -> Option<ContainerStateTerminated> {
    match &run.run {
        Run::Exited {
            code,
            reason,
            started,
            finished,
            message,
        } => Some(ContainerStateTerminated {
            message: (!message.is_empty()).then(|| message.clone()),
            exit_code: *code,
            reason: Some(if reason.is_empty() {
                if *code == 0 { "Completed" } else { "Error" }.to_owned()
            } else {
                reason.clone()
            }),
            started_at: time(*started),
            finished_at: time(*finished),
            container_id: Some(format!("containerd://{}", run.id)),
            ..Default::default()
        }),
        _ => None,
    }
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message,
        }),
        ..Default::default()
    }
}

struct Ctx<'a> {
    pod: &'a Pod,
    observed: &'a Observed,
    shape: &'a Shape,
    failures: &'a Failures,
    probes: &'a HashMap<String, super::probe::Verdict>,
    now: i64,
    initializing: bool,
}

/// Which list of the spec a container is of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Init,
    App,
    /// Ephemeral (`kubectl debug`): never restarted, never ready.
    Ephemeral,
}

fn container_status(ctx: &Ctx, c: &Container, kind: Kind) -> ContainerStatus {
    let init = kind == Kind::Init;
    let latest = ctx.observed.latest(&c.name);
    let restart = match kind {
        Kind::Init if ctx.shape.restart == RestartPolicy::Always => RestartPolicy::OnFailure,
        Kind::Ephemeral => RestartPolicy::Never,
        _ => ctx.shape.restart,
    };
    let (state, last) = match latest {
        None => {
            let (reason, message) = match ctx.failures.get(&c.name) {
                Some((r, m)) => (r.as_str(), Some(m.clone())),
                None if init || ctx.initializing => ("PodInitializing", None),
                None => ("ContainerCreating", None),
            };
            (waiting(reason, message), None)
        }
        Some(run) => {
            let previous = ctx.observed.previous(&c.name).and_then(terminated);
            match &run.run {
                Run::Running { started } => (
                    ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: time(*started),
                        }),
                        ..Default::default()
                    },
                    previous,
                ),
                Run::Exited {
                    code,
                    started,
                    finished,
                    ..
                } if restart_applies(restart, *code) => {
                    let left = backoff_left(run.attempt, *started, *finished, ctx.now);
                    let pod = ctx.pod;
                    let message = format!(
                        "back-off {}s restarting failed container={} pod={}_{}({})",
                        left.as_secs().max(1),
                        c.name,
                        pod.metadata.name.as_deref().unwrap_or_default(),
                        pod.metadata.namespace.as_deref().unwrap_or_default(),
                        pod.metadata.uid.as_deref().unwrap_or_default(),
                    );
                    let state = match ctx.failures.get(&c.name) {
                        Some((r, m)) => waiting(r, Some(m.clone())),
                        None if left.is_zero() => waiting("ContainerCreating", None),
                        None => waiting("CrashLoopBackOff", Some(message)),
                    };
                    (state, terminated(run))
                }
                Run::Exited { .. } => (
                    ContainerState {
                        terminated: terminated(run),
                        ..Default::default()
                    },
                    previous,
                ),
                Run::Created | Run::Unknown => (waiting("ContainerCreating", None), previous),
            }
        }
    };
    let running = state.running.is_some();
    let verdict = ctx.probes.get(&c.name);
    // An init container is ready once it has exited successfully, as upstream marks it.
    let init_done = init && state.terminated.as_ref().is_some_and(|t| t.exit_code == 0);
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: latest.map(|r| r.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|r| format!("containerd://{}", r.id)),
        ready: init_done || (running && kind == Kind::App && verdict.is_none_or(|v| v.ready)),
        started: Some(running && verdict.is_none_or(|v| v.started)),
        restart_count: latest.map_or(0, |r| r.attempt as i32),
        state: Some(state),
        last_state: Some(
            last.map_or_else(ContainerState::default, |t| ContainerState {
                terminated: Some(t),
                ..Default::default()
            }),
        ),
        ..Default::default()
    }
}

fn restart_applies(restart: RestartPolicy, code: i32) -> bool {
    match restart {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => code != 0,
        RestartPolicy::Never => false,
    }
}

fn condition(kind: &str, ok: bool, reason: Option<&str>) -> PodCondition {
    PodCondition {
        type_: kind.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.map(str::to_owned),
        ..Default::default()
    }
}

/// Upstream's condition message naming containers: `containers with <what> status: [a b]`.
fn naming(what: &str, names: &[String]) -> Option<String> {
    (!names.is_empty()).then(|| format!("containers with {what} status: [{}]", names.join(" ")))
}

/// Phase as upstream's `getPhase`: pending until init containers are done and every app
/// container has started once; then running until no container will run again.
fn phase(state: &State, statuses: &[ContainerStatus]) -> &'static str {
    match state {
        State::Finished { succeeded: true } => "Succeeded",
        State::Finished { succeeded: false } => "Failed",
        State::NoSandbox { .. } | State::Initializing { .. } | State::InitRunning { .. } => {
            "Pending"
        }
        State::Running { .. } => {
            let started = statuses.iter().all(|s| {
                s.state
                    .as_ref()
                    .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
                    || s.last_state
                        .as_ref()
                        .is_some_and(|l| l.terminated.is_some())
            });
            if started { "Running" } else { "Pending" }
        }
    }
}

/// The pod's new status; times of unchanged conditions and `startTime` are kept from `old`.
#[allow(clippy::too_many_arguments)]
pub fn compute(
    pod: &Pod,
    shape: &Shape,
    observed: &Observed,
    state: &State,
    reports: &Reports,
    host_ip: &str,
    host_network: bool,
    now: i64,
) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let old = pod.status.clone().unwrap_or_default();
    // Init containers not yet succeeded keep the app containers waiting as PodInitializing,
    // also once a failed init container has ended the pod.
    let init_done = |name: &String| {
        observed
            .latest(name)
            .is_some_and(|c| matches!(c.run, Run::Exited { code: 0, .. }))
    };
    let initializing = !shape.init.is_empty()
        && (matches!(
            state,
            State::NoSandbox { .. } | State::Initializing { .. } | State::InitRunning { .. }
        ) || !shape.init.iter().all(init_done));
    let ctx = Ctx {
        pod,
        observed,
        shape,
        failures: reports.failures,
        probes: reports.probes,
        now,
        initializing,
    };
    let statuses: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(&ctx, c, Kind::App))
        .collect();
    let init_statuses: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_status(&ctx, c, Kind::Init))
        .collect();
    let ephemeral_statuses: Vec<ContainerStatus> = super::spec::ephemeral_containers(pod)
        .iter()
        .map(|c| container_status(&ctx, c, Kind::Ephemeral))
        .collect();
    let phase = phase(state, &statuses);
    let finished = matches!(state, State::Finished { .. });
    let initialized = !initializing || matches!(state, State::Running { .. });
    let ready = !finished && statuses.iter().all(|s| s.ready);
    let not_ready = if finished {
        Some("PodCompleted")
    } else {
        Some("ContainersNotReady")
    };
    let incomplete: Vec<String> = init_statuses
        .iter()
        .filter(|s| {
            s.state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_none_or(|t| t.exit_code != 0)
        })
        .map(|s| s.name.clone())
        .collect();
    let unready: Vec<String> = statuses
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.clone())
        .collect();
    let mut initialized_cond = condition(
        "Initialized",
        initialized,
        (!initialized).then_some("ContainersNotInitialized"),
    );
    if !initialized {
        initialized_cond.message = naming("incomplete", &incomplete);
    }
    let mut ready_conds = [
        condition(
            "ContainersReady",
            ready,
            (!ready).then_some(not_ready).flatten(),
        ),
        condition("Ready", ready, (!ready).then_some(not_ready).flatten()),
    ];
    if !ready && !finished {
        for c in &mut ready_conds {
            c.message = naming("unready", &unready);
        }
    }
    let mut conditions = vec![condition("PodScheduled", true, None), initialized_cond];
    conditions.extend(ready_conds);
    let stamp = Time(jiff::Timestamp::from_nanosecond(now as i128).unwrap_or_default());
    for c in &mut conditions {
        let before = old.conditions.iter().flatten().find(|o| o.type_ == c.type_);
        c.last_transition_time = match before {
            Some(b) if b.status == c.status => b.last_transition_time.clone(),
            _ => Some(stamp.clone()),
        };
    }
    let pod_ip = if host_network {
        Some(host_ip.to_owned())
    } else {
        observed
            .sandbox
            .as_ref()
            .filter(|s| s.ready)
            .and_then(|s| s.ip.clone())
            .or_else(|| if finished { old.pod_ip.clone() } else { None })
    };
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        host_ip: Some(host_ip.to_owned()),
        host_ips: Some(vec![HostIP {
            ip: host_ip.to_owned(),
        }]),
        pod_ips: pod_ip.clone().map(|ip| vec![PodIP { ip }]),
        pod_ip,
        start_time: old.start_time.clone().or(Some(stamp)),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty())
            .then_some(ephemeral_statuses),
        qos_class: old.qos_class.clone(),
        ..Default::default()
    }
}

/// Whether `new` says anything `old` does not (so a write is needed).
pub fn changed(old: Option<&PodStatus>, new: &PodStatus) -> bool {
    let Some(old) = old else { return true };
    let strip = |s: &PodStatus| {
        let mut s = s.clone();
        s.message = None;
        s.reason = None;
        s.nominated_node_name = None;
        s.resize = None;
        s.resource_claim_statuses = None;
        s.observed_generation = None;
        s
    };
    strip(old) != strip(new)
}

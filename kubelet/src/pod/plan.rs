//! The pod lifecycle as explicit states and the one step that moves a pod on from each: a pure
//! function of the pod spec, what the runtime holds ([`Observed`]) and the time, so a kubelet
//! that restarts picks up exactly where its predecessor stopped.

use super::observed::{ContainerRun, Observed, Run};
use std::time::Duration;

/// Restart back-off: the first restart is immediate, then 10 s doubling up to 5 min.
pub const BACKOFF_BASE: Duration = Duration::from_secs(10);
/// The longest restart back-off.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A container that ran this long before it exited restarts without back-off.
const BACKOFF_RESET: Duration = Duration::from_secs(600);

/// The pod's restart policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Restart every exit.
    Always,
    /// Restart non-zero exits.
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    /// From the spec's string (upstream default: Always).
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }

    fn restarts(self, code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// The shape of a pod the planner needs: its containers' names in order.
#[derive(Clone, Debug)]
pub struct Shape {
    /// Init containers, run one after another.
    pub init: Vec<String>,
    /// App containers.
    pub containers: Vec<String>,
    /// Restart policy.
    pub restart: RestartPolicy,
}

/// Where a pod stands: each state names the one step that leaves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// No ready sandbox: start one (`attempt`).
    NoSandbox {
        /// The sandbox attempt to create.
        attempt: u32,
    },
    /// Init container `index` has to be (re)started (after `wait`).
    Initializing {
        /// Which init container.
        index: usize,
        /// Back-off left before it may start.
        wait: Duration,
    },
    /// Init container `index` is running: wait for it.
    InitRunning {
        /// Which init container.
        index: usize,
    },
    /// App containers run; `start` lists those to (re)start now, `wait` the shortest back-off
    /// left of those that must wait.
    Running {
        /// Containers to start now (indices into `Shape::containers`).
        start: Vec<usize>,
        /// Shortest back-off left, if some container waits.
        wait: Option<Duration>,
    },
    /// Nothing will run again: the pod ended (`succeeded` or not); its sandbox is stopped.
    Finished {
        /// Whether every container succeeded.
        succeeded: bool,
    },
}

/// The back-off left before a container that exited at `finished` after `restarts` restarts
/// may start again (ns since the epoch; `now` likewise): none after the first exit, then 10 s
/// doubling.
pub fn backoff_left(restarts: u32, started: i64, finished: i64, now: i64) -> Duration {
    if restarts == 0 {
        return Duration::ZERO;
    }
    let ran = Duration::from_nanos(finished.saturating_sub(started).max(0) as u64);
    if ran >= BACKOFF_RESET {
        return Duration::ZERO;
    }
    let delay = BACKOFF_BASE
        .saturating_mul(1u32 << (restarts - 1).min(16))
        .min(BACKOFF_MAX);
    let since = Duration::from_nanos(now.saturating_sub(finished).max(0) as u64);
    delay.saturating_sub(since)
}

/// How a container that may not run again ended, if it did.
fn ended(c: Option<&ContainerRun>, restart: RestartPolicy) -> Option<i32> {
    match c.map(|c| &c.run) {
        Some(Run::Exited { code, .. }) if !restart.restarts(*code) => Some(*code),
        _ => None,
    }
}

/// Where the pod stands.
pub fn state(shape: &Shape, observed: &Observed, now: i64) -> State {
    // A pod whose containers have all ended for good stays finished, sandbox or not.
    let app_ended: Vec<Option<i32>> = shape
        .containers
        .iter()
        .map(|c| ended(observed.latest(c), shape.restart))
        .collect();
    if !shape.containers.is_empty() && app_ended.iter().all(Option::is_some) {
        return State::Finished {
            succeeded: app_ended.iter().all(|c| *c == Some(0)),
        };
    }
    for name in &shape.init {
        if let Some(Run::Exited { code, .. }) = observed.latest(name).map(|c| &c.run)
            && *code != 0
            && shape.restart == RestartPolicy::Never
        {
            return State::Finished { succeeded: false };
        }
    }
    if !observed.sandbox.as_ref().is_some_and(|s| s.ready) {
        return State::NoSandbox {
            attempt: observed.sandbox.as_ref().map_or(0, |s| s.attempt + 1),
        };
    }
    for (index, name) in shape.init.iter().enumerate() {
        match observed.latest(name) {
            None => {
                return State::Initializing {
                    index,
                    wait: Duration::ZERO,
                };
            }
            Some(c) => match &c.run {
                Run::Exited { code: 0, .. } => continue,
                Run::Exited {
                    started, finished, ..
                } => {
                    return State::Initializing {
                        index,
                        wait: backoff_left(c.attempt, *started, *finished, now),
                    };
                }
                Run::Running { .. } | Run::Created | Run::Unknown => {
                    return State::InitRunning { index };
                }
            },
        }
    }
    let mut start = Vec::new();
    let mut wait: Option<Duration> = None;
    for (index, name) in shape.containers.iter().enumerate() {
        match observed.latest(name) {
            None => start.push(index),
            Some(c) => {
                if let Run::Exited {
                    code,
                    started,
                    finished,
                    ..
                } = &c.run
                    && shape.restart.restarts(*code)
                {
                    let left = backoff_left(c.attempt, *started, *finished, now);
                    if left.is_zero() {
                        start.push(index);
                    } else {
                        wait = Some(wait.map_or(left, |w| w.min(left)));
                    }
                }
            }
        }
    }
    State::Running { start, wait }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::observed::Sandbox;

    const S: i64 = 1_000_000_000;

    fn shape(init: &[&str], containers: &[&str], restart: RestartPolicy) -> Shape {
        Shape {
            init: init.iter().map(|s| s.to_string()).collect(),
            containers: containers.iter().map(|s| s.to_string()).collect(),
            restart,
        }
    }

    fn sandboxed() -> Observed {
        Observed {
            sandbox: Some(Sandbox {
                id: "sb".into(),
                attempt: 0,
                ready: true,
                ip: Some("10.244.0.2".into()),
            }),
            ..Default::default()
        }
    }

    fn with(mut o: Observed, name: &str, attempt: u32, run: Run) -> Observed {
        o.containers.entry(name.into()).or_default().insert(
            0,
            ContainerRun {
                id: format!("{name}-{attempt}"),
                attempt,
                run,
                image_ref: String::new(),
            },
        );
        o
    }

    fn exited(code: i32, started: i64, finished: i64) -> Run {
        Run::Exited {
            code,
            reason: String::new(),
            started,
            finished,
            message: String::new(),
        }
    }

    #[test]
    fn a_new_pod_needs_a_sandbox_then_its_init_containers_in_order_then_all_containers() {
        let s = shape(&["a", "b"], &["x", "y"], RestartPolicy::Always);
        assert_eq!(
            state(&s, &Observed::default(), 0),
            State::NoSandbox { attempt: 0 }
        );
        let o = sandboxed();
        assert_eq!(
            state(&s, &o, 0),
            State::Initializing {
                index: 0,
                wait: Duration::ZERO
            }
        );
        let o = with(o, "a", 0, Run::Running { started: 0 });
        assert_eq!(state(&s, &o, 0), State::InitRunning { index: 0 });
        let o = with(o, "a", 0, exited(0, 0, S));
        assert_eq!(
            state(&s, &o, 2 * S),
            State::Initializing {
                index: 1,
                wait: Duration::ZERO
            }
        );
        let o = with(o, "b", 0, exited(0, 0, S));
        assert_eq!(
            state(&s, &o, 2 * S),
            State::Running {
                start: vec![0, 1],
                wait: None
            }
        );
    }

    #[test]
    fn a_crashing_container_restarts_at_once_then_after_a_doubling_back_off() {
        let s = shape(&[], &["x"], RestartPolicy::Always);
        let o = with(sandboxed(), "x", 0, exited(1, 0, S));
        assert_eq!(
            state(&s, &o, S),
            State::Running {
                start: vec![0],
                wait: None
            },
            "the first exit restarts at once"
        );
        let o = with(sandboxed(), "x", 1, exited(1, 0, S));
        assert_eq!(
            state(&s, &o, S),
            State::Running {
                start: vec![],
                wait: Some(Duration::from_secs(10))
            }
        );
        assert_eq!(backoff_left(0, 0, S, S), Duration::ZERO);
        assert_eq!(backoff_left(1, 0, S, 4 * S), Duration::from_secs(7));
        assert_eq!(backoff_left(3, 0, S, S), Duration::from_secs(40));
        assert_eq!(backoff_left(12, 0, S, S), BACKOFF_MAX);
        assert_eq!(
            backoff_left(5, 0, 700 * S, 700 * S),
            Duration::ZERO,
            "ten minutes of running resets the back-off"
        );
        let o = with(sandboxed(), "x", 1, exited(1, 0, S));
        assert_eq!(
            state(&s, &o, 12 * S),
            State::Running {
                start: vec![0],
                wait: None
            }
        );
    }

    #[test]
    fn restart_policies_decide_which_exits_end_the_pod() {
        let done = with(sandboxed(), "x", 0, exited(0, 0, S));
        let failed = with(sandboxed(), "x", 0, exited(3, 0, S));
        let never = shape(&[], &["x"], RestartPolicy::Never);
        let on_failure = shape(&[], &["x"], RestartPolicy::OnFailure);
        assert_eq!(state(&never, &done, S), State::Finished { succeeded: true });
        assert_eq!(
            state(&never, &failed, S),
            State::Finished { succeeded: false }
        );
        assert_eq!(
            state(&on_failure, &done, S),
            State::Finished { succeeded: true }
        );
        assert!(matches!(
            state(&on_failure, &failed, S),
            State::Running { .. }
        ));
        let init_failed = with(sandboxed(), "i", 0, exited(1, 0, S));
        assert_eq!(
            state(
                &shape(&["i"], &["x"], RestartPolicy::Never),
                &init_failed,
                S
            ),
            State::Finished { succeeded: false }
        );
    }

    #[test]
    fn a_lost_sandbox_is_replaced_with_the_next_attempt() {
        let mut o = sandboxed();
        o.sandbox.as_mut().unwrap().ready = false;
        assert_eq!(
            state(&shape(&[], &["x"], RestartPolicy::Always), &o, 0),
            State::NoSandbox { attempt: 1 }
        );
    }
}

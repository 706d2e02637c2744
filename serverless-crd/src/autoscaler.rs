//! The autoscaler's decision, Knative's KPA: desired pods = ceil(the metric's average over
//! the stable window (60 s) / the per-pod target), or over the panic window (a tenth of it)
//! while panicking. A burst asking for at least twice the ready pods starts panic mode, in
//! which the pods never go down until a whole stable window passes without such a burst. Down
//! at most to half the ready pods a tick (while traffic is routed); to zero after the idle
//! period; bounded by `minScale`/`maxScale`; never zero while requests are waiting.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The panic window as a share of the stable window (Knative's `panic-window-percentage`).
pub const PANIC_SHARE: f64 = 0.10;
/// The panic threshold: panic pods over ready pods (Knative's `panic-threshold-percentage`).
pub const PANIC_THRESHOLD: f64 = 2.0;
/// The most a tick may multiply the ready pods by (Knative's `max-scale-up-rate`).
pub const MAX_SCALE_UP_RATE: f64 = 1000.0;
/// The most a tick may divide the ready pods by (Knative's `max-scale-down-rate`).
pub const MAX_SCALE_DOWN_RATE: f64 = 2.0;

/// The panic window for a stable window.
pub fn panic_window(stable: Duration) -> Duration {
    stable.mul_f64(PANIC_SHARE).max(Duration::from_secs(1))
}

/// Samples of one revision's metric (one a tick), for its stable window.
#[derive(Debug, Default)]
pub struct Samples {
    samples: VecDeque<(Instant, f64)>,
}

impl Samples {
    /// Records the metric's value at `at`, keeping what lies within `keep` of it.
    pub fn record(&mut self, at: Instant, value: f64, keep: Duration) {
        self.samples.push_back((at, value));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > keep)
        {
            self.samples.pop_front();
        }
    }

    /// The average over the last `window` before `now`.
    pub fn average(&self, now: Instant, window: Duration) -> f64 {
        let recent: Vec<f64> = self
            .samples
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= window)
            .map(|(_, c)| *c)
            .collect();
        if recent.is_empty() {
            0.0
        } else {
            recent.iter().sum::<f64>() / recent.len() as f64
        }
    }
}

/// What one decision needs to know about a revision.
#[derive(Clone, Copy, Debug)]
pub struct Inputs {
    /// Pods the Deployment asks for now.
    pub current: i32,
    /// Pods ready to take requests.
    pub ready: usize,
    /// The metric's average over the stable window.
    pub stable: f64,
    /// The metric's average over the panic window.
    pub panic: f64,
    /// Requests in flight or waiting right now.
    pub now: usize,
    /// Requests waiting and in flight a pod takes, for those waiting now (`None`: any).
    pub per_pod: Option<usize>,
    /// Time since the last request arrived.
    pub idle: Duration,
    /// The metric's value per pod aimed at.
    pub target: f64,
    /// Bounds.
    pub min: i32,
    /// Bounds.
    pub max: i32,
    /// Idle time before scaling to zero.
    pub to_zero_after: Duration,
    /// The stable window (how long panic mode lasts after the last burst).
    pub window: Duration,
    /// Traffic is routed to the revision (Knative's "reachable"): down by halves only.
    pub routed: bool,
}

/// One revision's decider: its panic mode is state across ticks.
#[derive(Debug, Default)]
pub struct Decider {
    /// When a burst last crossed the threshold, while in panic mode.
    panicking_since: Option<Instant>,
    /// The most pods asked for in this panic.
    max_panic_pods: i32,
}

impl Decider {
    /// Whether the revision is in panic mode.
    pub fn panicking(&self) -> bool {
        self.panicking_since.is_some()
    }

    /// The pods the revision should have at `now`.
    pub fn desired(&mut self, at: Instant, i: Inputs) -> i32 {
        let ready = i.ready.max(1) as f64;
        let target = i.target.max(0.01);
        let max_up = (MAX_SCALE_UP_RATE * ready).ceil();
        let max_down = if i.routed {
            (ready / MAX_SCALE_DOWN_RATE).floor()
        } else {
            0.0
        };
        let stable_pods = (i.stable / target).ceil();
        let panic_pods = (i.panic / target).ceil();
        let bounded = |pods: f64| pods.max(max_down).min(max_up) as i32;
        let over_threshold = panic_pods / ready >= PANIC_THRESHOLD;
        match self.panicking_since {
            _ if over_threshold => self.panicking_since = Some(at),
            Some(since) if at.duration_since(since) > i.window => {
                self.panicking_since = None;
                self.max_panic_pods = 0;
            }
            _ => {}
        }
        let mut want = bounded(stable_pods);
        if self.panicking() {
            // Up with the burst, never down while it may come back.
            want = want.max(bounded(panic_pods)).max(self.max_panic_pods);
            self.max_panic_pods = want;
        }
        // Waiting requests need at least one pod, and as many as they fill.
        if i.now > 0 {
            let needed = i.per_pod.map_or(1, |p| i.now.div_ceil(p.max(1)) as i32);
            want = want.max(needed.max(1));
        }
        if i.now == 0 && i.idle >= i.to_zero_after {
            // Idle for the whole period: to zero (or minScale), whatever the windows remember.
            want = 0;
            self.panicking_since = None;
            self.max_panic_pods = 0;
        } else if want == 0 && i.current > 0 {
            // Not idle long enough yet: keep one pod warm.
            want = 1;
        }
        want.clamp(i.min.max(0), i.max.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Inputs {
        Inputs {
            current: 1,
            ready: 1,
            stable: 0.0,
            panic: 0.0,
            now: 0,
            per_pod: Some(1),
            idle: Duration::ZERO,
            target: 1.0,
            min: 0,
            max: 4,
            to_zero_after: Duration::from_secs(30),
            window: Duration::from_secs(60),
            routed: true,
        }
    }

    fn once(i: Inputs) -> i32 {
        Decider::default().desired(Instant::now(), i)
    }

    #[test]
    fn a_first_request_scales_from_zero_and_idleness_to_zero() {
        let cold = Inputs {
            current: 0,
            ready: 0,
            now: 1,
            ..inputs()
        };
        assert_eq!(once(cold), 1);
        let busy_recently = Inputs {
            idle: Duration::from_secs(5),
            ..inputs()
        };
        assert_eq!(once(busy_recently), 1);
        let idle = Inputs {
            idle: Duration::from_secs(31),
            ..inputs()
        };
        assert_eq!(once(idle), 0);
        // The stable window still remembers a burst, but the idle period decides.
        let remembered = Inputs {
            idle: Duration::from_secs(31),
            stable: 0.4,
            current: 2,
            ready: 2,
            ..inputs()
        };
        assert_eq!(once(remembered), 0);
        let kept = Inputs {
            idle: Duration::from_secs(31),
            min: 2,
            ..inputs()
        };
        assert_eq!(once(kept), 2);
    }

    #[test]
    fn the_metric_over_the_target_sets_the_pods_within_bounds() {
        let steady = Inputs {
            stable: 2.5,
            panic: 2.5,
            now: 2,
            current: 3,
            ready: 3,
            ..inputs()
        };
        assert_eq!(once(steady), 3);
        let four_each = Inputs {
            stable: 8.0,
            panic: 8.0,
            target: 4.0,
            current: 2,
            ready: 2,
            ..inputs()
        };
        assert_eq!(once(four_each), 2);
        // Knative's 70 % utilization of one request each: 0.7.
        let one_each = Inputs {
            stable: 2.0,
            panic: 2.0,
            target: 0.7,
            current: 3,
            ready: 3,
            max: 10,
            ..inputs()
        };
        assert_eq!(once(one_each), 3);
        // Requests a second over the rps target.
        let rps = Inputs {
            stable: 45.0,
            panic: 45.0,
            target: 10.0,
            current: 5,
            ready: 5,
            max: 10,
            per_pod: None,
            now: 3,
            ..inputs()
        };
        assert_eq!(once(rps), 5);
        // Down by halves at most while routed; at once when not.
        let quiet = Inputs {
            stable: 1.0,
            panic: 1.0,
            current: 8,
            ready: 8,
            max: 10,
            ..inputs()
        };
        assert_eq!(once(quiet), 4);
        assert_eq!(
            once(Inputs {
                routed: false,
                ..quiet
            }),
            1
        );
    }

    #[test]
    fn a_burst_panics_up_and_holds_until_a_stable_window_passes_quietly() {
        let mut d = Decider::default();
        let t0 = Instant::now();
        // Six in the last seconds against one pod: six pods, capped at max.
        let burst = Inputs {
            stable: 1.0,
            panic: 6.0,
            now: 6,
            ..inputs()
        };
        assert_eq!(d.desired(t0, burst), 4);
        assert!(d.panicking());
        // The burst gone, the stable window still asks for one: panic mode holds four.
        let after = Inputs {
            stable: 1.0,
            panic: 0.0,
            current: 4,
            ready: 4,
            now: 0,
            idle: Duration::from_secs(1),
            ..inputs()
        };
        assert_eq!(d.desired(t0 + Duration::from_secs(30), after), 4);
        assert!(d.panicking());
        // A whole stable window without a burst: out of panic, down by half.
        assert_eq!(d.desired(t0 + Duration::from_secs(61), after), 2);
        assert!(!d.panicking());
    }

    #[test]
    fn samples_average_over_their_windows() {
        let mut s = Samples::default();
        let t0 = Instant::now();
        let keep = Duration::from_secs(60);
        s.record(t0, 4.0, keep);
        s.record(t0 + Duration::from_secs(10), 2.0, keep);
        let now = t0 + Duration::from_secs(10);
        assert_eq!(s.average(now, panic_window(keep)), 2.0);
        assert_eq!(s.average(now, keep), 3.0);
        s.record(t0 + Duration::from_secs(69), 1.0, keep);
        assert_eq!(s.average(t0 + Duration::from_secs(69), keep), 1.5);
    }
}

//! The KPA-like autoscaler's decision, as a pure function of observed concurrency: desired
//! pods = ceil(average concurrency over the stable window (60 s) / target), or over the panic
//! window (6 s) when that asks for at least twice the current pods; scale to zero after the
//! idle period; bounded by `minScale`/`maxScale`; never zero while requests are waiting.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The stable window.
pub const STABLE: Duration = Duration::from_secs(60);
/// The panic window.
pub const PANIC: Duration = Duration::from_secs(6);

/// Concurrency samples of one function (one a tick).
#[derive(Debug, Default)]
pub struct Samples {
    samples: VecDeque<(Instant, f64)>,
}

impl Samples {
    /// Records the concurrency (requests in flight and waiting) seen at `at`.
    pub fn record(&mut self, at: Instant, concurrency: f64) {
        self.samples.push_back((at, concurrency));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > STABLE)
        {
            self.samples.pop_front();
        }
    }

    /// The average concurrency over the last `window` before `now`.
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

/// What the decision needs to know about a function.
#[derive(Clone, Copy, Debug)]
pub struct Inputs {
    /// Pods the Deployment asks for now.
    pub current: i32,
    /// Average concurrency over the stable window.
    pub stable: f64,
    /// Average concurrency over the panic window.
    pub panic: f64,
    /// Requests in flight or waiting right now.
    pub now: usize,
    /// Time since the last request arrived.
    pub idle: Duration,
    /// Requests one pod serves at once.
    pub target: i32,
    /// Bounds.
    pub min: i32,
    /// Bounds.
    pub max: i32,
    /// Idle time before scaling to zero.
    pub to_zero_after: Duration,
}

/// The pods a function should have.
pub fn desired(i: Inputs) -> i32 {
    let target = f64::from(i.target.max(1));
    let stable = (i.stable / target).ceil() as i32;
    let panic = (i.panic / target).ceil() as i32;
    let mut want = if panic >= 2 * i.current.max(1) {
        panic.max(i.current)
    } else {
        stable
    };
    // Waiting requests need at least one pod, and as many as they fill.
    let needed_now = ((i.now as f64) / target).ceil() as i32;
    want = want.max(needed_now);
    if i.now == 0 && i.idle >= i.to_zero_after {
        // Idle for the whole period: to zero (or minScale), whatever the windows remember.
        want = 0;
    } else if want == 0 && i.current > 0 {
        // Not idle long enough yet: keep one pod warm.
        want = 1;
    }
    want.clamp(i.min.max(0), i.max.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Inputs {
        Inputs {
            current: 1,
            stable: 0.0,
            panic: 0.0,
            now: 0,
            idle: Duration::ZERO,
            target: 1,
            min: 0,
            max: 4,
            to_zero_after: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_first_request_scales_from_zero_and_idleness_to_zero() {
        let cold = Inputs {
            current: 0,
            now: 1,
            ..inputs()
        };
        assert_eq!(desired(cold), 1);
        let busy_recently = Inputs {
            idle: Duration::from_secs(5),
            ..inputs()
        };
        assert_eq!(desired(busy_recently), 1);
        let idle = Inputs {
            idle: Duration::from_secs(31),
            ..inputs()
        };
        assert_eq!(desired(idle), 0);
        // The stable window still remembers a burst, but the idle period decides.
        let remembered = Inputs {
            idle: Duration::from_secs(31),
            stable: 0.4,
            current: 2,
            ..inputs()
        };
        assert_eq!(desired(remembered), 0);
        let kept = Inputs {
            idle: Duration::from_secs(31),
            min: 2,
            ..inputs()
        };
        assert_eq!(desired(kept), 2);
    }

    #[test]
    fn concurrency_sets_the_pods_and_a_burst_panics_up_within_bounds() {
        assert_eq!(
            desired(Inputs {
                stable: 2.5,
                panic: 2.5,
                now: 2,
                current: 3,
                ..inputs()
            }),
            3
        );
        // Panic: six in the last seconds against one pod → six pods, capped at max.
        assert_eq!(
            desired(Inputs {
                stable: 1.0,
                panic: 6.0,
                now: 6,
                ..inputs()
            }),
            4
        );
        assert_eq!(
            desired(Inputs {
                stable: 8.0,
                panic: 8.0,
                target: 4,
                current: 2,
                ..inputs()
            }),
            2
        );
        // Samples average over their windows.
        let mut s = Samples::default();
        let t0 = Instant::now();
        s.record(t0, 4.0);
        s.record(t0 + Duration::from_secs(10), 2.0);
        assert_eq!(s.average(t0 + Duration::from_secs(10), PANIC), 2.0);
        assert_eq!(s.average(t0 + Duration::from_secs(10), STABLE), 3.0);
    }
}

//! Turning a proposal into the replicas to set, as upstream's HPA controller does with
//! `spec.behavior` (`normalizeDesiredReplicasWithBehaviors`): stabilization windows over past
//! recommendations, then the scaling policies' rate limits and min/max, with the
//! `ScalingLimited` condition's reason and message.

/// How one policy limits a change per period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// At most `value` pods.
    Pods,
    /// At most `value` percent of the replicas at the period's start.
    Percent,
}

/// One scaling policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Pods or Percent.
    pub kind: PolicyKind,
    /// How many (pods or percent).
    pub value: i32,
    /// Over how many seconds.
    pub period_seconds: i32,
}

/// Which policy wins when several allow different changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Select {
    /// The one allowing the largest change (the default).
    Max,
    /// The one allowing the smallest change.
    Min,
    /// No change in this direction.
    Disabled,
}

/// The rules of one direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Recommendations over this many seconds are considered.
    pub stabilization_seconds: i32,
    /// Which policy wins.
    pub select: Select,
    /// The policies.
    pub policies: Vec<Policy>,
}

impl Rules {
    /// Upstream's defaults for scaling up: no stabilization; 4 pods or 100 % per 15 s, the larger.
    pub fn default_up() -> Self {
        Rules {
            stabilization_seconds: 0,
            select: Select::Max,
            policies: vec![
                Policy {
                    kind: PolicyKind::Pods,
                    value: 4,
                    period_seconds: 15,
                },
                Policy {
                    kind: PolicyKind::Percent,
                    value: 100,
                    period_seconds: 15,
                },
            ],
        }
    }

    /// Upstream's defaults for scaling down: 300 s stabilization; 100 % per 15 s.
    pub fn default_down() -> Self {
        Rules {
            stabilization_seconds: 300,
            select: Select::Max,
            policies: vec![Policy {
                kind: PolicyKind::Percent,
                value: 100,
                period_seconds: 15,
            }],
        }
    }
}

/// A past recommendation or scale change, at a time in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timed {
    /// When.
    pub at: f64,
    /// Replicas recommended, or replicas changed by (positive).
    pub replicas: i32,
}

/// Why the result is what it is (`ScalingLimited`: its status, reason and message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    /// Whether a limit applied.
    pub limited: bool,
    /// Upstream's reason.
    pub reason: &'static str,
    /// Upstream's message.
    pub message: &'static str,
}

/// The recommendation within the stabilization windows: the lowest of the scale-up window's
/// recommendations and the highest of the scale-down window's, applied to `current`. The
/// caller records `desired` in `history` afterwards.
pub fn stabilize(
    current: i32,
    desired: i32,
    history: &[Timed],
    now: f64,
    up: &Rules,
    down: &Rules,
) -> i32 {
    let (mut up_rec, mut down_rec) = (desired, desired);
    for r in history {
        if r.at > now - up.stabilization_seconds as f64 {
            up_rec = up_rec.min(r.replicas);
        }
        if r.at > now - down.stabilization_seconds as f64 {
            down_rec = down_rec.max(r.replicas);
        }
    }
    let mut recommendation = current;
    if recommendation < up_rec {
        recommendation = up_rec;
    }
    if recommendation > down_rec {
        recommendation = down_rec;
    }
    recommendation
}

/// Replicas changed within the last `period` seconds.
fn changed_within(period: i32, events: &[Timed], now: f64) -> i32 {
    events
        .iter()
        .filter(|e| e.at > now - period as f64)
        .map(|e| e.replicas)
        .sum()
}

/// The most replicas the scale-up policies allow now.
pub fn up_limit(current: i32, ups: &[Timed], downs: &[Timed], rules: &Rules, now: f64) -> i32 {
    policy_limit(current, ups, downs, rules, now, true)
}

/// The fewest replicas the scale-down policies allow now.
pub fn down_limit(current: i32, ups: &[Timed], downs: &[Timed], rules: &Rules, now: f64) -> i32 {
    policy_limit(current, ups, downs, rules, now, false)
}

/// Each policy's bound, from the replicas at the start of its period; `Max` takes the policy
/// allowing the larger change (the higher count going up, the lower going down), `Min` the
/// smaller. No policy (or `Disabled`) allows no change.
fn policy_limit(
    current: i32,
    ups: &[Timed],
    downs: &[Timed],
    rules: &Rules,
    now: f64,
    up: bool,
) -> i32 {
    let larger_change = match rules.select {
        Select::Disabled => return current,
        Select::Max => true,
        Select::Min => false,
    };
    let bounds = rules.policies.iter().map(|p| {
        let start = current - changed_within(p.period_seconds, ups, now)
            + changed_within(p.period_seconds, downs, now);
        match (p.kind, up) {
            (PolicyKind::Pods, true) => start + p.value,
            (PolicyKind::Pods, false) => start - p.value,
            (PolicyKind::Percent, true) => {
                (start as f64 * (1.0 + p.value as f64 / 100.0)).ceil() as i32
            }
            (PolicyKind::Percent, false) => (start as f64 * (1.0 - p.value as f64 / 100.0)) as i32,
        }
    });
    let highest = larger_change == up;
    if highest { bounds.max() } else { bounds.min() }.unwrap_or(current)
}

/// Everything the rate limits need.
#[derive(Clone, Debug)]
pub struct Bounds<'a> {
    /// `spec.minReplicas`.
    pub min: i32,
    /// `spec.maxReplicas`.
    pub max: i32,
    /// Scale-ups in the longest period, with how many pods each added.
    pub ups: &'a [Timed],
    /// Scale-downs, with how many pods each removed.
    pub downs: &'a [Timed],
    /// Scaling up.
    pub up: &'a Rules,
    /// Scaling down.
    pub down: &'a Rules,
    /// Now (seconds).
    pub now: f64,
}

/// Applies the policies' rate limits and min/max to a stabilized recommendation.
pub fn limit(current: i32, desired: i32, b: &Bounds) -> (i32, Limited) {
    let within = Limited {
        limited: false,
        reason: "DesiredWithinRange",
        message: "the desired count is within the acceptable range",
    };
    if desired > current {
        let rate = up_limit(current, b.ups, b.downs, b.up, b.now).max(current);
        let (most, why) = if b.max > rate {
            (
                rate,
                Limited {
                    limited: true,
                    reason: "ScaleUpLimit",
                    message: "the desired replica count is increasing faster than the maximum scale rate",
                },
            )
        } else {
            (
                b.max,
                Limited {
                    limited: true,
                    reason: "TooManyReplicas",
                    message: "the desired replica count is more than the maximum replica count",
                },
            )
        };
        if desired > most {
            return (most, why);
        }
    } else if desired < current {
        let rate = down_limit(current, b.ups, b.downs, b.down, b.now).min(current);
        let (least, why) = if b.min < rate {
            (
                rate,
                Limited {
                    limited: true,
                    reason: "ScaleDownLimit",
                    message: "the desired replica count is decreasing faster than the maximum scale rate",
                },
            )
        } else {
            (
                b.min,
                Limited {
                    limited: true,
                    reason: "TooFewReplicas",
                    message: "the desired replica count is less than the minimum replica count",
                },
            )
        };
        if desired < least {
            return (least, why);
        }
    }
    (desired, within)
}

/// Upstream's scale-up limit without `behavior`: twice the replicas, at least 4.
pub fn legacy_up_limit(current: i32) -> i32 {
    (2 * current).max(4)
}

/// Without `behavior` (upstream's `stabilizeRecommendation`): the highest of the proposal and
/// the recommendations within the downscale stabilization window (seconds).
pub fn legacy_stabilize(desired: i32, history: &[Timed], now: f64, window: f64) -> i32 {
    history
        .iter()
        .filter(|r| r.at >= now - window)
        .map(|r| r.replicas)
        .fold(desired, i32::max)
}

/// Without `behavior` (upstream's `convertDesiredReplicasWithRules`): min/max and the legacy
/// scale-up limit, with the `ScalingLimited` reason.
pub fn legacy_limit(current: i32, desired: i32, min: i32, max: i32) -> (i32, Limited) {
    let up = legacy_up_limit(current);
    let (most, why) = if max > up {
        (
            up,
            Limited {
                limited: true,
                reason: "ScaleUpLimit",
                message: "the desired replica count is increasing faster than the maximum scale rate",
            },
        )
    } else {
        (
            max,
            Limited {
                limited: true,
                reason: "TooManyReplicas",
                message: "the desired replica count is more than the maximum replica count",
            },
        )
    };
    if desired < min {
        return (
            min,
            Limited {
                limited: true,
                reason: "TooFewReplicas",
                message: "the desired replica count is less than the minimum replica count",
            },
        );
    }
    if desired > most {
        return (most, why);
    }
    (
        desired,
        Limited {
            limited: false,
            reason: "DesiredWithinRange",
            message: "the desired count is within the acceptable range",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `behavior`: the highest recommendation of the last 300 s holds on the way down
    /// (and is not bounded by the current count, as upstream); going up, at most twice the
    /// replicas or 4, then max; below min, min.
    #[test]
    fn legacy_rules_follow_upstream() {
        let history = [t(800.0, 7), t(950.0, 3)];
        assert_eq!(legacy_stabilize(2, &history, 1000.0, 300.0), 7);
        assert_eq!(legacy_stabilize(2, &history, 1101.0, 300.0), 3);
        assert_eq!(legacy_stabilize(9, &history, 1000.0, 300.0), 9);
        let cases = [
            // (current, desired, min, max, replicas, reason)
            (1, 8, 1, 10, 4, "ScaleUpLimit"),
            (3, 8, 1, 10, 6, "ScaleUpLimit"),
            (1, 8, 1, 4, 4, "TooManyReplicas"),
            (3, 5, 1, 10, 5, "DesiredWithinRange"),
            (3, 0, 1, 10, 1, "TooFewReplicas"),
            (5, 2, 2, 10, 2, "DesiredWithinRange"),
        ];
        for (current, desired, min, max, want, reason) in cases {
            let (got, why) = legacy_limit(current, desired, min, max);
            assert_eq!((got, why.reason), (want, reason), "{current} → {desired}");
            assert_eq!(why.limited, reason != "DesiredWithinRange");
        }
    }

    fn t(at: f64, replicas: i32) -> Timed {
        Timed { at, replicas }
    }

    #[test]
    fn stabilization_takes_the_safest_recommendation_in_each_window() {
        let (up, down) = (Rules::default_up(), Rules::default_down());
        // Upstream's documented behaviour: on the way down the highest recommendation of the
        // last 300 s wins; it was 5 a minute ago, so 5 pods stay although 2 are wanted.
        let history = [t(940.0, 5), t(970.0, 3)];
        assert_eq!(stabilize(5, 2, &history, 1000.0, &up, &down), 5);
        // Once that recommendation is older than the window, the next highest (3) wins.
        assert_eq!(stabilize(5, 2, &history, 1241.0, &up, &down), 3);
        // Scaling up is not stabilized by default (window 0): the new recommendation applies.
        assert_eq!(stabilize(2, 6, &history, 1000.0, &up, &down), 6);
        // With a 60 s up window, the lowest recommendation within it wins: 3.
        let slow_up = Rules {
            stabilization_seconds: 60,
            ..Rules::default_up()
        };
        assert_eq!(stabilize(2, 6, &history, 1000.0, &slow_up, &down), 3);
    }

    /// (what, current, desired, min, max, rules up, rules down, past ups, past downs,
    /// expected replicas, expected reason): upstream's policy arithmetic.
    #[test]
    fn policy_cases_from_upstreams_algorithm() {
        let pods = |n, s| Policy {
            kind: PolicyKind::Pods,
            value: n,
            period_seconds: s,
        };
        let pct = |n, s| Policy {
            kind: PolicyKind::Percent,
            value: n,
            period_seconds: s,
        };
        let rules = |select, policies: Vec<Policy>| Rules {
            stabilization_seconds: 0,
            select,
            policies,
        };
        let now = 1000.0;
        type Case = (
            &'static str,
            i32,
            i32,
            i32,
            i32,
            Rules,
            Rules,
            Vec<Timed>,
            Vec<Timed>,
            i32,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            // Defaults: up by max(4 pods, 100 %) per 15 s: from 1, 1 + 4 = 5 beats 2.
            (
                "default up from 1",
                1,
                10,
                1,
                20,
                Rules::default_up(),
                Rules::default_down(),
                vec![],
                vec![],
                5,
                "ScaleUpLimit",
            ),
            // From 10, 100 % (20) beats 4 pods (14).
            (
                "default up from 10",
                10,
                30,
                1,
                50,
                Rules::default_up(),
                Rules::default_down(),
                vec![],
                vec![],
                20,
                "ScaleUpLimit",
            ),
            // maxReplicas below the rate: TooManyReplicas.
            (
                "max",
                10,
                30,
                1,
                12,
                Rules::default_up(),
                Rules::default_down(),
                vec![],
                vec![],
                12,
                "TooManyReplicas",
            ),
            // Within both: as desired.
            (
                "within",
                3,
                4,
                1,
                10,
                Rules::default_up(),
                Rules::default_down(),
                vec![],
                vec![],
                4,
                "DesiredWithinRange",
            ),
            // The seed's `scaleInterval: 10`: 1 pod per 10 s; a pod added 5 s ago uses it up.
            (
                "one pod per 10 s, used",
                3,
                6,
                1,
                10,
                rules(Select::Max, vec![pods(1, 10)]),
                Rules::default_down(),
                vec![t(995.0, 1)],
                vec![],
                3,
                "ScaleUpLimit",
            ),
            // …and 11 s later it is free again.
            (
                "one pod per 10 s, free",
                3,
                6,
                1,
                10,
                rules(Select::Max, vec![pods(1, 10)]),
                Rules::default_down(),
                vec![t(989.0, 1)],
                vec![],
                4,
                "ScaleUpLimit",
            ),
            // selectPolicy Min picks the smaller change: min(10 + 4, 10 × 1.5) = 14.
            (
                "select min up",
                10,
                30,
                1,
                50,
                rules(Select::Min, vec![pods(4, 60), pct(50, 60)]),
                Rules::default_down(),
                vec![],
                vec![],
                14,
                "ScaleUpLimit",
            ),
            // Disabled: no scaling up at all.
            (
                "disabled up",
                3,
                6,
                1,
                10,
                rules(Select::Disabled, vec![]),
                Rules::default_down(),
                vec![],
                vec![],
                3,
                "ScaleUpLimit",
            ),
            // Down by 50 % per 60 s from 10: 5 (truncated percent).
            (
                "percent down",
                10,
                1,
                1,
                20,
                Rules::default_up(),
                rules(Select::Max, vec![pct(50, 60)]),
                vec![],
                vec![],
                5,
                "ScaleDownLimit",
            ),
            // 50 % of 7 = 3.5 → 3 left (truncation).
            (
                "percent down truncates",
                7,
                1,
                1,
                20,
                Rules::default_up(),
                rules(Select::Max, vec![pct(50, 60)]),
                vec![],
                vec![],
                3,
                "ScaleDownLimit",
            ),
            // The period started at 12 (2 removed 30 s ago): 50 % of 12 = 6 is the floor.
            (
                "percent down, period start",
                10,
                1,
                1,
                20,
                Rules::default_up(),
                rules(Select::Max, vec![pct(50, 60)]),
                vec![],
                vec![t(970.0, 2)],
                6,
                "ScaleDownLimit",
            ),
            // Min on the way down removes fewer: max(10 - 1, 10 × 0.5) = 9.
            (
                "select min down",
                10,
                1,
                1,
                20,
                Rules::default_up(),
                rules(Select::Min, vec![pods(1, 60), pct(50, 60)]),
                vec![],
                vec![],
                9,
                "ScaleDownLimit",
            ),
            // minReplicas above the rate: TooFewReplicas.
            (
                "min",
                10,
                1,
                8,
                20,
                Rules::default_up(),
                Rules::default_down(),
                vec![],
                vec![],
                8,
                "TooFewReplicas",
            ),
            // Disabled down keeps the count.
            (
                "disabled down",
                10,
                1,
                1,
                20,
                Rules::default_up(),
                rules(Select::Disabled, vec![]),
                vec![],
                vec![],
                10,
                "ScaleDownLimit",
            ),
        ];
        for (what, current, desired, min, max, up, down, ups, downs, want, reason) in cases {
            let (got, why) = limit(
                current,
                desired,
                &Bounds {
                    min,
                    max,
                    ups: &ups,
                    downs: &downs,
                    up: &up,
                    down: &down,
                    now,
                },
            );
            assert_eq!((got, why.reason), (want, reason), "{what}");
        }
    }
}

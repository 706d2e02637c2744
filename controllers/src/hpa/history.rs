//! What an HPA remembers between syncs: its recent recommendations (for the stabilization
//! windows) and scale changes (for the policies' periods). Upstream keeps them in the
//! controller's memory, so a restart forgets them and starts a new window. Here they are also
//! kept in an annotation on the HPA whenever they hold a pending decision, so a restarted
//! controller decides as the old one would have (no flapping, and no fresh window either).

use super::behavior::Timed;
use serde::{Deserialize, Serialize};

/// The annotation that carries the history.
pub const ANNOTATION: &str = "autoscaling.minik8s.io/history";

/// Recommendations and scale changes, with times in seconds since the epoch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// Recent recommendations: for each value, the last time it was recommended.
    pub recommendations: Vec<Timed>,
    /// Recent scale-ups, with how many pods each added.
    pub ups: Vec<Timed>,
    /// Recent scale-downs, with how many pods each removed.
    pub downs: Vec<Timed>,
}

/// The annotation's form: `[replicas, seconds]` pairs.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    #[serde(default, rename = "r")]
    recommendations: Vec<(i32, i64)>,
    #[serde(default, rename = "u")]
    ups: Vec<(i32, i64)>,
    #[serde(default, rename = "d")]
    downs: Vec<(i32, i64)>,
}

fn pairs(list: &[Timed]) -> Vec<(i32, i64)> {
    list.iter().map(|t| (t.replicas, t.at as i64)).collect()
}

fn timed(list: &[(i32, i64)]) -> Vec<Timed> {
    list.iter()
        .map(|&(replicas, at)| Timed {
            at: at as f64,
            replicas,
        })
        .collect()
}

impl History {
    /// A fresh history: the current replicas recommended now (upstream's initial
    /// recommendation, so a new or restarted controller does not scale down at once).
    pub fn seeded(current: i32, now: f64) -> Self {
        History {
            recommendations: vec![Timed {
                at: now,
                replicas: current,
            }],
            ..Default::default()
        }
    }

    /// The history kept in an HPA's annotation, if it has a readable one.
    pub fn from_annotation(value: &str) -> Option<Self> {
        let s: Stored = serde_json::from_str(value).ok()?;
        Some(History {
            recommendations: timed(&s.recommendations),
            ups: timed(&s.ups),
            downs: timed(&s.downs),
        })
    }

    /// Records a recommendation made now; forgets those older than `keep` seconds. Only the
    /// last time of each value is kept: the windows take the lowest or highest value seen
    /// within them, which that time decides alone.
    pub fn recommend(&mut self, replicas: i32, now: f64, keep: f64) {
        self.recommendations
            .retain(|r| r.replicas != replicas && r.at >= now - keep);
        self.recommendations.push(Timed { at: now, replicas });
    }

    /// Records a scale change made now; forgets changes older than the longest policy period
    /// of their direction.
    pub fn scaled(&mut self, from: i32, to: i32, now: f64, up_period: f64, down_period: f64) {
        self.forget_changes(now, up_period, down_period);
        if to > from {
            self.ups.push(Timed {
                at: now,
                replicas: to - from,
            });
        } else if to < from {
            self.downs.push(Timed {
                at: now,
                replicas: from - to,
            });
        }
    }

    /// Forgets scale changes older than the longest policy period of their direction.
    pub fn forget_changes(&mut self, now: f64, up_period: f64, down_period: f64) {
        self.ups.retain(|e| e.at > now - up_period);
        self.downs.retain(|e| e.at > now - down_period);
    }

    /// The annotation's value, or `None` when the history holds nothing a fresh one
    /// ([`History::seeded`] with `current`) would not: every recent recommendation is the
    /// current count and no scale change is recent.
    pub fn to_annotation(&self, current: i32) -> Option<String> {
        let trivial = self.recommendations.iter().all(|r| r.replicas == current)
            && self.ups.is_empty()
            && self.downs.is_empty();
        if trivial {
            return None;
        }
        serde_json::to_string(&Stored {
            recommendations: pairs(&self.recommendations),
            ups: pairs(&self.ups),
            downs: pairs(&self.downs),
        })
        .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_each_values_last_time_and_round_trips() {
        let mut h = History::seeded(4, 1000.0);
        assert_eq!(h.to_annotation(4), None, "nothing to keep yet");
        h.recommend(4, 1015.0, 300.0);
        h.recommend(1, 1030.0, 300.0);
        h.recommend(1, 1045.0, 300.0);
        assert_eq!(
            h.recommendations,
            vec![
                Timed {
                    at: 1015.0,
                    replicas: 4
                },
                Timed {
                    at: 1045.0,
                    replicas: 1
                }
            ]
        );
        let text = h.to_annotation(4).expect("a pending scale-down is kept");
        assert_eq!(History::from_annotation(&text), Some(h.clone()));
        // Older than the window: forgotten.
        h.recommend(1, 1400.0, 300.0);
        assert_eq!(h.recommendations.len(), 1);
        h.scaled(4, 1, 1400.0, 15.0, 15.0);
        assert_eq!(h.downs.len(), 1);
        h.forget_changes(1500.0, 15.0, 15.0);
        assert!(h.downs.is_empty());
        assert_eq!(h.to_annotation(1), None);
    }
}

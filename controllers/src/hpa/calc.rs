//! The replica calculation of the HorizontalPodAutoscaler, as upstream's
//! `pkg/controller/podautoscaler/replica_calculator.go` documents it: pods are grouped into
//! ready (with a metric), unready, missing a metric, and ignored; the usage ratio of the ready
//! pods decides, within a tolerance; then missing and unready pods are counted conservatively
//! (missing ones at the target on the way down and at zero on the way up, unready ones at zero
//! on the way up) and a proposal that would reverse the direction is dropped.

use std::collections::BTreeMap;
use std::time::Duration;

/// Upstream's default tolerance: ratios within 10 % of 1 change nothing.
pub const TOLERANCE: f64 = 0.1;
/// Upstream's default CPU initialization period (`--horizontal-pod-autoscaler-cpu-initialization-period`).
pub const CPU_INITIALIZATION_PERIOD: Duration = Duration::from_secs(300);
/// Upstream's default delay of the first readiness (`…-initial-readiness-delay`).
pub const INITIAL_READINESS_DELAY: Duration = Duration::from_secs(30);

/// A pod as the calculation sees it. Times are seconds on one clock (the controller's "now"
/// is [`Inputs::now`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodInfo {
    /// Being deleted.
    pub deleting: bool,
    /// `status.phase`.
    pub phase: Phase,
    /// The `Ready` condition: its status and when it last changed (`None`: no condition).
    pub ready: Option<(bool, f64)>,
    /// `status.startTime` (`None`: not started).
    pub start_time: Option<f64>,
    /// The sum of the containers' requests of the resource (millicores or bytes); `None`
    /// when a container has none.
    pub request: Option<i64>,
}

/// A pod's phase, as far as the calculation cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// Scheduled or starting.
    Pending,
    /// Running.
    #[default]
    Running,
    /// Ended well.
    Succeeded,
    /// Ended badly (ignored).
    Failed,
}

/// A pod's usage from `metrics.k8s.io`: the value, the end of its window and the window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Millicores or bytes.
    pub value: i64,
    /// When the window ended (seconds).
    pub timestamp: f64,
    /// The window's length (seconds).
    pub window: f64,
}

/// What a calculation needs.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// The target's replicas now (`scale.status.replicas`).
    pub current: i32,
    /// The pods the target's selector picks, by name.
    pub pods: &'a BTreeMap<String, PodInfo>,
    /// Their metrics, by pod name.
    pub metrics: &'a BTreeMap<String, Sample>,
    /// Whether the resource is CPU (readiness matters only for CPU, as upstream).
    pub cpu: bool,
    /// The controller's clock (seconds).
    pub now: f64,
}

/// Why no proposal could be made (upstream's messages).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalcError {
    /// The selector picked no pod.
    #[error("no pods returned by selector while calculating replica count")]
    NoPods,
    /// No usable metric.
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoMetrics,
    /// A pod with a metric lacks a request (utilization needs requests).
    #[error("missing request for {0}")]
    MissingRequest(String),
}

/// A proposal: the replica count and the usage it came from (utilization in percent of the
/// requests for [`utilization`], the average value for [`average_value`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// Replicas proposed.
    pub replicas: i32,
    /// Current usage (percent, or the average value).
    pub usage: i64,
}

struct Groups {
    ready: usize,
    unready: Vec<String>,
    missing: Vec<String>,
    metrics: BTreeMap<String, i64>,
}

/// Upstream's `groupPods` (and the removal of ignored and unready pods' metrics).
fn group(i: &Inputs) -> Groups {
    let mut g = Groups {
        ready: 0,
        unready: vec![],
        missing: vec![],
        metrics: BTreeMap::new(),
    };
    for (name, pod) in i.pods {
        if pod.deleting || pod.phase == Phase::Failed {
            continue;
        }
        if pod.phase == Phase::Pending {
            g.unready.push(name.clone());
            continue;
        }
        let Some(m) = i.metrics.get(name) else {
            g.missing.push(name.clone());
            continue;
        };
        if i.cpu {
            let unready = match (pod.ready, pod.start_time) {
                (Some((ready, changed)), Some(start)) => {
                    if start + CPU_INITIALIZATION_PERIOD.as_secs_f64() > i.now {
                        // Within the initialization period: the metric counts only once the pod
                        // is ready and the metric's window began after it became so.
                        !ready || m.timestamp < changed + m.window
                    } else {
                        // Afterwards: ignored only if it has never been ready.
                        !ready && start + INITIAL_READINESS_DELAY.as_secs_f64() > changed
                    }
                }
                _ => true,
            };
            if unready {
                g.unready.push(name.clone());
                continue;
            }
        }
        g.ready += 1;
        g.metrics.insert(name.clone(), m.value);
    }
    g
}

/// Replicas for a `Utilization` target (percent of the pods' requests).
pub fn utilization(i: &Inputs, target_percent: i32) -> Result<Proposal, CalcError> {
    let request = |name: &str| -> Result<i64, CalcError> {
        i.pods[name]
            .request
            .filter(|r| *r > 0)
            .ok_or_else(|| CalcError::MissingRequest(name.to_owned()))
    };
    let ratio_of = |metrics: &BTreeMap<String, i64>| -> Result<(f64, i64), CalcError> {
        let (mut used, mut requested) = (0i64, 0i64);
        for (name, v) in metrics {
            used += v;
            requested += request(name)?;
        }
        if requested == 0 {
            return Err(CalcError::NoMetrics);
        }
        let percent = used * 100 / requested;
        Ok((percent as f64 / target_percent.max(1) as f64, percent))
    };
    let fallback = |name: &str| -> Result<i64, CalcError> {
        Ok(request(name)? * (target_percent.max(100) as i64) / 100)
    };
    calculate(i, ratio_of, fallback)
}

/// Replicas for an `AverageValue` target (millicores or bytes per pod).
pub fn average_value(i: &Inputs, target: i64) -> Result<Proposal, CalcError> {
    let ratio_of = |metrics: &BTreeMap<String, i64>| -> Result<(f64, i64), CalcError> {
        if metrics.is_empty() {
            return Err(CalcError::NoMetrics);
        }
        // As upstream's GetMetricUsageRatio: an integer average over the pods.
        let average = metrics.values().sum::<i64>() / metrics.len() as i64;
        Ok((average as f64 / target.max(1) as f64, average))
    };
    calculate(i, ratio_of, |_| Ok(target))
}

/// The shared steps: decide on the ready pods; then recount with missing and unready pods
/// filled in conservatively, and keep the current count when that would flip the direction.
fn calculate(
    i: &Inputs,
    ratio_of: impl Fn(&BTreeMap<String, i64>) -> Result<(f64, i64), CalcError>,
    scale_down_fallback: impl Fn(&str) -> Result<i64, CalcError>,
) -> Result<Proposal, CalcError> {
    if i.pods.is_empty() {
        return Err(CalcError::NoPods);
    }
    let mut g = group(i);
    if g.metrics.is_empty() {
        return Err(CalcError::NoMetrics);
    }
    let (ratio, usage) = ratio_of(&g.metrics)?;
    let keep = Proposal {
        replicas: i.current,
        usage,
    };
    let up_with_unready = !g.unready.is_empty() && ratio > 1.0;
    if !up_with_unready && g.missing.is_empty() {
        if (1.0 - ratio).abs() <= TOLERANCE {
            return Ok(keep);
        }
        return Ok(Proposal {
            replicas: (ratio * g.ready as f64).ceil() as i32,
            usage,
        });
    }
    if ratio < 1.0 {
        for name in &g.missing {
            g.metrics.insert(name.clone(), scale_down_fallback(name)?);
        }
    } else if ratio > 1.0 {
        for name in &g.missing {
            g.metrics.insert(name.clone(), 0);
        }
    }
    if up_with_unready {
        for name in &g.unready {
            g.metrics.insert(name.clone(), 0);
        }
    }
    let (new_ratio, _) = ratio_of(&g.metrics)?;
    if (1.0 - new_ratio).abs() <= TOLERANCE
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok(keep);
    }
    let replicas = (new_ratio * g.metrics.len() as f64).ceil() as i32;
    if (new_ratio < 1.0 && replicas > i.current) || (new_ratio > 1.0 && replicas < i.current) {
        return Ok(keep);
    }
    Ok(Proposal { replicas, usage })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 10_000.0;

    /// A running pod, ready long ago, requesting `request` millicores.
    fn pod(request: i64) -> PodInfo {
        PodInfo {
            deleting: false,
            phase: Phase::Running,
            ready: Some((true, NOW - 5_000.0)),
            start_time: Some(NOW - 5_010.0),
            request: Some(request),
        }
    }

    fn sample(value: i64) -> Sample {
        Sample {
            value,
            timestamp: NOW - 1.0,
            window: 15.0,
        }
    }

    /// Pods `p0…` with requests, and metrics for those given one.
    fn setup(
        pods: &[(PodInfo, Option<i64>)],
    ) -> (BTreeMap<String, PodInfo>, BTreeMap<String, Sample>) {
        let mut ps = BTreeMap::new();
        let mut ms = BTreeMap::new();
        for (n, (p, m)) in pods.iter().enumerate() {
            ps.insert(format!("p{n}"), p.clone());
            if let Some(v) = m {
                ms.insert(format!("p{n}"), sample(*v));
            }
        }
        (ps, ms)
    }

    fn cpu(
        current: i32,
        pods: &[(PodInfo, Option<i64>)],
        target: i32,
    ) -> Result<Proposal, CalcError> {
        let (ps, ms) = setup(pods);
        utilization(
            &Inputs {
                current,
                pods: &ps,
                metrics: &ms,
                cpu: true,
                now: NOW,
            },
            target,
        )
    }

    /// Each case is upstream's documented algorithm applied by hand: (what, current replicas,
    /// pods with their CPU use, target %, expected replicas, expected utilization %).
    #[test]
    fn utilization_cases_from_upstreams_algorithm() {
        let r = |m: i64| (pod(1000), Some(m));
        type Case = (
            &'static str,
            i32,
            Vec<(PodInfo, Option<i64>)>,
            i32,
            i32,
            i64,
        );
        let cases: Vec<Case> = vec![
            // ceil(ratio × ready pods): 3 pods at 90 % of 1 core, target 50 → ceil(1.8×3) = 6.
            ("scale up", 3, vec![r(900), r(900), r(900)], 50, 6, 90),
            // 3 pods at 20 %, target 50 → ceil(0.4 × 3) = 2.
            ("scale down", 3, vec![r(200), r(200), r(200)], 50, 2, 20),
            // 54 % against 50 %: ratio 1.08 is within the tolerance of 0.1.
            (
                "within tolerance, up",
                3,
                vec![r(540), r(540), r(540)],
                50,
                3,
                54,
            ),
            // 46 % against 50 %: ratio 0.92, within the tolerance.
            (
                "within tolerance, down",
                3,
                vec![r(460), r(460), r(460)],
                50,
                3,
                46,
            ),
            // 56 %: ratio 1.12 is outside it → ceil(1.12 × 3) = 4.
            (
                "just outside tolerance",
                3,
                vec![r(560), r(560), r(560)],
                50,
                4,
                56,
            ),
            // Utilization is an integer percentage of the summed requests.
            ("integer percent", 2, vec![r(999), r(0)], 50, 2, 49),
            // A failed pod and a pod being deleted are ignored.
            (
                "ignored pods",
                3,
                vec![
                    r(900),
                    (
                        PodInfo {
                            phase: Phase::Failed,
                            ..pod(1000)
                        },
                        Some(0),
                    ),
                    (
                        PodInfo {
                            deleting: true,
                            ..pod(1000)
                        },
                        Some(0),
                    ),
                ],
                50,
                2,
                90,
            ),
            // Scale up with a pod missing its metric: the missing pod counts as 0 %.
            // Ready: 2 pods at 100 % → ratio 2. With the missing pod at 0: 200/300 = 66 % →
            // ratio 1.32 → ceil(1.32 × 3) = 4.
            (
                "missing on the way up",
                2,
                vec![r(1000), r(1000), (pod(1000), None)],
                50,
                4,
                100,
            ),
            // Scale down with a missing pod: it counts at max(100 %, target) of its request.
            // Ready: 2 pods at 10 % → ratio 0.2; with the missing one at 100 %: 120/300 = 40 %
            // → ratio 0.8 → ceil(0.8 × 3) = 3... which is not below 3 pods now: kept.
            (
                "missing on the way down",
                3,
                vec![r(100), r(100), (pod(1000), None)],
                50,
                3,
                10,
            ),
            // The same with 4 current replicas: 3 is a scale down, allowed.
            (
                "missing on the way down, fewer",
                4,
                vec![r(100), r(100), (pod(1000), None)],
                50,
                3,
                10,
            ),
            // Filling in a missing pod can flip the direction: then nothing changes.
            // Ready at 60 % (ratio 1.2, up); with the missing one at 0 %: 120/300 = 40 % (down).
            (
                "direction flips",
                3,
                vec![r(600), r(600), (pod(1000), None)],
                50,
                3,
                60,
            ),
            // A pending pod is unready; on the way up it counts as 0 %.
            // Ready: 1 at 100 % → ratio 2; with the pending one at 0: 50 % → within tolerance.
            (
                "unready on the way up",
                2,
                vec![
                    r(1000),
                    (
                        PodInfo {
                            phase: Phase::Pending,
                            ..pod(1000)
                        },
                        None,
                    ),
                ],
                50,
                2,
                100,
            ),
            // On the way down unready pods are left out.
            (
                "unready on the way down",
                2,
                vec![
                    r(100),
                    (
                        PodInfo {
                            phase: Phase::Pending,
                            ..pod(1000)
                        },
                        None,
                    ),
                ],
                50,
                1,
                10,
            ),
            // Within the CPU initialization period, a metric whose window began before the pod
            // became ready is not used (the pod is unready).
            (
                "young pod's metric from before readiness",
                2,
                vec![
                    r(1000),
                    (
                        PodInfo {
                            start_time: Some(NOW - 60.0),
                            ready: Some((true, NOW - 5.0)),
                            ..pod(1000)
                        },
                        Some(1000),
                    ),
                ],
                50,
                2,
                100,
            ),
        ];
        for (what, current, pods, target, replicas, usage) in cases {
            let got = cpu(current, &pods, target).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got, Proposal { replicas, usage }, "{what}");
        }
    }

    #[test]
    fn no_pods_no_metrics_and_no_requests_are_errors() {
        assert_eq!(cpu(1, &[], 50), Err(CalcError::NoPods));
        assert_eq!(
            cpu(1, &[(pod(1000), None)], 50).unwrap_err(),
            CalcError::NoMetrics
        );
        let no_request = PodInfo {
            request: None,
            ..pod(0)
        };
        assert_eq!(
            cpu(1, &[(no_request, Some(10))], 50),
            Err(CalcError::MissingRequest("p0".into()))
        );
    }

    #[test]
    fn memory_ignores_readiness_and_average_values_divide_by_the_target() {
        // Memory: a pod that is not ready still counts.
        let (ps, ms) = setup(&[(
            PodInfo {
                ready: Some((false, NOW)),
                ..pod(1000)
            },
            Some(900),
        )]);
        let i = Inputs {
            current: 1,
            pods: &ps,
            metrics: &ms,
            cpu: false,
            now: NOW,
        };
        assert_eq!(
            utilization(&i, 50).unwrap(),
            Proposal {
                replicas: 2,
                usage: 90
            }
        );
        // AverageValue: 3 pods using 300, 300, 600 (avg 400) against 200 → ceil(2 × 3) = 6.
        let (ps, ms) = setup(&[
            (pod(0), Some(300)),
            (pod(0), Some(300)),
            (pod(0), Some(600)),
        ]);
        let i = Inputs {
            current: 3,
            pods: &ps,
            metrics: &ms,
            cpu: false,
            now: NOW,
        };
        assert_eq!(
            average_value(&i, 200).unwrap(),
            Proposal {
                replicas: 6,
                usage: 400
            }
        );
        assert_eq!(
            average_value(&i, 380).unwrap(),
            Proposal {
                replicas: 3,
                usage: 400
            }
        );
    }
}

//! The HorizontalPodAutoscaler controller (`autoscaling/v2`), as upstream's
//! `pkg/controller/podautoscaler`: every sync period (and when an HPA's spec changes) it reads
//! the target's `scale` subresource (any kind that has one), the pods its selector picks and
//! their `metrics.k8s.io` usage, proposes replicas per metric ([`super::calc`]), takes the
//! largest, stabilizes and rate-limits it ([`super::behavior`]), writes `scale`, and reports
//! status, conditions and events with upstream's reasons and messages.

use super::behavior::{self, Bounds, Limited, Policy, PolicyKind, Rules, Select};
use super::calc::{self, CalcError, Inputs, Phase, PodInfo, Sample};
use super::history::{ANNOTATION, History};
use crate::driver::Driver;
use crate::{Result, util};
use k8s_openapi::api::autoscaling::v2::{
    HPAScalingRules, HorizontalPodAutoscaler, MetricSpec, MetricTarget,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use minik8s_events::{Recorder, Type};
use minik8s_types::quantity::Quantity;
use minik8s_types::selector::LabelSelector;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The controller's settings (upstream's `--horizontal-pod-autoscaler-*` flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// How often every HPA is reconciled (`…-sync-period`, 15 s).
    pub sync_period: Duration,
    /// The scale-down stabilization window when `behavior` does not set one
    /// (`…-downscale-stabilization`, 5 min).
    pub downscale_stabilization: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            sync_period: Duration::from_secs(15),
            downscale_stabilization: Duration::from_secs(300),
        }
    }
}

struct Ctx {
    client: Client,
    pods: Store<Pod>,
    config: Config,
    recorder: Recorder,
    /// Each HPA's history, by `namespace/name`.
    memory: Mutex<HashMap<String, History>>,
}

/// Seconds since the epoch.
fn seconds(t: jiff::Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

fn parse_time(s: &str) -> Option<f64> {
    s.parse::<jiff::Timestamp>().ok().map(seconds)
}

/// A quantity of milli-units as upstream prints `NewMilliQuantity(v, DecimalSI)`.
pub fn decimal_quantity(millis: i64) -> String {
    if millis % 1000 != 0 {
        return format!("{millis}m");
    }
    let mut n = millis / 1000;
    if n == 0 {
        return "0".into();
    }
    let mut suffix = 0;
    while n % 1000 == 0 && suffix < 6 {
        n /= 1000;
        suffix += 1;
    }
    format!("{n}{}", ["", "k", "M", "G", "T", "P", "E"][suffix])
}

/// The HPA's conditions as they are updated during one reconcile (upstream's `setCondition`:
/// the transition time changes only when the status does).
struct Conditions {
    list: Vec<Value>,
    now: String,
}

impl Conditions {
    fn set(&mut self, kind: &str, status: bool, reason: &str, message: impl Into<String>) {
        let status = if status { "True" } else { "False" };
        let message = message.into();
        if let Some(c) = self.list.iter_mut().find(|c| c["type"] == kind) {
            if c["status"] != status {
                c["lastTransitionTime"] = json!(self.now);
            }
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        } else {
            self.list
                .push(json!({"type": kind, "status": status, "reason": reason,
                "message": message, "lastTransitionTime": self.now}));
        }
    }
}

/// Why one metric gave no proposal: the condition's reason and the error.
struct MetricError {
    reason: &'static str,
    /// The error as the condition and the event word it.
    detail: String,
    /// The error as the metric's source words it (`failed to get cpu resource metric value: …`).
    error: String,
}

/// One metric's proposal.
struct Proposal {
    replicas: i32,
    name: String,
    status: Value,
}

/// A pod's usage of a resource from `metrics.k8s.io`, summed over its containers (or one).
async fn pod_metrics(
    client: &Client,
    ns: &str,
    selector: &str,
    resource: &str,
    container: Option<&str>,
) -> std::result::Result<BTreeMap<String, Sample>, String> {
    let gvk = GroupVersionKind::gvk("metrics.k8s.io", "v1beta1", "PodMetrics");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "pods");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| format!("unable to fetch metrics from resource metrics API: {e}"))?;
    if list.items.is_empty() {
        return Err("no metrics returned from resource metrics API".into());
    }
    let mut out = BTreeMap::new();
    for m in list.items {
        let name = m.name_any();
        let timestamp = m.data["timestamp"].as_str().and_then(parse_time);
        let window = m.data["window"]
            .as_str()
            .and_then(util::go_duration)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut sum = 0i64;
        let mut found = false;
        for c in m.data["containers"].as_array().into_iter().flatten() {
            if container.is_some_and(|want| c["name"] != want) {
                continue;
            }
            let Some(q) = c["usage"][resource].as_str() else {
                continue;
            };
            found = true;
            sum += Quantity::parse(q).map(|q| q.millis() as i64).unwrap_or(0);
        }
        if found && let Some(timestamp) = timestamp {
            out.insert(
                name,
                Sample {
                    value: sum,
                    timestamp,
                    window,
                },
            );
        }
    }
    Ok(out)
}

/// The pods `selector` picks in `ns`, as the calculation sees them, with their requests of
/// `resource` (of one container, or all); a container without a request is upstream's error.
fn pods_of(
    pods: &Store<Pod>,
    ns: &str,
    selector: &LabelSelector,
    resource: &str,
    container: Option<&str>,
) -> (BTreeMap<String, PodInfo>, Option<String>) {
    let mut out = BTreeMap::new();
    let mut missing = None;
    for pod in pods.state() {
        if pod.namespace().as_deref() != Some(ns)
            || !selector.matches(pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
        {
            continue;
        }
        let name = pod.name_any();
        let status = pod.status.as_ref();
        let phase = match util::phase(&pod) {
            "Pending" => Phase::Pending,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            _ => Phase::Running,
        };
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| {
                (
                    c.status == "True",
                    c.last_transition_time
                        .as_ref()
                        .map_or(0.0, |t| seconds(t.0)),
                )
            });
        let start_time = status
            .and_then(|s| s.start_time.as_ref())
            .map(|t| seconds(t.0));
        let mut request = Some(0i64);
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            if container.is_some_and(|want| c.name != want) {
                continue;
            }
            match c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
            {
                Some(q) => {
                    let v = Quantity::parse(&q.0)
                        .map(|q| q.millis() as i64)
                        .unwrap_or(0);
                    request = request.map(|r| r + v);
                }
                None => {
                    request = None;
                    if missing.is_none() {
                        missing = Some(format!(
                            "missing request for {resource} in container {} of Pod {name}",
                            c.name
                        ));
                    }
                }
            }
        }
        out.insert(
            name,
            PodInfo {
                deleting: pod.metadata.deletion_timestamp.is_some(),
                phase,
                ready,
                start_time,
                request,
            },
        );
    }
    (out, missing)
}

impl Ctx {
    /// One `Resource` or `ContainerResource` metric (upstream's
    /// `computeStatusForResourceMetricGeneric`).
    #[allow(clippy::too_many_arguments)]
    async fn resource_metric(
        &self,
        ns: &str,
        selector: (&str, &LabelSelector),
        current: i32,
        resource: &str,
        container: Option<&str>,
        target: &MetricTarget,
        now: f64,
    ) -> std::result::Result<Proposal, String> {
        let kind = if container.is_some() {
            "ContainerResource"
        } else {
            "Resource"
        };
        let source = if container.is_some() {
            "containerResource"
        } else {
            "resource"
        };
        let metrics = pod_metrics(&self.client, ns, selector.0, resource, container).await;
        let (pods, missing_request) = pods_of(&self.pods, ns, selector.1, resource, container);
        let inputs = |metrics| Inputs {
            current,
            pods: &pods,
            metrics,
            cpu: resource == "cpu",
            now,
        };
        let mut status = json!({"name": resource});
        if let Some(c) = container {
            status["container"] = json!(c);
        }
        if let Some(value) = &target.average_value {
            let target_millis = Quantity::parse(&value.0)
                .map(|q| q.millis() as i64)
                .unwrap_or(0);
            let metrics = metrics.map_err(|e| {
                format!("failed to get {resource} usage: unable to get metrics for resource {resource}: {e}")
            })?;
            let p = calc::average_value(&inputs(&metrics), target_millis)
                .map_err(|e| format!("failed to get {resource} usage: {e}"))?;
            status["current"] = json!({"averageValue": decimal_quantity(p.usage)});
            return Ok(Proposal {
                replicas: p.replicas,
                name: format!("{resource} resource"),
                status: json!({"type": kind, source: status}),
            });
        }
        let Some(percent) = target.average_utilization else {
            return Err("invalid resource metric source: neither an average utilization target nor an average value (usage) target was set".into());
        };
        let metrics = metrics.map_err(|e| {
            format!("failed to get {resource} utilization: unable to get metrics for resource {resource}: {e}")
        })?;
        if let Some(m) = missing_request {
            return Err(format!("failed to get {resource} utilization: {m}"));
        }
        let p = calc::utilization(&inputs(&metrics), percent).map_err(|e| match e {
            CalcError::MissingRequest(pod) => {
                format!("failed to get {resource} utilization: missing request for {resource} in Pod {pod}")
            }
            other => format!("failed to get {resource} utilization: {other}"),
        })?;
        // The raw average: the ready pods' usage per pod (upstream reports it beside the
        // percentage).
        let ready: Vec<i64> = metrics
            .iter()
            .filter(|(name, _)| pods.contains_key(*name))
            .map(|(_, s)| s.value)
            .collect();
        let average = if ready.is_empty() {
            0
        } else {
            ready.iter().sum::<i64>() / ready.len() as i64
        };
        status["current"] =
            json!({"averageUtilization": p.usage, "averageValue": decimal_quantity(average)});
        let name = if container.is_some() {
            format!("{resource} container resource utilization (percentage of request)")
        } else {
            format!("{resource} resource utilization (percentage of request)")
        };
        Ok(Proposal {
            replicas: p.replicas,
            name,
            status: json!({"type": kind, source: status}),
        })
    }

    /// One metric's proposal (upstream's `computeReplicasForMetric`).
    async fn metric(
        &self,
        ns: &str,
        selector: (&str, &LabelSelector),
        current: i32,
        spec: &MetricSpec,
        now: f64,
    ) -> std::result::Result<Proposal, MetricError> {
        let unable = |reason: &'static str, what: &str, detail: String| MetricError {
            reason,
            error: format!("failed to get {what} metric value: {detail}"),
            detail,
        };
        let no_custom = |name: &str, api: &str| {
            format!(
                "unable to get metric {name}: unable to fetch metrics from {api} API: the server could not find the requested resource"
            )
        };
        match spec.type_.as_str() {
            "Resource" => {
                let Some(r) = &spec.resource else {
                    return Err(unable(
                        "FailedGetResourceMetric",
                        "resource",
                        "no resource source".into(),
                    ));
                };
                self.resource_metric(ns, selector, current, &r.name, None, &r.target, now)
                    .await
                    .map_err(|e| MetricError {
                        reason: "FailedGetResourceMetric",
                        error: format!("failed to get {} resource metric value: {e}", r.name),
                        detail: e,
                    })
            }
            "ContainerResource" => {
                let Some(r) = &spec.container_resource else {
                    return Err(unable(
                        "FailedGetContainerResourceMetric",
                        "container resource",
                        "no container resource source".into(),
                    ));
                };
                self.resource_metric(
                    ns,
                    selector,
                    current,
                    &r.name,
                    Some(&r.container),
                    &r.target,
                    now,
                )
                .await
                .map_err(|e| MetricError {
                    reason: "FailedGetContainerResourceMetric",
                    error: format!(
                        "failed to get {} container resource metric value: {e}",
                        r.name
                    ),
                    detail: e,
                })
            }
            // No custom or external metrics API exists in this cluster (yet).
            "Pods" => {
                let name = spec.pods.as_ref().map_or("", |p| p.metric.name.as_str());
                Err(unable(
                    "FailedGetPodsMetric",
                    "pods",
                    no_custom(name, "custom metrics"),
                ))
            }
            "Object" => {
                let name = spec.object.as_ref().map_or("", |o| o.metric.name.as_str());
                Err(unable(
                    "FailedGetObjectMetric",
                    "object",
                    no_custom(name, "custom metrics"),
                ))
            }
            "External" => {
                let name = spec
                    .external
                    .as_ref()
                    .map_or("", |e| e.metric.name.as_str());
                Err(unable(
                    "FailedGetExternalMetric",
                    "external",
                    no_custom(name, "external metrics"),
                ))
            }
            other => Err(MetricError {
                reason: "InvalidMetricSourceType",
                detail: format!("unknown metric source type {other:?}"),
                error: format!("unknown metric source type {other:?}"),
            }),
        }
    }

    async fn event(
        &self,
        hpa: &HorizontalPodAutoscaler,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let type_ = if warning { Type::Warning } else { Type::Normal };
        self.recorder
            .record(&hpa.object_ref(&()), type_, reason, note);
    }
}

/// The target's `scale`: its API and the scale itself, or upstream's error text.
async fn scale_of(
    client: &Client,
    ns: &str,
    api_version: &str,
    kind: &str,
    name: &str,
) -> std::result::Result<(Api<DynamicObject>, Value), String> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|_| format!("no matches for kind {kind:?} in group {group:?}"))?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let scale = api
        .get_subresource("scale", name)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) => s.message,
            other => other.to_string(),
        })?;
    let scale = serde_json::to_value(scale.data).unwrap_or_default();
    Ok((api, scale))
}

/// Upstream's `HPAScalingRules` with this controller's default down window.
fn rules(r: Option<&HPAScalingRules>, default: Rules, window: Option<i32>) -> Rules {
    let Some(r) = r else {
        return Rules {
            stabilization_seconds: window.unwrap_or(default.stabilization_seconds),
            ..default
        };
    };
    Rules {
        stabilization_seconds: r
            .stabilization_window_seconds
            .or(window)
            .unwrap_or(default.stabilization_seconds),
        select: match r.select_policy.as_deref() {
            Some("Min") => Select::Min,
            Some("Disabled") => Select::Disabled,
            _ => Select::Max,
        },
        policies: match &r.policies {
            Some(ps) if !ps.is_empty() => ps
                .iter()
                .map(|p| Policy {
                    kind: if p.type_ == "Pods" {
                        PolicyKind::Pods
                    } else {
                        PolicyKind::Percent
                    },
                    value: p.value,
                    period_seconds: p.period_seconds,
                })
                .collect(),
            _ => default.policies,
        },
    }
}

async fn reconcile(hpa: Arc<HorizontalPodAutoscaler>, ctx: Arc<Ctx>) -> Result<Action> {
    let requeue = Action::requeue(ctx.config.sync_period);
    let ns = hpa.namespace().unwrap_or_default();
    let key = util::key(hpa.as_ref());
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
    // Work on the newest copy (the trigger may be a resync of an older one).
    let hpa = match api.get_opt(&hpa.name_any()).await? {
        Some(h) => h,
        None => {
            ctx.memory.lock().expect("hpa memory").remove(&key);
            return Ok(Action::await_change());
        }
    };
    let spec = hpa.spec.clone().unwrap_or_default();
    let old_status = serde_json::to_value(hpa.status.clone().unwrap_or_default())?;
    let now_ts = jiff::Timestamp::now();
    let now = seconds(now_ts);
    let mut conditions = Conditions {
        list: old_status["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        now: util::rfc3339(now_ts),
    };
    let mut status = json!({
        "currentReplicas": old_status.get("currentReplicas").cloned().unwrap_or(json!(0)),
        "desiredReplicas": old_status.get("desiredReplicas").cloned().unwrap_or(json!(0)),
        "lastScaleTime": old_status.get("lastScaleTime").cloned().unwrap_or(Value::Null),
        "currentMetrics": old_status.get("currentMetrics").cloned().unwrap_or(Value::Null),
        "observedGeneration": hpa.metadata.generation,
    });

    let target = &spec.scale_target_ref;
    let target_api_version = target.api_version.clone().unwrap_or_default();
    let (scale_api, scale) = match scale_of(
        &ctx.client,
        &ns,
        &target_api_version,
        &target.kind,
        &target.name,
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            ctx.event(&hpa, true, "FailedGetScale", e.clone()).await;
            conditions.set(
                "AbleToScale",
                false,
                "FailedGetScale",
                format!("the HPA controller was unable to get the target's current scale: {e}"),
            );
            status["conditions"] = json!(conditions.list);
            write_status(&api, &hpa, &old_status, status).await?;
            return Ok(requeue);
        }
    };
    conditions.set(
        "AbleToScale",
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale",
    );
    let current = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0) as i32;
    let min = spec.min_replicas.unwrap_or(1);
    let max = spec.max_replicas;

    let mut history = {
        let mut memory = ctx.memory.lock().expect("hpa memory");
        memory
            .entry(key.clone())
            .or_insert_with(|| {
                hpa.annotations()
                    .get(ANNOTATION)
                    .and_then(|a| History::from_annotation(a))
                    .unwrap_or_else(|| History::seeded(current, now))
            })
            .clone()
    };

    // Scale changes older than the longest policy period of their direction no longer count.
    let longest = |r: Option<&HPAScalingRules>| {
        r.and_then(|r| r.policies.as_ref())
            .into_iter()
            .flatten()
            .map(|p| p.period_seconds)
            .max()
            .unwrap_or(15) as f64
    };
    let behavior = spec.behavior.as_ref();
    let up_period = longest(behavior.and_then(|b| b.scale_up.as_ref()));
    let down_period = longest(behavior.and_then(|b| b.scale_down.as_ref()));
    history.forget_changes(now, up_period, down_period);

    let mut desired = 0;
    let mut rescale_reason = String::new();
    let mut rescale = true;
    let mut metric_statuses: Option<Vec<Value>> = None;
    let mut failure: Option<String> = None;
    if current == 0 && min != 0 {
        rescale = false;
        conditions.set(
            "ScalingActive",
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero",
        );
    } else if current > max {
        rescale_reason = "Current number of replicas above Spec.MaxReplicas".into();
        desired = max;
    } else if current < min {
        rescale_reason = "Current number of replicas below Spec.MinReplicas".into();
        desired = min;
    } else {
        match compute(&ctx, &hpa, &ns, &scale, current, &mut conditions, now).await {
            Err((statuses, error)) => {
                metric_statuses = statuses;
                failure = Some(error);
            }
            Ok((proposal, metric, statuses)) => {
                metric_statuses = Some(statuses);
                let mut rescale_metric = String::new();
                if proposal > desired {
                    desired = proposal;
                    rescale_metric = metric;
                }
                if desired > current {
                    rescale_reason = format!("{rescale_metric} above target");
                }
                if desired < current {
                    rescale_reason = "All metrics below target".into();
                }
                desired = normalize(
                    &ctx,
                    &spec,
                    &mut history,
                    &mut conditions,
                    current,
                    desired,
                    min,
                    now,
                );
                rescale = desired != current;
            }
        }
    }

    if let Some(error) = failure {
        status["currentReplicas"] = json!(current);
        status["currentMetrics"] = json!(metric_statuses);
        status["conditions"] = json!(conditions.list);
        write_status(&api, &hpa, &old_status, status).await?;
        ctx.event(&hpa, true, "FailedComputeMetricsReplicas", error)
            .await;
        keep_history(&ctx, &api, &hpa, &key, history, current).await?;
        return Ok(requeue);
    }

    if rescale {
        let patch = json!({"spec": {"replicas": desired}});
        if let Err(e) = scale_api
            .patch_subresource(
                "scale",
                &target.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            let e = match e {
                kube::Error::Api(s) => s.message,
                other => other.to_string(),
            };
            ctx.event(
                &hpa,
                true,
                "FailedRescale",
                format!("New size: {desired}; reason: {rescale_reason}; error: {e}"),
            )
            .await;
            conditions.set(
                "AbleToScale",
                false,
                "FailedUpdateScale",
                format!("the HPA controller was unable to update the target scale: {e}"),
            );
            status["currentReplicas"] = json!(current);
            status["currentMetrics"] = json!(metric_statuses);
            status["conditions"] = json!(conditions.list);
            write_status(&api, &hpa, &old_status, status).await?;
            return Ok(requeue);
        }
        conditions.set(
            "AbleToScale",
            true,
            "SucceededRescale",
            format!("the HPA controller was able to update the target scale to {desired}"),
        );
        ctx.event(
            &hpa,
            false,
            "SuccessfulRescale",
            format!("New size: {desired}; reason: {rescale_reason}"),
        )
        .await;
        if spec.behavior.is_some() {
            history.scaled(current, desired, now, up_period, down_period);
        }
        status["lastScaleTime"] = json!(util::rfc3339(now_ts));
        tracing::info!(hpa = %key, from = current, to = desired, reason = %rescale_reason, "rescaled");
    } else {
        desired = current;
    }
    status["currentReplicas"] = json!(current);
    status["desiredReplicas"] = json!(desired);
    status["currentMetrics"] = json!(metric_statuses);
    status["conditions"] = json!(conditions.list);
    write_status(&api, &hpa, &old_status, status).await?;
    keep_history(&ctx, &api, &hpa, &key, history, desired).await?;
    Ok(requeue)
}

/// Every metric's proposal, the largest winning (upstream's `computeReplicasForMetrics`):
/// (replicas, the metric's name, the statuses), or the statuses and the error when no metric
/// (or, on the way down, not every metric) could be read.
async fn compute(
    ctx: &Ctx,
    hpa: &HorizontalPodAutoscaler,
    ns: &str,
    scale: &Value,
    current: i32,
    conditions: &mut Conditions,
    now: f64,
) -> std::result::Result<(i32, String, Vec<Value>), (Option<Vec<Value>>, String)> {
    let selector_text = scale
        .pointer("/status/selector")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if selector_text.is_empty() {
        ctx.event(hpa, true, "SelectorRequired", "selector is required".into())
            .await;
        conditions.set(
            "ScalingActive",
            false,
            "InvalidSelector",
            "the HPA target's scale is missing a selector",
        );
        return Err((None, "selector is required".into()));
    }
    let selector = match LabelSelector::parse(selector_text) {
        Ok(s) => s,
        Err(e) => {
            let msg = format!(
                "couldn't convert selector into a corresponding internal selector object: {e}"
            );
            ctx.event(hpa, true, "InvalidSelector", msg.clone()).await;
            conditions.set("ScalingActive", false, "InvalidSelector", msg.clone());
            return Err((None, msg));
        }
    };
    let specs = hpa
        .spec
        .as_ref()
        .and_then(|s| s.metrics.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| {
            // An HPA stored without metrics (v1 without a target) scales on 80 % CPU.
            serde_json::from_value(json!([{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 80}}}]))
            .unwrap_or_default()
        });
    let mut statuses = vec![json!({"type": ""}); specs.len()];
    let (mut replicas, mut metric) = (0, String::new());
    let mut invalid: Vec<MetricError> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        match ctx
            .metric(ns, (selector_text, &selector), current, spec, now)
            .await
        {
            Ok(p) => {
                statuses[i] = p.status;
                if replicas == 0 || p.replicas > replicas {
                    replicas = p.replicas;
                    metric = p.name;
                }
            }
            Err(e) => {
                ctx.event(hpa, true, e.reason, e.detail.clone()).await;
                invalid.push(e);
            }
        }
    }
    if !invalid.is_empty() && (invalid.len() >= specs.len() || replicas < current) {
        let first = &invalid[0];
        conditions.set(
            "ScalingActive",
            false,
            first.reason,
            format!(
                "the HPA was unable to compute the replica count: {}",
                first.detail
            ),
        );
        return Err((
            Some(statuses),
            format!(
                "invalid metrics ({} invalid out of {}), first error is: {}",
                invalid.len(),
                specs.len(),
                first.error
            ),
        ));
    }
    conditions.set(
        "ScalingActive",
        true,
        "ValidMetricFound",
        format!("the HPA was able to successfully calculate a replica count from {metric}"),
    );
    Ok((replicas, metric, statuses))
}

/// Stabilizes and limits a proposal (upstream's `normalizeDesiredReplicas` without
/// `behavior`, `normalizeDesiredReplicasWithBehaviors` with it), recording it in `history`.
#[allow(clippy::too_many_arguments)]
fn normalize(
    ctx: &Ctx,
    spec: &k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerSpec,
    history: &mut History,
    conditions: &mut Conditions,
    current: i32,
    desired: i32,
    min: i32,
    now: f64,
) -> i32 {
    let default_down = ctx.config.downscale_stabilization.as_secs() as i32;
    let (stabilized, out, limited, keep): (i32, i32, Limited, f64) = match &spec.behavior {
        None => {
            let window = default_down as f64;
            let stabilized =
                behavior::legacy_stabilize(desired, &history.recommendations, now, window);
            let (out, limited) =
                behavior::legacy_limit(current, stabilized, min, spec.max_replicas);
            (stabilized, out, limited, window)
        }
        Some(b) => {
            let up = rules(b.scale_up.as_ref(), Rules::default_up(), None);
            let down = rules(
                b.scale_down.as_ref(),
                Rules::default_down(),
                Some(default_down),
            );
            let stabilized =
                behavior::stabilize(current, desired, &history.recommendations, now, &up, &down);
            let bounds = Bounds {
                min,
                max: spec.max_replicas,
                ups: &history.ups,
                downs: &history.downs,
                up: &up,
                down: &down,
                now,
            };
            let (out, limited) = behavior::limit(current, stabilized, &bounds);
            let keep = up.stabilization_seconds.max(down.stabilization_seconds) as f64;
            (stabilized, out, limited, keep)
        }
    };
    history.recommend(desired, now, keep);
    if stabilized == desired {
        conditions.set(
            "AbleToScale",
            true,
            "ReadyForNewScale",
            "recommended size matches current size",
        );
    } else if spec.behavior.is_some() && desired >= current {
        conditions.set(
            "AbleToScale",
            true,
            "ScaleUpStabilized",
            "recent recommendations were lower than current one, applying the lowest recent recommendation",
        );
    } else {
        conditions.set(
            "AbleToScale",
            true,
            "ScaleDownStabilized",
            "recent recommendations were higher than current one, applying the highest recent recommendation",
        );
    }
    conditions.set(
        "ScalingLimited",
        out != stabilized,
        limited.reason,
        limited.message,
    );
    out
}

/// Writes the status if it changed (upstream's `updateStatusIfNeeded`).
async fn write_status(
    api: &Api<HorizontalPodAutoscaler>,
    hpa: &HorizontalPodAutoscaler,
    old: &Value,
    mut new: Value,
) -> Result<()> {
    if let Some(m) = new.as_object_mut() {
        m.retain(|_, v| !v.is_null());
    }
    if &new == old {
        return Ok(());
    }
    // A merge patch: absent fields are removed explicitly.
    let mut patch = new.clone();
    for field in ["lastScaleTime", "currentMetrics"] {
        if patch.get(field).is_none() && old.get(field).is_some() {
            patch[field] = Value::Null;
        }
    }
    api.patch_status(
        &hpa.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": patch})),
    )
    .await?;
    Ok(())
}

/// Keeps the history in memory, and in the HPA's annotation when it holds a pending decision
/// (removing the annotation when it no longer does).
async fn keep_history(
    ctx: &Ctx,
    api: &Api<HorizontalPodAutoscaler>,
    hpa: &HorizontalPodAutoscaler,
    key: &str,
    history: History,
    replicas: i32,
) -> Result<()> {
    let wanted = history.to_annotation(replicas);
    ctx.memory
        .lock()
        .expect("hpa memory")
        .insert(key.to_owned(), history);
    if hpa.annotations().get(ANNOTATION) == wanted.as_ref() {
        return Ok(());
    }
    let patch = json!({"metadata": {"annotations": {ANNOTATION: wanted}}});
    api.patch(
        &hpa.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

/// Runs the HPA controller with upstream's default settings until `shutdown`.
pub async fn run(
    client: Client,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    run_with(client, Config::default(), informers, shutdown).await
}

/// Runs the HPA controller until `shutdown`.
pub async fn run_with(
    client: Client,
    config: Config,
    informers: crate::informer::Informers,
    shutdown: CancellationToken,
) {
    let pods = informers.all::<Pod>().await;
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(client.clone(), "horizontal-pod-autoscaler", None),
        client: client.clone(),
        pods,
        config,
        memory: Mutex::default(),
    });
    // Reconciled on spec changes (not on the controller's own status and annotation writes)
    // and every sync period (the reconcile requeues itself).
    Driver::<HorizontalPodAutoscaler>::on_spec_changes("horizontalpodautoscaling", &informers)
        .await
        .run(reconcile, ctx, shutdown)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_print_and_durations_read_as_upstream() {
        assert_eq!(decimal_quantity(250), "250m");
        assert_eq!(decimal_quantity(1000), "1");
        assert_eq!(decimal_quantity(52_428_800_000), "52428800");
        assert_eq!(decimal_quantity(12_000_000_000), "12M");
        assert_eq!(decimal_quantity(0), "0");
        let secs = |s| util::go_duration(s).map(|d| d.as_secs_f64());
        assert_eq!(secs("15s"), Some(15.0));
        assert_eq!(secs("15.5s"), Some(15.5));
        assert_eq!(secs("1m0.5s"), Some(60.5));
        assert_eq!(secs("250ms"), Some(0.25));
        assert_eq!(secs("5m"), Some(300.0));
        assert_eq!(secs("x"), None);
    }
}

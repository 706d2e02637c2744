//! The `Function` custom resource (`serverless.minik8s.io/v1alpha1`): Python code (or an image
//! that speaks the invocation protocol) run as a Deployment scaled 0 → N → 0 by the gateway's
//! autoscaler. The CRD is generated from these types (`crdgen`).

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// An object kept as it is by the apiserver (a Knative revision template).
pub fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// What runs a function's code.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum Runtime {
    /// The locally built Python runtime image: `source` holds the module.
    #[default]
    #[serde(rename = "python3")]
    Python3,
    /// `image` is run as it is; it must serve the invocation protocol on port 8080.
    #[serde(rename = "image")]
    Image,
    /// A Knative Serving revision: `template` is the pod (any HTTP server on `$PORT`), and
    /// calls reach it as they came (method, path, headers, body).
    #[serde(rename = "container")]
    Container,
}

/// Where a function's code runs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum Placement {
    /// Pods of its own (one process per pod): the isolation of a container.
    #[default]
    #[serde(rename = "pod")]
    Pod,
    /// Modules loaded into warm base processes (virtual nodes): millisecond cold starts, one
    /// Python process shared with the other modules of the base (same namespace only).
    #[serde(rename = "module")]
    Module,
}

/// Where the function's code comes from.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The module's text (`main.py`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
    /// A key of a ConfigMap in the function's namespace holding the module's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKey>,
}

/// A key of a ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct ConfigMapKey {
    /// The ConfigMap's name.
    pub name: String,
    /// The key whose value is the module's text.
    pub key: String,
}

/// How the function scales.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minScale <= self.maxScale").message("minScale must not be greater than maxScale"))]
pub struct Scale {
    /// Pods kept when idle (0: scale to zero).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_scale: i32,
    /// Most pods.
    #[serde(default = "default_max_scale")]
    #[schemars(range(min = 1))]
    pub max_scale: i32,
    /// Requests one pod serves at once (a Python handler: 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub target_concurrency: i32,
    /// Seconds without requests before the function scales to zero.
    #[serde(default = "default_idle")]
    #[schemars(range(min = 0))]
    pub scale_to_zero_after_seconds: i32,
    /// Requests held per function while it has no ready pod or all are busy.
    #[serde(default = "default_queue")]
    #[schemars(range(min = 0))]
    pub queue_limit: i32,
    /// Requests one pod is given at once, a hard limit (0: no limit); without it,
    /// `targetConcurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub container_concurrency: Option<i32>,
    /// What the autoscaler measures: requests in flight (`concurrency`) or arriving a second
    /// (`rps`).
    #[serde(default, skip_serializing_if = "Metric::is_concurrency")]
    pub metric: Metric,
    /// The value of the metric per pod the autoscaler aims at; without it,
    /// `targetConcurrency` for `concurrency` and 200 for `rps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01))]
    pub target: Option<f64>,
    /// Seconds the autoscaler averages the metric over (its stable window; 60 without).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub window_seconds: Option<i32>,
}

/// What the autoscaler measures.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Requests in flight or waiting.
    #[default]
    Concurrency,
    /// Requests arriving a second.
    Rps,
}

impl Metric {
    fn is_concurrency(&self) -> bool {
        *self == Metric::Concurrency
    }
}

/// Knative's default target for the `rps` metric (`requests-per-second-target-default`).
pub const DEFAULT_RPS_TARGET: f64 = 200.0;

impl Scale {
    /// The requests one pod is given at once (`None`: no limit).
    pub fn per_pod_limit(&self) -> Option<usize> {
        match self.container_concurrency {
            Some(0) => None,
            Some(n) => Some(n.max(1) as usize),
            None => Some(self.target_concurrency.max(1) as usize),
        }
    }

    /// The metric's value per pod the autoscaler aims at.
    pub fn target_value(&self) -> f64 {
        let default = match self.metric {
            Metric::Concurrency => f64::from(self.target_concurrency.max(1)),
            Metric::Rps => DEFAULT_RPS_TARGET,
        };
        self.target.unwrap_or(default).max(0.01)
    }

    /// The autoscaler's stable window.
    pub fn window(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.window_seconds.unwrap_or(60).clamp(1, 3600) as u64)
    }
}

fn default_max_scale() -> i32 {
    10
}
fn one() -> i32 {
    1
}
fn default_idle() -> i32 {
    30
}
fn default_queue() -> i32 {
    100
}
fn default_handler() -> String {
    "main.handler".into()
}
fn default_timeout() -> i64 {
    60
}
fn default_history() -> i32 {
    10
}

impl Default for Scale {
    fn default() -> Self {
        Scale {
            min_scale: 0,
            max_scale: default_max_scale(),
            target_concurrency: 1,
            scale_to_zero_after_seconds: default_idle(),
            queue_limit: default_queue(),
            container_concurrency: None,
            metric: Metric::Concurrency,
            target: None,
            window_seconds: None,
        }
    }
}

/// The API group of the serverless kinds.
pub const GROUP: &str = "serverless.minik8s.io";

/// A function: code, how it is called and how it scales.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.traffic) || size(self.traffic) == 0 || self.traffic.map(t, has(t.percent) ? t.percent : 0).sum() == 100").message("traffic percentages must sum to 100").field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(t, has(t.revisionName) != (has(t.latestRevision) && t.latestRevision))").message("a traffic target names either a revisionName or latestRevision: true").field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(a, !has(a.tag) || self.traffic.exists_one(b, has(b.tag) && b.tag == a.tag))").message("a tag may name only one traffic target").field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.placement) || self.placement != 'module' || !has(self.runtime) || self.runtime == 'python3'").message("placement module needs runtime python3 (an image runs in pods of its own)"))]
#[x_kube(validation = Rule::new("!has(self.runtime) || self.runtime != 'container' || has(self.template)").message("runtime container needs a template (the pod of a Knative revision)").field_path(".template"))]
#[kube(
    group = "serverless.minik8s.io",
    version = "v1alpha1",
    kind = "Function",
    namespaced,
    shortname = "fn",
    status = "FunctionStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".status.url"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FunctionSpec {
    /// `python3` (the local runtime image) or `image`.
    #[serde(default)]
    pub runtime: Runtime,
    /// The image, for runtime `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The code, for runtime `python3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// The pod, for runtime `container`: a Knative `RevisionTemplateSpec` (`metadata` with
    /// labels and annotations, `spec` a pod spec with Knative's `containerConcurrency` and
    /// `timeoutSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub template: Option<serde_json::Value>,
    /// `module.function` called with the event (default `main.handler`).
    #[serde(default = "default_handler")]
    pub handler: String,
    /// Environment of the function's pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Resources of the function's container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Longest time one invocation may take (504 after it).
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: i64,
    /// Scaling.
    #[serde(default)]
    pub scale: Scale,
    /// `pod` (default) or `module` (runtime `python3` only).
    #[serde(default)]
    pub placement: Placement,
    /// How calls are split between revisions (Knative's `traffic`). Empty: every call goes
    /// to the latest ready revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
    /// Revisions kept that take no traffic (older ones are deleted with their pods and code).
    #[serde(default = "default_history")]
    #[schemars(range(min = 0))]
    pub revision_history_limit: i32,
}

/// One entry of a traffic split: a revision (by name, or the latest ready one), its share of
/// calls, and a tag that reaches it at `…/function/<ns>/<name>@<tag>` whatever its share.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
// (In `status.traffic` every target names its revision, and `latestRevision` says whether it
// was chosen as the latest: the rule that a target names one or the other is the spec's.)
pub struct TrafficTarget {
    /// A revision of this function (`<function>-00001`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// The latest ready revision, whichever it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_revision: Option<bool>,
    /// The share of calls, 0–100; the targets' shares sum to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub percent: Option<i64>,
    /// A name for this target: a DNS label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub tag: Option<String>,
    /// Where the tag is reached (in `status.traffic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// What the controller and the gateway report about a function.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FunctionStatus {
    /// Where to invoke it (`POST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Pods asked for.
    #[serde(default)]
    pub replicas: i32,
    /// Pods ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` and `SourceReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The last cold start, from the first request to its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_cold_start_millis: Option<i64>,
    /// The newest revision made from the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_created_revision: Option<String>,
    /// The newest revision that became ready (what `latestRevision: true` routes to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_ready_revision: Option<String>,
    /// The split the gateway applies, with every target's revision named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
}

/// The label naming a revision's function (on revisions, their pods, Deployments, code).
pub const REVISION_LABEL: &str = "serverless.minik8s.io/revision";

/// An immutable snapshot of what a Function runs: made by the Function controller on every
/// change of code, handler, runtime, image, env, resources, timeout or placement, owned by
/// the Function, run as a Deployment of its own and scaled 0 → N → 0 on its own traffic.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[kube(
    group = "serverless.minik8s.io",
    version = "v1alpha1",
    kind = "FunctionRevision",
    namespaced,
    shortname = "fnrev",
    status = "FunctionRevisionStatus",
    printcolumn = r#"{"name":"Function","type":"string","jsonPath":".spec.function"}"#,
    printcolumn = r#"{"name":"Generation","type":"integer","jsonPath":".spec.generation"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Traffic","type":"string","jsonPath":".status.traffic"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FunctionRevisionSpec {
    /// The Function it was made from.
    pub function: String,
    /// The Function's `metadata.generation` when it was made.
    pub generation: i64,
    /// A hash of everything below and the code: equal hashes run the same thing.
    pub code_hash: String,
    /// As the Function's.
    #[serde(default)]
    pub runtime: Runtime,
    /// As the Function's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// As the Function's (runtime `container`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub template: Option<serde_json::Value>,
    /// The frozen code (`python3`): a ConfigMap owned by the revision, key the module file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ConfigMapKey>,
    /// As the Function's.
    pub handler: String,
    /// As the Function's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// As the Function's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// As the Function's.
    pub timeout_seconds: i64,
    /// As the Function's.
    #[serde(default)]
    pub placement: Placement,
}

/// What the revision controller reports about a revision.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FunctionRevisionStatus {
    /// Pods asked for.
    #[serde(default)]
    pub replicas: i32,
    /// Pods ready to serve.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The share of the Function's calls it takes (`90%`; tags after it), empty if none.
    /// Always written, as `null` when none: the controller's merge patch of the status must
    /// clear the share of a revision that lost its traffic.
    #[serde(default)]
    pub traffic: Option<String>,
    /// `Ready`: it served once (a revision at zero stays Ready), or why it cannot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_crd_has_the_names_columns_defaults_and_rules_users_see() {
        let crd = serde_json::to_value(Function::crd()).unwrap();
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!(["fn"])
        );
        let v = &crd["spec"]["versions"][0];
        assert!(v["subresources"]["status"].is_object());
        let text = v.to_string();
        assert!(text.contains("self.minScale <= self.maxScale"), "{text}");
        assert!(
            text.contains(r#""enum":["python3","image","container"]"#),
            "{text}"
        );
        let spec: FunctionSpec =
            serde_json::from_value(serde_json::json!({"source": {"inline": "x"}})).unwrap();
        assert_eq!(spec.handler, "main.handler");
        assert_eq!(spec.scale, Scale::default());
        assert_eq!(spec.timeout_seconds, 60);
    }
}

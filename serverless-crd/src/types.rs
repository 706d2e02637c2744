//! The `Function` custom resource (`serverless.minik8s.io/v1alpha1`): Python code (or an image
//! that speaks the invocation protocol) run as a Deployment scaled 0 → N → 0 by the gateway's
//! autoscaler. The CRD is generated from these types (`crdgen`).

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

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

impl Default for Scale {
    fn default() -> Self {
        Scale {
            min_scale: 0,
            max_scale: default_max_scale(),
            target_concurrency: 1,
            scale_to_zero_after_seconds: default_idle(),
            queue_limit: default_queue(),
        }
    }
}

/// The API group of the serverless kinds.
pub const GROUP: &str = "serverless.minik8s.io";

/// A function: code, how it is called and how it scales.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.placement) || self.placement != 'module' || !has(self.runtime) || self.runtime == 'python3'").message("placement module needs runtime python3 (an image runs in pods of its own)"))]
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
        assert!(text.contains(r#""enum":["python3","image"]"#), "{text}");
        let spec: FunctionSpec =
            serde_json::from_value(serde_json::json!({"source": {"inline": "x"}})).unwrap();
        assert_eq!(spec.handler, "main.handler");
        assert_eq!(spec.scale, Scale::default());
        assert_eq!(spec.timeout_seconds, 60);
    }
}

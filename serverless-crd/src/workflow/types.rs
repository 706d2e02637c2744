//! The `Workflow` (a definition: steps from `startAt`) and `WorkflowRun` (one execution, with
//! every step it took recorded in its status) custom resources.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Any JSON value (kept as it is by the apiserver).
fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"x-kubernetes-preserve-unknown-fields": true})
}

/// What a step does.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum StepType {
    /// Invokes `function` with the step's input; its answer is the output.
    #[default]
    Task,
    /// Goes to the `next` of the first of `choices` whose condition holds, else to `default`.
    Choice,
    /// Runs `branches` concurrently; the output is the array of their outputs.
    Parallel,
    /// Reshapes its input with the CEL expression `output` (or passes it on).
    Pass,
    /// Ends the run successfully with its input as the output.
    Succeed,
    /// Ends the run as failed with `error` and `cause`.
    Fail,
}

/// How a failing Task is tried again.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// Attempts in all, the first included.
    #[schemars(range(min = 1))]
    pub max_attempts: i32,
    /// Seconds between attempts (doubling after each).
    #[serde(default = "default_backoff")]
    #[schemars(range(min = 0))]
    pub backoff_seconds: f64,
}

fn default_backoff() -> f64 {
    1.0
}

/// One way out of a Choice.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct ChoiceRule {
    /// A CEL expression over `input` that is true or false.
    pub condition: String,
    /// The step to go to when it is true.
    pub next: String,
}

/// A branch of a Parallel step: steps of their own from `startAt`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Branch {
    /// The branch's first step.
    pub start_at: String,
    /// The branch's steps (of the same shape as the Workflow's).
    #[schemars(schema_with = "any_json")]
    pub steps: Value,
}

/// A step of a workflow.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Unique among the steps it is listed with.
    pub name: String,
    /// What it does.
    #[serde(rename = "type", default)]
    pub type_: StepType,
    /// The Function a Task invokes (in the run's namespace): `<name>`, or `<name>@<tag>` for
    /// the revision its traffic tags so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// The step after this one; none ends the run (or branch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Longest time one attempt of a Task may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<i64>,
    /// How a failing Task is tried again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// The step to go to when a Task or Parallel fails (its input: `{"error", "cause"}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch: Option<String>,
    /// A Choice's rules, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<ChoiceRule>,
    /// A Choice's step when no rule holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// A Parallel's branches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<Branch>,
    /// A Pass step's CEL expression: its output, from `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// A Fail step's error name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A Fail step's explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

/// Transitions a run may take unless the Workflow says otherwise.
pub const DEFAULT_MAX_STEPS: i64 = 1000;

fn default_max_steps() -> i64 {
    DEFAULT_MAX_STEPS
}

/// A workflow: steps from `startAt`, each naming the next.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[kube(
    group = "serverless.minik8s.io",
    version = "v1alpha1",
    kind = "Workflow",
    namespaced,
    shortname = "wf",
    status = "WorkflowStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Steps","type":"integer","jsonPath":".status.steps"}"#,
    printcolumn = r#"{"name":"Runs","type":"integer","jsonPath":".status.runs"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowSpec {
    /// The first step.
    pub start_at: String,
    /// The steps.
    pub steps: Vec<Step>,
    /// When set, applying the Workflow starts a run (`<name>-<generation>`) with these as input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub params: Option<Value>,
    /// Most transitions one run may take (loops through a Choice end there, as Failed).
    #[serde(default = "default_max_steps")]
    #[schemars(range(min = 1))]
    pub max_steps: i64,
}

/// What the controller reports about a Workflow.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStatus {
    /// Its steps (top level).
    #[serde(default)]
    pub steps: i64,
    /// Its runs that exist.
    #[serde(default)]
    pub runs: i64,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The generation whose `params` run was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_generation: Option<i64>,
    /// `Ready`: the definition is valid (else the message names the step).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A Workflow by name, in the run's namespace.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct WorkflowRef {
    /// The Workflow's name.
    pub name: String,
}

/// One execution of a workflow.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[kube(
    group = "serverless.minik8s.io",
    version = "v1alpha1",
    kind = "WorkflowRun",
    namespaced,
    shortname = "wfr",
    status = "WorkflowRunStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.step"}"#,
    printcolumn = r#"{"name":"Duration","type":"string","jsonPath":".status.duration"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowRunSpec {
    /// The Workflow to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_ref: Option<WorkflowRef>,
    /// Or a definition of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_spec: Option<WorkflowSpec>,
    /// The first step's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub input: Option<Value>,
}

/// Where a run is.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum Phase {
    /// Not started.
    #[default]
    Pending,
    /// Steps are being taken.
    Running,
    /// Ended by a last step or a Succeed.
    Succeeded,
    /// Ended by an error nothing caught, a Fail, an invalid definition or `maxSteps`.
    Failed,
}

impl Phase {
    /// Whether the run has ended.
    pub fn finished(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// One executed step, recorded as it completes.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// The step.
    pub name: String,
    /// Where it ran: empty at the top, `<parallel step>#<n>[<branch>]/…` inside branches.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Its type.
    #[serde(rename = "type")]
    pub type_: StepType,
    /// Its input (absent when stored in `inputRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub input: Option<Value>,
    /// A ConfigMap (owned by the run, key `value`) holding a large input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ref: Option<String>,
    /// Its output (absent when stored in `outputRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub output: Option<Value>,
    /// A ConfigMap (owned by the run, key `value`) holding a large output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_ref: Option<String>,
    /// The step taken next (none: the run or branch ended here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Invocations made (Tasks).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: i32,
    /// The Function revision that answered the last invocation (Tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// When it started (RFC 3339, microseconds).
    pub start_time: String,
    /// When it ended.
    pub end_time: String,
    /// The error it ended with (caught when `next` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error's explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// What the controller records of a run.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowRunStatus {
    /// Where the run is.
    #[serde(default)]
    pub phase: Phase,
    /// The step being taken (top level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// How long it took (`1.234s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// The last step's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub output: Option<Value>,
    /// A ConfigMap (owned by the run, key `value`) holding a large output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_ref: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The failure's explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// Every executed step, in the order they completed.
    #[serde(default)]
    pub steps: Vec<StepRecord>,
}

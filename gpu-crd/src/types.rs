//! The `GPUJob` custom resource (`gpu.minik8s.io/v1alpha1`, short name `gj`): a program built
//! and run as one Slurm batch job. (A kind named `Job` would collide with `batch/v1` in
//! `kubectl get job`.) The CRD is generated from these types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API group of the GPU kinds.
pub const GROUP: &str = "gpu.minik8s.io";

/// A program built and run on a Slurm cluster with GPUs.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[kube(
    group = "gpu.minik8s.io",
    version = "v1alpha1",
    kind = "GPUJob",
    plural = "gpujobs",
    namespaced,
    shortname = "gj",
    status = "GPUJobStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Slurm-ID","type":"string","jsonPath":".status.slurmJobId"}"#,
    printcolumn = r#"{"name":"Partition","type":"string","jsonPath":".spec.partition"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".spec.gpus"}"#,
    printcolumn = r#"{"name":"Duration","type":"string","jsonPath":".status.duration"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GPUJobSpec {
    /// The Slurm partition (the seed's `partition`); the cluster's default when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_.-]*$"))]
    pub partition: Option<String>,
    /// Nodes (`--nodes`).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub nodes: i32,
    /// Tasks per node (`--ntasks-per-node`; the seed's `taskPerNode`).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub tasks_per_node: i32,
    /// CPUs per task (`--cpus-per-task`; the seed's `cpu_per_task`).
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub cpus_per_task: i32,
    /// GPUs per node (`--gres=gpu:N`; the seed's `gpu-num`).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub gpus: i32,
    /// The time limit (`--time`), as Slurm writes it: `MM`, `HH:MM:SS`, `D-HH:MM:SS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(\d+-)?\d+(:\d{1,2}){0,2}$"))]
    pub time_limit: Option<String>,
    /// The program's files (the seed's `codePath`).
    #[serde(default)]
    pub source: Source,
    /// The build command, run in the job's folder before `run` (e.g. `nvcc add.cu -o add`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    /// The run command (e.g. `./add`).
    #[schemars(length(min = 1))]
    pub run: String,
    /// The file the program writes its result to (the seed's `file`); else its stdout is the
    /// result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_file: Option<String>,
    /// Environment of the build and run commands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Which Slurm cluster (the Secret `gpu-system/slurm-<cluster>`); `default` when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

fn one() -> i32 {
    1
}

/// An environment variable.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct EnvVar {
    /// Its name.
    #[schemars(regex(pattern = r"^[A-Za-z_][A-Za-z0-9_]*$"))]
    pub name: String,
    /// Its value.
    #[serde(default)]
    pub value: String,
}

/// Where the program's files come from.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// Files by name (`add.cu: |…`); names are plain file names.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inline: BTreeMap<String, String>,
    /// A ConfigMap in the job's namespace whose keys are file names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapRef>,
}

/// A ConfigMap by name.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct ConfigMapRef {
    /// The ConfigMap's name.
    pub name: String,
}

/// What happened to a GPUJob.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GPUJobStatus {
    /// `Pending`, `Submitted`, `Queued`, `Running`, `Succeeded`, `Failed` or `Cancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why it is in its phase (Slurm's reason, `BuildFailed`, `TIMEOUT`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Slurm job id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    /// Slurm's state (`PENDING`, `RUNNING`, `COMPLETED`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_state: Option<String>,
    /// The program's exit code (the build's, when it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// When Slurm accepted the job (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_time: Option<String>,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<String>,
    /// How long it ran (`12s`, `3m4s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// The tail of the job's stdout (at most 32 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// The tail of the job's stderr (at most 32 KiB; the build's output when it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// The tail of the result (at most 32 KiB); the whole of it is in `resultConfigMap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The ConfigMap (owned by the job) holding the result (at most 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_config_map: Option<String>,
    /// `ClusterReachable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl GPUJobStatus {
    /// Whether the job has ended.
    pub fn finished(&self) -> bool {
        matches!(
            self.phase.as_deref(),
            Some("Succeeded" | "Failed" | "Cancelled")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_crd_has_the_short_name_columns_and_limits() {
        let crd = serde_json::to_value(GPUJob::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "gpujobs.gpu.minik8s.io");
        assert_eq!(crd["spec"]["names"]["shortNames"][0], "gj");
        let v = &crd["spec"]["versions"][0];
        let cols: Vec<&str> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            cols,
            ["Phase", "Slurm-ID", "Partition", "GPUs", "Duration", "Age"]
        );
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["gpus"]["minimum"], 0.0);
        assert_eq!(spec["properties"]["run"]["minLength"], 1);
        assert_eq!(spec["required"], serde_json::json!(["run"]));
    }
}

//! Knative Serving's four kinds, `serving.knative.dev/v1`, with Knative's names, short names,
//! categories, printer columns and the fields of its v1 API: `Service`, `Configuration`,
//! `Revision` and `Route`. Their schemas come from these types; a revision's pod spec is
//! Kubernetes' own (`k8s-openapi`) with Knative's fields beside it, and a container's `name`
//! is optional, as Knative's schema has it.

use k8s_openapi::api::core::v1::{
    Container, HostAlias, LocalObjectReference, PodDNSConfig, PodSecurityContext, Toleration,
    TopologySpreadConstraint, Volume,
};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Knative Serving's API group.
pub const GROUP: &str = "serving.knative.dev";

/// A Knative condition (`knative.dev/pkg/apis.Condition`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type (`Ready`, `ConfigurationsReady`, …).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// `Error` (the default, left out) or `Warning`/`Info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// Why, in one CamelCase word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// An address (`status.address`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Addressable {
    /// Its URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// The metadata of a revision template: what its revisions (and their pods) carry, with
/// Knative's autoscaling annotations checked as its webhook checks them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/min-scale' in self.annotations) || self.annotations['autoscaling.knative.dev/min-scale'].matches('^-?[0-9]+$')").message(kube::core::cel::Message::Expression("'invalid value: ' + self.annotations['autoscaling.knative.dev/min-scale'] + ': autoscaling.knative.dev/min-scale'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/min-scale' in self.annotations) || !self.annotations['autoscaling.knative.dev/min-scale'].matches('^-?[0-9]+$') || int(self.annotations['autoscaling.knative.dev/min-scale']) >= 0").message(kube::core::cel::Message::Expression("'expected 0 <= ' + self.annotations['autoscaling.knative.dev/min-scale'] + ' <= 2147483647: autoscaling.knative.dev/min-scale'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/max-scale' in self.annotations) || self.annotations['autoscaling.knative.dev/max-scale'].matches('^-?[0-9]+$')").message(kube::core::cel::Message::Expression("'invalid value: ' + self.annotations['autoscaling.knative.dev/max-scale'] + ': autoscaling.knative.dev/max-scale'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/max-scale' in self.annotations) || !self.annotations['autoscaling.knative.dev/max-scale'].matches('^-?[0-9]+$') || int(self.annotations['autoscaling.knative.dev/max-scale']) >= 0").message(kube::core::cel::Message::Expression("'expected 0 <= ' + self.annotations['autoscaling.knative.dev/max-scale'] + ' <= 2147483647: autoscaling.knative.dev/max-scale'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/min-scale' in self.annotations) || !('autoscaling.knative.dev/max-scale' in self.annotations) || !self.annotations['autoscaling.knative.dev/min-scale'].matches('^-?[0-9]+$') || !self.annotations['autoscaling.knative.dev/max-scale'].matches('^-?[0-9]+$') || int(self.annotations['autoscaling.knative.dev/max-scale']) == 0 || int(self.annotations['autoscaling.knative.dev/max-scale']) >= int(self.annotations['autoscaling.knative.dev/min-scale'])").message(kube::core::cel::Message::Expression("'max-scale=' + self.annotations['autoscaling.knative.dev/max-scale'] + ' is less than min-scale=' + self.annotations['autoscaling.knative.dev/min-scale'] + ': autoscaling.knative.dev/max-scale, autoscaling.knative.dev/min-scale'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/target' in self.annotations) || self.annotations['autoscaling.knative.dev/target'].matches('^[0-9]*[.]?[0-9]+$')").message(kube::core::cel::Message::Expression("'invalid value: ' + self.annotations['autoscaling.knative.dev/target'] + ': autoscaling.knative.dev/target'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/target' in self.annotations) || !self.annotations['autoscaling.knative.dev/target'].matches('^[0-9]*[.]?[0-9]+$') || double(self.annotations['autoscaling.knative.dev/target']) >= 0.01").message(kube::core::cel::Message::Expression("'target ' + self.annotations['autoscaling.knative.dev/target'] + ' should be at least 0.01: autoscaling.knative.dev/target'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/target-utilization-percentage' in self.annotations) || self.annotations['autoscaling.knative.dev/target-utilization-percentage'].matches('^[0-9]*[.]?[0-9]+$')").message(kube::core::cel::Message::Expression("'invalid value: ' + self.annotations['autoscaling.knative.dev/target-utilization-percentage'] + ': autoscaling.knative.dev/target-utilization-percentage'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/target-utilization-percentage' in self.annotations) || !self.annotations['autoscaling.knative.dev/target-utilization-percentage'].matches('^[0-9]*[.]?[0-9]+$') || (double(self.annotations['autoscaling.knative.dev/target-utilization-percentage']) >= 1.0 && double(self.annotations['autoscaling.knative.dev/target-utilization-percentage']) <= 100.0)").message(kube::core::cel::Message::Expression("'expected 1 <= ' + self.annotations['autoscaling.knative.dev/target-utilization-percentage'] + ' <= 100: autoscaling.knative.dev/target-utilization-percentage'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/window' in self.annotations) || self.annotations['autoscaling.knative.dev/window'].matches('^([0-9]+[hms])+$')").message(kube::core::cel::Message::Expression("'invalid value: ' + self.annotations['autoscaling.knative.dev/window'] + ': autoscaling.knative.dev/window'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/window' in self.annotations) || !self.annotations['autoscaling.knative.dev/window'].matches('^([0-9]+[hms])+$') || (duration(self.annotations['autoscaling.knative.dev/window']) >= duration('6s') && duration(self.annotations['autoscaling.knative.dev/window']) <= duration('1h'))").message(kube::core::cel::Message::Expression("'expected 6s <= ' + self.annotations['autoscaling.knative.dev/window'] + ' <= 1h0m0s: autoscaling.knative.dev/window'".into())).field_path(".annotations"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || !('autoscaling.knative.dev/metric' in self.annotations) || self.annotations['autoscaling.knative.dev/metric'] in ['concurrency', 'rps']").message(kube::core::cel::Message::Expression("'invalid value: ' + self.annotations['autoscaling.knative.dev/metric'] + ': autoscaling.knative.dev/metric'".into())).field_path(".annotations"))]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// The revision's name (`<configuration>-<suffix>`), when the user names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Labels of the revision and its pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations of the revision and its pods (`autoscaling.knative.dev/*` among them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// What a revision runs: a pod spec (Kubernetes' fields that Knative takes) and how requests
/// reach it. As a kind: a Revision, an immutable snapshot of a Configuration's template.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, KubeSchema)]
#[x_kube(validation = Rule::new("size(self.containers) > 0").message("missing field(s): containers").field_path(".containers"))]
#[x_kube(validation = Rule::new("size(self.containers) <= 1 || size(self.containers.filter(c, has(c.ports) && size(c.ports) > 0)) == 1").message("exactly one container must specify a port (the one that serves requests)").field_path(".containers"))]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Revision",
    root = "KRevision",
    validation = Rule::new("self.spec == oldSelf.spec").message("Immutable fields changed (-old +new)").field_path(".spec"),
    namespaced,
    shortname = "rev",
    category = "all",
    category = "knative",
    category = "serving",
    status = "RevisionStatus",
    printcolumn = r#"{"name":"Config Name","type":"string","jsonPath":".metadata.labels['serving\\.knative\\.dev/configuration']"}"#,
    printcolumn = r#"{"name":"Generation","type":"string","jsonPath":".metadata.labels['serving\\.knative\\.dev/configurationGeneration']"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].reason"}"#,
    printcolumn = r#"{"name":"Actual Replicas","type":"integer","jsonPath":".status.actualReplicas"}"#,
    printcolumn = r#"{"name":"Desired Replicas","type":"integer","jsonPath":".status.desiredReplicas"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RevisionSpec {
    /// The containers (one serves requests: the one with a port, or the only one).
    pub containers: Vec<Container>,
    /// Containers run to completion before the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
    /// Volumes the containers mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
    /// The pods' ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Whether the ServiceAccount's token is mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,
    /// Secrets to pull images with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Whether Services' variables are set in the containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_service_links: Option<bool>,
    /// The pods' security context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// Nodes the pods may run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Affinity (kept as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::types::any_object")]
    pub affinity: Option<serde_json::Value>,
    /// How the pods spread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// The RuntimeClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// The PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// The DNS policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<String>,
    /// The DNS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_config: Option<PodDNSConfig>,
    /// Extra `/etc/hosts` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_aliases: Option<Vec<HostAlias>>,
    /// One process namespace for the pod's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_process_namespace: Option<bool>,
    /// The host's network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    /// The host's process ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_pid: Option<bool>,
    /// The host's IPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ipc: Option<bool>,
    /// Requests one pod serves at once, a hard limit (0: as many as come).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub container_concurrency: Option<i64>,
    /// Longest time a request may take (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub timeout_seconds: Option<i64>,
    /// Longest wait for the first byte of an answer (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub response_start_timeout_seconds: Option<i64>,
    /// Longest time a request may go without bytes (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub idle_timeout_seconds: Option<i64>,
}

/// A revision template: the revision each change of it makes.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionTemplate {
    /// The revision's name, labels and annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// What it runs.
    pub spec: RevisionSpec,
}

/// One entry of a traffic split.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficTarget {
    /// A name for this target, reached at its own URL whatever its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// A revision (of the Configuration this Route's Service manages, or any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// A Configuration, whose latest ready revision takes the share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_name: Option<String>,
    /// The latest ready revision of the Configuration (or the Service's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_revision: Option<bool>,
    /// The share of requests, 0–100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i64>,
    /// Where the tag is reached (in `status.traffic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// A Service: a Configuration and a Route of its name, managed together.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.traffic) || size(self.traffic) == 0 || self.traffic.map(t, has(t.percent) ? t.percent : 0).sum() == 100").message(kube::core::cel::Message::Expression("'Traffic targets sum to ' + string(self.traffic.map(t, has(t.percent) ? t.percent : 0).sum()) + ', want 100'".into())).field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(a, !has(a.tag) || self.traffic.exists_one(b, has(b.tag) && b.tag == a.tag))").message(kube::core::cel::Message::Expression("'Multiple definitions for \"' + self.traffic.filter(a, has(a.tag) && !self.traffic.exists_one(b, has(b.tag) && b.tag == a.tag))[0].tag + '\"'".into())).field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(t, !has(t.revisionName) || !has(t.latestRevision) || !t.latestRevision)").message(kube::core::cel::Message::Expression("'may not set revisionName \"' + self.traffic.filter(t, has(t.revisionName) && has(t.latestRevision) && t.latestRevision)[0].revisionName + '\" when latestRevision is true'".into())).field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(t, !has(t.configurationName))").message("must not set the field(s): configurationName (a Service's traffic goes to its own Configuration)").field_path(".traffic"))]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Service",
    validation = Rule::new("!has(self.metadata.name) || !has(self.spec.template.metadata) || !has(self.spec.template.metadata.name) || self.spec.template.metadata.name.startsWith(self.metadata.name + '-')").message(kube::core::cel::Message::Expression("'invalid value: \"' + self.spec.template.metadata.name + '\" must have prefix \"' + self.metadata.name + '-\": spec.template.metadata.name'".into())).field_path(".spec.template.metadata.name"),
    root = "KService",
    plural = "services",
    namespaced,
    shortname = "kservice",
    shortname = "ksvc",
    category = "all",
    category = "knative",
    category = "serving",
    status = "ServiceStatus",
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".status.url"}"#,
    printcolumn = r#"{"name":"LatestCreated","type":"string","jsonPath":".status.latestCreatedRevisionName"}"#,
    printcolumn = r#"{"name":"LatestReady","type":"string","jsonPath":".status.latestReadyRevisionName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].reason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// The revision template of the Service's Configuration.
    pub template: RevisionTemplate,
    /// The Service's Route's split (default: all to the latest ready revision).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
}

/// What a Service reports: its Configuration's and its Route's status together.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `ConfigurationsReady`, `RoutesReady` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The newest revision made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_created_revision_name: Option<String>,
    /// The newest revision that became ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_ready_revision_name: Option<String>,
    /// Where it is reached from outside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Where it is reached from inside the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Addressable>,
    /// The split in effect, every target naming its revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
    /// More about the status (Knative's `status.annotations`): here the gateway's path form
    /// of the URL, `serverless.minik8s.io/gateway-url`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A Configuration: the revision template whose every change makes a revision.
#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Configuration",
    validation = Rule::new("!has(self.metadata.name) || !has(self.spec.template.metadata) || !has(self.spec.template.metadata.name) || self.spec.template.metadata.name.startsWith(self.metadata.name + '-')").message(kube::core::cel::Message::Expression("'invalid value: \"' + self.spec.template.metadata.name + '\" must have prefix \"' + self.metadata.name + '-\": spec.template.metadata.name'".into())).field_path(".spec.template.metadata.name"),
    root = "KConfiguration",
    namespaced,
    shortname = "config",
    shortname = "cfg",
    shortname = "kcfg",
    category = "all",
    category = "knative",
    category = "serving",
    status = "ConfigurationStatus",
    printcolumn = r#"{"name":"LatestCreated","type":"string","jsonPath":".status.latestCreatedRevisionName"}"#,
    printcolumn = r#"{"name":"LatestReady","type":"string","jsonPath":".status.latestReadyRevisionName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].reason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationSpec {
    /// The template of its revisions.
    pub template: RevisionTemplate,
}

/// What a Configuration reports.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The newest revision made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_created_revision_name: Option<String>,
    /// The newest revision that became ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_ready_revision_name: Option<String>,
}

/// The name and image digest of a revision's container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// The container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its image's digest, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
}

/// What a Revision reports.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `ResourcesAvailable`, `ContainerHealthy`, `Active` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The containers and their images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_statuses: Vec<ContainerStatus>,
    /// Pods ready now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_replicas: Option<i32>,
    /// Pods asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
}

/// A Route: a split of requests over revisions, reached at its URL (and its tags' URLs).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.traffic) || size(self.traffic) == 0 || self.traffic.map(t, has(t.percent) ? t.percent : 0).sum() == 100").message(kube::core::cel::Message::Expression("'Traffic targets sum to ' + string(self.traffic.map(t, has(t.percent) ? t.percent : 0).sum()) + ', want 100'".into())).field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(a, !has(a.tag) || self.traffic.exists_one(b, has(b.tag) && b.tag == a.tag))").message(kube::core::cel::Message::Expression("'Multiple definitions for \"' + self.traffic.filter(a, has(a.tag) && !self.traffic.exists_one(b, has(b.tag) && b.tag == a.tag))[0].tag + '\"'".into())).field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(t, !has(t.revisionName) || !has(t.latestRevision) || !t.latestRevision)").message(kube::core::cel::Message::Expression("'may not set revisionName \"' + self.traffic.filter(t, has(t.revisionName) && has(t.latestRevision) && t.latestRevision)[0].revisionName + '\" when latestRevision is true'".into())).field_path(".traffic"))]
#[x_kube(validation = Rule::new("!has(self.traffic) || self.traffic.all(t, has(t.revisionName) != has(t.configurationName))").message("expected exactly one of revisionName and configurationName").field_path(".traffic"))]
#[kube(
    group = "serving.knative.dev",
    version = "v1",
    kind = "Route",
    root = "KRoute",
    namespaced,
    shortname = "rt",
    shortname = "route",
    category = "all",
    category = "knative",
    category = "serving",
    status = "RouteStatus",
    printcolumn = r#"{"name":"URL","type":"string","jsonPath":".status.url"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].reason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// The split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
}

/// What a Route reports.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `AllTrafficAssigned`, `IngressReady`, `CertificateProvisioned` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Where it is reached from outside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Where it is reached from inside the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Addressable>,
    /// The split in effect, every target naming its revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficTarget>,
    /// More about the status (Knative's `status.annotations`): here the gateway's path form
    /// of the URL, `serverless.minik8s.io/gateway-url`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Drops `name` from the required fields of every `containers`/`initContainers` item schema
/// under `v` (Knative defaults a container's name; Kubernetes' schema requires it).
pub fn unrequire_container_names(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            for key in ["containers", "initContainers"] {
                if let Some(required) = o
                    .get_mut(key)
                    .and_then(|c| c.get_mut("items"))
                    .and_then(|i| i.get_mut("required"))
                    .and_then(|r| r.as_array_mut())
                {
                    required.retain(|r| r != "name");
                }
            }
            for (_, child) in o.iter_mut() {
                unrequire_container_names(child);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(unrequire_container_names),
        _ => {}
    }
}

//! The seed's `DNS` kind (`networking.minik8s.io/v1alpha1`, plural `dnses`): a host name and
//! paths, each routed to a port of a Service by the node's router (the path prefix stripped, as
//! the seed's nginx did). The CRD is generated from these types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// A host and its paths.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[kube(
    group = "networking.minik8s.io",
    version = "v1alpha1",
    kind = "DNS",
    plural = "dnses",
    singular = "dns",
    namespaced,
    status = "DnsStatus",
    printcolumn = r#"{"name":"Host","type":"string","jsonPath":".spec.host"}"#,
    printcolumn = r#"{"name":"Paths","type":"string","jsonPath":".spec.subpaths[*].path"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct DnsSpec {
    /// The host name (`minik8s.io`); it resolves to the node from pods and from the node.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub host: String,
    /// The paths; each path appears once.
    #[schemars(length(min = 1), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["path"]))]
    pub subpaths: Vec<Subpath>,
}

/// One path of a host.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct Subpath {
    /// The path prefix (`/test1`), stripped before the request goes on.
    #[schemars(regex(pattern = r"^/"))]
    pub path: String,
    /// A Service in the DNS object's namespace.
    #[schemars(length(min = 1))]
    pub service: String,
    /// A port of that Service.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// Where each path goes, and whether all of them can.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
pub struct DnsStatus {
    /// One entry per path.
    #[serde(default)]
    pub backends: Vec<Backend>,
    /// `Ready`: every path has its Service and port.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A path's backend as resolved.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// The path.
    pub path: String,
    /// The Service.
    pub service: String,
    /// The Service's port.
    pub port: i32,
    /// The Service's ClusterIP (empty while it is missing).
    #[serde(rename = "clusterIP")]
    pub cluster_ip: String,
}

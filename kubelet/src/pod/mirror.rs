//! Mirror pods: the API objects that show static pods (upstream's `pkg/kubelet/pod`
//! mirror client), known by their annotation.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// The annotation marking a mirror pod; its value is the static pod's hash (and uid).
pub const MIRROR: &str = "kubernetes.io/config.mirror";
/// The annotation naming where a pod came from (`file` or `api`).
pub const SOURCE: &str = "kubernetes.io/config.source";
/// Whether `pod` is a mirror pod (its containers belong to a static pod).
pub fn is_mirror(pod: &Pod) -> bool {
    pod.annotations().contains_key(MIRROR)
}

/// The uid the runtime knows a pod by: a mirror pod's static pod's, else its own.
pub fn runtime_uid(pod: &Pod) -> String {
    pod.annotations()
        .get(MIRROR)
        .cloned()
        .or_else(|| pod.uid())
        .unwrap_or_default()
}

//! minik8s gpu: the `GPUJob` custom resource and its controller, which builds and runs each
//! job as a Slurm batch job on a cluster reached over SSH (see [`controller`]). An API client
//! only: the apiserver learns the kind from its CRD at run time.

pub mod controller;
pub mod slurm;
pub mod ssh;
pub mod types;

pub use types::{GPUJob, GPUJobSpec, GPUJobStatus};

/// The user the GPUJob controller runs as (bound to [`rbac`]'s roles by [`install`]).
pub const USER: &str = "system:minik8s-gpujobs";

/// Installs (or updates) the CRD, the `gpu-system` namespace and the controller's roles by
/// server-side apply, as the cluster's bootstrap does.
pub async fn install(client: kube::Client) -> Result<(), kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::discovery::ApiResource;
    let pp = PatchParams::apply("minik8s").force();
    let crd = GPUJob::crd();
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &crd.metadata.name.clone().unwrap_or_default(),
            &pp,
            &Patch::Apply(&crd),
        )
        .await?;
    for obj in rbac() {
        let kind = obj["kind"].as_str().unwrap_or_default();
        let (group, version, plural) = match kind {
            "Namespace" => ("", "v1", "namespaces"),
            "ClusterRole" => ("rbac.authorization.k8s.io", "v1", "clusterroles"),
            "ClusterRoleBinding" => ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"),
            "Role" => ("rbac.authorization.k8s.io", "v1", "roles"),
            _ => ("rbac.authorization.k8s.io", "v1", "rolebindings"),
        };
        let ar = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: if group.is_empty() {
                version.into()
            } else {
                format!("{group}/{version}")
            },
            kind: kind.into(),
            plural: plural.into(),
        };
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        api.patch(&name, &pp, &Patch::Apply(&obj)).await?;
    }
    Ok(())
}

/// The `gpu-system` namespace, the controller's roles (GPUJobs and their result ConfigMaps
/// everywhere; the clusters' Secrets and its leader-election Lease in `gpu-system` only), their bindings to [`USER`], and
/// the parts of `view`/`edit`/`admin` that let users work with GPUJobs.
pub fn rbac() -> Vec<serde_json::Value> {
    use serde_json::json;
    let rbac = "rbac.authorization.k8s.io/v1";
    let user = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]);
    let read = ["get", "list", "watch"];
    let write = ["create", "delete", "deletecollection", "patch", "update"];
    let all: Vec<&str> = read.iter().chain(write.iter()).copied().collect();
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": controller::SECRET_NAMESPACE}}),
        json!({"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "minik8s:gpujob-controller"},
        "rules": [
            {"apiGroups": [types::GROUP], "resources": ["gpujobs"], "verbs": ["get", "list", "watch", "patch", "update"]},
            {"apiGroups": [types::GROUP], "resources": ["gpujobs/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ]}),
        json!({"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "minik8s:gpujob-controller"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "minik8s:gpujob-controller"},
            "subjects": user}),
        json!({"apiVersion": rbac, "kind": "Role",
            "metadata": {"name": "minik8s:gpujob-controller", "namespace": controller::SECRET_NAMESPACE},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": read},
                // Its leader election (controller::LEASE).
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": ["get", "create", "update"]}]}),
        json!({"apiVersion": rbac, "kind": "RoleBinding",
            "metadata": {"name": "minik8s:gpujob-controller", "namespace": controller::SECRET_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "minik8s:gpujob-controller"},
            "subjects": user}),
        json!({"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "minik8s:gpujobs-view",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
            "rules": [{"apiGroups": [types::GROUP], "resources": ["gpujobs", "gpujobs/status"], "verbs": read}]}),
        json!({"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "minik8s:gpujobs-edit",
                "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true",
                           "rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
            "rules": [{"apiGroups": [types::GROUP], "resources": ["gpujobs"], "verbs": all}]}),
    ]
}

//! minik8s serverless: the `Function` custom resource, its controller, and the gateway
//! (activator and autoscaler); `Workflow`/`WorkflowRun` and their durable executor. An API
//! client only: the apiserver learns these kinds from their CRDs at run time.

pub mod autoscaler;
pub mod cli;
pub mod controller;
pub mod gateway;
pub mod knative;
pub mod modules;
pub mod reconcile;
pub mod revision;
pub mod runtime;
pub mod types;
pub mod workflow;

pub use types::{Function, FunctionRevision, FunctionSpec, FunctionStatus};

/// The user the gateway and the controllers run as (bound to [`rbac`]'s role by `install`).
pub const USER: &str = "system:minik8s-functions";

/// Installs (or updates) the CRDs and the RBAC roles by server-side apply, as the cluster's
/// bootstrap does.
pub async fn install(client: kube::Client) -> Result<(), kube::Error> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let pp = PatchParams::apply("minik8s").force();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(&crd)).await?;
    }
    let (roles, binding) = rbac();
    let api: Api<ClusterRole> = Api::all(client.clone());
    for role in roles {
        let name = role["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.patch(&name, &pp, &Patch::Apply(&role)).await?;
    }
    let name = binding["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let bindings: Api<ClusterRoleBinding> = Api::all(client);
    bindings.patch(&name, &pp, &Patch::Apply(&binding)).await?;
    let modules = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "minik8s:function-modules"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "minik8s:function-modules"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": modules::USER}]});
    bindings
        .patch("minik8s:function-modules", &pp, &Patch::Apply(&modules))
        .await?;
    Ok(())
}

/// The ClusterRoles (the components' own, and the parts of `view`/`edit`/`admin` that let
/// users work with the serverless kinds) and the binding of the components' role to [`USER`].
pub fn rbac() -> (Vec<serde_json::Value>, serde_json::Value) {
    use serde_json::json;
    let manage = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let read = ["get", "list", "watch"];
    let kinds = ["functions", "workflows", "workflowruns"];
    let statuses = [
        "functions/status",
        "functionrevisions/status",
        "workflows/status",
        "workflowruns/status",
    ];
    let knative_kinds = ["services", "configurations", "revisions", "routes"];
    let knative_statuses = [
        "services/status",
        "configurations/status",
        "revisions/status",
        "routes/status",
    ];
    let role = |name: &str, labels: serde_json::Value, rules: serde_json::Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels}, "rules": rules})
    };
    let components = role(
        "minik8s:functions",
        json!({}),
        json!([
            {"apiGroups": [types::GROUP], "resources": kinds, "verbs": manage},
            {"apiGroups": [types::GROUP], "resources": ["functionrevisions"], "verbs": manage},
            {"apiGroups": [types::GROUP], "resources": statuses, "verbs": ["get", "patch", "update"]},
            {"apiGroups": [""], "resources": ["configmaps", "services", "pods"], "verbs": manage},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create", "patch"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": manage},
            {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": manage},
            // Knative Serving's kinds (Services make Configurations and Routes, which make
            // Functions, Revisions, Services and Ingresses) and its domain setting.
            {"apiGroups": [knative::types::GROUP], "resources": knative_kinds, "verbs": manage},
            {"apiGroups": [knative::types::GROUP], "resources": knative_statuses, "verbs": ["get", "patch", "update"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": manage},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
            // The controllers' leader election (CONTROLLERS_LEASE in minik8s-system).
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": [CONTROLLERS_LEASE], "verbs": ["get", "update"]},
        ]),
    );
    let edit = role(
        "minik8s:functions:edit",
        json!({"rbac.authorization.k8s.io/aggregate-to-edit": "true",
            "rbac.authorization.k8s.io/aggregate-to-admin": "true"}),
        // Revisions are made by the Function controller: users read and delete them only.
        json!([{"apiGroups": [types::GROUP], "resources": kinds, "verbs": manage},
            {"apiGroups": [types::GROUP], "resources": ["functionrevisions"],
             "verbs": ["get", "list", "watch", "delete", "deletecollection"]},
            {"apiGroups": [knative::types::GROUP], "resources": knative_kinds, "verbs": manage}]),
    );
    let view = role(
        "minik8s:functions:view",
        json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"}),
        json!([{"apiGroups": [types::GROUP], "resources": kinds.iter().chain(&["functionrevisions"]).chain(&statuses).collect::<Vec<_>>(), "verbs": read},
            {"apiGroups": [knative::types::GROUP], "resources": knative_kinds.iter().chain(&knative_statuses).collect::<Vec<_>>(), "verbs": read}]),
    );
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "minik8s:functions"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "minik8s:functions"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]});
    // The module controller (virtual nodes for the bases) is its own user: it registers
    // Nodes and holds their Leases, which the gateway and the Function controller may not.
    let modules = role(
        "minik8s:function-modules",
        json!({}),
        json!([
            {"apiGroups": [""], "resources": ["nodes"], "verbs": manage},
            {"apiGroups": [""], "resources": ["nodes/status", "pods/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": manage},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        ]),
    );
    (vec![components, edit, view, modules], binding)
}

/// Where functions are served.
#[derive(Clone, Debug)]
pub struct Config {
    /// The gateway's listening address (a host port; `0.0.0.0:8181` in `minik8s up`).
    pub listen: std::net::SocketAddr,
    /// The node address users and pods reach the gateway at (for `status.url` and the
    /// `minik8s-system/gateway` Service's endpoint).
    pub public_host: String,
    /// How many function bases to start with the first `placement: module` function.
    pub bases: i32,
}

/// The namespace of the gateway's Service.
pub const SYSTEM_NAMESPACE: &str = "minik8s-system";

/// The Lease (in [`SYSTEM_NAMESPACE`]) whose holder runs the Function and Workflow
/// controllers.
pub const CONTROLLERS_LEASE: &str = "function-controllers";

/// Runs the gateway, the Function controller and the Workflow controllers until `shutdown`.
/// The gateway serves on every machine that runs it; the controllers (revisions, scaling,
/// the workflow executor) run only while this process holds the [`CONTROLLERS_LEASE`], so
/// with a gateway on every control-plane machine one of them executes each workflow step,
/// and a standby takes over within 15 s of the leader's death.
pub async fn serve(
    client: kube::Client,
    cfg: Config,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), gateway::Error> {
    let mut registry = prometheus_client::registry::Registry::default();
    let workflow_metrics = workflow::controller::Metrics::new(&mut registry);
    let running = gateway::start(
        client.clone(),
        gateway::Config { listen: cfg.listen },
        registry,
        shutdown.clone(),
    )
    .await?;
    let port = running.addr.port();
    if let Err(e) = gateway_service(&client, &cfg.public_host, port).await {
        tracing::warn!(error = %e, "the minik8s-system/gateway Service");
    }
    let controller_cfg = controller::Config {
        gateway_url: format!("http://{}:{port}", cfg.public_host),
        bases: cfg.bases,
    };
    let mut lease = minik8s_controllers::leader::Config::new(
        CONTROLLERS_LEASE,
        minik8s_controllers::leader::identity(),
    );
    lease.namespace = SYSTEM_NAMESPACE.into();
    let gateway = running.gateway.clone();
    let controllers =
        minik8s_controllers::leader::run(client.clone(), lease, shutdown, move |leading| {
            let workflows = workflow::controller::run(
                client.clone(),
                gateway.clone(),
                workflow_metrics.clone(),
                leading.clone(),
            );
            let functions = controller::run(client.clone(), controller_cfg.clone(), leading);
            async move {
                tokio::join!(functions, workflows);
            }
        });
    let _ = tokio::join!(controllers, running.done);
    Ok(())
}

/// The Service `gateway` in `minik8s-system` (port 80) that pods reach the gateway through:
/// no selector, one EndpointSlice naming the node's address and the gateway's port.
async fn gateway_service(client: &kube::Client, host: &str, port: u16) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, Patch, PatchParams};
    let pp = PatchParams::apply("minik8s-gateway").force();
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}});
    Api::<Namespace>::all(client.clone())
        .patch(SYSTEM_NAMESPACE, &pp, &Patch::Apply(&ns))
        .await?;
    let svc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "gateway", "namespace": SYSTEM_NAMESPACE},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": port, "protocol": "TCP"}]},
    });
    Api::<Service>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .patch("gateway", &pp, &Patch::Apply(&svc))
        .await?;
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "gateway", "namespace": SYSTEM_NAMESPACE,
            "labels": {"kubernetes.io/service-name": "gateway",
                "endpointslice.kubernetes.io/managed-by": "minik8s-gateway"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
    });
    Api::<EndpointSlice>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .patch("gateway", &pp, &Patch::Apply(&slice))
        .await?;
    Ok(())
}

/// The CRDs this crate serves, as `minik8s up` installs them.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        Function::crd(),
        types::FunctionRevision::crd(),
        workflow::Workflow::crd(),
        workflow::WorkflowRun::crd(),
    ]
    .into_iter()
    .chain(knative::crds())
    .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_checked_in_crds_are_current() {
        let mut text = String::new();
        for crd in super::crds() {
            text.push_str(&format!("---\n{}", serde_yaml::to_string(&crd).unwrap()));
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds.yaml");
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            text,
            "serverless-crd/crds.yaml is stale: cargo run -p minik8s-serverless --bin crdgen > serverless-crd/crds.yaml"
        );
    }
}

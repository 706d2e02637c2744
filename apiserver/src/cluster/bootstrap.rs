//! Objects every cluster has from the start: the `default`, `kube-system`, `kube-public` and
//! `kube-node-lease` namespaces, the `kubernetes` Service with its Endpoints, and the
//! default `local-path` StorageClass.

use crate::Api;
use crate::error::ApiResult;
use crate::object::{ensure, ensure_fields};
use k8s_openapi::Resource;
use k8s_openapi::api::rbac::v1::ClusterRole;
use serde_json::{Value, json};

/// The default StorageClass's name.
pub const LOCAL_PATH_CLASS: &str = "local-path";

/// The provisioner of node-local folder volumes (each kubelet runs it for its node).
pub const LOCAL_PATH_PROVISIONER: &str = minik8s_types::storage::LOCAL_PATH_PROVISIONER;

/// Creates `obj` at `key`, or brings a stored copy's `data` up to date (the CAs it carries
/// may have been replaced since it was written).
async fn ensure_data(api: &Api, key: &str, obj: Value) -> ApiResult<()> {
    ensure_fields(api, key, obj, &["data"]).await
}

/// Creates the built-in namespaces, default RBAC roles and the `kubernetes` Service if they
/// are missing.
pub async fn run(api: &Api) -> ApiResult<()> {
    for obj in crate::auth::rbac::defaults() {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let plural = match obj.get("kind").and_then(Value::as_str) {
            Some(ClusterRole::KIND) => "clusterroles",
            _ => "clusterrolebindings",
        };
        ensure(
            api,
            &format!("/registry/rbac.authorization.k8s.io/{plural}/{name}"),
            obj,
        )
        .await?;
    }
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = json!({
            "kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        ensure(api, &format!("/registry/core/namespaces/{ns}"), obj).await?;
        namespace_defaults(api, ns).await?;
    }
    // The aggregation layer: a local APIService per built-in group/version, the ConfigMap
    // extension apiservers authenticate with, and the Role that lets them read it.
    for (group, versions) in api.registry.groups() {
        for version in versions {
            let obj = crate::aggregation::local(&group, &version);
            ensure(
                api,
                &format!("{}{version}.{group}", crate::aggregation::PREFIX),
                obj,
            )
            .await?;
        }
    }
    if let Some(ca) = &api.root_ca {
        let cm = crate::aggregation::authentication_configmap(ca, api.front_proxy_ca.as_deref());
        let key = format!(
            "/registry/core/configmaps/kube-system/{}",
            crate::aggregation::AUTHENTICATION_CONFIGMAP
        );
        ensure_data(api, &key, cm).await?;
    }
    let reader = json!({
        "kind": "Role", "apiVersion": "rbac.authorization.k8s.io/v1",
        "metadata": {"name": "extension-apiserver-authentication-reader", "namespace": "kube-system",
            "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"],
            "resourceNames": [crate::aggregation::AUTHENTICATION_CONFIGMAP]}],
    });
    ensure(
        api,
        "/registry/rbac.authorization.k8s.io/roles/kube-system/extension-apiserver-authentication-reader",
        reader,
    )
    .await?;
    let ip = api.alloc.first_ip().to_string();
    let (_, port) = crate::cluster::endpoints::split_address(&api.advertise);
    let svc = json!({
        "kind": "Service", "apiVersion": "v1",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None", "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]},
        "status": {"loadBalancer": {}},
    });
    ensure(api, "/registry/core/services/default/kubernetes", svc).await?;
    // Its Endpoints and EndpointSlice: this apiserver's address and those of the others
    // whose leases are live (kept so by `endpoint_reconciler::run`).
    crate::cluster::endpoints::pass(api, true).await?;
    // The built-in PriorityClasses (upstream's scheduling storage post-start hook).
    for class in crate::admission::priority::system_classes() {
        let name = class["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        ensure(
            api,
            &format!("/registry/scheduling.k8s.io/priorityclasses/{name}"),
            class,
        )
        .await?;
    }
    // The default ServiceCIDR, Ready (upstream's default-servicecidr controller), and the
    // mandatory API priority and fairness objects upstream's apiserver keeps.
    let cidr = json!({
        "kind": "ServiceCIDR", "apiVersion": "networking.k8s.io/v1",
        "metadata": {"name": "kubernetes", "generation": 1},
        "spec": {"cidrs": [api.alloc.cidr()]},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "",
            "message": "Kubernetes default Service CIDR is ready",
            "lastTransitionTime": crate::object::now()}]},
    });
    ensure(
        api,
        "/registry/networking.k8s.io/servicecidrs/kubernetes",
        cidr,
    )
    .await?;
    for (plural, obj) in crate::registry::kinds::flowcontrol::mandatory() {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        ensure(
            api,
            &format!("/registry/flowcontrol.apiserver.k8s.io/{plural}/{name}"),
            obj,
        )
        .await?;
    }
    // The default StorageClass, as k3s bundles one: each node's kubelet provisions its
    // volumes as folders (see the kubelet's `provisioner`).
    let class = json!({
        "kind": "StorageClass", "apiVersion": "storage.k8s.io/v1",
        "metadata": {"name": LOCAL_PATH_CLASS, "annotations": {
            crate::admission::storageclass::DEFAULT_CLASS: "true"}},
        "provisioner": LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    });
    ensure(
        api,
        &format!("/registry/storage.k8s.io/storageclasses/{LOCAL_PATH_CLASS}"),
        class,
    )
    .await?;
    Ok(())
}

/// What every namespace gets: its `default` ServiceAccount and, when the cluster CA is
/// known, the `kube-root-ca.crt` ConfigMap pods' token volumes project.
pub async fn namespace_defaults(api: &Api, ns: &str) -> ApiResult<()> {
    let sa = json!({"kind": "ServiceAccount", "apiVersion": "v1", "metadata": {"name": "default", "namespace": ns}});
    ensure(
        api,
        &format!("/registry/core/serviceaccounts/{ns}/default"),
        sa,
    )
    .await?;
    if let Some(ca) = &api.root_ca {
        let name = crate::admission::serviceaccount::ROOT_CA_CONFIGMAP;
        let cm = json!({
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": ns, "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
            "data": {"ca.crt": ca},
        });
        ensure(api, &format!("/registry/core/configmaps/{ns}/{name}"), cm).await?;
    }
    Ok(())
}

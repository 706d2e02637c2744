//! RBAC authorization: Roles, ClusterRoles (with aggregation), RoleBindings and
//! ClusterRoleBindings, evaluated from an in-memory copy that a task keeps in step with the
//! store; `system:masters` may do everything. Also the upstream default roles and bindings.

use crate::Api;
use crate::auth::User;
use crate::error::{ApiError, ApiResult, qualified};
use crate::serving::request::ResourceRequest;
use k8s_openapi::Resource;
use k8s_openapi::api::{core::v1::ServiceAccount, rbac::v1 as rbac};
use minik8s_storage::{RangeRequest, Store};
use minik8s_types::LabelSelector;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

const PREFIX: &str = "/registry/rbac.authorization.k8s.io/";

/// What is being asked: a resource request or a non-resource path, with its verb.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `create`, …
    pub verb: String,
    /// API group of the resource.
    pub group: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource, if any.
    pub subresource: String,
    /// Namespace, if any.
    pub namespace: String,
    /// Object name, if any.
    pub name: String,
    /// For non-resource requests: the path.
    pub path: Option<String>,
}

impl Attributes {
    /// The attributes of a resource request.
    pub fn of(req: &ResourceRequest) -> Self {
        Attributes {
            verb: req.verb.as_str().into(),
            group: req.group.clone(),
            resource: req.resource.clone(),
            subresource: req.subresource.clone().unwrap_or_default(),
            namespace: req.namespace.clone().unwrap_or_default(),
            name: req
                .name
                .clone()
                .or_else(|| req.selected_name.clone())
                .unwrap_or_default(),
            path: None,
        }
    }

    /// The attributes of a non-resource request (`/metrics`, discovery documents).
    pub fn non_resource(verb: &str, path: &str) -> Self {
        Attributes {
            verb: verb.into(),
            path: Some(path.into()),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Rule {
    verbs: Vec<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
    urls: Vec<String>,
}

impl Rule {
    fn from(v: &Value) -> Self {
        Rule {
            verbs: crate::object::strings_at(v, "/verbs"),
            groups: crate::object::strings_at(v, "/apiGroups"),
            resources: crate::object::strings_at(v, "/resources"),
            names: crate::object::strings_at(v, "/resourceNames"),
            urls: crate::object::strings_at(v, "/nonResourceURLs"),
        }
    }

    fn allows(&self, a: &Attributes) -> bool {
        let any = |list: &[String], x: &str| list.iter().any(|i| i == "*" || i == x);
        if !any(&self.verbs, &a.verb) {
            return false;
        }
        if let Some(path) = &a.path {
            return self.urls.iter().any(|u| {
                u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
            });
        }
        let resource = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        any(&self.groups, &a.group)
            && (self.resources.iter().any(|r| {
                r == "*"
                    || *r == resource
                    || (a.subresource.is_empty() && r == &a.resource)
                    || r.strip_prefix("*/").is_some_and(|s| s == a.subresource)
            }))
            && (self.names.is_empty() || self.names.contains(&a.name))
    }
}

#[derive(Clone, Debug)]
struct Binding {
    namespace: Option<String>,
    role_kind: String,
    role_name: String,
    subjects: Vec<(String, String, String)>,
}

/// The RBAC objects, as rules per role.
#[derive(Default)]
struct Snapshot {
    roles: HashMap<(String, String), Vec<Rule>>,
    cluster_roles: HashMap<String, Vec<Rule>>,
    bindings: Vec<Binding>,
}

/// The authorizer's in-memory copy of the RBAC objects.
#[derive(Clone, Default)]
pub struct Rbac {
    snapshot: Arc<RwLock<Snapshot>>,
}

fn subject_matches(user: &User, (kind, name, ns): &(String, String, String)) -> bool {
    match kind.as_str() {
        "User" => *name == user.name,
        "Group" => user.groups.contains(name),
        ServiceAccount::KIND => user.name == format!("system:serviceaccount:{ns}:{name}"),
        _ => false,
    }
}

impl Rbac {
    /// Rebuilds the copy from the stored objects.
    fn load(&self, kvs: &[minik8s_storage::KeyValue]) {
        let mut snap = Snapshot::default();
        let mut aggregated: Vec<(String, Vec<LabelSelector>)> = Vec::new();
        let mut labels: HashMap<String, Value> = HashMap::new();
        for kv in kvs {
            let Ok(o) = serde_json::from_slice::<Value>(&kv.value) else {
                continue;
            };
            let name = o
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let ns = o
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let rules = || {
                o.get("rules")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().map(Rule::from).collect())
                    .unwrap_or_default()
            };
            match o.get("kind").and_then(Value::as_str) {
                Some(rbac::Role::KIND) => {
                    snap.roles.insert((ns, name), rules());
                }
                Some(rbac::ClusterRole::KIND) => {
                    if let Some(sels) = o
                        .pointer("/aggregationRule/clusterRoleSelectors")
                        .and_then(Value::as_array)
                    {
                        aggregated.push((
                            name.clone(),
                            sels.iter()
                                .filter_map(|s| LabelSelector::from_json(s).ok())
                                .collect(),
                        ));
                    }
                    labels.insert(
                        name.clone(),
                        o.pointer("/metadata/labels")
                            .cloned()
                            .unwrap_or(Value::Null),
                    );
                    snap.cluster_roles.insert(name, rules());
                }
                Some(kind @ (rbac::RoleBinding::KIND | rbac::ClusterRoleBinding::KIND)) => {
                    let subjects = o
                        .get("subjects")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .map(|s| {
                                    let f = |k: &str| {
                                        s.get(k).and_then(Value::as_str).unwrap_or("").to_owned()
                                    };
                                    (f("kind"), f("name"), f("namespace"))
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    snap.bindings.push(Binding {
                        namespace: (kind == rbac::RoleBinding::KIND).then_some(ns),
                        role_kind: o
                            .pointer("/roleRef/kind")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        role_name: o
                            .pointer("/roleRef/name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        subjects,
                    });
                }
                _ => {}
            }
        }
        // Aggregated ClusterRoles get the rules of every ClusterRole their selectors match.
        for (name, selectors) in aggregated {
            let mut rules = Vec::new();
            for (other, l) in &labels {
                if *other != name && selectors.iter().any(|s| s.matches_json(Some(l))) {
                    rules.extend(snap.cluster_roles.get(other).cloned().unwrap_or_default());
                }
            }
            snap.cluster_roles.entry(name).or_default().extend(rules);
        }
        *self.snapshot.write().expect("rbac lock") = snap;
    }

    /// Whether `user` may do what `a` describes.
    pub fn allows(&self, user: &User, a: &Attributes) -> bool {
        if user.groups.iter().any(|g| g == "system:masters") {
            return true;
        }
        let snap = self.snapshot.read().expect("rbac lock");
        snap.bindings.iter().any(|b| {
            if let Some(ns) = &b.namespace
                && (a.path.is_some() || *ns != a.namespace)
            {
                return false;
            }
            if !b.subjects.iter().any(|s| subject_matches(user, s)) {
                return false;
            }
            let rules = match (b.role_kind.as_str(), &b.namespace) {
                (rbac::ClusterRole::KIND, _) => snap.cluster_roles.get(&b.role_name),
                (rbac::Role::KIND, Some(ns)) => snap.roles.get(&(ns.clone(), b.role_name.clone())),
                _ => None,
            };
            rules.is_some_and(|rules| rules.iter().any(|r| r.allows(a)))
        })
    }

    /// Allows or answers upstream's 403.
    pub fn authorize(&self, user: &User, a: &Attributes) -> ApiResult<()> {
        if self.allows(user, a) {
            return Ok(());
        }
        let message = match &a.path {
            Some(path) => format!(
                "forbidden: User \"{}\" cannot {} path \"{path}\"",
                user.name, a.verb
            ),
            None => {
                let resource = if a.subresource.is_empty() {
                    a.resource.clone()
                } else {
                    format!("{}/{}", a.resource, a.subresource)
                };
                let what = if a.name.is_empty() {
                    qualified(&a.group, &resource)
                } else {
                    format!("{} \"{}\"", qualified(&a.group, &resource), a.name)
                };
                let scope = if a.namespace.is_empty() {
                    "at the cluster scope".to_owned()
                } else {
                    format!("in the namespace \"{}\"", a.namespace)
                };
                format!(
                    "{what} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
                    user.name, a.verb, a.group
                )
            }
        };
        let mut e = ApiError::forbidden(message);
        e.details = Some(json!({"name": a.name, "group": a.group, "kind": a.resource}));
        Err(e)
    }
}

/// Keeps the authorizer's copy in step with the stored RBAC objects until shutdown.
pub async fn sync(api: Arc<Api>) {
    crate::store::follow::follow(api, PREFIX, |api, kvs| api.rbac.load(kvs)).await;
}

/// Loads the store's RBAC objects once (at start, before serving).
pub async fn load(api: &Api) -> ApiResult<()> {
    let listed = api.store.range(RangeRequest::prefix(PREFIX)).await?;
    api.rbac.load(&listed.kvs);
    Ok(())
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

/// The upstream default ClusterRoles and ClusterRoleBindings (created if missing).
pub fn defaults() -> Vec<Value> {
    let read = ["get", "list", "watch"];
    let write = ["create", "delete", "deletecollection", "patch", "update"];
    let all_write: Vec<&str> = read.iter().chain(write.iter()).copied().collect();
    let view_rules = vec![
        rule(
            &[""],
            &[
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "pods",
                "pods/log",
                "pods/status",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "replicationcontrollers/status",
                "serviceaccounts",
                "services",
                "services/status",
                "bindings",
                "events",
                "limitranges",
                "resourcequotas",
                "resourcequotas/status",
                "namespaces",
                "namespaces/status",
            ],
            &read,
        ),
        rule(
            &["apps"],
            &[
                "controllerrevisions",
                "daemonsets",
                "daemonsets/status",
                "deployments",
                "deployments/scale",
                "deployments/status",
                "replicasets",
                "replicasets/scale",
                "replicasets/status",
                "statefulsets",
                "statefulsets/scale",
                "statefulsets/status",
            ],
            &read,
        ),
        rule(
            &["autoscaling"],
            &[
                "horizontalpodautoscalers",
                "horizontalpodautoscalers/status",
            ],
            &read,
        ),
        rule(
            &["batch"],
            &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
            &read,
        ),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "ingresses/status", "networkpolicies"],
            &read,
        ),
        rule(
            &["policy"],
            &["poddisruptionbudgets", "poddisruptionbudgets/status"],
            &read,
        ),
        rule(&["discovery.k8s.io"], &["endpointslices"], &read),
        rule(&["events.k8s.io"], &["events"], &read),
    ];
    let edit_rules = vec![
        rule(
            &[""],
            &[
                "pods",
                "pods/attach",
                "pods/exec",
                "pods/portforward",
                "pods/proxy",
                "pods/eviction",
                "configmaps",
                "endpoints",
                "persistentvolumeclaims",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "secrets",
                "serviceaccounts",
                "services",
                "services/proxy",
            ],
            &all_write,
        ),
        rule(&[""], &["serviceaccounts/token"], &["create"]),
        rule(
            &["apps"],
            &[
                "daemonsets",
                "deployments",
                "deployments/rollback",
                "deployments/scale",
                "replicasets",
                "replicasets/scale",
                "statefulsets",
                "statefulsets/scale",
            ],
            &all_write,
        ),
        rule(&["autoscaling"], &["horizontalpodautoscalers"], &all_write),
        rule(&["batch"], &["cronjobs", "jobs"], &all_write),
        rule(
            &["networking.k8s.io"],
            &["ingresses", "networkpolicies"],
            &all_write,
        ),
        rule(&["policy"], &["poddisruptionbudgets"], &all_write),
        rule(&["discovery.k8s.io"], &["endpointslices"], &all_write),
    ];
    let admin_rules = vec![
        rule(
            &["rbac.authorization.k8s.io"],
            &["rolebindings", "roles"],
            &all_write,
        ),
        rule(
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
            &["create"],
        ),
    ];
    let aggregate = |name: &str, into: &[&str]| -> Value {
        let sels: Vec<Value> = into.iter().map(|t| json!({"matchLabels": {format!("rbac.authorization.k8s.io/aggregate-to-{t}"): "true"}})).collect();
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "aggregationRule": {"clusterRoleSelectors": sels}, "rules": []})
    };
    // The parts carry one label per aggregate they flow into (view → edit → admin).
    let part = |name: &str, to: &[&str], rules: Vec<Value>| -> Value {
        let mut labels = serde_json::Map::new();
        labels.insert("kubernetes.io/bootstrapping".into(), json!("rbac-defaults"));
        for t in to {
            labels.insert(
                format!("rbac.authorization.k8s.io/aggregate-to-{t}"),
                json!("true"),
            );
        }
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels}, "rules": rules})
    };
    let plain = |name: &str, rules: Vec<Value>| -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}, "rules": rules})
    };
    let bind = |name: &str, role: &str, group: &str| -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]})
    };
    let bind_user = |name: &str, role: &str, user: &str| -> Value {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    };
    let watch_all = ["get", "list", "watch"];
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
    let events = rule(
        &["", "events.k8s.io"],
        &["events"],
        &["create", "patch", "update"],
    );
    let leases = rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["create", "get", "list", "watch", "update", "patch"],
    );
    vec![
        plain(
            "system:kube-scheduler",
            vec![
                events.clone(),
                leases.clone(),
                rule(
                    &[""],
                    &[
                        "pods",
                        "nodes",
                        "namespaces",
                        "persistentvolumes",
                        "persistentvolumeclaims",
                        "services",
                        "replicationcontrollers",
                    ],
                    &watch_all,
                ),
                rule(&["apps"], &["replicasets", "statefulsets"], &watch_all),
                rule(&["policy"], &["poddisruptionbudgets"], &watch_all),
                rule(
                    &["storage.k8s.io"],
                    &["storageclasses", "csinodes", "csidrivers"],
                    &watch_all,
                ),
                rule(&[""], &["pods/binding", "bindings"], &["create"]),
                rule(&[""], &["pods/status"], &["patch", "update"]),
                // Volume binding: the claim waiting for its first consumer learns the node.
                rule(&[""], &["persistentvolumeclaims"], &["patch", "update"]),
                rule(&[""], &["pods"], &["delete"]),
            ],
        ),
        plain(
            "system:kube-controller-manager",
            vec![
                events.clone(),
                leases.clone(),
                json!({"apiGroups": ["*"], "resources": ["*"], "verbs": manage}),
                // The CSR approver and signer act for the built-in signers.
                rule(&["certificates.k8s.io"], &["signers"], &["approve", "sign"]),
            ],
        ),
        plain(
            "system:node",
            vec![
                events.clone(),
                leases.clone(),
                rule(
                    &[""],
                    &["nodes", "nodes/status"],
                    &["create", "get", "list", "watch", "update", "patch"],
                ),
                rule(
                    &[""],
                    &["pods"],
                    &["get", "list", "watch", "create", "delete"],
                ),
                rule(&[""], &["pods/status"], &["patch", "update"]),
                rule(&[""], &["pods/eviction"], &["create"]),
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "secrets",
                        "services",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumes",
                    ],
                    &watch_all,
                ),
                rule(&[""], &["serviceaccounts/token"], &["create"]),
                rule(&["discovery.k8s.io"], &["endpointslices"], &watch_all),
                rule(
                    &["certificates.k8s.io"],
                    &["certificatesigningrequests"],
                    &["create", "get", "list", "watch"],
                ),
            ],
        ),
        plain(
            "system:node-proxier",
            vec![
                events,
                rule(&[""], &["services", "endpoints", "nodes"], &watch_all),
                rule(&["discovery.k8s.io"], &["endpointslices"], &watch_all),
            ],
        ),
        bind_user(
            "system:kube-scheduler",
            "system:kube-scheduler",
            "system:kube-scheduler",
        ),
        bind_user(
            "system:kube-controller-manager",
            "system:kube-controller-manager",
            "system:kube-controller-manager",
        ),
        bind_user(
            "system:node-proxier",
            "system:node-proxier",
            "system:kube-proxy",
        ),
        bind("system:node", "system:node", "system:nodes"),
        // The node-local volume provisioner runs in each kubelet, on its node's credentials
        // (as a provisioner DaemonSet would with its own ServiceAccount).
        plain(
            "system:minik8s:local-path-provisioner",
            vec![
                rule(
                    &[""],
                    &["persistentvolumes"],
                    &["get", "list", "watch", "create", "delete", "patch"],
                ),
                rule(&[""], &["persistentvolumeclaims"], &watch_all),
                rule(&["storage.k8s.io"], &["storageclasses"], &watch_all),
                rule(&[""], &["events"], &["create", "patch"]),
            ],
        ),
        bind(
            "system:minik8s:local-path-provisioner",
            "system:minik8s:local-path-provisioner",
            "system:nodes",
        ),
        // TLS bootstrapping (kubeadm's roles and bindings): a node's bootstrap token may post
        // CSRs for a node client certificate, which the approver then approves; a node may
        // renew its own.
        plain(
            "system:node-bootstrapper",
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
                &["create", "get", "list", "watch"],
            )],
        ),
        plain(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/nodeclient"],
                &["create"],
            )],
        ),
        plain(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests/selfnodeclient"],
                &["create"],
            )],
        ),
        bind(
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            minik8s_types::bootstrap::NODE_GROUP,
        ),
        bind(
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            minik8s_types::bootstrap::NODE_GROUP,
        ),
        bind(
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
        plain(
            "cluster-admin",
            vec![
                json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
                json!({"nonResourceURLs": ["*"], "verbs": ["*"]}),
            ],
        ),
        aggregate("admin", &["admin"]),
        aggregate("edit", &["edit"]),
        aggregate("view", &["view"]),
        part(
            "system:aggregate-to-view",
            &["view", "edit", "admin"],
            view_rules,
        ),
        part("system:aggregate-to-edit", &["edit", "admin"], edit_rules),
        part("system:aggregate-to-admin", &["admin"], admin_rules),
        plain(
            "system:discovery",
            vec![
                json!({"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/openapi", "/openapi/*", "/version", "/version/"], "verbs": ["get"]}),
            ],
        ),
        // Scrapers: upstream's role and binding for the metrics and health endpoints.
        plain(
            "system:monitoring",
            vec![
                json!({"nonResourceURLs": ["/healthz", "/healthz/*", "/livez", "/livez/*", "/readyz", "/readyz/*", "/metrics", "/metrics/slis"], "verbs": ["get"]}),
            ],
        ),
        bind(
            "system:monitoring",
            "system:monitoring",
            "system:monitoring",
        ),
        plain(
            "system:public-info-viewer",
            vec![
                json!({"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}),
            ],
        ),
        // Extension apiservers delegate authentication and authorization back to this one.
        plain(
            "system:auth-delegator",
            vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
            ],
        ),
        plain(
            "system:basic-user",
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
            ],
        ),
        bind("cluster-admin", "cluster-admin", "system:masters"),
        bind(
            "system:discovery",
            "system:discovery",
            "system:authenticated",
        ),
        bind(
            "system:basic-user",
            "system:basic-user",
            "system:authenticated",
        ),
        bind(
            "system:public-info-viewer",
            "system:public-info-viewer",
            "system:authenticated",
        ),
        // Service account issuer discovery (OIDC): service accounts may read it.
        plain(
            "system:service-account-issuer-discovery",
            vec![
                json!({"nonResourceURLs": crate::auth::tokens::DISCOVERY_PATHS, "verbs": ["get"]}),
            ],
        ),
        bind(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            "system:serviceaccounts",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(o: Value) -> minik8s_storage::KeyValue {
        minik8s_storage::KeyValue {
            key: "/k".into(),
            value: serde_json::to_vec(&o).unwrap().into(),
            create_revision: 1,
            mod_revision: 1,
        }
    }

    fn attrs(verb: &str, resource: &str, ns: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: "".into(),
            resource: resource.into(),
            subresource: "".into(),
            namespace: ns.into(),
            name: "".into(),
            path: None,
        }
    }

    #[test]
    fn a_rolebinding_to_view_allows_reads_in_its_namespace_only() {
        let rbac = Rbac::default();
        let mut objs: Vec<_> = defaults().into_iter().map(kv).collect();
        objs.push(kv(json!({"kind": "RoleBinding", "metadata": {"name": "b", "namespace": "team"},
            "roleRef": {"kind": "ClusterRole", "name": "view"}, "subjects": [{"kind": "User", "name": "alice"}]})));
        rbac.load(&objs);
        let alice = User::new("alice", vec![]);
        assert!(rbac.allows(&alice, &attrs("list", "pods", "team")));
        assert!(!rbac.allows(&alice, &attrs("create", "pods", "team")));
        assert!(!rbac.allows(&alice, &attrs("list", "pods", "other")));
        assert!(!rbac.allows(&alice, &attrs("get", "secrets", "team")));
        let discovery = Attributes {
            path: Some("/apis/apps/v1".into()),
            ..attrs("get", "", "")
        };
        assert!(rbac.allows(&alice, &discovery));
        assert!(rbac.allows(
            &User::new("root", vec!["system:masters".into()]),
            &attrs("delete", "nodes", "")
        ));
        let err = rbac
            .authorize(&alice, &attrs("create", "pods", "team"))
            .unwrap_err();
        assert_eq!(err.code, 403);
        assert_eq!(
            err.message,
            "pods is forbidden: User \"alice\" cannot create resource \"pods\" in API group \"\" in the namespace \"team\""
        );
    }
}

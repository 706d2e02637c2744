//! Non-resource endpoints: version, health, and API discovery (plain and aggregated v2),
//! all generated from the registry; OpenAPI is delegated to `openapi`.

pub mod openapi;

use crate::Api;
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use k8s_openapi::Resource;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use std::sync::Arc;

/// The Kubernetes version this server speaks.
pub const KUBE_MINOR: &str = "33";

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn verbs_of(res: &ResourceInfo) -> Vec<&'static str> {
    match res.serving {
        crate::registry::Serving::Review(_) => vec!["create"],
        crate::registry::Serving::Metrics => vec!["get", "list"],
        crate::registry::Serving::Stored => VERBS.to_vec(),
    }
}

fn json_ok(v: &Value) -> Response {
    crate::context::json_response(StatusCode::OK, v, &[])
}

/// Serves `path` if it is a non-resource endpoint.
pub fn serve(api: &Arc<Api>, path: &str, headers: &HeaderMap) -> ApiResult<Response> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .unwrap_or("");
    let aggregated = accept
        .split(',')
        .find(|a| a.contains("as=APIGroupDiscoveryList"))
        .map(|a| {
            if a.contains("v=v2beta1") {
                "v2beta1"
            } else {
                "v2"
            }
        })
        .filter(|_| {
            accept
                .split(',')
                .next()
                .is_some_and(|a| a.contains("as=APIGroupDiscoveryList"))
        });
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    match parts.as_slice() {
        ["version"] => Ok(json_ok(&version())),
        ["api"] => match aggregated {
            Some(v) => Ok(aggregated_response(v, &aggregated_list(api, true, v))),
            None => Ok(json_ok(&json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": api.advertise.clone()}],
            }))),
        },
        ["apis"] => match aggregated {
            Some(v) => Ok(aggregated_response(v, &aggregated_list(api, false, v))),
            None => Ok(json_ok(&group_list(api))),
        },
        ["apis", group] => group_list(api)["groups"]
            .as_array()
            .and_then(|gs| gs.iter().find(|g| g["name"] == *group))
            .map(|g| {
                let mut g = g.clone();
                g["kind"] = json!("APIGroup");
                g["apiVersion"] = json!("v1");
                json_ok(&g)
            })
            .ok_or_else(|| ApiError::no_route(path)),
        ["api", version] => resource_list(api, "", version, path),
        ["apis", group, version] => resource_list(api, group, version, path),
        ["openapi", ..] => crate::discovery::openapi::serve(api, &parts[1..], headers),
        _ => Err(ApiError::no_route(path)),
    }
}

/// The source's git commit as `/version`'s `gitCommit`, set by the binary embedding the
/// apiserver ([`crate::set_git_commit`]).
static GIT_COMMIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets `/version`'s `gitCommit` once: a 40-digit hex commit id (upstream's form, which
/// clients and upstream's conformance spec check); anything else is ignored.
pub fn set_git_commit(commit: &str) {
    if commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        let _ = GIT_COMMIT.set(commit.to_owned());
    }
}

/// `/version`.
pub fn version() -> Value {
    // Zeros when unset (a build outside a git tree, or a test embedding the library).
    let commit = GIT_COMMIT
        .get()
        .map_or("0000000000000000000000000000000000000000", |c| c);
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "emulationMajor": "1",
        "emulationMinor": KUBE_MINOR,
        "gitVersion": format!("v1.{KUBE_MINOR}.0-minik8s"),
        "gitCommit": commit,
        "gitTreeState": "clean",
        "buildDate": "2026-11-22T00:00:00Z",
        "goVersion": "rustc",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// The served groups: the registry's, then those of Service-backed APIServices.
fn all_groups(api: &Arc<Api>) -> Vec<(String, Vec<String>)> {
    let mut groups = api.registry.groups();
    for (g, versions) in api.aggregator.groups() {
        if !groups.iter().any(|(have, _)| *have == g) {
            groups.push((g, versions));
        }
    }
    groups
}

fn group_list(api: &Arc<Api>) -> Value {
    let groups: Vec<Value> = all_groups(api)
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(name, versions)| {
            let gv = |v: &String| json!({"groupVersion": format!("{name}/{v}"), "version": v});
            json!({
                "name": name,
                "versions": versions.iter().map(gv).collect::<Vec<_>>(),
                "preferredVersion": gv(&versions[0]),
            })
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn subresource_kind(res: &ResourceInfo, sub: &str) -> (String, String, String, Vec<&'static str>) {
    match sub {
        "scale" => (
            "autoscaling".into(),
            "v1".into(),
            "Scale".into(),
            vec!["get", "patch", "update"],
        ),
        "status" | "approval" => (
            res.group.clone(),
            res.version.clone(),
            res.kind.clone(),
            vec!["get", "patch", "update"],
        ),
        "binding" => ("".into(), "v1".into(), "Binding".into(), vec!["create"]),
        "eviction" => (
            "policy".into(),
            "v1".into(),
            "Eviction".into(),
            vec!["create"],
        ),
        "token" => (
            "authentication.k8s.io".into(),
            "v1".into(),
            "TokenRequest".into(),
            vec!["create"],
        ),
        "finalize" => (
            res.group.clone(),
            res.version.clone(),
            res.kind.clone(),
            vec!["update"],
        ),
        "log" => ("".into(), "v1".into(), Pod::KIND.into(), vec!["get"]),
        "exec" | "attach" | "portforward" => (
            "".into(),
            "v1".into(),
            "PodExecOptions".into(),
            vec!["create", "get"],
        ),
        "proxy" => (
            "".into(),
            "v1".into(),
            res.kind.clone() + "ProxyOptions",
            vec!["create", "delete", "get", "patch", "update"],
        ),
        "ephemeralcontainers" => (
            "".into(),
            "v1".into(),
            Pod::KIND.into(),
            vec!["get", "patch", "update"],
        ),
        _ => (
            res.group.clone(),
            res.version.clone(),
            res.kind.clone(),
            vec!["get"],
        ),
    }
}

fn resource_list(api: &Arc<Api>, group: &str, version: &str, path: &str) -> ApiResult<Response> {
    let mut resources = Vec::new();
    for res in api
        .registry
        .all()
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
            "kind": res.kind, "verbs": verbs_of(res), "shortNames": res.short_names, "categories": res.categories,
            "storageVersionHash": "",
        }));
        for sub in res.subresources() {
            let (g, v, k, verbs) = subresource_kind(res, &sub);
            let mut entry = json!({"name": format!("{}/{sub}", res.plural), "singularName": "", "namespaced": res.namespaced, "kind": k, "verbs": verbs});
            if g != res.group || v != res.version {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            resources.push(entry);
        }
    }
    if resources.is_empty() {
        return Err(ApiError::no_route(path));
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Ok(json_ok(
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    ))
}

fn aggregated_list(api: &Arc<Api>, core: bool, v: &str) -> Value {
    let mut items = Vec::new();
    for (group, versions) in api.registry.groups() {
        if group.is_empty() != core {
            continue;
        }
        let versions: Vec<Value> = versions
            .iter()
            .map(|version| {
                let resources: Vec<Value> = api
                    .registry
                    .all()
                    .iter()
                    .filter(|r| r.group == group && &r.version == version)
                    .map(|res| {
                        let subs: Vec<Value> = res
                            .subresources()
                            .iter()
                            .map(|sub| {
                                let (g, v, k, verbs) = subresource_kind(res, sub);
                                json!({"subresource": sub, "responseKind": {"group": g, "version": v, "kind": k}, "verbs": verbs})
                            })
                            .collect();
                        json!({
                            "resource": res.plural,
                            "responseKind": {"group": res.group, "version": res.version, "kind": res.kind},
                            "scope": if res.namespaced { "Namespaced" } else { "Cluster" },
                            "singularResource": res.singular,
                            "verbs": verbs_of(res),
                            "shortNames": res.short_names,
                            "categories": res.categories,
                            "subresources": subs,
                        })
                    })
                    .collect();
                json!({"version": version, "resources": resources, "freshness": "Current"})
            })
            .collect();
        items.push(
            json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions}),
        );
    }
    if !core {
        // Service-backed groups, from the discovery documents their checks fetched (upstream's
        // aggregated discovery manager); one not fetched yet is listed as stale.
        for (group, versions) in api.aggregator.groups() {
            if api.registry.groups().iter().any(|(g, _)| *g == group) {
                continue;
            }
            let versions: Vec<Value> = versions
                .iter()
                .map(|version| match api.aggregator.discovery(&group, version) {
                    Some(doc) => json!({"version": version, "resources": v2_resources(&group, version, &doc), "freshness": "Current"}),
                    None => json!({"version": version, "resources": [], "freshness": "Stale"}),
                })
                .collect();
            items.push(json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions}));
        }
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{v}"), "metadata": {}, "items": items})
}

/// An `APIResourceList`'s resources in aggregated discovery's form.
fn v2_resources(group: &str, version: &str, doc: &Value) -> Vec<Value> {
    let list: Vec<&Value> = doc
        .get("resources")
        .and_then(Value::as_array)
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    list.iter()
        .filter(|r| !s(r, "name").contains('/'))
        .map(|r| {
            let name = s(r, "name");
            let subs: Vec<Value> = list
                .iter()
                .filter_map(|sr| {
                    let n = s(sr, "name");
                    let sub = n.strip_prefix(&format!("{name}/"))?.to_owned();
                    Some(json!({"subresource": sub,
                        "responseKind": {"group": sr.get("group").cloned().unwrap_or(json!(group)),
                            "version": sr.get("version").cloned().unwrap_or(json!(version)), "kind": s(sr, "kind")},
                        "verbs": sr.get("verbs").cloned().unwrap_or(json!([]))}))
                })
                .collect();
            json!({
                "resource": name,
                "responseKind": {"group": group, "version": version, "kind": s(r, "kind")},
                "scope": if r.get("namespaced") == Some(&json!(true)) { "Namespaced" } else { "Cluster" },
                "singularResource": s(r, "singularName"),
                "verbs": r.get("verbs").cloned().unwrap_or(json!([])),
                "shortNames": r.get("shortNames").cloned().unwrap_or(json!([])),
                "categories": r.get("categories").cloned().unwrap_or(json!([])),
                "subresources": subs,
            })
        })
        .collect()
}

fn aggregated_response(v: &str, body: &Value) -> Response {
    let mut resp = json_ok(body);
    let ct = format!("application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList");
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&ct).expect("header"),
    );
    resp.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    resp
}

//! OpenAPI v3 (per group-version documents and their index) and v2 (JSON), generated from the
//! k8s-openapi types' schemas with the extensions kubectl reads: `x-kubernetes-group-version-kind`
//! on kinds and operations, `fieldValidation`/`dryRun`/`fieldManager` parameters (kubectl's
//! server-side validation check), and strategic-merge patch keys on list fields.

mod v2proto;

use crate::Api;
use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The generated documents, built once on first use.
pub struct Docs {
    /// `group/version` path (`api/v1`, `apis/apps/v1`) → serialized v3 document.
    v3: BTreeMap<String, (String, Vec<u8>)>,
    /// Serialized v3 index.
    index: Vec<u8>,
    /// Serialized v2 document.
    v2: Vec<u8>,
    /// The v2 document as gnostic's protobuf.
    v2_proto: Vec<u8>,
}

/// Upstream patch strategies of list fields, by schema and property.
const PATCH_KEYS: &[(&str, &str, &str, &str)] = &[
    ("io.k8s.api.core.v1.PodSpec", "containers", "name", "merge"),
    (
        "io.k8s.api.core.v1.PodSpec",
        "initContainers",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "ephemeralContainers",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "volumes",
        "name",
        "merge,retainKeys",
    ),
    (
        "io.k8s.api.core.v1.PodSpec",
        "imagePullSecrets",
        "name",
        "merge",
    ),
    ("io.k8s.api.core.v1.PodSpec", "hostAliases", "ip", "merge"),
    (
        "io.k8s.api.core.v1.PodSpec",
        "topologySpreadConstraints",
        "topologyKey",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.Container",
        "ports",
        "containerPort",
        "merge",
    ),
    ("io.k8s.api.core.v1.Container", "env", "name", "merge"),
    (
        "io.k8s.api.core.v1.Container",
        "volumeMounts",
        "mountPath",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.Container",
        "volumeDevices",
        "devicePath",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "env",
        "name",
        "merge",
    ),
    (
        "io.k8s.api.core.v1.EphemeralContainer",
        "volumeMounts",
        "mountPath",
        "merge",
    ),
    ("io.k8s.api.core.v1.ServiceSpec", "ports", "port", "merge"),
    (
        "io.k8s.api.core.v1.NodeStatus",
        "addresses",
        "type",
        "merge",
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "ownerReferences",
        "uid",
        "merge",
    ),
];

fn annotate(defs: &mut Map<String, Value>, registry: &[Arc<ResourceInfo>]) {
    for (schema, prop, key, strategy) in PATCH_KEYS {
        if let Some(p) = defs
            .get_mut(*schema)
            .and_then(|s| s.pointer_mut(&format!("/properties/{prop}")))
        {
            p["x-kubernetes-patch-merge-key"] = json!(key);
            p["x-kubernetes-patch-strategy"] = json!(strategy);
            p["x-kubernetes-list-type"] = json!("map");
            p["x-kubernetes-list-map-keys"] = json!([key]);
        }
    }
    if let Some(p) = defs
        .get_mut("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        .and_then(|s| s.pointer_mut("/properties/finalizers"))
    {
        p["x-kubernetes-patch-strategy"] = json!("merge");
        p["x-kubernetes-list-type"] = json!("set");
    }
    // Conditions merge by type wherever they appear.
    for (name, schema) in defs.iter_mut() {
        if (name.ends_with("Status") || name.ends_with("Spec"))
            && let Some(c) = schema.pointer_mut("/properties/conditions")
            && c.get("type") == Some(&json!("array"))
        {
            c["x-kubernetes-patch-merge-key"] = json!("type");
            c["x-kubernetes-patch-strategy"] = json!("merge");
            c["x-kubernetes-list-type"] = json!("map");
            c["x-kubernetes-list-map-keys"] = json!(["type"]);
        }
    }
    for res in registry {
        let Some(name) = schema_name(res) else {
            continue;
        };
        if let Some(s) = defs.get_mut(&name) {
            let gvk = json!({"group": res.group, "version": res.version, "kind": res.kind});
            let list = s["x-kubernetes-group-version-kind"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !list.contains(&gvk) {
                let mut list = list;
                list.push(gvk);
                s["x-kubernetes-group-version-kind"] = json!(list);
            }
        }
    }
}

/// The schema name of a resource's kind, as k8s-openapi names it.
fn schema_name(res: &ResourceInfo) -> Option<String> {
    let f = res.schema?;
    let mut g = schemars::generate::SchemaSettings::openapi3().into_generator();
    let r = f(&mut g);
    r.get("$ref")
        .and_then(Value::as_str)
        .map(|r| r.trim_start_matches("#/components/schemas/").to_owned())
}

fn params(names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|n| {
            let ty = match *n {
                "limit" | "timeoutSeconds" | "gracePeriodSeconds" => "integer",
                "watch" | "allowWatchBookmarks" | "force" | "sendInitialEvents" => "boolean",
                _ => "string",
            };
            json!({"name": n, "in": "query", "schema": {"type": ty, "uniqueItems": true}})
        })
        .collect()
}

fn op(
    res: &ResourceInfo,
    action: &str,
    id: &str,
    schema: &Value,
    query: &[&str],
    body: bool,
    status: u16,
) -> Value {
    let mut o = json!({
        "operationId": id,
        "tags": [if res.group.is_empty() { "core_v1".to_owned() } else { format!("{}_{}", res.group.replace('.', "_"), res.version) }],
        "parameters": params(query),
        "responses": {status.to_string(): {"description": "OK", "content": {"application/json": {"schema": schema}}},
            "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": res.group, "version": res.version, "kind": res.kind},
    });
    if body {
        let content = if action == "patch" {
            // As upstream: strategic merge patch only where the kind supports it (built-in
            // kinds, not custom resources); kubectl apply picks its patch type from this list.
            let patch = json!({"schema": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"}});
            let mut types = vec![
                "application/apply-patch+yaml",
                "application/json-patch+json",
                "application/merge-patch+json",
            ];
            if res.strategic_merge {
                types.push("application/strategic-merge-patch+json");
            }
            Value::Object(
                types
                    .into_iter()
                    .map(|t| (t.to_owned(), patch.clone()))
                    .collect(),
            )
        } else {
            json!({"application/json": {"schema": schema}})
        };
        o["requestBody"] = json!({"content": content, "required": true});
    }
    o
}

fn paths_for(res: &ResourceInfo, schema: &Value, out: &mut Map<String, Value>) {
    let base = res.base_path();
    let scope = if res.namespaced {
        "/namespaces/{namespace}"
    } else {
        ""
    };
    let kind = &res.kind;
    let ns = if res.namespaced { "Namespaced" } else { "" };
    let writes = ["dryRun", "fieldManager", "fieldValidation", "pretty"];
    let list_q = [
        "labelSelector",
        "fieldSelector",
        "limit",
        "continue",
        "resourceVersion",
        "resourceVersionMatch",
        "watch",
        "allowWatchBookmarks",
        "sendInitialEvents",
        "timeoutSeconds",
        "pretty",
    ];
    let list_schema = json!({"type": "object"});
    out.insert(
        format!("{base}{scope}/{}", res.plural),
        json!({
            "get": op(res, "list", &format!("list{ns}{kind}"), &list_schema, &list_q, false, 200),
            "post": op(res, "post", &format!("create{ns}{kind}"), schema, &writes, true, 201),
            "delete": op(res, "deletecollection", &format!("deletecollection{ns}{kind}"), &json!({"type": "object"}), &["labelSelector", "fieldSelector", "dryRun", "gracePeriodSeconds", "propagationPolicy"], false, 200),
        }),
    );
    let mut one = json!({
        "get": op(res, "get", &format!("read{ns}{kind}"), schema, &["pretty"], false, 200),
        "put": op(res, "put", &format!("replace{ns}{kind}"), schema, &writes, true, 200),
        "patch": op(res, "patch", &format!("patch{ns}{kind}"), schema, &["dryRun", "fieldManager", "fieldValidation", "force", "pretty"], true, 200),
        "delete": op(res, "delete", &format!("delete{ns}{kind}"), schema, &["dryRun", "gracePeriodSeconds", "propagationPolicy"], false, 200),
    });
    one["parameters"] = json!([
        {"name": "name", "in": "path", "required": true, "schema": {"type": "string"}},
    ]);
    out.insert(format!("{base}{scope}/{}/{{name}}", res.plural), one);
    if res.status {
        let mut st = json!({
            "get": op(res, "get", &format!("read{ns}{kind}Status"), schema, &["pretty"], false, 200),
            "put": op(res, "put", &format!("replace{ns}{kind}Status"), schema, &writes, true, 200),
            "patch": op(res, "patch", &format!("patch{ns}{kind}Status"), schema, &["dryRun", "fieldManager", "fieldValidation", "force"], true, 200),
        });
        // Only the main resource's PATCH carries the kind's GVK for kubectl's check.
        for m in ["get", "put", "patch"] {
            st[m]
                .as_object_mut()
                .expect("op")
                .remove("x-kubernetes-group-version-kind");
        }
        out.insert(format!("{base}{scope}/{}/{{name}}/status", res.plural), st);
    }
}

/// The v2 document's paths: each kind's PATCH with its group/version/kind and the query
/// parameters it takes, which is what kubectl up to 1.26 reads from them (its dry-run
/// verifier looks for `dryRun` there).
fn v2_paths(refs: &[(Arc<ResourceInfo>, Value)]) -> Value {
    let mut out = Map::new();
    for (res, _) in refs {
        if res.serving != crate::registry::Serving::Stored {
            continue;
        }
        let base = res.base_path();
        let scope = if res.namespaced {
            "/namespaces/{namespace}"
        } else {
            ""
        };
        let query = |name: &str, ty: &str| json!({"uniqueItems": true, "type": ty, "name": name, "in": "query"});
        out.insert(
            format!("{base}{scope}/{}/{{name}}", res.plural),
            json!({"patch": {
                "parameters": [query("dryRun", "string"), query("fieldManager", "string"),
                    query("fieldValidation", "string"), query("force", "boolean")],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": res.group, "kind": res.kind, "version": res.version},
            }}),
        );
    }
    Value::Object(out)
}

fn hash_of(bytes: &[u8]) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    format!("{:016X}", h.finish())
}

/// Builds every document from the registry.
pub fn build(api: &Api) -> Docs {
    let registry = api.registry.all();
    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    let mut refs: Vec<(Arc<ResourceInfo>, Value)> = Vec::new();
    let mut custom: Vec<(String, Value)> = Vec::new();
    let mut custom_v2: Vec<(String, Value)> = Vec::new();
    for res in &registry {
        if let Some(f) = res.schema {
            let r = f(&mut generator);
            refs.push((res.clone(), serde_json::to_value(r).unwrap_or(Value::Null)));
        } else if let Some(schema) = &res.crd_schema {
            // Upstream names a custom resource's schema by its reversed group, version and kind.
            let reversed: Vec<&str> = res.group.split('.').rev().collect();
            let name = format!("{}.{}.{}", reversed.join("."), res.version, res.kind);
            let mut schema = schema.clone();
            // v2 (upstream's buildKubeNative): a root that keeps unknown fields is a bare
            // object, since kubectl 1.20 would refuse any field beside listed properties.
            let mut v2 = if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true))
            {
                json!({"type": "object"})
            } else {
                let mut v2 = schema.clone();
                to_v2_structural(&mut v2);
                kube_native(&mut v2, res, true);
                v2
            };
            v2["x-kubernetes-group-version-kind"] =
                json!([{"group": res.group, "version": res.version, "kind": res.kind}]);
            kube_native(&mut schema, res, false);
            custom_v2.push((name.clone(), v2));
            refs.push((
                res.clone(),
                json!({"$ref": format!("#/components/schemas/{name}")}),
            ));
            custom.push((name, schema));
        }
    }
    // Types every document refers to.
    generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Patch>();
    generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>();
    generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions>();
    let mut defs = generator.take_definitions(true);
    annotate(&mut defs, &registry);
    for (name, schema) in custom {
        defs.insert(name, schema);
    }
    let components = json!({"schemas": defs});

    let mut by_gv: BTreeMap<String, Map<String, Value>> = BTreeMap::new();
    for (res, schema) in &refs {
        let key = if res.group.is_empty() {
            format!("api/{}", res.version)
        } else {
            format!("apis/{}/{}", res.group, res.version)
        };
        paths_for(res, schema, by_gv.entry(key).or_default());
    }
    let mut v3 = BTreeMap::new();
    let mut index = Map::new();
    for (gv, paths) in by_gv {
        let doc = json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": format!("v1.{}.0", crate::discovery::KUBE_MINOR)},
            "paths": paths,
            "components": components,
        });
        let bytes = serde_json::to_vec(&doc).expect("json");
        let hash = hash_of(&bytes);
        index.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={hash}")}),
        );
        v3.insert(gv, (hash, bytes));
    }
    let index = serde_json::to_vec(&json!({"paths": index})).expect("json");
    let mut v2_schemas = components["schemas"].clone();
    for (name, schema) in custom_v2 {
        v2_schemas[name] = schema;
    }
    v2_refs(&mut v2_schemas);
    let v2_defs = serde_json::to_string(&v2_schemas)
        .expect("json")
        .replace("#/components/schemas/", "#/definitions/");
    let v2_paths = serde_json::to_string(&v2_paths(&refs)).expect("json");
    let v2 = format!(
        "{{\"swagger\":\"2.0\",\"info\":{{\"title\":\"Kubernetes\",\"version\":\"v1.{}.0\"}},\"paths\":{v2_paths},\"definitions\":{v2_defs}}}",
        crate::discovery::KUBE_MINOR
    )
    .into_bytes();
    let v2_proto = v2proto::encode(&serde_json::from_slice(&v2).expect("the v2 document is JSON"));
    Docs {
        v3,
        index,
        v2,
        v2_proto,
    }
}

/// The properties every custom resource has, and its group/version/kind (upstream's
/// `buildKubeNative`): `metadata` is described as upstream does, as a `$ref` with a
/// description in v2 and an `allOf` in v3.
fn kube_native(schema: &mut Value, res: &ResourceInfo, v2: bool) {
    const META: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
    const REF: &str = "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
    schema["properties"]["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
    schema["properties"]["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
    schema["properties"]["metadata"] = if v2 {
        json!({"$ref": REF, "description": META})
    } else {
        json!({"allOf": [{"$ref": REF}], "default": {}, "description": META})
    };
    schema["x-kubernetes-group-version-kind"] =
        json!([{"group": res.group, "version": res.version, "kind": res.kind}]);
}

/// A CRD's structural schema as OpenAPI v2 publishes it (upstream's `ToStructuralOpenAPIV2`):
/// no `allOf`/`oneOf`/`anyOf`/`not`; nullable and unknown-field-preserving nodes lose their
/// `properties` and `items` (kubectl's client-side validation would refuse what they allow),
/// and with them their type where it would still constrain.
fn to_v2_structural(v: &mut Value) {
    let Some(m) = v.as_object_mut() else {
        return;
    };
    for k in ["allOf", "oneOf", "anyOf", "not"] {
        m.remove(k);
    }
    let yes = |m: &Map<String, Value>, k: &str| m.get(k) == Some(&Value::Bool(true));
    if yes(m, "nullable") {
        for k in ["type", "nullable", "items", "properties"] {
            m.remove(k);
        }
    }
    let preserve = yes(m, "x-kubernetes-preserve-unknown-fields");
    if preserve {
        m.remove("items");
        m.remove("properties");
    }
    let ty = m
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if (ty == "array" && !m.contains_key("items")) || (preserve && ty == "object") {
        m.remove("type");
    }
    // A nullable property is not required.
    let nullable: Vec<String> = m
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .filter(|(_, s)| s.get("nullable") == Some(&Value::Bool(true)))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    if !nullable.is_empty()
        && let Some(req) = m.get_mut("required").and_then(Value::as_array_mut)
    {
        req.retain(|r| !nullable.iter().any(|n| r == n));
        if req.is_empty() {
            m.remove("required");
        }
    }
    if m.get("additionalProperties")
        .is_some_and(|a| a.get("nullable") == Some(&Value::Bool(true)))
    {
        m.remove("required");
    }
    if let Some(p) = m.get_mut("properties").and_then(Value::as_object_mut) {
        p.values_mut().for_each(to_v2_structural);
    }
    if let Some(i) = m.get_mut("items") {
        to_v2_structural(i);
    }
    if let Some(a) = m.get_mut("additionalProperties").filter(|a| a.is_object()) {
        to_v2_structural(a);
    }
}

/// v3's `allOf: [{$ref}]` (a reference with siblings such as a description) as v2 writes
/// it, a `$ref` beside them: kubectl's v2 reader follows only a direct `$ref`.
fn v2_refs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let single = m
                .get("allOf")
                .and_then(Value::as_array)
                .filter(|a| a.len() == 1)
                .and_then(|a| a[0].get("$ref"))
                .cloned();
            if let Some(r) = single
                && !m.contains_key("$ref")
            {
                m.remove("allOf");
                m.insert("$ref".into(), r);
            }
            m.values_mut().for_each(v2_refs);
        }
        Value::Array(a) => a.iter_mut().for_each(v2_refs),
        _ => {}
    }
}

fn bytes_response(body: Vec<u8>, etag: Option<&str>) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(e) = etag.and_then(|e| HeaderValue::from_str(&format!("\"{e}\"")).ok()) {
        resp.headers_mut().insert(header::ETAG, e);
        resp.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, immutable"),
        );
    }
    resp
}

/// Serves `/openapi/...` (`parts` is the path after `openapi`).
pub fn serve(api: &Arc<Api>, parts: &[&str], headers: &HeaderMap) -> ApiResult<Response> {
    let docs = {
        let generation = api.registry.generation();
        let mut cached = api.openapi.lock().expect("openapi lock");
        match cached.as_ref() {
            Some((g, docs)) if *g == generation => docs.clone(),
            _ => {
                let docs = Arc::new(build(api));
                *cached = Some((generation, docs.clone()));
                docs
            }
        }
    };
    match parts {
        ["v3"] => Ok(bytes_response(docs.index.clone(), None)),
        ["v3", rest @ ..] => {
            let gv = rest.join("/");
            let (hash, doc) = docs.v3.get(&gv).ok_or_else(|| ApiError::no_route(&gv))?;
            Ok(bytes_response(doc.clone(), Some(hash)))
        }
        ["v2"] => {
            let accept = headers
                .get(header::ACCEPT)
                .and_then(|a| a.to_str().ok())
                .unwrap_or("");
            // kubectl up to 1.26 asks for gnostic's protobuf and nothing else.
            if accept.contains("com.github.proto-openapi.spec.v2") && !accept.contains("json") {
                let mut resp = bytes_response(docs.v2_proto.clone(), None);
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    // As upstream's kube-openapi handler: the type's '@' is no MIME token.
                    HeaderValue::from_static("application/octet-stream"),
                );
                return Ok(resp);
            }
            if accept.contains("protobuf") && !accept.contains("json") && !accept.contains("*/*") {
                return Err(ApiError::not_acceptable(
                    "only application/json is served for /openapi/v2",
                ));
            }
            Ok(bytes_response(docs.v2.clone(), None))
        }
        _ => Err(ApiError::no_route(&parts.join("/"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_schemas_lose_what_openapi_v2_cannot_say_as_upstream_converts_them() {
        let mut s = json!({"type": "object", "required": ["a", "n"], "properties": {
            "a": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"known": {"type": "string"}}},
            "n": {"type": "string", "nullable": true},
            "l": {"type": "array", "items": {"type": "object", "oneOf": [{"required": ["x"]}],
                "properties": {"x": {"type": "integer"}}}},
            "u": {"type": "array", "x-kubernetes-preserve-unknown-fields": true, "items": {"type": "string"}},
        }});
        to_v2_structural(&mut s);
        assert_eq!(
            s,
            json!({"type": "object", "required": ["a"], "properties": {
                "a": {"x-kubernetes-preserve-unknown-fields": true},
                "n": {},
                "l": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                "u": {"x-kubernetes-preserve-unknown-fields": true},
            }})
        );
    }
}

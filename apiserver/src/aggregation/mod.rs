//! The aggregation layer (upstream's kube-aggregator): `apiregistration.k8s.io/v1`
//! APIServices name who serves each group/version.
//!
//! - **Local** APIServices (no `service`) are written at start for every built-in group and
//!   version, with upstream's priorities; this server serves them.
//! - An APIService with a `service` sends every request under `/apis/{group}/{version}` on to
//!   a ready endpoint of that Service over TLS (verified against its `caBundle`, name
//!   `<service>.<namespace>.svc`), after this server has authenticated and authorized it. The
//!   user travels in upstream's front-proxy headers (`X-Remote-User`, `X-Remote-Group`,
//!   `X-Remote-Extra-*`), vouched for by the front-proxy client certificate, whose CA the
//!   `kube-system/extension-apiserver-authentication` ConfigMap publishes.
//! - A checker sets each APIService's `Available` condition as upstream's
//!   `AvailableConditionController` does (service, port, endpoints, then a discovery GET as
//!   `system:kube-aggregator`), and keeps the discovery document it fetched, which `/apis`
//!   and aggregated discovery merge with the built-in groups.

pub mod kubelet;
pub mod proxy;

use crate::Api;
use crate::auth::User;
use crate::error::{ApiError, ApiResult};
use crate::object;
use axum::body::Body;
use axum::http::{Request, header, request::Parts};
use axum::response::Response;
use http_body_util::{BodyExt, Empty};
use minik8s_storage::{KeyValue, RangeRequest, Store};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Where APIServices are stored.
pub const PREFIX: &str = "/registry/apiregistration.k8s.io/apiservices/";

/// The ConfigMap extension apiservers read to authenticate the front proxy and clients.
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";

/// How often every APIService is checked (upstream resyncs every 30 s; a change is checked
/// at once).
const RECHECK: Duration = Duration::from_secs(10);

/// upstream's `apiVersionPriorities`: (group priority minimum, version priority).
fn priority(group: &str, version: &str) -> (i64, i64) {
    match (group, version) {
        ("", "v1") => (18000, 1),
        ("apiregistration.k8s.io", _) => (18000, 15),
        ("apps", _) => (17800, 15),
        ("events.k8s.io", _) => (17750, 15),
        ("authentication.k8s.io", _) => (17700, 15),
        ("authorization.k8s.io", _) => (17600, 15),
        ("autoscaling", "v2") => (17500, 30),
        ("autoscaling", _) => (17500, 15),
        ("batch", _) => (17400, 15),
        ("certificates.k8s.io", _) => (17300, 15),
        ("networking.k8s.io", _) => (17200, 15),
        ("policy", _) => (17100, 15),
        ("rbac.authorization.k8s.io", _) => (17000, 15),
        ("storage.k8s.io", _) => (16800, 15),
        ("apiextensions.k8s.io", _) | ("admissionregistration.k8s.io", _) => (16700, 15),
        ("scheduling.k8s.io", _) => (16600, 15),
        ("coordination.k8s.io", _) => (16500, 15),
        ("node.k8s.io", _) => (16300, 15),
        ("discovery.k8s.io", _) => (16200, 15),
        ("flowcontrol.apiserver.k8s.io", _) => (16100, 21),
        // metrics-server's APIService asks for these.
        ("metrics.k8s.io", _) => (100, 100),
        _ => (1000, 15),
    }
}

/// The label upstream puts on APIServices it manages: `onstart` for built-in groups, `true`
/// for those of CRDs.
pub const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

/// The local APIService of a built-in group/version, as upstream's `makeAPIService`.
pub fn local(group: &str, version: &str) -> Value {
    let (g, v) = priority(group, version);
    json!({
        "kind": "APIService", "apiVersion": "apiregistration.k8s.io/v1",
        "metadata": {"name": format!("{version}.{group}"), "labels": {AUTOMANAGED: "onstart"}},
        "spec": {"group": group, "version": version, "groupPriorityMinimum": g, "versionPriority": v},
        "status": {"conditions": [local_condition()]},
    })
}

/// Keeps one local APIService per served version of a CRD group (upstream's
/// `crdRegistrationController`: group priority 1000, version priority 100), and removes those
/// of versions no CRD serves any more.
pub async fn sync_crd_group(api: &Api, group: &str, versions: &[String]) {
    for version in versions {
        let key = format!("{PREFIX}{version}.{group}");
        if matches!(api.store.get(&key).await, Ok(Some(_))) {
            continue;
        }
        let mut obj = json!({
            "kind": "APIService", "apiVersion": "apiregistration.k8s.io/v1",
            "metadata": {"name": format!("{version}.{group}"), "labels": {AUTOMANAGED: "true"},
                "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": object::now()},
            "spec": {"group": group, "version": version, "groupPriorityMinimum": 1000, "versionPriority": 100},
            "status": {"conditions": [local_condition()]},
        });
        let _ = api.store.create(&key, object::to_store(&mut obj)).await;
    }
    let Ok(all) = api.store.range(RangeRequest::prefix(PREFIX)).await else {
        return;
    };
    for kv in all.kvs {
        let Ok(o) = serde_json::from_slice::<Value>(&kv.value) else {
            continue;
        };
        let managed = o
            .pointer("/metadata/labels")
            .and_then(|l| l.get(AUTOMANAGED))
            == Some(&json!("true"));
        let version = o
            .pointer("/spec/version")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if managed
            && o.pointer("/spec/group").and_then(Value::as_str) == Some(group)
            && !versions.iter().any(|v| v == version)
        {
            let _ = api.store.delete(&kv.key, Some(kv.mod_revision)).await;
        }
    }
}

fn local_condition() -> Value {
    json!({"type": "Available", "status": "True", "lastTransitionTime": object::now(),
        "reason": "Local", "message": "Local APIServices are always available"})
}

/// An APIService served by a Service.
struct Remote {
    name: String,
    group: String,
    version: String,
    namespace: String,
    service: String,
    port: u16,
    group_priority: i64,
    version_priority: i64,
    tls: Arc<rustls::ClientConfig>,
}

/// The Service-backed APIServices by (group, version).
type Table = Arc<HashMap<(String, String), Arc<Remote>>>;

/// What the checker last found for an APIService.
#[derive(Clone, Default)]
struct Health {
    available: bool,
    /// Its discovery document (`APIResourceList`) from the last check that passed.
    discovery: Option<Value>,
}

/// The APIServices served by Services, kept in step with the store.
pub struct Aggregator {
    remotes: RwLock<Table>,
    health: Mutex<HashMap<String, Health>>,
    client: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    changed: tokio::sync::Notify,
}

/// Why the front-proxy client certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("loading the front-proxy client certificate {path}: {reason}")]
pub struct FrontProxyError {
    path: std::path::PathBuf,
    reason: String,
}

impl Aggregator {
    /// An aggregator presenting the front-proxy client certificate (if any) to backends.
    pub fn new(
        front_proxy: Option<&minik8s_kubeconfig::FrontProxy>,
    ) -> Result<Self, FrontProxyError> {
        let client = match front_proxy {
            None => None,
            Some(fp) => {
                let err = |path: &std::path::Path, reason: String| FrontProxyError {
                    path: path.into(),
                    reason,
                };
                let certs = CertificateDer::pem_file_iter(&fp.cert)
                    .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| err(&fp.cert, e.to_string()))?;
                let key = PrivateKeyDer::from_pem_file(&fp.key)
                    .map_err(|e| err(&fp.key, e.to_string()))?;
                Some((certs, key))
            }
        };
        Ok(Aggregator {
            remotes: RwLock::default(),
            health: Mutex::default(),
            client,
            changed: tokio::sync::Notify::new(),
        })
    }

    fn tls(&self, ca: &[u8], insecure: bool) -> Option<Arc<rustls::ClientConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .ok()?;
        let builder = if insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(
                    minik8s_kubeconfig::insecure::AnyServerCert::new(provider),
                ))
        } else {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca).flatten() {
                let _ = roots.add(cert);
            }
            builder.with_root_certificates(roots)
        };
        let config = match &self.client {
            Some((certs, key)) => builder
                .with_client_auth_cert(certs.clone(), key.clone_key())
                .ok()?,
            None => builder.with_no_client_auth(),
        };
        Some(Arc::new(config))
    }

    /// Rebuilds the table from the stored APIServices.
    pub fn load(&self, kvs: &[KeyValue]) {
        let mut remotes = HashMap::new();
        for kv in kvs {
            let Ok(o) = serde_json::from_slice::<Value>(&kv.value) else {
                continue;
            };
            let Some(svc) = o.pointer("/spec/service").filter(|s| !s.is_null()) else {
                continue;
            };
            let s = |v: &Value, p: &str| {
                v.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            let ca = o
                .pointer("/spec/caBundle")
                .and_then(Value::as_str)
                .and_then(|b| {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD.decode(b).ok()
                })
                .unwrap_or_default();
            let insecure = o.pointer("/spec/insecureSkipTLSVerify") == Some(&json!(true));
            let Some(tls) = self.tls(&ca, insecure) else {
                continue;
            };
            let remote = Remote {
                name: s(&o, "/metadata/name"),
                group: s(&o, "/spec/group"),
                version: s(&o, "/spec/version"),
                namespace: s(svc, "/namespace"),
                service: s(svc, "/name"),
                port: svc.get("port").and_then(Value::as_u64).unwrap_or(443) as u16,
                group_priority: o
                    .pointer("/spec/groupPriorityMinimum")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                version_priority: o
                    .pointer("/spec/versionPriority")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                tls,
            };
            remotes.insert(
                (remote.group.clone(), remote.version.clone()),
                Arc::new(remote),
            );
        }
        {
            let mut health = self.health.lock().expect("aggregator health");
            health.retain(|name, _| remotes.values().any(|r| &r.name == name));
        }
        *self.remotes.write().expect("aggregator table") = Arc::new(remotes);
        self.changed.notify_one();
    }

    fn snapshot(&self) -> Table {
        self.remotes.read().expect("aggregator table").clone()
    }

    /// The remote serving `path`, if it lies under a Service-backed group/version.
    fn route(&self, path: &str) -> Option<Arc<Remote>> {
        let mut parts = path.trim_start_matches('/').split('/');
        if parts.next() != Some("apis") {
            return None;
        }
        let (group, version) = (parts.next()?, parts.next()?);
        self.snapshot()
            .get(&(group.to_owned(), version.to_owned()))
            .cloned()
    }

    fn health(&self, name: &str) -> Health {
        self.health
            .lock()
            .expect("aggregator health")
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// The Service-backed groups for `/apis`: (group, versions by priority), by group
    /// priority; they follow the built-in groups.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let remotes = self.snapshot();
        let mut by_group: BTreeMap<&str, Vec<&Remote>> = BTreeMap::new();
        for r in remotes.values() {
            by_group.entry(&r.group).or_default().push(r);
        }
        let mut groups: Vec<(i64, String, Vec<String>)> = by_group
            .into_iter()
            .map(|(g, mut rs)| {
                rs.sort_by(|a, b| {
                    b.version_priority
                        .cmp(&a.version_priority)
                        .then(a.version.cmp(&b.version))
                });
                let top = rs.iter().map(|r| r.group_priority).max().unwrap_or(0);
                (
                    top,
                    g.to_owned(),
                    rs.iter().map(|r| r.version.clone()).collect(),
                )
            })
            .collect();
        groups.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        groups.into_iter().map(|(_, g, v)| (g, v)).collect()
    }

    /// The discovery document of a Service-backed group/version, from its last passed check.
    pub fn discovery(&self, group: &str, version: &str) -> Option<Value> {
        let remote = self
            .snapshot()
            .get(&(group.to_owned(), version.to_owned()))
            .cloned()?;
        self.health(&remote.name).discovery
    }
}

/// Whether `path` is served by a Service-backed APIService.
pub fn routes(api: &Api, path: &str) -> bool {
    api.aggregator.route(path).is_some()
}

/// A ready endpoint (address, port) of the Service for the APIService's service port, as
/// upstream's endpoint resolver picks one.
async fn endpoint(api: &Api, r: &Remote) -> Result<(String, u16), (&'static str, String)> {
    let key = format!("/registry/core/services/{}/{}", r.namespace, r.service);
    let svc = match api.store.get(&key).await {
        Ok(Some(kv)) => {
            object::from_store(&kv).map_err(|e| ("ServiceAccessError", e.to_string()))?
        }
        Ok(None) => {
            return Err((
                "ServiceNotFound",
                format!("service/{} in {:?} is not present", r.service, r.namespace),
            ));
        }
        Err(e) => return Err(("ServiceAccessError", e.to_string())),
    };
    let port = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(r.port)));
    let Some(port) = port else {
        return Err((
            "ServicePortError",
            format!(
                "service/{} in {:?} is not listening on port {}",
                r.service, r.namespace, r.port
            ),
        ));
    };
    let port_name = port
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    crate::aggregation::proxy::ready_endpoint(api, &r.namespace, &r.service, &port_name)
        .await
        .map_err(|e| ("ServiceAccessError", e.to_string()))?
        .ok_or_else(|| {
            (
                "MissingEndpoints",
                format!(
                    "endpoints for service/{} in {:?} have no addresses with port name {:?}",
                    r.service, r.namespace, port_name
                ),
            )
        })
}

/// Headers that belong to one hop, and credentials meant for this server.
fn dropped(name: &header::HeaderName) -> bool {
    matches!(
        *name,
        header::CONNECTION
            | header::TE
            | header::TRAILER
            | header::TRANSFER_ENCODING
            | header::UPGRADE
            | header::PROXY_AUTHORIZATION
            | header::AUTHORIZATION
            | header::HOST
    ) || {
        let n = name.as_str();
        n.starts_with("impersonate-") || n.starts_with("x-remote-")
    }
}

/// Sets upstream's front-proxy headers for `user` (`transport.SetAuthProxyHeaders`).
fn auth_headers(
    mut req: axum::http::request::Builder,
    user: &str,
    groups: &[String],
    extra: &BTreeMap<String, Vec<String>>,
) -> axum::http::request::Builder {
    req = req.header("X-Remote-User", user);
    for g in groups {
        req = req.header("X-Remote-Group", g);
    }
    for (k, vs) in extra {
        let name = format!("X-Remote-Extra-{}", urlencoding(k));
        for v in vs {
            req = req.header(name.as_str(), v);
        }
    }
    req
}

/// Percent-encodes an extra key as upstream's `headerKeyEscape`.
fn urlencoding(k: &str) -> String {
    k.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Sends an authenticated, authorized request on to the APIService's Service and streams the
/// answer back (upstream's `proxyHandler`).
pub async fn proxy(api: &Arc<Api>, user: &User, parts: Parts, body: Body) -> ApiResult<Response> {
    let Some(remote) = api.aggregator.route(parts.uri.path()) else {
        return Err(ApiError::no_route(parts.uri.path()));
    };
    if !api.aggregator.health(&remote.name).available {
        return Err(ApiError::unavailable("service unavailable"));
    }
    let (host, port) = endpoint(api, &remote)
        .await
        .map_err(|(_, m)| ApiError::unavailable(m))?;
    let uri = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut req = Request::builder().method(parts.method.clone()).uri(&uri);
    for (k, v) in &parts.headers {
        if !dropped(k) {
            req = req.header(k, v);
        }
    }
    req = auth_headers(req, &user.name, &user.groups, &BTreeMap::new());
    let req = req
        .header(header::HOST, format!("{host}:{port}"))
        .body(body)
        .map_err(ApiError::internal)?;
    let server_name = format!("{}.{}.svc", remote.service, remote.namespace);
    let unreachable =
        |e: String| ApiError::unavailable(format!("error trying to reach service: {e}"));
    let mut sender = crate::serving::server::dial_https(
        remote.tls.clone(),
        &host,
        port,
        &server_name,
        &api.tasks,
    )
    .await
    .map_err(unreachable)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let (mut parts, body) = resp.into_parts();
    for h in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TRAILER,
        header::UPGRADE,
    ] {
        parts.headers.remove(h);
    }
    Ok(Response::from_parts(
        parts,
        Body::new(body.map_err(axum::Error::new)),
    ))
}

/// One availability check of a Service-backed APIService: (status, reason, message) and the
/// discovery document when it passed.
async fn check(api: &Api, r: &Remote) -> (bool, &'static str, String, Option<Value>) {
    let (host, port) = match endpoint(api, r).await {
        Ok(e) => e,
        Err((reason, message)) => return (false, reason, message, None),
    };
    let path = format!("/apis/{}/{}", r.group, r.version);
    let url = format!("https://{}.{}.svc:{}{path}", r.service, r.namespace, r.port);
    let attempt = async {
        let server_name = format!("{}.{}.svc", r.service, r.namespace);
        let mut sender = crate::serving::server::dial_https::<Empty<bytes::Bytes>>(
            r.tls.clone(),
            &host,
            port,
            &server_name,
            &api.tasks,
        )
        .await?;
        let req = auth_headers(
            Request::get(&path)
                .header(header::HOST, format!("{host}:{port}"))
                .header(header::ACCEPT, "application/json"),
            "system:kube-aggregator",
            &["system:masters".to_owned()],
            &BTreeMap::new(),
        )
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !(200..300).contains(&status.as_u16()) {
            return Err(format!("bad status from {url}: {}", status.as_u16()));
        }
        Ok::<_, String>(serde_json::from_slice::<Value>(&bytes).ok())
    };
    match tokio::time::timeout(Duration::from_secs(6), attempt).await {
        Ok(Ok(doc)) => (true, "Passed", "all checks passed".into(), doc),
        Ok(Err(e)) if e.starts_with("bad status") => (false, "FailedDiscoveryCheck", e, None),
        Ok(Err(e)) => (
            false,
            "FailedDiscoveryCheck",
            format!("failing or missing response from {url}: {e}"),
            None,
        ),
        Err(_) => (
            false,
            "FailedDiscoveryCheck",
            format!("timed out waiting for {url}"),
            None,
        ),
    }
}

/// Writes the `Available` condition if it changed (the transition time moves only with the
/// status, as upstream's `SetAPIServiceCondition`).
async fn set_condition(api: &Api, name: &str, available: bool, reason: &str, message: &str) {
    let key = format!("{PREFIX}{name}");
    for _ in 0..3 {
        let Ok(Some(kv)) = api.store.get(&key).await else {
            return;
        };
        let Ok(mut o) = serde_json::from_slice::<Value>(&kv.value) else {
            return;
        };
        let status = if available { "True" } else { "False" };
        let old = o
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
            .cloned();
        if old.as_ref().is_some_and(|c| {
            c["status"] == status && c["reason"] == reason && c["message"] == message
        }) {
            return;
        }
        let since = old
            .as_ref()
            .filter(|c| c["status"] == status)
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(object::now()));
        o["status"] = json!({"conditions": [{"type": "Available", "status": status,
            "lastTransitionTime": since, "reason": reason, "message": message}]});
        let value = object::to_store(&mut o);
        match api.store.update(&key, value, kv.mod_revision).await {
            Err(minik8s_storage::Error::Conflict { .. }) => continue,
            Ok(_) | Err(_) => return,
        }
    }
}

/// Checks every Service-backed APIService now, after each change, and every 10 s, until
/// shutdown; local ones are always available.
pub async fn run(api: Arc<Api>) {
    loop {
        let remotes = api.aggregator.snapshot();
        for r in remotes.values() {
            let (available, reason, message, doc) = check(&api, r).await;
            {
                let mut health = api.aggregator.health.lock().expect("aggregator health");
                let h = health.entry(r.name.clone()).or_default();
                h.available = available;
                if doc.is_some() {
                    h.discovery = doc;
                }
            }
            if !available {
                tracing::debug!(apiservice = %r.name, reason, %message, "APIService not available");
            }
            set_condition(&api, &r.name, available, reason, &message).await;
        }
        // Local APIServices (written by others, or from an older start) say they are available.
        if let Ok(all) = api.store.range(RangeRequest::prefix(PREFIX)).await {
            for kv in all.kvs {
                let Ok(o) = serde_json::from_slice::<Value>(&kv.value) else {
                    continue;
                };
                if o.pointer("/spec/service").is_none_or(Value::is_null) {
                    let name = o
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    set_condition(
                        &api,
                        name,
                        true,
                        "Local",
                        "Local APIServices are always available",
                    )
                    .await;
                }
            }
        }
        tokio::select! {
            _ = api.shutdown.cancelled() => return,
            _ = api.aggregator.changed.notified() => {}
            _ = tokio::time::sleep(RECHECK) => {}
        }
    }
}

/// The `kube-system/extension-apiserver-authentication` ConfigMap, as upstream's
/// `ClusterAuthenticationTrustController` writes it.
pub fn authentication_configmap(client_ca: &str, front_proxy_ca: Option<&str>) -> Value {
    let mut data = json!({"client-ca-file": client_ca});
    if let Some(ca) = front_proxy_ca {
        data["requestheader-client-ca-file"] = json!(ca);
        data["requestheader-allowed-names"] =
            json!(format!("[\"{}\"]", minik8s_kubeconfig::FRONT_PROXY_CLIENT));
        data["requestheader-extra-headers-prefix"] = json!("[\"X-Remote-Extra-\"]");
        data["requestheader-group-headers"] = json!("[\"X-Remote-Group\"]");
        data["requestheader-username-headers"] = json!("[\"X-Remote-User\"]");
    }
    json!({
        "kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": AUTHENTICATION_CONFIGMAP, "namespace": "kube-system"},
        "data": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_keys_are_escaped_as_upstream() {
        assert_eq!(
            urlencoding("scopes.example.com/x y"),
            "scopes.example.com%2Fx%20y"
        );
    }

    #[test]
    fn local_apiservices_carry_upstream_priorities() {
        let v = local("apps", "v1");
        assert_eq!(v["metadata"]["name"], "v1.apps");
        assert_eq!(v["spec"]["groupPriorityMinimum"], 17800);
        assert_eq!(local("", "v1")["metadata"]["name"], "v1.");
    }

    #[test]
    fn routes_are_found_by_group_and_version() {
        let a = Aggregator::new(None).unwrap();
        let o = json!({"metadata": {"name": "v1alpha1.wardle.example.com"},
            "spec": {"group": "wardle.example.com", "version": "v1alpha1", "insecureSkipTLSVerify": true,
                "groupPriorityMinimum": 2000, "versionPriority": 200,
                "service": {"namespace": "w", "name": "api", "port": 443}}});
        let kv = KeyValue {
            key: format!("{PREFIX}v1alpha1.wardle.example.com"),
            value: serde_json::to_vec(&o).unwrap().into(),
            create_revision: 1,
            mod_revision: 1,
        };
        a.load(&[kv]);
        assert!(
            a.route("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders")
                .is_some()
        );
        assert!(a.route("/apis/wardle.example.com/v1alpha1").is_some());
        assert!(a.route("/apis/wardle.example.com").is_none());
        assert!(a.route("/apis/apps/v1").is_none());
        assert_eq!(
            a.groups(),
            vec![("wardle.example.com".to_owned(), vec!["v1alpha1".to_owned()])]
        );
    }
}

//! The resource registry: one [`ResourceInfo`] row per served resource, and what the rows
//! point at. Built-in kinds are rows made from k8s-openapi's type constants (`builtin.rs`);
//! custom resources add rows at run time (`crd.rs`). Handlers look rows up here and never name
//! a kind: each row points at its kind's strategy (`kinds/`). Beside them: how lists merge
//! (`lists.rs`), defaulting and validation helpers (`defaults.rs`, `validation/`), Service
//! address allocation (`alloc.rs`), conversion between stored versions (`versions.rs`), and
//! what custom resources need: structural schemas (`structural.rs`), CEL rules (`rules.rs`)
//! and conversion webhooks (`conversion.rs`).

pub mod alloc;
mod builtin;
pub mod conversion;
pub mod crd;
pub mod defaults;
pub mod kinds;
pub mod lists;
pub mod rules;
pub mod structural;
pub mod validation;
pub(crate) mod versions;

use crate::error::{ApiError, ApiResult};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

pub use builtin::builtin_resources;

/// How object names of a kind are validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// A lowercase RFC 1123 subdomain (most kinds).
    Subdomain,
    /// A lowercase RFC 1123 label (namespaces).
    Label,
    /// A DNS-1035 label: an RFC 1123 label starting with a letter (services).
    Dns1035Label,
    /// Any name without `/` or `%` and not `.`/`..` (RBAC kinds).
    Path,
    /// An IP address in its canonical form (IPAddress objects).
    Ip,
}

/// Where a kind's `/scale` subresource reads and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleInfo {
    /// JSON pointer of the desired replicas (`/spec/replicas`).
    pub spec_replicas: String,
    /// JSON pointer of the observed replicas (`/status/replicas`).
    pub status_replicas: String,
    /// JSON pointer of the label selector (`/spec/selector`), if any.
    pub selector: Option<String>,
}

/// Decodes an object as the kind's typed form and encodes it back (dropping fields the type
/// does not have); the error says why it does not decode.
pub type DecodeCheck = fn(&Value) -> Result<Value, String>;

/// Adds a kind's schema to an OpenAPI generator.
pub type SchemaFn = fn(&mut schemars::SchemaGenerator) -> schemars::Schema;

/// One served resource.
#[derive(Clone)]
pub struct ResourceInfo {
    /// API group ("" for core).
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Kind of its list.
    pub list_kind: String,
    /// Plural name (the URL segment).
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Short names (`po`, `deploy`).
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Whether it has a `status` subresource.
    pub status: bool,
    /// Its `scale` subresource, if any.
    pub scale: Option<ScaleInfo>,
    /// Other subresources served elsewhere (`binding`, `eviction`, `log`, …).
    pub extra_subresources: Vec<String>,
    /// Name validation.
    pub name_rule: NameRule,
    /// Whether `generation` is tracked (kinds with a spec).
    pub generation: bool,
    /// Whether status given on create is kept (nodes); otherwise it is cleared.
    pub keep_status_on_create: bool,
    /// The typed decode check of a built-in kind.
    pub decode: Option<DecodeCheck>,
    /// Adds the kind's OpenAPI schema (and its subschemas) to a generator; returns its `$ref`.
    pub schema: Option<SchemaFn>,
    /// Whether the kind supports strategic merge patch (built-ins do, custom resources do not).
    pub strategic_merge: bool,
    /// Fields other than `metadata.name`/`metadata.namespace` that field selectors may use.
    pub field_selectors: Vec<String>,
    /// The field its watches are indexed by (pods: `spec.nodeName`, as upstream's watch cache
    /// indexes them): a watch selecting one value of it is woken only by that value's changes.
    pub watch_index: Option<&'static str>,
    /// When another version holds the objects: its apiVersion and storage key prefix.
    pub storage: Option<(String, String)>,
    /// Table columns declared by a CRD (`additionalPrinterColumns`); empty for built-ins.
    pub printer_columns: Vec<PrinterColumn>,
    /// The structural OpenAPI v3 schema of a custom resource version.
    pub crd_schema: Option<Value>,
    /// Whether `crd_schema` has `default`s, which are applied to objects read from storage.
    pub read_defaults: bool,
    /// How the resource is served: stored, or answered without storage.
    pub serving: Serving,
    /// A custom resource's conversion webhook (`None`: conversion only sets `apiVersion`).
    pub conversion: Option<Arc<crate::registry::conversion::Webhook>>,
    /// The kind's rules: defaults, validation, update rules, hooks and table (`kinds/`).
    pub strategy: &'static dyn crate::registry::kinds::Strategy,
}

/// How a resource's requests are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// Objects live in the store (every verb).
    Stored,
    /// A review (access reviews, whoami): only `create`, answered, never stored.
    Review(Review),
    /// Resource metrics (`metrics.k8s.io`): only `get`/`list`, gathered from the kubelets.
    Metrics,
}

/// What a review resource answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Review {
    /// Whether the requesting user may do something (SelfSubjectAccessReview).
    SelfAccess,
    /// Whether the user the review names may do something (SubjectAccessReview and
    /// LocalSubjectAccessReview).
    Access,
    /// Who the requesting user is (SelfSubjectReview, `kubectl auth whoami`).
    SelfSubject,
    /// Who a bearer token authenticates as (TokenReview, what webhook token authenticators
    /// ask).
    Token,
}

/// One `additionalPrinterColumns` entry of a CRD.
#[derive(Clone, Debug, PartialEq)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// OpenAPI type (`string`, `integer`, `date`, …).
    pub type_: String,
    /// Simple JSONPath (`.spec.replicas`).
    pub json_path: String,
    /// 0: always; >0: only with `-o wide`.
    pub priority: i64,
    /// Description.
    pub description: String,
}

impl std::fmt::Debug for ResourceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} {}", self.group, self.version, self.plural)
    }
}

impl ResourceInfo {
    /// Whether this is a custom resource (served from a CRD) rather than a built-in kind.
    pub fn is_custom(&self) -> bool {
        self.serving == Serving::Stored && self.decode.is_none()
    }

    /// Where its list types (merge keys, sets) come from.
    pub fn lists(&self) -> lists::Lists<'_> {
        match &self.crd_schema {
            Some(schema) => lists::Lists::Schema(schema),
            None => lists::Lists::Builtin(self.strategy),
        }
    }

    /// `apiVersion` as objects carry it (`v1`, `apps/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The URL prefix of this resource's group/version (`/api/v1`, `/apis/apps/v1`).
    pub fn base_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The storage key prefix of all objects of this resource, with a trailing `/`.
    pub fn key_prefix(&self) -> String {
        if let Some((_, prefix)) = &self.storage {
            return prefix.clone();
        }
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        format!("/registry/{group}/{}/", self.plural)
    }

    /// The storage key prefix of a namespace's objects (or of all, for `None`).
    pub fn scope_prefix(&self, namespace: Option<&str>) -> String {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => format!("{}{ns}/", self.key_prefix()),
            _ => self.key_prefix(),
        }
    }

    /// The storage key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}{name}", self.scope_prefix(namespace))
    }

    /// Decodes a stored object into this resource's version (with its resourceVersion).
    pub fn read(&self, kv: &minik8s_storage::KeyValue) -> ApiResult<Value> {
        let obj = crate::object::from_store(kv)?;
        let mut obj = match &self.storage {
            Some(_) => self.convert(obj, &self.api_version())?,
            None => obj,
        };
        // A CRD's defaults apply to what is read from storage too (upstream's defaulting on
        // decode), so fields defaulted after an object was written appear on read.
        if self.read_defaults
            && let Some(schema) = &self.crd_schema
        {
            crate::registry::structural::default(schema, &mut obj);
        }
        Ok(obj)
    }

    /// Encodes an object of this resource's version for storage (in the storage version).
    pub fn encode(&self, obj: &mut Value) -> ApiResult<bytes::Bytes> {
        Ok(match &self.storage {
            Some((version, _)) => crate::object::to_store(&mut self.convert(obj.clone(), version)?),
            None => crate::object::to_store(obj),
        })
    }

    /// Converts an object to apiVersion `to`: by the CRD's conversion webhook when it has one
    /// (500 when the webhook fails, as upstream), else by the built-in conversions.
    fn convert(&self, obj: Value, to: &str) -> ApiResult<Value> {
        match &self.conversion {
            Some(hook) if obj.get("apiVersion").and_then(Value::as_str) != Some(to) => {
                hook.convert(obj, to).map_err(|e| {
                    crate::error::ApiError::internal(format!(
                        "conversion webhook for {}, Kind={} failed: {e}",
                        self.api_version(),
                        self.kind
                    ))
                })
            }
            _ => Ok(crate::registry::versions::convert(obj, to)),
        }
    }

    /// What label and field selectors read of a stored object: its name, namespace, labels
    /// and the kind's selectable fields, decoded without the rest where the stored version
    /// is the served one (`None`: decode the whole object, [`ResourceInfo::read`]).
    pub fn selectable(&self, kv: &minik8s_storage::KeyValue) -> Option<Value> {
        if !self.stored_as_served() {
            return None;
        }
        let mut paths = vec!["metadata.name", "metadata.namespace", "metadata.labels"];
        paths.extend(self.field_selectors.iter().map(String::as_str));
        crate::object::decode_paths(&kv.value, &paths)
    }

    /// Whether stored bytes are already in this resource's version (no conversion on read).
    pub fn stored_as_served(&self) -> bool {
        self.storage.is_none() && !self.read_defaults
    }

    /// The subresources this resource serves.
    pub fn subresources(&self) -> Vec<String> {
        let mut subs = Vec::new();
        if self.status {
            subs.push("status".to_owned());
        }
        if self.scale.is_some() {
            subs.push("scale".to_owned());
        }
        subs.extend(self.extra_subresources.iter().cloned());
        subs
    }
}

/// Registry rows keyed by group, version and plural.
type Rows = BTreeMap<(String, String, String), Arc<ResourceInfo>>;

/// Every served resource, by group, version and plural; shared and updatable at run time.
#[derive(Clone, Default)]
pub struct Registry {
    inner: Arc<RwLock<Rows>>,
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl Registry {
    /// A registry holding the built-in resources.
    pub fn with_builtins() -> Self {
        let r = Registry::default();
        let mut rows = builtin_resources();
        // Upstream keeps one storage version per resource; other versions are views of it.
        for row in &mut rows {
            let storage = match (
                row.group.as_str(),
                row.version.as_str(),
                row.plural.as_str(),
            ) {
                ("autoscaling", "v1", "horizontalpodautoscalers") => Some((
                    "autoscaling/v2",
                    "/registry/autoscaling/horizontalpodautoscalers/",
                )),
                ("events.k8s.io", "v1", "events") => Some(("v1", "/registry/core/events/")),
                _ => None,
            };
            row.storage = storage.map(|(v, p)| (v.to_owned(), p.to_owned()));
        }
        for info in rows {
            r.add(info);
        }
        r
    }

    /// Adds or replaces a resource.
    pub fn add(&self, info: ResourceInfo) {
        let key = (
            info.group.clone(),
            info.version.clone(),
            info.plural.clone(),
        );
        self.inner
            .write()
            .expect("registry lock")
            .insert(key, Arc::new(info));
        self.bump();
    }

    /// Removes every version of a resource (a deleted CRD).
    pub fn remove(&self, group: &str, plural: &str) {
        self.inner
            .write()
            .expect("registry lock")
            .retain(|(g, _, p), _| !(g == group && p == plural));
        self.bump();
    }

    fn bump(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A counter that changes whenever rows are added or removed.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Looks up a resource by group, version and plural.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.inner
            .read()
            .expect("registry lock")
            .get(&(group.to_owned(), version.to_owned(), plural.to_owned()))
            .cloned()
    }

    /// Looks up a resource, answering 404 as upstream does for an unknown one.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> ApiResult<Arc<ResourceInfo>> {
        self.get(group, version, plural)
            .ok_or_else(|| ApiError::no_route(plural))
    }

    /// Every resource, sorted by group, version and plural.
    pub fn all(&self) -> Vec<Arc<ResourceInfo>> {
        self.inner
            .read()
            .expect("registry lock")
            .values()
            .cloned()
            .collect()
    }

    /// The served groups, each with its versions, preferred version first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for info in self.all() {
            match groups.iter_mut().find(|(g, _)| *g == info.group) {
                Some((_, versions)) => {
                    if !versions.contains(&info.version) {
                        versions.push(info.version.clone());
                    }
                }
                None => groups.push((info.group.clone(), vec![info.version.clone()])),
            }
        }
        for (_, versions) in &mut groups {
            versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        }
        // Upstream orders groups by priority; core first, then the built-in groups.
        groups.sort_by_key(|(g, _)| group_order(g));
        groups
    }
}

/// Upstream's version ordering: GA > beta > alpha, higher numbers first.
pub fn version_priority(v: &str) -> (u8, u32, u32) {
    let rest = v.trim_start_matches('v');
    let (num, tail) = rest.split_at(
        rest.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len()),
    );
    let major = num.parse().unwrap_or(0);
    if tail.is_empty() {
        return (3, major, 0);
    }
    let (stage, n) = if let Some(n) = tail.strip_prefix("beta") {
        (2, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n)
    } else {
        (0, tail)
    };
    (stage, major, n.parse().unwrap_or(0))
}

fn group_order(group: &str) -> (usize, String) {
    const ORDER: &[&str] = &[
        "",
        "apiregistration.k8s.io",
        "apps",
        "events.k8s.io",
        "authentication.k8s.io",
        "authorization.k8s.io",
        "autoscaling",
        "batch",
        "certificates.k8s.io",
        "networking.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "storage.k8s.io",
        "admissionregistration.k8s.io",
        "apiextensions.k8s.io",
        "scheduling.k8s.io",
        "coordination.k8s.io",
        "node.k8s.io",
        "discovery.k8s.io",
        "flowcontrol.apiserver.k8s.io",
    ];
    match ORDER.iter().position(|g| *g == group) {
        Some(i) => (i, String::new()),
        None => (ORDER.len(), group.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_like_upstream() {
        let mut v = vec!["v1beta1", "v2", "v1", "v1alpha1", "v2beta2", "v1beta2"];
        v.sort_by_key(|x| std::cmp::Reverse(version_priority(x)));
        assert_eq!(v, ["v2", "v1", "v2beta2", "v1beta2", "v1beta1", "v1alpha1"]);
    }

    #[test]
    fn keys_follow_the_storage_layout() {
        let r = Registry::with_builtins();
        let cm = r.get("", "v1", "configmaps").unwrap();
        assert_eq!(
            cm.key(Some("default"), "x"),
            "/registry/core/configmaps/default/x"
        );
        let deploy = r.get("apps", "v1", "deployments").unwrap();
        assert_eq!(deploy.scope_prefix(None), "/registry/apps/deployments/");
        let node = r.get("", "v1", "nodes").unwrap();
        assert_eq!(node.key(Some("ignored"), "n1"), "/registry/core/nodes/n1");
    }
}

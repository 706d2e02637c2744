//! Small facts about pods, owners and selectors that several controllers share.

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use minik8s_types::Quantity;
use std::collections::BTreeMap;

/// The controller owner reference of an object, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
}

/// A controller owner reference to `owner` (blocking its foreground deletion).
pub fn owner_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    let meta = owner.meta();
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A label selector (as in a workload's spec) parsed once, for matching many label sets. An
/// empty selector matches everything; an invalid one matches nothing.
pub struct Selector(Option<minik8s_types::LabelSelector>);

impl Selector {
    /// Parses `selector`.
    pub fn new(selector: &LabelSelector) -> Self {
        let parsed = serde_json::to_value(selector)
            .ok()
            .and_then(|json| minik8s_types::LabelSelector::from_json(&json).ok());
        Selector(parsed)
    }

    /// Whether `labels` (none: empty) match.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let empty = BTreeMap::new();
        self.0
            .as_ref()
            .is_some_and(|s| s.matches(labels.unwrap_or(&empty)))
    }
}

/// A pod's phase.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Whether a pod has ended (Succeeded or Failed).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

/// Whether a pod counts toward its controller's replicas: not ended, not being deleted.
pub fn is_active(pod: &Pod) -> bool {
    !is_terminal(pod) && pod.metadata.deletion_timestamp.is_none()
}

/// Whether a pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether a pod has been Ready for at least `min_ready_seconds`.
pub fn is_available(pod: &Pod, min_ready_seconds: i32, now: jiff::Timestamp) -> bool {
    if !is_ready(pod) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    let since = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    since.is_some_and(|t| now.duration_since(t).as_secs() >= i64::from(min_ready_seconds))
}

/// The resources a pod asks for: the larger of its containers' sum and any one init
/// container, plus its overhead (upstream's effective request).
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, Quantity> {
    let mut total: BTreeMap<String, Quantity> = BTreeMap::new();
    let Some(spec) = &pod.spec else {
        return total;
    };
    for c in &spec.containers {
        for (k, v) in c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
        {
            *total.entry(k.clone()).or_default() += Quantity::parse(&v.0).unwrap_or_default();
        }
    }
    for c in spec.init_containers.iter().flatten() {
        for (k, v) in c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
        {
            let q = Quantity::parse(&v.0).unwrap_or_default();
            let e = total.entry(k.clone()).or_default();
            *e = (*e).max(q);
        }
    }
    for (k, v) in spec.overhead.iter().flatten() {
        *total.entry(k.clone()).or_default() += Quantity::parse(&v.0).unwrap_or_default();
    }
    total
}

/// An API error as upstream's controllers print it in events: the Status's message.
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// `namespace/name` of an object, for logs and maps.
pub fn key<K: Resource>(obj: &K) -> String {
    let m = obj.meta();
    match &m.namespace {
        Some(ns) => format!("{ns}/{}", m.name.as_deref().unwrap_or_default()),
        None => m.name.clone().unwrap_or_default(),
    }
}

pub use minik8s_types::names::random_suffix;

/// A stable hash of a value's JSON, spelled with the same alphabet (pod-template-hash).
pub fn hash_of(v: &impl serde::Serialize) -> String {
    const CHARS: &[u8] = minik8s_types::names::ALPHABET;
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    // FNV-1a, 64-bit.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    let mut out = String::new();
    for _ in 0..10 {
        out.push(CHARS[(h % CHARS.len() as u64) as usize] as char);
        h /= CHARS.len() as u64;
    }
    out
}

/// A time as Kubernetes writes it (RFC 3339, whole seconds, UTC).
pub fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A Go duration (`15s`, `1m0.5s`, `250ms`, `5m`), as metav1.Duration and upstream's flags
/// write them.
pub fn go_duration(s: &str) -> Option<std::time::Duration> {
    let mut total = 0.0;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    // Go's time.ParseDuration takes a bare zero too.
    if rest == "0" {
        return Some(std::time::Duration::ZERO);
    }
    while !rest.is_empty() {
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Some(std::time::Duration::from_secs_f64(total))
}

/// Whether a node selector requirement holds for `value` (a label's, or the node's name).
pub fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Whether `node` matches a node selector (any of its terms), as required node affinity and
/// a volume's node affinity use it.
pub fn selector_matches(selector: &NodeSelector, node: &Node) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// Whether `node` matches one node selector term (all its expressions and fields).
pub fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let labels = node.labels();
    let name = node.metadata.name.as_deref();
    term.match_expressions
        .iter()
        .flatten()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && term
            .match_fields
            .iter()
            .flatten()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, name))
}

/// Deletes this pod (by uid, so a new pod of the same name is left alone); a pod already
/// gone or replaced is not an error.
pub async fn delete_pod(api: &kube::Api<Pod>, pod: &Pod) -> crate::Result<()> {
    use kube::ResourceExt;
    let dp = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&pod.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Maps an object (a pod, a ReplicaSet) that no controller owns to the controllers of its
/// namespace whose selector matches it (upstream's `getPodReplicaSets`/`getPodJobs`/
/// `getDeploymentsForReplicaSet`), so a new or released orphan is looked at for adoption.
pub fn orphan_owners<K, C>(
    controllers: kube::runtime::reflector::Store<K>,
    selector_of: impl Fn(&K) -> Option<LabelSelector> + Send + Sync + 'static,
) -> impl Fn(std::sync::Arc<C>) -> Vec<kube::runtime::reflector::ObjectRef<K>> + Send + Sync + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    C: Resource,
{
    move |child| {
        let meta = child.meta();
        if controller_of(meta).is_some() || meta.deletion_timestamp.is_some() {
            return Vec::new();
        }
        controllers
            .state()
            .into_iter()
            .filter(|c| c.meta().namespace == meta.namespace)
            .filter(|c| {
                selector_of(c).is_some_and(|sel| Selector::new(&sel).matches(meta.labels.as_ref()))
            })
            .map(|c| kube::runtime::reflector::ObjectRef::from_obj(c.as_ref()))
            .collect()
    }
}

/// Claims objects for a controller, as upstream's `ControllerRefManager`: of the given
/// objects, those it controls that still match `selector` are kept, those that no longer
/// match are released (their reference removed), and matching orphans that are not being
/// deleted and that `adoptable` accepts are adopted (`reference` added). Returns the claimed.
pub async fn claim<K>(
    api: &kube::Api<K>,
    objects: Vec<std::sync::Arc<K>>,
    selector: &Selector,
    reference: OwnerReference,
    adoptable: impl Fn(&K) -> bool,
) -> kube::Result<Vec<std::sync::Arc<K>>>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use kube::api::{Patch, PatchParams};
    let uid = reference.uid.clone();
    let mut owned = Vec::new();
    for o in objects {
        let meta = o.meta();
        let controller = controller_of(meta);
        // Objects of another controller are neither adopted nor released.
        if controller.is_some_and(|c| c.uid != uid) {
            continue;
        }
        let matches = selector.matches(meta.labels.as_ref());
        let name = meta.name.clone().unwrap_or_default();
        match controller {
            Some(_) if matches => owned.push(o),
            Some(_) => {
                let keep: Vec<&OwnerReference> = meta
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|r| r.uid != uid)
                    .collect();
                // An empty list is dropped (null), as Go's omitempty does upstream.
                let keep = if keep.is_empty() {
                    serde_json::Value::Null
                } else {
                    serde_json::json!(keep)
                };
                let patch =
                    serde_json::json!({"metadata": {"ownerReferences": keep, "uid": meta.uid}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
            }
            None if matches && meta.deletion_timestamp.is_none() && adoptable(&o) => {
                let mut refs = meta.owner_references.clone().unwrap_or_default();
                refs.push(reference.clone());
                let patch =
                    serde_json::json!({"metadata": {"ownerReferences": refs, "uid": meta.uid}});
                if api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .is_ok()
                {
                    owned.push(o);
                }
            }
            None => {}
        }
    }
    Ok(owned)
}

/// Claims pods for a controller (upstream's `ClaimPods`): finished pods are not adopted.
pub async fn claim_pods(
    api: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    pods: Vec<std::sync::Arc<k8s_openapi::api::core::v1::Pod>>,
    selector: &Selector,
    reference: OwnerReference,
) -> kube::Result<Vec<std::sync::Arc<k8s_openapi::api::core::v1::Pod>>> {
    claim(api, pods, selector, reference, |p| !is_terminal(p)).await
}

/// Whether `have` already says what `want` (the object this controller would apply) says:
/// the same labels, `want`'s owners among `have`'s, and the same content (`fields`; absent and empty
/// lists alike, as the API stores them).
pub fn unchanged<K: serde::Serialize + Resource>(
    have: &K,
    want: &serde_json::Value,
    fields: &[&str],
) -> bool {
    let Ok(have_json) = serde_json::to_value(have) else {
        return false;
    };
    let meta = have.meta();
    // Exactly the labels wanted: one the controller no longer sets (a Service's label
    // removed, a Service no longer headless) must go, as upstream's checks compare them whole.
    let wanted_labels: BTreeMap<String, String> =
        serde_json::from_value(want["metadata"]["labels"].clone()).unwrap_or_default();
    let labels_kept = meta.labels.clone().unwrap_or_default() == wanted_labels;
    let owners_kept = want["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|o| {
            meta.owner_references
                .iter()
                .flatten()
                .any(|h| Some(h.uid.as_str()) == o["uid"].as_str())
        });
    let empty = |v: &serde_json::Value| v.is_null() || v.as_array().is_some_and(Vec::is_empty);
    let same = fields.iter().all(|f| {
        let (h, w) = (&have_json[*f], &want[*f]);
        (empty(h) && empty(w)) || h == w
    });
    labels_kept && owners_kept && same
}

/// `object` as its typed form serializes it (no nulls), to compare with what the informer
/// holds.
pub fn normalized<K: serde::de::DeserializeOwned + serde::Serialize>(
    object: serde_json::Value,
) -> crate::Result<serde_json::Value> {
    let typed: K = serde_json::from_value(object)
        .map_err(|e| crate::Error::Invalid(format!("an object this controller built: {e}")))?;
    serde_json::to_value(typed)
        .map_err(|e| crate::Error::Invalid(format!("an object this controller built: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    #[test]
    fn go_durations_parse_as_go_does() {
        let secs = |s| go_duration(s).map(|d| d.as_secs_f64());
        assert_eq!(secs("5m0s"), Some(300.0));
        assert_eq!(secs("1m0.5s"), Some(60.5));
        assert_eq!(secs("250ms"), Some(0.25));
        assert_eq!(secs("0"), Some(0.0));
        assert_eq!(secs("5"), None);
        assert_eq!(secs(""), None);
    }

    fn container(cpu: &str) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some([("cpu".to_owned(), Q(cpu.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn requests_are_the_larger_of_the_sum_and_any_init_container() {
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![container("100m"), container("200m")],
                init_containers: Some(vec![container("500m")]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(pod_requests(&pod)["cpu"], Quantity(500));
    }

    #[test]
    fn template_hashes_are_stable_and_differ_by_content() {
        let a = hash_of(&serde_json::json!({"image": "a"}));
        assert_eq!(a, hash_of(&serde_json::json!({"image": "a"})));
        assert_ne!(a, hash_of(&serde_json::json!({"image": "b"})));
        assert_eq!(a.len(), 10);
    }
}

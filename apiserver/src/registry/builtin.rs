//! The built-in resources: one row per k8s-openapi type, named by the type's own constants
//! (group, version, kind, plural, scope), plus the per-resource facts k8s-openapi does not
//! carry (short names, categories, subresources, field selectors) as data.

use super::{NameRule, ResourceInfo, Review, ScaleInfo, Serving};
use crate::registry::kinds::{self, Strategy};
use k8s_openapi::api::{
    admissionregistration::v1 as admission, apps::v1 as apps, autoscaling::v1 as autoscaling1,
    autoscaling::v2 as autoscaling2, batch::v1 as batch, certificates::v1 as certificates,
    coordination::v1 as coordination, core::v1 as core, discovery::v1 as discovery,
    events::v1 as events, flowcontrol::v1 as flowcontrol, networking::v1 as networking,
    policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as scheduling, storage::v1 as storage,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use k8s_openapi::{ClusterResourceScope, ListableResource, NamespaceResourceScope, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Whether a k8s-openapi scope type is namespaced.
trait Scope {
    const NAMESPACED: bool;
}
impl Scope for NamespaceResourceScope {
    const NAMESPACED: bool = true;
}
impl Scope for ClusterResourceScope {
    const NAMESPACED: bool = false;
}

fn decode_as<K: DeserializeOwned + serde::Serialize>(v: &Value) -> Result<Value, String> {
    let first = match K::deserialize(v) {
        Ok(typed) => return serde_json::to_value(typed).map_err(|e| e.to_string()),
        Err(e) => e.to_string(),
    };
    let mut filled = Vec::new();
    let mut v = v.clone();
    zero_times(&mut v, String::new(), &mut filled);
    if filled.is_empty() {
        return Err(first);
    }
    let typed = K::deserialize(&v).map_err(|_| first)?;
    let mut out = serde_json::to_value(typed).map_err(|e| e.to_string())?;
    for path in filled {
        if let Some(t) = out.pointer_mut(&path) {
            *t = Value::Null;
        }
    }
    Ok(out)
}

/// Go's zero time, which a Go client sends as `null`.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Go clients send a `metav1.Condition` whose `lastTransitionTime` is unset as `null`, which
/// upstream takes (and returns as `null`) but k8s-openapi's type requires: when the typed
/// decode fails, such conditions get Go's zero time for it, and their paths are noted to be
/// `null` again.
fn zero_times(v: &mut Value, path: String, filled: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let condition = m.contains_key("type")
                && m.contains_key("status")
                && m.contains_key("reason")
                && m.get("lastTransitionTime").is_none_or(Value::is_null)
                && path.contains("/conditions/");
            if condition {
                m.insert("lastTransitionTime".into(), Value::String(ZERO_TIME.into()));
                filled.push(format!("{path}/lastTransitionTime"));
            }
            for (k, child) in m.iter_mut() {
                let key = k.replace('~', "~0").replace('/', "~1");
                zero_times(child, format!("{path}/{key}"), filled);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                zero_times(child, format!("{path}/{i}"), filled);
            }
        }
        _ => {}
    }
}

/// The facts about a resource that its type does not carry.
#[derive(Default)]
struct Extra {
    short: &'static [&'static str],
    all: bool,
    status: bool,
    scale: bool,
    subresources: &'static [&'static str],
    name_rule: Option<NameRule>,
    generation: bool,
    keep_status: bool,
    fields: &'static [&'static str],
    watch_index: Option<&'static str>,
}

fn row<K>(strategy: &'static dyn Strategy, extra: Extra) -> ResourceInfo
where
    K: Resource + ListableResource + DeserializeOwned + serde::Serialize + schemars::JsonSchema,
    K::Scope: Scope,
{
    ResourceInfo {
        group: K::GROUP.into(),
        version: K::VERSION.into(),
        kind: K::KIND.into(),
        list_kind: K::LIST_KIND.into(),
        plural: K::URL_PATH_SEGMENT.into(),
        singular: K::KIND.to_ascii_lowercase(),
        short_names: extra.short.iter().map(|s| s.to_string()).collect(),
        categories: if extra.all {
            vec!["all".into()]
        } else {
            vec![]
        },
        namespaced: <K::Scope as Scope>::NAMESPACED,
        status: extra.status,
        scale: extra.scale.then(|| ScaleInfo {
            spec_replicas: "/spec/replicas".into(),
            status_replicas: "/status/replicas".into(),
            selector: Some("/spec/selector".into()),
        }),
        extra_subresources: extra.subresources.iter().map(|s| s.to_string()).collect(),
        name_rule: extra.name_rule.unwrap_or(NameRule::Subdomain),
        generation: extra.generation,
        keep_status_on_create: extra.keep_status,
        decode: Some(decode_as::<K>),
        schema: Some(|g| g.subschema_for::<K>()),
        strategic_merge: true,
        field_selectors: extra.fields.iter().map(|s| s.to_string()).collect(),
        watch_index: extra.watch_index,
        storage: None,
        printer_columns: vec![],
        crd_schema: None,
        read_defaults: false,
        serving: Serving::Stored,
        conversion: None,
        strategy,
    }
}

/// A resource that is answered, never stored (reviews, metrics): no status, no generation.
fn unstored(
    (group, version, kind, plural): (&str, &str, &str, &str),
    namespaced: bool,
    serving: Serving,
) -> ResourceInfo {
    ResourceInfo {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        short_names: vec![],
        categories: vec![],
        namespaced,
        status: false,
        scale: None,
        extra_subresources: vec![],
        name_rule: NameRule::Subdomain,
        generation: false,
        keep_status_on_create: true,
        decode: None,
        schema: None,
        strategic_merge: false,
        field_selectors: vec![],
        watch_index: None,
        storage: None,
        printer_columns: vec![],
        crd_schema: None,
        read_defaults: false,
        serving,
        conversion: None,
        strategy: &kinds::Plain,
    }
}

/// A review resource: created and answered at once, never stored.
fn review<K>(namespaced: bool, answers: Review) -> ResourceInfo
where
    K: Resource + DeserializeOwned + serde::Serialize + schemars::JsonSchema,
{
    ResourceInfo {
        decode: Some(decode_as::<K>),
        schema: Some(|g| g.subschema_for::<K>()),
        ..unstored(
            (K::GROUP, K::VERSION, K::KIND, K::URL_PATH_SEGMENT),
            namespaced,
            Serving::Review(answers),
        )
    }
}

/// Every built-in resource minik8s serves.
pub fn builtin_resources() -> Vec<ResourceInfo> {
    let status = || Extra {
        status: true,
        ..Default::default()
    };
    let workload = |short: &'static [&'static str], scale: bool| Extra {
        short,
        all: true,
        status: true,
        scale,
        generation: true,
        ..Default::default()
    };
    let rbac_names = || Extra {
        name_rule: Some(NameRule::Path),
        ..Default::default()
    };
    vec![
        // core/v1
        row::<core::Namespace>(
            &kinds::namespace::Namespace,
            Extra {
                short: &["ns"],
                status: true,
                subresources: &["finalize"],
                name_rule: Some(NameRule::Label),
                fields: &["status.phase"],
                ..Default::default()
            },
        ),
        row::<core::Pod>(
            &kinds::pod::Pod,
            Extra {
                short: &["po"],
                all: true,
                status: true,
                // metadata.generation: 1 on create, bumped by spec changes (1.33's pods).
                generation: true,
                subresources: &[
                    "attach",
                    "binding",
                    "ephemeralcontainers",
                    "eviction",
                    "exec",
                    "log",
                    "portforward",
                    "proxy",
                ],
                fields: &[
                    "spec.nodeName",
                    "spec.restartPolicy",
                    "spec.schedulerName",
                    "spec.serviceAccountName",
                    "spec.hostNetwork",
                    "status.phase",
                    "status.podIP",
                    "status.nominatedNodeName",
                ],
                // Every kubelet watches its node's pods.
                watch_index: Some("spec.nodeName"),
                ..Default::default()
            },
        ),
        row::<core::Service>(
            &kinds::service::Service,
            Extra {
                short: &["svc"],
                all: true,
                status: true,
                subresources: &["proxy"],
                name_rule: Some(NameRule::Dns1035Label),
                ..Default::default()
            },
        ),
        row::<core::Endpoints>(
            &kinds::discovery::Endpoints,
            Extra {
                short: &["ep"],
                ..Default::default()
            },
        ),
        row::<core::ConfigMap>(
            &kinds::config::ConfigMap,
            Extra {
                short: &["cm"],
                ..Default::default()
            },
        ),
        row::<core::Secret>(
            &kinds::config::Secret,
            Extra {
                fields: &["type"],
                ..Default::default()
            },
        ),
        row::<core::ServiceAccount>(
            &kinds::config::ServiceAccount,
            Extra {
                short: &["sa"],
                subresources: &["token"],
                ..Default::default()
            },
        ),
        row::<core::Node>(
            &kinds::node::Node,
            Extra {
                short: &["no"],
                status: true,
                subresources: &["proxy"],
                keep_status: true,
                fields: &["spec.unschedulable"],
                ..Default::default()
            },
        ),
        row::<core::Event>(
            &kinds::event::Event,
            Extra {
                short: &["ev"],
                fields: &[
                    "involvedObject.kind",
                    "involvedObject.namespace",
                    "involvedObject.name",
                    "involvedObject.uid",
                    "involvedObject.apiVersion",
                    "involvedObject.resourceVersion",
                    "involvedObject.fieldPath",
                    "reason",
                    "reportingComponent",
                    "source",
                    "type",
                ],
                ..Default::default()
            },
        ),
        row::<core::LimitRange>(
            &kinds::quota::LimitRange,
            Extra {
                short: &["limits"],
                ..Default::default()
            },
        ),
        row::<core::ResourceQuota>(
            &kinds::quota::ResourceQuota,
            Extra {
                short: &["quota"],
                status: true,
                ..Default::default()
            },
        ),
        row::<core::PersistentVolume>(
            &kinds::storage::PersistentVolume,
            Extra {
                short: &["pv"],
                status: true,
                ..Default::default()
            },
        ),
        row::<core::PersistentVolumeClaim>(
            &kinds::storage::PersistentVolumeClaim,
            Extra {
                short: &["pvc"],
                status: true,
                ..Default::default()
            },
        ),
        row::<core::PodTemplate>(&kinds::pod::PodTemplate, Extra::default()),
        row::<core::ReplicationController>(
            &kinds::apps::ReplicationController,
            Extra {
                fields: &["status.replicas"],
                ..workload(&["rc"], true)
            },
        ),
        // apps/v1
        row::<apps::Deployment>(&kinds::apps::Deployment, workload(&["deploy"], true)),
        row::<apps::ReplicaSet>(
            &kinds::apps::ReplicaSet,
            Extra {
                fields: &["status.replicas"],
                ..workload(&["rs"], true)
            },
        ),
        row::<apps::StatefulSet>(&kinds::apps::StatefulSet, workload(&["sts"], true)),
        row::<apps::DaemonSet>(&kinds::apps::DaemonSet, workload(&["ds"], false)),
        row::<apps::ControllerRevision>(&kinds::apps::ControllerRevision, Extra::default()),
        // batch/v1
        row::<batch::Job>(
            &kinds::batch::Job,
            Extra {
                fields: &["status.successful"],
                ..workload(&[], false)
            },
        ),
        row::<batch::CronJob>(&kinds::batch::CronJob, workload(&["cj"], false)),
        // autoscaling
        row::<autoscaling1::HorizontalPodAutoscaler>(
            &kinds::hpa::HorizontalPodAutoscaler,
            workload(&["hpa"], false),
        ),
        row::<autoscaling2::HorizontalPodAutoscaler>(
            &kinds::hpa::HorizontalPodAutoscaler,
            workload(&["hpa"], false),
        ),
        // discovery, coordination, events, policy
        row::<discovery::EndpointSlice>(&kinds::discovery::EndpointSlice, Extra::default()),
        row::<coordination::Lease>(&kinds::discovery::Lease, Extra::default()),
        row::<events::Event>(
            &kinds::Plain,
            Extra {
                short: &["ev"],
                // Upstream's field label conversions of events.k8s.io/v1 (read on the served object).
                fields: &[
                    "reason",
                    "regarding.kind",
                    "regarding.namespace",
                    "regarding.name",
                    "regarding.uid",
                    "regarding.apiVersion",
                    "regarding.resourceVersion",
                    "regarding.fieldPath",
                    "reportingController",
                    "type",
                ],
                ..Default::default()
            },
        ),
        row::<certificates::CertificateSigningRequest>(
            &kinds::certificates::CertificateSigningRequest,
            Extra {
                short: &["csr"],
                status: true,
                subresources: &["approval"],
                fields: &["spec.signerName"],
                ..Default::default()
            },
        ),
        row::<policy::PodDisruptionBudget>(
            &kinds::policy::PodDisruptionBudget,
            Extra {
                short: &["pdb"],
                status: true,
                generation: true,
                ..Default::default()
            },
        ),
        // rbac
        row::<rbac::Role>(&kinds::rbac::Role, rbac_names()),
        row::<rbac::RoleBinding>(&kinds::rbac::RoleBinding, rbac_names()),
        row::<rbac::ClusterRole>(&kinds::rbac::Role, rbac_names()),
        row::<rbac::ClusterRoleBinding>(&kinds::rbac::RoleBinding, rbac_names()),
        // apiextensions
        row::<apiextensions::CustomResourceDefinition>(
            &kinds::custom::CustomResourceDefinition,
            Extra {
                short: &["crd", "crds"],
                generation: true,
                ..status()
            },
        ),
        // admission webhooks and policies
        row::<admission::MutatingWebhookConfiguration>(
            &kinds::admission::WebhookConfiguration,
            Extra {
                generation: true,
                ..Default::default()
            },
        ),
        row::<admission::ValidatingWebhookConfiguration>(
            &kinds::admission::WebhookConfiguration,
            Extra {
                generation: true,
                ..Default::default()
            },
        ),
        row::<admission::ValidatingAdmissionPolicy>(
            &kinds::admission::ValidatingAdmissionPolicy,
            Extra {
                generation: true,
                ..status()
            },
        ),
        row::<admission::ValidatingAdmissionPolicyBinding>(
            &kinds::admission::ValidatingAdmissionPolicyBinding,
            Extra {
                generation: true,
                ..Default::default()
            },
        ),
        // API priority and fairness: served as upstream's API (requests are limited by the
        // server's in-flight cap, not by these objects).
        row::<flowcontrol::FlowSchema>(
            &kinds::flowcontrol::FlowSchema,
            Extra {
                generation: true,
                ..status()
            },
        ),
        row::<flowcontrol::PriorityLevelConfiguration>(
            &kinds::flowcontrol::PriorityLevelConfiguration,
            Extra {
                generation: true,
                ..status()
            },
        ),
        // the aggregation layer
        row::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>(
            &kinds::discovery::ApiService,
            status(),
        ),
        // networking, storage, scheduling
        row::<networking::Ingress>(
            &kinds::networking::Ingress,
            Extra {
                short: &["ing"],
                generation: true,
                ..status()
            },
        ),
        row::<networking::IngressClass>(
            &kinds::networking::IngressClass,
            Extra {
                generation: true,
                ..Default::default()
            },
        ),
        // The ranges Services take their cluster IPs from, and the addresses taken.
        row::<networking::ServiceCIDR>(&kinds::Plain, status()),
        row::<networking::IPAddress>(
            &kinds::Plain,
            Extra {
                short: &["ip"],
                name_rule: Some(NameRule::Ip),
                ..Default::default()
            },
        ),
        row::<networking::NetworkPolicy>(
            &kinds::networking::NetworkPolicy,
            Extra {
                short: &["netpol"],
                generation: true,
                ..Default::default()
            },
        ),
        row::<storage::StorageClass>(
            &kinds::storage::StorageClass,
            Extra {
                short: &["sc"],
                ..Default::default()
            },
        ),
        // CSI objects the drivers and the attach controller of a CSI setup write; served as
        // upstream's API (no CSI driver runs here).
        row::<storage::CSIDriver>(&kinds::Plain, Extra::default()),
        row::<storage::CSINode>(&kinds::Plain, Extra::default()),
        row::<storage::CSIStorageCapacity>(&kinds::Plain, Extra::default()),
        row::<storage::VolumeAttachment>(&kinds::Plain, status()),
        row::<scheduling::PriorityClass>(
            &kinds::scheduling::PriorityClass,
            Extra {
                short: &["pc"],
                ..Default::default()
            },
        ),
        // node.k8s.io/v1: RuntimeClasses name the node's runtime handler (runc only here).
        row::<k8s_openapi::api::node::v1::RuntimeClass>(
            &kinds::scheduling::RuntimeClass,
            Extra::default(),
        ),
        // reviews
        review::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>(
            false,
            Review::SelfAccess,
        ),
        review::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(false, Review::Access),
        review::<k8s_openapi::api::authorization::v1::LocalSubjectAccessReview>(
            true,
            Review::Access,
        ),
        review::<k8s_openapi::api::authentication::v1::SelfSubjectReview>(
            false,
            Review::SelfSubject,
        ),
        review::<k8s_openapi::api::authentication::v1::TokenReview>(false, Review::Token),
        // resource metrics, gathered from the kubelets
        metrics("NodeMetrics", "nodes", false),
        metrics("PodMetrics", "pods", true),
    ]
}

/// A `metrics.k8s.io/v1beta1` resource (k8s-openapi has no types for it): read-only, answered
/// from the kubelets' stats, never stored.
fn metrics(kind: &str, plural: &str, namespaced: bool) -> ResourceInfo {
    unstored(
        ("metrics.k8s.io", "v1beta1", kind, plural),
        namespaced,
        Serving::Metrics,
    )
}

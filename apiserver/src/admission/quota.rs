//! ResourceQuota: a create in a namespace with quotas is refused (403) when it would take
//! any quota's usage past its `hard` limit. Usage is counted from the stored objects at
//! admission time, under one lock held until the object is stored, so concurrent creates
//! cannot overshoot; each quota's `status` (hard and used) is rewritten after every change
//! of what it counts, and every minute whatever changed ([`resync`]).

use crate::Api;
use crate::error::{ApiError, ApiResult};
use crate::object::{from_store, meta_str};
use crate::registry::ResourceInfo;
use minik8s_storage::{RangeRequest, Store};
use minik8s_types::Quantity;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The quota scope that selects pods by their priority class (a scope's name, not a kind).
const PRIORITY_CLASS_SCOPE: &str = "PriorityClass";

/// Quota resource names that count a core kind by another name.
const CORE_COUNTS: [(&str, &str); 6] = [
    ("pods", "pods"),
    ("services", "services"),
    ("configmaps", "configmaps"),
    ("secrets", "secrets"),
    ("persistentvolumeclaims", "persistentvolumeclaims"),
    ("replicationcontrollers", "replicationcontrollers"),
];

/// The (group, plural) a quota resource name counts.
fn source(name: &str) -> Option<(String, String)> {
    if let Some(what) = name.strip_prefix("count/") {
        let (plural, group) = what.split_once('.').unwrap_or((what, ""));
        return Some((group.into(), plural.into()));
    }
    if let Some((_, plural)) = CORE_COUNTS.iter().find(|(n, _)| *n == name) {
        return Some((String::new(), (*plural).into()));
    }
    if name == "resourcequotas" {
        return Some((String::new(), "resourcequotas".into()));
    }
    if name.starts_with("services.") {
        return Some((String::new(), "services".into()));
    }
    if name == "requests.storage" || name.ends_with(".storageclass.storage.k8s.io/requests.storage")
    {
        return Some((String::new(), "persistentvolumeclaims".into()));
    }
    if matches!(name, "cpu" | "memory" | "ephemeral-storage")
        || name.starts_with("requests.")
        || name.starts_with("limits.")
    {
        return Some((String::new(), "pods".into()));
    }
    None
}

fn terminal(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

fn parse(v: Option<&Value>) -> Option<Quantity> {
    match v? {
        Value::String(s) => Quantity::parse(s).ok(),
        Value::Number(n) => n.as_i64().map(Quantity::from_units),
        _ => None,
    }
}

/// `requests.<r>` or `limits.<r>` summed over a pod's containers; `Err` names a container
/// that does not set it (quota then requires it).
fn pod_sum(pod: &Value, kind: &str, res: &str) -> Result<Quantity, ()> {
    let mut total = Quantity::ZERO;
    // Extended resource names hold a `/` (`example.com/dongle`), escaped in a JSON pointer.
    let res = res.replace('~', "~0").replace('/', "~1");
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        total += parse(c.pointer(&format!("/resources/{kind}/{res}"))).ok_or(())?;
    }
    // Init containers run one at a time: the pod needs the larger of their maximum and
    // the containers' sum.
    for c in pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(q) = parse(c.pointer(&format!("/resources/{kind}/{res}"))) {
            total = total.max(q);
        }
    }
    Ok(total)
}

/// As [`pod_sum`], counting containers that do not set the resource as zero.
fn pod_sum_present(pod: &Value, kind: &str, res: &str) -> Quantity {
    let key = res.replace('~', "~0").replace('/', "~1");
    let mut total = Quantity::ZERO;
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        total += parse(c.pointer(&format!("/resources/{kind}/{key}"))).unwrap_or_default();
    }
    for c in pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(q) = parse(c.pointer(&format!("/resources/{kind}/{key}"))) {
            total = total.max(q);
        }
    }
    total
}

/// What one object adds to the usage a quota resource name measures; `Err` when the
/// object must say (a pod without the request a compute quota tracks).
fn usage(name: &str, obj: &Value) -> Result<Quantity, String> {
    if name.starts_with("count/") || CORE_COUNTS.iter().any(|(n, _)| *n == name) {
        if name.ends_with("pods") && terminal(obj) {
            return Ok(Quantity::ZERO);
        }
        return Ok(Quantity::from_units(1));
    }
    match name {
        "resourcequotas" => Ok(Quantity::from_units(1)),
        "services.nodeports" => {
            let ty = obj.pointer("/spec/type").and_then(Value::as_str);
            if !matches!(ty, Some("NodePort" | "LoadBalancer")) {
                return Ok(Quantity::ZERO);
            }
            let n = obj
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            Ok(Quantity::from_units(n as i64))
        }
        "services.loadbalancers" => Ok(Quantity::from_units(i64::from(
            obj.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer"),
        ))),
        "requests.storage" => {
            Ok(parse(obj.pointer("/spec/resources/requests/storage")).unwrap_or_default())
        }
        _ => {
            if terminal(obj) {
                return Ok(Quantity::ZERO);
            }
            let (kind, res) = match name.split_once('.') {
                Some(("limits", r)) => ("limits", r),
                Some(("requests", r)) => ("requests", r),
                _ => ("requests", name),
            };
            // Only CPU and memory must be set by every container (upstream's backward
            // compatible `validationSet`); other resources count what is set.
            if matches!(res, "cpu" | "memory") {
                pod_sum(obj, kind, res).map_err(|()| format!("must specify {name}"))
            } else {
                Ok(pod_sum_present(obj, kind, res))
            }
        }
    }
}

fn hard(quota: &Value) -> BTreeMap<String, Quantity> {
    quota
        .pointer("/spec/hard")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| parse(Some(v)).map(|q| (k.clone(), q)))
        .collect()
}

/// A pod's QoS is BestEffort: no container (init containers included) sets a CPU or memory
/// request or limit.
fn best_effort(pod: &Value) -> bool {
    ["/spec/containers", "/spec/initContainers"]
        .iter()
        .all(|list| {
            pod.pointer(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .all(|c| {
                    ["requests", "limits"].iter().all(|k| {
                        c.pointer(&format!("/resources/{k}"))
                            .and_then(Value::as_object)
                            .is_none_or(|m| !m.contains_key("cpu") && !m.contains_key("memory"))
                    })
                })
        })
}

/// Whether a quota's scopes (`spec.scopes` and `spec.scopeSelector`) take in `obj`, an
/// object of `res`, as upstream's `podMatchesScopeFunc`: a scoped quota counts only pods.
fn in_scope(quota: &Value, res: &ResourceInfo, obj: &Value) -> bool {
    let mut scopes: Vec<(String, String, Vec<String>)> = quota
        .pointer("/spec/scopes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|s| (s.to_owned(), "Exists".to_owned(), Vec::new()))
        .collect();
    for e in quota
        .pointer("/spec/scopeSelector/matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        scopes.push((
            e["scopeName"].as_str().unwrap_or_default().to_owned(),
            e["operator"].as_str().unwrap_or_default().to_owned(),
            crate::object::strings_at(e, "/values"),
        ));
    }
    if scopes.is_empty() {
        return true;
    }
    if !(res.group.is_empty() && res.plural == "pods") {
        return false;
    }
    scopes.iter().all(|(scope, op, values)| {
        let terminating = obj
            .pointer("/spec/activeDeadlineSeconds")
            .and_then(Value::as_i64)
            .is_some_and(|d| d >= 0);
        let matched = match scope.as_str() {
            "Terminating" => terminating,
            "NotTerminating" => !terminating,
            "BestEffort" => best_effort(obj),
            "NotBestEffort" => !best_effort(obj),
            PRIORITY_CLASS_SCOPE => {
                let class = obj
                    .pointer("/spec/priorityClassName")
                    .and_then(Value::as_str);
                return match op.as_str() {
                    "In" => class.is_some_and(|c| values.iter().any(|v| v == c)),
                    "NotIn" => class.is_none_or(|c| !values.iter().any(|v| v == c)),
                    "Exists" => class.is_some_and(|c| !c.is_empty()),
                    "DoesNotExist" => class.is_none_or(str::is_empty),
                    _ => false,
                };
            }
            _ => false,
        };
        match op.as_str() {
            "DoesNotExist" | "NotIn" => !matched,
            _ => matched,
        }
    })
}

/// The namespace's quotas, read in short pages: most namespaces have none or a few, and a
/// short read is answered without a hand-off to a blocking thread (this runs on every create).
async fn quotas(api: &Api, ns: &str) -> ApiResult<Vec<(String, i64, Value)>> {
    let mut out = Vec::new();
    let mut req = RangeRequest {
        prefix: format!("/registry/core/resourcequotas/{ns}/"),
        limit: 64,
        ..Default::default()
    };
    loop {
        let page = api.store.range(req.clone()).await?;
        for kv in &page.kvs {
            out.push((kv.key.clone(), kv.mod_revision, from_store(kv)?));
        }
        if !page.more {
            return Ok(out);
        }
        // Later pages read at the first page's revision, as one consistent list.
        req.start_after = page.kvs.last().map(|kv| kv.key.clone());
        req.revision = page.revision;
    }
}

/// What every object of (group, plural) in a namespace that the quota's scopes take in adds
/// up to, per quota name.
async fn used(
    api: &Api,
    ns: &str,
    quota: &Value,
    names: &[String],
) -> ApiResult<BTreeMap<String, Quantity>> {
    let mut by_source: BTreeMap<(String, String), Vec<&String>> = BTreeMap::new();
    for n in names {
        if let Some(s) = source(n) {
            by_source.entry(s).or_default().push(n);
        }
    }
    let mut out = BTreeMap::new();
    for ((group, plural), names) in by_source {
        let Some(res) = api
            .registry
            .all()
            .into_iter()
            .find(|r| r.group == group && r.plural == plural)
        else {
            continue;
        };
        let listed = api
            .store
            .range(RangeRequest::prefix(res.scope_prefix(Some(ns))))
            .await?;
        for kv in &listed.kvs {
            let obj = from_store(kv)?;
            if !in_scope(quota, &res, &obj) {
                continue;
            }
            for n in &names {
                let q = usage(n, &obj).unwrap_or_default();
                *out.entry((*n).clone()).or_insert(Quantity::ZERO) += q;
            }
        }
        for n in names {
            out.entry(n.clone()).or_insert(Quantity::ZERO);
        }
    }
    Ok(out)
}

/// Serialises quota-checked creates (held until the object is stored and usage refreshed).
pub type Guard = tokio::sync::MutexGuard<'static, ()>;

static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Checks a create against the namespace's quotas; `Some(guard)` when the namespace has
/// quotas (keep it until [`refresh`] has run), `None` when it has none.
pub async fn admit(
    api: &Api,
    res: &ResourceInfo,
    ns: &str,
    obj: &Value,
) -> ApiResult<Option<Guard>> {
    if ns.is_empty() || quotas(api, ns).await?.is_empty() {
        return Ok(None);
    }
    let guard = LOCK.lock().await;
    let all = quotas(api, ns).await?;
    let counts_this = |n: &str| source(n).is_some_and(|(g, p)| g == res.group && p == res.plural);
    for (_, _, quota) in &all {
        let hard = hard(quota);
        let names: Vec<String> = hard.keys().filter(|n| counts_this(n)).cloned().collect();
        if names.is_empty() || !in_scope(quota, res, obj) {
            continue;
        }
        let qname = meta_str(quota, "name").unwrap_or_default();
        let forbidden = |why: String| {
            ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: {why}",
                crate::error::qualified(&res.group, &res.plural),
                meta_str(obj, "name").unwrap_or_default()
            ))
        };
        let mut requested = Vec::new();
        for n in &names {
            let q = usage(n, obj).map_err(|e| forbidden(format!("failed quota: {qname}: {e}")))?;
            if q > Quantity::ZERO {
                requested.push((n.clone(), q));
            }
        }
        if requested.is_empty() {
            continue;
        }
        let used = used(api, ns, quota, &names).await?;
        let over: Vec<&(String, Quantity)> = requested
            .iter()
            .filter(|(n, q)| used.get(n).copied().unwrap_or_default() + *q > hard[n])
            .collect();
        if !over.is_empty() {
            let list = |f: &dyn Fn(&str, Quantity) -> Quantity| {
                over.iter()
                    .map(|(n, q)| format!("{n}={}", f(n, *q)))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            return Err(forbidden(format!(
                "exceeded quota: {qname}, requested: {}, used: {}, limited: {}",
                list(&|_, q| q),
                list(&|n, _| used.get(n).copied().unwrap_or_default()),
                list(&|n, _| hard[n]),
            )));
        }
    }
    Ok(Some(guard))
}

/// Rewrites `status.hard` and `status.used` of every quota in a namespace from the stored
/// objects.
pub async fn refresh(api: &Api, ns: &str) -> ApiResult<()> {
    if ns.is_empty() {
        return Ok(());
    }
    for _ in 0..4 {
        let mut raced = false;
        for (key, rev, mut quota) in quotas(api, ns).await? {
            let hard = hard(&quota);
            let names: Vec<String> = hard.keys().cloned().collect();
            let used = used(api, ns, &quota, &names).await?;
            let fmt = |m: &BTreeMap<String, Quantity>| -> Value {
                m.iter()
                    .map(|(k, v)| (k.clone(), json!(v.to_string())))
                    .collect::<serde_json::Map<_, _>>()
                    .into()
            };
            let status = json!({"hard": fmt(&hard), "used": fmt(&used)});
            if quota.get("status") == Some(&status) {
                continue;
            }
            quota["status"] = status;
            match api
                .store
                .update(&key, crate::object::to_store(&mut quota), rev)
                .await
            {
                Ok(_) => {}
                Err(minik8s_storage::Error::Conflict { .. }) => raced = true,
                Err(minik8s_storage::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !raced {
            break;
        }
    }
    Ok(())
}

/// How often every quota's status is recounted whatever changed, by default (upstream's
/// controller resyncs every 5 minutes): a status written by hand, or counts that drifted,
/// are put right within this.
pub const RESYNC: std::time::Duration = std::time::Duration::from_secs(60);

/// Recounts every namespace's quotas every `quota_resync`, until shutdown.
pub async fn resync(api: std::sync::Arc<Api>) {
    loop {
        tokio::select! {
            _ = api.shutdown.cancelled() => return,
            _ = tokio::time::sleep(api.quota_resync) => {}
        }
        let listed = match api
            .store
            .range(RangeRequest::prefix("/registry/core/resourcequotas/"))
            .await
        {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "quota resync: listing quotas failed");
                continue;
            }
        };
        let mut namespaces: Vec<String> = listed
            .kvs
            .iter()
            .filter_map(|kv| {
                let rest = kv.key.strip_prefix("/registry/core/resourcequotas/")?;
                Some(rest.split('/').next()?.to_owned())
            })
            .collect();
        namespaces.dedup();
        for ns in namespaces {
            if let Err(e) = refresh(&api, &ns).await {
                tracing::warn!(namespace = %ns, error = %e.message, "quota resync failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_usage_sums_containers_and_requires_requests() {
        let pod = json!({"spec": {"containers": [
            {"resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
            {"resources": {"requests": {"cpu": "1"}}},
        ]}});
        assert_eq!(usage("requests.cpu", &pod).unwrap(), Quantity(1250));
        let dongle = json!({"spec": {"containers": [{"resources": {"requests": {"example.com/dongle": "2"}}}]}});
        assert_eq!(
            usage("requests.example.com/dongle", &dongle).unwrap(),
            Quantity::from_units(2)
        );
        assert_eq!(usage("cpu", &pod).unwrap(), Quantity(1250));
        // The bare ephemeral-storage name counts pods' requests, as cpu and memory do.
        let scratch = json!({"spec": {"containers": [{"resources": {"requests": {"ephemeral-storage": "30Gi"}}}]}});
        assert_eq!(
            source("ephemeral-storage"),
            Some((String::new(), "pods".into()))
        );
        assert_eq!(
            usage("ephemeral-storage", &scratch).unwrap(),
            usage("requests.ephemeral-storage", &scratch).unwrap()
        );
        assert_eq!(
            usage("requests.memory", &pod).unwrap_err(),
            "must specify requests.memory"
        );
        assert_eq!(usage("pods", &pod).unwrap(), Quantity::from_units(1));
        let done = json!({"status": {"phase": "Succeeded"}});
        assert_eq!(usage("pods", &done).unwrap(), Quantity::ZERO);
    }

    #[test]
    fn quota_names_map_to_what_they_count() {
        assert_eq!(source("pods"), Some(("".into(), "pods".into())));
        assert_eq!(source("limits.memory"), Some(("".into(), "pods".into())));
        assert_eq!(
            source("count/deployments.apps"),
            Some(("apps".into(), "deployments".into()))
        );
        assert_eq!(
            source("count/configmaps"),
            Some(("".into(), "configmaps".into()))
        );
        assert_eq!(
            source("services.nodeports"),
            Some(("".into(), "services".into()))
        );
        assert_eq!(source("bogus"), None);
    }

    #[test]
    fn scoped_quotas_take_in_only_the_pods_their_scopes_name() {
        let res = crate::registry::Registry::with_builtins()
            .lookup("", "v1", "pods")
            .unwrap();
        let cms = crate::registry::Registry::with_builtins()
            .lookup("", "v1", "configmaps")
            .unwrap();
        let be = json!({"spec": {"containers": [{"name": "c"}]}});
        let burstable = json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}});
        let q = |scopes: Value| json!({"spec": {"hard": {"pods": "1"}, "scopes": scopes}});
        assert!(in_scope(&q(json!(["BestEffort"])), &res, &be));
        assert!(!in_scope(&q(json!(["BestEffort"])), &res, &burstable));
        assert!(in_scope(&q(json!(["NotBestEffort"])), &res, &burstable));
        assert!(!in_scope(&q(json!(["Terminating"])), &res, &be));
        let mut terminating = be.clone();
        terminating["spec"]["activeDeadlineSeconds"] = json!(30);
        assert!(in_scope(
            &q(json!(["Terminating", "BestEffort"])),
            &res,
            &terminating
        ));
        assert!(!in_scope(&q(json!(["BestEffort"])), &cms, &json!({})));
        assert!(in_scope(&json!({"spec": {}}), &cms, &json!({})));
        let by_class = json!({"spec": {"scopeSelector": {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}});
        let mut high = be.clone();
        high["spec"]["priorityClassName"] = json!("high");
        assert!(in_scope(&by_class, &res, &high));
        assert!(!in_scope(&by_class, &res, &be));
    }
}

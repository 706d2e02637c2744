//! Container environment: `env` (plain values, `$(VAR)` expansion, fieldRef, resourceFieldRef,
//! configMapKeyRef, secretKeyRef) and `envFrom`, resolved against the API as upstream does.

use crate::cri;
use crate::error::{Error, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeMap;

/// What a fieldRef or downward API file may name.
pub fn field(pod: &Pod, path: &str, pod_ip: Option<&str>, host_ip: Option<&str>) -> Result<String> {
    let selected =
        |map: &BTreeMap<String, String>, key: &str| map.get(key).cloned().unwrap_or_default();
    let spec = pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "metadata.labels" => lines(pod.labels()),
        "metadata.annotations" => lines(pod.annotations()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => pod_ip.unwrap_or_default().to_owned(),
        "status.hostIP" | "status.hostIPs" => host_ip.unwrap_or_default().to_owned(),
        p => {
            let key = |prefix: &str| {
                p.strip_prefix(prefix)
                    .and_then(|r| r.strip_suffix("']"))
                    .map(str::to_owned)
            };
            if let Some(k) = key("metadata.labels['") {
                selected(pod.labels(), &k)
            } else if let Some(k) = key("metadata.annotations['") {
                selected(pod.annotations(), &k)
            } else {
                return Err(Error::Pod(format!("unsupported fieldPath {p:?}")));
            }
        }
    })
}

/// `key="value"` lines, sorted, as the downward API writes maps.
fn lines(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A resourceFieldRef's value (`limits.cpu`, `requests.memory`, …) in `divisor` units.
pub fn resource_field(c: &Container, resource: &str, divisor: Option<&str>) -> Result<String> {
    let (which, name) = resource
        .split_once('.')
        .ok_or_else(|| Error::Pod(format!("unsupported resource {resource:?}")))?;
    let r = c.resources.as_ref();
    let map = if which == "limits" {
        r.and_then(|r| r.limits.as_ref())
    } else {
        r.and_then(|r| r.requests.as_ref())
    };
    let given = map
        .and_then(|m| m.get(name))
        .and_then(|q| minik8s_types::Quantity::parse(&q.0).ok());
    // Without a limit, a CPU or memory limit reads as the node's allocatable, as upstream's
    // MergeContainerResourceLimits (allocatable is the capacity here).
    let q = match (given, which, name) {
        (Some(q), _, _) => q,
        (None, "limits", "cpu") => minik8s_types::Quantity::from_units(crate::node::cpus() as i64),
        (None, "limits", "memory") => {
            minik8s_types::Quantity::from_units(crate::node::memory() as i64)
        }
        (None, _, _) => minik8s_types::Quantity::default(),
    };
    let divisor = divisor
        .and_then(|d| minik8s_types::Quantity::parse(d).ok())
        .filter(|d| d.millis() > 0)
        .unwrap_or(minik8s_types::Quantity::from_units(1));
    // Rounded up, as upstream's ExtractContainerResourceValue.
    let n = (q.millis() + divisor.millis() - 1) / divisor.millis();
    Ok(n.to_string())
}

/// Expands `$(VAR)` references to earlier variables; `$$` escapes.
pub fn expand(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(r) = after.strip_prefix('(')
            && let Some(end) = r.find(')')
        {
            let name = &r[..end];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = &r[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

async fn config_map(client: &Client, ns: &str, name: &str) -> Result<Option<ConfigMap>> {
    Ok(Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

async fn secret(client: &Client, ns: &str, name: &str) -> Result<Option<Secret>> {
    Ok(Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

/// A ConfigMap's or Secret's entries as strings.
pub fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    data.extend(
        cm.binary_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone())),
    );
    data
}

/// A Secret's entries.
pub fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = s
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    data.extend(
        s.string_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes())),
    );
    data
}

/// Reads a ConfigMap's entries (`None` when it does not exist).
pub async fn config_map_entries(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    Ok(config_map(client, ns, name)
        .await?
        .map(|c| config_map_data(&c)))
}

/// Reads a Secret's entries (`None` when it does not exist).
pub async fn secret_entries(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    Ok(secret(client, ns, name).await?.map(|s| secret_data(&s)))
}

/// The container's environment, in order, as CRI key/values.
pub async fn resolve(
    client: &Client,
    pod: &Pod,
    c: &Container,
    pod_ip: Option<&str>,
    host_ip: Option<&str>,
) -> Result<Vec<cri::KeyValue>> {
    let ns = pod.namespace().unwrap_or_default();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut set = |vars: &mut BTreeMap<String, String>, k: String, v: String| {
        if !vars.contains_key(&k) {
            order.push(k.clone());
        }
        vars.insert(k, v);
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let entries = if let Some(r) = &from.config_map_ref {
            match config_map_entries(client, &ns, &r.name).await? {
                Some(e) => e,
                None if r.optional == Some(true) => continue,
                None => return Err(Error::Pod(format!("configmap \"{}\" not found", r.name))),
            }
        } else if let Some(r) = &from.secret_ref {
            match secret_entries(client, &ns, &r.name).await? {
                Some(e) => e,
                None if r.optional == Some(true) => continue,
                None => return Err(Error::Pod(format!("secret \"{}\" not found", r.name))),
            }
        } else {
            continue;
        };
        for (k, v) in entries {
            set(
                &mut vars,
                format!("{prefix}{k}"),
                String::from_utf8_lossy(&v).into_owned(),
            );
        }
    }
    for e in c.env.iter().flatten() {
        let value = match &e.value_from {
            None => expand(e.value.as_deref().unwrap_or_default(), &vars),
            Some(from) => {
                if let Some(f) = &from.field_ref {
                    field(pod, &f.field_path, pod_ip, host_ip)?
                } else if let Some(r) = &from.resource_field_ref {
                    resource_field(c, &r.resource, r.divisor.as_ref().map(|d| d.0.as_str()))?
                } else if let Some(r) = &from.config_map_key_ref {
                    let entries = config_map_entries(client, &ns, &r.name).await?;
                    match entries.and_then(|mut e| e.remove(&r.key)) {
                        Some(v) => String::from_utf8_lossy(&v).into_owned(),
                        None if r.optional == Some(true) => continue,
                        None => {
                            return Err(Error::Pod(format!(
                                "couldn't find key {} in ConfigMap {ns}/{}",
                                r.key, r.name
                            )));
                        }
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let entries = secret_entries(client, &ns, &r.name).await?;
                    match entries.and_then(|mut e| e.remove(&r.key)) {
                        Some(v) => String::from_utf8_lossy(&v).into_owned(),
                        None if r.optional == Some(true) => continue,
                        None => {
                            return Err(Error::Pod(format!(
                                "couldn't find key {} in Secret {ns}/{}",
                                r.key, r.name
                            )));
                        }
                    }
                } else {
                    continue;
                }
            }
        };
        set(&mut vars, e.name.clone(), value);
    }
    Ok(order
        .into_iter()
        .map(|k| cri::KeyValue {
            value: vars.get(&k).cloned().unwrap_or_default(),
            key: k,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_without_a_value_read_as_the_node_allocatable() {
        let c = Container::default();
        assert_eq!(
            resource_field(&c, "limits.cpu", None).unwrap(),
            crate::node::cpus().to_string()
        );
        assert_eq!(
            resource_field(&c, "limits.memory", Some("1")).unwrap(),
            crate::node::memory().to_string()
        );
        assert_eq!(resource_field(&c, "requests.memory", None).unwrap(), "0");
    }

    #[test]
    fn dollar_references_expand_to_earlier_variables_and_double_dollars_escape() {
        let vars = BTreeMap::from([("A".to_owned(), "x".to_owned())]);
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &vars), "x-$(B)-$(A)-$");
    }
}

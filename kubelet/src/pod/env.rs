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

/// The environment variables upstream gives a container for Services (`envvars.FromServices`):
/// `<NAME>_SERVICE_HOST`, `_SERVICE_PORT` (and one per named port) and the Docker-link
/// `<NAME>_PORT…` set, for every Service with a cluster IP.
pub fn service_links(services: &[k8s_openapi::api::core::v1::Service]) -> Vec<(String, String)> {
    let var = |s: &str| s.replace('-', "_").to_uppercase();
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let ip = spec.cluster_ip.as_deref().unwrap_or_default();
        let ports = spec.ports.as_deref().unwrap_or_default();
        if ip.is_empty() || ip == "None" || ports.is_empty() {
            continue;
        }
        let prefix = var(&svc.name_any());
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_owned()));
        out.push((format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string()));
        for p in ports {
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!("{prefix}_SERVICE_PORT_{}", var(n)),
                    p.port.to_string(),
                ));
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let url = format!("{}://{ip}:{}", proto.to_lowercase(), p.port);
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.push((pp.clone(), url));
            out.push((format!("{pp}_PROTO"), proto.to_lowercase()));
            out.push((format!("{pp}_PORT"), p.port.to_string()));
            out.push((format!("{pp}_ADDR"), ip.to_owned()));
        }
    }
    out
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
    // Services' Docker-link variables first (the container's own may override them): the
    // pod namespace's Services with enableServiceLinks, and `default/kubernetes` always.
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    let mut services: Vec<k8s_openapi::api::core::v1::Service> = Vec::new();
    let svc_api =
        |ns: &str| Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), ns);
    if links {
        match svc_api(&ns).list(&Default::default()).await {
            Ok(l) => services.extend(l.items),
            Err(e) => {
                tracing::warn!(namespace = %ns, error = %e, "listing services for their variables")
            }
        }
    }
    if ns != "default" || !links {
        match svc_api("default").get_opt("kubernetes").await {
            Ok(Some(k)) => services.push(k),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "reading the kubernetes service for its variables")
            }
        }
    }
    for (k, v) in service_links(&services) {
        set(&mut vars, k, v);
    }
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
    fn services_give_upstreams_link_variables() {
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fooservice"},
            "spec": {"clusterIP": "10.96.0.9", "ports": [
                {"port": 8765, "protocol": "TCP"}, {"name": "udp-x", "port": 53, "protocol": "UDP"}]}}))
        .unwrap();
        let vars: BTreeMap<String, String> = service_links(&[svc]).into_iter().collect();
        assert_eq!(vars["FOOSERVICE_SERVICE_HOST"], "10.96.0.9");
        assert_eq!(vars["FOOSERVICE_SERVICE_PORT"], "8765");
        assert_eq!(vars["FOOSERVICE_SERVICE_PORT_UDP_X"], "53");
        assert_eq!(vars["FOOSERVICE_PORT"], "tcp://10.96.0.9:8765");
        assert_eq!(vars["FOOSERVICE_PORT_8765_TCP_PROTO"], "tcp");
        assert_eq!(vars["FOOSERVICE_PORT_8765_TCP_PORT"], "8765");
        assert_eq!(vars["FOOSERVICE_PORT_8765_TCP_ADDR"], "10.96.0.9");
        assert_eq!(vars["FOOSERVICE_PORT_53_UDP"], "udp://10.96.0.9:53");
    }

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

//! Services (upstream's `pkg/registry/core/service`): defaults, validation, the cluster IP
//! and node port allocation around every write, and the table.

use super::{Row, Strategy, list, map_text, or_none, s};
use crate::Api;
use crate::error::{ApiResult, Cause};
use crate::registry::ResourceInfo;
use crate::registry::alloc::Reservation;
use crate::registry::defaults::{child, set_default};
use crate::registry::validation::specs;
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// `core/v1` Service.
pub struct Service;

impl Strategy for Service {
    fn merge_key(&self, path: &[String]) -> Option<&'static str> {
        super::ends_with(path, "spec", "ports").then_some("port")
    }

    fn apply_keys(&self, path: &[String]) -> Option<&'static [&'static str]> {
        super::ends_with(path, "spec", "ports").then_some(&["port", "protocol"])
    }

    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "type", json!("ClusterIP"));
        set_default(spec, "sessionAffinity", json!("None"));
        if spec.get("sessionAffinity").and_then(Value::as_str) == Some("ClientIP") {
            let config = child(child(spec, "sessionAffinityConfig"), "clientIP");
            set_default(config, "timeoutSeconds", json!(10800));
        }
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports {
                set_default(p, "protocol", json!("TCP"));
                // Upstream: an unset, 0 or "" targetPort is the port (clients built on Go
                // structs send 0 for unset).
                if matches!(p.get("targetPort"), Some(t) if *t == json!(0) || *t == json!("")) {
                    p.as_object_mut().map(|m| m.remove("targetPort"));
                }
                let port = p.get("port").cloned().unwrap_or(Value::Null);
                set_default(p, "targetPort", port);
            }
        }
        if spec.get("type").and_then(Value::as_str) != Some("ExternalName") {
            set_default(spec, "internalTrafficPolicy", json!("Cluster"));
        }
    }

    fn initial_status(&self, obj: &mut Value) {
        obj["status"] = json!({"loadBalancer": {}});
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::service(obj.get("spec"), causes);
    }

    fn allocates(&self) -> bool {
        true
    }

    /// Fills in or checks the cluster IPs and node ports.
    fn allocate<'a, 'b>(
        &'a self,
        api: &'a Api,
        key: &'b str,
        obj: &'b mut Value,
        old: Option<&'b Value>,
    ) -> BoxFuture<'b, ApiResult<Option<Reservation<'a>>>>
    where
        'a: 'b,
    {
        Box::pin(async move { api.alloc.assign(&api.store, key, obj, old).await.map(Some) })
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        let ty = s(o, "/spec/type");
        row.name(o);
        row.col("Type", "string", 0, || ty.clone());
        row.col("Cluster-IP", "string", 0, || {
            or_none(s(o, "/spec/clusterIP"))
        });
        row.col("External-IP", "string", 0, || {
            or_none(match ty.as_str() {
                "ExternalName" => s(o, "/spec/externalName"),
                "LoadBalancer" => {
                    let ips: Vec<String> = list(o, "/status/loadBalancer/ingress")
                        .iter()
                        .map(|x| s(x, "/ip"))
                        .filter(|x| !x.is_empty())
                        .collect();
                    if ips.is_empty() {
                        "<pending>".into()
                    } else {
                        ips.join(",")
                    }
                }
                _ => list(o, "/spec/externalIPs")
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
            })
        });
        row.col("Port(s)", "string", 0, || service_ports(o));
        row.age(o);
        row.col("Selector", "string", 1, || {
            or_none(map_text(o.pointer("/spec/selector")))
        });
    }
}

/// The PORT(S) cell: `port[:nodePort]/protocol`, comma-separated.
fn service_ports(svc: &Value) -> String {
    let parts: Vec<String> = list(svc, "/spec/ports")
        .iter()
        .map(|p| {
            let proto = s(p, "/protocol");
            let proto = if proto.is_empty() {
                "TCP".into()
            } else {
                proto
            };
            match p.get("nodePort") {
                Some(n) => format!("{}:{}/{proto}", s(p, "/port"), n),
                None => format!("{}/{proto}", s(p, "/port")),
            }
        })
        .collect();
    or_none(parts.join(","))
}

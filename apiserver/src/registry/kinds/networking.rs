//! Ingresses, IngressClasses and NetworkPolicies (upstream's `pkg/registry/networking/*`).

use super::{Row, Strategy, immutable, len, list, or_none, s, selector_text};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::validation::{label_selector, specs};
use serde_json::Value;

/// `networking.k8s.io/v1` Ingress.
pub struct Ingress;

impl Strategy for Ingress {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::ingress(obj.get("spec"), causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Class", "string", 0, || {
            or_none(s(o, "/spec/ingressClassName"))
        });
        row.col("Hosts", "string", 0, || {
            let hosts: Vec<String> = list(o, "/spec/rules")
                .iter()
                .map(|r| s(r, "/host"))
                .filter(|h| !h.is_empty())
                .collect();
            if hosts.is_empty() {
                "*".into()
            } else {
                hosts.join(",")
            }
        });
        row.col("Address", "string", 0, || "");
        row.col("Ports", "string", 0, || {
            if len(o, "/spec/tls") > 0 {
                "80, 443"
            } else {
                "80"
            }
        });
        row.age(o);
    }
}

/// `networking.k8s.io/v1` IngressClass.
pub struct IngressClass;

impl Strategy for IngressClass {
    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, &[("/spec/controller", "spec.controller")], causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Controller", "string", 0, || s(o, "/spec/controller"));
        row.col("Parameters", "string", 0, || {
            match o.pointer("/spec/parameters") {
                Some(p) => format!("{}/{}", s(p, "/kind"), s(p, "/name")),
                None => "<none>".into(),
            }
        });
        row.age(o);
    }
}

/// `networking.k8s.io/v1` NetworkPolicy.
pub struct NetworkPolicy;

impl Strategy for NetworkPolicy {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        let spec = obj.get("spec");
        label_selector(
            spec.and_then(|s| s.get("podSelector")),
            "spec.podSelector",
            causes,
        );
        for dir in ["ingress", "egress"] {
            let peers = if dir == "ingress" { "from" } else { "to" };
            for (i, rule) in spec.map(|s| specs::items(s, dir)).into_iter().flatten() {
                for (j, peer) in specs::items(rule, peers) {
                    for sel in ["podSelector", "namespaceSelector"] {
                        label_selector(
                            peer.get(sel),
                            &format!("spec.{dir}[{i}].{peers}[{j}].{sel}"),
                            causes,
                        );
                    }
                }
            }
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Pod-Selector", "string", 0, || {
            selector_text(o.pointer("/spec/podSelector").unwrap_or(&Value::Null))
        });
        row.age(o);
    }
}

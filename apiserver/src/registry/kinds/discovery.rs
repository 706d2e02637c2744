//! Endpoints, EndpointSlices, Leases and APIServices: kinds whose only rules are their
//! tables (upstream's printers for each).

use super::{Row, Strategy, list, or_none, s};
use crate::registry::ResourceInfo;
use serde_json::Value;

/// At most three entries, then `+ N more...`, as upstream's printers shorten lists.
fn first_three(items: &[String]) -> String {
    if items.len() > 3 {
        format!("{} + {} more...", items[..3].join(","), items.len() - 3)
    } else {
        items.join(",")
    }
}

/// `core/v1` Endpoints.
pub struct Endpoints;

impl Strategy for Endpoints {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Endpoints", "string", 0, || {
            let mut eps = Vec::new();
            for subset in list(o, "/subsets") {
                for a in list(subset, "/addresses") {
                    for p in list(subset, "/ports") {
                        eps.push(format!("{}:{}", s(a, "/ip"), s(p, "/port")));
                    }
                }
            }
            or_none(first_three(&eps))
        });
        row.age(o);
    }
}

/// `discovery.k8s.io/v1` EndpointSlice.
pub struct EndpointSlice;

impl Strategy for EndpointSlice {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("AddressType", "string", 0, || s(o, "/addressType"));
        row.col("Ports", "string", 0, || {
            let ports: Vec<String> = list(o, "/ports").iter().map(|p| s(p, "/port")).collect();
            or_none(ports.join(","))
        });
        row.col("Endpoints", "string", 0, || {
            let addrs: Vec<String> = list(o, "/endpoints")
                .iter()
                .flat_map(|e| list(e, "/addresses"))
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect();
            or_none(first_three(&addrs))
        });
        row.age(o);
    }
}

/// `coordination.k8s.io/v1` Lease.
pub struct Lease;

impl Strategy for Lease {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Holder", "string", 0, || s(o, "/spec/holderIdentity"));
        row.age(o);
    }
}

/// `apiregistration.k8s.io/v1` APIService.
pub struct ApiService;

impl Strategy for ApiService {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Service", "string", 0, || {
            match o.pointer("/spec/service").filter(|v| !v.is_null()) {
                Some(svc) => format!("{}/{}", s(svc, "/namespace"), s(svc, "/name")),
                None => "Local".into(),
            }
        });
        row.col("Available", "string", 0, || {
            list(o, "/status/conditions")
                .iter()
                .find(|c| c["type"] == "Available")
                .map_or("Unknown".to_owned(), |c| {
                    let (status, reason) = (s(c, "/status"), s(c, "/reason"));
                    if status == "True" || reason.is_empty() {
                        status
                    } else {
                        format!("{status} ({reason})")
                    }
                })
        });
        row.age(o);
    }
}

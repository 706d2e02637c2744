//! Nodes (upstream's `pkg/registry/core/node` and its printer): their status is theirs
//! on create (the kubelet registers with it), and the table shows readiness and roles.

use super::{Row, Strategy, list, or_none, s};
use crate::object::meta;
use crate::registry::ResourceInfo;
use serde_json::{Value, json};

/// `core/v1` Node.
pub struct Node;

impl Strategy for Node {
    fn merge_key(&self, path: &[String]) -> Option<&'static str> {
        super::ends_with(path, "status", "addresses").then_some("type")
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        let addr = |t: &str| {
            list(o, "/status/addresses")
                .iter()
                .find(|x| s(x, "/type") == t)
                .map(|x| s(x, "/address"))
                .unwrap_or_default()
        };
        row.name(o);
        row.col("Status", "string", 0, || node_status(o));
        row.col("Roles", "string", 0, || {
            let mut roles: Vec<&str> = meta(o)
                .get("labels")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|l| l.keys())
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .filter(|r| !r.is_empty())
                .collect();
            roles.sort();
            or_none(roles.join(","))
        });
        row.age(o);
        row.col("Version", "string", 0, || {
            s(o, "/status/nodeInfo/kubeletVersion")
        });
        row.col("Internal-IP", "string", 1, || or_none(addr("InternalIP")));
        row.col("External-IP", "string", 1, || or_none(addr("ExternalIP")));
        row.col("OS-Image", "string", 1, || s(o, "/status/nodeInfo/osImage"));
        row.col("Kernel-Version", "string", 1, || {
            s(o, "/status/nodeInfo/kernelVersion")
        });
        row.col("Container-Runtime", "string", 1, || {
            s(o, "/status/nodeInfo/containerRuntimeVersion")
        });
    }
}

/// Ready, NotReady or Unknown from the Ready condition, then SchedulingDisabled if cordoned.
fn node_status(node: &Value) -> String {
    let ready = list(node, "/status/conditions")
        .iter()
        .find(|c| s(c, "/type") == "Ready");
    let mut out = vec![match ready.map(|c| s(c, "/status")) {
        Some(st) if st == "True" => "Ready".to_owned(),
        Some(_) => "NotReady".to_owned(),
        None => "Unknown".to_owned(),
    }];
    if node.pointer("/spec/unschedulable") == Some(&json!(true)) {
        out.push("SchedulingDisabled".into());
    }
    out.join(",")
}

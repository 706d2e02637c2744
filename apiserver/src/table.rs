//! Server-side printing: `meta.k8s.io/v1` Table output with the upstream columns of each
//! built-in kind (what `kubectl get` shows), NAME and AGE for the rest.

use crate::object::meta;
use crate::registry::ResourceInfo;
use serde_json::{Value, json};

/// A column: name, type, and priority (1 = only with `-o wide`).
struct Col(&'static str, &'static str, u8);

fn s(v: &Value, p: &str) -> String {
    match v.pointer(p) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

fn i(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(x: String) -> String {
    if x.is_empty() { "<none>".into() } else { x }
}

fn or(x: String, default: &str) -> String {
    if x.is_empty() { default.into() } else { x }
}

fn len(v: &Value, p: &str) -> usize {
    match v.pointer(p) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

/// kubectl's human-readable age (`duration.HumanDuration`).
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        if secs % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", secs % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if d / 365 < 8 {
        format!("{}y{}d", d / 365, d % 365)
    } else {
        format!("{}y", d / 365)
    }
}

/// The age of a timestamp, as kubectl prints it (`<unknown>` if absent).
pub fn age(ts: &str) -> String {
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration((jiff::Timestamp::now() - t).get_seconds()),
        Err(_) => "<unknown>".into(),
    }
}

fn created(obj: &Value) -> String {
    age(meta(obj)
        .get("creationTimestamp")
        .and_then(Value::as_str)
        .unwrap_or(""))
}

fn containers_images(obj: &Value, spec: &str) -> (String, String) {
    let cs = obj
        .pointer(spec)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<String> = cs.iter().map(|c| s(c, "/name")).collect();
    let images: Vec<String> = cs.iter().map(|c| s(c, "/image")).collect();
    (names.join(","), images.join(","))
}

fn selector_text(v: &Value) -> String {
    match minik8s_types::LabelSelector::from_json(v) {
        Ok(sel) if !sel.is_empty() => sel.to_string(),
        _ => "<none>".into(),
    }
}

fn pod_status(pod: &Value) -> (String, i64, usize, usize) {
    let mut reason = s(pod, "/status/phase");
    if !s(pod, "/status/reason").is_empty() {
        reason = s(pod, "/status/reason");
    }
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = len(pod, "/spec/containers");
    let mut ready = 0;
    let mut restarts = 0;
    let inits = pod
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let init_total = len(pod, "/spec/initContainers");
    let mut initializing = false;
    for (n, c) in inits.iter().enumerate() {
        restarts += i(c, "/restartCount");
        let term = c.pointer("/state/terminated");
        if term.is_some_and(|t| i(t, "/exitCode") == 0) {
            continue;
        }
        initializing = true;
        reason = if let Some(t) = term {
            let r = s(t, "/reason");
            if r.is_empty() {
                format!("Init:ExitCode:{}", i(t, "/exitCode"))
            } else {
                format!("Init:{r}")
            }
        } else if let Some(w) = c
            .pointer("/state/waiting")
            .filter(|w| !s(w, "/reason").is_empty() && s(w, "/reason") != "PodInitializing")
        {
            format!("Init:{}", s(w, "/reason"))
        } else {
            format!("Init:{n}/{init_total}")
        };
        break;
    }
    if !initializing {
        let mut has_running = false;
        for c in statuses.iter().rev() {
            restarts += i(c, "/restartCount");
            if let Some(w) = c
                .pointer("/state/waiting")
                .filter(|w| !s(w, "/reason").is_empty())
            {
                reason = s(w, "/reason");
            } else if let Some(t) = c.pointer("/state/terminated") {
                reason = if !s(t, "/reason").is_empty() {
                    s(t, "/reason")
                } else if i(t, "/signal") != 0 {
                    format!("Signal:{}", i(t, "/signal"))
                } else {
                    format!("ExitCode:{}", i(t, "/exitCode"))
                };
            } else if c.pointer("/ready") == Some(&json!(true))
                && c.pointer("/state/running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    } else {
        restarts += statuses.iter().map(|c| i(c, "/restartCount")).sum::<i64>();
    }
    if meta(pod).get("deletionTimestamp").is_some() {
        reason = if s(pod, "/status/reason") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    (reason, restarts, ready, total)
}

/// A claim's or volume's STATUS column: its phase, or Terminating once deleted (as upstream's
/// printers).
fn phase_or_terminating(o: &Value) -> String {
    if meta(o).get("deletionTimestamp").is_some() {
        "Terminating".into()
    } else {
        s(o, "/status/phase")
    }
}

fn node_status(node: &Value) -> String {
    let conds = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = conds.iter().find(|c| s(c, "/type") == "Ready");
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

fn service_ports(svc: &Value) -> String {
    let ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let parts: Vec<String> = ports
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

/// Evaluates the JSONPath of a printer column: fields (`.spec.replicas`), indexes
/// (`.status.conditions[0]`) and filters on a field's value
/// (`.status.conditions[?(@.type=="Ready")].status`, the first match), as upstream's columns use.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    let mut rest = path.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let name = &r[..end];
            if !name.is_empty() {
                cur = cur.get(name)?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("[?(") {
            let end = r.find(")]")?;
            let (field, want) = r[..end].split_once("==")?;
            let field = field.trim().strip_prefix('@')?;
            let want = want.trim().trim_matches(['"', '\'']);
            cur = cur.as_array()?.iter().find(|item| {
                json_path(item, field).is_some_and(|v| match v {
                    Value::String(s) => s == want,
                    Value::Number(n) => want.parse::<f64>().ok() == n.as_f64(),
                    Value::Bool(b) => want.parse::<bool>().ok() == Some(*b),
                    _ => false,
                })
            })?;
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix("[*]") {
            // Every element: the first with a result, as upstream's table convertor prints
            // the first of a JSONPath's results.
            return cur.as_array()?.iter().find_map(|item| json_path(item, r));
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            cur = cur.get(r[..end].trim().parse::<usize>().ok()?)?;
            rest = &r[end + 1..];
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            cur = cur.get(&rest[..end])?;
            rest = &rest[end..];
        }
    }
    Some(cur)
}

fn crd_cell(col: &crate::registry::PrinterColumn, obj: &Value) -> Value {
    let v = json_path(obj, &col.json_path)
        .cloned()
        .unwrap_or(Value::Null);
    match (col.type_.as_str(), &v) {
        ("date", Value::String(ts)) => json!(age(ts)),
        (_, Value::Null) => json!("<none>"),
        (_, Value::String(_) | Value::Number(_) | Value::Bool(_)) => v,
        _ => json!(v.to_string()),
    }
}

/// Columns and cells of one kind.
fn columns(res: &ResourceInfo) -> Vec<Col> {
    let k = (res.group.as_str(), res.kind.as_str());
    let mut cols = match k {
        ("", "Pod") => vec![
            Col("Ready", "string", 0),
            Col("Status", "string", 0),
            Col("Restarts", "string", 0),
            Col("Age", "string", 0),
            Col("IP", "string", 1),
            Col("Node", "string", 1),
            Col("Nominated Node", "string", 1),
            Col("Readiness Gates", "string", 1),
        ],
        ("apps", "Deployment") => vec![
            Col("Ready", "string", 0),
            Col("Up-to-date", "integer", 0),
            Col("Available", "integer", 0),
            Col("Age", "string", 0),
            Col("Containers", "string", 1),
            Col("Images", "string", 1),
            Col("Selector", "string", 1),
        ],
        ("apps", "ReplicaSet") | ("", "ReplicationController") => vec![
            Col("Desired", "integer", 0),
            Col("Current", "integer", 0),
            Col("Ready", "integer", 0),
            Col("Age", "string", 0),
            Col("Containers", "string", 1),
            Col("Images", "string", 1),
            Col("Selector", "string", 1),
        ],
        ("apps", "StatefulSet") => vec![
            Col("Ready", "string", 0),
            Col("Age", "string", 0),
            Col("Containers", "string", 1),
            Col("Images", "string", 1),
        ],
        ("apps", "DaemonSet") => vec![
            Col("Desired", "integer", 0),
            Col("Current", "integer", 0),
            Col("Ready", "integer", 0),
            Col("Up-to-date", "integer", 0),
            Col("Available", "integer", 0),
            Col("Node Selector", "string", 0),
            Col("Age", "string", 0),
            Col("Containers", "string", 1),
            Col("Images", "string", 1),
            Col("Selector", "string", 1),
        ],
        ("", "Service") => vec![
            Col("Type", "string", 0),
            Col("Cluster-IP", "string", 0),
            Col("External-IP", "string", 0),
            Col("Port(s)", "string", 0),
            Col("Age", "string", 0),
            Col("Selector", "string", 1),
        ],
        ("", "Node") => vec![
            Col("Status", "string", 0),
            Col("Roles", "string", 0),
            Col("Age", "string", 0),
            Col("Version", "string", 0),
            Col("Internal-IP", "string", 1),
            Col("External-IP", "string", 1),
            Col("OS-Image", "string", 1),
            Col("Kernel-Version", "string", 1),
            Col("Container-Runtime", "string", 1),
        ],
        ("", "Namespace") => vec![Col("Status", "string", 0), Col("Age", "string", 0)],
        ("", "ConfigMap") => vec![Col("Data", "integer", 0), Col("Age", "string", 0)],
        ("", "Secret") => vec![
            Col("Type", "string", 0),
            Col("Data", "integer", 0),
            Col("Age", "string", 0),
        ],
        ("", "ServiceAccount") => vec![Col("Secrets", "integer", 0), Col("Age", "string", 0)],
        ("", "Endpoints") => vec![Col("Endpoints", "string", 0), Col("Age", "string", 0)],
        ("", "Event") => vec![
            Col("Last Seen", "string", 0),
            Col("Type", "string", 0),
            Col("Reason", "string", 0),
            Col("Object", "string", 0),
            Col("Subobject", "string", 1),
            Col("Source", "string", 1),
            Col("Message", "string", 0),
            Col("First Seen", "string", 1),
            Col("Count", "string", 1),
        ],
        ("", "PersistentVolumeClaim") => vec![
            Col("Status", "string", 0),
            Col("Volume", "string", 0),
            Col("Capacity", "string", 0),
            Col("Access Modes", "string", 0),
            Col("StorageClass", "string", 0),
            Col("Age", "string", 0),
        ],
        ("", "PersistentVolume") => vec![
            Col("Capacity", "string", 0),
            Col("Access Modes", "string", 0),
            Col("Reclaim Policy", "string", 0),
            Col("Status", "string", 0),
            Col("Claim", "string", 0),
            Col("StorageClass", "string", 0),
            Col("Age", "string", 0),
        ],
        ("batch", "Job") => vec![
            Col("Status", "string", 0),
            Col("Completions", "string", 0),
            Col("Duration", "string", 0),
            Col("Age", "string", 0),
            Col("Containers", "string", 1),
            Col("Images", "string", 1),
            Col("Selector", "string", 1),
        ],
        ("batch", "CronJob") => vec![
            Col("Schedule", "string", 0),
            Col("Timezone", "string", 0),
            Col("Suspend", "boolean", 0),
            Col("Active", "integer", 0),
            Col("Last Schedule", "string", 0),
            Col("Age", "string", 0),
        ],
        ("autoscaling", "HorizontalPodAutoscaler") => vec![
            Col("Reference", "string", 0),
            Col("Targets", "string", 0),
            Col("MinPods", "string", 0),
            Col("MaxPods", "integer", 0),
            Col("Replicas", "integer", 0),
            Col("Age", "string", 0),
        ],
        ("discovery.k8s.io", "EndpointSlice") => vec![
            Col("AddressType", "string", 0),
            Col("Ports", "string", 0),
            Col("Endpoints", "string", 0),
            Col("Age", "string", 0),
        ],
        ("coordination.k8s.io", "Lease") => {
            vec![Col("Holder", "string", 0), Col("Age", "string", 0)]
        }
        ("networking.k8s.io", "IngressClass") => vec![
            Col("Controller", "string", 0),
            Col("Parameters", "string", 0),
            Col("Age", "string", 0),
        ],
        ("networking.k8s.io", "Ingress") => vec![
            Col("Class", "string", 0),
            Col("Hosts", "string", 0),
            Col("Address", "string", 0),
            Col("Ports", "string", 0),
            Col("Age", "string", 0),
        ],
        ("apiregistration.k8s.io", "APIService") => vec![
            Col("Service", "string", 0),
            Col("Available", "string", 0),
            Col("Age", "string", 0),
        ],
        ("storage.k8s.io", "StorageClass") => vec![
            Col("Provisioner", "string", 0),
            Col("ReclaimPolicy", "string", 0),
            Col("VolumeBindingMode", "string", 0),
            Col("AllowVolumeExpansion", "string", 0),
            Col("Age", "string", 0),
        ],
        ("scheduling.k8s.io", "PriorityClass") => vec![
            Col("Value", "integer", 0),
            Col("Global-Default", "boolean", 0),
            Col("Age", "string", 0),
            Col("PreemptionPolicy", "string", 0),
        ],
        ("certificates.k8s.io", "CertificateSigningRequest") => vec![
            Col("Age", "string", 0),
            Col("SignerName", "string", 0),
            Col("Requestor", "string", 0),
            Col("RequestedDuration", "string", 0),
            Col("Condition", "string", 0),
        ],
        ("policy", "PodDisruptionBudget") => vec![
            Col("Min Available", "string", 0),
            Col("Max Unavailable", "string", 0),
            Col("Allowed Disruptions", "integer", 0),
            Col("Age", "string", 0),
        ],
        ("apiextensions.k8s.io", _)
        | ("rbac.authorization.k8s.io", "Role" | "ClusterRole")
        | ("", "LimitRange") => vec![Col("Created At", "date", 0)],
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => vec![
            Col("Role", "string", 0),
            Col("Age", "string", 0),
            Col("Users", "string", 1),
            Col("Groups", "string", 1),
            Col("ServiceAccounts", "string", 1),
        ],
        ("apps", "ControllerRevision") => vec![
            Col("Controller", "string", 0),
            Col("Revision", "integer", 0),
            Col("Age", "string", 0),
        ],
        ("networking.k8s.io", "NetworkPolicy") => {
            vec![Col("Pod-Selector", "string", 0), Col("Age", "string", 0)]
        }
        _ => vec![Col("Age", "string", 0)],
    };
    if k != ("", "Event") {
        cols.insert(0, Col("Name", "string", 0));
    } else {
        cols.push(Col("Name", "string", 1));
    }
    cols
}

/// An HPA's TARGETS cell, as upstream's `formatHPAMetrics`: each metric's current value and
/// target (`cpu: 37%/50%`, `memory: 12Mi/100Mi`, `<unknown>` before the first reading), at
/// most two, then `+ N more...`.
/// A CSR's CONDITION column as upstream's `extractCSRStatus`: Denied, else Approved, else
/// Pending; then `,Failed` and `,Issued` when they apply.
fn csr_condition(o: &Value) -> String {
    let types: Vec<String> = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().map(|c| s(c, "/type")).collect())
        .unwrap_or_default();
    let has = |t: &str| types.iter().any(|x| x == t);
    let mut out = if has("Denied") {
        "Denied".to_owned()
    } else if has("Approved") {
        "Approved".to_owned()
    } else {
        "Pending".to_owned()
    };
    if has("Failed") {
        out.push_str(",Failed");
    }
    if o.pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        out.push_str(",Issued");
    }
    out
}

fn hpa_targets(o: &Value) -> String {
    let specs = o
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses = o
        .pointer("/status/currentMetrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let text = |v: Option<&Value>| -> Option<String> {
        match v? {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    };
    let mut list = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let status = statuses.get(i);
        let current = |source: &str, field: &str| {
            text(status.and_then(|st| st.pointer(&format!("/{source}/current/{field}"))))
                .unwrap_or_else(|| "<unknown>".into())
        };
        let target =
            |source: &str, field: &str| text(spec.pointer(&format!("/{source}/target/{field}")));
        let kind = spec.get("type").and_then(Value::as_str).unwrap_or_default();
        let entry = match kind {
            "External" | "Object" => {
                let source = if kind == "External" {
                    "external"
                } else {
                    "object"
                };
                match target(source, "averageValue") {
                    Some(t) => format!("{}/{t} (avg)", current(source, "averageValue")),
                    None => format!(
                        "{}/{}",
                        current(source, "value"),
                        target(source, "value").unwrap_or_default()
                    ),
                }
            }
            "Pods" => format!(
                "{}/{}",
                current("pods", "averageValue"),
                target("pods", "averageValue").unwrap_or_default()
            ),
            "Resource" | "ContainerResource" => {
                let source = if kind == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let name = s(spec, &format!("/{source}/name"));
                match target(source, "averageValue") {
                    Some(t) => format!("{name}: {}/{t}", current(source, "averageValue")),
                    None => {
                        let cur = text(status.and_then(|st| {
                            st.pointer(&format!("/{source}/current/averageUtilization"))
                        }))
                        .map_or_else(|| "<unknown>".into(), |v| format!("{v}%"));
                        let t = target(source, "averageUtilization")
                            .map_or_else(|| "<auto>".into(), |v| format!("{v}%"));
                        format!("{name}: {cur}/{t}")
                    }
                }
            }
            _ => "<unknown type>".into(),
        };
        list.push(entry);
    }
    let count = list.len();
    if count > 2 {
        list.truncate(2);
        return format!("{} + {} more...", list.join(", "), count - 2);
    }
    list.join(", ")
}

fn cells(res: &ResourceInfo, o: &Value) -> Vec<Value> {
    let mut name = meta(o)
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    // The default StorageClass says so in its name cell, as upstream prints it.
    if res.kind == "StorageClass"
        && o.pointer("/metadata/annotations")
            .and_then(|a| a.get(crate::admission::storageclass::DEFAULT_CLASS))
            .and_then(Value::as_str)
            == Some("true")
    {
        name.push_str(" (default)");
    }
    let name = json!(name);
    let age = json!(created(o));
    let k = (res.group.as_str(), res.kind.as_str());
    let mut row: Vec<Value> = match k {
        ("", "Pod") => {
            let (status, restarts, ready, total) = pod_status(o);
            let gates = o
                .pointer("/spec/readinessGates")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            vec![
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts.to_string()),
                age,
                json!(or_none(s(o, "/status/podIP"))),
                json!(or_none(s(o, "/spec/nodeName"))),
                json!(or_none(s(o, "/status/nominatedNodeName"))),
                json!(if gates == 0 {
                    "<none>".to_owned()
                } else {
                    format!("0/{gates}")
                }),
            ]
        }
        ("apps", "Deployment") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            vec![
                json!(format!(
                    "{}/{}",
                    i(o, "/status/readyReplicas"),
                    i(o, "/spec/replicas")
                )),
                json!(i(o, "/status/updatedReplicas")),
                json!(i(o, "/status/availableReplicas")),
                age,
                json!(c),
                json!(im),
                json!(selector_text(
                    o.pointer("/spec/selector").unwrap_or(&Value::Null)
                )),
            ]
        }
        ("apps", "ReplicaSet") | ("", "ReplicationController") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            let sel = match o.pointer("/spec/selector") {
                Some(sel)
                    if sel.get("matchLabels").is_some()
                        || sel.get("matchExpressions").is_some() =>
                {
                    selector_text(sel)
                }
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(","),
                _ => "<none>".into(),
            };
            vec![
                json!(i(o, "/spec/replicas")),
                json!(i(o, "/status/replicas")),
                json!(i(o, "/status/readyReplicas")),
                age,
                json!(c),
                json!(im),
                json!(sel),
            ]
        }
        ("apps", "StatefulSet") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            vec![
                json!(format!(
                    "{}/{}",
                    i(o, "/status/readyReplicas"),
                    i(o, "/spec/replicas")
                )),
                age,
                json!(c),
                json!(im),
            ]
        }
        ("apps", "DaemonSet") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            let ns = o
                .pointer("/spec/template/spec/nodeSelector")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                json!(i(o, "/status/desiredNumberScheduled")),
                json!(i(o, "/status/currentNumberScheduled")),
                json!(i(o, "/status/numberReady")),
                json!(i(o, "/status/updatedNumberScheduled")),
                json!(i(o, "/status/numberAvailable")),
                json!(or_none(ns)),
                age,
                json!(c),
                json!(im),
                json!(selector_text(
                    o.pointer("/spec/selector").unwrap_or(&Value::Null)
                )),
            ]
        }
        ("", "Service") => {
            let ty = s(o, "/spec/type");
            let external = match ty.as_str() {
                "ExternalName" => s(o, "/spec/externalName"),
                "LoadBalancer" => {
                    let ing = o
                        .pointer("/status/loadBalancer/ingress")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    let ips: Vec<String> = ing
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
                _ => o
                    .pointer("/spec/externalIPs")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default(),
            };
            let sel = o
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                json!(ty),
                json!(or_none(s(o, "/spec/clusterIP"))),
                json!(or_none(external)),
                json!(service_ports(o)),
                age,
                json!(or_none(sel)),
            ]
        }
        ("", "Node") => {
            let labels = meta(o)
                .get("labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let mut roles: Vec<String> = labels
                .keys()
                .filter_map(|k| {
                    k.strip_prefix("node-role.kubernetes.io/")
                        .map(str::to_owned)
                })
                .filter(|r| !r.is_empty())
                .collect();
            roles.sort();
            let addr = |t: &str| {
                o.pointer("/status/addresses")
                    .and_then(Value::as_array)
                    .and_then(|a| a.iter().find(|x| s(x, "/type") == t))
                    .map(|x| s(x, "/address"))
                    .unwrap_or_default()
            };
            vec![
                json!(node_status(o)),
                json!(or_none(roles.join(","))),
                age,
                json!(s(o, "/status/nodeInfo/kubeletVersion")),
                json!(or_none(addr("InternalIP"))),
                json!(or_none(addr("ExternalIP"))),
                json!(s(o, "/status/nodeInfo/osImage")),
                json!(s(o, "/status/nodeInfo/kernelVersion")),
                json!(s(o, "/status/nodeInfo/containerRuntimeVersion")),
            ]
        }
        ("", "Namespace") => vec![json!(s(o, "/status/phase")), age],
        ("", "ConfigMap") => vec![json!(len(o, "/data") + len(o, "/binaryData")), age],
        ("", "Secret") => vec![json!(s(o, "/type")), json!(len(o, "/data")), age],
        ("", "ServiceAccount") => vec![json!(len(o, "/secrets")), age],
        ("", "Endpoints") => {
            let mut eps = Vec::new();
            for subset in o
                .pointer("/subsets")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                for a in subset
                    .pointer("/addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
                {
                    for p in subset
                        .pointer("/ports")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                    {
                        eps.push(format!("{}:{}", s(&a, "/ip"), s(&p, "/port")));
                    }
                }
            }
            let shown = if eps.len() > 3 {
                format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
            } else {
                eps.join(",")
            };
            vec![json!(or_none(shown)), age]
        }
        ("", "Event") => {
            let last = [
                s(o, "/lastTimestamp"),
                s(o, "/eventTime"),
                s(o, "/metadata/creationTimestamp"),
            ]
            .into_iter()
            .find(|t| !t.is_empty())
            .unwrap_or_default();
            let obj = format!(
                "{}/{}",
                s(o, "/involvedObject/kind").to_lowercase(),
                s(o, "/involvedObject/name")
            );
            let source = [s(o, "/source/component"), s(o, "/reportingComponent")]
                .into_iter()
                .find(|t| !t.is_empty())
                .unwrap_or_default();
            vec![
                json!(age_of(&last)),
                json!(s(o, "/type")),
                json!(s(o, "/reason")),
                json!(obj),
                json!(s(o, "/involvedObject/fieldPath")),
                json!(source),
                json!(s(o, "/message")),
                json!(age_of(&s(o, "/firstTimestamp"))),
                json!(i(o, "/count").max(1).to_string()),
            ]
        }
        ("", "PersistentVolumeClaim") => vec![
            json!(phase_or_terminating(o)),
            json!(s(o, "/spec/volumeName")),
            json!(s(o, "/status/capacity/storage")),
            json!(access_modes(o, "/status/accessModes")),
            json!(or_none(s(o, "/spec/storageClassName"))),
            age,
        ],
        ("", "PersistentVolume") => {
            let claim = if s(o, "/spec/claimRef/name").is_empty() {
                String::new()
            } else {
                format!(
                    "{}/{}",
                    s(o, "/spec/claimRef/namespace"),
                    s(o, "/spec/claimRef/name")
                )
            };
            vec![
                json!(s(o, "/spec/capacity/storage")),
                json!(access_modes(o, "/spec/accessModes")),
                json!(s(o, "/spec/persistentVolumeReclaimPolicy")),
                json!(phase_or_terminating(o)),
                json!(claim),
                json!(s(o, "/spec/storageClassName")),
                age,
            ]
        }
        ("batch", "Job") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            let conds = o
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let has = |t: &str| {
                conds
                    .iter()
                    .any(|c| s(c, "/type") == t && s(c, "/status") == "True")
            };
            let status = if has("Complete") {
                "Complete"
            } else if has("Failed") {
                "Failed"
            } else if has("Suspended") {
                "Suspended"
            } else {
                "Running"
            };
            let completions = match o.pointer("/spec/completions") {
                Some(c) if !c.is_null() => format!("{}/{}", i(o, "/status/succeeded"), c),
                _ => format!(
                    "{}/1 of {}",
                    i(o, "/status/succeeded"),
                    i(o, "/spec/parallelism")
                ),
            };
            let duration = match (
                s(o, "/status/startTime").parse::<jiff::Timestamp>(),
                s(o, "/status/completionTime").parse::<jiff::Timestamp>(),
            ) {
                (Ok(st), Ok(end)) => human_duration((end - st).get_seconds()),
                (Ok(st), Err(_)) => human_duration((jiff::Timestamp::now() - st).get_seconds()),
                _ => String::new(),
            };
            vec![
                json!(status),
                json!(completions),
                json!(duration),
                age,
                json!(c),
                json!(im),
                json!(selector_text(
                    o.pointer("/spec/selector").unwrap_or(&Value::Null)
                )),
            ]
        }
        ("batch", "CronJob") => vec![
            json!(s(o, "/spec/schedule")),
            json!(or_none(s(o, "/spec/timeZone"))),
            json!(o.pointer("/spec/suspend") == Some(&json!(true))),
            json!(len(o, "/status/active")),
            json!(if s(o, "/status/lastScheduleTime").is_empty() {
                "<none>".into()
            } else {
                age_of(&s(o, "/status/lastScheduleTime"))
            }),
            age,
        ],
        ("autoscaling", "HorizontalPodAutoscaler") => {
            let reference = format!(
                "{}/{}",
                s(o, "/spec/scaleTargetRef/kind"),
                s(o, "/spec/scaleTargetRef/name")
            );
            let v2 = if res.version == "v1" {
                crate::convert::convert(o.clone(), "autoscaling/v2")
            } else {
                o.clone()
            };
            let targets = hpa_targets(&v2);
            let min = o
                .pointer("/spec/minReplicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            vec![
                json!(reference),
                json!(targets),
                json!(min.to_string()),
                json!(i(o, "/spec/maxReplicas")),
                json!(i(o, "/status/currentReplicas")),
                age,
            ]
        }
        ("discovery.k8s.io", "EndpointSlice") => {
            let ports: Vec<String> = o
                .pointer("/ports")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|p| s(p, "/port"))
                .collect();
            let addrs: Vec<String> = o
                .pointer("/endpoints")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .iter()
                .flat_map(|e| {
                    e.pointer("/addresses")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect();
            let shown = if addrs.len() > 3 {
                format!("{} + {} more...", addrs[..3].join(","), addrs.len() - 3)
            } else {
                addrs.join(",")
            };
            vec![
                json!(s(o, "/addressType")),
                json!(or_none(ports.join(","))),
                json!(or_none(shown)),
                age,
            ]
        }
        ("coordination.k8s.io", "Lease") => vec![json!(s(o, "/spec/holderIdentity")), age],
        ("networking.k8s.io", "IngressClass") => {
            let params = match o.pointer("/spec/parameters") {
                Some(p) => format!("{}/{}", s(p, "/kind"), s(p, "/name")),
                None => "<none>".into(),
            };
            vec![json!(s(o, "/spec/controller")), json!(params), age]
        }
        ("networking.k8s.io", "Ingress") => {
            let hosts: Vec<String> = o
                .pointer("/spec/rules")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|r| s(r, "/host"))
                .filter(|h| !h.is_empty())
                .collect();
            let ports = if len(o, "/spec/tls") > 0 {
                "80, 443"
            } else {
                "80"
            };
            vec![
                json!(or_none(s(o, "/spec/ingressClassName"))),
                json!(if hosts.is_empty() {
                    "*".into()
                } else {
                    hosts.join(",")
                }),
                json!(""),
                json!(ports),
                age,
            ]
        }
        ("apiregistration.k8s.io", "APIService") => {
            let service = match o.pointer("/spec/service").filter(|v| !v.is_null()) {
                Some(svc) => format!("{}/{}", s(svc, "/namespace"), s(svc, "/name")),
                None => "Local".into(),
            };
            let available = o
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
                .map_or("Unknown".to_owned(), |c| {
                    let (status, reason) = (s(c, "/status"), s(c, "/reason"));
                    if status == "True" || reason.is_empty() {
                        status
                    } else {
                        format!("{status} ({reason})")
                    }
                });
            vec![json!(service), json!(available), age]
        }
        ("storage.k8s.io", "StorageClass") => vec![
            json!(s(o, "/provisioner")),
            json!(or(s(o, "/reclaimPolicy"), "Delete")),
            json!(or(s(o, "/volumeBindingMode"), "Immediate")),
            json!(o.pointer("/allowVolumeExpansion") == Some(&json!(true))),
            age,
        ],
        ("scheduling.k8s.io", "PriorityClass") => vec![
            json!(i(o, "/value")),
            json!(o.pointer("/globalDefault") == Some(&json!(true))),
            age,
            json!(or(s(o, "/preemptionPolicy"), "PreemptLowerPriority")),
        ],
        ("certificates.k8s.io", "CertificateSigningRequest") => vec![
            age,
            json!(s(o, "/spec/signerName")),
            json!(s(o, "/spec/username")),
            json!(
                match o.pointer("/spec/expirationSeconds").and_then(Value::as_i64) {
                    Some(secs) => human_duration(secs),
                    None => "<none>".into(),
                }
            ),
            json!(csr_condition(o)),
        ],
        ("policy", "PodDisruptionBudget") => vec![
            json!(or(s(o, "/spec/minAvailable"), "N/A")),
            json!(or(s(o, "/spec/maxUnavailable"), "N/A")),
            json!(i(o, "/status/disruptionsAllowed")),
            age,
        ],
        ("apiextensions.k8s.io", _)
        | ("rbac.authorization.k8s.io", "Role" | "ClusterRole")
        | ("", "LimitRange") => vec![json!(s(o, "/metadata/creationTimestamp"))],
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            let subjects = o
                .pointer("/subjects")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let of = |kind: &str| {
                subjects
                    .iter()
                    .filter(|x| s(x, "/kind") == kind)
                    .map(|x| {
                        if kind == "ServiceAccount" {
                            format!("{}/{}", s(x, "/namespace"), s(x, "/name"))
                        } else {
                            s(x, "/name")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                json!(format!(
                    "{}/{}",
                    s(o, "/roleRef/kind"),
                    s(o, "/roleRef/name")
                )),
                age,
                json!(of("User")),
                json!(of("Group")),
                json!(of("ServiceAccount")),
            ]
        }
        ("apps", "ControllerRevision") => {
            let owner = meta(o)
                .get("ownerReferences")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .map(|r| format!("{}/{}", s(r, "/kind").to_lowercase(), s(r, "/name")))
                .unwrap_or_else(|| "<none>".into());
            vec![json!(owner), json!(i(o, "/revision")), age]
        }
        ("networking.k8s.io", "NetworkPolicy") => vec![
            json!(selector_text(
                o.pointer("/spec/podSelector").unwrap_or(&Value::Null)
            )),
            age,
        ],
        _ => vec![age],
    };
    if k != ("", "Event") {
        row.insert(0, name);
    } else {
        row.push(name);
    }
    row
}

fn age_of(ts: &str) -> String {
    if ts.is_empty() {
        "<unknown>".into()
    } else {
        age(ts)
    }
}

fn access_modes(o: &Value, p: &str) -> String {
    let modes = o
        .pointer(p)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    modes
        .iter()
        .filter_map(Value::as_str)
        .map(|m| match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Renders objects of one resource as a Table; `include_object` is `None`, `Metadata`
/// (the default) or `Object`.
pub fn table(
    res: &ResourceInfo,
    objects: &[Value],
    include_object: Option<&str>,
    list_meta: Option<Value>,
    with_columns: bool,
) -> Value {
    if !res.printer_columns.is_empty() {
        return crd_table(res, objects, include_object, list_meta, with_columns);
    }
    let cols = columns(res);
    let defs: Vec<Value> = if with_columns {
        cols.iter()
            .map(|c| {
                let mut d = json!({"name": c.0, "type": c.1, "format": if c.0 == "Name" { "name" } else { "" }, "description": c.0, "priority": c.2});
                if c.0 == "Name" {
                    d["description"] = json!("Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names");
                }
                d
            })
            .collect()
    } else {
        vec![]
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(res, o)});
            if let Some(obj) = partial_object(o, include_object) {
                row["object"] = obj;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.unwrap_or_else(|| json!({})),
        "columnDefinitions": defs,
        "rows": rows,
    })
}

fn partial_object(o: &Value, include_object: Option<&str>) -> Option<Value> {
    match include_object.unwrap_or("Metadata") {
        "None" => None,
        "Object" => Some(o.clone()),
        _ => Some(crate::object::partial_metadata(o)),
    }
}

/// A Table from a CRD's printer columns (Name first, as upstream).
fn crd_table(
    res: &ResourceInfo,
    objects: &[Value],
    include_object: Option<&str>,
    list_meta: Option<Value>,
    with_columns: bool,
) -> Value {
    let mut defs = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    defs.extend(res.printer_columns.iter().map(|c| {
        json!({"name": c.name, "type": c.type_, "format": "", "description": c.description, "priority": c.priority})
    }));
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![json!(
                meta(o).get("name").and_then(Value::as_str).unwrap_or("")
            )];
            cells.extend(res.printer_columns.iter().map(|c| crd_cell(c, o)));
            let mut row = json!({"cells": cells});
            if let Some(obj) = partial_object(o, include_object) {
                row["object"] = obj;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.unwrap_or_else(|| json!({})),
        "columnDefinitions": if with_columns { defs } else { vec![] },
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_paths_index_and_filter() {
        let obj = json!({"status": {"replicas": 2, "conditions": [
            {"type": "SourceReady", "status": "True"}, {"type": "Ready", "status": "False"}]}});
        assert_eq!(json_path(&obj, ".status.replicas"), Some(&json!(2)));
        assert_eq!(
            json_path(&obj, ".status.conditions[0].type"),
            Some(&json!("SourceReady"))
        );
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(&json!("False"))
        );
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Gone")].status"#),
            None
        );
        assert_eq!(json_path(&obj, ".spec.x"), None);
        let dns = json!({"spec": {"subpaths": [{"path": "/a"}, {"path": "/b"}]}});
        assert_eq!(
            json_path(&dns, ".spec.subpaths[*].path"),
            Some(&json!("/a"))
        );
        assert_eq!(
            json_path(&json!({"spec": {"subpaths": []}}), ".spec.subpaths[*].path"),
            None
        );
    }

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(30 * 86400), "30d");
    }

    #[test]
    fn pod_rows_show_ready_status_and_restarts() {
        let r = crate::registry::Registry::with_builtins();
        let pods = r.get("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 1, "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        let t = table(&pods, &[pod], None, None, true);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "p");
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[2], "CrashLoopBackOff");
        assert_eq!(cells[3], "3");
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
    }
}

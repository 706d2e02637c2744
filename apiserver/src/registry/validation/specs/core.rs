//! The spec validators of Services, pods and their containers, claims and volumes (upstream's `pkg/apis/core/validation`).

use super::*;

pub(crate) fn service(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    labels(
        spec.and_then(|s| s.get("selector")),
        "spec.selector",
        causes,
    );
    const TYPES: [&str; 4] = ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];
    one_of(spec, "type", "spec", &TYPES, causes);
    one_of(
        spec,
        "sessionAffinity",
        "spec",
        &["ClientIP", "None"],
        causes,
    );
    let ty = str_at(spec, "type").unwrap_or("ClusterIP");
    if ty == "ExternalName" {
        match str_at(spec, "externalName") {
            None | Some("") => causes.push(Cause::required("spec.externalName", "")),
            Some(n) if !is_subdomain(n.trim_end_matches('.')) => causes.push(Cause::invalid(
                "spec.externalName",
                n,
                "must be a valid DNS name (RFC 1123 subdomain)",
            )),
            Some(_) => {}
        }
        return;
    }
    let ports = spec.and_then(|s| s.get("ports")).and_then(Value::as_array);
    let headless = str_at(spec, "clusterIP") == Some("None");
    if ports.is_none_or(Vec::is_empty) && !headless {
        causes.push(Cause::required("spec.ports", ""));
    }
    let ports = ports.map(Vec::as_slice).unwrap_or_default();
    let mut names = HashSet::new();
    let mut seen = HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        let name = str_at(Some(p), "name").unwrap_or_default();
        if ports.len() > 1 && name.is_empty() {
            causes.push(Cause::required(&format!("{path}.name"), ""));
        } else if !name.is_empty() {
            if !is_label(name) {
                causes.push(Cause::invalid(&format!("{path}.name"), name, LABEL_MSG));
            } else if !names.insert(name) {
                causes.push(Cause::duplicate(&format!("{path}.name"), name));
            }
        }
        let port = int(Some(p), "port").unwrap_or(0);
        if !(1..=65535).contains(&port) {
            causes.push(Cause::invalid(
                &format!("{path}.port"),
                &port.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        one_of(Some(p), "protocol", &path, &["SCTP", "TCP", "UDP"], causes);
        let proto = str_at(Some(p), "protocol").unwrap_or("TCP");
        if !seen.insert((port, proto)) {
            causes.push(Cause::duplicate(
                &path,
                &format!("{{\"Protocol\":\"{proto}\",\"Port\":{port}}}"),
            ));
        }
        match p.get("targetPort") {
            Some(Value::Number(n)) if !(1..=65535).contains(&n.as_i64().unwrap_or(0)) => {
                causes.push(Cause::invalid(
                    &format!("{path}.targetPort"),
                    &n.to_string(),
                    "must be between 1 and 65535, inclusive",
                ))
            }
            Some(Value::String(s)) if !is_port_name(s) => causes.push(Cause::invalid(
                &format!("{path}.targetPort"),
                s,
                "must contain at least one letter (a-z), and may contain only lowercase letters, digits and '-' (at most 15 characters)",
            )),
            _ => {}
        }
        if int(Some(p), "nodePort").is_some_and(|n| n != 0) && ty == "ClusterIP" {
            causes.push(Cause::forbidden(
                &format!("{path}.nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            ));
        }
    }
    one_of(
        spec,
        "externalTrafficPolicy",
        "spec",
        &["Cluster", "Local"],
        causes,
    );
    one_of(
        spec,
        "internalTrafficPolicy",
        "spec",
        &["Cluster", "Local"],
        causes,
    );
}

/// An IANA service name, as container port names and named target ports must be.
pub(crate) fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

/// Whether `s` is a valid environment variable name (upstream's relaxed rule: printable
/// ASCII but `=`).
pub(crate) fn is_env_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// Upstream's message for a sysctl name that is not one.
const SYSCTL_MSG: &str = r"must have at most 253 characters and match regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";

/// Whether `name` is a sysctl name: segments of `[a-z0-9]([-_a-z0-9]*[a-z0-9])?` joined by
/// `.` or `/`, at most 253 characters (upstream's `IsValidSysctlName`).
fn is_sysctl_name(name: &str) -> bool {
    let segment = |s: &str| {
        let b = s.as_bytes();
        let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        !b.is_empty()
            && b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
            && b.iter().all(|c| edge(c) || matches!(c, b'-' | b'_'))
    };
    name.len() <= 253 && name.split(['.', '/']).all(segment)
}

pub(crate) fn pod_spec(spec: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    let Some(spec) = spec else {
        causes.push(Cause::required(&format!("{path}.containers"), ""));
        return;
    };
    // Label selectors of pod (anti-)affinity terms and spread constraints.
    for kind in ["podAffinity", "podAntiAffinity"] {
        let Some(a) = spec.pointer(&format!("/affinity/{kind}")) else {
            continue;
        };
        for (list, inner) in [
            ("requiredDuringSchedulingIgnoredDuringExecution", ""),
            (
                "preferredDuringSchedulingIgnoredDuringExecution",
                ".podAffinityTerm",
            ),
        ] {
            for (i, term) in items(a, list) {
                let term = if inner.is_empty() {
                    Some(term)
                } else {
                    term.get("podAffinityTerm")
                };
                for sel in ["labelSelector", "namespaceSelector"] {
                    label_selector(
                        term.and_then(|t| t.get(sel)),
                        &format!("{path}.affinity.{kind}.{list}[{i}]{inner}.{sel}"),
                        causes,
                    );
                }
            }
        }
    }
    for (i, c) in items(spec, "topologySpreadConstraints") {
        label_selector(
            c.get("labelSelector"),
            &format!("{path}.topologySpreadConstraints[{i}].labelSelector"),
            causes,
        );
    }
    one_of(
        Some(spec),
        "restartPolicy",
        path,
        &["Always", "OnFailure", "Never"],
        causes,
    );
    one_of(
        Some(spec),
        "dnsPolicy",
        path,
        &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
        causes,
    );
    if str_at(Some(spec), "dnsPolicy") == Some("None") && spec.get("dnsConfig").is_none() {
        causes.push(Cause::required(
            &format!("{path}.dnsConfig"),
            "must provide `dnsConfig` when `dnsPolicy` is None",
        ));
    }
    at_least(Some(spec), "terminationGracePeriodSeconds", path, 0, causes);
    at_least(Some(spec), "activeDeadlineSeconds", path, 1, causes);
    let mut sysctls = HashSet::new();
    for (i, s) in spec
        .pointer("/securityContext/sysctls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = format!("{path}.securityContext.sysctls[{i}].name");
        match str_at(Some(s), "name") {
            None | Some("") => causes.push(Cause::required(&field, "")),
            Some(n) if !is_sysctl_name(n) => causes.push(Cause::invalid(&field, n, SYSCTL_MSG)),
            Some(n) if !sysctls.insert(n.to_owned()) => causes.push(Cause::duplicate(&field, n)),
            Some(_) => {}
        }
    }
    // Volumes: unique names; mounts must name one.
    let mut volumes = HashSet::new();
    if let Some(vs) = spec.get("volumes").and_then(Value::as_array) {
        for (i, v) in vs.iter().enumerate() {
            let field = format!("{path}.volumes[{i}].name");
            match str_at(Some(v), "name") {
                None | Some("") => causes.push(Cause::required(&field, "")),
                Some(n) if !is_label(n) => causes.push(Cause::invalid(&field, n, LABEL_MSG)),
                Some(n) if !volumes.insert(n.to_owned()) => {
                    causes.push(Cause::duplicate(&field, n))
                }
                Some(_) => {}
            }
        }
    }
    let mut names = HashSet::new();
    let lists = [("containers", true), ("initContainers", false)];
    for (key, required) in lists {
        let cs = spec.get(key).and_then(Value::as_array);
        if required && cs.is_none_or(Vec::is_empty) {
            causes.push(Cause::required(&format!("{path}.{key}"), ""));
        }
        for (i, c) in cs.into_iter().flatten().enumerate() {
            container(
                c,
                &format!("{path}.{key}[{i}]"),
                &volumes,
                &mut names,
                causes,
            );
        }
    }
}

pub(crate) fn container(
    c: &Value,
    path: &str,
    volumes: &HashSet<String>,
    names: &mut HashSet<String>,
    causes: &mut Vec<Cause>,
) {
    let name = str_at(Some(c), "name").unwrap_or_default();
    let field = format!("{path}.name");
    if name.is_empty() {
        causes.push(Cause::required(&field, ""));
    } else if !is_label(name) {
        causes.push(Cause::invalid(&field, name, LABEL_MSG));
    } else if !names.insert(name.to_owned()) {
        causes.push(Cause::duplicate(&field, name));
    }
    require(Some(c), "image", path, "", causes);
    one_of(
        Some(c),
        "imagePullPolicy",
        path,
        &["Always", "IfNotPresent", "Never"],
        causes,
    );
    let mut ports = HashSet::new();
    for (i, p) in items(c, "ports") {
        let ppath = format!("{path}.ports[{i}]");
        let port = int(Some(p), "containerPort").unwrap_or(0);
        if !(1..=65535).contains(&port) {
            causes.push(Cause::invalid(
                &format!("{ppath}.containerPort"),
                &port.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if let Some(h) = int(Some(p), "hostPort")
            && !(0..=65535).contains(&h)
        {
            causes.push(Cause::invalid(
                &format!("{ppath}.hostPort"),
                &h.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        one_of(Some(p), "protocol", &ppath, &["SCTP", "TCP", "UDP"], causes);
        if let Some(n) = str_at(Some(p), "name") {
            if !is_port_name(n) {
                causes.push(Cause::invalid(
                    &format!("{ppath}.name"),
                    n,
                    "must contain at least one letter (a-z), and may contain only lowercase letters, digits and '-' (at most 15 characters)",
                ));
            } else if !ports.insert(n.to_owned()) {
                causes.push(Cause::duplicate(&format!("{ppath}.name"), n));
            }
        }
    }
    for (i, e) in items(c, "env") {
        let field = format!("{path}.env[{i}].name");
        match str_at(Some(e), "name") {
            None | Some("") => causes.push(Cause::required(&field, "")),
            Some(n) if !is_env_name(n) => causes.push(Cause::invalid(
                &field,
                n,
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            )),
            Some(_) => {}
        }
    }
    for (i, m) in items(c, "volumeMounts") {
        let mpath = format!("{path}.volumeMounts[{i}]");
        match str_at(Some(m), "name") {
            None | Some("") => causes.push(Cause::required(&format!("{mpath}.name"), "")),
            Some(n) if !volumes.contains(n) => causes.push(Cause {
                reason: "FieldValueNotFound".into(),
                message: format!("Not found: \"{n}\""),
                field: format!("{mpath}.name"),
            }),
            Some(_) => {}
        }
        require(Some(m), "mountPath", &mpath, "", causes);
    }
    // Requests may not exceed limits.
    let resources = c.get("resources");
    let limits = quantities(
        resources.and_then(|r| r.get("limits")),
        &format!("{path}.resources.limits"),
        causes,
    );
    let requests = quantities(
        resources.and_then(|r| r.get("requests")),
        &format!("{path}.resources.requests"),
        causes,
    );
    for (name, q) in &requests {
        if let Some((_, l)) = limits.iter().find(|(n, _)| n == name)
            && q > l
        {
            let shown = resources
                .and_then(|r| r.pointer(&format!("/requests/{name}")))
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| v.to_string())
                })
                .unwrap_or_default();
            causes.push(Cause::invalid(
                &format!("{path}.resources.requests"),
                &shown,
                &format!("must be less than or equal to {name} limit"),
            ));
        }
    }
}

const ACCESS_MODES: &[&str] = &[
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

pub(crate) fn access_modes(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    let modes = spec
        .and_then(|s| s.get("accessModes"))
        .and_then(Value::as_array);
    match modes {
        Some(m) if !m.is_empty() => {
            for (i, mode) in m.iter().enumerate() {
                let mode = mode.as_str().unwrap_or_default();
                if !ACCESS_MODES.contains(&mode) {
                    causes.push(Cause::not_supported(
                        &format!("spec.accessModes[{i}]"),
                        mode,
                        ACCESS_MODES,
                    ));
                }
            }
        }
        _ => causes.push(Cause::required("spec.accessModes", "")),
    }
}

/// A PersistentVolumeClaim: access modes and a storage request.
pub(crate) fn claim(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    access_modes(spec, causes);
    match spec.and_then(|s| s.pointer("/resources/requests/storage")) {
        None => causes.push(Cause::required("spec.resources[storage]", "")),
        Some(q) => {
            let q = q.as_str().unwrap_or_default();
            match Quantity::parse(q) {
                Ok(v) if v > Quantity::ZERO => {}
                _ => causes.push(Cause::invalid(
                    "spec.resources[storage]",
                    q,
                    "must be greater than zero",
                )),
            }
        }
    }
}

/// The volume sources of a PersistentVolume (upstream's list). The API takes them all; the
/// kubelet here mounts `hostPath` and `local` ones.
const PV_SOURCES: &[&str] = &[
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "hostPath",
    "glusterfs",
    "nfs",
    "rbd",
    "quobyte",
    "iscsi",
    "cinder",
    "cephfs",
    "fc",
    "flocker",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];

/// A PersistentVolume: capacity, access modes, exactly one (supported) source.
pub(crate) fn volume(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    access_modes(spec, causes);
    if spec.and_then(|s| s.pointer("/capacity/storage")).is_none() {
        causes.push(Cause::required("spec.capacity", ""));
    }
    let sources: Vec<&str> = PV_SOURCES
        .iter()
        .copied()
        .filter(|k| spec.and_then(|s| s.get(*k)).is_some_and(|v| !v.is_null()))
        .collect();
    match sources.len() {
        0 => causes.push(Cause::required("spec", "must specify a volume type")),
        1 => {}
        _ => causes.push(Cause::forbidden(
            &format!("spec.{}", sources[1]),
            "may not specify more than 1 volume type",
        )),
    }
    if let Some(csi) = spec.and_then(|s| s.get("csi")).filter(|c| !c.is_null()) {
        for key in ["driver", "volumeHandle"] {
            if csi
                .get(key)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(Cause::required(&format!("spec.csi.{key}"), ""));
            }
        }
    }
    if spec
        .and_then(|s| s.get("local"))
        .is_some_and(|l| !l.is_null())
        && spec
            .and_then(|s| s.pointer("/nodeAffinity/required"))
            .is_none()
    {
        causes.push(Cause::required(
            "spec.nodeAffinity",
            "Local volume requires node affinity",
        ));
    }
    one_of(
        spec,
        "persistentVolumeReclaimPolicy",
        "spec",
        &["Delete", "Retain", "Recycle"],
        causes,
    );
}

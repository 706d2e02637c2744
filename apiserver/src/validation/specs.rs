//! The validators of built-in kinds' specs, following upstream's `pkg/apis/*/validation`:
//! the rules users meet (ranges, enums, required references, cross-field constraints), each
//! reported with upstream's field path and message.

use super::{LABEL_MSG, is_label, is_subdomain, label_selector, labels};
use crate::error::Cause;
use minik8s_types::{LabelSelector, Quantity};
use serde_json::Value;
use std::collections::HashSet;

pub(crate) fn int(v: Option<&Value>, key: &str) -> Option<i64> {
    v.and_then(|v| v.get(key)).and_then(Value::as_i64)
}

/// The elements of the array at `key` of `v`, numbered (none if absent or not an array).
pub(crate) fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = (usize, &'a Value)> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
}

pub(crate) fn str_at<'a>(v: Option<&'a Value>, key: &str) -> Option<&'a str> {
    v.and_then(|v| v.get(key)).and_then(Value::as_str)
}

/// `key` of `v` is a non-empty string, else a Required cause at `path.key`.
pub(crate) fn require(
    v: Option<&Value>,
    key: &str,
    path: &str,
    detail: &str,
    causes: &mut Vec<Cause>,
) {
    if str_at(v, key).is_none_or(str::is_empty) {
        causes.push(Cause::required(&format!("{path}.{key}"), detail));
    }
}

/// `key` of `v`, when set, is at least `min`.
pub(crate) fn at_least(
    v: Option<&Value>,
    key: &str,
    path: &str,
    min: i64,
    causes: &mut Vec<Cause>,
) {
    if let Some(n) = int(v, key)
        && n < min
    {
        let msg = match min {
            0 => "must be greater than or equal to 0".to_owned(),
            1 => "must be greater than or equal to 1".to_owned(),
            m => format!("must be greater than or equal to {m}"),
        };
        causes.push(Cause::invalid(
            &format!("{path}.{key}"),
            &n.to_string(),
            &msg,
        ));
    }
}

/// Upstream's `ValidatePriorityClass`: `system-` names are the built-in classes only, and
/// a user's class is at most 1000000000.
pub(crate) fn priority_class(obj: &Value, causes: &mut Vec<Cause>) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let value = obj.get("value").and_then(Value::as_i64).unwrap_or(0);
    if name.starts_with("system-") {
        let known = crate::admission::priority::system_classes()
            .iter()
            .find(|c| c["metadata"]["name"] == name)
            .map(|c| c["value"].as_i64().unwrap_or(0));
        let why = match known {
            None => Some(format!("{name:?} is not a known system priority class")),
            Some(v) if v != value => Some(format!("value of {name:?} PriorityClass must be {v}")),
            Some(_) if obj.get("globalDefault") == Some(&Value::Bool(true)) => Some(format!(
                "globalDefault of {name:?} PriorityClass must be false"
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            causes.push(Cause::forbidden(
                "metadata.name",
                &format!("priority class names with 'system-' prefix are reserved for system use only. error: {why}"),
            ));
        }
    } else if value > 1_000_000_000 {
        causes.push(Cause::forbidden(
            "value",
            "maximum allowed value of a user defined priority is 1000000000",
        ));
    }
    one_of(
        Some(obj),
        "preemptionPolicy",
        "",
        &["PreemptLowerPriority", "Never"],
        causes,
    );
}

pub(crate) fn one_of(
    v: Option<&Value>,
    key: &str,
    path: &str,
    allowed: &[&str],
    causes: &mut Vec<Cause>,
) {
    if let Some(s) = str_at(v, key)
        && !allowed.contains(&s)
    {
        let field = if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        };
        causes.push(Cause::not_supported(&field, s, allowed));
    }
}

pub(crate) fn replicas(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    at_least(spec, "replicas", "spec", 0, causes);
}

pub(crate) fn data_keys(map: Option<&Value>, field: &str, causes: &mut Vec<Cause>) {
    let Some(m) = map.and_then(Value::as_object) else {
        return;
    };
    for k in m.keys() {
        let ok = !k.is_empty()
            && k.len() <= 253
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            causes.push(Cause::invalid(field, k, "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
        }
    }
}

/// Every value of a resource list is a non-negative quantity.
pub(crate) fn quantities(
    list: Option<&Value>,
    path: &str,
    causes: &mut Vec<Cause>,
) -> Vec<(String, Quantity)> {
    let mut out = Vec::new();
    let Some(m) = list.and_then(Value::as_object) else {
        return out;
    };
    for (name, v) in m {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => other.to_string(),
        };
        let field = format!("{path}.{name}");
        match Quantity::parse(&text) {
            Ok(q) if q.0 < 0 => causes.push(Cause::invalid(
                &field,
                &text,
                "must be greater than or equal to 0",
            )),
            Ok(q) => out.push((name.clone(), q)),
            Err(e) => causes.push(Cause::invalid(&field, &text, &e.to_string())),
        }
    }
    out
}

pub(crate) fn workload(kind: &str, spec: Option<&Value>, causes: &mut Vec<Cause>) {
    let selector = spec.and_then(|s| s.get("selector"));
    if selector.is_none_or(|s| s.as_object().is_none_or(|m| m.is_empty())) {
        causes.push(Cause::required("spec.selector", ""));
    } else {
        let before = causes.len();
        label_selector(selector, "spec.selector", causes);
        if causes.len() > before {
            return;
        }
        match LabelSelector::from_json(selector.expect("checked")) {
            Ok(sel) => {
                let labels = spec.and_then(|s| s.pointer("/template/metadata/labels"));
                if sel.is_empty() {
                    causes.push(Cause::invalid(
                        "spec.selector",
                        "{}",
                        "empty selector is invalid for deployment",
                    ));
                } else if !sel.matches_json(labels) {
                    let shown = labels.map(|l| l.to_string()).unwrap_or_default();
                    causes.push(Cause::invalid(
                        "spec.template.metadata.labels",
                        &shown,
                        "`selector` does not match template `labels`",
                    ));
                }
            }
            Err(e) => causes.push(Cause::invalid("spec.selector", "", &e.to_string())),
        }
    }
    let template = spec.and_then(|s| s.pointer("/template/spec"));
    // A StatefulSet's claim templates are volumes of its pods (as upstream validates them).
    let with_claims = (kind == "StatefulSet")
        .then(|| {
            let claims = spec?.get("volumeClaimTemplates")?.as_array()?;
            let mut t = template?.clone();
            let volumes = t
                .as_object_mut()?
                .entry("volumes")
                .or_insert_with(|| Value::Array(Vec::new()));
            if !volumes.is_array() {
                *volumes = Value::Array(Vec::new());
            }
            let list = volumes.as_array_mut()?;
            for c in claims {
                let name = c.pointer("/metadata/name").cloned().unwrap_or_default();
                list.retain(|v| v.get("name") != Some(&name));
                list.push(serde_json::json!({"name": name,
                    "persistentVolumeClaim": {"claimName": name}}));
            }
            Some(t)
        })
        .flatten();
    pod_spec(
        with_claims.as_ref().or(template),
        "spec.template.spec",
        causes,
    );
    if kind != "DaemonSet" {
        replicas(spec, causes);
    }
    at_least(spec, "minReadySeconds", "spec", 0, causes);
    at_least(spec, "revisionHistoryLimit", "spec", 0, causes);
    if let Some(p) = str_at(template, "restartPolicy")
        && p != "Always"
    {
        causes.push(Cause::not_supported(
            "spec.template.spec.restartPolicy",
            p,
            &["Always"],
        ));
    }
    match kind {
        "Deployment" => {
            let strategy = spec.and_then(|s| s.get("strategy"));
            one_of(
                strategy,
                "type",
                "spec.strategy",
                &["Recreate", "RollingUpdate"],
                causes,
            );
            let ru = strategy.and_then(|s| s.get("rollingUpdate"));
            if str_at(strategy, "type") == Some("Recreate") && ru.is_some() {
                causes.push(Cause::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
            rolling_update(ru, "spec.strategy.rollingUpdate", causes);
            if let (Some(deadline), min) = (
                int(spec, "progressDeadlineSeconds"),
                int(spec, "minReadySeconds").unwrap_or(0),
            ) && deadline <= min
            {
                causes.push(Cause::invalid(
                    "spec.progressDeadlineSeconds",
                    &deadline.to_string(),
                    "must be greater than minReadySeconds",
                ));
            }
        }
        "DaemonSet" => {
            let strategy = spec.and_then(|s| s.get("updateStrategy"));
            one_of(
                strategy,
                "type",
                "spec.updateStrategy",
                &["OnDelete", "RollingUpdate"],
                causes,
            );
            rolling_update(
                strategy.and_then(|s| s.get("rollingUpdate")),
                "spec.updateStrategy.rollingUpdate",
                causes,
            );
        }
        "StatefulSet" => {
            one_of(
                spec,
                "podManagementPolicy",
                "spec",
                &["OrderedReady", "Parallel"],
                causes,
            );
            let strategy = spec.and_then(|s| s.get("updateStrategy"));
            one_of(
                strategy,
                "type",
                "spec.updateStrategy",
                &["OnDelete", "RollingUpdate"],
                causes,
            );
            at_least(
                strategy.and_then(|s| s.get("rollingUpdate")),
                "partition",
                "spec.updateStrategy.rollingUpdate",
                0,
                causes,
            );
        }
        _ => {}
    }
}

/// An int-or-percent value: its number, or its percentage (`Err` when malformed).
pub(crate) fn int_or_percent(v: &Value) -> Result<(i64, bool), String> {
    match v {
        Value::Number(n) => n.as_i64().map(|n| (n, false)).ok_or_else(|| n.to_string()),
        Value::String(s) => match s.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) => Ok((p, true)),
            _ => Err(s.clone()),
        },
        other => Err(other.to_string()),
    }
}

pub(crate) fn rolling_update(ru: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    let Some(ru) = ru else {
        return;
    };
    let mut zero = [false, false];
    for (i, key) in ["maxUnavailable", "maxSurge"].iter().enumerate() {
        let Some(v) = ru.get(*key).filter(|v| !v.is_null()) else {
            continue;
        };
        let field = format!("{path}.{key}");
        match int_or_percent(v) {
            Ok((n, pct)) => {
                if n < 0 {
                    causes.push(Cause::invalid(
                        &field,
                        &n.to_string(),
                        "must be greater than or equal to 0",
                    ));
                }
                if pct && n > 100 && *key == "maxUnavailable" {
                    causes.push(Cause::invalid(
                        &field,
                        &format!("{n}%"),
                        "must not be greater than 100%",
                    ));
                }
                zero[i] = n == 0;
            }
            Err(shown) => causes.push(Cause::invalid(
                &field,
                &shown,
                "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            )),
        }
    }
    if zero == [true, true] {
        causes.push(Cause::invalid(
            &format!("{path}.maxUnavailable"),
            "0",
            "may not be 0 when `maxSurge` is 0",
        ));
    }
}

pub(crate) fn job_spec(spec: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    label_selector(
        spec.and_then(|s| s.get("selector")),
        &format!("{path}.selector"),
        causes,
    );
    for key in ["parallelism", "completions", "backoffLimit"] {
        at_least(spec, key, path, 0, causes);
    }
    at_least(spec, "activeDeadlineSeconds", path, 1, causes);
    at_least(spec, "ttlSecondsAfterFinished", path, 0, causes);
    one_of(
        spec,
        "completionMode",
        path,
        &["NonIndexed", "Indexed"],
        causes,
    );
    if str_at(spec, "completionMode") == Some("Indexed") && int(spec, "completions").is_none() {
        causes.push(Cause::required(
            &format!("{path}.completions"),
            "when completion mode is Indexed",
        ));
    }
    let template = spec.and_then(|s| s.pointer("/template/spec"));
    let tpath = format!("{path}.template.spec");
    pod_spec(template, &tpath, causes);
    match str_at(template, "restartPolicy") {
        Some("OnFailure" | "Never") => {}
        Some(p) => causes.push(Cause::not_supported(
            &format!("{tpath}.restartPolicy"),
            p,
            &["OnFailure", "Never"],
        )),
        None => {}
    }
}

pub(crate) fn cronjob(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    match str_at(spec, "schedule") {
        None | Some("") => causes.push(Cause::required("spec.schedule", "")),
        Some(s) => {
            let fields = s.split_whitespace().count();
            let ok = if s.starts_with('@') {
                matches!(
                    s,
                    "@yearly"
                        | "@annually"
                        | "@monthly"
                        | "@weekly"
                        | "@daily"
                        | "@midnight"
                        | "@hourly"
                ) || s.starts_with("@every ")
            } else {
                fields == 5
                    && s.split_whitespace().all(|f| {
                        f.bytes().all(|b| {
                            b.is_ascii_alphanumeric()
                                || matches!(b, b'*' | b'/' | b',' | b'-' | b'?')
                        })
                    })
            };
            if !ok {
                causes.push(Cause::invalid(
                    "spec.schedule",
                    s,
                    &format!("expected exactly 5 fields, found {fields}: {s}"),
                ));
            }
        }
    }
    one_of(
        spec,
        "concurrencyPolicy",
        "spec",
        &["Allow", "Forbid", "Replace"],
        causes,
    );
    for key in [
        "successfulJobsHistoryLimit",
        "failedJobsHistoryLimit",
        "startingDeadlineSeconds",
    ] {
        at_least(spec, key, "spec", 0, causes);
    }
    job_spec(
        spec.and_then(|s| s.pointer("/jobTemplate/spec")),
        "spec.jobTemplate.spec",
        causes,
    );
}

/// Upstream's Ingress rules: hosts are DNS names (a leading `*.` allowed), not IPs; paths of
/// `Exact` and `Prefix` type are absolute; `pathType` is one of the three.
pub(crate) fn ingress(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    let Some(spec) = spec else { return };
    for (i, rule) in spec
        .get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(host) = rule.get("host").and_then(Value::as_str) {
            let field = format!("spec.rules[{i}].host");
            let name = host.strip_prefix("*.").unwrap_or(host);
            if host.parse::<std::net::IpAddr>().is_ok() {
                causes.push(Cause::invalid(
                    &field,
                    host,
                    "must be a DNS name, not an IP address",
                ));
            } else if !is_subdomain(name) {
                causes.push(Cause::invalid(&field, host, super::SUBDOMAIN_MSG));
            }
        }
        for (j, p) in rule
            .pointer("/http/paths")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let base = format!("spec.rules[{i}].http.paths[{j}]");
            let kind = p.get("pathType").and_then(Value::as_str);
            match kind {
                None => causes.push(Cause::required(
                    &format!("{base}.pathType"),
                    "pathType must be specified",
                )),
                Some("Exact" | "Prefix" | "ImplementationSpecific") => {}
                Some(other) => causes.push(Cause::not_supported(
                    &format!("{base}.pathType"),
                    other,
                    &["Exact", "ImplementationSpecific", "Prefix"],
                )),
            }
            if let Some(path) = p.get("path").and_then(Value::as_str)
                && matches!(kind, Some("Exact" | "Prefix"))
                && !path.starts_with('/')
            {
                causes.push(Cause::invalid(
                    &format!("{base}.path"),
                    path,
                    "must be an absolute path",
                ));
            }
        }
    }
}

/// The key usages a CSR may ask for (upstream's `KeyUsage` values).
const KEY_USAGES: [&str; 22] = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
];

/// The PEM blocks of base64-encoded `field` (a `[]byte` in JSON): their labels and DER.
pub(crate) fn pem_blocks(v: &Value) -> Option<Vec<(String, Vec<u8>)>> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(v.as_str()?)
        .ok()?;
    let mut out = Vec::new();
    for item in rustls::pki_types::pem::PemObject::pem_slice_iter(&raw) {
        let (kind, der): (rustls::pki_types::pem::SectionKind, Vec<u8>) = item.ok()?;
        let label = match kind {
            rustls::pki_types::pem::SectionKind::Certificate => "CERTIFICATE",
            rustls::pki_types::pem::SectionKind::Csr => "CERTIFICATE REQUEST",
            _ => "OTHER",
        };
        out.push((label.to_owned(), der));
    }
    Some(out)
}

/// A CertificateSigningRequest (upstream's `ValidateCertificateSigningRequestCreate` and the
/// condition rules of its status and approval updates).
pub(crate) fn csr(obj: &Value, causes: &mut Vec<Cause>) {
    use x509_parser::prelude::FromDer;
    let spec = obj.get("spec");
    match spec.and_then(|s| s.get("request")) {
        None => causes.push(Cause::required("spec.request", "")),
        Some(req) => {
            let blocks = pem_blocks(req).unwrap_or_default();
            let parsed = match blocks.first() {
                Some((label, der)) if label == "CERTIFICATE REQUEST" => {
                    x509_parser::certification_request::X509CertificationRequest::from_der(der)
                        .map(|_| ())
                        .map_err(|e| format!("the CSR does not parse: {e}"))
                }
                _ => Err("PEM block type must be CERTIFICATE REQUEST".to_owned()),
            };
            if let Err(msg) = parsed {
                causes.push(Cause::invalid("spec.request", "[]byte{...}", &msg));
            }
        }
    }
    match str_at(spec, "signerName") {
        None | Some("") => causes.push(Cause::required("spec.signerName", "")),
        Some("kubernetes.io/legacy-unknown") => causes.push(Cause::invalid(
            "spec.signerName",
            "kubernetes.io/legacy-unknown",
            "the legacy signerName is not allowed via this API version",
        )),
        Some(name) => {
            let ok = name.split_once('/').is_some_and(|(domain, path)| {
                is_subdomain(domain)
                    && !path.is_empty()
                    && path.len() <= 253
                    && path
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            });
            if !ok {
                causes.push(Cause::invalid(
                    "spec.signerName",
                    name,
                    "must be a fully qualified domain and path of the form 'example.com/signer-name'",
                ));
            }
        }
    }
    if let Some(secs) = int(spec, "expirationSeconds")
        && secs < 600
    {
        causes.push(Cause::invalid(
            "spec.expirationSeconds",
            &secs.to_string(),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    if let Some(spec) = spec {
        for (i, u) in items(spec, "usages") {
            let u = u.as_str().unwrap_or("");
            if !KEY_USAGES.contains(&u) {
                causes.push(Cause::not_supported(
                    &format!("spec.usages[{i}]"),
                    u,
                    &KEY_USAGES,
                ));
            }
        }
    }
    let status = obj.get("status");
    let mut seen = HashSet::new();
    if let Some(status) = status {
        for (i, c) in items(status, "conditions") {
            let ty = str_at(Some(c), "type").unwrap_or("");
            let path = format!("status.conditions[{i}]");
            if ty.is_empty() {
                causes.push(Cause::required(&format!("{path}.type"), ""));
            }
            let st = str_at(Some(c), "status").unwrap_or("");
            if ["Approved", "Denied", "Failed"].contains(&ty) {
                if !seen.insert(ty.to_owned()) {
                    causes.push(Cause::duplicate(&format!("{path}.type"), ty));
                }
                if st != "True" && !(ty == "Failed" && st.is_empty()) {
                    causes.push(Cause::not_supported(
                        &format!("{path}.status"),
                        st,
                        &["True"],
                    ));
                }
            } else if !["True", "False", "Unknown"].contains(&st) {
                causes.push(Cause::not_supported(
                    &format!("{path}.status"),
                    st,
                    &["False", "True", "Unknown"],
                ));
            }
        }
        if let Some(cert) = status.get("certificate") {
            let ok = pem_blocks(cert).is_some_and(|b| {
                !b.is_empty()
                    && b.iter().all(|(label, der)| {
                        label == "CERTIFICATE"
                            && x509_parser::certificate::X509Certificate::from_der(der).is_ok()
                    })
            });
            if !ok {
                causes.push(Cause::invalid(
                    "status.certificate",
                    "<certificate data>",
                    "must contain at least one CERTIFICATE PEM block",
                ));
            }
        }
    }
    if seen.contains("Approved") && seen.contains("Denied") {
        causes.push(Cause::invalid(
            "status.conditions",
            "Approved",
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
}

pub(crate) fn hpa(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    let target = spec.and_then(|s| s.get("scaleTargetRef"));
    require(target, "kind", "spec.scaleTargetRef", "", causes);
    match str_at(target, "name") {
        None | Some("") => causes.push(Cause::required("spec.scaleTargetRef.name", "")),
        Some(n) => causes.extend(super::check_name(
            crate::registry::NameRule::Path,
            "spec.scaleTargetRef.name",
            n,
        )),
    }
    let min = int(spec, "minReplicas");
    let max = int(spec, "maxReplicas").unwrap_or(0);
    if let Some(m) = min
        && m < 1
    {
        // minReplicas 0 needs the HPAScaleToZero feature gate, which is off (as upstream's default).
        causes.push(Cause::invalid(
            "spec.minReplicas",
            &m.to_string(),
            "must be greater than or equal to 1",
        ));
    }
    if max < 1 {
        causes.push(Cause::invalid(
            "spec.maxReplicas",
            &max.to_string(),
            "must be greater than 0",
        ));
    }
    if let Some(m) = min
        && max < m
    {
        causes.push(Cause::invalid(
            "spec.maxReplicas",
            &max.to_string(),
            "must be greater than or equal to `minReplicas`",
        ));
    }
    // autoscaling/v1
    if let Some(p) = int(spec, "targetCPUUtilizationPercentage")
        && p < 1
    {
        causes.push(Cause::invalid(
            "spec.targetCPUUtilizationPercentage",
            &p.to_string(),
            "must be greater than or equal to 1",
        ));
    }
    // autoscaling/v2
    if let Some(metrics) = spec
        .and_then(|s| s.get("metrics"))
        .and_then(Value::as_array)
    {
        for (i, m) in metrics.iter().enumerate() {
            hpa_metric(m, &format!("spec.metrics[{i}]"), causes);
        }
    }
    if let Some(b) = spec.and_then(|s| s.get("behavior")) {
        for dir in ["scaleUp", "scaleDown"] {
            let Some(rules) = b.get(dir) else { continue };
            let path = format!("spec.behavior.{dir}");
            if let Some(w) = int(Some(rules), "stabilizationWindowSeconds")
                && !(0..=3600).contains(&w)
            {
                causes.push(Cause::invalid(
                    &format!("{path}.stabilizationWindowSeconds"),
                    &w.to_string(),
                    if w < 0 {
                        "must be greater than or equal to zero"
                    } else {
                        "must be less than or equal to 3600"
                    },
                ));
            }
            one_of(
                Some(rules),
                "selectPolicy",
                &path,
                &["Max", "Min", "Disabled"],
                causes,
            );
            let policies = rules.get("policies").and_then(Value::as_array);
            if policies.is_some_and(Vec::is_empty) {
                causes.push(Cause::required(
                    &format!("{path}.policies"),
                    "must specify at least one Policy",
                ));
            }
            for (j, p) in policies.into_iter().flatten().enumerate() {
                let ppath = format!("{path}.policies[{j}]");
                one_of(Some(p), "type", &ppath, &["Pods", "Percent"], causes);
                if int(Some(p), "value").is_none_or(|v| v <= 0) {
                    causes.push(Cause::invalid(
                        &format!("{ppath}.value"),
                        &int(Some(p), "value").unwrap_or(0).to_string(),
                        "must be greater than zero",
                    ));
                }
                let period = int(Some(p), "periodSeconds").unwrap_or(0);
                if !(1..=1800).contains(&period) {
                    causes.push(Cause::invalid(
                        &format!("{ppath}.periodSeconds"),
                        &period.to_string(),
                        if period <= 0 {
                            "must be greater than zero"
                        } else {
                            "must be less than or equal to 1800"
                        },
                    ));
                }
            }
        }
    }
}

pub(crate) fn hpa_metric(m: &Value, path: &str, causes: &mut Vec<Cause>) {
    const TYPES: [(&str, &str); 5] = [
        ("Object", "object"),
        ("Pods", "pods"),
        ("Resource", "resource"),
        ("ContainerResource", "containerResource"),
        ("External", "external"),
    ];
    let Some(ty) = m.get("type").and_then(Value::as_str) else {
        causes.push(Cause::required(
            &format!("{path}.type"),
            "must specify a metric source type",
        ));
        return;
    };
    let Some((_, field)) = TYPES.iter().find(|(t, _)| *t == ty) else {
        let allowed: Vec<&str> = TYPES.iter().map(|(t, _)| *t).collect();
        causes.push(Cause::not_supported(&format!("{path}.type"), ty, &allowed));
        return;
    };
    let Some(source) = m.get(*field) else {
        causes.push(Cause::required(
            &format!("{path}.{field}"),
            &format!("must populate information for the given metric source (type {ty})"),
        ));
        return;
    };
    let spath = format!("{path}.{field}");
    if matches!(ty, "Resource" | "ContainerResource") {
        require(
            Some(source),
            "name",
            &spath,
            "must specify a resource name",
            causes,
        );
    }
    if ty == "ContainerResource" {
        require(
            Some(source),
            "container",
            &spath,
            "must specify a container",
            causes,
        );
    }
    let target = source.get("target");
    let tpath = format!("{spath}.target");
    match str_at(target, "type") {
        None | Some("") => causes.push(Cause::required(
            &format!("{tpath}.type"),
            "must specify a metric target type",
        )),
        Some("Utilization") => {
            if int(target, "averageUtilization").is_none_or(|u| u <= 0) {
                causes.push(Cause::required(
                    &format!("{tpath}.averageUtilization"),
                    "must set either a target raw value or a target utilization",
                ));
            }
        }
        Some("Value") if target.and_then(|t| t.get("value")).is_none() => {
            causes.push(Cause::required(
                &format!("{tpath}.value"),
                "must set either a target value for metric or a per-pod target",
            ))
        }
        Some("AverageValue") if target.and_then(|t| t.get("averageValue")).is_none() => causes
            .push(Cause::required(
                &format!("{tpath}.averageValue"),
                "must set either a target value for metric or a per-pod target",
            )),
        Some("Value" | "AverageValue") => {}
        Some(t) => causes.push(Cause::not_supported(
            &format!("{tpath}.type"),
            t,
            &["Utilization", "Value", "AverageValue"],
        )),
    }
}

pub(crate) fn pdb(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    let min = spec
        .and_then(|s| s.get("minAvailable"))
        .filter(|v| !v.is_null());
    let max = spec
        .and_then(|s| s.get("maxUnavailable"))
        .filter(|v| !v.is_null());
    if min.is_some() && max.is_some() {
        causes.push(Cause::invalid(
            "spec",
            "",
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (key, v) in [("minAvailable", min), ("maxUnavailable", max)] {
        let Some(v) = v else { continue };
        let field = format!("spec.{key}");
        match int_or_percent(v) {
            Ok((n, _)) if n < 0 => causes.push(Cause::invalid(
                &field,
                &n.to_string(),
                "must be greater than or equal to 0",
            )),
            Ok((n, true)) if n > 100 => causes.push(Cause::invalid(
                &field,
                &format!("{n}%"),
                "must not be greater than 100%",
            )),
            Ok(_) => {}
            Err(shown) => causes.push(Cause::invalid(
                &field,
                &shown,
                "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            )),
        }
    }
    label_selector(
        spec.and_then(|s| s.get("selector")),
        "spec.selector",
        causes,
    );
    one_of(
        spec,
        "unhealthyPodEvictionPolicy",
        "spec",
        &["IfHealthyBudget", "AlwaysAllow"],
        causes,
    );
}

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

/// The volume sources a PersistentVolume may have here (node-local ones).
const PV_SOURCES: &[&str] = &["hostPath", "local"];

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
        0 => causes.push(Cause::required(
            "spec",
            "must specify a volume type (hostPath or local)",
        )),
        1 => {}
        _ => causes.push(Cause::forbidden(
            &format!("spec.{}", sources[1]),
            "may not specify more than 1 volume type",
        )),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn causes(group: &str, kind: &str, obj: Value) -> Vec<String> {
        let mut out = Vec::new();
        crate::kinds::builtin(group, kind).validate(&obj, &mut out);
        out.iter().map(Cause::line).collect()
    }

    #[test]
    fn claims_and_volumes_need_modes_sizes_and_one_source() {
        assert_eq!(
            causes("", "PersistentVolumeClaim", json!({"spec": {}})),
            [
                "spec.accessModes: Required value",
                "spec.resources[storage]: Required value"
            ]
        );
        assert_eq!(
            causes(
                "",
                "PersistentVolumeClaim",
                json!({"spec": {"accessModes": ["ReadWriteSometimes"],
                    "resources": {"requests": {"storage": "0"}}}})
            ),
            [
                "spec.accessModes[0]: Unsupported value: \"ReadWriteSometimes\": supported values: \"ReadWriteOnce\", \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOncePod\"",
                "spec.resources[storage]: Invalid value: \"0\": must be greater than zero"
            ]
        );
        assert_eq!(
            causes(
                "",
                "PersistentVolume",
                json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                    "local": {"path": "/x"}}})
            ),
            ["spec.nodeAffinity: Required value: Local volume requires node affinity"]
        );
        assert_eq!(
            causes(
                "",
                "PersistentVolume",
                json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}})
            ),
            ["spec: Required value: must specify a volume type (hostPath or local)"]
        );
    }

    #[test]
    fn ingress_hosts_paths_and_path_types_follow_upstream() {
        let bad = json!({"spec": {"rules": [
            {"host": "Bad_Host", "http": {"paths": [{"path": "api", "pathType": "Prefix"}, {"path": "/x"}]}},
            {"host": "10.0.0.1"},
            {"host": "*.example.com", "http": {"paths": [{"path": "/", "pathType": "Whatever"}]}}]}});
        let got = causes("networking.k8s.io", "Ingress", bad);
        assert_eq!(got.len(), 5, "{got:#?}");
        assert!(got[0].starts_with(
            "spec.rules[0].host: Invalid value: \"Bad_Host\": a lowercase RFC 1123 subdomain"
        ));
        assert_eq!(
            got[1],
            "spec.rules[0].http.paths[0].path: Invalid value: \"api\": must be an absolute path"
        );
        assert_eq!(
            got[2],
            "spec.rules[0].http.paths[1].pathType: Required value: pathType must be specified"
        );
        assert_eq!(
            got[3],
            "spec.rules[1].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address"
        );
        assert!(
            got[4].starts_with(
                "spec.rules[2].http.paths[0].pathType: Unsupported value: \"Whatever\""
            ),
            "{}",
            got[4]
        );
        let good = json!({"spec": {"rules": [{"host": "*.a.example", "http": {"paths": [{"path": "/", "pathType": "Prefix"}]}}]}});
        assert!(causes("networking.k8s.io", "Ingress", good).is_empty());
    }

    #[test]
    fn hpa_replica_bounds_follow_upstream() {
        let bad = json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 5, "maxReplicas": 2}});
        assert_eq!(
            causes("autoscaling", "HorizontalPodAutoscaler", bad),
            [
                "spec.maxReplicas: Invalid value: \"2\": must be greater than or equal to `minReplicas`"
            ]
        );
        let zero = json!({"spec": {"scaleTargetRef": {"name": "web"}, "minReplicas": 0, "maxReplicas": 0}});
        let got = causes("autoscaling", "HorizontalPodAutoscaler", zero);
        assert!(
            got.iter()
                .any(|c| c.starts_with("spec.scaleTargetRef.kind: Required")),
            "{got:?}"
        );
        assert!(
            got.iter().any(|c| c.starts_with("spec.minReplicas")),
            "{got:?}"
        );
        assert!(
            got.iter().any(|c| c.contains("must be greater than 0")),
            "{got:?}"
        );
        let metric = json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}],
            "behavior": {"scaleDown": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 4000}]}}}});
        let got = causes("autoscaling", "HorizontalPodAutoscaler", metric);
        assert_eq!(got.len(), 3, "{got:?}");
    }

    #[test]
    fn pod_specs_check_enums_ports_mounts_and_requests_against_limits() {
        let pod = json!({"spec": {"restartPolicy": "Sometimes", "containers": [{"name": "c", "image": "i",
            "ports": [{"containerPort": 70000}], "volumeMounts": [{"name": "nope", "mountPath": "/x"}],
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]}});
        let got = causes("", "Pod", pod);
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got[0].starts_with("spec.restartPolicy: Unsupported value: \"Sometimes\""));
        assert!(
            got.iter()
                .any(|c| c == "spec.containers[0].volumeMounts[0].name: Not found: \"nope\"")
        );
        assert!(
            got.iter()
                .any(|c| c.ends_with("must be less than or equal to cpu limit"))
        );
    }

    #[test]
    fn services_jobs_deployments_and_budgets_are_checked() {
        let svc =
            json!({"spec": {"type": "Weird", "ports": [{"port": 80}, {"port": 80, "name": "b"}]}});
        assert_eq!(causes("", "Service", svc).len(), 3);
        let job = json!({"spec": {"parallelism": -1, "template": {"spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "i"}]}}}});
        assert_eq!(causes("batch", "Job", job).len(), 2);
        let d = json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        assert_eq!(
            causes("apps", "Deployment", d),
            [
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: \"0\": may not be 0 when `maxSurge` is 0"
            ]
        );
        let pdb = json!({"spec": {"minAvailable": 1, "maxUnavailable": "10%"}});
        assert_eq!(causes("policy", "PodDisruptionBudget", pdb).len(), 1);
        let cj = json!({"spec": {"schedule": "every minute", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}}});
        assert_eq!(causes("batch", "CronJob", cj).len(), 1);
    }
}

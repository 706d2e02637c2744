//! The spec validators of Ingresses (upstream's `pkg/apis/networking/validation`).

use super::*;

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
                causes.push(Cause::invalid(
                    &field,
                    host,
                    crate::registry::validation::SUBDOMAIN_MSG,
                ));
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

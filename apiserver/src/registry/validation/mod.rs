//! Validation shared by every kind (object metadata: names, labels, annotations) and the
//! per-kind rules of upstream's `ValidateX` functions (`kinds`), each producing upstream's
//! field causes.

pub(crate) mod specs;

use crate::error::Cause;
use crate::registry::{NameRule, ResourceInfo};
use serde_json::Value;

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub(crate) const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

pub(crate) fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a lowercase RFC 1123 subdomain: at most 253 characters, dot-separated
/// parts of label characters (upstream's regex sets no length per part).
pub fn is_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

/// Whether `s` is a DNS-1035 label (starts with a letter).
pub fn is_dns1035(s: &str) -> bool {
    is_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// Validates a qualified name (`prefix/name`): label and annotation keys, condition names.
pub(crate) fn check_qualified_name(field: &str, key: &str, causes: &mut Vec<Cause>) {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_subdomain(p)
    {
        causes.push(Cause::invalid(
            field,
            key,
            &format!("prefix part {SUBDOMAIN_MSG}"),
        ));
    }
    if !is_qualified_name_part(name) {
        causes.push(Cause::invalid(field, key, QUALIFIED_NAME_MSG));
    }
}

/// Validates a label value at `field`.
fn check_label_value(field: &str, v: &str, causes: &mut Vec<Cause>) {
    if !(v.is_empty() || is_qualified_name_part(v)) {
        causes.push(Cause::invalid(field, v, LABEL_VALUE_MSG));
    }
}

/// Validates a map of labels (keys and values) at `field`, as upstream's `ValidateLabels`.
pub fn labels(v: Option<&Value>, field: &str, causes: &mut Vec<Cause>) {
    for (k, val) in v.and_then(Value::as_object).into_iter().flatten() {
        check_qualified_name(field, k, causes);
        check_label_value(field, val.as_str().unwrap_or_default(), causes);
    }
}

/// Validates a `metav1.LabelSelector` at `field`, as upstream's `ValidateLabelSelector`:
/// matchLabels as labels; each expression's key, a known operator, values required for
/// `In`/`NotIn` and forbidden for `Exists`/`DoesNotExist`, each a valid label value.
pub fn label_selector(sel: Option<&Value>, field: &str, causes: &mut Vec<Cause>) {
    let Some(sel) = sel.filter(|s| !s.is_null()) else {
        return;
    };
    labels(
        sel.get("matchLabels"),
        &format!("{field}.matchLabels"),
        causes,
    );
    let exprs = sel.get("matchExpressions").and_then(Value::as_array);
    for (i, e) in exprs.into_iter().flatten().enumerate() {
        let at = format!("{field}.matchExpressions[{i}]");
        let values = e.get("values").and_then(Value::as_array);
        let n = values.map_or(0, Vec::len);
        match e
            .get("operator")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "In" | "NotIn" if n == 0 => causes.push(Cause::required(
                &format!("{at}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if n > 0 => causes.push(Cause::forbidden(
                &format!("{at}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => causes.push(Cause::invalid(
                &format!("{at}.operator"),
                other,
                "not a valid selector operator",
            )),
        }
        check_qualified_name(
            &format!("{at}.key"),
            e.get("key").and_then(Value::as_str).unwrap_or_default(),
            causes,
        );
        for (j, v) in values.into_iter().flatten().enumerate() {
            check_label_value(
                &format!("{at}.values[{j}]"),
                v.as_str().unwrap_or_default(),
                causes,
            );
        }
    }
}

/// Validates `name` by the kind's rule; returns the causes.
pub fn check_name(rule: NameRule, field: &str, name: &str) -> Vec<Cause> {
    let problem = match rule {
        NameRule::Subdomain => (!is_subdomain(name)).then(|| SUBDOMAIN_MSG.to_owned()),
        NameRule::Dns1035Label => (!is_dns1035(name)).then(|| DNS1035_MSG.to_owned()),
        NameRule::Label => (!is_label(name)).then(|| LABEL_MSG.to_owned()),
        NameRule::Path => {
            (name.is_empty() || name == "." || name == ".." || name.contains(['/', '%']))
                .then(|| "may not be '.' or '..' and may not contain '/' or '%'".to_owned())
        }
        // Upstream's ValidateIPAddressName: an address, written in its canonical form.
        NameRule::Ip => match name.parse::<std::net::IpAddr>() {
            Err(_) => Some("must be a valid ip address".to_owned()),
            Ok(ip) if ip.to_string() != name => {
                Some(format!("must be in canonical form (\"{ip}\")"))
            }
            Ok(_) => None,
        },
    };
    problem
        .map(|msg| vec![Cause::invalid(field, name, &msg)])
        .unwrap_or_default()
}

/// Validates `metadata`: name, namespace, labels, annotations.
pub fn validate_meta(info: &ResourceInfo, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let meta = obj.get("metadata").unwrap_or(&Value::Null);
    match meta.get("name").and_then(Value::as_str) {
        None | Some("") => causes.push(Cause::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(name) => causes.extend(check_name(info.name_rule, "metadata.name", name)),
    }
    labels(meta.get("labels"), "metadata.labels", &mut causes);
    if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0;
        for (k, v) in ann {
            check_qualified_name("metadata.annotations", k, &mut causes);
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > 256 * 1024 {
            causes.push(Cause {
                reason: "FieldValueTooLong".into(),
                message: "Too long: must have at most 262144 bytes".into(),
                field: "metadata.annotations".into(),
            });
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_upstream_rules() {
        assert!(is_subdomain("my.app-1"));
        assert!(!is_subdomain("My_App"));
        assert!(!is_subdomain("-x"));
        // No limit per part: pod names of 64+ characters are valid subdomains upstream.
        assert!(is_subdomain(&"a".repeat(100)));
        assert!(!is_subdomain(&"a".repeat(254)));
        assert!(is_dns1035("web"));
        assert!(!is_dns1035("1web"));
        assert!(check_name(NameRule::Path, "metadata.name", "system:admin").is_empty());
        let causes = check_name(NameRule::Subdomain, "metadata.name", "Bad_Name");
        assert_eq!(causes[0].field, "metadata.name");
        assert!(causes[0].message.contains("RFC 1123 subdomain"));
        assert!(check_name(NameRule::Ip, "metadata.name", "fe80::42:1dff:fe84:f9e2").is_empty());
        assert!(check_name(NameRule::Ip, "metadata.name", "255.255.255.255").is_empty());
        let causes = check_name(NameRule::Ip, "metadata.name", "fe80:0::1");
        assert!(causes[0].message.contains("canonical form (\"fe80::1\")"));
        assert_eq!(check_name(NameRule::Ip, "metadata.name", "x").len(), 1);
    }

    #[test]
    fn label_selectors_are_validated_as_upstreams() {
        let check = |v: serde_json::Value| {
            let mut causes = Vec::new();
            label_selector(Some(&v), "spec.selector", &mut causes);
            causes.iter().map(Cause::line).collect::<Vec<_>>()
        };
        assert_eq!(
            check(serde_json::json!({"matchExpressions": [{"key": "app", "operator": "In"}]})),
            [
                "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
            ]
        );
        assert_eq!(
            check(
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]})
            ),
            [
                "spec.selector.matchExpressions[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            ]
        );
        assert_eq!(check(serde_json::json!({"matchExpressions": [{"key": "app", "operator": "Is", "values": ["x"]}]})).len(), 1);
        assert_eq!(
            check(serde_json::json!({"matchLabels": {"bad key!": "v"}})).len(),
            1
        );
        assert!(check(serde_json::json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]})).is_empty());
    }
}

//! Admission configuration (admissionregistration.k8s.io/v1): webhook configurations,
//! ValidatingAdmissionPolicies and their bindings, with upstream's defaults and the
//! validation of their CEL expressions (`pkg/apis/admissionregistration/validation`).

use super::{Row, Strategy, s};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::defaults::{child, set_default};
use crate::registry::rules;
use serde_json::{Value, json};

/// Upstream's limit on `matchConditions` per webhook or policy.
const MAX_MATCH_CONDITIONS: usize = 64;

fn each<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = (usize, &'a Value)> {
    v.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
}

fn each_mut(v: &mut Value, key: &str, f: impl Fn(&mut Value)) {
    if let Some(list) = v.get_mut(key).and_then(Value::as_array_mut) {
        list.iter_mut().for_each(f);
    }
}

/// A CEL expression at `field`: present and compiling.
fn expression(field: &str, expr: Option<&str>, causes: &mut Vec<Cause>) {
    match expr {
        None | Some("") => causes.push(Cause::required(field, "")),
        Some(e) => {
            if let Err(err) = rules::compile(e) {
                causes.push(Cause::invalid(field, e, &err.to_string()));
            }
        }
    }
}

/// `matchConditions`: at most 64, each with a unique qualified name and a compiling
/// expression.
fn match_conditions(v: &Value, field: &str, causes: &mut Vec<Cause>) {
    let list: Vec<(usize, &Value)> = each(v, "matchConditions").collect();
    if list.len() > MAX_MATCH_CONDITIONS {
        causes.push(Cause {
            reason: "FieldValueTooMany".into(),
            message: format!(
                "Too many: {}: must have at most {MAX_MATCH_CONDITIONS} items",
                list.len()
            ),
            field: format!("{field}.matchConditions"),
        });
    }
    let mut seen = Vec::new();
    for (i, c) in list {
        let at = format!("{field}.matchConditions[{i}]");
        match c.get("name").and_then(Value::as_str) {
            None | Some("") => causes.push(Cause::required(&format!("{at}.name"), "")),
            Some(name) => {
                crate::registry::validation::check_qualified_name(
                    &format!("{at}.name"),
                    name,
                    causes,
                );
                if seen.contains(&name) {
                    causes.push(Cause::duplicate(&format!("{at}.name"), name));
                }
                seen.push(name);
            }
        }
        expression(
            &format!("{at}.expression"),
            c.get("expression").and_then(Value::as_str),
            causes,
        );
    }
}

/// Defaults of a `matchResources`/`matchConstraints` (`SetDefaults_MatchResources`).
fn default_match_resources(m: &mut Value) {
    set_default(m, "matchPolicy", json!("Equivalent"));
    set_default(m, "namespaceSelector", json!({}));
    set_default(m, "objectSelector", json!({}));
    for key in ["resourceRules", "excludeResourceRules"] {
        each_mut(m, key, |r| set_default(r, "scope", json!("*")));
    }
}

/// `MutatingWebhookConfiguration` and `ValidatingWebhookConfiguration`.
pub struct WebhookConfiguration;

impl Strategy for WebhookConfiguration {
    fn default(&self, obj: &mut Value) {
        let mutating =
            obj.get("kind").and_then(Value::as_str) == Some("MutatingWebhookConfiguration");
        each_mut(obj, "webhooks", |w| {
            set_default(w, "failurePolicy", json!("Fail"));
            set_default(w, "matchPolicy", json!("Equivalent"));
            set_default(w, "namespaceSelector", json!({}));
            set_default(w, "objectSelector", json!({}));
            set_default(w, "timeoutSeconds", json!(10));
            if mutating {
                set_default(w, "reinvocationPolicy", json!("Never"));
            }
            each_mut(w, "rules", |r| set_default(r, "scope", json!("*")));
            if let Some(service) = w.pointer_mut("/clientConfig/service") {
                set_default(service, "port", json!(443));
            }
        });
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        for (i, w) in each(obj, "webhooks") {
            match_conditions(w, &format!("webhooks[{i}]"), causes);
        }
    }
}

/// `ValidatingAdmissionPolicy`.
pub struct ValidatingAdmissionPolicy;

impl Strategy for ValidatingAdmissionPolicy {
    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "failurePolicy", json!("Fail"));
        if let Some(m) = spec.get_mut("matchConstraints") {
            default_match_resources(m);
        }
    }

    fn prepare_for_create(&self, obj: &mut Value, _user: &crate::auth::User) {
        if let Some(o) = obj.as_object_mut() {
            o.insert("status".into(), json!({}));
        }
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        let spec = obj.get("spec").unwrap_or(&Value::Null);
        match spec.get("matchConstraints") {
            None | Some(Value::Null) => causes.push(Cause::required("spec.matchConstraints", "")),
            Some(m) => {
                if each(m, "resourceRules").next().is_none() {
                    causes.push(Cause::required("spec.matchConstraints.resourceRules", ""));
                }
            }
        }
        if each(spec, "validations").next().is_none()
            && each(spec, "auditAnnotations").next().is_none()
        {
            causes.push(Cause::required(
                "spec.validations",
                "validations or auditAnnotations must contain at least one item",
            ));
        }
        if let Some(f) = spec.get("failurePolicy").and_then(Value::as_str)
            && !matches!(f, "Fail" | "Ignore")
        {
            causes.push(Cause::not_supported(
                "spec.failurePolicy",
                f,
                &["Fail", "Ignore"],
            ));
        }
        for (i, v) in each(spec, "validations") {
            let at = format!("spec.validations[{i}]");
            expression(
                &format!("{at}.expression"),
                v.get("expression").and_then(Value::as_str),
                causes,
            );
            if let Some(m) = v.get("messageExpression").and_then(Value::as_str)
                && !m.is_empty()
            {
                expression(&format!("{at}.messageExpression"), Some(m), causes);
            }
        }
        for (i, v) in each(spec, "variables") {
            let at = format!("spec.variables[{i}]");
            if v.get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                causes.push(Cause::required(
                    &format!("{at}.name"),
                    "name is not specified",
                ));
            }
            expression(
                &format!("{at}.expression"),
                v.get("expression").and_then(Value::as_str),
                causes,
            );
        }
        for (i, a) in each(spec, "auditAnnotations") {
            let at = format!("spec.auditAnnotations[{i}]");
            expression(
                &format!("{at}.valueExpression"),
                a.get("valueExpression").and_then(Value::as_str),
                causes,
            );
        }
        match_conditions(spec, "spec", causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Validations", "integer", 0, || {
            super::len(o, "/spec/validations") as i64
        });
        row.col("ParamKind", "string", 0, || {
            match o.pointer("/spec/paramKind") {
                Some(p) => format!("{}/{}", s(p, "/apiVersion"), s(p, "/kind")),
                None => "<unset>".into(),
            }
        });
        row.age(o);
    }
}

/// `ValidatingAdmissionPolicyBinding`.
pub struct ValidatingAdmissionPolicyBinding;

impl Strategy for ValidatingAdmissionPolicyBinding {
    fn default(&self, obj: &mut Value) {
        if let Some(m) = obj.pointer_mut("/spec/matchResources") {
            default_match_resources(m);
        }
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        let spec = obj.get("spec").unwrap_or(&Value::Null);
        if spec
            .get("policyName")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            causes.push(Cause::required("spec.policyName", ""));
        }
        let actions = crate::object::strings_at(spec, "/validationActions");
        if actions.is_empty() {
            causes.push(Cause::required("spec.validationActions", ""));
        }
        let mut seen: Vec<&str> = Vec::new();
        for (i, a) in actions.iter().enumerate() {
            let at = format!("spec.validationActions[{i}]");
            if !matches!(a.as_str(), "Deny" | "Warn" | "Audit") {
                causes.push(Cause::not_supported(&at, a, &["Audit", "Deny", "Warn"]));
            } else if seen.contains(&a.as_str()) {
                causes.push(Cause::duplicate(&at, a));
            }
            seen.push(a);
        }
        if seen.contains(&"Deny") && seen.contains(&"Warn") {
            causes.push(Cause::invalid(
                "spec.validationActions",
                &format!("{actions:?}"),
                "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
            ));
        }
        if let Some(p) = spec.get("paramRef").filter(|p| !p.is_null()) {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("");
            if !name.is_empty() && p.get("selector").is_some_and(|s| !s.is_null()) {
                causes.push(Cause::forbidden(
                    "spec.paramRef.name",
                    "name and selector are mutually exclusive",
                ));
            }
            match p.get("parameterNotFoundAction").and_then(Value::as_str) {
                None => causes.push(Cause::required("spec.paramRef.parameterNotFoundAction", "")),
                Some(a) if !matches!(a, "Allow" | "Deny") => causes.push(Cause::not_supported(
                    "spec.paramRef.parameterNotFoundAction",
                    a,
                    &["Allow", "Deny"],
                )),
                Some(_) => {}
            }
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("PolicyName", "string", 0, || s(o, "/spec/policyName"));
        row.col("ParamRef", "string", 0, || {
            match o.pointer("/spec/paramRef") {
                Some(p) => {
                    let (ns, name) = (s(p, "/namespace"), s(p, "/name"));
                    match ns.is_empty() {
                        true => format!("*/{name}"),
                        false => format!("{ns}/{name}"),
                    }
                }
                None => "<unset>".into(),
            }
        });
        row.age(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn causes(strategy: &dyn Strategy, mut obj: Value) -> Vec<String> {
        strategy.default(&mut obj);
        let mut causes = Vec::new();
        strategy.validate(&obj, &mut causes);
        causes.iter().map(Cause::line).collect()
    }

    #[test]
    fn bad_match_conditions_are_refused_with_upstreams_words() {
        let hook = |conditions: Value| {
            json!({"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "w"},
                "webhooks": [{"name": "w.example.com", "matchConditions": conditions}]})
        };
        let got = causes(
            &WebhookConfiguration,
            hook(json!([{"name": "invalid-expression-1", "expression": "... [] bad expression"}])),
        );
        assert_eq!(got.len(), 1);
        assert!(got[0].starts_with("webhooks[0].matchConditions[0].expression: Invalid value: \"... [] bad expression\": compilation failed"), "{got:?}");
        let got = causes(
            &WebhookConfiguration,
            hook(json!([{"name": "a", "expression": "true"}, {"name": "a", "expression": "true"}])),
        );
        assert_eq!(
            got,
            ["webhooks[0].matchConditions[1].name: Duplicate value: \"a\""]
        );
        assert!(
            causes(
                &WebhookConfiguration,
                hook(json!([{"name": "skip", "expression": "object.metadata.name != 'skip-me'"}]))
            )
            .is_empty()
        );
    }

    #[test]
    fn policies_and_bindings_are_validated() {
        let got = causes(
            &ValidatingAdmissionPolicy,
            json!({"spec": {"matchConstraints": {"resourceRules": [{"apiGroups": ["apps"]}]},
                "validations": [{"expression": "object.spec.replicas >"}]}}),
        );
        assert_eq!(got.len(), 1);
        assert!(got[0].starts_with("spec.validations[0].expression: Invalid value"));
        let got = causes(&ValidatingAdmissionPolicy, json!({"spec": {}}));
        assert_eq!(got.len(), 2);
        let got = causes(
            &ValidatingAdmissionPolicyBinding,
            json!({"spec": {"policyName": "p", "validationActions": ["Deny", "Warn"]}}),
        );
        assert_eq!(got.len(), 1);
        assert!(got[0].contains("must not contain both Deny and Warn"));
        assert!(
            causes(
                &ValidatingAdmissionPolicyBinding,
                json!({"spec": {"policyName": "p", "validationActions": ["Deny"]}})
            )
            .is_empty()
        );
    }
}

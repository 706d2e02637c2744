//! CRD validation rules (`x-kubernetes-validations`): CEL expressions over `self`, the value
//! of the schema node that carries them, evaluated with the `cel` crate as upstream's
//! apiextensions-apiserver does. Transition rules (those reading `oldSelf`) are checked on
//! updates only, where the old object has a value at the same place ([`transition_causes`]:
//! object properties and map keys correlate, as upstream's; list items are not followed).

use crate::error::Cause;
use serde_json::Value;

/// Why a rule could not be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    /// The expression does not parse.
    #[error("compilation failed: {0}")]
    Compile(String),
    /// Evaluating it failed (no such key, wrong types, …).
    #[error("{0}")]
    Execute(String),
    /// It did not evaluate to a boolean.
    #[error("rule did not evaluate to a bool: {0}")]
    NotBool(String),
}

impl From<minik8s_cel::Error> for RuleError {
    fn from(e: minik8s_cel::Error) -> Self {
        match e {
            minik8s_cel::Error::Compile(m) => RuleError::Compile(m),
            minik8s_cel::Error::Execute(m) => RuleError::Execute(m),
        }
    }
}

/// Whether a rule reads the old value (a transition rule).
pub fn is_transition(rule: &str) -> bool {
    rule.contains("oldSelf")
}

/// Parses a rule (to check it when a CRD is written), within cel-go's limits
/// ([`minik8s_cel`]).
pub fn compile(rule: &str) -> Result<(), RuleError> {
    Ok(minik8s_cel::compile(rule)?)
}

/// Evaluates `rule` with `self` bound to `value`.
pub fn check(rule: &str, value: &Value) -> Result<bool, RuleError> {
    evaluate(rule, value, None)
}

/// Evaluates `rule` with `self` bound to `value` and, for a transition rule, `oldSelf` to
/// `old`.
fn evaluate(rule: &str, value: &Value, old: Option<&Value>) -> Result<bool, RuleError> {
    match run(rule, value, old)? {
        cel::Value::Bool(b) => Ok(b),
        other => Err(RuleError::NotBool(format!("{other:?}"))),
    }
}

/// The value of CEL `expression` with `self` bound to `value` (and `oldSelf` to `old`).
fn run(expression: &str, value: &Value, old: Option<&Value>) -> Result<cel::Value, RuleError> {
    let mut variables = vec![("self", value)];
    variables.extend(old.map(|old| ("oldSelf", old)));
    Ok(minik8s_cel::eval(expression, &variables)?)
}

/// A failed rule's `messageExpression`, as upstream takes it: a string that is neither blank
/// nor more than one line; otherwise (or when it fails) `None`, and the `message` stands.
fn message_of(expression: &str, value: &Value, old: Option<&Value>) -> Option<String> {
    match run(expression, value, old) {
        Ok(cel::Value::String(s)) if !s.trim().is_empty() && !s.contains('\n') => {
            Some(s.to_string())
        }
        _ => None,
    }
}

/// The causes from the transition rules of `schema` (a whole custom resource's) for an update
/// from `old` to `new`.
pub fn transition_causes(schema: &Value, new: &Value, old: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    transitions(schema, new, old, "", &mut out);
    out
}

fn transitions(schema: &Value, new: &Value, old: &Value, path: &str, out: &mut Vec<Cause>) {
    for r in schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(rule) = r.get("rule").and_then(Value::as_str) else {
            continue;
        };
        if !is_transition(rule) {
            continue;
        }
        let field = match r.get("fieldPath").and_then(Value::as_str) {
            Some(fp) if !fp.is_empty() && path.is_empty() => fp.trim_start_matches('.').to_owned(),
            Some(fp) if !fp.is_empty() => format!("{path}{fp}"),
            _ => path.to_owned(),
        };
        out.extend(failed(r, rule, &field, new, Some(old)));
    }
    let (Some(n), Some(o)) = (new.as_object(), old.as_object()) else {
        return;
    };
    let child = |k: &str| {
        if path.is_empty() {
            k.to_owned()
        } else {
            format!("{path}.{k}")
        }
    };
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            if let (Some(nv), Some(ov)) = (n.get(k), o.get(k)) {
                transitions(s, nv, ov, &child(k), out);
            }
        }
    } else if let Some(s) = schema.get("additionalProperties").filter(|s| s.is_object()) {
        for (k, nv) in n {
            if let Some(ov) = o.get(k) {
                transitions(s, nv, ov, &child(k), out);
            }
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "boolean",
        Value::Null => "null",
    }
}

/// The cause of rule entry `r` (its `rule`) at `field` when it fails for `value` (and `old`,
/// for a transition rule): its message (or the rule), its reason.
fn failed(r: &Value, rule: &str, field: &str, value: &Value, old: Option<&Value>) -> Option<Cause> {
    let detail = match evaluate(rule, value, old) {
        Ok(true) => return None,
        Ok(false) => r
            .get("messageExpression")
            .and_then(Value::as_str)
            .and_then(|e| message_of(e, value, old))
            .or_else(|| {
                r.get("message")
                    .and_then(Value::as_str)
                    .filter(|m| !m.is_empty())
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| format!("failed rule: {rule}")),
        Err(e) => format!("{e}: {rule}"),
    };
    let mut cause = Cause::invalid(field, kind_of(value), &detail);
    if let Some(reason) = r.get("reason").and_then(Value::as_str) {
        cause.reason = reason.to_owned();
    }
    Some(cause)
}

/// The causes from the rules of schema node `schema` for `value` at `path`.
pub fn causes(schema: &Value, value: &Value, path: &str) -> Vec<Cause> {
    let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    else {
        return vec![];
    };
    let mut out = Vec::new();
    for r in rules {
        let Some(rule) = r.get("rule").and_then(Value::as_str) else {
            continue;
        };
        if is_transition(rule) {
            continue;
        }
        let field = match r.get("fieldPath").and_then(Value::as_str) {
            Some(fp) if !fp.is_empty() => format!("{path}{fp}"),
            _ => path.to_owned(),
        };
        out.extend(failed(r, rule, &field, value, None));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_sum_as_upstreams_list_library() {
        let rule = "self.traffic.map(t, has(t.percent) ? t.percent : 0).sum() == 100";
        let split = json!({"traffic": [{"percent": 90}, {"percent": 10}, {"tag": "x"}]});
        assert!(check(rule, &split).unwrap());
        let short = json!({"traffic": [{"percent": 90}, {"percent": 5}]});
        assert!(!check(rule, &short).unwrap());
        assert!(check("[].sum() == 0", &json!({})).unwrap());
        assert!(check("[1.5, 2.5].sum() == 4.0", &json!({})).unwrap());
        assert!(check("['a'].sum() == 0", &json!({})).is_err());
        let unique = "self.traffic.all(a, !has(a.tag) || self.traffic.exists_one(b, has(b.tag) && b.tag == a.tag))";
        assert!(check(unique, &split).unwrap());
        let twice = json!({"traffic": [{"tag": "a"}, {"tag": "a"}, {}]});
        assert!(!check(unique, &twice).unwrap());
    }

    #[test]
    fn transition_rules_compare_with_the_old_value_where_it_exists() {
        let schema = json!({
            "x-kubernetes-validations": [{"rule": "self.spec == oldSelf.spec",
                "message": "Immutable fields changed (-old +new)", "fieldPath": ".spec"}],
            "properties": {"spec": {"type": "object", "properties": {
                "n": {"type": "integer", "x-kubernetes-validations": [
                    {"rule": "self >= oldSelf", "message": "may not decrease"}]}}}}});
        let old = json!({"spec": {"n": 2}});
        assert!(
            transition_causes(&schema, &json!({"spec": {"n": 2}, "status": {}}), &old).is_empty()
        );
        let changed = transition_causes(&schema, &json!({"spec": {"n": 1}}), &old);
        let fields: Vec<(&str, &str)> = changed
            .iter()
            .map(|c| (c.field.as_str(), c.message.as_str()))
            .collect();
        assert_eq!(
            fields,
            [
                (
                    "spec",
                    "Invalid value: \"object\": Immutable fields changed (-old +new)"
                ),
                ("spec.n", "Invalid value: \"number\": may not decrease")
            ]
        );
    }

    #[test]
    fn rules_see_self_and_report_their_message_or_the_rule() {
        let schema = json!({"x-kubernetes-validations": [
            {"rule": "self.minScale <= self.maxScale", "message": "minScale must not exceed maxScale"},
            {"rule": "!has(self.name) || self.name.startsWith('a')"},
            {"rule": "self.minScale == oldSelf.minScale"},
        ]});
        assert!(
            causes(
                &schema,
                &json!({"minScale": 0, "maxScale": 4}),
                "spec.scale"
            )
            .is_empty()
        );
        let got = causes(
            &schema,
            &json!({"minScale": 5, "maxScale": 4, "name": "b"}),
            "spec.scale",
        );
        let lines: Vec<String> = got.iter().map(Cause::line).collect();
        assert_eq!(
            lines,
            [
                "spec.scale: Invalid value: \"object\": minScale must not exceed maxScale",
                "spec.scale: Invalid value: \"object\": failed rule: !has(self.name) || self.name.startsWith('a')",
            ]
        );
        assert!(compile("self.x >").is_err());
    }

    #[test]
    fn a_message_expression_names_the_value_unless_it_fails_or_is_blank() {
        let schema = json!({"x-kubernetes-validations": [
            {"rule": "self.n <= 100", "messageExpression": "'expected 1 <= ' + string(self.n) + ' <= 100: n'"},
            {"rule": "self.n <= 100", "messageExpression": "self.missing", "message": "too many"},
            {"rule": "self.n <= 100", "messageExpression": "'  '"},
        ]});
        let lines: Vec<String> = causes(&schema, &json!({"n": 200}), "spec")
            .iter()
            .map(Cause::line)
            .collect();
        assert_eq!(
            lines,
            [
                "spec: Invalid value: \"object\": expected 1 <= 200 <= 100: n",
                "spec: Invalid value: \"object\": too many",
                "spec: Invalid value: \"object\": failed rule: self.n <= 100",
            ]
        );
    }
}

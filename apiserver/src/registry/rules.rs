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

/// Whether a rule reads the old value (a transition rule).
pub fn is_transition(rule: &str) -> bool {
    rule.contains("oldSelf")
}

/// The longest expression, in code points (cel-go's default limit).
const MAX_CODE_POINTS: usize = 100_000;
/// The most nested brackets plus operators and selectors an expression may have. The parser
/// recurses once for each bracket level and each operator of a chain, with large frames (a
/// debug build overflowed an 8 MiB stack at 250 terms of `1+1+…`); cel-go's own limit is a
/// recursion depth of 250.
const MAX_DEPTH: usize = 100;
/// The most nested brackets: each level of a list, map or call costs the parser some fifteen
/// frames (67 nested `{` overflowed 8 MiB in a debug build).
const MAX_NESTING: usize = 32;

/// Parses a CEL expression within the limits cel-go sets: a deeply nested expression is
/// refused, never a crash of the parser's recursion.
pub fn program(expression: &str) -> Result<cel::Program, RuleError> {
    let size = expression.chars().count();
    if size > MAX_CODE_POINTS {
        return Err(RuleError::Compile(format!(
            "expression code point size exceeds limit: size: {size}, limit {MAX_CODE_POINTS}"
        )));
    }
    let (mut depth, mut deepest, mut operators, mut quote) = (0usize, 0usize, 0usize, None);
    let mut chars = expression.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') => {
                chars.next();
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            (None, '+' | '-' | '*' | '/' | '%' | '&' | '|' | '=' | '<' | '>' | '?' | '.' | '!') => {
                operators += 1
            }
            _ => {}
        }
    }
    if deepest > MAX_NESTING {
        return Err(RuleError::Compile(format!(
            "max recursion depth exceeded: brackets nested {deepest} deep, limit {MAX_NESTING}"
        )));
    }
    if deepest + operators > MAX_DEPTH {
        return Err(RuleError::Compile(format!(
            "max recursion depth exceeded: {deepest} nested brackets and {operators} operators, limit {MAX_DEPTH} together"
        )));
    }
    cel::Program::compile(expression).map_err(|e| RuleError::Compile(e.to_string()))
}

/// Compiles a rule (to check it when a CRD is written).
pub fn compile(rule: &str) -> Result<(), RuleError> {
    program(rule).map(|_| ())
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
    let program = program(expression)?;
    let mut context = library()?;
    context.add_variable_from_value("self", to_cel(value));
    if let Some(old) = old {
        context.add_variable_from_value("oldSelf", to_cel(old));
    }
    program
        .execute(&context)
        .map_err(|e| RuleError::Execute(e.to_string()))
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

/// A JSON value as CEL sees it: integers are `int` (as upstream's schema-typed values,
/// so `x % 2` and `x + 1` work), `uint` only beyond `int`'s range.
pub(crate) fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(std::sync::Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(std::sync::Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: std::collections::HashMap<String, cel::Value> =
                m.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            cel::Value::from(map)
        }
    }
}

/// A CEL context with the functions of upstream's Kubernetes libraries that are provided
/// here (`k8s.io/apiserver/pkg/cel/library`): the list library's `sum()`.
pub(crate) fn library() -> Result<cel::Context<'static, 'static>, RuleError> {
    let mut context = cel::Context::default();
    context
        .add_function("sum", sum)
        .map_err(|e| RuleError::Execute(e.to_string()))?;
    Ok(context)
}

/// `list.sum()`: the sum of a list of integers or of doubles (0 for an empty list), as
/// upstream's list library.
fn sum(
    cel::extractors::This(list): cel::extractors::This<std::sync::Arc<Vec<cel::Value>>>,
) -> Result<cel::Value, cel::ExecutionError> {
    let mut ints: i64 = 0;
    let mut doubles: Option<f64> = None;
    for v in list.iter() {
        match v {
            cel::Value::Int(i) => {
                ints = ints
                    .checked_add(*i)
                    .ok_or_else(|| cel::ExecutionError::function_error("sum", "integer overflow"))?
            }
            cel::Value::UInt(u) => {
                ints = i64::try_from(*u)
                    .ok()
                    .and_then(|u| ints.checked_add(u))
                    .ok_or_else(|| cel::ExecutionError::function_error("sum", "integer overflow"))?
            }
            cel::Value::Float(f) => *doubles.get_or_insert(0.0) += f,
            other => {
                return Err(cel::ExecutionError::function_error(
                    "sum",
                    format!("no such overload for a list of {other:?}"),
                ));
            }
        }
    }
    Ok(match doubles {
        Some(d) => cel::Value::Float(d + ints as f64),
        None => cel::Value::Int(ints),
    })
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
    fn a_deeply_nested_rule_is_refused_not_a_crash() {
        // The cel fuzz target's find: these overflowed the parser's stack.
        for rule in [
            format!("{}1{}", "(".repeat(3000), ")".repeat(3000)),
            format!("{}{}", "[".repeat(3000), "]".repeat(3000)),
            vec!["1"; 3000].join("+"),
        ] {
            let e = compile(&rule).unwrap_err().to_string();
            assert!(e.contains("max recursion depth exceeded"), "{e}");
        }
    }

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

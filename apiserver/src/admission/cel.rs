//! CEL in admission: the variables upstream's admission CEL binds (`object`, `oldObject`,
//! `request`, `params`, `namespaceObject` and a policy's `variables`), the evaluation of
//! webhooks' and policies' `matchConditions`, and of policies' expressions. Expressions are
//! evaluated with the `cel` crate and the library functions of [`crate::registry::rules`]; there is no
//! type checker, so a type error shows when an expression runs, and `authorizer` is not
//! bound (an expression reading it fails and its failure policy applies).

use super::Operation;
use crate::context::Ctx;
use crate::registry::rules::RuleError;
use serde_json::Value;
use std::collections::HashMap;

/// A `matchConditions` list as (name, expression) pairs.
pub(crate) fn conditions(v: &Value) -> Vec<(String, String)> {
    v.get("matchConditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            (text("name"), text("expression"))
        })
        .collect()
}

/// Why an expression could not give an answer.
pub(crate) fn describe(expression: &str, e: &RuleError) -> String {
    format!("expression '{expression}' resulted in error: {e}")
}

/// What admission expressions see of one request.
pub(crate) struct Input {
    object: Value,
    old_object: Value,
    request: Value,
    namespace_object: Value,
    params: Value,
    variables: HashMap<String, cel::Value>,
}

impl Input {
    /// The request's variables; `namespace` is the stored namespace of a namespaced request,
    /// `params` a policy's parameter object.
    pub(crate) fn new(
        ctx: &Ctx,
        op: Operation,
        obj: Option<&Value>,
        old: Option<&Value>,
        namespace: Option<Value>,
        params: Option<Value>,
    ) -> Self {
        let mut request = super::review::review(ctx, op, obj, old)
            .get("request")
            .cloned()
            .unwrap_or_default();
        if let Some(r) = request.as_object_mut() {
            for key in ["uid", "object", "oldObject"] {
                r.remove(key);
            }
        }
        let strip = |o: Option<&Value>| {
            let mut o = o.cloned().unwrap_or(Value::Null);
            if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
            }
            o
        };
        Input {
            object: strip(obj),
            old_object: strip(old),
            request,
            namespace_object: strip(namespace.as_ref()),
            params: params.unwrap_or(Value::Null),
            variables: HashMap::new(),
        }
    }

    /// Evaluates `expression` against the request.
    pub(crate) fn eval(&self, expression: &str) -> Result<cel::Value, RuleError> {
        let variables = self.variables.clone();
        Ok(minik8s_cel::eval_with(expression, |context| {
            for (name, v) in [
                ("object", &self.object),
                ("oldObject", &self.old_object),
                ("request", &self.request),
                ("namespaceObject", &self.namespace_object),
                ("params", &self.params),
            ] {
                context.add_variable_from_value(name, minik8s_cel::to_cel(v));
            }
            context.add_variable_from_value("variables", variables);
        })?)
    }

    /// Evaluates a boolean expression.
    pub(crate) fn eval_bool(&self, expression: &str) -> Result<bool, RuleError> {
        match self.eval(expression)? {
            cel::Value::Bool(b) => Ok(b),
            other => Err(RuleError::NotBool(format!("{other:?}"))),
        }
    }

    /// Binds a policy's variable, in order, so later ones and the validations can read
    /// `variables.<name>`. A variable that fails is left unbound: reading it fails then.
    pub(crate) fn bind_variable(&mut self, name: &str, expression: &str) {
        if let Ok(v) = self.eval(expression) {
            self.variables.insert(name.to_owned(), v);
        }
    }

    /// Upstream's matchConditions: false as soon as one is false; an error when none is
    /// false but one could not be evaluated; true otherwise.
    pub(crate) fn conditions_hold(&self, conditions: &[(String, String)]) -> Result<bool, String> {
        let mut error = None;
        for (name, expression) in conditions {
            match self.eval_bool(expression) {
                Ok(false) => return Ok(false),
                Ok(true) => {}
                Err(e) => {
                    error.get_or_insert_with(|| {
                        format!(
                            "failed to evaluate match condition {name:?}: {}",
                            describe(expression, &e)
                        )
                    });
                }
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }
}

/// An input with `object` (tests of the evaluation without a request).
#[cfg(test)]
pub(crate) fn tests_input(object: Value) -> Input {
    use serde_json::json;
    Input {
        object,
        old_object: Value::Null,
        request: json!({"operation": "CREATE", "userInfo": {"username": "alice"}}),
        namespace_object: json!({"metadata": {"name": "team-a"}}),
        params: Value::Null,
        variables: HashMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(object: Value) -> Input {
        tests_input(object)
    }

    #[test]
    fn expressions_read_the_request_and_variables_in_order() {
        let mut i = input(json!({"metadata": {"name": "web"}, "spec": {"replicas": 3}}));
        assert!(i.eval_bool("object.spec.replicas > 1").unwrap());
        assert!(
            i.eval_bool("namespaceObject.metadata.name == 'team-a'")
                .unwrap()
        );
        assert!(i.eval_bool("request.userInfo.username == 'alice'").unwrap());
        assert!(i.eval_bool("oldObject == null").unwrap());
        i.bind_variable("replicas", "object.spec.replicas");
        i.bind_variable("odd", "variables.replicas % 2 == 1");
        assert!(
            i.eval_bool("variables.odd && variables.replicas > 1")
                .unwrap()
        );
        // A type error is an error, not a denial.
        assert!(i.eval_bool("'n' + object.spec.replicas == 'n3'").is_err());
    }

    #[test]
    fn match_conditions_are_false_before_they_fail() {
        let i = input(json!({"metadata": {"name": "skip-me"}}));
        let c = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, e)| (n.to_string(), e.to_string()))
                .collect()
        };
        let skip = c(&[("skip", "object.metadata.name != 'skip-me'")]);
        assert_eq!(i.conditions_hold(&skip), Ok(false));
        let broken = c(&[
            ("broken", "object.nope.x"),
            ("skip", "object.metadata.name != 'skip-me'"),
        ]);
        assert_eq!(i.conditions_hold(&broken), Ok(false));
        let only_broken = c(&[("broken", "object.nope.x")]);
        assert!(
            i.conditions_hold(&only_broken)
                .unwrap_err()
                .contains("\"broken\"")
        );
    }
}

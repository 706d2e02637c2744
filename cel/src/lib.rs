//! CEL as minik8s evaluates it: CRD validation rules, admission policies and Workflow
//! conditions all come from users, so every expression is parsed and run here, within
//! limits that keep the `cel` crate's recursion bounded:
//!
//! - at most 100,000 code points (cel-go's default);
//! - at most [`MAX_SYMBOLS`] brackets and operator characters, counted anywhere (string
//!   literals included): each level of the parse and of the tree it builds needs one, so
//!   this bounds how deep both go, whatever the lexer makes of the quotes;
//! - brackets nest at most 96 deep (the crate's own recursion limit).
//!
//! Parsing, evaluating and dropping the program happen on a stack of [`STACK`] bytes of
//! its own (mapped, touched only as deep as the expression goes): the deepest expression
//! these limits let through needs about 60 MiB in a debug build, far less optimised.

use std::collections::HashMap;
use std::sync::Arc;

/// The longest expression, in code points (cel-go's default limit).
pub const MAX_CODE_POINTS: usize = 100_000;
/// The most brackets and operator characters an expression may hold.
pub const MAX_SYMBOLS: usize = 1_000;
/// The stack each expression is parsed and run on.
pub const STACK: usize = 128 << 20;

/// Why an expression could not be evaluated.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Error {
    /// It does not parse, or is beyond the limits.
    #[error("compilation failed: {0}")]
    Compile(String),
    /// Evaluating it failed (no such key, wrong types, …).
    #[error("{0}")]
    Execute(String),
}

/// Checks `expression` against the limits, without parsing it.
pub fn check_limits(expression: &str) -> Result<(), Error> {
    let size = expression.chars().count();
    if size > MAX_CODE_POINTS {
        return Err(Error::Compile(format!(
            "expression code point size exceeds limit: size: {size}, limit {MAX_CODE_POINTS}"
        )));
    }
    let symbols = expression
        .chars()
        .filter(|c| "([{+-*/%&|=<>?.!".contains(*c))
        .count();
    if symbols > MAX_SYMBOLS {
        return Err(Error::Compile(format!(
            "max recursion depth exceeded: {symbols} brackets and operators, limit {MAX_SYMBOLS}"
        )));
    }
    Ok(())
}

/// Parses `expression` (to check it when it is written).
pub fn compile(expression: &str) -> Result<(), Error> {
    check_limits(expression)?;
    stacker::grow(STACK, || {
        cel::Program::compile(expression)
            .map(drop)
            .map_err(|e| Error::Compile(e.to_string()))
    })
}

/// Evaluates `expression` with `variables` bound (JSON values, as Kubernetes' CEL sees
/// them) and Kubernetes' [`library`].
pub fn eval(
    expression: &str,
    variables: &[(&str, &serde_json::Value)],
) -> Result<cel::Value, Error> {
    eval_with(expression, |context| {
        for (name, value) in variables {
            context.add_variable_from_value(*name, to_cel(value));
        }
    })
}

/// Evaluates `expression` in [`library`]'s context, after `bind` added its variables.
pub fn eval_with(
    expression: &str,
    bind: impl FnOnce(&mut cel::Context<'static, 'static>),
) -> Result<cel::Value, Error> {
    check_limits(expression)?;
    stacker::grow(STACK, || {
        let program =
            cel::Program::compile(expression).map_err(|e| Error::Compile(e.to_string()))?;
        let mut context = library()?;
        bind(&mut context);
        program
            .execute(&context)
            .map_err(|e| Error::Execute(e.to_string()))
    })
}

/// A JSON value as CEL sees it in Kubernetes: integers are `int` (`uint` only beyond it),
/// objects are maps.
pub fn to_cel(v: &serde_json::Value) -> cel::Value {
    use serde_json::Value;
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: HashMap<String, cel::Value> =
                m.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect();
            cel::Value::from(map)
        }
    }
}

/// A CEL context with the functions of upstream's Kubernetes libraries that are provided
/// here (`k8s.io/apiserver/pkg/cel/library`): the list library's `sum()`.
pub fn library() -> Result<cel::Context<'static, 'static>, Error> {
    let mut context = cel::Context::default();
    context
        .add_function("sum", sum)
        .map_err(|e| Error::Execute(e.to_string()))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn too_many_brackets_or_operators_are_refused_not_a_crash() {
        for rule in [
            format!("{}1{}", "(".repeat(3000), ")".repeat(3000)),
            format!("{}{}", "[".repeat(3000), "]".repeat(3000)),
            vec!["1"; 3000].join("+"),
            // An unterminated quote hides nothing: brackets count wherever they are.
            format!("\n'\n{}#", "{".repeat(1001)),
        ] {
            let e = compile(&rule).unwrap_err().to_string();
            assert!(e.contains("max recursion depth exceeded"), "{e}");
        }
        let e = compile(&"1".repeat(MAX_CODE_POINTS + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("code point size exceeds limit"), "{e}");
    }

    /// The deepest expressions the limits let through parse and run on a test thread's
    /// small stack (2 MiB): nesting up to the parser's own limit, chains up to ours.
    #[test]
    fn the_deepest_expressions_allowed_run_on_a_small_stack() {
        let chain = MAX_SYMBOLS - 1;
        for (rule, ok) in [
            (format!("{}1{}", "{1:".repeat(90), "}".repeat(90)), true),
            (format!("{}1{}", "[".repeat(90), "]".repeat(90)), true),
            (format!("{}1{}", "(".repeat(90), ")".repeat(90)), true),
            (format!("{}1{}", "size(".repeat(90), ")".repeat(90)), false),
            (format!("1{}", "+1".repeat(chain)), true),
            (format!("self{}", "[0]".repeat(chain / 3)), false),
            (format!("{}1", "-".repeat(chain)), true),
            // Both at once: a chain inside the deepest nesting.
            (
                format!(
                    "{}1{}{}",
                    "{1:".repeat(95),
                    "+1".repeat(chain - 95),
                    "}".repeat(95)
                ),
                true,
            ),
            // The crash the fuzzer found: a quote the lexer drops, then nested maps.
            (format!("\n'\n{}#", "{".repeat(53)), false),
        ] {
            let got = eval(&rule, &[("self", &json!([[[1]]]))]);
            assert_eq!(got.is_ok(), ok, "{}: {got:?}", &rule[..rule.len().min(40)]);
        }
        // Beyond the parser's nesting limit: its own error.
        let deep = format!("{}1{}", "(".repeat(200), ")".repeat(200));
        assert!(
            compile(&deep)
                .unwrap_err()
                .to_string()
                .contains("Recursion limit")
        );
    }

    #[test]
    fn lists_sum_as_upstreams_list_library() {
        let sum = |rule: &str| eval(rule, &[]);
        assert_eq!(sum("[1, 2].sum()"), Ok(cel::Value::Int(3)));
        assert_eq!(sum("[].sum()"), Ok(cel::Value::Int(0)));
        assert_eq!(sum("[1.5, 2.5].sum()"), Ok(cel::Value::Float(4.0)));
        assert!(sum("['a'].sum()").is_err());
    }
}

//! Checking a workflow definition and executing it durably.
//!
//! A run is a walk from `startAt` along each step's `next`. Every completed step is handed to
//! the [`Host`] as a [`StepRecord`] before the walk goes on, and a walk given the records of
//! an earlier, interrupted execution replays them (their outputs, and the branch each took)
//! instead of running those steps again: only the step that was in flight runs again, with
//! the same invocation id. Parallel branches are walks of their own, told apart by the
//! records' `path`.

use super::types::{Step, StepRecord, StepType, WorkflowSpec};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A checked definition: a start and its steps by name (branches checked too).
#[derive(Debug, Clone)]
pub struct Chain {
    start: String,
    steps: HashMap<String, Node>,
    /// The number of top-level steps.
    pub len: usize,
}

#[derive(Debug, Clone)]
struct Node {
    step: Step,
    branches: Vec<Chain>,
}

/// Checks a definition: every `next`, `catch`, `default` and choice names a step; every step
/// is reachable from `startAt`; a Choice has a way out; CEL expressions compile; Tasks name a
/// Function for which `function_exists` holds. The error names the step.
pub fn check(spec: &WorkflowSpec, function_exists: &dyn Fn(&str) -> bool) -> Result<Chain, String> {
    chain(&spec.start_at, &spec.steps, "", function_exists)
}

fn chain(
    start: &str,
    steps: &[Step],
    within: &str,
    function_exists: &dyn Fn(&str) -> bool,
) -> Result<Chain, String> {
    let mut by_name: HashMap<String, Node> = HashMap::new();
    for s in steps {
        let here = format!("{within}{}", s.name);
        if s.name.is_empty() {
            return Err(format!("{within}a step has no name"));
        }
        if by_name.contains_key(&s.name) {
            return Err(format!("step {here}: the name is used twice"));
        }
        let mut branches = Vec::new();
        for (i, b) in s.branches.iter().enumerate() {
            let inner: Vec<Step> = serde_json::from_value(b.steps.clone())
                .map_err(|e| format!("step {here}: branch {i}: its steps: {e}"))?;
            branches.push(chain(
                &b.start_at,
                &inner,
                &format!("{here}[{i}]/"),
                function_exists,
            )?);
        }
        by_name.insert(
            s.name.clone(),
            Node {
                step: s.clone(),
                branches,
            },
        );
    }
    if !by_name.contains_key(start) {
        return Err(format!("{within}startAt names no step: {start:?}"));
    }
    for s in steps {
        let here = format!("{within}{}", s.name);
        let names = |what: &str, target: &Option<String>| -> Result<(), String> {
            match target {
                Some(t) if !by_name.contains_key(t) => {
                    Err(format!("step {here}: {what} names no step: {t:?}"))
                }
                _ => Ok(()),
            }
        };
        names("next", &s.next)?;
        names("catch", &s.catch)?;
        names("default", &s.default)?;
        for c in &s.choices {
            names("a choice's next", &Some(c.next.clone()))?;
            compile(&c.condition)
                .map_err(|e| format!("step {here}: condition {:?}: {e}", c.condition))?;
        }
        match s.type_ {
            StepType::Task => match s.function.as_deref() {
                None | Some("") => return Err(format!("step {here}: a Task needs a function")),
                Some(f) if !function_exists(f) => {
                    return Err(format!("step {here}: function {f:?} does not exist"));
                }
                _ => {}
            },
            StepType::Choice => {
                if s.choices.is_empty() && s.default.is_none() {
                    return Err(format!("step {here}: a Choice needs choices or a default"));
                }
                if s.next.is_some() {
                    return Err(format!(
                        "step {here}: a Choice goes on by its choices, not next"
                    ));
                }
            }
            StepType::Parallel if s.branches.is_empty() => {
                return Err(format!("step {here}: a Parallel needs branches"));
            }
            StepType::Pass => {
                if let Some(o) = &s.output {
                    compile(o).map_err(|e| format!("step {here}: output {o:?}: {e}"))?;
                }
            }
            StepType::Succeed | StepType::Fail if s.next.is_some() => {
                return Err(format!(
                    "step {here}: a {:?} step ends the run; it has no next",
                    s.type_
                ));
            }
            _ => {}
        }
    }
    // Reachability from the start.
    let mut seen: HashSet<&str> = HashSet::new();
    let mut todo = vec![start];
    while let Some(n) = todo.pop() {
        if !seen.insert(n) {
            continue;
        }
        let s = &by_name[n].step;
        todo.extend(s.next.as_deref());
        todo.extend(s.catch.as_deref());
        todo.extend(s.default.as_deref());
        todo.extend(s.choices.iter().map(|c| c.next.as_str()));
    }
    if let Some(s) = steps.iter().find(|s| !seen.contains(s.name.as_str())) {
        return Err(format!(
            "step {within}{}: unreachable from {start:?}",
            s.name
        ));
    }
    Ok(Chain {
        start: start.to_owned(),
        len: steps.len(),
        steps: by_name,
    })
}

/// A CEL error as a step reports it: the parser's text, or the evaluation's.
fn cel_error(e: minik8s_cel::Error) -> String {
    match e {
        minik8s_cel::Error::Compile(m) => m.trim().to_owned(),
        minik8s_cel::Error::Execute(m) => m,
    }
}

fn compile(expr: &str) -> Result<(), String> {
    minik8s_cel::compile(expr).map_err(cel_error)
}

/// Evaluates a CEL expression with `input` bound to the step's input.
pub fn eval(expr: &str, input: &Value) -> Result<Value, String> {
    let v = minik8s_cel::eval(expr, &[("input", input)]).map_err(cel_error)?;
    v.json().map_err(|e| e.to_string())
}

/// An error a step ended with: a name and an explanation (`{"error", "cause"}`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepError {
    /// A short name (`KeyError`, `Timeout`, `NoChoiceMatched`, a Fail step's `error`).
    pub error: String,
    /// What happened.
    pub cause: String,
}

impl StepError {
    fn new(error: &str, cause: impl Into<String>) -> Self {
        StepError {
            error: error.into(),
            cause: cause.into(),
        }
    }
}

/// Why a walk ended without an output.
#[derive(Debug, Clone, PartialEq)]
pub enum Halt {
    /// The run failed (nothing caught the error).
    Failed(StepError),
    /// The run can not go on here (deleted, or this process is stopping): nothing is recorded.
    Stopped(String),
}

/// What a run needs from the world: invoking functions and keeping records.
pub trait Host: Sync {
    /// Invokes `function` (`<name>` or `<name>@<tag>`) with `input` (carrying
    /// `invocation_id`): its JSON answer, or the error it gave; and the revision that
    /// answered, if one did.
    fn invoke(
        &self,
        function: &str,
        input: &Value,
        invocation_id: &str,
    ) -> impl Future<Output = (Result<Value, StepError>, Option<String>)> + Send;
    /// Persists a completed step; `step` is the top-level step now being taken (`None`: the
    /// record is inside a branch, or the run is ending).
    fn record(
        &self,
        record: StepRecord,
        step: Option<&str>,
    ) -> impl Future<Output = Result<(), Halt>> + Send;
    /// A recorded step's output (stored in a ConfigMap when large).
    fn output(&self, record: &StepRecord) -> impl Future<Output = Result<Value, Halt>> + Send;
}

/// The current time as RFC 3339 with microseconds.
pub fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Microsecond)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .to_string()
}

/// Seconds from one RFC 3339 time to another (as recorded in a run's status).
pub fn seconds_between(start: &str, end: &str) -> Option<f64> {
    let s: jiff::Timestamp = start.parse().ok()?;
    let e: jiff::Timestamp = end.parse().ok()?;
    (e - s).total(jiff::Unit::Second).ok()
}

/// One execution: its id (for invocation ids), what earlier executions recorded, and the
/// transitions taken so far.
pub struct Run<'a, H> {
    host: &'a H,
    id: String,
    recorded: Vec<StepRecord>,
    transitions: AtomicI64,
    max_steps: i64,
}

type Walk<'b> = Pin<Box<dyn Future<Output = Result<Value, Halt>> + Send + 'b>>;

impl<'a, H: Host> Run<'a, H> {
    /// A run with id `id` (the WorkflowRun's uid) resuming after `recorded`.
    pub fn new(host: &'a H, id: &str, recorded: Vec<StepRecord>, max_steps: i64) -> Self {
        Run {
            host,
            id: id.to_owned(),
            transitions: AtomicI64::new(recorded.len() as i64),
            recorded,
            max_steps,
        }
    }

    /// Walks `chain` from its start with `input`: the last step's output.
    pub fn walk<'b>(&'b self, path: String, chain: &'b Chain, input: Value) -> Walk<'b>
    where
        'a: 'b,
    {
        Box::pin(async move {
            let prior: Vec<&StepRecord> = self.recorded.iter().filter(|r| r.path == path).collect();
            let mut cursor = chain.start.clone();
            let mut input = input;
            let mut index = 0usize;
            loop {
                let node = chain.steps.get(&cursor).ok_or_else(|| {
                    Halt::Failed(StepError::new(
                        "InvalidWorkflow",
                        format!("no step {cursor:?}"),
                    ))
                })?;
                // Done before: take what it gave and where it went.
                if let Some(r) = prior.get(index).filter(|r| r.name == cursor) {
                    index += 1;
                    let output = self.host.output(r).await?;
                    match (&r.next, &r.error) {
                        (Some(next), _) => {
                            cursor = next.clone();
                            input = output;
                            continue;
                        }
                        (None, Some(error)) => {
                            return Err(Halt::Failed(StepError::new(
                                error,
                                r.cause.clone().unwrap_or_default(),
                            )));
                        }
                        (None, None) => return Ok(output),
                    }
                }
                let taken = self.transitions.fetch_add(1, Ordering::SeqCst) + 1;
                if taken > self.max_steps {
                    return Err(Halt::Failed(StepError::new(
                        "MaxStepsExceeded",
                        format!("the run took more than maxSteps ({}) steps", self.max_steps),
                    )));
                }
                let start_time = now();
                let step = &node.step;
                let mut attempts = 0;
                let mut revision = None;
                let outcome: Result<(Value, Option<String>), StepError> = match step.type_ {
                    StepType::Task => {
                        let id = format!("{}/{path}{}#{index}", self.id, step.name);
                        let (result, n, r) = self.task(step, &input, &id).await;
                        attempts = n;
                        revision = r;
                        result.map(|v| (v, step.next.clone()))
                    }
                    StepType::Choice => choose(step, &input).map(|n| (input.clone(), n)),
                    StepType::Pass => match &step.output {
                        Some(expr) => eval(expr, &input)
                            .map(|v| (v, step.next.clone()))
                            .map_err(|e| StepError::new("OutputError", e)),
                        None => Ok((input.clone(), step.next.clone())),
                    },
                    StepType::Succeed => Ok((input.clone(), None)),
                    StepType::Fail => Err(StepError::new(
                        step.error.as_deref().unwrap_or("Failed"),
                        step.cause.clone().unwrap_or_default(),
                    )),
                    StepType::Parallel => {
                        let walks = node.branches.iter().enumerate().map(|(b, branch)| {
                            let inner = format!("{path}{}#{index}[{b}]/", step.name);
                            self.walk(inner, branch, input.clone())
                        });
                        match futures::future::try_join_all(walks).await {
                            Ok(outputs) => Ok((Value::Array(outputs), step.next.clone())),
                            Err(Halt::Failed(e)) => Err(e),
                            Err(stopped) => return Err(stopped),
                        }
                    }
                };
                // A Choice's failure (no rule held, a condition that could not be evaluated)
                // and a Fail are not caught; Tasks' and Parallels' errors are, by `catch`.
                let catchable = matches!(step.type_, StepType::Task | StepType::Parallel);
                let (output, next, error) = match outcome {
                    Ok((output, next)) => (output, next, None),
                    Err(e) => match step.catch.as_ref().filter(|_| catchable) {
                        Some(to) => (
                            json!({"error": e.error, "cause": e.cause}),
                            Some(to.clone()),
                            Some(e),
                        ),
                        None => (Value::Null, None, Some(e)),
                    },
                };
                let record = StepRecord {
                    name: step.name.clone(),
                    path: path.clone(),
                    type_: step.type_,
                    input: Some(input),
                    input_ref: None,
                    output: (error.is_none() || next.is_some()).then(|| output.clone()),
                    output_ref: None,
                    next: next.clone(),
                    attempts,
                    revision,
                    start_time,
                    end_time: now(),
                    error: error.as_ref().map(|e| e.error.clone()),
                    cause: error.as_ref().map(|e| e.cause.clone()),
                };
                let top = if path.is_empty() {
                    next.as_deref()
                } else {
                    None
                };
                self.host.record(record, top).await?;
                index += 1;
                match (next, error) {
                    (Some(n), _) => {
                        cursor = n;
                        input = output;
                    }
                    (None, Some(e)) => return Err(Halt::Failed(e)),
                    (None, None) => return Ok(output),
                }
            }
        })
    }

    /// Invokes a Task's function, again after a failure while `retry` allows: the result, the
    /// attempts made, and the revision that gave the last answer.
    async fn task(
        &self,
        step: &Step,
        input: &Value,
        id: &str,
    ) -> (Result<Value, StepError>, i32, Option<String>) {
        let function = step.function.as_deref().unwrap_or_default();
        let max = step.retry.as_ref().map_or(1, |r| r.max_attempts.max(1));
        let mut backoff = step
            .retry
            .as_ref()
            .map_or(0.0, |r| r.backoff_seconds.max(0.0));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let call = self.host.invoke(function, input, id);
            let (result, revision) = match step.timeout_seconds {
                Some(t) => tokio::time::timeout(Duration::from_secs(t.max(1) as u64), call)
                    .await
                    .unwrap_or_else(|_| {
                        (
                            Err(StepError::new(
                                "Timeout",
                                format!("{function} did not answer within {t} s"),
                            )),
                            None,
                        )
                    }),
                None => call.await,
            };
            match result {
                Ok(v) => return (Ok(v), attempt, revision),
                Err(e) if attempt >= max => return (Err(e), attempt, revision),
                Err(e) => {
                    tracing::debug!(step = %step.name, attempt, error = %e.error, "retrying");
                    tokio::time::sleep(Duration::from_secs_f64(backoff)).await;
                    backoff *= 2.0;
                }
            }
        }
    }
}

/// The step a Choice goes to: the first rule that holds, else the default.
fn choose(step: &Step, input: &Value) -> Result<Option<String>, StepError> {
    for c in &step.choices {
        match eval(&c.condition, input) {
            Ok(Value::Bool(true)) => return Ok(Some(c.next.clone())),
            Ok(Value::Bool(false)) => {}
            Ok(other) => {
                return Err(StepError::new(
                    "ConditionError",
                    format!("{:?} is {other}, not true or false", c.condition),
                ));
            }
            Err(e) => {
                return Err(StepError::new(
                    "ConditionError",
                    format!("{:?}: {e}", c.condition),
                ));
            }
        }
    }
    match &step.default {
        Some(d) => Ok(Some(d.clone())),
        None => Err(StepError::new(
            "NoChoiceMatched",
            format!(
                "step {}: no condition held and there is no default",
                step.name
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn spec(yaml: &str) -> WorkflowSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    const BRANCHING: &str = "
startAt: add
steps:
- {name: add, type: Task, function: add, next: check}
- name: check
  type: Choice
  choices:
  - {condition: 'input.sum > 10', next: big}
  default: small
- {name: big, type: Task, function: double}
- {name: small, type: Task, function: negate}
";

    #[test]
    fn definitions_are_checked_and_errors_name_the_step() {
        let any = |_: &str| true;
        assert_eq!(check(&spec(BRANCHING), &any).unwrap().len, 4);
        let err = |y: &str| check(&spec(y), &any).unwrap_err();
        assert!(
            err("startAt: a\nsteps: [{name: a, type: Task, function: f, next: nope}]")
                .contains("step a: next names no step: \"nope\"")
        );
        assert!(
            err("startAt: a\nsteps: [{name: a, type: Pass}, {name: b, type: Pass}]")
                .contains("step b: unreachable")
        );
        assert!(
            err("startAt: a\nsteps: [{name: a, type: Choice}]").contains("step a: a Choice needs")
        );
        assert!(err("startAt: a\nsteps: [{name: a, type: Choice, choices: [{condition: 'input.', next: a}]}]")
            .contains("step a: condition"));
        let none = |f: &str| f != "ghost";
        assert!(
            check(
                &spec("startAt: a\nsteps: [{name: a, type: Task, function: ghost}]"),
                &none
            )
            .unwrap_err()
            .contains("step a: function \"ghost\" does not exist")
        );
        // Inside a branch, the path names it.
        let e = err(
            "startAt: p\nsteps:\n- name: p\n  type: Parallel\n  branches:\n  - startAt: x\n    steps: [{name: x, type: Pass, next: y}]\n",
        );
        assert!(e.contains("step p[0]/x: next names no step"), "{e}");
    }

    #[test]
    fn cel_sees_the_input_and_reshapes_it() {
        let input = json!({"sum": 12, "user": {"tier": "gold"}});
        assert_eq!(eval("input.sum > 10", &input).unwrap(), json!(true));
        assert_eq!(
            eval("has(input.user) && input.user.tier == \"gold\"", &input).unwrap(),
            json!(true)
        );
        assert_eq!(
            eval("{\"x\": input.sum, \"y\": input.sum * 2}", &input).unwrap(),
            json!({"x": 12, "y": 24})
        );
    }

    /// A host whose functions are Rust closures, keeping the records it is given.
    struct Fake {
        calls: Mutex<Vec<(String, String)>>,
        records: Mutex<Vec<StepRecord>>,
        fail_first: Mutex<HashMap<String, i32>>,
        stop_after: Option<usize>,
    }

    impl Fake {
        fn new() -> Self {
            Fake {
                calls: Mutex::default(),
                records: Mutex::default(),
                fail_first: Mutex::default(),
                stop_after: None,
            }
        }

        fn answer(&self, f: &str, input: &Value, id: &str) -> Result<Value, StepError> {
            self.calls
                .lock()
                .unwrap()
                .push((f.to_owned(), id.to_owned()));
            if let Some(n) = self.fail_first.lock().unwrap().get_mut(f)
                && *n > 0
            {
                *n -= 1;
                return Err(StepError::new("Flaky", "not yet"));
            }
            match f {
                "add" => {
                    Ok(json!({"sum": input["x"].as_i64().unwrap() + input["y"].as_i64().unwrap()}))
                }
                "double" => Ok(json!(input["sum"].as_i64().unwrap() * 2)),
                "negate" => Ok(json!(-input["sum"].as_i64().unwrap())),
                "boom" => Err(StepError::new("KeyError", "'y'")),
                other => Ok(json!({"from": other, "in": input})),
            }
        }
    }

    impl Host for Fake {
        async fn invoke(
            &self,
            f: &str,
            input: &Value,
            id: &str,
        ) -> (Result<Value, StepError>, Option<String>) {
            let answer = self.answer(f, input, id);
            // The fake's functions have one revision each.
            (answer, Some(format!("{f}-00001")))
        }
        async fn record(&self, r: StepRecord, _: Option<&str>) -> Result<(), Halt> {
            let mut records = self.records.lock().unwrap();
            if self.stop_after.is_some_and(|n| records.len() >= n) {
                return Err(Halt::Stopped("crash".into()));
            }
            records.push(r);
            Ok(())
        }
        async fn output(&self, r: &StepRecord) -> Result<Value, Halt> {
            Ok(r.output.clone().unwrap_or(Value::Null))
        }
    }

    fn run(host: &Fake, yaml: &str, input: Value) -> Result<Value, Halt> {
        let s = spec(yaml);
        let chain = check(&s, &|_| true).unwrap();
        let recorded = host.records.lock().unwrap().clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(Run::new(host, "uid", recorded, s.max_steps).walk(String::new(), &chain, input))
    }

    #[test]
    fn a_choice_routes_on_the_previous_result() {
        let h = Fake::new();
        assert_eq!(run(&h, BRANCHING, json!({"x": 3, "y": 9})), Ok(json!(24)));
        let h = Fake::new();
        assert_eq!(run(&h, BRANCHING, json!({"x": 1, "y": 2})), Ok(json!(-3)));
        let names: Vec<_> = h
            .records
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.name.clone())
            .collect();
        assert_eq!(names, ["add", "check", "small"]);
    }

    #[test]
    fn retries_catches_fails_parallels_and_loops() {
        let h = Fake::new();
        h.fail_first.lock().unwrap().insert("flaky".into(), 2);
        let flaky = "startAt: a\nsteps: [{name: a, type: Task, function: flaky, retry: {maxAttempts: 3, backoffSeconds: 0}}]";
        assert!(run(&h, flaky, json!(1)).is_ok());
        let r = &h.records.lock().unwrap()[0];
        assert_eq!(r.attempts, 3);
        assert_eq!(r.revision.as_deref(), Some("flaky-00001"));
        let calls = h.calls.lock().unwrap();
        assert!(
            calls.iter().all(|(_, id)| id == &calls[0].1),
            "one id for every attempt"
        );
        drop(calls);

        let h = Fake::new();
        let caught = "startAt: a\nsteps:\n- {name: a, type: Task, function: boom, catch: handle}\n- {name: handle, type: Pass, output: 'input.error + \": \" + input.cause'}";
        assert_eq!(run(&h, caught, json!({})), Ok(json!("KeyError: 'y'")));

        let h = Fake::new();
        let fail = "startAt: a\nsteps: [{name: a, type: Fail, error: Bad, cause: why}]";
        assert_eq!(
            run(&h, fail, json!({})),
            Err(Halt::Failed(StepError::new("Bad", "why")))
        );

        let h = Fake::new();
        let par = "startAt: p\nsteps:\n- name: p\n  type: Parallel\n  branches:\n  - startAt: x\n    steps: [{name: x, type: Task, function: one}]\n  - startAt: y\n    steps: [{name: y, type: Pass, output: 'input.n + 1'}]\n";
        let out = run(&h, par, json!({"n": 1})).unwrap();
        assert_eq!(out, json!([{"from": "one", "in": {"n": 1}}, 2]));
        let paths: Vec<_> = h
            .records
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.path.clone())
            .collect();
        assert!(paths.contains(&"p#0[0]/".to_string()) && paths.contains(&String::new()));

        let h = Fake::new();
        let looping = "startAt: a\nmaxSteps: 10\nsteps:\n- {name: a, type: Pass, next: b}\n- {name: b, type: Choice, choices: [{condition: 'true', next: a}]}";
        match run(&h, looping, json!(0)) {
            Err(Halt::Failed(e)) => assert_eq!(e.error, "MaxStepsExceeded"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_resumed_run_replays_what_was_recorded_and_reruns_only_the_step_in_flight() {
        let chain = "startAt: s1\nsteps:\n- {name: s1, type: Task, function: f, next: s2}\n- {name: s2, type: Task, function: f, next: s3}\n- {name: s3, type: Task, function: f}";
        let mut h = Fake::new();
        h.stop_after = Some(1);
        assert!(matches!(run(&h, chain, json!(0)), Err(Halt::Stopped(_))));
        // s1 recorded; s2 ran but its record was lost with the "crash".
        assert_eq!(h.calls.lock().unwrap().len(), 2);
        let first_s2 = h.calls.lock().unwrap()[1].1.clone();
        h.stop_after = None;
        h.calls.lock().unwrap().clear();
        let out = run(&h, chain, json!(0)).unwrap();
        let calls = h.calls.lock().unwrap();
        assert_eq!(calls.len(), 2, "s2 again and s3; never s1: {calls:?}");
        assert_eq!(
            calls[0].1, first_s2,
            "the step in flight keeps its invocation id"
        );
        assert_eq!(out["in"]["in"]["in"], json!(0));
        assert_eq!(h.records.lock().unwrap().len(), 3);
    }
}

//! A Job's `podFailurePolicy` (what a failed pod means: fail the Job, fail its index, not
//! count, or count against the backoff limit) and `successPolicy` (which succeeded indexes
//! are enough), as upstream's `pod_failure_policy.go` and `success_policy.go`.

use super::indexes::Indexes;
use k8s_openapi::api::batch::v1::{Job, PodFailurePolicyRule};
use k8s_openapi::api::core::v1::Pod;

/// What a failed pod means for its Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The Job fails at once (`FailJob`), with upstream's message.
    FailJob(String),
    /// The pod's index fails at once (`FailIndex`).
    FailIndex,
    /// The failure is not counted (`Ignore`).
    Ignore,
    /// The failure counts against the backoff limits (`Count`, and no rule matching).
    Count,
}

/// The action of the first rule of the Job's pod failure policy a failed pod matches.
pub fn action(job: &Job, pod: &Pod) -> Action {
    let rules = job
        .spec
        .as_ref()
        .and_then(|s| s.pod_failure_policy.as_ref())
        .map(|p| p.rules.as_slice())
        .unwrap_or_default();
    let who = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    for (i, rule) in rules.iter().enumerate() {
        let Some(what) = matches(rule, pod, &who) else {
            continue;
        };
        return match rule.action.as_str() {
            "FailJob" => Action::FailJob(format!("{what} matching FailJob rule at index {i}")),
            "FailIndex" => Action::FailIndex,
            "Ignore" => Action::Ignore,
            _ => Action::Count,
        };
    }
    Action::Count
}

/// What made a rule match (the start of upstream's message), if it does.
fn matches(rule: &PodFailurePolicyRule, pod: &Pod, who: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    if let Some(on) = &rule.on_exit_codes {
        let statuses = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for c in statuses {
            if on.container_name.as_ref().is_some_and(|n| *n != c.name) {
                continue;
            }
            let Some(code) = c
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| t.exit_code)
            else {
                continue;
            };
            // Exit code 0 never matches (upstream: a successful container is no failure).
            let listed = on.values.contains(&code);
            let hit = code != 0
                && match on.operator.as_str() {
                    "In" => listed,
                    "NotIn" => !listed,
                    _ => false,
                };
            if hit {
                return Some(format!(
                    "Container {} for pod {who} failed with exit code {code}",
                    c.name
                ));
            }
        }
        return None;
    }
    for pattern in rule.on_pod_conditions.iter().flatten() {
        let want = pattern.status.as_str();
        if status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == pattern.type_ && c.status == want)
        {
            return Some(format!("Pod {who} has condition {}", pattern.type_));
        }
    }
    None
}

/// The message of the first success policy rule the succeeded indexes meet, if any.
pub fn success(job: &Job, completions: i32, succeeded: &Indexes) -> Option<String> {
    let rules = &job.spec.as_ref()?.success_policy.as_ref()?.rules;
    if succeeded.is_empty() {
        return None;
    }
    for (i, rule) in rules.iter().enumerate() {
        let met = match (&rule.succeeded_indexes, rule.succeeded_count) {
            (Some(text), count) => {
                let required = Indexes::parse(text, completions);
                let done = required.0.intersection(&succeeded.0).count();
                !required.is_empty()
                    && match count {
                        Some(n) => done as i32 >= n,
                        None => done == required.len(),
                    }
            }
            (None, Some(n)) => succeeded.len() as i32 >= n,
            (None, None) => false,
        };
        if met {
            return Some(format!("Matched rules at index {i}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(policy: serde_json::Value) -> Job {
        serde_json::from_value(json!({"metadata": {"name": "j"}, "spec": {
            "template": {"spec": {"containers": []}}, "podFailurePolicy": policy,
            "successPolicy": {"rules": [{"succeededIndexes": "0,2"}, {"succeededCount": 3}]}}}))
        .unwrap()
    }

    fn failed(code: i32, conditions: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"},
            "status": {"phase": "Failed", "conditions": conditions,
                "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": code}}}]}}))
        .unwrap()
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let j = job(json!({"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [2]}},
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [2, 42]}}]}));
        let evicted = failed(137, json!([{"type": "DisruptionTarget", "status": "True"}]));
        assert_eq!(action(&j, &evicted), Action::Ignore);
        assert_eq!(action(&j, &failed(2, json!([]))), Action::FailIndex);
        assert_eq!(
            action(&j, &failed(1, json!([]))),
            Action::FailJob(
                "Container main for pod ns/p failed with exit code 1 matching FailJob rule at index 2".into()
            )
        );
        assert_eq!(action(&j, &failed(42, json!([]))), Action::Count);
    }

    #[test]
    fn success_rules_need_their_indexes_or_their_count() {
        let j = job(json!(null));
        let set = |t: &str| Indexes::parse(t, 5);
        assert_eq!(success(&j, 5, &set("0")), None);
        assert_eq!(
            success(&j, 5, &set("0,2")).as_deref(),
            Some("Matched rules at index 0")
        );
        assert_eq!(
            success(&j, 5, &set("1,3-4")).as_deref(),
            Some("Matched rules at index 1")
        );
    }
}

//! The spec validators of Deployments, ReplicaSets, StatefulSets and DaemonSets (upstream's `pkg/apis/apps/validation`).

use super::*;

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

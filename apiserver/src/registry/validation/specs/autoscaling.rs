//! The spec validators of HorizontalPodAutoscalers (upstream's `pkg/apis/autoscaling/validation`).

use super::*;

pub(crate) fn hpa(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    let target = spec.and_then(|s| s.get("scaleTargetRef"));
    require(target, "kind", "spec.scaleTargetRef", "", causes);
    match str_at(target, "name") {
        None | Some("") => causes.push(Cause::required("spec.scaleTargetRef.name", "")),
        Some(n) => causes.extend(crate::registry::validation::check_name(
            crate::registry::NameRule::Path,
            "spec.scaleTargetRef.name",
            n,
        )),
    }
    let min = int(spec, "minReplicas");
    let max = int(spec, "maxReplicas").unwrap_or(0);
    if let Some(m) = min
        && m < 1
    {
        // minReplicas 0 needs the HPAScaleToZero feature gate, which is off (as upstream's default).
        causes.push(Cause::invalid(
            "spec.minReplicas",
            &m.to_string(),
            "must be greater than or equal to 1",
        ));
    }
    if max < 1 {
        causes.push(Cause::invalid(
            "spec.maxReplicas",
            &max.to_string(),
            "must be greater than 0",
        ));
    }
    if let Some(m) = min
        && max < m
    {
        causes.push(Cause::invalid(
            "spec.maxReplicas",
            &max.to_string(),
            "must be greater than or equal to `minReplicas`",
        ));
    }
    // autoscaling/v1
    if let Some(p) = int(spec, "targetCPUUtilizationPercentage")
        && p < 1
    {
        causes.push(Cause::invalid(
            "spec.targetCPUUtilizationPercentage",
            &p.to_string(),
            "must be greater than or equal to 1",
        ));
    }
    // autoscaling/v2
    if let Some(metrics) = spec
        .and_then(|s| s.get("metrics"))
        .and_then(Value::as_array)
    {
        for (i, m) in metrics.iter().enumerate() {
            hpa_metric(m, &format!("spec.metrics[{i}]"), causes);
        }
    }
    if let Some(b) = spec.and_then(|s| s.get("behavior")) {
        for dir in ["scaleUp", "scaleDown"] {
            let Some(rules) = b.get(dir) else { continue };
            let path = format!("spec.behavior.{dir}");
            if let Some(w) = int(Some(rules), "stabilizationWindowSeconds")
                && !(0..=3600).contains(&w)
            {
                causes.push(Cause::invalid(
                    &format!("{path}.stabilizationWindowSeconds"),
                    &w.to_string(),
                    if w < 0 {
                        "must be greater than or equal to zero"
                    } else {
                        "must be less than or equal to 3600"
                    },
                ));
            }
            one_of(
                Some(rules),
                "selectPolicy",
                &path,
                &["Max", "Min", "Disabled"],
                causes,
            );
            let policies = rules.get("policies").and_then(Value::as_array);
            if policies.is_some_and(Vec::is_empty) {
                causes.push(Cause::required(
                    &format!("{path}.policies"),
                    "must specify at least one Policy",
                ));
            }
            for (j, p) in policies.into_iter().flatten().enumerate() {
                let ppath = format!("{path}.policies[{j}]");
                one_of(Some(p), "type", &ppath, &["Pods", "Percent"], causes);
                if int(Some(p), "value").is_none_or(|v| v <= 0) {
                    causes.push(Cause::invalid(
                        &format!("{ppath}.value"),
                        &int(Some(p), "value").unwrap_or(0).to_string(),
                        "must be greater than zero",
                    ));
                }
                let period = int(Some(p), "periodSeconds").unwrap_or(0);
                if !(1..=1800).contains(&period) {
                    causes.push(Cause::invalid(
                        &format!("{ppath}.periodSeconds"),
                        &period.to_string(),
                        if period <= 0 {
                            "must be greater than zero"
                        } else {
                            "must be less than or equal to 1800"
                        },
                    ));
                }
            }
        }
    }
}

pub(crate) fn hpa_metric(m: &Value, path: &str, causes: &mut Vec<Cause>) {
    const TYPES: [(&str, &str); 5] = [
        ("Object", "object"),
        ("Pods", "pods"),
        ("Resource", "resource"),
        ("ContainerResource", "containerResource"),
        ("External", "external"),
    ];
    let Some(ty) = m.get("type").and_then(Value::as_str) else {
        causes.push(Cause::required(
            &format!("{path}.type"),
            "must specify a metric source type",
        ));
        return;
    };
    let Some((_, field)) = TYPES.iter().find(|(t, _)| *t == ty) else {
        let allowed: Vec<&str> = TYPES.iter().map(|(t, _)| *t).collect();
        causes.push(Cause::not_supported(&format!("{path}.type"), ty, &allowed));
        return;
    };
    let Some(source) = m.get(*field) else {
        causes.push(Cause::required(
            &format!("{path}.{field}"),
            &format!("must populate information for the given metric source (type {ty})"),
        ));
        return;
    };
    let spath = format!("{path}.{field}");
    if matches!(ty, "Resource" | "ContainerResource") {
        require(
            Some(source),
            "name",
            &spath,
            "must specify a resource name",
            causes,
        );
    }
    if ty == "ContainerResource" {
        require(
            Some(source),
            "container",
            &spath,
            "must specify a container",
            causes,
        );
    }
    let target = source.get("target");
    let tpath = format!("{spath}.target");
    match str_at(target, "type") {
        None | Some("") => causes.push(Cause::required(
            &format!("{tpath}.type"),
            "must specify a metric target type",
        )),
        Some("Utilization") => {
            if int(target, "averageUtilization").is_none_or(|u| u <= 0) {
                causes.push(Cause::required(
                    &format!("{tpath}.averageUtilization"),
                    "must set either a target raw value or a target utilization",
                ));
            }
        }
        Some("Value") if target.and_then(|t| t.get("value")).is_none() => {
            causes.push(Cause::required(
                &format!("{tpath}.value"),
                "must set either a target value for metric or a per-pod target",
            ))
        }
        Some("AverageValue") if target.and_then(|t| t.get("averageValue")).is_none() => causes
            .push(Cause::required(
                &format!("{tpath}.averageValue"),
                "must set either a target value for metric or a per-pod target",
            )),
        Some("Value" | "AverageValue") => {}
        Some(t) => causes.push(Cause::not_supported(
            &format!("{tpath}.type"),
            t,
            &["Utilization", "Value", "AverageValue"],
        )),
    }
}

//! The spec validators of PodDisruptionBudgets (upstream's `pkg/apis/policy/validation`).

use super::*;

pub(crate) fn pdb(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    let min = spec
        .and_then(|s| s.get("minAvailable"))
        .filter(|v| !v.is_null());
    let max = spec
        .and_then(|s| s.get("maxUnavailable"))
        .filter(|v| !v.is_null());
    if min.is_some() && max.is_some() {
        causes.push(Cause::invalid(
            "spec",
            "",
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (key, v) in [("minAvailable", min), ("maxUnavailable", max)] {
        let Some(v) = v else { continue };
        let field = format!("spec.{key}");
        match int_or_percent(v) {
            Ok((n, _)) if n < 0 => causes.push(Cause::invalid(
                &field,
                &n.to_string(),
                "must be greater than or equal to 0",
            )),
            Ok((n, true)) if n > 100 => causes.push(Cause::invalid(
                &field,
                &format!("{n}%"),
                "must not be greater than 100%",
            )),
            Ok(_) => {}
            Err(shown) => causes.push(Cause::invalid(
                &field,
                &shown,
                "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            )),
        }
    }
    label_selector(
        spec.and_then(|s| s.get("selector")),
        "spec.selector",
        causes,
    );
    one_of(
        spec,
        "unhealthyPodEvictionPolicy",
        "spec",
        &["IfHealthyBudget", "AlwaysAllow"],
        causes,
    );
}

//! The spec validators of Jobs and CronJobs (upstream's `pkg/apis/batch/validation`).

use super::*;

pub(crate) fn job_spec(spec: Option<&Value>, path: &str, causes: &mut Vec<Cause>) {
    label_selector(
        spec.and_then(|s| s.get("selector")),
        &format!("{path}.selector"),
        causes,
    );
    for key in ["parallelism", "completions", "backoffLimit"] {
        at_least(spec, key, path, 0, causes);
    }
    at_least(spec, "activeDeadlineSeconds", path, 1, causes);
    at_least(spec, "ttlSecondsAfterFinished", path, 0, causes);
    one_of(
        spec,
        "completionMode",
        path,
        &["NonIndexed", "Indexed"],
        causes,
    );
    if str_at(spec, "completionMode") == Some("Indexed") && int(spec, "completions").is_none() {
        causes.push(Cause::required(
            &format!("{path}.completions"),
            "when completion mode is Indexed",
        ));
    }
    let template = spec.and_then(|s| s.pointer("/template/spec"));
    let tpath = format!("{path}.template.spec");
    pod_spec(template, &tpath, causes);
    match str_at(template, "restartPolicy") {
        Some("OnFailure" | "Never") => {}
        Some(p) => causes.push(Cause::not_supported(
            &format!("{tpath}.restartPolicy"),
            p,
            &["OnFailure", "Never"],
        )),
        None => {}
    }
}

pub(crate) fn cronjob(spec: Option<&Value>, causes: &mut Vec<Cause>) {
    match str_at(spec, "schedule") {
        None | Some("") => causes.push(Cause::required("spec.schedule", "")),
        Some(s) => {
            let fields = s.split_whitespace().count();
            let ok = if s.starts_with('@') {
                matches!(
                    s,
                    "@yearly"
                        | "@annually"
                        | "@monthly"
                        | "@weekly"
                        | "@daily"
                        | "@midnight"
                        | "@hourly"
                ) || s.starts_with("@every ")
            } else {
                fields == 5
                    && s.split_whitespace().all(|f| {
                        f.bytes().all(|b| {
                            b.is_ascii_alphanumeric()
                                || matches!(b, b'*' | b'/' | b',' | b'-' | b'?')
                        })
                    })
            };
            if !ok {
                causes.push(Cause::invalid(
                    "spec.schedule",
                    s,
                    &format!("expected exactly 5 fields, found {fields}: {s}"),
                ));
            }
        }
    }
    one_of(
        spec,
        "concurrencyPolicy",
        "spec",
        &["Allow", "Forbid", "Replace"],
        causes,
    );
    for key in [
        "successfulJobsHistoryLimit",
        "failedJobsHistoryLimit",
        "startingDeadlineSeconds",
    ] {
        at_least(spec, key, "spec", 0, causes);
    }
    job_spec(
        spec.and_then(|s| s.pointer("/jobTemplate/spec")),
        "spec.jobTemplate.spec",
        causes,
    );
}

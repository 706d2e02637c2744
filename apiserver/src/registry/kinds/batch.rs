//! Jobs and CronJobs (upstream's `pkg/registry/batch/{job,cronjob}`).

use super::human_duration;
use super::{
    Row, Strategy, age_of, i, immutable, len, list, or_none, s, selector_text, template_columns,
};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::defaults::{child, job_selector, pod_spec, set_default};
use crate::registry::validation::specs;
use serde_json::{Value, json};

/// `batch/v1` Job.
pub struct Job;

impl Strategy for Job {
    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "parallelism", json!(1));
        // Upstream: unlimited when failures are limited per index instead.
        let per_index = spec
            .get("backoffLimitPerIndex")
            .is_some_and(|v| !v.is_null());
        set_default(
            spec,
            "backoffLimit",
            json!(if per_index { i32::MAX } else { 6 }),
        );
        if spec.get("podFailurePolicy").is_some_and(|v| !v.is_null()) {
            set_default(spec, "podReplacementPolicy", json!("Failed"));
        } else {
            set_default(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
        }
        set_default(spec, "completionMode", json!("NonIndexed"));
        set_default(spec, "suspend", json!(false));
        if let Some(t) = obj.pointer_mut("/spec/template/spec") {
            pod_spec(t);
        }
        job_selector(obj);
        if obj.pointer("/spec/completions").is_none() {
            let p = obj
                .pointer("/spec/parallelism")
                .cloned()
                .unwrap_or(json!(1));
            if obj.pointer("/spec/parallelism") == Some(&json!(1)) {
                obj["spec"]["completions"] = p;
            }
        }
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::job_spec(obj.get("spec"), "spec", causes);
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, &[("/spec/selector", "spec.selector")], causes);
        // The pod template is fixed once a Job may have started pods (upstream lets a
        // suspended Job's template change).
        let suspended = old.pointer("/spec/suspend") == Some(&json!(true));
        if !suspended && new.pointer("/spec/template") != old.pointer("/spec/template") {
            causes.push(Cause::immutable("spec.template"));
        }
        if new.pointer("/spec/completionMode") != old.pointer("/spec/completionMode") {
            causes.push(Cause::immutable("spec.completionMode"));
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Status", "string", 0, || {
            let has = |t: &str| {
                list(o, "/status/conditions")
                    .iter()
                    .any(|c| s(c, "/type") == t && s(c, "/status") == "True")
            };
            if has("Complete") {
                "Complete"
            } else if has("Failed") {
                "Failed"
            } else if has("Suspended") {
                "Suspended"
            } else {
                "Running"
            }
        });
        row.col("Completions", "string", 0, || {
            match o.pointer("/spec/completions") {
                Some(c) if !c.is_null() => format!("{}/{}", i(o, "/status/succeeded"), c),
                _ => format!(
                    "{}/1 of {}",
                    i(o, "/status/succeeded"),
                    i(o, "/spec/parallelism")
                ),
            }
        });
        row.col("Duration", "string", 0, || {
            match (
                s(o, "/status/startTime").parse::<jiff::Timestamp>(),
                s(o, "/status/completionTime").parse::<jiff::Timestamp>(),
            ) {
                (Ok(st), Ok(end)) => human_duration((end - st).get_seconds()),
                (Ok(st), Err(_)) => human_duration((jiff::Timestamp::now() - st).get_seconds()),
                _ => String::new(),
            }
        });
        row.age(o);
        template_columns(o, row);
        row.col("Selector", "string", 1, || {
            selector_text(o.pointer("/spec/selector").unwrap_or(&Value::Null))
        });
    }
}

/// `batch/v1` CronJob.
pub struct CronJob;

impl Strategy for CronJob {
    fn default(&self, obj: &mut Value) {
        let spec = child(obj, "spec");
        set_default(spec, "concurrencyPolicy", json!("Allow"));
        set_default(spec, "suspend", json!(false));
        set_default(spec, "successfulJobsHistoryLimit", json!(3));
        set_default(spec, "failedJobsHistoryLimit", json!(1));
        if let Some(t) = obj.pointer_mut("/spec/jobTemplate/spec/template/spec") {
            pod_spec(t);
        }
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::cronjob(obj.get("spec"), causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Schedule", "string", 0, || s(o, "/spec/schedule"));
        row.col("Timezone", "string", 0, || or_none(s(o, "/spec/timeZone")));
        row.col("Suspend", "boolean", 0, || {
            o.pointer("/spec/suspend") == Some(&json!(true))
        });
        row.col("Active", "integer", 0, || len(o, "/status/active"));
        row.col("Last Schedule", "string", 0, || {
            match s(o, "/status/lastScheduleTime") {
                t if t.is_empty() => "<none>".into(),
                t => age_of(&t),
            }
        });
        row.age(o);
    }
}

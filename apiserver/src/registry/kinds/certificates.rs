//! CertificateSigningRequests (upstream's `pkg/registry/certificates/certificates`): the
//! requestor is whoever creates it, the spec is fixed, `approval` changes only the
//! Approved and Denied conditions and `status` everything but them.

use super::human_duration;
use super::{Row, Strategy, conditions_where, immutable, s};
use crate::auth::User;
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::validation::specs;
use serde_json::{Value, json};

/// `certificates.k8s.io/v1` CertificateSigningRequest.
pub struct CertificateSigningRequest;

impl Strategy for CertificateSigningRequest {
    /// Upstream's `csrStrategy.PrepareForCreate` fills `spec.username`, `uid`, `groups` and
    /// `extra` from the user who creates it, whatever the client sent.
    fn prepare_for_create(&self, obj: &mut Value, user: &User) {
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let spec = obj["spec"].as_object_mut().expect("spec is an object");
        spec.insert("username".into(), json!(user.name));
        spec.insert("groups".into(), json!(user.groups));
        spec.remove("uid");
        spec.remove("extra");
    }

    /// `status` keeps the stored Approved and Denied conditions, and `approval` changes the
    /// conditions only (upstream's csrStatusStrategy and csrApprovalStrategy).
    fn prepare_for_status(&self, merged: &mut Value, old: &Value, sub: Option<&str>) {
        let decision = |t: &str| t == "Approved" || t == "Denied";
        if !merged.get("status").is_some_and(Value::is_object) {
            merged["status"] = json!({});
        }
        if sub == Some("approval") {
            let certificate = old.pointer("/status/certificate").cloned();
            let status = merged["status"].as_object_mut().expect("status object");
            match certificate {
                Some(c) => status.insert("certificate".into(), c),
                None => status.remove("certificate"),
            };
            return;
        }
        let mut keep = conditions_where(merged, |t| !decision(t));
        let mut conditions = conditions_where(old, decision);
        conditions.append(&mut keep);
        if conditions.is_empty() {
            merged["status"]
                .as_object_mut()
                .expect("status object")
                .remove("conditions");
        } else {
            merged["status"]["conditions"] = json!(conditions);
        }
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        specs::csr(obj, causes);
    }

    /// The spec is fixed, and a decision stands: Approved and Denied may not be removed.
    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable(new, old, &[("/spec", "spec")], causes);
        for t in ["Approved", "Denied"] {
            let had = !conditions_where(old, |x| x == t).is_empty();
            if had && conditions_where(new, |x| x == t).is_empty() {
                causes.push(Cause::forbidden(
                    "status.conditions",
                    &format!("updates may not remove a condition of type {t:?}"),
                ));
            }
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.age(o);
        row.col("SignerName", "string", 0, || s(o, "/spec/signerName"));
        row.col("Requestor", "string", 0, || s(o, "/spec/username"));
        row.col("RequestedDuration", "string", 0, || {
            match o.pointer("/spec/expirationSeconds").and_then(Value::as_i64) {
                Some(secs) => human_duration(secs),
                None => "<none>".into(),
            }
        });
        row.col("Condition", "string", 0, || csr_condition(o));
    }
}

/// A CSR's CONDITION column as upstream's `extractCSRStatus`: Denied, else Approved, else
/// Pending; then `,Failed` and `,Issued` when they apply.
fn csr_condition(o: &Value) -> String {
    let types: Vec<String> = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().map(|c| s(c, "/type")).collect())
        .unwrap_or_default();
    let has = |t: &str| types.iter().any(|x| x == t);
    let mut out = if has("Denied") {
        "Denied".to_owned()
    } else if has("Approved") {
        "Approved".to_owned()
    } else {
        "Pending".to_owned()
    };
    if has("Failed") {
        out.push_str(",Failed");
    }
    if o.pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        out.push_str(",Issued");
    }
    out
}

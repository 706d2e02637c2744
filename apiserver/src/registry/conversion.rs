//! Custom resource conversion by webhook (a CRD's `spec.conversion.strategy: Webhook`), as
//! upstream's `apiextensions-apiserver/pkg/apiserver/conversion/webhook_converter.go`: an
//! object read or written in a version other than the one it is stored in is sent to the
//! webhook in a `ConversionReview` (`apiextensions.k8s.io/v1` or `v1beta1`, the first the
//! CRD lists that is known), and the answer is checked: same count, the desired
//! `apiVersion`, and metadata changed only in labels and annotations (the rest is restored).
//!
//! Reading and encoding are synchronous in this apiserver (the watch cache decodes lazily),
//! so the call blocks its thread: on the multi-threaded runtime through
//! `block_in_place` (other tasks move on), elsewhere on a thread of its own.

use crate::admission::webhook_client::{Target, client_config, post_review};
use serde_json::{Value, json};
use std::time::Duration;

/// How long a conversion may take (upstream's webhook converter timeout).
const TIMEOUT: Duration = Duration::from_secs(30);

/// A CRD's conversion webhook.
pub struct Webhook {
    target: Target,
    ca: Vec<u8>,
    /// The ConversionReview apiVersion sent.
    review_version: String,
    store: minik8s_storage::Storage,
    tasks: tokio_util::task::TaskTracker,
}

impl Webhook {
    /// The webhook of a CRD whose conversion strategy is `Webhook`; `None` otherwise (or
    /// when it names no review version this server speaks).
    pub fn of(
        crd: &Value,
        store: minik8s_storage::Storage,
        tasks: tokio_util::task::TaskTracker,
    ) -> Option<Webhook> {
        let conversion = crd.pointer("/spec/conversion")?;
        if conversion.get("strategy").and_then(Value::as_str) != Some("Webhook") {
            return None;
        }
        let hook = conversion.get("webhook")?;
        let (target, ca) = client_config(hook.get("clientConfig")?)?;
        let review_version = hook
            .get("conversionReviewVersions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|v| matches!(*v, "v1" | "v1beta1"))?
            .to_owned();
        Some(Webhook {
            target,
            ca,
            review_version,
            store,
            tasks,
        })
    }

    /// Converts `obj` to `to` (an apiVersion); `Err` says why the webhook failed.
    pub fn convert(&self, obj: Value, to: &str) -> Result<Value, String> {
        let uid = uuid::Uuid::new_v4().to_string();
        let review = json!({
            "kind": "ConversionReview",
            "apiVersion": format!("apiextensions.k8s.io/{}", self.review_version),
            "request": {"uid": uid, "desiredAPIVersion": to, "objects": [obj]},
        });
        let body = serde_json::to_vec(&review).expect("json");
        let call = async {
            match tokio::time::timeout(
                TIMEOUT,
                post_review(&self.store, &self.tasks, &self.target, &self.ca, body, None),
            )
            .await
            {
                Ok(answer) => answer,
                Err(_) => Err("context deadline exceeded".to_owned()),
            }
        };
        let answer = block_on(call)?;
        let obj = review["request"]["objects"][0].clone();
        checked(answer, &uid, obj, to)
    }
}

/// Runs a future to completion from synchronous code inside or outside a runtime.
fn block_on<F: std::future::Future<Output = Result<Value, String>> + Send>(
    f: F,
) -> Result<Value, String> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| h.block_on(f))
        }
        _ => std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?
                    .block_on(f)
            })
            .join()
            .map_err(|_| "conversion thread panicked".to_owned())?
        }),
    }
}

/// The converted object of a webhook's answer, checked as upstream does; the original's
/// metadata is kept except labels and annotations.
fn checked(answer: Value, uid: &str, original: Value, to: &str) -> Result<Value, String> {
    let response = answer
        .get("response")
        .ok_or("conversion webhook response was absent")?;
    if response.get("uid").and_then(Value::as_str) != Some(uid) {
        return Err(format!(
            "expected response.uid={uid:?}, got {:?}",
            response
                .get("uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
        ));
    }
    if let Some(result) = response.get("result")
        && result.get("status").and_then(Value::as_str) != Some("Success")
    {
        let message = result
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("conversion failed");
        return Err(format!("conversion webhook returned failure: {message}"));
    }
    let objects = response
        .get("convertedObjects")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if objects.len() != 1 {
        return Err(format!(
            "returned objects mismatch, expected 1 and got {}",
            objects.len()
        ));
    }
    let mut converted = objects.into_iter().next().expect("one");
    let version = converted
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if version != to {
        return Err(format!(
            "invalid apiVersion {version:?} in converted object, expected {to:?}"
        ));
    }
    let mut meta = original.get("metadata").cloned().unwrap_or(json!({}));
    for key in ["labels", "annotations"] {
        match converted.pointer(&format!("/metadata/{key}")) {
            Some(v) => meta[key] = v.clone(),
            None => {
                if let Some(m) = meta.as_object_mut() {
                    m.remove(key);
                }
            }
        }
    }
    converted["metadata"] = meta;
    Ok(converted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_checked_and_keeps_the_original_metadata() {
        let original = json!({"apiVersion": "g/v1", "kind": "K",
            "metadata": {"name": "a", "uid": "u1", "labels": {"x": "1"}}, "hostPort": "h:1"});
        let answer = |obj: Value| json!({"response": {"uid": "r", "result": {"status": "Success"}, "convertedObjects": [obj]}});
        let good = json!({"apiVersion": "g/v2", "kind": "K",
            "metadata": {"name": "changed", "uid": "other", "labels": {"y": "2"}},
            "host": "h", "port": "1"});
        let out = checked(answer(good.clone()), "r", original.clone(), "g/v2").unwrap();
        assert_eq!(out["metadata"]["name"], "a");
        assert_eq!(out["metadata"]["uid"], "u1");
        assert_eq!(out["metadata"]["labels"], json!({"y": "2"}));
        assert_eq!(out["host"], "h");
        let err = checked(answer(good.clone()), "r", original.clone(), "g/v3").unwrap_err();
        assert!(err.contains("invalid apiVersion"), "{err}");
        let err = checked(answer(good), "other", original.clone(), "g/v2").unwrap_err();
        assert!(err.contains("expected response.uid"), "{err}");
        let failed =
            json!({"response": {"uid": "r", "result": {"status": "Failure", "message": "no"}}});
        let err = checked(failed, "r", original, "g/v2").unwrap_err();
        assert!(err.contains("returned failure: no"), "{err}");
    }
}

//! ResourceQuotas and LimitRanges (upstream's `pkg/registry/core/{resourcequota,limitrange}`).
//!
//! A quota's `status.used` is recounted by the apiserver as soon as the quota is written,
//! not by a controller as upstream's: admission reads the same counts, so a quota is
//! enforced from its first write (see docs/architecture.md).

use super::{CreatedAt, Row, Strategy};
use crate::Api;
use crate::error::{ApiResult, Cause};
use crate::registry::ResourceInfo;
use crate::registry::validation::specs::quantities;
use futures::future::BoxFuture;
use serde_json::Value;

/// `core/v1` ResourceQuota.
pub struct ResourceQuota;

impl Strategy for ResourceQuota {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        quantities(obj.pointer("/spec/hard"), "spec.hard", causes);
    }

    /// Counts what the namespace uses into the quota's status.
    fn after_write<'a>(&'a self, api: &'a Api, obj: &'a Value) -> BoxFuture<'a, ApiResult<bool>> {
        Box::pin(async move {
            let ns = crate::object::meta_str(obj, "namespace").unwrap_or_default();
            crate::admission::quota::refresh(api, ns).await?;
            Ok(true)
        })
    }
}

/// `core/v1` LimitRange.
pub struct LimitRange;

impl Strategy for LimitRange {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        let limits = obj.pointer("/spec/limits").and_then(Value::as_array);
        for (i, l) in limits.into_iter().flatten().enumerate() {
            for f in [
                "max",
                "min",
                "default",
                "defaultRequest",
                "maxLimitRequestRatio",
            ] {
                quantities(l.get(f), &format!("spec.limits[{i}].{f}"), causes);
            }
        }
    }

    fn table(&self, res: &ResourceInfo, o: &Value, row: &mut Row) {
        CreatedAt.table(res, o, row);
    }
}

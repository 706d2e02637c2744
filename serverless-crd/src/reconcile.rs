//! What the Function, revision and Workflow reconciles share: their error, conditions that
//! keep their transition time, and a short stable hash.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// Wraps an API error with what was being done.
pub(crate) fn api(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { what, source }
}

/// A condition, keeping its last transition time while its status stays the same.
pub(crate) fn condition(
    old: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    let status = if status { "True" } else { "False" };
    let kept = old.iter().find(|c| c.type_ == type_ && c.status == status);
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: kept
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| Time(jiff::Timestamp::now())),
    }
}

/// A short stable hash (FNV-1a) of some strings (code and handler for the template annotation; names).
pub(crate) fn hash(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}

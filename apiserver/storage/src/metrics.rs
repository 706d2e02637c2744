//! Storage latency as upstream's apiserver reports it: `etcd_request_duration_seconds`, by
//! operation (`get`, `list`, `create`, `update`, `delete`, `watch`, `compact`) and type (the
//! resource the key belongs to, `/registry/<group>/<resource>/…`), for either backend.

use minik8s_metrics::{HistogramVec, labels};
use std::sync::OnceLock;
use std::time::Instant;

fn family() -> &'static HistogramVec {
    static F: OnceLock<HistogramVec> = OnceLock::new();
    F.get_or_init(minik8s_metrics::latency_family)
}

/// Registers the storage series in `component`'s registry (once per process).
pub fn register(component: &'static str) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        minik8s_metrics::register(
            component,
            "etcd_request_duration_seconds",
            "Etcd request latency in seconds for each operation and object type.",
            family().clone(),
        )
    });
}

/// The resource a key (or prefix) belongs to.
pub fn type_of(key: &str) -> &str {
    let mut parts = key.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("registry"), Some(_), Some(resource)) if !resource.is_empty() => resource,
        _ => "other",
    }
}

/// Records one operation on `key` that started at `started`.
pub fn observe(operation: &str, key: &str, started: Instant) {
    family()
        .get_or_create(&labels(&[("operation", operation), ("type", type_of(key))]))
        .observe(started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_name_their_resource() {
        assert_eq!(super::type_of("/registry/core/pods/default/web"), "pods");
        assert_eq!(super::type_of("/registry/apps/deployments/"), "deployments");
        assert_eq!(super::type_of("\0"), "other");
    }
}

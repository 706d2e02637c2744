//! What the runtime writes into Docker: container names and the labels that carry what the
//! CRI must answer later.

use std::collections::HashMap;

/// Which CRI object a Docker container is: `sandbox` or `container`.
pub const KIND: &str = "io.minik8s.cri.kind";
/// The CRI metadata (JSON).
pub const METADATA: &str = "io.minik8s.cri.metadata";
/// The CRI annotations (JSON).
pub const ANNOTATIONS: &str = "io.minik8s.cri.annotations";
/// A container's sandbox id.
pub const SANDBOX: &str = "io.minik8s.cri.sandbox";
/// A container's image as the kubelet asked for it.
pub const IMAGE: &str = "io.minik8s.cri.image";
/// The node the container is for.
pub const NODE: &str = "io.minik8s.cri.node";

/// The labels that are the runtime's own, not the CRI caller's.
pub fn internal(key: &str) -> bool {
    key.starts_with("io.minik8s.cri.")
}

/// The CRI labels of a Docker container: its labels less the runtime's own.
pub fn cri_labels(labels: &HashMap<String, String>) -> HashMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| !internal(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The CRI annotations kept in a Docker container's labels.
pub fn annotations(labels: &HashMap<String, String>) -> HashMap<String, String> {
    labels
        .get(ANNOTATIONS)
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default()
}

/// The design's name of a pod's container: `<pod>.<container>` (the sandbox's is
/// `<pod>.pause`). Docker allows `[a-zA-Z0-9][a-zA-Z0-9_.-]*`, which pod and container
/// names keep to.
pub fn container_name(pod: &str, container: &str) -> String {
    format!("{pod}.{container}")
}

/// A name for a container whose design name another holds (a pod of the same name in another
/// namespace, or an earlier attempt still running): the design name with the pod's uid's
/// start and the attempt.
pub fn fallback_name(name: &str, uid: &str, attempt: u32) -> String {
    let short: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    format!("{name}.{short}.{attempt}")
}

/// The network aliases of a pod: its `app` and `k8s-app` labels' values.
pub fn aliases(labels: &HashMap<String, String>) -> Vec<String> {
    let mut out: Vec<String> = ["app", "k8s-app"]
        .iter()
        .filter_map(|k| labels.get(*k))
        .filter(|v| !v.is_empty())
        .cloned()
        .collect();
    out.dedup();
    out
}

/// Nanoseconds since the epoch of a Docker time (RFC 3339); 0 for Docker's zero time or
/// none.
pub fn nanos(time: Option<&str>) -> i64 {
    time.and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_nanosecond())
        .and_then(|n| i64::try_from(n).ok())
        .filter(|n| *n > 0)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_design_and_fall_back_uniquely() {
        assert_eq!(container_name("web-1", "main"), "web-1.main");
        assert_eq!(
            fallback_name("web-1.main", "5f0c2a1e-77aa-4c1b", 2),
            "web-1.main.5f0c2a1e.2"
        );
    }

    #[test]
    fn aliases_come_from_app_and_k8s_app() {
        let labels: HashMap<String, String> = [
            ("app".to_owned(), "web".to_owned()),
            ("k8s-app".to_owned(), "dns".to_owned()),
            ("tier".to_owned(), "x".to_owned()),
        ]
        .into();
        assert_eq!(aliases(&labels), ["web", "dns"]);
        assert!(aliases(&HashMap::new()).is_empty());
    }

    #[test]
    fn docker_times_read_as_nanoseconds_and_zero_time_as_none() {
        assert_eq!(nanos(Some("0001-01-01T00:00:00Z")), 0);
        assert_eq!(nanos(None), 0);
        assert_eq!(
            nanos(Some("2026-11-28T17:29:49.664092830Z")),
            1_795_886_989_664_092_830
        );
    }

    #[test]
    fn the_runtimes_labels_stay_out_of_the_cri_labels() {
        let labels: HashMap<String, String> = [
            (KIND.to_owned(), "sandbox".to_owned()),
            (ANNOTATIONS.to_owned(), r#"{"a":"b"}"#.to_owned()),
            ("app".to_owned(), "web".to_owned()),
        ]
        .into();
        assert_eq!(
            cri_labels(&labels),
            [("app".to_owned(), "web".to_owned())].into()
        );
        assert_eq!(
            annotations(&labels),
            [("a".to_owned(), "b".to_owned())].into()
        );
    }
}

//! Taking a finalizer off an object, the one way every controller here does it.

use serde_json::{Value, json};

/// The merge patch that takes `finalizer` off an object holding `finalizers`, guarded by
/// `resource_version` when given (a changed object then answers 409); `None` when the object
/// does not hold it.
pub fn removal(
    finalizers: &[String],
    finalizer: &str,
    resource_version: Option<&str>,
) -> Option<Value> {
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let keep: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
    Some(json!({"metadata": {"finalizers": keep, "resourceVersion": resource_version}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_finalizer_goes_and_only_if_held() {
        let held = ["a".to_owned(), "b".to_owned()];
        assert_eq!(
            removal(&held, "b", Some("7")),
            Some(json!({"metadata": {"finalizers": ["a"], "resourceVersion": "7"}}))
        );
        assert_eq!(
            removal(&held, "a", None),
            Some(json!({"metadata": {"finalizers": ["b"], "resourceVersion": null}}))
        );
        assert_eq!(removal(&held, "c", Some("7")), None);
    }
}

//! How a kind's lists merge (strategic merge patch, server-side apply): by a merge key, as a
//! set, or whole. Built-in kinds share upstream's `patchMergeKey` table below, and a kind's own
//! keys are its strategy's; a custom resource's come from its CRD's structural schema
//! (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`).

use super::kinds::Strategy;
use serde_json::Value;

/// Where a built-in list's apply keys differ from its merge key (every kind's; a kind's own are
/// its strategy's): ports are keyed by port and protocol (upstream's
/// `x-kubernetes-list-map-keys`), so a UDP and a TCP port 53 are two.
fn apply_keys(path: &[String]) -> Option<&'static [&'static str]> {
    let last = path.last().map(String::as_str)?;
    let parent = path.len().checked_sub(2).map(|i| path[i].as_str());
    match (parent, last) {
        (Some("containers" | "initContainers" | "ephemeralContainers"), "ports") => {
            Some(&["containerPort", "protocol"])
        }
        _ => None,
    }
}

/// The merge key of a list field of every kind, by the field path's last names (upstream
/// `patchMergeKey`; a kind's own are its strategy's).
fn merge_key(path: &[String]) -> Option<&'static str> {
    let last = path.last().map(String::as_str)?;
    let parent = path.len().checked_sub(2).map(|i| path[i].as_str());
    Some(match (parent, last) {
        (_, "containers" | "initContainers" | "ephemeralContainers") => "name",
        (Some("containers" | "initContainers" | "ephemeralContainers"), "ports") => "containerPort",
        (Some("containers" | "initContainers" | "ephemeralContainers"), "env") => "name",
        (Some("containers" | "initContainers" | "ephemeralContainers"), "volumeMounts") => {
            "mountPath"
        }
        (Some("containers" | "initContainers" | "ephemeralContainers"), "volumeDevices") => {
            "devicePath"
        }
        (Some("spec"), "volumes") => "name",
        (_, "conditions") => "type",
        (_, "imagePullSecrets") => "name",
        (Some("metadata"), "ownerReferences") => "uid",
        (_, "hostAliases") => "ip",
        (_, "topologySpreadConstraints") => "topologyKey",
        (_, "resourceClaims") => "name",
        (_, "podIPs" | "hostIPs") => "ip",
        _ => return None,
    })
}

/// How a list merges (upstream `x-kubernetes-list-type`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListType {
    /// Replaced as a whole.
    Atomic,
    /// Scalars merged as a set.
    Set,
    /// Objects identified by these key fields.
    Map(Vec<String>),
}

/// Where a kind's list types come from: the built-in merge-key table and the kind's strategy,
/// or a CRD's schema.
#[derive(Clone, Copy)]
pub enum Lists<'a> {
    /// A built-in kind, by its strategy.
    Builtin(&'a dyn Strategy),
    /// A built-in kind for server-side apply: its list-map keys, which for ports include the
    /// protocol (`x-kubernetes-list-map-keys`), where strategic merge uses the port alone.
    BuiltinApply(&'a dyn Strategy),
    /// A custom resource's structural schema.
    Schema(&'a Value),
}

impl<'a> Lists<'a> {
    /// These lists as server-side apply sees them.
    pub fn for_apply(self) -> Lists<'a> {
        match self {
            Lists::Builtin(kind) => Lists::BuiltinApply(kind),
            other => other,
        }
    }

    /// The list type of the field at a path of field names.
    pub fn of(&self, path: &[String]) -> ListType {
        if let Lists::BuiltinApply(kind) = self
            && let Some(keys) = kind.apply_keys(path).or_else(|| apply_keys(path))
        {
            return ListType::Map(keys.iter().map(|k| k.to_string()).collect());
        }
        // Metadata is the same for every kind (a CRD schema does not describe it).
        let own = match self {
            Lists::Schema(schema) if path.first().map(String::as_str) != Some("metadata") => {
                return schema_list_type(schema, path);
            }
            Lists::Schema(_) => None,
            Lists::Builtin(kind) | Lists::BuiltinApply(kind) => kind.merge_key(path),
        };
        if let Some(key) = own.or_else(|| merge_key(path)) {
            return ListType::Map(vec![key.to_owned()]);
        }
        if matches!(path.last().map(String::as_str), Some("finalizers")) && path.len() == 2 {
            return ListType::Set;
        }
        ListType::Atomic
    }
}

/// The list type a structural schema declares for the field at `path` (atomic when unset).
fn schema_list_type(schema: &Value, path: &[String]) -> ListType {
    let mut cur = schema;
    for name in path {
        if cur.get("type").and_then(Value::as_str) == Some("array") {
            let Some(items) = cur.get("items") else {
                return ListType::Atomic;
            };
            cur = items;
        }
        let next = cur
            .get("properties")
            .and_then(|p| p.get(name))
            .or_else(|| cur.get("additionalProperties").filter(|a| a.is_object()));
        let Some(next) = next else {
            return ListType::Atomic;
        };
        cur = next;
    }
    match cur.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => ListType::Set,
        Some("map") => ListType::Map(
            cur.get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|keys| {
                    keys.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
        ),
        _ => ListType::Atomic,
    }
}

//! ConfigMaps, Secrets and ServiceAccounts (upstream's `pkg/registry/core/{configmap,secret,
//! serviceaccount}`): data keys, `immutable`, a Secret's type and write-only `stringData`.

use super::{Row, Strategy, len, s};
use crate::error::Cause;
use crate::registry::ResourceInfo;
use crate::registry::defaults::{set_default, string_data};
use crate::registry::validation::specs::data_keys;
use serde_json::{Value, json};

/// `core/v1` ConfigMap.
pub struct ConfigMap;

impl Strategy for ConfigMap {
    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        for field in ["data", "binaryData"] {
            data_keys(obj.get(field), field, causes);
        }
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        immutable_data(new, old, causes);
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Data", "integer", 0, || {
            len(o, "/data") + len(o, "/binaryData")
        });
        row.age(o);
    }
}

/// `core/v1` Secret.
pub struct Secret;

impl Strategy for Secret {
    fn default(&self, obj: &mut Value) {
        set_default(obj, "type", json!("Opaque"));
        string_data(obj);
    }

    fn validate(&self, obj: &Value, causes: &mut Vec<Cause>) {
        data_keys(obj.get("data"), "data", causes);
    }

    fn validate_update(&self, new: &Value, old: &Value, causes: &mut Vec<Cause>) {
        // As upstream's checks in order: an immutable Secret reports its data first.
        if !immutable_data(new, old, causes) && new.get("type") != old.get("type") {
            causes.push(Cause::immutable("type"));
        }
    }

    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Type", "string", 0, || s(o, "/type"));
        row.col("Data", "integer", 0, || len(o, "/data"));
        row.age(o);
    }
}

/// With `immutable: true`, the data and the flag itself are fixed; whether that applies.
fn immutable_data(new: &Value, old: &Value, causes: &mut Vec<Cause>) -> bool {
    if old.get("immutable") != Some(&json!(true)) {
        return false;
    }
    for f in ["data", "binaryData", "stringData"] {
        if new.get(f) != old.get(f) {
            causes.push(Cause::forbidden(
                f,
                "field is immutable when `immutable` is set",
            ));
        }
    }
    if new.get("immutable") != Some(&json!(true)) {
        causes.push(Cause::forbidden(
            "immutable",
            "field is immutable when `immutable` is set",
        ));
    }
    true
}

/// `core/v1` ServiceAccount.
pub struct ServiceAccount;

impl Strategy for ServiceAccount {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Secrets", "integer", 0, || len(o, "/secrets"));
        row.age(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_string_data_is_merged_into_data_and_dropped() {
        let mut s =
            json!({"data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "two", "c": "three"}});
        Secret.default(&mut s);
        assert_eq!(
            s["data"],
            json!({"a": "eA==", "b": "dHdv", "c": "dGhyZWU="})
        );
        assert!(s.get("stringData").is_none());
        assert_eq!(s["type"], "Opaque");
    }
}

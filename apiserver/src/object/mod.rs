//! The one place that knows how an object is read from and written to storage, and small
//! helpers on JSON objects (metadata access, timestamps, field paths).

pub mod apply;
pub mod patch;

use crate::error::{ApiError, ApiResult};
use bytes::Bytes;
use minik8s_storage::{KeyValue, Store};
use serde_json::{Map, Value, json};

/// The current time as upstream writes timestamps (RFC 3339, seconds, UTC).
pub fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The current time with microseconds (`MicroTime`, used by managedFields-free kinds like Leases).
pub fn now_micro() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string()
}

/// `metadata` of an object, or `Null`.
pub fn meta(obj: &Value) -> &Value {
    obj.get("metadata").unwrap_or(&Value::Null)
}

/// `obj` as a `meta.k8s.io/v1` PartialObjectMetadata: what metadata-only clients (the
/// garbage collector's informers, Tables' `includeObject=Metadata`) are sent.
pub fn partial_metadata(obj: &Value) -> Value {
    serde_json::json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta(obj)})
}

/// [`partial_metadata`] of an object's JSON, copying its `metadata` bytes without decoding
/// them; `None` if the JSON is not an object with metadata.
pub fn partial_metadata_raw(json: &[u8]) -> Option<Vec<u8>> {
    #[derive(serde::Deserialize)]
    struct Metadata<'a> {
        #[serde(borrow)]
        metadata: &'a serde_json::value::RawValue,
    }
    let m: Metadata = serde_json::from_slice(json).ok()?;
    // (serde's derived structs also accept an array: `[{…}]` is no object.)
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{')
        || !m.metadata.get().starts_with('{')
    {
        return None;
    }
    let head = br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#;
    let mut out = Vec::with_capacity(head.len() + m.metadata.get().len() + 1);
    out.extend_from_slice(head);
    out.extend_from_slice(m.metadata.get().as_bytes());
    out.push(b'}');
    Some(out)
}

/// A string field of `metadata`.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj).get(field).and_then(Value::as_str)
}

/// `metadata`, created if missing, as a mutable map.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Map::new());
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

/// Decodes a stored object and sets its `resourceVersion` from the key's revision.
pub fn from_store(kv: &KeyValue) -> ApiResult<Value> {
    let mut obj: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("decoding stored {}: {e}", kv.key)))?;
    meta_mut(&mut obj).insert(
        "resourceVersion".into(),
        Value::String(kv.mod_revision.to_string()),
    );
    Ok(obj)
}

/// Encodes an object for storage (without `resourceVersion`, which the store's revision gives).
pub fn to_store(obj: &mut Value) -> Bytes {
    let rv = meta_mut(obj).remove("resourceVersion");
    let bytes = serde_json::to_vec(obj).expect("a JSON value serializes");
    if let Some(rv) = rv {
        meta_mut(obj).insert("resourceVersion".into(), rv);
    }
    Bytes::from(bytes)
}

/// The text of a field for field selectors (`spec.nodeName`), as upstream's per-kind field
/// sets write it: booleans and counters are formatted from the Go value, so an unset
/// `spec.unschedulable` reads `"false"` and an unset `status.replicas` `"0"`; an Event's
/// `source` is its `source.component`; other missing fields are "".
pub fn field_text(obj: &Value, path: &str) -> String {
    let text = raw_field_text(
        obj,
        if path == "source" {
            "source.component"
        } else {
            path
        },
    );
    if !text.is_empty() {
        return text;
    }
    match path {
        "spec.unschedulable" | "spec.hostNetwork" => "false".into(),
        "status.replicas" | "status.successful" => "0".into(),
        // An event written through events.k8s.io has no source: upstream selects its
        // reporting controller instead.
        "source" => raw_field_text(obj, "reportingComponent"),
        _ => text,
    }
}

fn raw_field_text(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Decodes only the values at `paths` (dotted, e.g. `spec.nodeName`) of an object's JSON,
/// skipping the rest without allocating: enough for label and field selectors, at a fraction
/// of a whole decode. `None` if the JSON is invalid.
pub fn decode_paths(json: &[u8], paths: &[&str]) -> Option<Value> {
    let paths: Vec<Vec<&str>> = paths.iter().map(|p| p.split('.').collect()).collect();
    let refs: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
    let mut de = serde_json::Deserializer::from_slice(json);
    let value = serde::de::DeserializeSeed::deserialize(Keep(&refs), &mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// The part of a JSON value under some paths (each relative to this value).
struct Keep<'a>(&'a [&'a [&'a str]]);

impl<'de> serde::de::DeserializeSeed<'de> for Keep<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Keep<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let under: Vec<&[&str]> = self
                .0
                .iter()
                .filter(|p| p.first() == Some(&key.as_ref()))
                .map(|p| &p[1..])
                .collect();
            if under.is_empty() {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else if under.iter().any(|p| p.is_empty()) {
                out.insert(key.into_owned(), map.next_value::<Value>()?);
            } else {
                out.insert(key.into_owned(), map.next_value_seed(Keep(&under))?);
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        // Paths do not index arrays: an array on the way is skipped.
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// The strings of an array at a JSON pointer (empty if absent).
pub fn strings_at(obj: &Value, pointer: &str) -> Vec<String> {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Reads a value at a JSON pointer, or `Null`.
pub fn at<'a>(obj: &'a Value, pointer: &str) -> &'a Value {
    obj.pointer(pointer).unwrap_or(&Value::Null)
}

/// Sets a value at a JSON pointer, creating objects on the way.
pub fn set_at(obj: &mut Value, pointer: &str, value: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let map = cur.as_object_mut().expect("object");
        if i == parts.len() - 1 {
            map.insert(part.to_string(), value);
            return;
        }
        cur = map
            .entry(part.to_string())
            .or_insert(Value::Object(Map::new()));
    }
}

/// Decodes a request body as JSON or YAML by its content type.
pub fn decode_body(content_type: &str, body: &[u8]) -> ApiResult<Value> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    let value: Value = match ct {
        "application/yaml" | "application/apply-patch+yaml" | "text/yaml" => {
            serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
        }
        "application/vnd.kubernetes.protobuf" => crate::serving::proto::decode(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding protobuf: {e}")))?,
        ""
        | "*/*"
        | "application/json"
        | "application/json-patch+json"
        | "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+json" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?,
        _ => return Err(ApiError::unsupported_media_type(content_type)),
    };
    Ok(value)
}

/// The fields a JSON body names twice in one object, as upstream's strict decoder reports
/// them (`spec.replicas`, `spec.containers[0].name`); empty for a body that is not JSON.
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    struct Walk<'a> {
        path: String,
        out: &'a mut Vec<String>,
    }
    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let path = match self.path.is_empty() {
                    true => key.clone(),
                    false => format!("{}.{key}", self.path),
                };
                if !seen.insert(key) && !self.out.contains(&path) {
                    self.out.push(path.clone());
                }
                map.next_value_seed(Walk {
                    path,
                    out: self.out,
                })?;
            }
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut i = 0;
            while seq
                .next_element_seed(Walk {
                    path: format!("{}[{i}]", self.path),
                    out: self.out,
                })?
                .is_some()
            {
                i += 1;
            }
            Ok(())
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
    }
    let mut out = Vec::new();
    let mut d = serde_json::Deserializer::from_slice(body);
    let _ = Walk {
        path: String::new(),
        out: &mut out,
    }
    .deserialize(&mut d);
    out
}

/// The keys a YAML (or JSON) body names twice in one mapping, in the words of the strict YAML
/// decoder upstream's server-side apply runs over the patch: `line 9: key "foo" already set in
/// map`, the line being that of the second value (go-yaml's, 1-based). Empty for a body that
/// does not parse (its parse error is reported elsewhere).
pub fn yaml_duplicate_keys(body: &str) -> Vec<String> {
    use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
    use yaml_rust2::scanner::{Marker, TScalarStyle};

    struct Frame {
        /// A mapping (else a sequence) and, for a mapping, whether a key comes next.
        map: bool,
        expect_key: bool,
        seen: std::collections::HashSet<String>,
        /// Whether this node is a key of its parent, and where it started.
        is_key: bool,
        line: usize,
        /// A key already set, waiting for the end of its value.
        pending: Option<String>,
    }
    struct Walk {
        stack: Vec<Frame>,
        out: Vec<String>,
    }
    /// A key as go-yaml's `%#v` prints the value it resolves to.
    fn go_key(v: &str, style: TScalarStyle) -> String {
        if style == TScalarStyle::Plain {
            // go-yaml v2's resolution of plain scalars.
            const TRUE: [&str; 11] = [
                "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
            ];
            const FALSE: [&str; 11] = [
                "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
            ];
            if v.is_empty() || v == "~" || v == "null" || v == "Null" || v == "NULL" {
                return "<nil>".into();
            }
            if TRUE.contains(&v) {
                return "true".into();
            }
            if FALSE.contains(&v) {
                return "false".into();
            }
            let numeric = v
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
            if numeric && v.parse::<f64>().is_ok() && !v.starts_with('.') {
                return v.to_owned();
            }
        }
        serde_json::to_string(v).unwrap_or_default()
    }
    impl Walk {
        /// A node ended (a scalar, or a collection's end) that began on `line`.
        fn ended(&mut self, is_key: bool, key: Option<String>, line: usize) {
            let Some(parent) = self.stack.last_mut() else {
                return;
            };
            if !parent.map {
                return;
            }
            if is_key {
                parent.expect_key = false;
                if let Some(k) = key
                    && !parent.seen.insert(k.clone())
                {
                    parent.pending = Some(k);
                }
            } else {
                parent.expect_key = true;
                if let Some(k) = parent.pending.take() {
                    self.out
                        .push(format!("line {}: key {k} already set in map", line + 1));
                }
            }
        }
    }
    impl MarkedEventReceiver for Walk {
        fn on_event(&mut self, ev: Event, mark: Marker) {
            let is_key = self.stack.last().is_some_and(|f| f.map && f.expect_key);
            // yaml-rust2 counts lines from 1; go-yaml from 0 and prints line+1.
            let line = mark.line().saturating_sub(1);
            match ev {
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    self.stack.push(Frame {
                        map: matches!(ev, Event::MappingStart(..)),
                        expect_key: true,
                        seen: Default::default(),
                        is_key,
                        line,
                        pending: None,
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    if let Some(f) = self.stack.pop() {
                        self.ended(f.is_key, None, f.line);
                    }
                }
                Event::Scalar(v, style, ..) => {
                    let key = (is_key && v != "<<").then(|| go_key(&v, style));
                    self.ended(is_key, key, line);
                }
                Event::Alias(_) => self.ended(is_key, None, line),
                _ => {}
            }
        }
    }
    let mut walk = Walk {
        stack: Vec::new(),
        out: Vec::new(),
    };
    match Parser::new_from_str(body).load(&mut walk, false) {
        Ok(()) => walk.out,
        Err(_) => Vec::new(),
    }
}

pub use minik8s_types::names::random_suffix;

/// Creates `obj` at `key` (with a uid and creation time) unless an object is stored there.
pub(crate) async fn ensure(api: &crate::Api, key: &str, mut obj: Value) -> ApiResult<()> {
    if api.store.get(key).await?.is_some() {
        return Ok(());
    }
    let m = meta_mut(&mut obj);
    m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    m.insert("creationTimestamp".into(), json!(now()));
    match api.store.create(key, to_store(&mut obj)).await {
        Ok(_) | Err(minik8s_storage::Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Creates `obj` at `key`, or brings the stored copy's `fields` up to date.
pub(crate) async fn ensure_fields(
    api: &crate::Api,
    key: &str,
    mut obj: Value,
    fields: &[&str],
) -> ApiResult<()> {
    let Some(kv) = api.store.get(key).await? else {
        return ensure(api, key, obj).await;
    };
    let mut stored: Value =
        serde_json::from_slice(&kv.value).map_err(crate::error::ApiError::internal)?;
    if fields.iter().all(|f| stored.get(*f) == obj.get(*f)) {
        return Ok(());
    }
    for f in fields {
        stored[*f] = obj[*f].take();
    }
    match api
        .store
        .update(key, to_store(&mut stored), kv.mod_revision)
        .await
    {
        Ok(_) | Err(minik8s_storage::Error::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_duplicate_keys_read_as_go_yamls_strict_decoder() {
        // Each expectation is what sigs.k8s.io/yaml's UnmarshalStrict says of the same body.
        let cr = "\napiVersion: a/v1\nkind: K\nmetadata:\n  name: n\nspec:\n  unknown: uk1\n  foo: foo1\n  foo: foo2\n  ports:\n  - name: x\n";
        assert_eq!(
            yaml_duplicate_keys(cr),
            ["line 9: key \"foo\" already set in map"]
        );
        let json = "{\"a\": 1,\n \"a\": {\"b\": 1, \"b\": 2}, 1: x, 1: y, yes: 1, true: 2}";
        assert_eq!(
            yaml_duplicate_keys(json),
            [
                "line 2: key \"b\" already set in map",
                "line 2: key \"a\" already set in map",
                "line 2: key 1 already set in map",
                "line 2: key true already set in map"
            ]
        );
        let nested = "spec:\n  a: 1\nspec:\n  b: 2\n  b: 3\nlist:\n- k: 1\n  k: 2\n- k: 3\n";
        assert_eq!(
            yaml_duplicate_keys(nested),
            [
                "line 5: key \"b\" already set in map",
                "line 4: key \"spec\" already set in map",
                "line 8: key \"k\" already set in map"
            ]
        );
        assert_eq!(
            yaml_duplicate_keys("false: 1\nno: 2\ninf: 3\ninf: 4\n"),
            [
                "line 2: key false already set in map",
                "line 4: key \"inf\" already set in map"
            ]
        );
        assert!(yaml_duplicate_keys("a: 1\nb: [1, 1]\nc: {d: 1}\n").is_empty());
        assert!(yaml_duplicate_keys("a: [").is_empty());
    }

    #[test]
    fn duplicate_fields_are_found_with_their_paths() {
        let body = br#"{"spec": {"unknownField": "foo", "replicas": 2, "replicas": 3,
            "template": {"spec": {"containers": [{"name": "a", "name": "b"}]}}}}"#;
        assert_eq!(
            duplicate_fields(body),
            ["spec.replicas", "spec.template.spec.containers[0].name"]
        );
        assert!(duplicate_fields(br#"{"a": 1, "b": {"a": 2}}"#).is_empty());
        assert!(duplicate_fields(b"kind: x").is_empty());
    }

    #[test]
    fn bodies_decode_by_content_type_and_unknown_types_are_415() {
        assert_eq!(
            decode_body("application/json", br#"{"a":1}"#).unwrap(),
            json!({"a": 1})
        );
        assert_eq!(
            decode_body("application/yaml", b"a: 1\n").unwrap(),
            json!({"a": 1})
        );
        assert_eq!(decode_body("text/plain", b"x").unwrap_err().code, 415);
        assert_eq!(
            decode_body("application/json", b"{nope").unwrap_err().code,
            400
        );
    }

    #[test]
    fn store_round_trip_sets_the_resource_version_from_the_revision() {
        let mut obj =
            json!({"kind": "ConfigMap", "metadata": {"name": "a", "resourceVersion": "3"}});
        let bytes = to_store(&mut obj);
        assert!(!String::from_utf8_lossy(&bytes).contains("resourceVersion"));
        assert_eq!(obj["metadata"]["resourceVersion"], "3");
        let kv = KeyValue {
            key: "/k".into(),
            value: bytes,
            create_revision: 7,
            mod_revision: 9,
        };
        assert_eq!(from_store(&kv).unwrap()["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn field_text_reads_nested_values() {
        let obj = json!({"spec": {"nodeName": "n1", "hostNetwork": true}});
        assert_eq!(field_text(&obj, "spec.nodeName"), "n1");
        assert_eq!(field_text(&obj, "spec.hostNetwork"), "true");
        assert_eq!(field_text(&obj, "status.phase"), "");
        // Upstream's field sets format Go values: unset booleans and counters are not "".
        assert_eq!(field_text(&json!({}), "spec.unschedulable"), "false");
        assert_eq!(field_text(&json!({}), "spec.hostNetwork"), "false");
        assert_eq!(field_text(&json!({}), "status.replicas"), "0");
        let ev = json!({"source": {"component": "kubelet", "host": "n1"}});
        assert_eq!(field_text(&ev, "source"), "kubelet");
        let new_style = json!({"reportingComponent": "test-controller"});
        assert_eq!(field_text(&new_style, "source"), "test-controller");
    }

    #[test]
    fn set_at_creates_the_path() {
        let mut obj = json!({});
        set_at(&mut obj, "/spec/replicas", json!(3));
        assert_eq!(obj, json!({"spec": {"replicas": 3}}));
    }
}

/// The stored JSON of an object with `metadata.resourceVersion` set, without parsing it: the
/// top-level `metadata` object is found by a byte scan and the field is inserted at its start.
/// `None` if the bytes are not an object with a `metadata` object (callers then parse).
pub fn raw_with_rv(stored: &[u8], revision: i64) -> Option<Vec<u8>> {
    let at = top_level_value(stored, b"metadata")?;
    if stored.get(at) != Some(&b'{') {
        return None;
    }
    let rv = format!("\"resourceVersion\":\"{revision}\"");
    let mut out = Vec::with_capacity(stored.len() + rv.len() + 1);
    out.extend_from_slice(&stored[..=at]);
    out.extend_from_slice(rv.as_bytes());
    let rest = &stored[at + 1..];
    if rest.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'}') {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Some(out)
}

/// The offset of the value of a top-level key in a JSON object (skipping nested values).
fn top_level_value(json: &[u8], key: &[u8]) -> Option<usize> {
    let mut i = json.iter().position(|b| !b.is_ascii_whitespace())?;
    if json[i] != b'{' {
        return None;
    }
    i += 1;
    loop {
        i += json[i..].iter().position(|b| !b.is_ascii_whitespace())?;
        if json[i] == b'}' {
            return None;
        }
        if json[i] != b'"' {
            return None;
        }
        let key_start = i + 1;
        let key_end = skip_string(json, i)?;
        let this = &json[key_start..key_end - 1];
        i = key_end;
        i += json[i..].iter().position(|b| !b.is_ascii_whitespace())?;
        if json[i] != b':' {
            return None;
        }
        i += 1;
        i += json[i..].iter().position(|b| !b.is_ascii_whitespace())?;
        if this == key {
            return Some(i);
        }
        i = skip_value(json, i)?;
        i += json[i..].iter().position(|b| !b.is_ascii_whitespace())?;
        match json[i] {
            b',' => i += 1,
            _ => return None,
        }
    }
}

/// Returns the index just past the string starting at `i` (a `"`).
fn skip_string(json: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < json.len() {
        match json[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// Returns the index just past the value starting at `i`.
fn skip_value(json: &[u8], mut i: usize) -> Option<usize> {
    match json.get(i)? {
        b'"' => skip_string(json, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            while i < json.len() {
                match json[i] {
                    b'"' => {
                        i = skip_string(json, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let end = json[i..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())?;
            Some(i + end)
        }
    }
}

#[cfg(test)]
mod raw_tests {
    use super::*;

    #[test]
    fn the_resource_version_is_spliced_into_top_level_metadata_only() {
        let stored = br#"{"aaa":{"metadata":{"x":"}"}},"data":{"k":"\"metadata\":{"},"metadata":{"name":"a"}}"#;
        let out = raw_with_rv(stored, 42).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "42");
        assert_eq!(v["metadata"]["name"], "a");
        assert!(v["aaa"]["metadata"].get("resourceVersion").is_none());
        let empty = raw_with_rv(br#"{"metadata": {} }"#, 7).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&empty).unwrap()["metadata"]["resourceVersion"],
            "7"
        );
        assert!(raw_with_rv(b"[1]", 1).is_none());
        let partial = partial_metadata_raw(&out).unwrap();
        let v2: Value = serde_json::from_slice(&partial).unwrap();
        assert_eq!(v2, partial_metadata(&v));
        assert_eq!(v2["kind"], "PartialObjectMetadata");
        assert_eq!(v2["metadata"]["resourceVersion"], "42");
        assert!(partial_metadata_raw(b"[1]").is_none());
        assert!(raw_with_rv(br#"{"kind":"X"}"#, 1).is_none());
    }

    #[test]
    fn decode_paths_keeps_only_what_selectors_read() {
        let json = br#"{"kind":"Pod","metadata":{"name":"p","namespace":"d","labels":{"a":"b"},"annotations":{"x":"y"},"managedFields":[{"f":1}]},
            "spec":{"nodeName":"n1","containers":[{"name":"c"}],"n":{"deep":true}},"status":{"phase":"Running","x":[1,2]}}"#;
        let v = decode_paths(
            json,
            &[
                "metadata.name",
                "metadata.namespace",
                "metadata.labels",
                "spec.nodeName",
                "status.phase",
                "spec.missing",
                "spec.containers.name",
            ],
        )
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"metadata": {"name": "p", "namespace": "d", "labels": {"a": "b"}},
                "spec": {"nodeName": "n1", "containers": null}, "status": {"phase": "Running"}})
        );
        assert_eq!(field_text(&v, "spec.nodeName"), "n1");
        assert_eq!(field_text(&v, "spec.missing"), "");
        assert!(decode_paths(b"{\"a\":", &["a"]).is_none());
        assert!(decode_paths(b"{} x", &["a"]).is_none());
    }
}

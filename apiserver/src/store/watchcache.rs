//! Watch events decoded once for every watcher: the apiserver's watches of one resource all
//! see the same store events, and each used to decode (and encode) every object on its own.
//! Keyed by the served version, the key and the revision, an event's object is kept for the
//! last few hundred events (watchers read an event at about the same time). Its JSON is made
//! from the stored bytes without decoding the object where the stored version is the served
//! one; the decoded object is made only for watchers that need it (selectors, Tables).

use crate::error::{ApiError, ApiResult};
use crate::registry::ResourceInfo;
use bytes::Bytes;
use minik8s_storage::KeyValue;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

/// How many events' objects are kept.
const CAPACITY: usize = 256;

/// An event's object as watchers see it, decoded and encoded on first use.
#[derive(Debug)]
pub struct Decoded {
    kv: KeyValue,
    shown_at: i64,
    value: OnceLock<Result<Value, String>>,
    json: OnceLock<Bytes>,
    metadata: OnceLock<Bytes>,
    selectable: OnceLock<Option<Value>>,
}

impl Decoded {
    /// The object (in the served version, `resourceVersion` set), decoded once.
    ///
    /// Decoding may call a CRD's conversion webhook, which blocks its thread while the
    /// runtime serves the call: it runs outside the cell, so that watchers of the same event
    /// never wait on each other's conversion (with every runtime thread waiting, the webhook
    /// call could not be served and the server stalled). Two may decode the same object at
    /// once; the first answer is kept.
    pub fn value(&self, res: &ResourceInfo) -> ApiResult<&Value> {
        if self.value.get().is_none() {
            let decoded = res
                .read(&self.kv)
                .map_err(|e| e.to_string())
                .map(|mut value| {
                    if self.shown_at != self.kv.mod_revision {
                        crate::object::meta_mut(&mut value).insert(
                            "resourceVersion".into(),
                            Value::String(self.shown_at.to_string()),
                        );
                    }
                    value
                });
            let _ = self.value.set(decoded);
        }
        match self.value.get() {
            Some(Ok(value)) => Ok(value),
            Some(Err(e)) => Err(ApiError::internal(e.clone())),
            None => Err(ApiError::internal("the object could not be decoded")),
        }
    }

    /// The object's JSON, encoded once (spliced from the stored bytes when it can be).
    pub fn json(&self, res: &ResourceInfo) -> ApiResult<Bytes> {
        if let Some(json) = self.json.get() {
            return Ok(json.clone());
        }
        let json = match res
            .stored_as_served()
            .then(|| crate::object::raw_with_rv(&self.kv.value, self.shown_at))
            .flatten()
        {
            Some(spliced) => Bytes::from(spliced),
            None => Bytes::from(serde_json::to_vec(self.value(res)?).expect("json")),
        };
        Ok(self.json.get_or_init(|| json).clone())
    }

    /// What label and field selectors read of the object: its name, namespace, labels and
    /// the kind's selectable fields, decoded once without the rest where the stored version
    /// is the served one (else the whole object).
    pub fn selectable(&self, res: &ResourceInfo) -> ApiResult<&Value> {
        if let Some(Ok(value)) = self.value.get() {
            return Ok(value);
        }
        let partial = self.selectable.get_or_init(|| res.selectable(&self.kv));
        match partial {
            Some(value) => Ok(value),
            None => self.value(res),
        }
    }

    /// The object as a PartialObjectMetadata's JSON, made once from [`Decoded::json`].
    pub fn metadata_json(&self, res: &ResourceInfo) -> ApiResult<Bytes> {
        if let Some(json) = self.metadata.get() {
            return Ok(json.clone());
        }
        let partial = match crate::object::partial_metadata_raw(&self.json(res)?) {
            Some(raw) => raw,
            None => serde_json::to_vec(&crate::object::partial_metadata(self.value(res)?))
                .expect("json"),
        };
        Ok(self.metadata.get_or_init(|| Bytes::from(partial)).clone())
    }
}

/// (served apiVersion, key, revision of the object, revision it is shown at).
type Key = (String, String, i64, i64);

/// The kept objects and their keys, oldest first.
type Entries = (HashMap<Key, Arc<Decoded>>, VecDeque<Key>);

/// The shared cache of watch events' objects.
#[derive(Default)]
pub struct WatchCache {
    inner: Mutex<Entries>,
}

impl WatchCache {
    /// `kv` as `res` serves it, with `resourceVersion` `shown_at` (its own revision, or a
    /// delete's).
    pub fn object(&self, res: &ResourceInfo, kv: &KeyValue, shown_at: i64) -> Arc<Decoded> {
        let key: Key = (res.api_version(), kv.key.clone(), kv.mod_revision, shown_at);
        let mut guard = self.inner.lock().expect("watch cache");
        let (map, order) = &mut *guard;
        if let Some(hit) = map.get(&key) {
            return hit.clone();
        }
        let decoded = Arc::new(Decoded {
            kv: kv.clone(),
            shown_at,
            value: OnceLock::new(),
            json: OnceLock::new(),
            metadata: OnceLock::new(),
            selectable: OnceLock::new(),
        });
        map.insert(key.clone(), decoded.clone());
        order.push_back(key);
        while order.len() > CAPACITY {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        decoded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_object_is_shared_and_shows_the_revision_asked_for() {
        let res = crate::registry::Registry::with_builtins()
            .lookup("", "v1", "pods")
            .unwrap();
        let mut obj = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "d", "labels": {"metadata": "x\"y"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        });
        let kv = KeyValue {
            key: "/registry/pods/d/p".into(),
            value: crate::object::to_store(&mut obj),
            create_revision: 3,
            mod_revision: 7,
        };
        let cache = WatchCache::default();
        let a = cache.object(&res, &kv, 7);
        assert!(Arc::ptr_eq(&a, &cache.object(&res, &kv, 7)));
        let json: Value = serde_json::from_slice(&a.json(&res).unwrap()).unwrap();
        assert_eq!(&json, a.value(&res).unwrap());
        assert_eq!(json["metadata"]["resourceVersion"], "7");
        // A delete shows the object at the delete's revision.
        let deleted = cache.object(&res, &kv, 9);
        assert_eq!(
            deleted.value(&res).unwrap()["metadata"]["resourceVersion"],
            "9"
        );
        let json: Value = serde_json::from_slice(&deleted.json(&res).unwrap()).unwrap();
        assert_eq!(json["metadata"]["resourceVersion"], "9");
    }
}

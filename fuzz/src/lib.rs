//! Fuzz targets: each takes arbitrary bytes through one of the paths that decode untrusted
//! input, the way the server or the edge takes them. A target may return early on input that
//! is refused (that is the point: a refusal, not a panic); it panics only when a property
//! the code promises is broken. `cargo fuzz run <target>` (see `hack/fuzz.sh`) drives them
//! with coverage; `tests/corpus.rs` replays each target's corpus and every regression.

use minik8s_apiserver::auth::User;
use minik8s_apiserver::context::{Params, decode_continue};
use minik8s_apiserver::object::{self, apply, patch};
use minik8s_apiserver::registry::{Registry, ResourceInfo, kinds, rules};
use minik8s_types::{FieldSelector, LabelSelector};
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};

/// A fuzz target: arbitrary bytes in, a panic only when a promise is broken.
pub type Target = fn(&[u8]);

/// Every target by name: the fuzz binary runs the one `MINIK8S_FUZZ_TARGET` names, and the
/// tests replay and briefly fuzz each.
pub const TARGETS: [(&str, Target); 7] = [
    ("bodies", bodies),
    ("patches", patches),
    ("queries", queries),
    ("cel", cel),
    ("store_recovery", store_recovery),
    ("edge_messages", edge_messages),
    ("edge_store", edge_store),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The built-in kinds, once.
fn kinds() -> &'static [Arc<ResourceInfo>] {
    static KINDS: OnceLock<Vec<Arc<ResourceInfo>>> = OnceLock::new();
    KINDS.get_or_init(|| Registry::with_builtins().all())
}

/// The first byte picks, the rest is the input.
fn pick(data: &[u8]) -> Option<(u8, &[u8])> {
    data.split_first().map(|(b, rest)| (*b, rest))
}

/// A request body of a built-in kind (the first byte picks the kind, the second JSON, YAML
/// or protobuf) through the create path's steps: decode, the duplicate-field and typed decode
/// checks, defaults, preparation, validation (of a create and of an update to itself), the
/// stored encoding and the table row.
pub fn bodies(data: &[u8]) {
    let Some((k, rest)) = pick(data) else { return };
    let Some((ct, body)) = pick(rest) else { return };
    let res = &kinds()[usize::from(k) % kinds().len()];
    let content_type = [
        "application/json",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
    ][usize::from(ct) % 3];
    let _ = object::duplicate_fields(body);
    if let Ok(text) = std::str::from_utf8(body) {
        let _ = object::yaml_duplicate_keys(text);
    }
    let Ok(mut obj) = object::decode_body(content_type, body) else {
        return;
    };
    if !obj.is_object() {
        return;
    }
    if let Some(decode) = res.decode
        && let Ok(typed) = decode(&obj)
    {
        obj = typed;
    }
    res.strategy.default(&mut obj);
    let user = User::new("fuzz", vec![]);
    res.strategy.prepare_for_create(&mut obj, &user);
    res.strategy.initial_status(&mut obj);
    let mut causes = minik8s_apiserver::registry::validation::validate_meta(res, &obj);
    res.strategy.validate(&obj, &mut causes);
    res.strategy.validate_update(&obj, &obj, &mut causes);
    let _ = res.encode(&mut obj.clone());
    let mut row = kinds::Row::cells();
    res.strategy.table(res, &obj, &mut row);
    let _ = row.finish();
}

/// An object and a patch (split at the first NUL byte) through JSON patch, merge patch,
/// strategic merge patch and server-side apply's merge, with a Pod's list rules.
pub fn patches(data: &[u8]) {
    let at = data.iter().position(|b| *b == 0).unwrap_or(data.len());
    let (Ok(target), Ok(given)) = (
        serde_json::from_slice::<Value>(&data[..at]),
        serde_json::from_slice::<Value>(data.get(at + 1..).unwrap_or_default()),
    ) else {
        return;
    };
    let pods = kinds()
        .iter()
        .find(|r| r.group.is_empty() && r.plural == "pods")
        .expect("pods are built in");
    let mut t = target.clone();
    let _ = patch::json_patch(&mut t, &given);
    let mut t = target.clone();
    patch::merge_patch(&mut t, &given);
    let mut t = target.clone();
    let _ = patch::strategic_merge(pods.lists(), &mut t, &given);
    if target.is_object() && given.is_object() {
        let lists = pods.lists().for_apply();
        let merged = apply::apply(lists, &target, &given, "fuzz", "v1", None, true, |t, p| {
            let _ = patch::strategic_merge(pods.lists(), t, p);
        });
        if let Ok(merged) = merged {
            // What apply records must read back.
            let _ = apply::entries(&merged);
        }
        let _ = apply::fields_of(lists, &given);
    }
}

/// A query string and selectors: the same text as a label selector, a field selector, a whole
/// query string and a continue token. A selector that parses must parse again from its text.
pub fn queries(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sel) = LabelSelector::parse(text) {
        let labels = json!({"app": "web", "tier": "a"});
        let _ = sel.matches_json(Some(&labels));
        let again = sel.to_string();
        assert!(
            LabelSelector::parse(&again).is_ok(),
            "{text:?} parsed, but its text {again:?} does not"
        );
    }
    if let Ok(sel) = FieldSelector::parse(text) {
        let _ = sel.matches(|f| f.to_owned());
    }
    let _ = Params::parse(Some(text));
    let _ = decode_continue(text);
}

/// A CRD validation rule: compiled, then evaluated against an object (a refusal or an error,
/// never a panic).
pub fn cel(data: &[u8]) {
    let Ok(rule) = std::str::from_utf8(data) else {
        return;
    };
    if rules::compile(rule).is_err() {
        return;
    }
    let object = json!({"spec": {"replicas": 3, "name": "web", "tags": ["a", "b"],
        "limits": {"cpu": "1"}, "ratio": 0.5, "on": true}});
    let _ = rules::check(rule, &object);
}

/// The embedded store opened on a folder holding arbitrary bytes: the first byte picks the
/// write-ahead log as given, the log with one well-framed record around the bytes (so the
/// record's decoder sees them past the checksum), or the B-tree file as given. It must open
/// (cutting a torn tail) or refuse; whatever it then serves must read back.
pub fn store_recovery(data: &[u8]) {
    let Some((mode, bytes)) = pick(data) else {
        return;
    };
    let Ok(dir) = tempfile::tempdir() else { return };
    let (file, content) = match mode % 3 {
        0 => ("store.wal", bytes.to_vec()),
        1 => {
            let mut framed = Vec::with_capacity(bytes.len() + 8);
            framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            framed.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
            framed.extend_from_slice(bytes);
            ("store.wal", framed)
        }
        _ => ("store.redb", bytes.to_vec()),
    };
    if std::fs::write(dir.path().join(file), content).is_err() {
        return;
    }
    runtime().block_on(async {
        use minik8s_storage::{RangeRequest, Store, embedded::Embedded};
        let Ok(store) = Embedded::open(dir.path()) else {
            return;
        };
        if let Ok(all) = store.range(RangeRequest::prefix("")).await {
            for kv in all.kvs {
                let got = store.get(&kv.key).await;
                assert!(
                    matches!(&got, Ok(Some(again)) if again.value == kv.value),
                    "{} listed but read back as {got:?}",
                    kv.key
                );
            }
        }
        let _ = store.current_revision().await;
    });
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// An edge protocol message (the first byte picks which) as the edgelet or the cloud decodes
/// it, with the JSON objects it carries decoded as they are there.
pub fn edge_messages(data: &[u8]) {
    use k8s_openapi::api::core::v1::{Event, Pod};
    use minik8s_edge::proto;
    use prost::Message;
    let Some((which, bytes)) = pick(data) else {
        return;
    };
    let pod = |b: &[u8]| {
        let _ = serde_json::from_slice::<Pod>(b);
    };
    let event = |b: &[u8]| {
        let _ = serde_json::from_slice::<Event>(b);
    };
    match which % 10 {
        0 => {
            if let Ok(m) = proto::PodRequest::decode(bytes) {
                pod(&m.pod);
            }
        }
        1 => {
            if let Ok(m) = proto::PodsReply::decode(bytes) {
                m.pods.iter().for_each(|p| pod(p));
            }
        }
        2 => {
            if let Ok(m) = proto::HeartbeatReply::decode(bytes) {
                m.pods.iter().for_each(|c| pod(&c.pod));
                m.events.iter().for_each(|e| event(e));
            }
        }
        3 => {
            if let Ok(m) = proto::Change::decode(bytes) {
                match m.what {
                    Some(proto::change::What::Pod(c)) => pod(&c.pod),
                    Some(proto::change::What::Event(e)) => event(&e),
                    _ => {}
                }
            }
        }
        4 => {
            let _ = proto::StreamFrame::decode(bytes);
        }
        5 => {
            let _ = proto::NodeStatusReply::decode(bytes);
        }
        6 => {
            let _ = proto::JoinRequest::decode(bytes);
        }
        7 => {
            let _ = proto::RegisterRequest::decode(bytes);
        }
        8 => {
            let _ = proto::DeletePodRequest::decode(bytes);
        }
        _ => {
            let _ = proto::HeartbeatRequest::decode(bytes);
        }
    }
}

/// The cloud's messages as the edgelet applies them to its crash-safe store, then the store
/// reopened as after a crash, and the registry's reading of the node status the edge reports.
/// The input is a list of changes, each a byte that picks it, a length byte and that many
/// bytes: pods created, updated and deleted (JSON as the cloud sends them), shipped objects
/// put and removed, node statuses (protobuf), events and status patches. Every pod the store
/// holds must be there as it was after the reopen, and nothing may be written outside the
/// store's folder.
pub fn edge_store(data: &[u8]) {
    use k8s_openapi::api::core::v1::Pod;
    use minik8s_edge::store::{KINDS, Store};
    use prost::Message;
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let dir = tmp.path().join("edge").join("store");
    let store = Store::open(&dir).expect("an empty store opens");
    let mut rest = data;
    let mut seq = 0u64;
    while let Some((which, r)) = pick(rest) {
        let Some((len, r)) = pick(r) else { break };
        let (bytes, r) = r.split_at(usize::from(len).min(r.len()));
        rest = r;
        seq += 1;
        let text = String::from_utf8_lossy(bytes);
        // Three names from one text: `kind/namespace/name`.
        let mut parts = text.splitn(3, '/');
        let (a, b, c) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        let kind = KINDS[usize::from(which >> 4) % KINDS.len()];
        match which % 8 {
            0 | 1 => {
                if let Ok(pod) = serde_json::from_slice::<Pod>(bytes) {
                    let _ = store.put_pod(pod, seq, which % 8 == 0);
                }
            }
            2 => {
                let _ = store.delete_pod(&text, i64::from(len % 4));
            }
            3 => {
                // An object with its data after the first newline.
                let (key, object) = text.split_once('\n').unwrap_or((&text, "{}"));
                let mut parts = key.splitn(2, '/');
                let (ns, name) = (
                    parts.next().unwrap_or_default(),
                    parts.next().unwrap_or_default(),
                );
                if let Ok(object) = serde_json::from_str(object) {
                    let _ = store.put_volume(kind, ns, name, object, seq);
                }
            }
            4 => {
                let _ = store.remove_volume(a, b, c);
            }
            5 => {
                if let Ok(status) = minik8s_edge::proto::NodeStatusReply::decode(bytes) {
                    let _ = minik8s_edge::cloud::node_status(&status);
                    store.set_node(status);
                }
            }
            6 => {
                if let Ok(event) = serde_json::from_slice(bytes) {
                    store.push_event(event);
                }
            }
            _ => {
                let (key, status) = text.split_once('\n').unwrap_or((&text, "{}"));
                let mut parts = key.splitn(2, '/');
                let (ns, name) = (
                    parts.next().unwrap_or_default(),
                    parts.next().unwrap_or_default(),
                );
                if let Ok(status) = serde_json::from_str(status) {
                    let _ = store.patch_status(ns, name, None, &status);
                }
            }
        }
        let _ = store.changes_since(seq / 2);
        let _ = store.objects(kind, Some(b));
    }
    let sorted = |pods: Vec<Pod>| {
        let mut v: Vec<Value> = pods
            .iter()
            .map(|p| serde_json::to_value(p).expect("a pod serializes"))
            .collect();
        v.sort_by_key(|p| p["metadata"]["uid"].to_string());
        v
    };
    let before = sorted(store.pods());
    drop(store);
    let outside: Vec<_> = std::fs::read_dir(tmp.path().join("edge"))
        .expect("the folder")
        .chain(std::fs::read_dir(tmp.path()).expect("the folder"))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n != "store" && n != "edge")
        .collect();
    assert!(outside.is_empty(), "written outside the store: {outside:?}");
    let reopened = Store::open(&dir).expect("the store reopens");
    assert_eq!(
        sorted(reopened.pods()),
        before,
        "the pods after the reopen differ"
    );
}

//! Field ownership (`metadata.managedFields`) and server-side apply: each manager owns a set
//! of fields; an Update takes the fields it changes, an Apply owns exactly what it applied,
//! conflicts with other owners of a field it sets to another value (unless forced), and
//! drops fields it applied before and no longer does (if nobody else owns them).

use crate::object::patch::element_id;
use crate::registry::lists::{ListType, Lists};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// One field path: `f:spec`, `k:{"name":"c"}`, `f:image`.
pub type Path = Vec<String>;

/// A set of owned field paths.
pub type FieldSet = BTreeSet<Path>;

/// The leaf fields an object sets.
pub fn fields_of(lists: Lists, obj: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    for (mut path, mut names, v) in sections(obj) {
        walk(lists, v, &mut path, &mut names, &mut out);
    }
    out
}

/// The parts of an object whose fields are owned, each with its field path and names: every
/// top-level field but `apiVersion` and `kind`, and of `metadata` only labels, annotations,
/// finalizers and ownerReferences.
fn sections(obj: &Value) -> Vec<(Path, Vec<String>, &Value)> {
    let mut out = Vec::new();
    let Some(m) = obj.as_object() else {
        return out;
    };
    for (k, v) in m {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for key in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(x) = v.get(key) {
                        out.push((
                            vec!["f:metadata".into(), format!("f:{key}")],
                            vec!["metadata".into(), key.into()],
                            x,
                        ));
                    }
                }
            }
            _ => out.push((vec![format!("f:{k}")], vec![k.clone()], v)),
        }
    }
    out
}

fn walk(lists: Lists, v: &Value, path: &mut Path, names: &mut Vec<String>, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(format!("f:{k}"));
                names.push(k.clone());
                walk(lists, child, path, names, out);
                names.pop();
                path.pop();
            }
        }
        // An empty keyed list or set owns no elements (an empty atomic list is a leaf).
        Value::Array(items) => match lists.of(names) {
            ListType::Map(keys) if !keys.is_empty() => {
                for item in items {
                    if keys.iter().all(|k| item.get(k).is_none()) {
                        continue;
                    }
                    path.push(format!("k:{}", Value::Object(element_id(item, &keys))));
                    let mut dot = path.clone();
                    dot.push(".".into());
                    out.insert(dot);
                    // The element's fields, as for any object (an empty one owns only its `.`).
                    if item.as_object().is_some_and(|m| !m.is_empty()) {
                        walk(lists, item, path, names, out);
                    }
                    path.pop();
                }
            }
            ListType::Set => {
                for item in items {
                    path.push(format!("v:{item}"));
                    out.insert(path.clone());
                    path.pop();
                }
            }
            ListType::Atomic | ListType::Map(_) => {
                out.insert(path.clone());
            }
        },
        _ => {
            out.insert(path.clone());
        }
    }
}

/// How one path segment selects a child: a field, a keyed element or a set value.
enum Segment {
    Field(String),
    Keyed(Map<String, Value>),
    Value(Value),
}

impl Segment {
    fn parse(seg: &str) -> Option<Segment> {
        if let Some(k) = seg.strip_prefix("f:") {
            Some(Segment::Field(k.to_owned()))
        } else if let Some(id) = seg.strip_prefix("k:") {
            serde_json::from_str(id).ok().map(Segment::Keyed)
        } else if let Some(v) = seg.strip_prefix("v:") {
            serde_json::from_str(v).ok().map(Segment::Value)
        } else {
            None
        }
    }

    /// Whether a list element is the one this segment names.
    fn selects(&self, e: &Value) -> bool {
        match self {
            // The element's identity as its key fields default (a port without a protocol
            // is the TCP one), so an applied element matches the stored, defaulted one.
            Segment::Keyed(id) => {
                let keys: Vec<String> = id.keys().cloned().collect();
                element_id(e, &keys) == *id
            }
            Segment::Value(v) => e == v,
            Segment::Field(_) => false,
        }
    }
}

/// The value at a field path, if present.
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path {
        if seg == "." {
            return Some(cur);
        }
        cur = match Segment::parse(seg)? {
            Segment::Field(k) => cur.get(&k)?,
            s => cur.as_array()?.iter().find(|e| s.selects(e))?,
        };
    }
    Some(cur)
}

/// Removes the field at a path (a keyed element when the path ends in `.`, a set value).
fn remove_at(obj: &mut Value, path: &[String]) {
    let path = path.strip_suffix(&[".".to_owned()]).unwrap_or(path);
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    match (Segment::parse(last), value_mut(obj, parent)) {
        (Some(Segment::Field(k)), Some(Value::Object(m))) => {
            m.remove(&k);
        }
        (Some(s), Some(Value::Array(list))) => list.retain(|e| !s.selects(e)),
        _ => {}
    }
}

fn value_mut<'a>(obj: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = obj;
    for seg in path {
        cur = match Segment::parse(seg)? {
            Segment::Field(k) => cur.get_mut(&k)?,
            s => cur.as_array_mut()?.iter_mut().find(|e| s.selects(e))?,
        };
    }
    Some(cur)
}

/// FieldsV1 JSON of a field set.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            cur = cur
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("object");
        }
    }
    Value::Object(root)
}

/// A field set from FieldsV1 JSON.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn rec(v: &Value, path: &mut Path, out: &mut FieldSet) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(k.clone());
                    rec(child, path, out);
                    path.pop();
                }
            }
            _ => {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
            }
        }
    }
    let mut out = FieldSet::new();
    rec(v, &mut Vec::new(), &mut out);
    out
}

/// How kubectl and upstream print a field path: `.spec.containers[name="c"].image`.
pub fn display(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        if let Some(k) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(k);
        } else if let Some(id) = seg.strip_prefix("k:")
            && let Ok(m) = serde_json::from_str::<Map<String, Value>>(id)
        {
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = seg.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

/// One `managedFields` entry.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// apiVersion the fields refer to.
    pub api_version: String,
    /// Subresource, if any.
    pub subresource: Option<String>,
    /// Owned fields.
    pub fields: FieldSet,
    /// When.
    pub time: String,
}

/// Reads `metadata.managedFields`.
pub fn entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e
                        .get("manager")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .into(),
                    operation: e
                        .get("operation")
                        .and_then(Value::as_str)
                        .unwrap_or("Update")
                        .into(),
                    api_version: e
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .into(),
                    subresource: e
                        .get("subresource")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
                    time: e.get("time").and_then(Value::as_str).unwrap_or("").into(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `metadata.managedFields` (entries that own nothing are dropped).
pub fn set_entries(obj: &mut Value, list: &[Entry]) {
    let v: Vec<Value> = list
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut x = json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields)});
            if let Some(s) = &e.subresource {
                x["subresource"] = json!(s);
            }
            x
        })
        .collect();
    crate::object::meta_mut(obj).insert("managedFields".into(), Value::Array(v));
}

/// Field paths whose value differs between two objects (present in `new`), those removed, and
/// all of `new`'s.
fn changed(lists: Lists, old: Option<&Value>, new: &Value) -> (FieldSet, FieldSet, FieldSet) {
    let new_set = fields_of(lists, new);
    let Some(old) = old else {
        return (new_set.clone(), FieldSet::new(), new_set);
    };
    // A section equal in both objects has no changed and no removed fields: only the others
    // are compared field by field (a status write leaves the spec alone, and so on).
    let new_sections = sections(new);
    let old_sections = sections(old);
    let same: Vec<&Path> = new_sections
        .iter()
        .filter(|(p, _, v)| old_sections.iter().any(|(op, _, ov)| op == p && ov == v))
        .map(|(p, _, _)| p)
        .collect();
    let in_same = |f: &Path| same.iter().any(|p| f.starts_with(p));
    let changed = new_set
        .iter()
        .filter(|p| !in_same(p) && value_at(old, p) != value_at(new, p))
        .cloned()
        .collect();
    let mut old_set = FieldSet::new();
    for (mut path, mut names, v) in old_sections {
        if !same.contains(&&path) {
            walk(lists, v, &mut path, &mut names, &mut old_set);
        }
    }
    let removed = old_set.difference(&new_set).cloned().collect();
    (changed, removed, new_set)
}

/// Records an Update by `manager`: it takes the fields it changed from everyone else.
pub fn record_update(
    lists: Lists,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
) {
    let mut list = old.map(entries).unwrap_or_default();
    let (taken, removed, present) = changed(lists, old, new);
    for e in &mut list {
        e.fields
            .retain(|p| !taken.contains(p) && !removed.contains(p) && present.contains(p));
    }
    let mine = list.iter().position(|e| {
        e.manager == manager && e.operation == "Update" && e.subresource.as_deref() == subresource
    });
    let idx = match mine {
        Some(i) => i,
        None => {
            list.push(Entry {
                manager: manager.into(),
                operation: "Update".into(),
                api_version: api_version.into(),
                subresource: subresource.map(str::to_owned),
                fields: FieldSet::new(),
                time: String::new(),
            });
            list.len() - 1
        }
    };
    if !taken.is_empty() {
        list[idx].time = crate::object::now();
    }
    list[idx].fields.extend(taken);
    set_entries(new, &list);
}

/// A field owned by another manager that an Apply would set to another value.
#[derive(Debug, Clone)]
pub struct Conflict {
    /// The other manager.
    pub manager: String,
    /// The field.
    pub path: Path,
}

/// Applies `applied` (by `manager`) to `current`: the merged object and its new managed
/// fields, or the conflicts when not forced.
#[allow(clippy::too_many_arguments)]
pub fn apply(
    lists: Lists,
    current: &Value,
    applied: &Value,
    manager: &str,
    api_version: &str,
    subresource: Option<&str>,
    force: bool,
    merge: impl Fn(&mut Value, &Value),
) -> Result<Value, Vec<Conflict>> {
    // A manager's applies to the object and to a subresource (status) are separate entries,
    // as upstream tracks them: applying one never drops what the other applied.
    let mine = |e: &Entry| {
        e.manager == manager && e.operation == "Apply" && e.subresource.as_deref() == subresource
    };
    let mut list = entries(current);
    let applied_set = fields_of(lists, applied);
    let mut conflicts = Vec::new();
    for e in list.iter().filter(|e| e.manager != manager) {
        for p in e.fields.intersection(&applied_set) {
            // An element's `.` marker is shared; only its fields can conflict.
            if p.last().is_some_and(|l| l == ".") {
                continue;
            }
            if value_at(current, p) != value_at(applied, p) {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    path: p.clone(),
                });
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    let previous: FieldSet = list
        .iter()
        .filter(|e| mine(e))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let mut result = current.clone();
    // Fields this manager applied before and no longer does are removed, if nobody else owns them.
    let others: FieldSet = list
        .iter()
        .filter(|e| !mine(e))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    for p in previous.difference(&applied_set) {
        if !others.contains(p) {
            remove_at(&mut result, p);
        }
    }
    merge(&mut result, applied);
    for e in &mut list {
        if e.manager != manager {
            e.fields.retain(|p| {
                let marker = p.last().is_some_and(|l| l == ".");
                !(force
                    && !marker
                    && applied_set.contains(p)
                    && value_at(current, p) != value_at(applied, p))
            });
        }
    }
    list.retain(|e| !mine(e));
    list.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        api_version: api_version.into(),
        subresource: subresource.map(str::to_owned),
        fields: applied_set,
        time: crate::object::now(),
    });
    set_entries(&mut result, &list);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPLOYMENT: Lists = Lists::Builtin(&crate::registry::kinds::apps::Deployment);

    fn merge(t: &mut Value, p: &Value) {
        crate::object::patch::strategic_merge(DEPLOYMENT, t, p).unwrap();
    }

    #[test]
    fn reapplying_a_service_keeps_its_udp_and_tcp_ports_apart() {
        let svc = Lists::Builtin(&crate::registry::kinds::service::Service).for_apply();
        // Apply merges by the apply keys, as the write handler does.
        let smp =
            |t: &mut Value, p: &Value| crate::object::patch::strategic_merge(svc, t, p).unwrap();
        let applied = json!({"spec": {"ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}});
        let once = apply(svc, &json!({}), &applied, "m", "v1", None, true, smp).unwrap();
        let twice = apply(svc, &once, &applied, "m", "v1", None, true, smp).unwrap();
        assert_eq!(twice.pointer("/spec/ports"), applied.pointer("/spec/ports"));
        // A port without a protocol is the TCP one.
        let no_proto = json!({"spec": {"ports": [{"name": "web", "port": 80}]}});
        let tcp = json!({"spec": {"ports": [{"name": "web", "port": 80, "protocol": "TCP"}]}});
        let stored = apply(svc, &json!({}), &tcp, "m", "v1", None, true, smp).unwrap();
        let again = apply(svc, &stored, &no_proto, "m", "v1", None, true, smp).unwrap();
        assert_eq!(
            again
                .pointer("/spec/ports")
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn fields_of_use_keys_for_keyed_lists() {
        let d = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}});
        let f = fields_of(DEPLOYMENT, &d);
        let shown: Vec<String> = f.iter().map(|p| display(p)).collect();
        assert!(shown.contains(&".spec.replicas".to_owned()));
        assert!(shown.contains(&".spec.template.spec.containers[name=\"c\"].image".to_owned()));
        assert_eq!(from_fields_v1(&to_fields_v1(&f)), f);
    }

    #[test]
    fn an_update_takes_what_it_changes_and_drops_what_it_removes() {
        let fields = |d: &Value, m: &str, sub: Option<&str>| -> Vec<String> {
            let e = entries(d);
            let e = e
                .iter()
                .find(|e| e.manager == m && e.subresource.as_deref() == sub)
                .expect("manager");
            e.fields.iter().map(|p| display(p)).collect()
        };
        let mut d1 = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"a": "1"}},
            "spec": {"replicas": 1, "paused": true}, "status": {"replicas": 0}});
        record_update(DEPLOYMENT, None, &mut d1, "one", "apps/v1", None);
        assert_eq!(
            fields(&d1, "one", None),
            [
                ".metadata.labels.a",
                ".spec.paused",
                ".spec.replicas",
                ".status.replicas"
            ]
        );
        // "two" changes status only: the rest stays with "one".
        let mut d2 = d1.clone();
        d2["status"] = json!({"replicas": 1, "readyReplicas": 1});
        record_update(
            DEPLOYMENT,
            Some(&d1),
            &mut d2,
            "two",
            "apps/v1",
            Some("status"),
        );
        assert_eq!(
            fields(&d2, "one", None),
            [".metadata.labels.a", ".spec.paused", ".spec.replicas"]
        );
        assert_eq!(
            fields(&d2, "two", Some("status")),
            [".status.readyReplicas", ".status.replicas"]
        );
        // "two" removes a label and paused, and changes replicas: "one" keeps nothing of those.
        let mut d3 = d2.clone();
        d3["metadata"]["labels"] = json!({"b": "2"});
        d3["spec"] = json!({"replicas": 3});
        record_update(DEPLOYMENT, Some(&d2), &mut d3, "two", "apps/v1", None);
        assert!(
            entries(&d3).iter().all(|e| e.manager != "one"),
            "{:?}",
            entries(&d3)
        );
        assert_eq!(
            fields(&d3, "two", None),
            [".metadata.labels.b", ".spec.replicas"]
        );
        assert_eq!(
            fields(&d3, "two", Some("status")),
            [".status.readyReplicas", ".status.replicas"]
        );
    }

    #[test]
    fn apply_conflicts_forces_and_drops_fields_no_longer_applied() {
        let base = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}});
        let a1 = json!({"spec": {"replicas": 1, "paused": true}});
        let d1 = apply(DEPLOYMENT, &base, &a1, "one", "apps/v1", None, false, merge).unwrap();
        let a2 = json!({"spec": {"replicas": 3}});
        let conflicts =
            apply(DEPLOYMENT, &d1, &a2, "two", "apps/v1", None, false, merge).unwrap_err();
        assert_eq!(conflicts.len(), 1);
        assert_eq!(
            (
                conflicts[0].manager.as_str(),
                display(&conflicts[0].path).as_str()
            ),
            ("one", ".spec.replicas")
        );
        // Same value: shared ownership, no conflict.
        let same = json!({"spec": {"replicas": 1}});
        assert!(apply(DEPLOYMENT, &d1, &same, "two", "apps/v1", None, false, merge).is_ok());
        let d2 = apply(DEPLOYMENT, &d1, &a2, "two", "apps/v1", None, true, merge).unwrap();
        assert_eq!(d2["spec"]["replicas"], 3);
        let managers: Vec<String> = entries(&d2).iter().map(|e| e.manager.clone()).collect();
        assert_eq!(managers, ["one", "two"]);
        // "one" stops applying paused: it goes.
        let d3 = apply(
            DEPLOYMENT,
            &d2,
            &json!({"spec": {}}),
            "one",
            "apps/v1",
            None,
            false,
            merge,
        )
        .unwrap();
        assert!(d3["spec"].get("paused").is_none());
        assert_eq!(d3["spec"]["replicas"], 3);
    }

    #[test]
    fn a_managers_status_apply_keeps_what_it_applied_to_the_object() {
        // The kubelet applies its Node's labels, then the status through /status with the
        // same manager: the labels stay (upstream tracks the two applies apart).
        let base = json!({"apiVersion": "v1", "kind": "Deployment", "metadata": {"name": "n"}});
        let with_labels = apply(
            DEPLOYMENT,
            &base,
            &json!({"metadata": {"labels": {"a": "b"}}}),
            "kubelet",
            "v1",
            None,
            true,
            merge,
        )
        .unwrap();
        let with_status = apply(
            DEPLOYMENT,
            &with_labels,
            &json!({"status": {"replicas": 1}}),
            "kubelet",
            "v1",
            Some("status"),
            true,
            merge,
        )
        .unwrap();
        assert_eq!(with_status["metadata"]["labels"]["a"], "b", "{with_status}");
        assert_eq!(entries(&with_status).len(), 2);
    }

    #[test]
    fn applying_an_unchanged_manifest_shares_fields_whose_keys_were_defaulted() {
        // Created by a plain create (ports defaulted to TCP), then applied unchanged by
        // another manager, as the Python client's create_from_yaml(apply=True) does.
        let manifest = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "nginx", "image": "nginx", "ports": [{"containerPort": 80}]}]}}}});
        let mut created = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "nginx", "image": "nginx", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}});
        record_update(DEPLOYMENT, None, &mut created, "creator", "apps/v1", None);
        let applied = apply(
            DEPLOYMENT,
            &created,
            &manifest,
            "python-client",
            "apps/v1",
            None,
            false,
            merge,
        )
        .expect("no conflict on equal values");
        assert_eq!(
            applied.pointer("/spec/template/spec/containers/0/ports/0/protocol"),
            Some(&json!("TCP"))
        );
    }

    /// A CRD-like schema with a map list keyed by two fields, a set and an atomic list.
    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "routes": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["host", "port"],
                "items": {"type": "object", "properties": {
                    "host": {"type": "string"}, "port": {"type": "integer"}, "weight": {"type": "integer"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "args": {"type": "array", "items": {"type": "string"}}
        }}}})
    }

    #[test]
    fn schema_list_types_key_fields_and_merge_per_manager() {
        let schema = schema();
        let lists = Lists::Schema(&schema);
        assert_eq!(
            lists.of(&["spec".into(), "routes".into()]),
            ListType::Map(vec!["host".into(), "port".into()])
        );
        assert_eq!(lists.of(&["spec".into(), "tags".into()]), ListType::Set);
        assert_eq!(lists.of(&["spec".into(), "args".into()]), ListType::Atomic);
        // Metadata keeps the built-in rules on custom resources.
        assert_eq!(
            lists.of(&["metadata".into(), "finalizers".into()]),
            ListType::Set
        );

        let merge =
            |t: &mut Value, p: &Value| crate::object::patch::strategic_merge(lists, t, p).unwrap();
        let base =
            json!({"apiVersion": "x.io/v1", "kind": "R", "metadata": {"name": "r"}, "spec": {}});
        let a = json!({"spec": {"routes": [{"host": "a", "port": 80, "weight": 1}], "tags": ["x"], "args": ["1"]}});
        let r1 = apply(lists, &base, &a, "one", "x.io/v1", None, false, merge).unwrap();
        let shown: Vec<String> = entries(&r1)[0].fields.iter().map(|p| display(p)).collect();
        assert!(
            shown.contains(&".spec.routes[host=\"a\",port=80].weight".to_owned()),
            "{shown:?}"
        );
        assert!(
            shown.contains(&".spec.tags[=\"x\"]".to_owned()),
            "{shown:?}"
        );
        assert!(shown.contains(&".spec.args".to_owned()), "{shown:?}");

        // A second manager adds its own route (same host, other port) and tag: both are kept.
        let b =
            json!({"spec": {"routes": [{"host": "a", "port": 443, "weight": 2}], "tags": ["y"]}});
        let r2 = apply(lists, &r1, &b, "two", "x.io/v1", None, false, merge).unwrap();
        assert_eq!(r2["spec"]["routes"].as_array().unwrap().len(), 2);
        assert_eq!(r2["spec"]["tags"], json!(["x", "y"]));
        // The atomic list is owned as a whole: another value conflicts.
        let c = json!({"spec": {"args": ["2"]}});
        let err = apply(lists, &r2, &c, "two", "x.io/v1", None, false, merge).unwrap_err();
        assert_eq!(display(&err[0].path), ".spec.args");
        // Changing a field inside the other manager's element conflicts on that field.
        let d = json!({"spec": {"routes": [{"host": "a", "port": 80, "weight": 5}]}});
        let err = apply(lists, &r2, &d, "two", "x.io/v1", None, false, merge).unwrap_err();
        assert_eq!(
            display(&err[0].path),
            ".spec.routes[host=\"a\",port=80].weight"
        );

        // "one" stops applying its route and tag: they go, "two"'s stay.
        let e = json!({"spec": {"args": ["1"]}});
        let r3 = apply(lists, &r2, &e, "one", "x.io/v1", None, false, merge).unwrap();
        assert_eq!(
            r3["spec"]["routes"],
            json!([{"host": "a", "port": 443, "weight": 2}])
        );
        assert_eq!(r3["spec"]["tags"], json!(["y"]));
    }
}

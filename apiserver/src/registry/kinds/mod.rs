//! One strategy per kind, as upstream's `pkg/registry/<group>/<kind>/strategy.go`: a kind's
//! defaults, create and update rules, validation, initial status, deletion rules, write
//! hooks and table columns live in one file here, and its registry row
//! (`registry/builtin.rs`) points at it. The generic handlers call the row's [`Strategy`] and
//! never name a kind; a kind without special rules uses [`Plain`].
//!
//! Adding a built-in kind is one file here (a unit struct implementing [`Strategy`], only the
//! methods where it differs from the defaults) and one `row::<Type>(…)` in
//! `registry/builtin.rs` naming it; `docs/architecture.md` walks through an example.

pub mod admission;
pub mod apps;
pub mod batch;
pub mod certificates;
pub mod config;
pub mod custom;
pub mod discovery;
pub mod event;
pub mod flowcontrol;
pub mod hpa;
pub mod namespace;
pub mod networking;
pub mod node;
pub mod pod;
pub mod policy;
pub mod quota;
pub mod rbac;
pub mod scheduling;
pub mod service;
pub mod storage;

use crate::Api;
use crate::auth::User;
use crate::error::{ApiResult, Cause};
use crate::object::meta;
use crate::registry::ResourceInfo;
use crate::registry::alloc::Reservation;
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// Whether a field path ends with `parent.field` (list hooks match by the last two names, as
/// upstream's merge-key table does).
pub(crate) fn ends_with(path: &[String], parent: &str, field: &str) -> bool {
    matches!(path, [.., p, f] if p == parent && f == field)
}

/// A built-in admission step that acts on a kind's objects; a strategy lists those that
/// apply to it ([`Strategy::admission`]) where upstream's plugins each check the kind they
/// handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// A new Pod: LimitRanger's defaults, ServiceAccount, Priority,
    /// DefaultTolerationSeconds and RuntimeClass.
    NewPod,
    /// Priority's rules for a PriorityClass (one global default, reserved system names).
    PriorityClass,
    /// DefaultStorageClass: a new claim without a class gets the default one.
    DefaultStorageClass,
    /// StorageObjectInUseProtection: a new object gets this finalizer.
    Protection(&'static str),
}

/// What one kind does differently from the generic store. Every method has the generic
/// behaviour as its default, so a strategy names only its kind's rules.
pub trait Strategy: Sync + Send {
    /// The merge key of a list field of this kind's own (upstream's `patchMergeKey` on its
    /// type), beyond those every kind shares (`registry/lists.rs`): a Service's `spec.ports`.
    fn merge_key(&self, _path: &[String]) -> Option<&'static str> {
        None
    }

    /// Its server-side apply keys where they differ from the merge key
    /// (`x-kubernetes-list-map-keys`): a Service's ports by port and protocol.
    fn apply_keys(&self, _path: &[String]) -> Option<&'static [&'static str]> {
        None
    }

    /// The built-in admission steps for this kind's objects, in order.
    fn admission(&self) -> &'static [Admit] {
        &[]
    }

    /// Whether objects of this kind are namespaces: a webhook's or policy's namespace
    /// selector then matches the object's own labels.
    fn is_namespace(&self) -> bool {
        false
    }

    /// Fills unset fields with upstream's defaults (`SetDefaults_<Kind>`). Runs on create,
    /// on update, and again after a mutating webhook changed the object.
    fn default(&self, _obj: &mut Value) {}

    /// Sets what the server owns on a new object, after defaulting (`PrepareForCreate`).
    fn prepare_for_create(&self, _obj: &mut Value, _user: &User) {}

    /// Carries over what an update of the main resource (or of `subresource`, for spec-like
    /// subresources such as a namespace's `finalize`) may not change (`PrepareForUpdate`).
    /// Runs before defaulting and validation.
    fn prepare_for_update(&self, _new: &mut Value, _old: &Value, _subresource: Option<&str>) {}

    /// Narrows a status-like update (`merged`: the stored object with the new status) to what
    /// `subresource` may change (upstream's status strategies).
    fn prepare_for_status(&self, _merged: &mut Value, _old: &Value, _subresource: Option<&str>) {}

    /// Which metadata a status update takes from the request: (labels, annotations).
    fn status_keeps_metadata(&self) -> (bool, bool) {
        (true, true)
    }

    /// The status a new object starts with, where upstream sets one. Runs after defaulting
    /// and again after admission (which may have changed what it depends on).
    fn initial_status(&self, _obj: &mut Value) {}

    /// The kind's rules for a new or updated object (`ValidateX`), appended to `causes`.
    fn validate(&self, _obj: &Value, _causes: &mut Vec<Cause>) {}

    /// What an update may not change (`ValidateXUpdate`), appended to `causes`.
    fn validate_update(&self, _new: &Value, _old: &Value, _causes: &mut Vec<Cause>) {}

    /// What an update through `subresource` may not change (upstream's subresource
    /// strategies' `ValidateUpdate`); by default the kind's own update rules.
    fn validate_subresource_update(
        &self,
        _subresource: &str,
        new: &Value,
        old: &Value,
        causes: &mut Vec<Cause>,
    ) {
        self.validate_update(new, old, causes);
    }

    /// The grace period of a deletion (`CheckGracefulDelete`): 0 deletes at once.
    fn deletion_grace(&self, _obj: &Value, _requested: Option<i64>) -> i64 {
        0
    }

    /// Whether the object's own spec still holds it while it is being deleted (a
    /// namespace's `spec.finalizers`).
    fn held_by_spec(&self, _obj: &Value) -> bool {
        false
    }

    /// Changes an object when its deletion begins (a namespace turns Terminating).
    fn begin_deletion(&self, _obj: &mut Value) {}

    /// Whether writes take from a shared pool (cluster IPs, node ports): the handler then
    /// keeps the reservation from [`Strategy::allocate`] until the write has landed and the
    /// pool has been told it.
    fn allocates(&self) -> bool {
        false
    }

    /// Takes what the object needs from the shared pool before it is stored (`old`: the
    /// stored object on update); it stays taken while the reservation lives.
    fn allocate<'a, 'b>(
        &'a self,
        _api: &'a Api,
        _key: &'b str,
        _obj: &'b mut Value,
        _old: Option<&'b Value>,
    ) -> BoxFuture<'b, ApiResult<Option<Reservation<'a>>>>
    where
        'a: 'b,
    {
        Box::pin(async { Ok(None) })
    }

    /// Runs once a new object is stored (a namespace's default ServiceAccount and root CA).
    fn after_create<'a>(&'a self, _api: &'a Api, _obj: &'a Value) -> BoxFuture<'a, ApiResult<()>> {
        Box::pin(async { Ok(()) })
    }

    /// Runs once an object is stored after a write (create or update of the main resource);
    /// `true` when it changed the stored object, so the answer is read again.
    fn after_write<'a>(&'a self, _api: &'a Api, _obj: &'a Value) -> BoxFuture<'a, ApiResult<bool>> {
        Box::pin(async { Ok(false) })
    }

    /// The kind's table (what `kubectl get` prints): each column with its cell, so the two
    /// cannot drift. Called once with `Value::Null` for the column definitions (cells are not
    /// evaluated then) and once per object for its cells.
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.age(o);
    }
}

/// The strategy of kinds without special rules.
pub struct Plain;

impl Strategy for Plain {}

/// Kinds whose table shows NAME and CREATED AT (RBAC roles, LimitRanges, CRDs), as upstream's
/// default table convertor prints them.
pub struct CreatedAt;

impl Strategy for CreatedAt {
    fn table(&self, _res: &ResourceInfo, o: &Value, row: &mut Row) {
        row.name(o);
        row.col("Created At", "date", 0, || {
            s(o, "/metadata/creationTimestamp")
        });
    }
}

/// One row of a Table being built, or its column definitions.
pub struct Row {
    header: bool,
    out: Vec<Value>,
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

impl Row {
    /// Column definitions (`columnDefinitions`).
    pub fn header() -> Row {
        Row {
            header: true,
            out: Vec::new(),
        }
    }

    /// The cells of one object.
    pub fn cells() -> Row {
        Row {
            header: false,
            out: Vec::new(),
        }
    }

    /// The definitions or cells gathered.
    pub fn finish(self) -> Vec<Value> {
        self.out
    }

    /// A column with its description, format and cell.
    pub fn column<V: Into<Value>>(
        &mut self,
        name: &str,
        type_: &str,
        format: &str,
        description: &str,
        priority: i64,
        cell: impl FnOnce() -> V,
    ) {
        self.out.push(if self.header {
            json!({"name": name, "type": type_, "format": format, "description": description, "priority": priority})
        } else {
            cell().into()
        });
    }

    /// A column described by its name (`priority` 1: only with `-o wide`).
    pub fn col<V: Into<Value>>(
        &mut self,
        name: &str,
        type_: &str,
        priority: i64,
        cell: impl FnOnce() -> V,
    ) {
        self.column(name, type_, "", name, priority, cell);
    }

    /// The NAME column with the given cell and priority.
    pub fn name_with<V: Into<Value>>(&mut self, priority: i64, cell: impl FnOnce() -> V) {
        self.column("Name", "string", "name", NAME_DESCRIPTION, priority, cell);
    }

    /// The NAME column.
    pub fn name(&mut self, o: &Value) {
        self.name_with(0, || {
            meta(o).get("name").cloned().unwrap_or_else(|| json!(""))
        });
    }

    /// The AGE column.
    pub fn age(&mut self, o: &Value) {
        self.col("Age", "string", 0, || created(o));
    }
}

/// A string field (numbers and booleans as text), "" when absent.
pub fn s(v: &Value, p: &str) -> String {
    match v.pointer(p) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

/// An integer field, 0 when absent.
pub fn i(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

/// `<none>` for an empty cell.
pub fn or_none(x: String) -> String {
    if x.is_empty() { "<none>".into() } else { x }
}

/// `default` for an empty cell.
pub fn or(x: String, default: &str) -> String {
    if x.is_empty() { default.into() } else { x }
}

/// The number of entries of a map or list field.
pub fn len(v: &Value, p: &str) -> usize {
    match v.pointer(p) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

/// The elements of a list field (none when absent).
pub fn list<'a>(v: &'a Value, p: &str) -> &'a [Value] {
    v.pointer(p)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The age of an object.
pub fn created(obj: &Value) -> String {
    age(meta(obj)
        .get("creationTimestamp")
        .and_then(Value::as_str)
        .unwrap_or(""))
}

/// The age of a timestamp, `<unknown>` when there is none.
pub fn age_of(ts: &str) -> String {
    if ts.is_empty() {
        "<unknown>".into()
    } else {
        age(ts)
    }
}

/// kubectl's human-readable age (`duration.HumanDuration`).
pub fn human_duration(secs: i64) -> String {
    let secs = secs.max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        if secs % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", secs % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 192 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if d / 365 < 8 {
        format!("{}y{}d", d / 365, d % 365)
    } else {
        format!("{}y", d / 365)
    }
}

/// The age of a timestamp, as kubectl prints it (`<unknown>` if absent).
pub fn age(ts: &str) -> String {
    match ts.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration((jiff::Timestamp::now() - t).get_seconds()),
        Err(_) => "<unknown>".into(),
    }
}

/// Evaluates the JSONPath of a printer column: fields (`.spec.replicas`), indexes
/// (`.status.conditions[0]`) and filters on a field's value
/// (`.status.conditions[?(@.type=="Ready")].status`, the first match), as upstream's columns use.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    let mut rest = path.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            // A name ends at the next `.` or `[` that is not escaped (`serving\.knative\.dev`).
            let bytes = r.as_bytes();
            let mut end = 0;
            while end < bytes.len() && !matches!(bytes[end], b'.' | b'[') {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            let end = end.min(r.len());
            let name = r[..end].replace("\\.", ".");
            if !name.is_empty() {
                cur = cur.get(name.as_str())?;
            }
            rest = &r[end..];
        } else if let Some(r) = rest
            .strip_prefix("['")
            .map(|r| (r, '\''))
            .or_else(|| rest.strip_prefix("[\"").map(|r| (r, '"')))
            .and_then(|(r, quote)| {
                // A quoted key (`['app.kubernetes.io/name']`), escapes taken as the
                // character they escape, as client-go's JSONPath reads them.
                let mut key = String::new();
                let mut chars = r.char_indices();
                while let Some((i, ch)) = chars.next() {
                    match ch {
                        '\\' => key.extend(chars.next().map(|(_, c)| c)),
                        c if c == quote => {
                            let after = r[i + 1..].strip_prefix(']')?;
                            return Some((key, after));
                        }
                        c => key.push(c),
                    }
                }
                None
            })
        {
            let (key, after) = r;
            cur = cur.get(key.as_str())?;
            rest = after;
        } else if let Some(r) = rest.strip_prefix("[?(") {
            let end = r.find(")]")?;
            let (field, want) = r[..end].split_once("==")?;
            let field = field.trim().strip_prefix('@')?;
            let want = want.trim().trim_matches(['"', '\'']);
            cur = cur.as_array()?.iter().find(|item| {
                json_path(item, field).is_some_and(|v| match v {
                    Value::String(s) => s == want,
                    Value::Number(n) => want.parse::<f64>().ok() == n.as_f64(),
                    Value::Bool(b) => want.parse::<bool>().ok() == Some(*b),
                    _ => false,
                })
            })?;
            rest = &r[end + 2..];
        } else if let Some(r) = rest.strip_prefix("[*]") {
            // Every element: the first with a result, as upstream's table convertor prints
            // the first of a JSONPath's results.
            return cur.as_array()?.iter().find_map(|item| json_path(item, r));
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            cur = cur.get(r[..end].trim().parse::<usize>().ok()?)?;
            rest = &r[end + 1..];
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            cur = cur.get(&rest[..end])?;
            rest = &rest[end..];
        }
    }
    Some(cur)
}

/// The containers and images of a pod template, comma-separated (the wide columns of
/// workloads).
pub fn containers_images(obj: &Value, spec: &str) -> (String, String) {
    let cs = list(obj, spec);
    let names: Vec<String> = cs.iter().map(|c| s(c, "/name")).collect();
    let images: Vec<String> = cs.iter().map(|c| s(c, "/image")).collect();
    (names.join(","), images.join(","))
}

/// The CONTAINERS and IMAGES wide columns of a workload.
pub fn template_columns(o: &Value, row: &mut Row) {
    let (c, im) = containers_images(o, "/spec/template/spec/containers");
    row.col("Containers", "string", 1, || c);
    row.col("Images", "string", 1, || im);
}

/// A label selector as text (`app=web,tier in (a,b)`), `<none>` if empty.
pub fn selector_text(v: &Value) -> String {
    match minik8s_types::LabelSelector::from_json(v) {
        Ok(sel) if !sel.is_empty() => sel.to_string(),
        _ => "<none>".into(),
    }
}

/// A `key=value,…` map as text.
pub fn map_text(v: Option<&Value>) -> String {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// The conditions of an object whose type passes `keep`.
pub fn conditions_where(obj: &Value, keep: impl Fn(&str) -> bool) -> Vec<Value> {
    list(obj, "/status/conditions")
        .iter()
        .filter(|c| keep(c.get("type").and_then(Value::as_str).unwrap_or("")))
        .cloned()
        .collect()
}

/// Refuses changes to the fields at the given JSON pointers (with their field paths).
pub fn immutable(new: &Value, old: &Value, fields: &[(&str, &str)], causes: &mut Vec<Cause>) {
    for (ptr, field) in fields {
        if new.pointer(ptr) != old.pointer(ptr) {
            causes.push(Cause::immutable(field));
        }
    }
}

/// Sets `key` of `obj` to `from`'s value, or removes it where `from` has none.
pub fn set_or_remove(obj: &mut Value, key: &str, from: &Value) {
    let Some(m) = obj.as_object_mut() else {
        return;
    };
    match from.get(key) {
        Some(v) => {
            m.insert(key.into(), v.clone());
        }
        None => {
            m.remove(key);
        }
    }
}

/// Finalizers cannot be added once an object is being deleted (every kind's update rule).
pub fn no_new_finalizers(new: &Value, old: &Value, causes: &mut Vec<Cause>) {
    if meta(old).get("deletionTimestamp").is_none() {
        return;
    }
    let list = |o: &Value| -> Vec<String> { crate::object::strings_at(o, "/metadata/finalizers") };
    let before = list(old);
    let extra: Vec<String> = list(new)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if !extra.is_empty() {
        let shown: Vec<String> = extra.iter().map(|f| format!("{f:?}")).collect();
        causes.push(Cause::forbidden(
            "metadata.finalizers",
            &format!(
                "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                shown.join(", ")
            ),
        ));
    }
}

/// Whether an object being deleted may now go: no finalizers left in `metadata` nor held by
/// its spec, as upstream's `ShouldDeleteDuringUpdate`.
pub fn finalized(res: &ResourceInfo, obj: &Value) -> bool {
    list(obj, "/metadata/finalizers").is_empty() && !res.strategy.held_by_spec(obj)
}

/// The built-in strategy of a group and kind (for tests that exercise one kind's rules).
#[cfg(test)]
pub fn builtin(group: &str, kind: &str) -> &'static dyn Strategy {
    crate::registry::builtin_resources()
        .into_iter()
        .find(|r| r.group == group && r.kind == kind)
        .map(|r| r.strategy)
        .unwrap_or_else(|| panic!("no built-in kind {group}/{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_finalizer_may_be_added_to_an_object_being_deleted() {
        let old = json!({"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a"]}});
        let new = json!({"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a", "b"]}});
        let mut causes = vec![];
        no_new_finalizers(&new, &old, &mut causes);
        assert_eq!(causes[0].field, "metadata.finalizers");
        assert!(causes[0].message.contains("\"b\""), "{}", causes[0].message);
        let mut causes = vec![];
        no_new_finalizers(&old, &new, &mut causes);
        assert!(causes.is_empty());
    }

    #[test]
    fn every_table_has_as_many_cells_as_columns() {
        let obj = json!({"metadata": {"name": "x", "creationTimestamp": "2020-01-01T00:00:00Z"}});
        for res in crate::registry::builtin_resources() {
            let mut header = Row::header();
            res.strategy.table(&res, &Value::Null, &mut header);
            let mut cells = Row::cells();
            res.strategy.table(&res, &obj, &mut cells);
            assert_eq!(header.finish().len(), cells.finish().len(), "{res:?}");
        }
    }

    #[test]
    fn printer_column_paths_index_and_filter() {
        let obj = json!({"status": {"replicas": 2, "conditions": [
            {"type": "SourceReady", "status": "True"}, {"type": "Ready", "status": "False"}]}});
        assert_eq!(json_path(&obj, ".status.replicas"), Some(&json!(2)));
        assert_eq!(
            json_path(&obj, ".status.conditions[0].type"),
            Some(&json!("SourceReady"))
        );
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(&json!("False"))
        );
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Gone")].status"#),
            None
        );
        assert_eq!(json_path(&obj, ".spec.x"), None);
        let dns = json!({"spec": {"subpaths": [{"path": "/a"}, {"path": "/b"}]}});
        assert_eq!(
            json_path(&dns, ".spec.subpaths[*].path"),
            Some(&json!("/a"))
        );
        assert_eq!(
            json_path(&json!({"spec": {"subpaths": []}}), ".spec.subpaths[*].path"),
            None
        );
        // Label keys with dots, quoted in brackets (Knative's columns) or escaped.
        let rev = json!({"metadata": {"labels": {"serving.knative.dev/configuration": "hello"}}});
        for path in [
            r".metadata.labels['serving\.knative\.dev/configuration']",
            r#".metadata.labels["serving.knative.dev/configuration"]"#,
            r".metadata.labels.serving\.knative\.dev/configuration",
        ] {
            assert_eq!(json_path(&rev, path), Some(&json!("hello")), "{path}");
        }
    }

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(30 * 86400), "30d");
    }
}

//! CustomResourceDefinitions: each served version of a stored CRD becomes a registry row at
//! run time (same pipeline as built-ins), its status says the names are accepted and it is
//! established, and deleting it removes its objects. A task follows the stored CRDs.

use crate::Api;
use crate::registry::{NameRule, PrinterColumn, ResourceInfo, ScaleInfo, Serving};
use futures::StreamExt;
use minik8s_storage::{EventKind, RangeRequest, Store};
use serde_json::{Value, json};
use std::sync::Arc;

/// Where CRDs are stored.
pub const PREFIX: &str = "/registry/apiextensions.k8s.io/customresourcedefinitions/";

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

/// `.spec.replicas` → `/spec/replicas`.
fn pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |acc, p| format!("{acc}/{p}"))
}

/// The registry rows of a CRD: one per served version.
pub fn rows(crd: &Value) -> Vec<ResourceInfo> {
    let group = s(crd, "/spec/group").to_owned();
    let plural = s(crd, "/spec/names/plural").to_owned();
    let kind = s(crd, "/spec/names/kind").to_owned();
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage = versions
        .iter()
        .find(|v| v.get("storage") == Some(&json!(true)))
        .map(|v| s(v, "/name").to_owned())
        .unwrap_or_default();
    let prefix = format!("/registry/{group}/{plural}/");
    versions
        .iter()
        .filter(|v| v.get("served") != Some(&json!(false)))
        .map(|v| {
            let version = s(v, "/name").to_owned();
            let scale = v.pointer("/subresources/scale").map(|sc| ScaleInfo {
                spec_replicas: pointer(s(sc, "/specReplicasPath")),
                status_replicas: pointer(s(sc, "/statusReplicasPath")),
                selector: sc
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .map(pointer),
            });
            let printer_columns = v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .map(|cols| {
                    cols.iter()
                        .map(|c| PrinterColumn {
                            name: s(c, "/name").to_owned(),
                            type_: s(c, "/type").to_owned(),
                            json_path: s(c, "/jsonPath").to_owned(),
                            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                            description: s(c, "/description").to_owned(),
                        })
                        .collect()
                })
                .unwrap_or_else(|| {
                    vec![PrinterColumn {
                        name: "Age".into(),
                        type_: "date".into(),
                        json_path: ".metadata.creationTimestamp".into(),
                        priority: 0,
                        description: "".into(),
                    }]
                });
            ResourceInfo {
                group: group.clone(),
                version: version.clone(),
                kind: kind.clone(),
                list_kind: match s(crd, "/spec/names/listKind") {
                    "" => format!("{kind}List"),
                    lk => lk.to_owned(),
                },
                plural: plural.clone(),
                singular: match s(crd, "/spec/names/singular") {
                    "" => kind.to_ascii_lowercase(),
                    sg => sg.to_owned(),
                },
                short_names: crate::object::strings_at(crd, "/spec/names/shortNames"),
                categories: crate::object::strings_at(crd, "/spec/names/categories"),
                namespaced: s(crd, "/spec/scope") != "Cluster",
                status: v.pointer("/subresources/status").is_some(),
                scale,
                extra_subresources: vec![],
                name_rule: NameRule::Subdomain,
                generation: true,
                keep_status_on_create: false,
                decode: None,
                schema: None,
                strategic_merge: false,
                // The version's selectableFields (`.spec.color` selects as `spec.color`).
                field_selectors: v
                    .get("selectableFields")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                    .map(|p| p.trim_start_matches('.').to_owned())
                    .collect(),
                watch_index: None,
                // With several versions, every version converts what it reads: objects may be
                // stored in a version other than today's storage version.
                storage: (version != storage || versions.len() > 1)
                    .then(|| (format!("{group}/{storage}"), prefix.clone())),
                printer_columns,
                read_defaults: v
                    .pointer("/schema/openAPIV3Schema")
                    .is_some_and(crate::registry::structural::has_defaults),
                crd_schema: v.pointer("/schema/openAPIV3Schema").cloned(),
                serving: Serving::Stored,
                conversion: None,
                strategy: &crate::registry::kinds::custom::CustomResource,
            }
        })
        .collect()
}

fn register(api: &Api, crd: &Value) {
    api.registry
        .remove(s(crd, "/spec/group"), s(crd, "/spec/names/plural"));
    let hook = crate::registry::conversion::Webhook::of(crd, api.store.clone(), api.tasks.clone())
        .map(Arc::new);
    for mut row in rows(crd) {
        row.conversion = hook.clone();
        api.registry.add(row);
    }
}

/// The group's local APIServices follow the versions its CRDs serve.
async fn sync_apiservices(api: &Api, group: &str) {
    let versions = api
        .registry
        .groups()
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(_, v)| v)
        .unwrap_or_default();
    crate::aggregation::sync_crd_group(api, group, &versions).await;
}

/// Deletes every stored object of a removed CRD.
async fn remove(api: &Api, crd: &Value) {
    let (group, plural) = (s(crd, "/spec/group"), s(crd, "/spec/names/plural"));
    api.registry.remove(group, plural);
    let prefix = format!("/registry/{group}/{plural}/");
    match api.store.range(RangeRequest::prefix(prefix)).await {
        Ok(all) => {
            for kv in all.kvs {
                let _ = api.store.delete(&kv.key, None).await;
            }
        }
        Err(e) => tracing::warn!(error = %e, "removing the objects of a deleted CRD"),
    }
}

/// Registers every stored CRD, then follows changes until shutdown.
pub async fn sync(api: Arc<Api>) {
    loop {
        let listed = match api.store.range(RangeRequest::prefix(PREFIX)).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing CRDs");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        for kv in &listed.kvs {
            if let Ok(crd) = serde_json::from_slice::<Value>(&kv.value) {
                register(&api, &crd);
                sync_apiservices(&api, s(&crd, "/spec/group")).await;
            }
        }
        let mut events = match api.store.watch(PREFIX, listed.revision + 1).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "watching CRDs");
                continue;
            }
        };
        loop {
            let ev = tokio::select! {
                _ = api.shutdown.cancelled() => return,
                ev = events.next() => ev,
            };
            match ev {
                Some(Ok(ev)) => match ev.kind {
                    EventKind::Put => {
                        if let Ok(crd) = serde_json::from_slice::<Value>(&ev.kv.value) {
                            register(&api, &crd);
                            sync_apiservices(&api, s(&crd, "/spec/group")).await;
                        }
                    }
                    EventKind::Delete => {
                        if let Some(prev) = ev
                            .prev
                            .and_then(|p| serde_json::from_slice::<Value>(&p.value).ok())
                        {
                            remove(&api, &prev).await;
                            sync_apiservices(&api, s(&prev, "/spec/group")).await;
                        }
                    }
                    EventKind::Progress => {}
                },
                // The watch ended (compaction, store restart): list again.
                _ => break,
            }
        }
    }
}

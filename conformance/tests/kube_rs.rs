//! kube-rs against the in-process apiserver, on the embedded store and on etcd: typed and
//! dynamic CRUD, `watcher` with list-watch and streaming lists, a reflector through 1,000
//! writes, and a watch resumed across an apiserver restart.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams,
    PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use minik8s_conformance::Cluster;
use std::collections::BTreeMap;
use std::time::Duration;

macro_rules! both_backends {
    ($($case:ident),* $(,)?) => {
        mod embedded { $( #[test] fn $case() { super::$case(super::Cluster::start()); } )* }
        mod etcd { $( #[test] fn $case() { super::$case(super::Cluster::start_etcd()); } )* }
    };
}

both_backends!(
    typed_and_dynamic_objects_support_every_verb,
    watcher_sees_changes_with_list_watch_and_streaming_lists,
    a_reflector_stays_consistent_through_a_thousand_writes,
    a_watch_resumed_after_an_apiserver_restart_sees_each_event_once,
    watches_and_continue_tokens_older_than_compaction_get_410,
    remaining_item_count_holds_on_every_page,
    metadata_only_clients_get_partial_object_metadata,
    selector_watches_see_objects_enter_and_leave,
);

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"suite": "kube-rs"}},
        "data": {"v": value},
    }))
    .unwrap()
}

fn typed_and_dynamic_objects_support_every_verb(c: Cluster) {
    let client = c.client();
    c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let created = api.create(&PostParams::default(), &cm("a", "1")).await.unwrap();
        assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
        let got = api.get("a").await.unwrap();
        assert_eq!(got.data.as_ref().unwrap()["v"], "1");
        let mut changed = got.clone();
        changed.data = Some(BTreeMap::from([("v".into(), "2".into())]));
        let replaced = api.replace("a", &PostParams::default(), &changed).await.unwrap();
        // The old resourceVersion is now stale: 409.
        match api.replace("a", &PostParams::default(), &changed).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 409),
            other => panic!("expected a conflict, got {other:?}"),
        }
        let patched = api
            .patch("a", &PatchParams::default(), &Patch::Merge(serde_json::json!({"data": {"w": "3"}})))
            .await
            .unwrap();
        assert_ne!(patched.metadata.resource_version, replaced.metadata.resource_version);
        assert_eq!(patched.data.unwrap().len(), 2);
        let list = api.list(&ListParams::default().labels("suite=kube-rs")).await.unwrap();
        assert_eq!(list.items.len(), 1);
        api.delete("a", &DeleteParams::default()).await.unwrap();
        match api.get("a").await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 404),
            other => panic!("expected 404, got {other:?}"),
        }

        let gvk = GroupVersionKind::gvk("apps", "v1", "Deployment");
        let ar = ApiResource::from_gvk_with_plural(&gvk, "deployments");
        let dynamic: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}},
                "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
        }))
        .unwrap();
        dynamic.create(&PostParams::default(), &obj).await.unwrap();
        let typed: Api<Deployment> = Api::namespaced(client, "default");
        let scale = typed.get_scale("d").await.unwrap();
        assert_eq!(scale.spec.unwrap().replicas, Some(2));
        typed
            .patch_scale("d", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"replicas": 5}})))
            .await
            .unwrap();
        assert_eq!(typed.get("d").await.unwrap().spec.unwrap().replicas, Some(5));
        let got = dynamic.get("d").await.unwrap();
        assert_eq!(got.data["spec"]["replicas"], 5);
        dynamic.delete("d", &DeleteParams::default()).await.unwrap();
    });
}

fn watcher_sees_changes_with_list_watch_and_streaming_lists(c: Cluster) {
    let client = c.client();
    c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        api.create(&PostParams::default(), &cm("before", "0"))
            .await
            .unwrap();
        for config in [
            watcher::Config::default(),
            watcher::Config::default().streaming_lists(),
        ] {
            let mut stream = watcher(api.clone(), config.labels("suite=kube-rs"))
                .applied_objects()
                .boxed();
            // The initial state includes the object made before the watch started.
            loop {
                let o = next_within(&mut stream).await;
                if o.metadata.name.as_deref() == Some("before") {
                    break;
                }
            }
            let name = format!("after-{}", rand_suffix());
            api.create(&PostParams::default(), &cm(&name, "1"))
                .await
                .unwrap();
            loop {
                let o = next_within(&mut stream).await;
                if o.metadata.name.as_deref() == Some(name.as_str()) {
                    break;
                }
                assert!(
                    o.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("after-") || n == "before"),
                    "{o:?}"
                );
            }
        }
    });
}

/// GET, LIST and WATCH with `as=PartialObjectMetadata` (kube-rs's `PartialObjectMeta`, as
/// client-go's metadata informers and the garbage collector use) answer metadata only.
fn metadata_only_clients_get_partial_object_metadata(c: Cluster) {
    let client = c.client();
    c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        api.create(&PostParams::default(), &cm("meta-a", "1"))
            .await
            .unwrap();
        let meta: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(client.clone(), "default");
        let got = meta.get("meta-a").await.unwrap();
        assert_eq!(got.metadata.name.as_deref(), Some("meta-a"));
        assert!(got.metadata.resource_version.is_some());
        let types = got.types.clone().unwrap();
        assert_eq!(
            (types.kind.as_str(), types.api_version.as_str()),
            ("PartialObjectMetadata", "meta.k8s.io/v1")
        );
        let list = meta
            .list(&ListParams::default().labels("suite=kube-rs"))
            .await
            .unwrap();
        assert!(
            list.items
                .iter()
                .any(|m| m.metadata.name.as_deref() == Some("meta-a"))
        );
        // The raw answers carry no data, only metadata.
        let req = http::Request::get("/api/v1/namespaces/default/configmaps/meta-a")
            .header(
                "Accept",
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            )
            .body(Vec::new())
            .unwrap();
        let raw: serde_json::Value = client.request(req).await.unwrap();
        assert!(raw.get("data").is_none(), "{raw}");
        assert_eq!(raw["metadata"]["labels"]["suite"], "kube-rs");
        let req = http::Request::get(
            "/api/v1/namespaces/default/configmaps?labelSelector=suite%3Dkube-rs",
        )
        .header(
            "Accept",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        )
        .body(Vec::new())
        .unwrap();
        let raw: serde_json::Value = client.request(req).await.unwrap();
        assert_eq!(raw["kind"], "PartialObjectMetadataList");
        assert!(
            raw["items"]
                .as_array()
                .unwrap()
                .iter()
                .all(|i| i.get("data").is_none() && i["kind"] == "PartialObjectMetadata"),
            "{raw}"
        );

        for config in [
            watcher::Config::default(),
            watcher::Config::default().streaming_lists(),
        ] {
            let mut stream = watcher(meta.clone(), config.labels("suite=kube-rs"))
                .applied_objects()
                .boxed();
            let name = format!("meta-{}", rand_suffix());
            let mut created = false;
            loop {
                let o = next_within(&mut stream).await;
                assert_eq!(
                    o.types.as_ref().map(|t| t.kind.as_str()),
                    Some("PartialObjectMetadata")
                );
                if o.metadata.name.as_deref() == Some(name.as_str()) {
                    assert!(o.metadata.resource_version.is_some());
                    break;
                }
                if !created && o.metadata.name.as_deref() == Some("meta-a") {
                    created = true;
                    api.create(&PostParams::default(), &cm(&name, "1"))
                        .await
                        .unwrap();
                }
            }
        }
    });
}

/// A watch with field and label selectors: an object that comes to match is ADDED, one that
/// stops matching is DELETED, and changes outside the selection are not sent.
fn selector_watches_see_objects_enter_and_leave(c: Cluster) {
    use k8s_openapi::api::core::v1::Pod;
    let client = c.client();
    c.block_on(async {
        let api: Api<Pod> = Api::namespaced(client, "default");
        let params = WatchParams::default()
            .fields("status.phase=Pending,metadata.name!=other")
            .labels("sel=yes");
        let mut stream = api.watch(&params, "0").await.unwrap().boxed();
        let pod = |name: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"sel": "yes"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }))
            .unwrap()
        };
        api.create(&PostParams::default(), &pod("other"))
            .await
            .unwrap();
        api.create(&PostParams::default(), &pod("sel"))
            .await
            .unwrap();
        let phase = |p: &str| Patch::Merge(serde_json::json!({"status": {"phase": p}}));
        let pp = PatchParams::default();
        api.patch_status("sel", &pp, &phase("Running"))
            .await
            .unwrap();
        api.patch_status("sel", &pp, &phase("Pending"))
            .await
            .unwrap();
        let label = |v: &str| Patch::Merge(serde_json::json!({"metadata": {"labels": {"sel": v}}}));
        api.patch("sel", &pp, &label("no")).await.unwrap();
        api.patch("sel", &pp, &label("yes")).await.unwrap();
        api.delete("sel", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        let mut seen = Vec::new();
        while seen.len() < 6 {
            let ev = next_within(&mut stream).await;
            let (kind, o) = match ev {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(e) => panic!("{e:?}"),
            };
            assert_eq!(o.metadata.name.as_deref(), Some("sel"), "{kind} {o:?}");
            seen.push(kind);
        }
        assert_eq!(
            seen,
            ["ADDED", "DELETED", "ADDED", "DELETED", "ADDED", "DELETED"]
        );
    });
}

/// The next item of a stream, failing the test after 10 s, on an error or at its end.
async fn next_within<T, E: std::fmt::Debug>(
    stream: &mut (impl futures::Stream<Item = Result<T, E>> + Unpin),
) -> T {
    tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .expect("an item within 10 s")
        .unwrap()
        .expect("the stream goes on")
}

fn rand_suffix() -> String {
    format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    )
}

fn a_reflector_stays_consistent_through_a_thousand_writes(c: Cluster) {
    let client = c.client();
    c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let (reader, writer) = reflector::store();
        let stream = reflector(writer, watcher(api.clone(), watcher::Config::default()));
        let task = tokio::spawn(stream.for_each(|_| async {}));
        reader.wait_until_ready().await.unwrap();
        // 1,000 writes over 50 names: creates, updates and deletes.
        let mut live = std::collections::HashSet::new();
        for i in 0..1000u32 {
            let name = format!("r{}", i % 50);
            if live.contains(&name) && i % 7 == 0 {
                api.delete(&name, &DeleteParams::default()).await.unwrap();
                live.remove(&name);
            } else if live.contains(&name) {
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"data": {"v": i.to_string()}})),
                )
                .await
                .unwrap();
            } else {
                api.create(&PostParams::default(), &cm(&name, &i.to_string()))
                    .await
                    .unwrap();
                live.insert(name);
            }
        }
        let truth: BTreeMap<String, String> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|o| {
                (
                    o.metadata.name.unwrap(),
                    o.metadata.resource_version.unwrap(),
                )
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let seen: BTreeMap<String, String> = reader
                .state()
                .iter()
                .map(|o| {
                    (
                        o.metadata.name.clone().unwrap(),
                        o.metadata.resource_version.clone().unwrap(),
                    )
                })
                .collect();
            if seen == truth {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "reflector diverged:\n{seen:?}\n{truth:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        task.abort();
    });
}

fn a_watch_resumed_after_an_apiserver_restart_sees_each_event_once(mut c: Cluster) {
    let client = c.client();
    let resume_from = c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        for i in 0..5 {
            api.create(&PostParams::default(), &cm(&format!("w{i}"), "0"))
                .await
                .unwrap();
        }
        // Watch from the start of history, read three of our events, remember the last RV.
        let mut stream = api
            .watch(&WatchParams::default(), "1")
            .await
            .unwrap()
            .boxed();
        let mut last = String::new();
        let mut n = 0;
        while n < 3 {
            if let WatchEvent::Added(o) = stream.try_next().await.unwrap().unwrap() {
                if o.metadata
                    .name
                    .as_deref()
                    .is_some_and(|s| s.starts_with('w'))
                {
                    n += 1;
                }
                last = o.metadata.resource_version.unwrap();
            }
        }
        last
    });
    c.restart();
    let client = c.client();
    c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        for i in 5..8 {
            api.create(&PostParams::default(), &cm(&format!("w{i}"), "0"))
                .await
                .unwrap();
        }
        let mut stream = api
            .watch(&WatchParams::default(), &resume_from)
            .await
            .unwrap()
            .boxed();
        let mut names = Vec::new();
        while names.len() < 5 {
            let ev = next_within(&mut stream).await;
            match ev {
                WatchEvent::Added(o) => names.push(o.metadata.name.unwrap()),
                WatchEvent::Bookmark(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            names,
            ["w3", "w4", "w5", "w6", "w7"],
            "each event after the resume point, once, in order"
        );
        let extra = tokio::time::timeout(Duration::from_millis(300), stream.try_next()).await;
        assert!(extra.is_err(), "no duplicate events: {extra:?}");
    });
}

fn watches_and_continue_tokens_older_than_compaction_get_410(c: Cluster) {
    use minik8s_storage::Store;
    let client = c.client();
    let store = c.store();
    c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let first = api
            .create(&PostParams::default(), &cm("g0", "0"))
            .await
            .unwrap();
        for i in 1..5 {
            api.create(&PostParams::default(), &cm(&format!("g{i}"), "0"))
                .await
                .unwrap();
        }
        let page = api.list(&ListParams::default().limit(2)).await.unwrap();
        let token = page.metadata.continue_.clone().expect("a continue token");
        // remainingItemCount: what the rest of the list holds, when no selector filters it.
        let total = api.list(&ListParams::default()).await.unwrap().items.len() as i64;
        assert_eq!(page.metadata.remaining_item_count, Some(total - 2));
        let selected = api
            .list(
                &ListParams::default()
                    .limit(1)
                    .fields("metadata.namespace=default"),
            )
            .await
            .unwrap();
        assert!(selected.metadata.continue_.is_some());
        assert_eq!(selected.metadata.remaining_item_count, None);
        api.create(&PostParams::default(), &cm("g5", "0"))
            .await
            .unwrap();
        store
            .compact(store.current_revision().await.unwrap())
            .await
            .unwrap();

        let mut stream = api
            .watch(
                &WatchParams::default(),
                first.metadata.resource_version.as_deref().unwrap(),
            )
            .await
            .unwrap()
            .boxed();
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .unwrap();
        // As upstream: the watch is accepted and its one event is the 410, naming the
        // resourceVersion asked for.
        let first_rv = first.metadata.resource_version.as_deref().unwrap();
        match ev {
            Ok(Some(WatchEvent::Error(e))) => {
                assert_eq!((e.code, e.reason.as_str()), (410, "Expired"), "{e:?}");
                let prefix = format!("too old resource version: {first_rv} (");
                assert!(e.message.starts_with(&prefix), "{e:?}");
            }
            other => panic!("expected an ERROR event with 410 Expired, got {other:?}"),
        }
        assert!(stream.try_next().await.unwrap().is_none(), "the watch ends");
        match api
            .list(&ListParams::default().limit(2).continue_token(&token))
            .await
        {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 410);
                assert_eq!(s.reason, "Expired");
                assert!(
                    s.message
                        .contains("use the continue token in this response")
                );
            }
            other => panic!("expected 410 Expired, got {other:?}"),
        }
        // The expired Status carries a token for the rest of the list at the latest revision
        // (inconsistent: g5, created after the first page, is in it).
        let req = http::Request::get(format!(
            "/api/v1/namespaces/default/configmaps?limit=2&continue={token}"
        ))
        .body(kube::client::Body::empty())
        .unwrap();
        let resp = client.send(req).await.unwrap();
        assert_eq!(resp.status().as_u16(), 410);
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        let status: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let inconsistent = status["metadata"]["continue"]
            .as_str()
            .unwrap_or_else(|| panic!("no continue token in {status}"));
        let mut names = Vec::new();
        let mut next = Some(inconsistent.to_owned());
        while let Some(token) = next {
            let page = api
                .list(&ListParams::default().limit(2).continue_token(&token))
                .await
                .unwrap();
            names.extend(page.items.into_iter().map(|cm| cm.metadata.name.unwrap()));
            next = page.metadata.continue_;
        }
        names.retain(|n| n.starts_with('g'));
        assert_eq!(names, ["g2", "g3", "g4", "g5"]);
    });
}

/// Every page of a paged LIST tells how many objects follow it at the list's revision
/// (`remainingItemCount`), while objects are created and deleted between the pages.
fn remaining_item_count_holds_on_every_page(c: Cluster) {
    let client = c.client();
    c.block_on(async {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        for i in 0..7 {
            api.create(&PostParams::default(), &cm(&format!("p{i}"), "0"))
                .await
                .unwrap();
        }
        let mut names = Vec::new();
        let mut remaining = Vec::new();
        let mut next: Option<String> = None;
        let mut page_no = 0;
        loop {
            let mut lp = ListParams::default().limit(2);
            if let Some(token) = &next {
                lp = lp.continue_token(token);
            }
            let page = api.list(&lp).await.unwrap();
            names.extend(
                page.items
                    .iter()
                    .map(|cm| cm.metadata.name.clone().unwrap()),
            );
            next = page.metadata.continue_.clone();
            remaining.push((names.len(), page.metadata.remaining_item_count));
            if next.is_none() {
                break;
            }
            // Writes between the pages: the list goes on at its first page's revision.
            page_no += 1;
            api.create(&PostParams::default(), &cm(&format!("q{page_no}"), "0"))
                .await
                .unwrap();
            if page_no == 1 {
                api.delete("p6", &DeleteParams::default()).await.unwrap();
            }
        }
        let mine: Vec<_> = names.iter().filter(|n| n.starts_with(['p', 'q'])).collect();
        assert_eq!(mine, ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
        let total = names.len();
        let (last, pages) = remaining.split_last().unwrap();
        assert_eq!(last.1, None, "the last page has nothing after it");
        for &(returned, count) in pages {
            assert_eq!(count, Some((total - returned) as i64), "{remaining:?}");
        }
    });
}

mod controller {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::runtime::controller::{Action, Controller};
    use kube::{CustomResource, CustomResourceExt};
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};
    use std::sync::Arc;

    /// A test resource: the controller echoes `spec.message` into `status.echo`.
    #[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema)]
    #[kube(
        group = "test.minik8s.io",
        version = "v1",
        kind = "Echo",
        namespaced,
        status = "EchoStatus"
    )]
    pub struct EchoSpec {
        message: String,
    }

    /// What the controller reports.
    #[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
    pub struct EchoStatus {
        echo: String,
    }

    async fn reconcile(obj: Arc<Echo>, client: Arc<kube::Client>) -> Result<Action, kube::Error> {
        let api: Api<Echo> = Api::namespaced((*client).clone(), "default");
        let status = serde_json::json!({
            "apiVersion": "test.minik8s.io/v1", "kind": "Echo",
            "status": {"echo": obj.spec.message},
        });
        let name = obj.metadata.name.clone().unwrap_or_default();
        api.patch_status(
            &name,
            &PatchParams::apply("echo-controller").force(),
            &Patch::Apply(status),
        )
        .await?;
        Ok(Action::await_change())
    }

    fn error_policy(_: Arc<Echo>, e: &kube::Error, _: Arc<kube::Client>) -> Action {
        eprintln!("reconcile failed (retrying): {e:?}");
        Action::requeue(Duration::from_millis(200))
    }

    #[test]
    fn a_controller_on_a_custom_resource_writes_status_by_server_side_apply() {
        let c = Cluster::start();
        let client = c.client();
        c.block_on(async {
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            crds.create(&PostParams::default(), &Echo::crd())
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            let api: Api<Echo> = Api::namespaced(client.clone(), "default");
            let ctrl = Controller::new(api.clone(), watcher::Config::default())
                .run(reconcile, error_policy, Arc::new(client.clone()))
                .for_each(|_| async {});
            let task = tokio::spawn(ctrl);
            api.create(
                &PostParams::default(),
                &Echo::new(
                    "hello",
                    EchoSpec {
                        message: "hi there".into(),
                    },
                ),
            )
            .await
            .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let got = api.get("hello").await.unwrap();
                if got.status.as_ref().is_some_and(|s| s.echo == "hi there") {
                    let managers: Vec<String> = got
                        .metadata
                        .managed_fields
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|m| m.manager.clone())
                        .collect();
                    assert!(
                        managers.contains(&"echo-controller".to_owned()),
                        "{managers:?}"
                    );
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "status never written: {got:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            task.abort();
        });
    }
}

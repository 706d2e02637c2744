//! Behaviour only the embedded backend has: durability across reopen, its bounded history
//! with automatic compaction, catch-up of slow watchers and closing.

use bytes::Bytes;
use futures::StreamExt;
use minik8s_storage::{Embedded, EmbeddedOptions, Error, RangeRequest, Store};
use std::time::Duration;

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_owned())
}

#[tokio::test]
async fn reopening_keeps_the_data_the_revision_and_the_watch_history() {
    let dir = tempfile::tempdir().unwrap();
    let store = Embedded::open(dir.path()).unwrap();
    let a = store.create("/r/a", b("1")).await.unwrap();
    let a2 = store.update("/r/a", b("2"), a.mod_revision).await.unwrap();
    store.create("/r/b", b("1")).await.unwrap();
    let revision = store.current_revision().await.unwrap();
    store.close().await.unwrap();
    assert!(matches!(store.get("/r/a").await, Err(Error::Closed)));

    let store = Embedded::open(dir.path()).unwrap();
    assert_eq!(store.current_revision().await.unwrap(), revision);
    assert_eq!(store.get("/r/a").await.unwrap().unwrap(), a2);
    let mut w = store.watch("/r/", a.mod_revision).await.unwrap();
    for want in [a.mod_revision, a2.mod_revision, revision] {
        let e = w.next().await.unwrap().unwrap();
        assert_eq!(e.kv.mod_revision, want);
    }
    let next = store.create("/r/c", b("1")).await.unwrap();
    assert_eq!(next.mod_revision, revision + 1);
}

#[tokio::test]
async fn a_second_open_of_the_same_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _store = Embedded::open(dir.path()).unwrap();
    assert!(matches!(
        Embedded::open(dir.path()),
        Err(Error::Open { .. })
    ));
}

#[tokio::test]
async fn history_is_bounded_by_automatic_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        history: 10,
        ..Default::default()
    };
    let store = Embedded::open_with(dir.path(), opts).unwrap();
    let mut kv = store.create("/r/k", b("0")).await.unwrap();
    for i in 1..100 {
        kv = store
            .update("/r/k", b(&i.to_string()), kv.mod_revision)
            .await
            .unwrap();
    }
    assert_eq!(kv.mod_revision, 100);
    assert_eq!(store.compacted_revision().await.unwrap(), 90);
    let old = RangeRequest {
        prefix: "/r/".into(),
        revision: 50,
        ..Default::default()
    };
    assert!(matches!(
        store.range(old).await,
        Err(Error::Compacted { .. })
    ));
    let recent = RangeRequest {
        prefix: "/r/".into(),
        revision: 95,
        ..Default::default()
    };
    assert_eq!(store.range(recent).await.unwrap().kvs[0].value, b("94"));
    let mut w = store.watch("/r/", 91).await.unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().kv.mod_revision, 91);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_falls_behind_catches_up_from_history_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        watch_buffer: 16,
        ..Default::default()
    };
    let store = Embedded::open_with(dir.path(), opts).unwrap();
    let mut w = store.watch("/r/", 1).await.unwrap();
    // Many single-write commits while nobody reads the watch: the live channel overflows.
    for i in 0..2000 {
        store.create(&format!("/r/{i:05}"), b("v")).await.unwrap();
    }
    for i in 0..2000 {
        let e = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(e.kv.key, format!("/r/{i:05}"));
        assert_eq!(e.kv.mod_revision, i + 1);
    }
}

#[tokio::test]
async fn closing_ends_watches_and_fails_later_calls() {
    let dir = tempfile::tempdir().unwrap();
    let store = Embedded::open(dir.path()).unwrap();
    let mut w = store.watch("/r/", 0).await.unwrap();
    store.close().await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .unwrap();
    assert!(matches!(end, Some(Err(Error::Closed)) | None), "{end:?}");
    assert!(matches!(
        store.create("/r/x", b("x")).await,
        Err(Error::Closed)
    ));
    // The file is released: it opens again.
    Embedded::open(dir.path()).unwrap();
}

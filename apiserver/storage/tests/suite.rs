//! The behavioural suite of the storage contract, run against every backend: the embedded
//! store in a temporary folder and a private etcd started from Debian's package.

use bytes::Bytes;
use futures::StreamExt;
use minik8s_storage::testing::TestEtcd;
use minik8s_storage::{Embedded, Error, EventKind, RangeRequest, Storage, Store};
use std::time::Duration;

/// A store under test plus what keeps it alive.
struct Harness {
    store: Storage,
    _etcd: Option<TestEtcd>,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    async fn embedded() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Harness {
            store: Storage::Embedded(Embedded::open(dir.path()).unwrap()),
            _etcd: None,
            _dir: Some(dir),
        }
    }
    async fn etcd() -> Self {
        let etcd = TestEtcd::start()
            .await
            .expect("a private etcd for the storage suite");
        Harness {
            store: Storage::Etcd(etcd.connect().await.unwrap()),
            _etcd: Some(etcd),
            _dir: None,
        }
    }
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = super::Harness::embedded().await;
                    super::$case(&h.store).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = super::Harness::etcd().await;
                    super::$case(&h.store).await;
                }
            )*
        }
    };
}

suite!(
    create_then_get_returns_the_value_and_its_revisions,
    create_of_an_existing_key_is_already_exists,
    update_is_compare_and_swap_on_mod_revision,
    delete_is_compare_and_swap_and_returns_the_previous_value,
    every_write_bumps_the_one_global_revision_by_one,
    range_reads_a_prefix_in_key_order_and_pages_with_limit_and_start_after,
    range_at_an_older_revision_sees_the_past_and_pages_consistently,
    range_at_a_future_revision_is_an_error,
    watch_replays_history_from_a_revision_then_follows_live_writes,
    watch_only_sees_keys_under_its_prefix,
    watch_from_revision_zero_starts_after_the_current_revision,
    compaction_makes_older_revisions_unavailable,
    concurrent_creates_of_one_key_let_exactly_one_win,
    concurrent_compare_and_swap_increments_lose_no_update,
    large_and_binary_values_round_trip,
    watch_sees_every_concurrent_write_once_in_revision_order,
);

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_owned())
}

async fn next_event(w: &mut minik8s_storage::WatchStream) -> minik8s_storage::Event {
    tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("a watch event within 10 s")
        .expect("the watch is still open")
        .expect("no watch error")
}

async fn create_then_get_returns_the_value_and_its_revisions(s: &Storage) {
    let kv = s.create("/r/a", b("one")).await.unwrap();
    assert_eq!(kv.create_revision, kv.mod_revision);
    assert_eq!(kv.value, b("one"));
    let got = s.get("/r/a").await.unwrap().expect("present");
    assert_eq!(got, kv);
    assert_eq!(s.current_revision().await.unwrap(), kv.mod_revision);
    assert_eq!(s.get("/r/missing").await.unwrap(), None);
}

async fn create_of_an_existing_key_is_already_exists(s: &Storage) {
    let first = s.create("/r/a", b("one")).await.unwrap();
    let err = s.create("/r/a", b("two")).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");
    assert_eq!(s.get("/r/a").await.unwrap().unwrap(), first);
    assert_eq!(s.current_revision().await.unwrap(), first.mod_revision);
}

async fn update_is_compare_and_swap_on_mod_revision(s: &Storage) {
    let v1 = s.create("/r/a", b("one")).await.unwrap();
    let v2 = s.update("/r/a", b("two"), v1.mod_revision).await.unwrap();
    assert!(v2.mod_revision > v1.mod_revision);
    assert_eq!(v2.create_revision, v1.create_revision);
    assert_eq!(s.get("/r/a").await.unwrap().unwrap(), v2);

    match s.update("/r/a", b("stale"), v1.mod_revision).await {
        Err(Error::Conflict {
            current, expected, ..
        }) => {
            assert_eq!(*current, v2);
            assert_eq!(expected, v1.mod_revision);
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    let err = s.update("/r/none", b("x"), 0).await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert_eq!(
        s.get("/r/none").await.unwrap(),
        None,
        "a failed update creates nothing"
    );
}

async fn delete_is_compare_and_swap_and_returns_the_previous_value(s: &Storage) {
    let v1 = s.create("/r/a", b("one")).await.unwrap();
    let v2 = s.update("/r/a", b("two"), v1.mod_revision).await.unwrap();
    let err = s.delete("/r/a", Some(v1.mod_revision)).await.unwrap_err();
    assert!(matches!(err, Error::Conflict { .. }), "{err:?}");
    let deleted = s.delete("/r/a", Some(v2.mod_revision)).await.unwrap();
    assert_eq!(deleted.prev, v2);
    assert!(deleted.revision > v2.mod_revision);
    assert_eq!(s.get("/r/a").await.unwrap(), None);
    let err = s.delete("/r/a", None).await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");

    s.create("/r/b", b("x")).await.unwrap();
    s.delete("/r/b", None).await.expect("unconditional delete");
    // A key deleted and created again starts a new life.
    let again = s.create("/r/a", b("three")).await.unwrap();
    assert!(again.create_revision > deleted.revision);
}

async fn every_write_bumps_the_one_global_revision_by_one(s: &Storage) {
    let start = s.current_revision().await.unwrap();
    let a = s.create("/r/a", b("1")).await.unwrap();
    let c = s.create("/other/c", b("1")).await.unwrap();
    let a2 = s.update("/r/a", b("2"), a.mod_revision).await.unwrap();
    let d = s.delete("/other/c", None).await.unwrap();
    assert_eq!(
        [a.mod_revision, c.mod_revision, a2.mod_revision, d.revision],
        [start + 1, start + 2, start + 3, start + 4]
    );
    // Failed writes do not bump it.
    let _ = s.create("/r/a", b("x")).await.unwrap_err();
    assert_eq!(s.current_revision().await.unwrap(), start + 4);
}

async fn range_reads_a_prefix_in_key_order_and_pages_with_limit_and_start_after(s: &Storage) {
    for k in [
        "/r/a/3", "/r/a/1", "/r/a/5", "/r/a/2", "/r/a/4", "/r/ab/1", "/r/b/1",
    ] {
        s.create(k, b(k)).await.unwrap();
    }
    let all = s.range(RangeRequest::prefix("/r/a/")).await.unwrap();
    let keys: Vec<_> = all.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/r/a/1", "/r/a/2", "/r/a/3", "/r/a/4", "/r/a/5"]);
    assert!(!all.more);
    assert_eq!(all.revision, s.current_revision().await.unwrap());
    assert!(all.kvs.iter().all(|kv| kv.value == kv.key.as_bytes()));

    let mut pages = Vec::new();
    let mut start_after = None;
    let mut seen = 0;
    loop {
        let page = s
            .range(RangeRequest {
                prefix: "/r/a/".into(),
                start_after: start_after.clone(),
                limit: 2,
                revision: all.revision,
                count: true,
            })
            .await
            .unwrap();
        assert!(page.kvs.len() <= 2);
        // The count is of the whole rest of the range, beyond the limit.
        assert_eq!(page.count, 5 - seen);
        seen += page.kvs.len();
        start_after = page.kvs.last().map(|kv| kv.key.clone());
        pages.push(page.kvs.len());
        if !page.more {
            break;
        }
    }
    assert_eq!(pages, [2, 2, 1]);
    assert_eq!(start_after.as_deref(), Some("/r/a/5"));

    let everything = s.range(RangeRequest::prefix("/r/")).await.unwrap();
    assert_eq!(everything.kvs.len(), 7);
    let none = s.range(RangeRequest::prefix("/nothing/")).await.unwrap();
    assert!(none.kvs.is_empty() && !none.more);
}

async fn range_at_an_older_revision_sees_the_past_and_pages_consistently(s: &Storage) {
    let a = s.create("/r/a", b("a1")).await.unwrap();
    let bb = s.create("/r/b", b("b1")).await.unwrap();
    let c = s.create("/r/c", b("c1")).await.unwrap();
    let then = s.range(RangeRequest::prefix("/r/")).await.unwrap();
    // Change everything after the snapshot.
    s.update("/r/a", b("a2"), a.mod_revision).await.unwrap();
    s.delete("/r/b", Some(bb.mod_revision)).await.unwrap();
    s.create("/r/aa", b("new")).await.unwrap();
    s.create("/r/d", b("new")).await.unwrap();
    let c2 = s.update("/r/c", b("c2"), c.mod_revision).await.unwrap();
    s.update("/r/c", b("c3"), c2.mod_revision).await.unwrap();

    let past = s
        .range(RangeRequest {
            prefix: "/r/".into(),
            revision: then.revision,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(past.kvs, then.kvs);
    assert_eq!(past.revision, then.revision);

    // Paging at the old revision after a key that exists now but not then.
    let page = s
        .range(RangeRequest {
            prefix: "/r/".into(),
            start_after: Some("/r/a".into()),
            limit: 1,
            revision: then.revision,
            count: true,
        })
        .await
        .unwrap();
    assert_eq!(page.kvs, vec![then.kvs[1].clone()]);
    assert!(page.more);
    assert_eq!(page.count, 2, "b and c existed then after a");

    let now = s.range(RangeRequest::prefix("/r/")).await.unwrap();
    let keys: Vec<_> = now.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/r/a", "/r/aa", "/r/c", "/r/d"]);
}

async fn range_at_a_future_revision_is_an_error(s: &Storage) {
    s.create("/r/a", b("a")).await.unwrap();
    let current = s.current_revision().await.unwrap();
    let err = s
        .range(RangeRequest {
            prefix: "/r/".into(),
            revision: current + 100,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FutureRevision { .. }), "{err:?}");
}

async fn watch_replays_history_from_a_revision_then_follows_live_writes(s: &Storage) {
    let a1 = s.create("/r/a", b("1")).await.unwrap();
    let a2 = s.update("/r/a", b("2"), a1.mod_revision).await.unwrap();
    let bk = s.create("/r/b", b("1")).await.unwrap();
    let mut w = s.watch("/r/", a2.mod_revision).await.unwrap();

    let e = next_event(&mut w).await;
    assert_eq!((e.kind, e.kv.clone()), (EventKind::Put, a2.clone()));
    assert_eq!(e.prev, Some(a1.clone()));
    let e = next_event(&mut w).await;
    assert_eq!(
        (e.kind, e.kv.clone(), e.prev),
        (EventKind::Put, bk.clone(), None)
    );

    let d = s.delete("/r/a", None).await.unwrap();
    let e = next_event(&mut w).await;
    assert_eq!(e.kind, EventKind::Delete);
    assert_eq!(e.kv.key, "/r/a");
    assert_eq!(e.kv.mod_revision, d.revision);
    assert_eq!(e.prev, Some(a2));
    let c = s.create("/r/c", b("1")).await.unwrap();
    assert_eq!(next_event(&mut w).await.kv, c);
}

async fn watch_only_sees_keys_under_its_prefix(s: &Storage) {
    let mut w = s.watch("/r/pods/", 0).await.unwrap();
    s.create("/r/configmaps/x", b("no")).await.unwrap();
    s.create("/r/podsx", b("no")).await.unwrap();
    let pod = s.create("/r/pods/p", b("yes")).await.unwrap();
    assert_eq!(next_event(&mut w).await.kv, pod);
    let nothing = tokio::time::timeout(Duration::from_millis(200), w.next()).await;
    assert!(nothing.is_err(), "no further event: {nothing:?}");
}

async fn watch_from_revision_zero_starts_after_the_current_revision(s: &Storage) {
    s.create("/r/old", b("old")).await.unwrap();
    let mut w = s.watch("/r/", 0).await.unwrap();
    // Give etcd a moment to register the watch before the write.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let new = s.create("/r/new", b("new")).await.unwrap();
    assert_eq!(next_event(&mut w).await.kv, new);
}

async fn compaction_makes_older_revisions_unavailable(s: &Storage) {
    let a = s.create("/r/a", b("1")).await.unwrap();
    let a2 = s.update("/r/a", b("2"), a.mod_revision).await.unwrap();
    let a3 = s.update("/r/a", b("3"), a2.mod_revision).await.unwrap();
    s.create("/r/b", b("1")).await.unwrap();
    s.compact(a3.mod_revision).await.unwrap();
    assert!(s.compacted_revision().await.unwrap() >= a3.mod_revision);

    let err = s
        .range(RangeRequest {
            prefix: "/r/".into(),
            revision: a2.mod_revision,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Compacted { .. }), "{err:?}");
    let at = s
        .range(RangeRequest {
            prefix: "/r/".into(),
            revision: a3.mod_revision,
            ..Default::default()
        })
        .await
        .expect("the compaction revision itself is still readable");
    assert_eq!(at.kvs, vec![a3.clone()]);

    let mut w = s.watch("/r/", a2.mod_revision).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("an answer")
        .expect("an item");
    assert!(matches!(first, Err(Error::Compacted { .. })), "{first:?}");

    let mut w = s.watch("/r/", a3.mod_revision + 1).await.unwrap();
    assert_eq!(next_event(&mut w).await.kv.key, "/r/b");
    // Compacting again to the same revision is fine.
    s.compact(a3.mod_revision).await.unwrap();
}

async fn concurrent_creates_of_one_key_let_exactly_one_win(s: &Storage) {
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.create("/r/one", b(&format!("{i}"))).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(Error::AlreadyExists { .. }) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(ok, 1);
}

async fn concurrent_compare_and_swap_increments_lose_no_update(s: &Storage) {
    s.create("/r/counter", b("0")).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                for _ in 0..20 {
                    let mut cur = s.get("/r/counter").await.unwrap().unwrap();
                    loop {
                        let n: u64 = std::str::from_utf8(&cur.value).unwrap().parse().unwrap();
                        match s
                            .update("/r/counter", b(&(n + 1).to_string()), cur.mod_revision)
                            .await
                        {
                            Ok(_) => break,
                            Err(Error::Conflict { current, .. }) => cur = *current,
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let v = s.get("/r/counter").await.unwrap().unwrap();
    assert_eq!(v.value, b("160"));
}

async fn large_and_binary_values_round_trip(s: &Storage) {
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let kv = s.create("/r/big", Bytes::from(big.clone())).await.unwrap();
    assert_eq!(s.get("/r/big").await.unwrap().unwrap().value, big);
    let empty = s
        .update("/r/big", Bytes::new(), kv.mod_revision)
        .await
        .unwrap();
    assert_eq!(s.get("/r/big").await.unwrap().unwrap(), empty);
    assert!(empty.value.is_empty());
}

async fn watch_sees_every_concurrent_write_once_in_revision_order(s: &Storage) {
    let mut w = s
        .watch("/r/", s.current_revision().await.unwrap() + 1)
        .await
        .unwrap();
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    s.create(&format!("/r/{t}/{i}"), b("v")).await.unwrap();
                }
            })
        })
        .collect();
    for t in writers {
        t.await.unwrap();
    }
    let mut last = 0;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..400 {
        let e = next_event(&mut w).await;
        assert!(e.kv.mod_revision > last, "revisions increase");
        last = e.kv.mod_revision;
        assert!(seen.insert(e.kv.key.clone()), "{} seen twice", e.kv.key);
    }
    assert_eq!(seen.len(), 400);
}

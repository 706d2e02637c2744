//! Behaviour only the embedded backend has: durability across reopen, its bounded history
//! with automatic compaction, catch-up of slow watchers and closing.

use bytes::Bytes;
use futures::StreamExt;
use minik8s_storage::{Embedded, EmbeddedOptions, Error, EventKind, RangeRequest, Store};
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

/// A store with `opts` in `dir` whose key `/r/k` was written at revisions 1 to 100 (values
/// "0" to "99"); its last version.
async fn one_key_written_100_times(
    dir: &std::path::Path,
    opts: EmbeddedOptions,
) -> (Embedded, minik8s_storage::KeyValue) {
    let store = Embedded::open_with(dir, opts).unwrap();
    let mut kv = store.create("/r/k", b("0")).await.unwrap();
    for i in 1..100 {
        kv = store
            .update("/r/k", b(&i.to_string()), kv.mod_revision)
            .await
            .unwrap();
    }
    (store, kv)
}

#[tokio::test]
async fn history_is_bounded_by_automatic_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        history: 10,
        history_age: Duration::ZERO,
        ..Default::default()
    };
    let (store, kv) = one_key_written_100_times(dir.path(), opts).await;
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

/// Beyond `history` revisions, history younger than `history_age` is kept; once it is older,
/// the count bounds it again.
#[tokio::test]
async fn recent_history_is_kept_beyond_the_revision_count() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        history: 10,
        history_age: Duration::from_secs(3),
        ..Default::default()
    };
    let (store, mut kv) = one_key_written_100_times(dir.path(), opts).await;
    assert_eq!(store.compacted_revision().await.unwrap(), 0);
    let old = RangeRequest {
        prefix: "/r/".into(),
        revision: 5,
        ..Default::default()
    };
    assert_eq!(store.range(old.clone()).await.unwrap().kvs[0].value, b("4"));
    tokio::time::sleep(Duration::from_millis(3100)).await;
    kv = store
        .update("/r/k", b("100"), kv.mod_revision)
        .await
        .unwrap();
    assert_eq!(kv.mod_revision, 101);
    // The revision the store had three seconds ago (100) stays readable; the count allows
    // compacting to 91, so 100 it is.
    assert_eq!(store.compacted_revision().await.unwrap(), 91);
    assert!(matches!(
        store.range(old).await,
        Err(Error::Compacted { .. })
    ));
}

/// The pages of a paginated read at an older revision, while writes go on before, inside and
/// after the pages still to come, and a second read at the same revision starts over midway:
/// both see exactly the keys as they were at that revision.
#[tokio::test]
async fn pages_read_at_an_older_revision_agree_with_it_while_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Embedded::open(dir.path()).unwrap();
    let mut rev = std::collections::HashMap::new();
    for i in 0..300 {
        for prefix in ["/p/", "/q/"] {
            let key = format!("{prefix}k{:03}", i * 2);
            let kv = store.create(&key, b("0")).await.unwrap();
            rev.insert(key, kv.mod_revision);
        }
    }
    let whole = |revision| RangeRequest {
        prefix: "/p/".into(),
        revision,
        ..Default::default()
    };
    let then = store.range(whole(0)).await.unwrap();
    let at = then.revision;
    let mut seed = 7u64;
    let mut random = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut pages = [Vec::new(), Vec::new()];
    let mut after: [Option<String>; 2] = [None, None];
    let mut done = [false, true];
    let mut turn = 0;
    while !(done[0] && done[1]) {
        // A few writes: updates, deletions and creations anywhere in both prefixes.
        for _ in 0..random(12) {
            let prefix = if random(4) == 0 { "/q/" } else { "/p/" };
            let key = format!("{prefix}k{:03}", random(600));
            match rev.get(&key).copied() {
                Some(r) if random(3) == 0 => {
                    store.delete(&key, Some(r)).await.unwrap();
                    rev.remove(&key);
                }
                Some(r) => {
                    let kv = store.update(&key, b(&turn.to_string()), r).await.unwrap();
                    rev.insert(key, kv.mod_revision);
                }
                None => {
                    let kv = store.create(&key, b("new")).await.unwrap();
                    rev.insert(key, kv.mod_revision);
                }
            }
        }
        turn += 1;
        // The second read starts once the first is a third of the way.
        if turn == 15 {
            done[1] = false;
        }
        for r in 0..2 {
            if done[r] {
                continue;
            }
            let page = store
                .range(RangeRequest {
                    prefix: "/p/".into(),
                    start_after: after[r].clone(),
                    limit: 1 + random(9) as usize,
                    revision: at,
                    count: false,
                })
                .await
                .unwrap();
            assert_eq!(page.revision, at);
            after[r] = page.kvs.last().map(|kv| kv.key.clone());
            pages[r].extend(page.kvs);
            done[r] = !page.more;
        }
    }
    assert!(turn > 30, "the reads took {turn} turns");
    for (r, got) in pages.iter().enumerate() {
        assert_eq!(got.len(), then.kvs.len(), "read {r}");
        for (g, t) in got.iter().zip(&then.kvs) {
            assert_eq!(
                (&g.key, &g.value, g.mod_revision, g.create_revision),
                (&t.key, &t.value, t.mod_revision, t.create_revision),
                "read {r}"
            );
        }
    }
    assert_eq!(store.range(whole(at)).await.unwrap().kvs, then.kvs);
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

/// The events of a watch of `prefix` from `from` up to the store's revision `last` (a change
/// under the prefix).
async fn watched(store: &Embedded, prefix: &str, from: i64, last: i64) -> Vec<(String, i64)> {
    let mut w = store.watch(prefix, from).await.unwrap();
    let mut got = Vec::new();
    while got.last().is_none_or(|(_, rev)| *rev < last) {
        let e = tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        got.push((e.kv.key, e.kv.mod_revision));
    }
    got
}

/// A watch starting from a recent revision replays from memory, an older one (or one after a
/// reopen) from the history table: both hand over the same changes, in order, at every start
/// revision, including inside batches of several writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_replay_the_same_changes_from_memory_and_from_history() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        // Room for about the last 60 of the 300 writes.
        recent_bytes: 60 * (128 + 8 + 2 * 3),
        ..Default::default()
    };
    let store = Embedded::open_with(dir.path(), opts.clone()).unwrap();
    // Concurrent writes commit several to a batch; two prefixes interleave.
    let key = |i: usize| format!("{}{i:03}", if i.is_multiple_of(3) { "/b/" } else { "/a/" });
    let creates = (0..250).map(|i| {
        let store = store.clone();
        async move { store.create(&key(i), b("v")).await.unwrap() }
    });
    futures::future::join_all(creates).await;
    let deletes = (0..250).step_by(5).map(|i| {
        let store = store.clone();
        async move { store.delete(&key(i), None).await.unwrap() }
    });
    futures::future::join_all(deletes).await;
    let last = store.create("/a/end", b("v")).await.unwrap().mod_revision;
    assert_eq!(last, 301);
    let stats = store.stats();
    assert!(stats.commits < stats.writes, "{stats:?}");
    let all = watched(&store, "/a/", 1, last).await;
    assert!(all.windows(2).all(|w| w[0].1 < w[1].1));
    let from = |r: i64| -> Vec<(String, i64)> {
        all.iter().filter(|(_, rev)| *rev >= r).cloned().collect()
    };
    for r in 1..=last {
        assert_eq!(watched(&store, "/a/", r, last).await, from(r), "from {r}");
    }
    store.close().await.unwrap();

    let store = Embedded::open_with(dir.path(), opts).unwrap();
    for r in (1..=last).step_by(7) {
        assert_eq!(
            watched(&store, "/a/", r, last).await,
            from(r),
            "from {r}, reopened"
        );
    }

    // Writes after the reopen are kept in memory: a watch from before it reads the table up
    // to the reopen, then memory, and misses or repeats nothing at the seam.
    let mut all = all;
    for i in 0..40 {
        let k = key(1000 + i);
        let rev = store.create(&k, b("v")).await.unwrap().mod_revision;
        if k.starts_with("/a/") {
            all.push((k, rev));
        }
    }
    let end = all.last().unwrap().1;
    assert_eq!(end, last + 40);
    let from = |r: i64| -> Vec<(String, i64)> {
        all.iter().filter(|(_, rev)| *rev >= r).cloned().collect()
    };
    for r in (1..=end).step_by(7).chain(last - 2..=last + 3) {
        assert_eq!(
            watched(&store, "/a/", r, end).await,
            from(r),
            "from {r}, written after the reopen"
        );
    }
}

/// Indexes the watches of `/p/` by a value's text before its first ':' ("node:rest").
fn index_by_node(store: &Embedded) {
    store
        .index(
            "/p/",
            std::sync::Arc::new(|v: &[u8]| {
                let s = std::str::from_utf8(v).ok()?;
                Some(s.split_once(':')?.0.to_owned())
            }),
        )
        .unwrap();
}

/// An indexed watch (a kubelet's of its node's pods) is handed its value's changes, live
/// and, once it fell behind, from history: every one, in order. Others it may be handed too
/// (from history, or in a batch with its own), for its caller to filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_watch_gets_every_change_of_its_value_live_and_after_falling_behind() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        watch_buffer: 16,
        ..Default::default()
    };
    let store = Embedded::open_with(dir.path(), opts).unwrap();
    index_by_node(&store);
    let mut live = store.watch_where("/p/", 0, "n1").await.unwrap();
    let mut behind = store.watch_where("/p/", 0, "n1").await.unwrap();
    let mut wanted = Vec::new();
    for i in 0..400 {
        let node = if i % 4 == 0 { "n1" } else { "n2" };
        let kv = store
            .create(&format!("/p/{i:05}"), b(&format!("{node}:x")))
            .await
            .unwrap();
        if node == "n1" {
            wanted.push(kv.mod_revision);
            // Read as they come: nothing of n2's is handed over.
            let e = tokio::time::timeout(Duration::from_secs(10), live.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(e.kv.mod_revision, kv.mod_revision);
        }
    }
    // `behind` read nothing while 100 of its changes came: it lagged, and catches up.
    let mut got = Vec::new();
    while got.len() < wanted.len() {
        let e = tokio::time::timeout(Duration::from_secs(10), behind.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if e.kv.value.starts_with(b"n1:") {
            got.push(e.kv.mod_revision);
        }
    }
    assert_eq!(got, wanted);
}

/// An indexed watch whose value stays quiet tells its progress: how far it has been handed
/// everything it wants (so its resourceVersion stays recent).
#[tokio::test]
async fn a_quiet_indexed_watch_tells_its_progress() {
    let dir = tempfile::tempdir().unwrap();
    let store = Embedded::open(dir.path()).unwrap();
    index_by_node(&store);
    let mut quiet = store.watch_where("/p/", 0, "n1").await.unwrap();
    let mut last = 0;
    for i in 0..20 {
        last = store
            .create(&format!("/p/{i}"), b("n2:x"))
            .await
            .unwrap()
            .mod_revision;
    }
    let e = tokio::time::timeout(Duration::from_secs(10), quiet.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(e.kind, EventKind::Progress);
    assert_eq!(e.revision(), last);
    assert!(e.kv.key.is_empty());
}

/// The keys an indexed read of `value` hands over.
async fn keys_where(store: &Embedded, prefix: &str, value: &str) -> Vec<String> {
    let page = store
        .range_where(RangeRequest::prefix(prefix), value)
        .await
        .unwrap()
        .expect("an index covers the prefix");
    page.kvs.into_iter().map(|kv| kv.key).collect()
}

/// A read of one value of an index (a kubelet's LIST of its node's pods) hands over that
/// value's keys as they are now: the ones stored before the index was made, the ones written
/// since, moved, deleted, and after the store is opened again. Reads of older revisions and
/// of prefixes no index covers are left to a plain range.
#[tokio::test]
async fn an_indexed_read_finds_its_values_keys_before_and_after_writes_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Embedded::open(dir.path()).unwrap();
    store.create("/p/a/1", b("n1:x")).await.unwrap();
    store.create("/p/a/2", b("n2:x")).await.unwrap();
    index_by_node(&store);
    store.create("/p/b/3", b("n1:x")).await.unwrap();
    let moved = store.create("/p/b/4", b("n2:x")).await.unwrap();
    store.create("/q/5", b("n1:x")).await.unwrap();
    assert_eq!(keys_where(&store, "/p/", "n1").await, ["/p/a/1", "/p/b/3"]);
    assert_eq!(keys_where(&store, "/p/b/", "n1").await, ["/p/b/3"]);

    store
        .update("/p/b/4", b("n1:y"), moved.mod_revision)
        .await
        .unwrap();
    store.delete("/p/a/1", None).await.unwrap();
    assert_eq!(keys_where(&store, "/p/", "n1").await, ["/p/b/3", "/p/b/4"]);
    assert_eq!(keys_where(&store, "/p/", "n2").await, ["/p/a/2"]);
    let page = store
        .range_where(
            RangeRequest {
                limit: 1,
                ..RangeRequest::prefix("/p/")
            },
            "n1",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(page.kvs.len(), 1);
    assert!(page.more);
    assert_eq!(page.revision, store.current_revision().await.unwrap());

    let older = RangeRequest {
        revision: moved.mod_revision,
        ..RangeRequest::prefix("/p/")
    };
    assert!(store.range_where(older, "n1").await.unwrap().is_none());
    assert!(
        store
            .range_where(RangeRequest::prefix("/q/"), "n1")
            .await
            .unwrap()
            .is_none()
    );

    store.close().await.unwrap();
    let store = Embedded::open(dir.path()).unwrap();
    index_by_node(&store);
    assert_eq!(keys_where(&store, "/p/", "n1").await, ["/p/b/3", "/p/b/4"]);
}

/// While writers move keys between values, every indexed read holds exactly the keys of its
/// value at the revision it reports (after its caller's filter), as a plain range at that
/// revision does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_reads_agree_with_plain_ranges_while_keys_move() {
    let dir = tempfile::tempdir().unwrap();
    let store = Embedded::open(dir.path()).unwrap();
    index_by_node(&store);
    for i in 0..20 {
        store
            .create(&format!("/p/{i:02}"), b(&format!("n{}:0", i % 3)))
            .await
            .unwrap();
    }
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for round in 0..150usize {
                    let key = format!("/p/{:02}", (round * 7 + w * 5) % 20);
                    let Some(cur) = store.get(&key).await.unwrap() else {
                        continue;
                    };
                    let value = b(&format!("n{}:{round}", (round + w) % 3));
                    let _ = store.update(&key, value, cur.mod_revision).await;
                }
            })
        })
        .collect();
    let mut reads = 0;
    while writers.iter().any(|w| !w.is_finished()) || reads < 20 {
        let page = store
            .range_where(RangeRequest::prefix("/p/"), "n1")
            .await
            .unwrap()
            .unwrap();
        let indexed: Vec<String> = page
            .kvs
            .into_iter()
            .filter(|kv| kv.value.starts_with(b"n1:"))
            .map(|kv| kv.key)
            .collect();
        let at = RangeRequest {
            revision: page.revision,
            ..RangeRequest::prefix("/p/")
        };
        let plain: Vec<String> = store
            .range(at)
            .await
            .unwrap()
            .kvs
            .into_iter()
            .filter(|kv| kv.value.starts_with(b"n1:"))
            .map(|kv| kv.key)
            .collect();
        assert_eq!(indexed, plain, "at revision {}", page.revision);
        reads += 1;
    }
    for w in writers {
        w.await.unwrap();
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

/// Opens the folder once the last process-local handle of the store is gone (a dropped store's
/// writer thread lets go of the file a moment later).
async fn reopen(dir: &std::path::Path, wal: bool) -> Embedded {
    let opts = EmbeddedOptions {
        wal,
        // No checkpoint while the test runs: what is written stays in the log.
        checkpoint_every: Duration::from_secs(3600),
        ..Default::default()
    };
    for _ in 0..200 {
        match Embedded::open_with(dir, opts.clone()) {
            Ok(store) => return store,
            Err(Error::Open { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("reopen: {e}"),
        }
    }
    panic!("the store was not released");
}

#[tokio::test]
async fn a_store_changes_engine_both_ways_and_keeps_every_write() {
    let dir = tempfile::tempdir().unwrap();
    // Written by the engine before the write-ahead log (a durable redb commit per batch).
    let store = reopen(dir.path(), false).await;
    let a = store.create("/r/a", b("1")).await.unwrap();
    store.create("/r/b", b("1")).await.unwrap();
    store.close().await.unwrap();
    assert!(!dir.path().join("store.wal").exists());

    // Opened with the log: the old data is there; new writes go to the log, and the store is
    // dropped without a close, so they are only in the log.
    let store = reopen(dir.path(), true).await;
    assert_eq!(store.get("/r/a").await.unwrap().unwrap(), a);
    let a2 = store.update("/r/a", b("2"), a.mod_revision).await.unwrap();
    let c = store.create("/r/c", b("1")).await.unwrap();
    store.delete("/r/b", None).await.unwrap();
    let revision = store.current_revision().await.unwrap();
    let logged = std::fs::metadata(dir.path().join("store.wal"))
        .unwrap()
        .len();
    assert!(logged > 0, "the writes are in the log");
    drop(store);

    // Back on the engine before: the log is applied, then removed.
    let store = reopen(dir.path(), false).await;
    assert!(!dir.path().join("store.wal").exists());
    assert_eq!(store.current_revision().await.unwrap(), revision);
    assert_eq!(store.get("/r/a").await.unwrap().unwrap(), a2);
    assert_eq!(store.get("/r/c").await.unwrap().unwrap(), c);
    assert!(store.get("/r/b").await.unwrap().is_none());
    let mut w = store.watch("/r/", a2.mod_revision).await.unwrap();
    for want in [a2.mod_revision, c.mod_revision, revision] {
        assert_eq!(w.next().await.unwrap().unwrap().kv.mod_revision, want);
    }
    store.close().await.unwrap();
}

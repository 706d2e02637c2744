//! Crash safety of the embedded store: a child process writes as fast as it can and prints
//! each acknowledged write; it is killed with SIGKILL at a random moment; the reopened store
//! must hold every acknowledged write. Twenty runs in a row on the same file.
//!
//! Every fourth run also leaves a torn record at the end of the write-ahead log, as a crash in
//! the middle of an append does (a frame promising more bytes than follow, or bytes that fail
//! their checksum): the store must cut it and still hold every acknowledged write.

use minik8s_storage::{Embedded, RangeRequest, Store};
use rand::Rng;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill_twenty_times_in_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let mut created: Vec<String> = Vec::new();
    let mut counters: HashMap<String, u64> = HashMap::new();
    let wal = dir.path().join("store.wal");
    let (mut replays, mut torn) = (0, 0);
    for run in 0..20 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_storage-crash-writer"))
            .arg(dir.path())
            .arg(run.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the writer");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        out.read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready", "writer failed to start on run {run}");
        let wait = rand::rng().random_range(50..600);
        std::thread::sleep(Duration::from_millis(wait));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        let complete = match rest.rfind('\n') {
            Some(end) => &rest[..end],
            None => "",
        };
        let mut acked = 0;
        for line in complete.lines() {
            let parts: Vec<_> = line.split(' ').collect();
            match parts.as_slice() {
                ["c", key] => created.push((*key).to_owned()),
                ["u", key, n] => {
                    let n: u64 = n.parse().unwrap();
                    let e = counters.entry((*key).to_owned()).or_default();
                    *e = (*e).max(n);
                }
                _ => panic!("unexpected line {line:?}"),
            }
            acked += 1;
        }
        assert!(
            acked > 0,
            "run {run}: the writer acknowledged nothing in {wait} ms"
        );

        let logged = std::fs::metadata(&wal).map_or(0, |m| m.len());
        if logged > 0 {
            replays += 1;
        }
        if run % 4 == 3 {
            let mut file = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
            let tail: Vec<u8> = if run % 8 == 3 {
                // A frame that promises 4,000 bytes, then a crash after 100 of them.
                let mut t = 4000u32.to_le_bytes().to_vec();
                t.extend_from_slice(&0x1234_5678u32.to_le_bytes());
                t.extend(std::iter::repeat_n(7u8, 100));
                t
            } else {
                // A whole frame whose payload does not match its checksum.
                let mut t = 20u32.to_le_bytes().to_vec();
                t.extend_from_slice(&0u32.to_le_bytes());
                t.extend(std::iter::repeat_n(1u8, 20));
                t
            };
            std::io::Write::write_all(&mut file, &tail).unwrap();
            torn += 1;
        }
        let store = Embedded::open(dir.path()).expect("the store reopens cleanly after SIGKILL");
        assert_eq!(
            std::fs::metadata(&wal).unwrap().len(),
            0,
            "run {run}: the log is applied and emptied on open"
        );
        for key in &created {
            let kv = store.get(key).await.unwrap();
            let kv = kv.unwrap_or_else(|| panic!("run {run}: acknowledged {key} is lost"));
            assert!(
                kv.value.starts_with(key.as_bytes()),
                "run {run}: {key} has a wrong value"
            );
        }
        for (key, n) in &counters {
            let kv = store.get(key).await.unwrap().expect("counter present");
            let stored: u64 = std::str::from_utf8(&kv.value).unwrap().parse().unwrap();
            assert!(
                stored >= *n,
                "run {run}: {key} is {stored}, acknowledged {n}"
            );
        }
        let all = store.range(RangeRequest::prefix("/crash/")).await.unwrap();
        assert!(all.kvs.len() >= created.len());
        assert!(store.current_revision().await.unwrap() >= (created.len() + counters.len()) as i64);
        store.close().await.unwrap();
        eprintln!(
            "run {run}: killed after {wait} ms, {acked} acknowledged writes, {logged} bytes of \
             log to apply, all present"
        );
    }
    assert!(
        replays > 0,
        "no run was killed with batches only in the write-ahead log; the replay went untested"
    );
    assert_eq!(torn, 5);
}

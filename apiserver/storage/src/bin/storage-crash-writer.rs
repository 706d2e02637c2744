//! Test helper for the crash test: writes to the embedded store in `argv[1]` from 16 tasks as
//! fast as it can and prints one line per acknowledged write (`c KEY` for a create,
//! `u KEY N` for a counter update to N) until it is killed.

use bytes::Bytes;
use minik8s_storage::{Embedded, Error, Store};
use std::io::Write;
use std::sync::{Arc, Mutex};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: storage-crash-writer DIR");
    let run = std::env::args().nth(2).unwrap_or_else(|| "0".into());
    let store = Embedded::open(&dir)?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    {
        let mut o = out.lock().unwrap();
        writeln!(o, "ready")?;
        o.flush()?;
    }
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (store, out, run) = (store.clone(), out.clone(), run.clone());
            tokio::spawn(async move {
                let counter = format!("/crash/counter/{t}");
                let mut i = 0u64;
                loop {
                    i += 1;
                    let line = if i.is_multiple_of(4) {
                        // A compare-and-swap increment of this task's counter.
                        let cur = store.get(&counter).await?;
                        let (n, res) = match cur {
                            None => (1, store.create(&counter, Bytes::from("1")).await),
                            Some(cur) => {
                                let n: u64 = std::str::from_utf8(&cur.value)?.parse()?;
                                let v = Bytes::from((n + 1).to_string());
                                (n + 1, store.update(&counter, v, cur.mod_revision).await)
                            }
                        };
                        match res {
                            Ok(_) => format!("u {counter} {n}"),
                            Err(Error::AlreadyExists { .. } | Error::Conflict { .. }) => continue,
                            Err(e) => return Err(e.into()),
                        }
                    } else {
                        let key = format!("/crash/{run}/{t}/{i}");
                        store
                            .create(&key, Bytes::from(format!("{key}:{}", "x".repeat(200))))
                            .await?;
                        format!("c {key}")
                    };
                    let mut o = out.lock().unwrap();
                    writeln!(o, "{line}")?;
                    o.flush()?;
                }
                #[allow(unreachable_code)]
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(())
}

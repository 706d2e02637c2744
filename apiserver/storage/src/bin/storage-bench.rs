//! `storage-bench`: prints the storage micro-benchmark figures for each backend as JSON lines.

use clap::Parser;
use minik8s_storage::bench::{self, Plan};
use minik8s_storage::testing::TestEtcd;
use minik8s_storage::{Embedded, EmbeddedOptions, Storage, Store};

/// Storage micro-benchmark: sequential and concurrent creates, range, watch delivery, churn.
#[derive(Parser, Debug)]
struct Args {
    /// Which backends to measure.
    #[arg(long, value_enum, default_value = "all", env = "STORAGE_BENCH_BACKEND")]
    backend: Which,
    /// Creates spread over the concurrent writers.
    #[arg(long, default_value_t = 40_000, env = "STORAGE_BENCH_CONCURRENT")]
    concurrent: usize,
    /// Updates of the churn run on the embedded store (0 skips it).
    #[arg(long, default_value_t = 1_000_000, env = "STORAGE_BENCH_CHURN")]
    churn: usize,
    /// Keys the churn run updates.
    #[arg(long, default_value_t = 1_000)]
    churn_keys: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Which {
    All,
    /// Both engines of the embedded store.
    Embedded,
    /// Only the embedded store with its write-ahead log.
    EmbeddedWal,
    Etcd,
}

/// Bytes of the files in a folder (the store's data on disk).
fn dir_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let plan = Plan {
        concurrent: args.concurrent,
        ..Plan::default()
    };
    // The embedded store's two engines side by side: the write-ahead log (the default) and a
    // durable redb commit per batch (the engine before it).
    let engines = [("embedded", true), ("embedded-redb-commit", false)];
    for (name, wal) in engines {
        if args.backend == Which::Etcd || (args.backend == Which::EmbeddedWal && !wal) {
            continue;
        }
        let options = || EmbeddedOptions {
            wal,
            ..EmbeddedOptions::default()
        };
        let dir = tempfile::tempdir()?;
        let store = Storage::Embedded(Embedded::open_with(dir.path(), options())?);
        let report = bench::run(name, &store, &plan).await?;
        println!("{}", serde_json::to_string(&report)?);
        store.close().await?;
        if args.churn > 0 {
            let dir = tempfile::tempdir()?;
            let store = Embedded::open_with(dir.path(), options())?;
            let mut report = bench::churn(&store, args.churn_keys, args.churn, 16, 300).await?;
            report.writer = Some(store.stats());
            store.close().await?;
            report.file_mib = (dir_bytes(dir.path())? as f64 / 1048576.0 * 10.0).round() / 10.0;
            println!("{}", serde_json::json!({"backend": name, "churn": report}));
        }
    }
    if matches!(args.backend, Which::All | Which::Etcd) {
        let etcd = TestEtcd::start().await?;
        let store = Storage::Etcd(etcd.connect().await?);
        let report = bench::run("etcd", &store, &plan).await?;
        println!("{}", serde_json::to_string(&report)?);
        let _ = store.current_revision().await?;
    }
    Ok(())
}

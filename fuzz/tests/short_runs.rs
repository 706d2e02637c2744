//! Each target fuzzed briefly on a copy of its seed corpus, by the fuzz binary as the test
//! suite builds it: libFuzzer's mutations, without coverage guidance (the instrumented build,
//! `hack/fuzz.sh`, needs the nightly toolchain and a second build of the tree). The seed is
//! fixed and the runs counted, so CI repeats the same inputs (at most 20,000 a target, within
//! 5 s); other seeds are `hack/fuzz.sh`'s to explore. A crash fails the test with libFuzzer's
//! report; the input belongs in `fuzz/regressions/<target>/` with the fix (a crash libFuzzer
//! cannot catch, a stack overflow, leaves none: run the binary with `MINIK8S_FUZZ_LAST=FILE`,
//! which writes each input there first).

use std::path::Path;
use std::process::Command;

/// Seconds each target runs.
const SECONDS: u32 = 5;

#[test]
fn each_target_fuzzed_for_a_few_seconds_crashes_nowhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, _) in minik8s_fuzz::TARGETS {
        let work = tempfile::tempdir().expect("a temporary folder");
        let corpus = work.path().join("corpus");
        std::fs::create_dir(&corpus).expect("the corpus folder");
        for seed in std::fs::read_dir(root.join("corpus").join(name)).expect("a seed corpus") {
            let seed = seed.expect("a seed").path();
            std::fs::copy(&seed, corpus.join(seed.file_name().expect("a name")))
                .expect("a seed copied");
        }
        let out = Command::new(env!("CARGO_BIN_EXE_fuzz"))
            .env("MINIK8S_FUZZ_TARGET", name)
            .arg(&corpus)
            .arg(format!("-max_total_time={SECONDS}"))
            .arg("-seed=1")
            .arg("-runs=20000")
            .arg("-rss_limit_mb=4096")
            .arg("-timeout=10")
            .arg("-print_final_stats=1")
            .arg(format!("-artifact_prefix={}/", work.path().display()))
            .output()
            .expect("the fuzzer runs");
        let log = String::from_utf8_lossy(&out.stderr);
        let runs = log
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .map(str::trim)
            .unwrap_or("?");
        println!("{name}: {runs} inputs in {SECONDS} s");
        assert!(
            out.status.success(),
            "{name} crashed:\n{}",
            log.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

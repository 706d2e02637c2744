//! Every fuzz target's seed corpus and every input a fuzzer ever crashed on (its
//! `regressions/<target>/` folder, kept with the fix) run through the target again: a
//! panic here is a regression. `hack/fuzz.sh` does the fuzzing itself.

use std::path::Path;

fn inputs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.file_name().is_none_or(|n| n != ".keep"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn every_corpus_input_and_every_past_crash_runs_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ran = 0;
    for (name, target) in minik8s_fuzz::TARGETS {
        let seeds = inputs(&root.join("corpus").join(name));
        assert!(!seeds.is_empty(), "{name} has no seed corpus");
        for file in seeds
            .into_iter()
            .chain(inputs(&root.join("regressions").join(name)))
        {
            let data = std::fs::read(&file).expect("a corpus file");
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(
                outcome.is_ok(),
                "{name} panicked on {}",
                file.strip_prefix(root).unwrap_or(&file).display()
            );
            ran += 1;
        }
    }
    println!("{ran} inputs ran clean");
}

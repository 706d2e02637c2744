#![no_main]
//! Every target in one fuzzer: `MINIK8S_FUZZ_TARGET` names the one it runs
//! (`minik8s_fuzz::TARGETS`). One binary, so the instrumented build links once and the test
//! suite's short runs need no second build.

use std::sync::OnceLock;

fn chosen() -> minik8s_fuzz::Target {
    static CHOSEN: OnceLock<minik8s_fuzz::Target> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let name = std::env::var("MINIK8S_FUZZ_TARGET").unwrap_or_default();
        minik8s_fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = minik8s_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
            panic!(
                "MINIK8S_FUZZ_TARGET={name:?} names no target (one of {})",
                names.join(", ")
            )
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // For a crash libFuzzer cannot catch (a stack overflow): each input written first.
    static LAST: OnceLock<Option<std::ffi::OsString>> = OnceLock::new();
    if let Some(path) = LAST.get_or_init(|| std::env::var_os("MINIK8S_FUZZ_LAST")) {
        let _ = std::fs::write(path, data);
    }
    chosen()(data)
});

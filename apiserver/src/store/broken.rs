//! Deliberately broken modes, for the linearizability checker's own test that it can fail:
//! with `MINIK8S_TEST_BREAK_READS=stale` in the apiserver's environment, about one GET in
//! five of an object that changed since it was last served is answered with the version
//! served before, as a stale cache would; with `MINIK8S_TEST_BREAK_READS=drop-events`, a
//! watch leaves out about one event in twenty, as a lossy fan-out would. Off unless that
//! variable says so; the apiserver warns at its start when one is on.

use minik8s_storage::KeyValue;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The environment variable that turns it on.
pub const VARIABLE: &str = "MINIK8S_TEST_BREAK_READS";

/// The broken mode asked for, if any.
pub fn mode() -> Option<&'static str> {
    static MODE: OnceLock<Option<String>> = OnceLock::new();
    MODE.get_or_init(|| {
        std::env::var(VARIABLE)
            .ok()
            .filter(|v| v == "stale" || v == "drop-events")
    })
    .as_deref()
}

/// Whether GETs may be served stale.
fn stale_reads() -> bool {
    mode() == Some("stale")
}

/// Whether a watch leaves this event out.
pub fn drop_event() -> bool {
    mode() == Some("drop-events") && rand::random_range(0..20) == 0
}

/// What a GET of `fresh` serves: `fresh`, or in the broken mode sometimes the version of the
/// key served before it.
pub fn serve(fresh: KeyValue) -> KeyValue {
    if !stale_reads() {
        return fresh;
    }
    static LAST: OnceLock<Mutex<HashMap<String, KeyValue>>> = OnceLock::new();
    let mut last = LAST
        .get_or_init(Mutex::default)
        .lock()
        .expect("last served");
    match last.get(&fresh.key) {
        Some(before)
            if before.mod_revision < fresh.mod_revision && rand::random_range(0..5) == 0 =>
        {
            before.clone()
        }
        _ => {
            last.insert(fresh.key.clone(), fresh.clone());
            fresh
        }
    }
}

//! Expectations, as upstream's `ControllerExpectations`: the pods a controller created or
//! deleted but has not yet seen through its informer. Until they are seen (or 30 s pass) the
//! controller does not act on the cache again, which would otherwise still show the world
//! before its own writes and make it create or delete twice.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Creations and deletions made but not yet seen through the informer, per owner uid.
#[derive(Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, (HashSet<String>, Instant)>>,
}

impl Expectations {
    /// Records that these pods (by name) are about to appear or disappear.
    pub fn expect(&self, owner: &str, names: impl IntoIterator<Item = String>) {
        let mut p = self.pending.lock().expect("expectations");
        let e = p
            .entry(owner.to_owned())
            .or_insert_with(|| (HashSet::new(), Instant::now()));
        e.0.extend(names);
        e.1 = Instant::now();
    }

    /// Forgets one expectation (the call failed).
    pub fn forget(&self, owner: &str, name: &str) {
        if let Some(e) = self.pending.lock().expect("expectations").get_mut(owner) {
            e.0.remove(name);
        }
    }

    /// Whether all expectations are met, given a predicate telling which are observed;
    /// they expire after 30 s as upstream's do.
    pub fn satisfied(&self, owner: &str, observed: impl Fn(&str) -> bool) -> bool {
        let mut p = self.pending.lock().expect("expectations");
        let Some((names, since)) = p.get_mut(owner) else {
            return true;
        };
        names.retain(|n| !observed(n));
        if names.is_empty() || since.elapsed() > Duration::from_secs(30) {
            p.remove(owner);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations_hold_until_observed_or_expired() {
        let e = Expectations::default();
        e.expect("rs", ["a".to_owned(), "b".to_owned()]);
        assert!(!e.satisfied("rs", |n| n == "a"));
        assert!(e.satisfied("rs", |n| n == "b"));
        assert!(e.satisfied("other", |_| false));
    }
}

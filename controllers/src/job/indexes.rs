//! Indexed Jobs: the completion index of a pod, and sets of indexes written as upstream's
//! interval lists (`status.completedIndexes: "0,2-4"`).

use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeSet;

/// The annotation (and label) that carries a pod's completion index.
pub const INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The annotation that counts the failures of a pod's index before it (backoffLimitPerIndex).
pub const FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// The environment variable a pod reads its index from.
pub const ENV: &str = "JOB_COMPLETION_INDEX";

/// A pod's completion index, if it has a valid one below `completions`.
pub fn of(pod: &Pod, completions: i32) -> Option<i32> {
    let from = |m: Option<&std::collections::BTreeMap<String, String>>| {
        m.and_then(|m| m.get(INDEX))
            .and_then(|v| v.parse::<i32>().ok())
    };
    from(pod.metadata.annotations.as_ref())
        .or_else(|| from(pod.metadata.labels.as_ref()))
        .filter(|i| (0..completions).contains(i))
}

/// How many failures of its index came before this pod.
pub fn failure_count(pod: &Pod) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FAILURE_COUNT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A set of completion indexes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Indexes(pub BTreeSet<i32>);

impl Indexes {
    /// Parses an interval list (`"1,3-5"`), keeping indexes below `completions`; parts that
    /// do not parse are skipped, as upstream's `parseIndexesFromString`.
    pub fn parse(text: &str, completions: i32) -> Self {
        let mut set = BTreeSet::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.parse::<i32>(), b.parse::<i32>()),
                None => (part.parse::<i32>(), part.parse::<i32>()),
            };
            if let (Ok(lo), Ok(hi)) = (lo, hi) {
                set.extend((lo.max(0)..=hi.min(completions - 1)).filter(|i| *i >= lo));
            }
        }
        Indexes(set)
    }

    /// How many indexes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `i` is in the set.
    pub fn contains(&self, i: i32) -> bool {
        self.0.contains(&i)
    }
}

impl std::fmt::Display for Indexes {
    /// The interval list as upstream writes it: runs of three or more as `a-c`, a pair as
    /// `a,b`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut runs: Vec<(i32, i32)> = Vec::new();
        for &i in &self.0 {
            match runs.last_mut() {
                Some((_, hi)) if *hi + 1 == i => *hi = i,
                _ => runs.push((i, i)),
            }
        }
        let parts: Vec<String> = runs
            .into_iter()
            .map(|(lo, hi)| match hi - lo {
                0 => lo.to_string(),
                1 => format!("{lo},{hi}"),
                _ => format!("{lo}-{hi}"),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_lists_read_and_write_as_upstreams() {
        let s = Indexes::parse("0,2-4, 7,x,9-8", 8);
        assert_eq!(s.0.iter().copied().collect::<Vec<_>>(), [0, 2, 3, 4, 7]);
        assert_eq!(s.to_string(), "0,2-4,7");
        assert_eq!(Indexes::parse("", 3).to_string(), "");
        assert_eq!(Indexes::parse("0-1", 3).to_string(), "0,1");
        assert_eq!(Indexes::parse("0-10", 3).to_string(), "0-2");
    }
}

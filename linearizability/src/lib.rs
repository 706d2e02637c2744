//! A linearizability checker for histories of Kubernetes API calls, as etcd's robustness
//! tests check theirs with porcupine: every call has a start and an end (or none, when its
//! client never heard back), and the history is linearizable when each call can be placed at
//! one instant within its interval so that the calls, in that order, are what one object
//! store would have answered.
//!
//! The model is one object per key, as the API serves it: `create` (409 when it exists),
//! `update` with an optional resourceVersion precondition (409 on a stale one), `delete`,
//! and `get`; every acknowledged write has a resourceVersion above every earlier one of the
//! key. A call whose answer was lost may have taken effect or not, at any time after it
//! started. Keys are independent, so each key's calls are checked on their own (Lowe's
//! search with memoized states, as porcupine does); [`check`] also checks what spans keys:
//! resourceVersions are unique and rise in real time, and a list is a snapshot no older than
//! the writes acknowledged before it began.
//!
//! Watches are checked as etcd's robustness tests check theirs: each watcher is a chain of
//! watch calls (an informer: a list, then watches that resume at the last resourceVersion
//! seen, a new list after a 410). Its events must come in rising resourceVersion order after
//! where it started, each must be a write that a call made (the acknowledged write at that
//! resourceVersion, or a call whose answer was lost), one resourceVersion must be the same
//! change in every watch, the events must be a possible life of each object from the list
//! on (no ADDED of an object that exists, no MODIFIED or DELETED of one that does not), and a
//! watch must deliver every acknowledged write between where it started and the last
//! resourceVersion it reached. A lost write that a watch delivered did happen: the history's
//! calls are checked with that answer.

pub mod record;

use std::collections::{BTreeMap, HashMap, HashSet};

/// Nanoseconds since the history began.
pub type Time = u64;

/// What a call asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Input {
    /// Create the object with this value.
    Create { value: u64 },
    /// Replace its value, if its resourceVersion is `precondition` (when given).
    Update {
        value: u64,
        precondition: Option<u64>,
    },
    /// Delete it.
    Delete,
    /// Read it.
    Get,
}

/// What the call answered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// A create or update, acknowledged at this resourceVersion.
    Written { rv: u64 },
    /// A delete, acknowledged.
    Deleted,
    /// A read: the object at this resourceVersion with this value.
    Found { rv: u64, value: u64 },
    /// 404.
    NotFound,
    /// 409 on a create.
    AlreadyExists,
    /// 409 on an update whose precondition failed.
    Conflict,
    /// No answer (a time-out, a lost connection): it may have happened or not.
    Unknown,
}

/// One call on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub key: String,
    pub input: Input,
    pub output: Output,
    pub call: Time,
    /// `None` when the client never heard back.
    pub ret: Option<Time>,
}

/// A list of every key under one prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct List {
    pub prefix: String,
    /// The list's resourceVersion.
    pub rv: u64,
    /// Each item: its key, resourceVersion and value.
    pub items: Vec<(String, u64, u64)>,
    pub call: Time,
    pub ret: Time,
}

/// What a watch event said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    /// A bookmark: everything up to its resourceVersion was sent.
    Bookmark,
}

/// One event as a watcher received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventType,
    /// The object's key (empty for a bookmark).
    pub key: String,
    pub rv: u64,
    /// The object's value (for a deletion, its last; 0 for a bookmark).
    pub value: u64,
    /// When it arrived.
    pub at: Time,
}

/// One watch call of a watcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    /// The watcher it belongs to: its calls follow one another.
    pub watcher: usize,
    /// What it watches: every key under this prefix.
    pub prefix: String,
    /// The resourceVersion it started from.
    pub from: u64,
    /// The list it started from; `None` when it resumed where the watcher's call before it
    /// ended.
    pub listed: Option<List>,
    pub events: Vec<WatchEvent>,
    pub call: Time,
}

/// A recorded history: calls, lists and watches.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub ops: Vec<Operation>,
    pub lists: Vec<List>,
    pub watches: Vec<Watch>,
}

impl History {
    /// Calls recorded (lists and watch calls included).
    pub fn len(&self) -> usize {
        self.ops.len() + self.lists.len() + self.watches.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls that got no answer.
    pub fn unanswered(&self) -> usize {
        self.ops.iter().filter(|o| o.ret.is_none()).count()
    }

    /// What was recorded, in one line: calls, lists, watch calls and their events, and calls
    /// unanswered.
    pub fn summary(&self) -> String {
        format!(
            "{} calls ({} lists, {} watch calls delivering {} events, {} unanswered)",
            self.len(),
            self.lists.len(),
            self.watches.len(),
            self.events(),
            self.unanswered()
        )
    }

    /// Events the watches delivered (bookmarks not counted).
    pub fn events(&self) -> usize {
        self.watches
            .iter()
            .flat_map(|w| &w.events)
            .filter(|e| e.kind != EventType::Bookmark)
            .count()
    }
}

/// Why a history is not linearizable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// No order of this key's calls explains their answers.
    Key {
        key: String,
        /// The call the search could not place, at its deepest.
        stuck: Operation,
    },
    /// Two acknowledged writes share a resourceVersion.
    DuplicateVersion { rv: u64, keys: (String, String) },
    /// A write acknowledged before another began has the higher resourceVersion.
    VersionsBackwards {
        earlier: Operation,
        later: Operation,
    },
    /// A list older than a write acknowledged before the list began, or with an item newer
    /// than itself.
    StaleList {
        list: List,
        write: Option<Operation>,
    },
    /// A watch delivered something no history explains, or missed a write.
    Watch {
        watcher: usize,
        /// Where the watch call started.
        from: u64,
        event: Option<WatchEvent>,
        why: String,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::Key { key, stuck } => write!(
                f,
                "{key}: no linearization explains {:?} answered {:?}",
                stuck.input, stuck.output
            ),
            Violation::DuplicateVersion { rv, keys } => {
                write!(
                    f,
                    "resourceVersion {rv} acknowledged for {} and {}",
                    keys.0, keys.1
                )
            }
            Violation::VersionsBackwards { earlier, later } => write!(
                f,
                "{} was acknowledged at {:?} before {} began, which got {:?}",
                earlier.key, earlier.output, later.key, later.output
            ),
            Violation::StaleList { list, write } => write!(
                f,
                "a list of {} at resourceVersion {} misses {write:?}",
                list.prefix, list.rv
            ),
            Violation::Watch {
                watcher,
                from,
                event,
                why,
            } => write!(
                f,
                "watcher {watcher}'s watch from resourceVersion {from}: {why} ({event:?})"
            ),
        }
    }
}

/// Violations, one a line.
pub fn describe(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// One key's state in the model: its current version (a resourceVersion not known when it
/// came from a write whose answer was lost) and value, and the highest resourceVersion it
/// ever had.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    current: Option<(Option<u64>, u64)>,
    floor: u64,
}

/// Whether the current version can be resourceVersion `rv`.
fn version_is(current: Option<u64>, floor: u64, rv: u64) -> bool {
    match current {
        Some(c) => c == rv,
        None => rv > floor,
    }
}

/// The states one call can lead to from `s` given its answer (none: it cannot happen there).
fn step(s: &State, input: &Input, output: &Output) -> Vec<State> {
    let same = || vec![s.clone()];
    let write = |rv: u64, value: u64| State {
        current: Some((Some(rv), value)),
        floor: rv,
    };
    let lost_write = |value: u64| State {
        current: Some((None, value)),
        floor: s.floor,
    };
    match (input, output) {
        (Input::Create { value }, Output::Written { rv })
            if s.current.is_none() && *rv > s.floor =>
        {
            vec![write(*rv, *value)]
        }
        (Input::Create { .. }, Output::AlreadyExists) if s.current.is_some() => same(),
        (Input::Create { value }, Output::Unknown) => {
            let mut next = same();
            if s.current.is_none() {
                next.push(lost_write(*value));
            }
            next
        }
        (
            Input::Update {
                value,
                precondition,
            },
            out,
        ) => {
            let Some((crv, _)) = s.current else {
                return match out {
                    Output::NotFound | Output::Unknown => same(),
                    _ => vec![],
                };
            };
            let may_match = precondition.is_none_or(|p| version_is(crv, s.floor, p));
            let may_differ = precondition.is_some_and(|p| crv != Some(p));
            match out {
                Output::Written { rv } if may_match && *rv > s.floor => vec![write(*rv, *value)],
                Output::Conflict if may_differ => same(),
                Output::Unknown => {
                    let mut next = same();
                    if may_match {
                        next.push(lost_write(*value));
                    }
                    next
                }
                _ => vec![],
            }
        }
        (Input::Delete, Output::Deleted) if s.current.is_some() => vec![State {
            current: None,
            floor: s.floor,
        }],
        (Input::Delete, Output::NotFound) if s.current.is_none() => same(),
        (Input::Delete, Output::Unknown) => {
            let mut next = same();
            if s.current.is_some() {
                next.push(State {
                    current: None,
                    floor: s.floor,
                });
            }
            next
        }
        (Input::Get, Output::Found { rv, value }) => match s.current {
            Some((crv, v)) if v == *value && version_is(crv, s.floor, *rv) => vec![write(*rv, v)],
            _ => vec![],
        },
        (Input::Get, Output::NotFound) if s.current.is_none() => same(),
        (Input::Get, Output::Unknown) => same(),
        _ => vec![],
    }
}

/// One event of a key's history: a call starting or returning.
#[derive(Clone, Copy, Debug)]
struct Event {
    op: usize,
    returns: bool,
}

/// Whether one key's calls are linearizable; the call it could not place otherwise.
fn check_key(ops: &[Operation]) -> Result<(), Operation> {
    if ops.is_empty() {
        return Ok(());
    }
    // Calls before returns at the same instant: calls that touch are concurrent.
    let mut events: Vec<(Time, bool, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, o) in ops.iter().enumerate() {
        events.push((o.call, false, i));
        events.push((o.ret.unwrap_or(Time::MAX), true, i));
    }
    events.sort();
    let events: Vec<Event> = events
        .into_iter()
        .map(|(_, returns, op)| Event { op, returns })
        .collect();
    let n = events.len();
    // A doubly linked list over the events, with a head sentinel at index n.
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { n } else { i - 1 }).collect();
    next.push(0);
    prev.push(n);
    let end = n; // `next` of the last event points past the end (== n, the sentinel).
    next[n - 1] = end;
    let mut ret_of = vec![0usize; ops.len()];
    for (i, e) in events.iter().enumerate() {
        if e.returns {
            ret_of[e.op] = i;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = q;
        if q != end {
            prev[q] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = i;
        if q != end {
            prev[q] = i;
        }
    };
    let words = ops.len().div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, State)> = HashSet::new();
    // Each frame: the call event placed, the state before it, the alternatives left.
    let mut stack: Vec<(usize, State, Vec<State>)> = Vec::new();
    let mut state = State {
        current: None,
        floor: 0,
    };
    let mut deepest = (0usize, 0usize);
    let mut at = next[n];
    let mut pending: Option<Vec<State>> = None;
    loop {
        if next[n] == end {
            return Ok(());
        }
        let placed = stack.len();
        if at != end && !events[at].returns {
            let op = &ops[events[at].op];
            let mut options = pending
                .take()
                .unwrap_or_else(|| step(&state, &op.input, &op.output));
            let mut moved = false;
            while let Some(candidate) = options.pop() {
                let mut bits = linearized.clone();
                bits[events[at].op / 64] |= 1 << (events[at].op % 64);
                if cache.insert((bits.clone(), candidate.clone())) {
                    stack.push((at, state.clone(), options));
                    linearized = bits;
                    state = candidate;
                    let r = ret_of[events[at].op];
                    unlink(&mut next, &mut prev, at);
                    unlink(&mut next, &mut prev, r);
                    at = next[n];
                    moved = true;
                    break;
                }
            }
            if !moved {
                at = next[at];
            }
            continue;
        }
        // A return before its call could be placed (or the end): back up one call.
        if placed >= deepest.0 && at != end {
            deepest = (placed, events[at].op);
        }
        let Some((call, before, options)) = stack.pop() else {
            return Err(ops[deepest.1].clone());
        };
        let op = events[call].op;
        linearized[op / 64] &= !(1 << (op % 64));
        relink(&mut next, &mut prev, ret_of[op]);
        relink(&mut next, &mut prev, call);
        state = before;
        if options.is_empty() {
            at = next[call];
        } else {
            at = call;
            pending = Some(options);
        }
    }
}

/// Checks a history: its watches, each key's calls (with what the watches showed of lost
/// writes), then what spans keys. Empty when linearizable.
pub fn check(history: &History) -> Vec<Violation> {
    let (mut violations, ops) = check_watches(&history.ops, &history.watches);
    violations.extend(check_calls(&ops, &history.lists));
    violations
}

/// The value a create or update wrote.
fn written_value(input: &Input) -> Option<u64> {
    match input {
        Input::Create { value } | Input::Update { value, .. } => Some(*value),
        _ => None,
    }
}

/// Checks the watches against the calls; returns what is wrong, and the calls with each lost
/// write that a watch delivered answered as written (at that resourceVersion, returned when
/// the event arrived).
fn check_watches(ops: &[Operation], watches: &[Watch]) -> (Vec<Violation>, Vec<Operation>) {
    let mut violations = Vec::new();
    let mut ops = ops.to_vec();
    let acked: BTreeMap<u64, usize> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o.output {
            Output::Written { rv } if o.ret.is_some() => Some((rv, i)),
            _ => None,
        })
        .collect();
    // Every write's value is its own: which call wrote a value.
    let by_value: HashMap<(String, u64), usize> = ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| Some(((o.key.clone(), written_value(&o.input)?), i)))
        .collect();
    let mut changes: HashMap<u64, (EventType, String, u64)> = HashMap::new();
    let mut order: Vec<&Watch> = watches.iter().collect();
    order.sort_by_key(|w| (w.watcher, w.call));
    // Each watcher's view of the objects: key → (resourceVersion, value).
    let mut views: HashMap<usize, BTreeMap<String, (u64, u64)>> = HashMap::new();
    for w in order {
        let view = views.entry(w.watcher).or_default();
        if let Some(l) = &w.listed {
            *view = l
                .items
                .iter()
                .map(|(k, rv, v)| (k.clone(), (*rv, *v)))
                .collect();
        }
        let mut bad = |event: Option<&WatchEvent>, why: String| {
            violations.push(Violation::Watch {
                watcher: w.watcher,
                from: w.from,
                event: event.cloned(),
                why,
            })
        };
        let mut last = w.from;
        let mut delivered = HashSet::new();
        for e in &w.events {
            if e.kind == EventType::Bookmark {
                if e.rv < last {
                    bad(Some(e), format!("a bookmark went back from {last}"));
                }
                last = last.max(e.rv);
                continue;
            }
            if e.rv <= last {
                bad(Some(e), format!("not after resourceVersion {last}"));
                continue;
            }
            last = e.rv;
            delivered.insert(e.rv);
            if !e.key.starts_with(&w.prefix) {
                bad(Some(e), "an object it does not watch".into());
            }
            let change = (e.kind, e.key.clone(), e.value);
            match changes.get(&e.rv) {
                Some(other) if *other != change => bad(
                    Some(e),
                    format!("another watch delivered {other:?} at this resourceVersion"),
                ),
                Some(_) => {}
                None => {
                    changes.insert(e.rv, change);
                }
            }
            // A possible life of the object from what the watcher knew.
            let before = view.get(&e.key).copied();
            match (e.kind, before) {
                (EventType::Added, Some(_)) => bad(
                    Some(e),
                    "ADDED while it exists (a DELETED was missed)".into(),
                ),
                (EventType::Modified | EventType::Deleted, None) => bad(
                    Some(e),
                    "changed while it does not exist (an ADDED was missed)".into(),
                ),
                (EventType::Deleted, Some((_, v))) if v != e.value => bad(
                    Some(e),
                    format!("DELETED with another value than the last delivered, {v}"),
                ),
                _ => {}
            }
            if e.kind == EventType::Deleted {
                view.remove(&e.key);
            } else {
                view.insert(e.key.clone(), (e.rv, e.value));
            }
            // A change some call made.
            if e.kind == EventType::Deleted {
                if acked.contains_key(&e.rv) {
                    bad(
                        Some(e),
                        "a deletion at an acknowledged write's version".into(),
                    );
                }
                let deleted = ops.iter().any(|o| {
                    o.key == e.key
                        && o.input == Input::Delete
                        && o.call <= e.at
                        && matches!(o.output, Output::Deleted | Output::Unknown)
                });
                if !deleted {
                    bad(Some(e), "no delete call explains it".into());
                }
                continue;
            }
            let Some(&i) = by_value.get(&(e.key.clone(), e.value)) else {
                bad(Some(e), "no call wrote this value".into());
                continue;
            };
            let want = match ops[i].input {
                Input::Create { .. } => EventType::Added,
                _ => EventType::Modified,
            };
            if want != e.kind {
                bad(Some(e), format!("the call was {:?}", ops[i].input));
            }
            match ops[i].output {
                Output::Written { rv } if rv == e.rv => {}
                Output::Unknown if ops[i].call <= e.at && !acked.contains_key(&e.rv) => {
                    // The lost write happened, at this version, before the event arrived.
                    ops[i].output = Output::Written { rv: e.rv };
                    ops[i].ret = Some(ops[i].ret.map_or(e.at, |r| r.min(e.at)));
                }
                ref out => bad(Some(e), format!("the call that wrote it answered {out:?}")),
            }
        }
        // Every acknowledged write it passed, delivered.
        // (A watch that saw nothing passed nothing: `from + 1..=from` is no range.)
        let passed = if last > w.from {
            acked.range(w.from + 1..=last)
        } else {
            acked.range(1..1)
        };
        for (&rv, &i) in passed {
            if ops[i].key.starts_with(&w.prefix) && !delivered.contains(&rv) {
                bad(
                    None,
                    format!(
                        "missed {}'s write acknowledged at {rv} (it reached {last})",
                        ops[i].key
                    ),
                );
            }
        }
    }
    (violations, ops)
}

/// Checks the calls and lists: each key's calls, then what spans keys.
fn check_calls(ops: &[Operation], lists: &[List]) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut by_key: BTreeMap<&str, Vec<Operation>> = BTreeMap::new();
    for o in ops {
        by_key.entry(&o.key).or_default().push(o.clone());
    }
    // A list is, for each key under its prefix, a read of that key during the list.
    for l in lists {
        let listed: BTreeMap<&str, (u64, u64)> = l
            .items
            .iter()
            .map(|(k, rv, v)| (k.as_str(), (*rv, *v)))
            .collect();
        for (key, calls) in by_key.iter_mut() {
            if !key.starts_with(&l.prefix) {
                continue;
            }
            let output = match listed.get(key) {
                Some((rv, value)) => Output::Found {
                    rv: *rv,
                    value: *value,
                },
                None => Output::NotFound,
            };
            calls.push(Operation {
                key: key.to_string(),
                input: Input::Get,
                output,
                call: l.call,
                ret: Some(l.ret),
            });
        }
        if let Some((key, rv, _)) = l.items.iter().find(|(_, rv, _)| *rv > l.rv) {
            violations.push(Violation::StaleList {
                list: l.clone(),
                write: Some(Operation {
                    key: key.clone(),
                    input: Input::Get,
                    output: Output::Found { rv: *rv, value: 0 },
                    call: l.call,
                    ret: Some(l.ret),
                }),
            });
        }
        if let Some(w) = ops.iter().find(|o| {
            o.key.starts_with(&l.prefix)
                && o.ret.is_some_and(|r| r < l.call)
                && matches!(o.output, Output::Written { rv } if rv > l.rv)
        }) {
            violations.push(Violation::StaleList {
                list: l.clone(),
                write: Some(w.clone()),
            });
        }
    }
    for (key, calls) in &by_key {
        if let Err(stuck) = check_key(calls) {
            violations.push(Violation::Key {
                key: key.to_string(),
                stuck,
            });
        }
    }
    // Acknowledged writes: unique resourceVersions, rising in real time.
    let mut writes: Vec<&Operation> = ops
        .iter()
        .filter(|o| matches!(o.output, Output::Written { .. }) && o.ret.is_some())
        .collect();
    let rv = |o: &Operation| match o.output {
        Output::Written { rv } => rv,
        _ => 0,
    };
    writes.sort_by_key(|o| rv(o));
    for w in writes.windows(2) {
        if rv(w[0]) == rv(w[1]) {
            violations.push(Violation::DuplicateVersion {
                rv: rv(w[0]),
                keys: (w[0].key.clone(), w[1].key.clone()),
            });
        }
    }
    // A write acknowledged before another began must have the lower version: walking down
    // the versions, the earliest acknowledgement above finds any such pair in one pass.
    let mut first_acked: Option<&Operation> = None;
    for w in writes.iter().rev() {
        // `w` has a lower version than every write seen so far in this walk; none of those
        // may have been acknowledged before `w` began.
        if let Some(higher) = first_acked
            && higher.ret.unwrap_or(Time::MAX) < w.call
        {
            violations.push(Violation::VersionsBackwards {
                earlier: higher.clone(),
                later: (*w).clone(),
            });
            break;
        }
        if first_acked.is_none_or(|l| w.ret < l.ret) {
            first_acked = Some(w);
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(key: &str, input: Input, output: Output, call: Time, ret: Time) -> Operation {
        Operation {
            key: key.into(),
            input,
            output,
            call,
            ret: Some(ret),
        }
    }

    fn create(v: u64) -> Input {
        Input::Create { value: v }
    }

    fn update(v: u64, p: u64) -> Input {
        Input::Update {
            value: v,
            precondition: Some(p),
        }
    }

    #[test]
    fn a_sequential_history_of_writes_and_reads_is_linearizable() {
        let h = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            op("a", Input::Get, Output::Found { rv: 10, value: 1 }, 2, 3),
            op("a", update(2, 10), Output::Written { rv: 12 }, 4, 5),
            op("a", update(3, 10), Output::Conflict, 6, 7),
            op("a", Input::Delete, Output::Deleted, 8, 9),
            op("a", Input::Get, Output::NotFound, 10, 11),
            op("a", create(4), Output::Written { rv: 20 }, 12, 13),
        ];
        assert_eq!(check_calls(&h, &[]), vec![]);
    }

    #[test]
    fn concurrent_calls_may_take_effect_in_either_order() {
        // The read overlaps the update: it may see the old value or the new one.
        let h = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            op("a", update(2, 10), Output::Written { rv: 11 }, 2, 10),
            op("a", Input::Get, Output::Found { rv: 10, value: 1 }, 3, 4),
            op("a", Input::Get, Output::Found { rv: 11, value: 2 }, 5, 6),
        ];
        assert_eq!(check_calls(&h, &[]), vec![]);
    }

    #[test]
    fn a_stale_read_after_an_acknowledged_write_is_caught() {
        let h = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            op("a", update(2, 10), Output::Written { rv: 11 }, 2, 3),
            op("a", Input::Get, Output::Found { rv: 10, value: 1 }, 4, 5),
        ];
        let v = check_calls(&h, &[]);
        assert!(
            matches!(&v[..], [Violation::Key { key, .. }] if key == "a"),
            "{v:?}"
        );
    }

    #[test]
    fn a_stale_precondition_that_succeeds_is_caught() {
        let h = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            op("a", update(2, 10), Output::Written { rv: 11 }, 2, 3),
            op("a", update(3, 10), Output::Written { rv: 12 }, 4, 5),
        ];
        assert_eq!(check_calls(&h, &[]).len(), 1);
    }

    #[test]
    fn a_write_whose_answer_was_lost_may_or_may_not_have_happened() {
        let lost = |call| Operation {
            key: "a".into(),
            input: update(2, 10),
            output: Output::Unknown,
            call,
            ret: None,
        };
        let happened = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            lost(2),
            op("a", Input::Get, Output::Found { rv: 15, value: 2 }, 5, 6),
        ];
        assert_eq!(check_calls(&happened, &[]), vec![]);
        let did_not = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            lost(2),
            op("a", Input::Get, Output::Found { rv: 10, value: 1 }, 5, 6),
        ];
        assert_eq!(check_calls(&did_not, &[]), vec![]);
        // But not a value nobody wrote.
        let invented = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            lost(2),
            op("a", Input::Get, Output::Found { rv: 15, value: 9 }, 5, 6),
        ];
        assert_eq!(check_calls(&invented, &[]).len(), 1);
    }

    #[test]
    fn versions_must_be_unique_and_rise_in_real_time_across_keys() {
        let dup = [
            op("a", create(1), Output::Written { rv: 10 }, 0, 1),
            op("b", create(1), Output::Written { rv: 10 }, 2, 3),
        ];
        assert!(matches!(
            &check_calls(&dup, &[])[..],
            [Violation::DuplicateVersion { rv: 10, .. }]
        ));
        let backwards = [
            op("a", create(1), Output::Written { rv: 20 }, 0, 1),
            op("b", create(1), Output::Written { rv: 15 }, 2, 3),
        ];
        assert!(matches!(
            &check_calls(&backwards, &[])[..],
            [Violation::VersionsBackwards { .. }]
        ));
        let concurrent = [
            op("a", create(1), Output::Written { rv: 20 }, 0, 5),
            op("b", create(1), Output::Written { rv: 15 }, 2, 6),
        ];
        assert_eq!(check_calls(&concurrent, &[]), vec![]);
    }

    #[test]
    fn a_list_is_a_snapshot_no_older_than_what_was_acknowledged_before_it() {
        let h = [
            op("p/a", create(1), Output::Written { rv: 10 }, 0, 1),
            op("p/b", create(2), Output::Written { rv: 11 }, 2, 3),
        ];
        let good = List {
            prefix: "p/".into(),
            rv: 11,
            items: vec![("p/a".into(), 10, 1), ("p/b".into(), 11, 2)],
            call: 4,
            ret: 5,
        };
        assert_eq!(check_calls(&h, std::slice::from_ref(&good)), vec![]);
        let stale = List {
            rv: 10,
            items: vec![("p/a".into(), 10, 1)],
            ..good
        };
        assert!(!check_calls(&h, &[stale]).is_empty());
    }

    #[test]
    fn a_long_history_of_many_overlapping_calls_checks_quickly() {
        // Four clients, each update conditional on the version it last read: 2,000 calls.
        let mut h = vec![op("a", create(0), Output::Written { rv: 1 }, 0, 1)];
        let mut t = 10;
        for (rv, i) in (1..).zip(0..500u64) {
            let value = i + 1;
            h.push(op(
                "a",
                Input::Get,
                Output::Found { rv, value: i },
                t,
                t + 7,
            ));
            h.push(op(
                "a",
                update(value, rv),
                Output::Written { rv: rv + 1 },
                t + 1,
                t + 9,
            ));
            h.push(op("a", update(99, rv), Output::Conflict, t + 8, t + 12));
            h.push(op(
                "a",
                Input::Get,
                Output::Found { rv: rv + 1, value },
                t + 10,
                t + 13,
            ));
            t += 20;
        }
        // And eight writes whose answers were lost (a server killed mid-call), never seen.
        for i in 0..8 {
            h.push(Operation {
                key: "a".into(),
                input: update(7_000 + i, 3),
                output: Output::Unknown,
                call: 5_000 + i,
                ret: None,
            });
        }
        let started = std::time::Instant::now();
        assert_eq!(check_calls(&h, &[]), vec![]);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    fn ev(kind: EventType, key: &str, rv: u64, value: u64, at: Time) -> WatchEvent {
        WatchEvent {
            kind,
            key: key.into(),
            rv,
            value,
            at,
        }
    }

    /// Two creates, an update, a delete; and a watcher that listed before them.
    fn writes() -> Vec<Operation> {
        vec![
            op("p/a", create(1), Output::Written { rv: 10 }, 0, 1),
            op("p/b", create(2), Output::Written { rv: 11 }, 2, 3),
            op("p/a", update(3, 10), Output::Written { rv: 12 }, 4, 5),
            op("p/b", Input::Delete, Output::Deleted, 6, 7),
        ]
    }

    fn watch(events: Vec<WatchEvent>) -> Watch {
        Watch {
            watcher: 0,
            prefix: "p/".into(),
            from: 9,
            listed: Some(List {
                prefix: "p/".into(),
                rv: 9,
                items: vec![],
                call: 0,
                ret: 0,
            }),
            events,
            call: 0,
        }
    }

    fn all_events() -> Vec<WatchEvent> {
        vec![
            ev(EventType::Added, "p/a", 10, 1, 2),
            ev(EventType::Added, "p/b", 11, 2, 4),
            ev(EventType::Modified, "p/a", 12, 3, 6),
            ev(EventType::Deleted, "p/b", 13, 2, 8),
        ]
    }

    #[test]
    fn a_watch_that_delivers_every_change_in_order_passes() {
        let mut events = all_events();
        events.push(ev(EventType::Bookmark, "", 13, 0, 9));
        let h = History {
            ops: writes(),
            lists: vec![],
            watches: vec![watch(events)],
        };
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_watch_that_saw_nothing_passes() {
        // Cut off at once (the HA drill's partition): no event, no bookmark.
        let h = History {
            ops: writes(),
            lists: vec![],
            watches: vec![watch(vec![])],
        };
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn a_watch_that_skips_reorders_or_invents_a_change_is_caught() {
        let cases: Vec<(&str, Vec<WatchEvent>)> = vec![
            ("skipped a write", {
                let mut e = all_events();
                e.remove(2);
                e
            }),
            ("skipped a deletion", {
                let mut e = all_events();
                e.remove(3);
                e.push(ev(EventType::Added, "p/b", 14, 2, 9));
                e
            }),
            ("reordered", {
                let mut e = all_events();
                e.swap(0, 1);
                e
            }),
            ("invented a value", {
                let mut e = all_events();
                e[2].value = 99;
                e
            }),
            ("twice", {
                let mut e = all_events();
                e.insert(1, e[0].clone());
                e
            }),
        ];
        for (what, events) in cases {
            let h = History {
                ops: writes(),
                lists: vec![],
                watches: vec![watch(events)],
            };
            assert!(!check(&h).is_empty(), "{what}: passed");
        }
    }

    #[test]
    fn a_lost_write_a_watch_delivered_happened() {
        // The update's answer was lost; the watch saw it at 12. A read of the old version
        // after the event arrived is then stale.
        let mut ops = writes();
        ops.truncate(3);
        ops[2].output = Output::Unknown;
        ops[2].ret = None;
        ops.push(op(
            "p/a",
            Input::Get,
            Output::Found { rv: 10, value: 1 },
            20,
            21,
        ));
        let mut events = all_events();
        events.truncate(3);
        let h = History {
            ops: ops.clone(),
            lists: vec![],
            watches: vec![watch(events)],
        };
        assert!(
            matches!(&check(&h)[..], [Violation::Key { .. }]),
            "{:?}",
            check(&h)
        );
        // Without the watch, it may not have happened.
        let h = History {
            ops,
            lists: vec![],
            watches: vec![],
        };
        assert_eq!(check(&h), vec![]);
    }
}

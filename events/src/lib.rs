//! Events as upstream's `client-go/tools/record` writes them (the recorder every upstream
//! controller and the kubelet use): a core/v1 `Event` named `<object>.<hex nanoseconds>` in
//! the object's namespace, with `source`, `count`, `firstTimestamp` and `lastTimestamp`.
//!
//! The correlator is upstream's `events_cache.go`:
//! - **dedup**: an event identical to one already written (same object, type, reason,
//!   message and source) patches that one: `count` + 1, `lastTimestamp` now;
//! - **aggregation**: events that differ only in their message stay separate until 10
//!   different messages arrive within 10 minutes; from then on they are counted in one
//!   event whose message reads `(combined from similar events): <latest>`.
//!
//! kube-runtime's `Recorder` keys a series by reason and action and keeps the first note, so
//! `kubectl describe` showed one line for different messages; this one does not.
//!
//! - **spam filter**: each object, source, type and reason has a budget of 25 events, refilled
//!   at one per 5 minutes; beyond it events are dropped, so a container in a crash loop
//!   (looked at every second) does not write an event a second.
//!
//! Writes go through one sink task per recorder, so recording never waits on the apiserver;
//! the task ends when the last clone of the recorder is dropped.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Upstream's limits: distinct messages before aggregation, and its window.
const MAX_SIMILAR: usize = 10;
const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// Entries the caches keep (upstream's LRU size).
const CACHE: usize = 4096;
/// upstream's spam filter: a burst of 25 events per key, refilled one per 5 minutes.
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL: Duration = Duration::from_secs(300);
/// Events queued for the sink before new ones are dropped (upstream's broadcaster: 1000).
const QUEUE: usize = 1000;

/// An event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl Type {
    fn as_str(self) -> &'static str {
        match self {
            Type::Normal => "Normal",
            Type::Warning => "Warning",
        }
    }
}

/// Records events for one component (and host, for node components).
#[derive(Clone)]
pub struct Recorder {
    source: EventSource,
    state: Arc<Mutex<Correlator>>,
    sink: mpsc::Sender<Write>,
    /// The sink task's client and queue until it starts (on the first event, so a recorder
    /// can be made outside a runtime).
    idle: Arc<Mutex<Option<IdleSink>>>,
}

/// A sink not started yet: its client and queue.
type IdleSink = (kube::Client, mpsc::Receiver<Write>);

/// What the sink is asked to do.
#[derive(Debug)]
enum Write {
    Create(Box<Event>),
    /// Count up an existing event (its name, namespace, count, time, message), or create it
    /// again if it is gone (events expire).
    CountUp(Box<Event>),
}

impl Recorder {
    /// A recorder writing as `component` (on `host`, if a node's).
    pub fn new(client: kube::Client, component: &str, host: Option<&str>) -> Recorder {
        let (sink, rx) = mpsc::channel(QUEUE);
        Recorder {
            source: EventSource {
                component: Some(component.to_owned()),
                host: host.map(str::to_owned),
            },
            state: Arc::new(Mutex::new(Correlator::default())),
            sink,
            idle: Arc::new(Mutex::new(Some((client, rx)))),
        }
    }

    /// Records a Normal event.
    pub fn normal(&self, object: &ObjectReference, reason: &str, message: impl Into<String>) {
        self.record(object, Type::Normal, reason, message.into());
    }

    /// Records a Warning event.
    pub fn warning(&self, object: &ObjectReference, reason: &str, message: impl Into<String>) {
        self.record(object, Type::Warning, reason, message.into());
    }

    /// Records an event about `object` (queued; never waits on the apiserver).
    pub fn record(&self, object: &ObjectReference, type_: Type, reason: &str, message: String) {
        if let Some((client, rx)) = self.idle.lock().expect("event sink").take() {
            minik8s_task::spawn("event-sink", run_sink(client, rx));
        }
        let now = jiff::Timestamp::now();
        let Some(write) = self.state.lock().expect("event correlator").correlate(
            &self.source,
            object,
            type_,
            reason,
            message,
            now,
        ) else {
            tracing::debug!(reason, "event dropped by the spam filter");
            return;
        };
        if let Err(e) = self.sink.try_send(write) {
            tracing::warn!(reason, error = %e, "event dropped");
        }
    }
}

/// Bounds a cache as upstream's LRU caches are bounded: past twice [`CACHE`] entries, only
/// the [`CACHE`] used last (by `at`) are kept. Trimming once per [`CACHE`] new keys, rather
/// than scanning the cache at each once it is full, keeps an event's cost flat when
/// thousands of objects each get one (a scheduler's `Scheduled`).
fn trim<V>(cache: &mut HashMap<String, V>, at: impl Fn(&V) -> Instant) {
    if cache.len() <= 2 * CACHE {
        return;
    }
    let mut times: Vec<Instant> = cache.values().map(&at).collect();
    let (_, cut, _) = times.select_nth_unstable_by(cache.len() - CACHE, |a, b| a.cmp(b));
    let cut = *cut;
    cache.retain(|_, v| at(v) >= cut);
}

/// The caches of upstream's correlator.
#[derive(Default)]
struct Correlator {
    /// Messages seen per aggregate key (everything but the message), with when the window began.
    similar: HashMap<String, (HashSet<String>, Instant)>,
    /// Events written per full key: name, namespace, count, first timestamp.
    written: HashMap<String, Written>,
    /// Keys in the order written, to bound the caches.
    order: VecDeque<String>,
    /// Tokens left per aggregate key, and when they were last counted.
    budget: HashMap<String, (f64, Instant)>,
}

#[derive(Clone)]
struct Written {
    name: String,
    count: i32,
    first: Time,
}

fn key_of(source: &EventSource, o: &ObjectReference, type_: Type, reason: &str) -> String {
    [
        source.component.as_deref().unwrap_or_default(),
        source.host.as_deref().unwrap_or_default(),
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default(),
        o.api_version.as_deref().unwrap_or_default(),
        o.field_path.as_deref().unwrap_or_default(),
        type_.as_str(),
        reason,
    ]
    .join("\u{0}")
}

impl Correlator {
    fn correlate(
        &mut self,
        source: &EventSource,
        object: &ObjectReference,
        type_: Type,
        reason: &str,
        message: String,
        now: jiff::Timestamp,
    ) -> Option<Write> {
        let aggregate_key = key_of(source, object, type_, reason);
        let (tokens, counted) = self
            .budget
            .entry(aggregate_key.clone())
            .or_insert((SPAM_BURST, Instant::now()));
        *tokens =
            (*tokens + counted.elapsed().as_secs_f64() / SPAM_REFILL.as_secs_f64()).min(SPAM_BURST);
        *counted = Instant::now();
        if *tokens < 1.0 {
            return None;
        }
        *tokens -= 1.0;
        trim(&mut self.budget, |(_, counted)| *counted);
        let entry = self
            .similar
            .entry(aggregate_key.clone())
            .or_insert_with(|| (HashSet::new(), Instant::now()));
        if entry.1.elapsed() > AGGREGATE_WINDOW {
            *entry = (HashSet::new(), Instant::now());
        }
        entry.0.insert(message.clone());
        let (key, message) = if entry.0.len() >= MAX_SIMILAR {
            (
                aggregate_key,
                format!("(combined from similar events): {message}"),
            )
        } else {
            (format!("{aggregate_key}\u{0}{message}"), message)
        };
        let time =
            Time(jiff::Timestamp::from_second(now.as_second()).expect("a timestamp in range"));
        let namespace = object
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let previous = self.written.get(&key).cloned();
        let (name, count, first) = match &previous {
            Some(w) => (w.name.clone(), w.count + 1, w.first.clone()),
            None => (
                format!(
                    "{}.{:x}",
                    object.name.as_deref().unwrap_or_default(),
                    now.as_nanosecond()
                ),
                1,
                time.clone(),
            ),
        };
        if previous.is_none() {
            self.order.push_back(key.clone());
            while self.order.len() > CACHE {
                if let Some(old) = self.order.pop_front() {
                    self.written.remove(&old);
                }
            }
            trim(&mut self.similar, |(_, began)| *began);
        }
        self.written.insert(
            key,
            Written {
                name: name.clone(),
                count,
                first: first.clone(),
            },
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace),
                ..Default::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.to_owned()),
            message: Some(message),
            source: Some(source.clone()),
            first_timestamp: Some(first),
            last_timestamp: Some(time),
            count: Some(count),
            type_: Some(type_.as_str().to_owned()),
            reporting_component: source.component.clone(),
            reporting_instance: source.host.clone(),
            ..Default::default()
        };
        Some(match previous {
            Some(_) => Write::CountUp(Box::new(event)),
            None => Write::Create(Box::new(event)),
        })
    }
}

/// Writes queued events until every recorder is gone.
async fn run_sink(client: kube::Client, mut rx: mpsc::Receiver<Write>) {
    while let Some(write) = rx.recv().await {
        let (event, count_up) = match write {
            Write::Create(e) => (e, false),
            Write::CountUp(e) => (e, true),
        };
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let name = event.metadata.name.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &ns);
        let result = if count_up {
            let patch = serde_json::json!({
                "count": event.count,
                "lastTimestamp": event.last_timestamp,
                "message": event.message,
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    api.create(&PostParams::default(), &event).await.map(|_| ())
                }
                other => other.map(|_| ()),
            }
        } else {
            api.create(&PostParams::default(), &event).await.map(|_| ())
        };
        match result {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                tracing::warn!(event = %name, reason = ?event.reason, error = %e, "could not write event")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> ObjectReference {
        ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("ns".into()),
            name: Some("p".into()),
            uid: Some("u".into()),
            api_version: Some("v1".into()),
            ..Default::default()
        }
    }

    fn source() -> EventSource {
        EventSource {
            component: Some("kubelet".into()),
            host: Some("n1".into()),
        }
    }

    fn event(w: Option<Write>) -> (bool, Event) {
        match w.expect("within the spam budget") {
            Write::Create(e) => (false, *e),
            Write::CountUp(e) => (true, *e),
        }
    }

    #[test]
    fn caches_keep_the_entries_used_last() {
        let t = Instant::now();
        let mut cache: HashMap<String, Instant> = (0..2 * CACHE)
            .map(|i| (i.to_string(), t + Duration::from_millis(i as u64)))
            .collect();
        trim(&mut cache, |at| *at);
        assert_eq!(cache.len(), 2 * CACHE, "untouched up to twice the limit");
        cache.insert("last".into(), t + Duration::from_secs(3600));
        trim(&mut cache, |at| *at);
        assert_eq!(cache.len(), CACHE);
        assert!(cache.contains_key("last"));
        assert!(cache.contains_key(&(2 * CACHE - 1).to_string()));
        assert!(!cache.contains_key(&CACHE.to_string()));
    }

    #[test]
    fn identical_events_count_up_and_different_messages_stay_apart() {
        let mut c = Correlator::default();
        let now = jiff::Timestamp::now();
        let (up, a) =
            event(c.correlate(&source(), &pod(), Type::Normal, "Pulled", "one".into(), now));
        assert!(!up);
        assert_eq!(a.count, Some(1));
        assert!(a.metadata.name.as_deref().unwrap().starts_with("p."));
        let (up, b) =
            event(c.correlate(&source(), &pod(), Type::Normal, "Pulled", "one".into(), now));
        assert!(up);
        assert_eq!((b.count, &b.metadata.name), (Some(2), &a.metadata.name));
        let (up, d) =
            event(c.correlate(&source(), &pod(), Type::Normal, "Pulled", "two".into(), now));
        assert!(!up, "a different message is a new event");
        assert_eq!(d.message.as_deref(), Some("two"));
    }

    #[test]
    fn ten_different_messages_are_combined() {
        let mut c = Correlator::default();
        let now = jiff::Timestamp::now();
        for i in 0..9 {
            let (_, e) =
                event(c.correlate(&source(), &pod(), Type::Warning, "X", format!("m{i}"), now));
            assert_eq!(e.message, Some(format!("m{i}")));
        }
        let (up, e) = event(c.correlate(&source(), &pod(), Type::Warning, "X", "m9".into(), now));
        assert!(!up);
        assert_eq!(
            e.message.as_deref(),
            Some("(combined from similar events): m9")
        );
        let (up, e2) = event(c.correlate(&source(), &pod(), Type::Warning, "X", "m10".into(), now));
        assert!(up);
        assert_eq!((e2.count, &e2.metadata.name), (Some(2), &e.metadata.name));
    }

    #[test]
    fn a_burst_of_25_events_per_reason_then_none_until_refilled() {
        let mut c = Correlator::default();
        let now = jiff::Timestamp::now();
        for _ in 0..25 {
            assert!(
                c.correlate(&source(), &pod(), Type::Warning, "BackOff", "m".into(), now)
                    .is_some()
            );
        }
        assert!(
            c.correlate(&source(), &pod(), Type::Warning, "BackOff", "m".into(), now)
                .is_none()
        );
        // Another reason has its own budget.
        assert!(
            c.correlate(&source(), &pod(), Type::Normal, "Pulled", "m".into(), now)
                .is_some()
        );
    }

    #[test]
    fn cluster_scoped_objects_get_events_in_default() {
        let mut c = Correlator::default();
        let node = ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        };
        let (_, e) = event(c.correlate(
            &source(),
            &node,
            Type::Normal,
            "Starting",
            "s".into(),
            jiff::Timestamp::now(),
        ));
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
    }
}

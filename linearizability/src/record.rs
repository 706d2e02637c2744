//! The recorder: clients that call the API concurrently on a few ConfigMaps (create, get,
//! update conditional on the version they last saw, delete, list) and write down each call
//! with when it started and returned and what it answered, as [`check`](crate::check) reads
//! histories. A call that fails without an answer (a time-out, a refused or broken
//! connection) is recorded as never returning: it may have happened or not. Watchers follow
//! the ConfigMaps as informers do (a list, then watches resumed at the last resourceVersion
//! seen, a new list after a 410) and write down every event with when it arrived.

use crate::{EventType, History, Input, List, Operation, Output, Time, Watch, WatchEvent};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchParams};
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The label every ConfigMap of the workload carries (lists select on it).
pub const LABEL: &str = "minik8s.io/linearizability";

/// What the clients do.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Concurrent clients.
    pub clients: usize,
    /// Concurrent watchers.
    pub watchers: usize,
    /// ConfigMaps they share (`lin-0`, `lin-1`, …).
    pub keys: usize,
    /// Their namespace.
    pub namespace: String,
    /// How long each call may take before it counts as unanswered.
    pub call_timeout: Duration,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            clients: 4,
            watchers: 2,
            keys: 3,
            namespace: "default".into(),
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// The shared recorder: a clock, the history so far, and the numbers of the clients and
/// watchers it started (several [`Recorder::run`]s may share it, each through its own
/// server).
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    history: Arc<Mutex<History>>,
    clients: Arc<AtomicU64>,
    watchers: Arc<AtomicUsize>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            start: Instant::now(),
            history: Arc::default(),
            clients: Arc::default(),
            watchers: Arc::default(),
        }
    }
}

impl Recorder {
    fn now(&self) -> Time {
        self.start.elapsed().as_nanos() as Time
    }

    /// The history recorded so far, taken out.
    pub fn take(&self) -> History {
        std::mem::take(&mut *self.history.lock().expect("history"))
    }

    /// Runs `w`'s clients through `client` until `until`; each call is recorded.
    pub async fn run(&self, client: kube::Client, w: &Workload, until: Instant) {
        let mut tasks = Vec::new();
        for _ in 0..w.clients {
            let c = self.clients.fetch_add(1, Ordering::Relaxed);
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &w.namespace);
            let me = self.clone();
            let w = w.clone();
            tasks.push(minik8s_task::spawn("linearizability-client", async move {
                me.client(c, api, &w, until).await;
            }));
        }
        for _ in 0..w.watchers {
            let watcher = self.watchers.fetch_add(1, Ordering::Relaxed);
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &w.namespace);
            let me = self.clone();
            let w = w.clone();
            tasks.push(minik8s_task::spawn("linearizability-watcher", async move {
                me.watcher(watcher, api, &w, until).await;
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    async fn client(&self, id: u64, api: Api<ConfigMap>, w: &Workload, until: Instant) {
        // The version this client last saw of each key (its next update's precondition).
        let mut seen: BTreeMap<usize, u64> = BTreeMap::new();
        let mut n = 0u64;
        while Instant::now() < until {
            n += 1;
            let value = (id + 1) * 1_000_000_000 + n;
            let (k, roll) = {
                let mut rng = rand::rng();
                (rng.random_range(0..w.keys), rng.random_range(0..100u32))
            };
            let name = format!("lin-{k}");
            let key = format!("{}/{name}", w.namespace);
            let call = self.now();
            let (input, answer) = match roll {
                0..10 => {
                    match self.list(&api, w, call).await {
                        Some(l) => self.history.lock().expect("history").lists.push(l),
                        None => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                    continue;
                }
                10..25 => (
                    Input::Create { value },
                    timed(
                        w,
                        api.create(&PostParams::default(), &config_map(&name, value)),
                    )
                    .await,
                ),
                25..35 => (
                    Input::Delete,
                    timed(w, async {
                        api.delete(&name, &DeleteParams::default())
                            .await
                            .map(|_| None)
                    })
                    .await,
                ),
                35..70 if seen.contains_key(&k) => {
                    let precondition = seen[&k];
                    let mut cm = config_map(&name, value);
                    cm.metadata.resource_version = Some(precondition.to_string());
                    (
                        Input::Update {
                            value,
                            precondition: Some(precondition),
                        },
                        timed(w, api.replace(&name, &PostParams::default(), &cm)).await,
                    )
                }
                _ => (Input::Get, timed(w, api.get(&name)).await),
            };
            if matches!(answer, Answer::NotSent | Answer::None) {
                // The server is down or not answering: back off a little, as clients do.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if matches!(answer, Answer::NotSent) {
                continue;
            }
            let (output, ret) = outcome(&input, answer, self.now());
            match &output {
                Output::Written { rv } | Output::Found { rv, .. } => {
                    seen.insert(k, *rv);
                }
                Output::NotFound | Output::Deleted => {
                    seen.remove(&k);
                }
                _ => {}
            }
            self.history.lock().expect("history").ops.push(Operation {
                key,
                input,
                output,
                call,
                ret,
            });
        }
    }

    /// One watcher until `until`: a list, then watches from the last resourceVersion it saw,
    /// each ended by the server after 5 to 15 s (or by its going away); a new list after a
    /// 410 or a watch that could not start.
    async fn watcher(&self, watcher: usize, api: Api<ConfigMap>, w: &Workload, until: Instant) {
        let mut resume: Option<u64> = None;
        while Instant::now() < until {
            let call = self.now();
            let (from, listed) = match resume {
                Some(rv) => (rv, None),
                None => match self.list(&api, w, call).await {
                    Some(l) => (l.rv, Some(l)),
                    None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let seconds = rand::rng().random_range(5..15);
            let params = WatchParams::default().labels(LABEL).timeout(seconds);
            let stream =
                match tokio::time::timeout(w.call_timeout, api.watch(&params, &from.to_string()))
                    .await
                {
                    Ok(Ok(stream)) => stream,
                    _ => {
                        // Not started: nothing was delivered; a list begins the next one.
                        resume = None;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
            let mut watch = Watch {
                watcher,
                prefix: format!("{}/lin-", w.namespace),
                from,
                listed,
                events: Vec::new(),
                call,
            };
            let mut last = from;
            let mut gone = false;
            let mut stream = std::pin::pin!(stream);
            let deadline = tokio::time::Instant::from_std(until);
            while let Ok(Some(event)) = tokio::time::timeout_at(deadline, stream.next()).await {
                let at = self.now();
                let (kind, cm) = match event {
                    Ok(kube::api::WatchEvent::Added(cm)) => (EventType::Added, cm),
                    Ok(kube::api::WatchEvent::Modified(cm)) => (EventType::Modified, cm),
                    Ok(kube::api::WatchEvent::Deleted(cm)) => (EventType::Deleted, cm),
                    Ok(kube::api::WatchEvent::Bookmark(b)) => {
                        let Ok(rv) = b.metadata.resource_version.parse() else {
                            continue;
                        };
                        last = last.max(rv);
                        watch.events.push(WatchEvent {
                            kind: EventType::Bookmark,
                            key: String::new(),
                            rv,
                            value: 0,
                            at,
                        });
                        continue;
                    }
                    Ok(kube::api::WatchEvent::Error(s)) => {
                        gone = s.code == 410;
                        break;
                    }
                    Err(_) => break,
                };
                let (Some(name), Some(rv), Some(value)) = (
                    cm.metadata.name.as_deref(),
                    cm.metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse::<u64>().ok()),
                    value_of(&cm),
                ) else {
                    continue;
                };
                last = last.max(rv);
                watch.events.push(WatchEvent {
                    kind,
                    key: format!("{}/{name}", w.namespace),
                    rv,
                    value,
                    at,
                });
            }
            self.history.lock().expect("history").watches.push(watch);
            resume = (!gone).then_some(last);
        }
    }

    async fn list(&self, api: &Api<ConfigMap>, w: &Workload, call: Time) -> Option<List> {
        let lp = ListParams::default().labels(LABEL);
        let got = tokio::time::timeout(w.call_timeout, api.list(&lp))
            .await
            .ok()?
            .ok()?;
        let ret = self.now();
        let rv = got.metadata.resource_version.as_deref()?.parse().ok()?;
        let items = got
            .items
            .iter()
            .filter_map(|cm| {
                Some((
                    format!("{}/{}", w.namespace, cm.metadata.name.as_deref()?),
                    cm.metadata.resource_version.as_deref()?.parse().ok()?,
                    value_of(cm)?,
                ))
            })
            .collect();
        Some(List {
            prefix: format!("{}/lin-", w.namespace),
            rv,
            items,
            call,
            ret,
        })
    }
}

fn config_map(name: &str, value: u64) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_owned());
    cm.metadata.labels = Some([(LABEL.to_owned(), "true".to_owned())].into());
    cm.data = Some([("v".to_owned(), value.to_string())].into());
    cm
}

fn value_of(cm: &ConfigMap) -> Option<u64> {
    cm.data.as_ref()?.get("v")?.parse().ok()
}

/// A call's answer: the object it returned (if any), an error the server gave, or none.
enum Answer {
    Object(Option<Box<ConfigMap>>),
    Refused(Box<kube::core::Status>),
    /// The connection was refused: no call happened (the server is down).
    NotSent,
    None,
}

async fn timed<F, T>(w: &Workload, call: F) -> Answer
where
    F: std::future::Future<Output = Result<T, kube::Error>>,
    T: Into<Option<ConfigMap>>,
{
    match tokio::time::timeout(w.call_timeout, call).await {
        Ok(Ok(v)) => Answer::Object(v.into().map(Box::new)),
        Ok(Err(kube::Error::Api(s))) => Answer::Refused(s),
        Ok(Err(e)) if refused(&e) => Answer::NotSent,
        _ => Answer::None,
    }
}

/// Whether the connection was refused: the request never reached a server.
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// What a call's answer means in the model, and when it returned (`None`: it did not).
fn outcome(input: &Input, answer: Answer, now: Time) -> (Output, Option<Time>) {
    match answer {
        Answer::None | Answer::NotSent => (Output::Unknown, None),
        Answer::Refused(s) => {
            let out = match (s.code, input) {
                (404, _) => Output::NotFound,
                (409, Input::Create { .. }) => Output::AlreadyExists,
                (409, Input::Update { .. }) => Output::Conflict,
                // A 5xx or 429: the server answered, but whether the write took effect it
                // does not say.
                _ => Output::Unknown,
            };
            (out, Some(now))
        }
        Answer::Object(obj) => {
            let rv = obj
                .as_ref()
                .and_then(|o| o.metadata.resource_version.as_deref()?.parse().ok());
            let out = match (input, obj, rv) {
                (Input::Delete, _, _) => Output::Deleted,
                (Input::Get, Some(cm), Some(rv)) => match value_of(&cm) {
                    Some(value) => Output::Found { rv, value },
                    None => Output::Unknown,
                },
                (_, Some(_), Some(rv)) => Output::Written { rv },
                _ => Output::Unknown,
            };
            (out, Some(now))
        }
    }
}

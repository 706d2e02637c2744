//! The one way a controller runs here, as client-go's controller pattern (shared informers,
//! a rate-limited work queue, workers) and kube-runtime's `Controller` (which it is built
//! on): a controller is a reconcile function of one object of its kind, and the [`Driver`]
//! decides when to call it.
//!
//! - It reads from the manager's shared [`Informers`] (one watch per kind for all
//!   controllers), never from a watch of its own.
//! - Its queue is keyed by object: a key is reconciled by one worker at a time, and changes
//!   that arrive meanwhile fold into one more reconcile. The controllers of many objects run
//!   upstream's number of workers ([`workers`]); the others reconcile every key due at once.
//! - The kind's own changes trigger it, and so do the changes of what it [`owns`] (mapped to
//!   the controller owner) or [`watches`] (mapped by a function).
//! - Every object (of a driver made by [`only`], every object it is for) is reconciled once
//!   at start and again every [`resync`] period (upstream's resync), so a controller that
//!   depends on time or on objects it does not watch still converges.
//! - A failed reconcile is retried with per-key exponential back-off (5 ms doubling, at most
//!   [`MAX_BACKOFF`]), reset by a success.
//! - Each reconcile is a workqueue item in the metrics (`workqueue_*{name=…}`); the wait
//!   from a change of its own kind (or a periodic pass of a driver made by [`only`]) to its
//!   reconcile is `workqueue_queue_duration_seconds`, as upstream's queues time an item
//!   from its add to its start.
//! - It stops on shutdown after the reconciles in flight finish.
//!
//! Leader election is the manager's (`cli.rs`): a manager that is not leading runs none.
//!
//! [`owns`]: Driver::owns
//! [`workers`]: Driver::workers
//! [`only`]: Driver::only
//! [`watches`]: Driver::watches
//! [`resync`]: Driver::resync

use crate::informer::Informers;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The longest a failing key waits before its next try (upstream's default limiter allows
/// 1000 s; a controller here should recover within seconds of the API coming back).
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The first retry's delay; each further failure doubles it.
const BASE_BACKOFF: Duration = Duration::from_millis(5);

/// How soon a controller looks again at an object that is still converging with no event to
/// wake it (pods becoming available after `minReadySeconds`): the period of the whole-store
/// passes this driver replaced.
pub const BUSY: Duration = Duration::from_millis(500);

/// Nothing to do until a change when `settled`; otherwise look again after [`BUSY`].
pub fn until_settled(settled: bool) -> Action {
    if settled {
        Action::await_change()
    } else {
        Action::requeue(BUSY)
    }
}

/// The default resync period.
pub const RESYNC: Duration = Duration::from_secs(30);

/// A controller of kind `K` being assembled, then run.
pub struct Driver<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    name: &'static str,
    informers: Informers,
    controller: Controller<K>,
    store: Store<K>,
    resync: Duration,
    /// The objects the driver is for (`None`: all); the periodic passes take only those.
    wanted: Option<Wanted<K>>,
    first_retry: Duration,
    /// When each key waiting for its reconcile was first queued by a change since its last
    /// start (the changes of its own kind that this driver sees before kube-runtime does).
    queued: Queued<K>,
}

/// Which objects a driver made by [`Driver::only`] is for.
type Wanted<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

/// Keys waiting for their reconcile, with when they were queued.
type Queued<K> = Arc<Mutex<HashMap<ObjectRef<K>, Instant>>>;

/// Notes in `queued` when each object of `changes` was queued (the first change since its
/// reconcile last started).
fn stamped<K, S>(queued: &Queued<K>, changes: S) -> impl Stream<Item = Arc<K>> + Send + use<K, S>
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
    S: Stream<Item = Arc<K>> + Send,
{
    let queued = queued.clone();
    changes.inspect(move |o| {
        queued
            .lock()
            .expect("queued")
            .entry(ObjectRef::from(o.as_ref()))
            .or_insert_with(Instant::now);
    })
}

impl<K> Driver<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// The controller `name` of every `K`, fed by the shared informer of `K` (waits until it
    /// has listed them).
    pub async fn new(name: &'static str, informers: &Informers) -> Self {
        let store = informers.all::<K>().await;
        Self::on_changes(name, informers, store, informers.subscribe::<K>())
    }

    /// The controller `name` of every `K`, woken only by the changes of the objects `wanted`
    /// selects (the scheduler: pods not bound yet), so that the many changes of the others
    /// (bound pods' status) do not queue before theirs.
    pub async fn only(
        name: &'static str,
        informers: &Informers,
        wanted: impl Fn(&K) -> bool + Send + Sync + 'static,
    ) -> Self {
        let store = informers.all::<K>().await;
        let wanted: Wanted<K> = Arc::new(wanted);
        let select = wanted.clone();
        let changes = informers
            .subscribe::<K>()
            .filter(move |o| std::future::ready(select(o)));
        let mut driver = Self::on_changes(name, informers, store, changes);
        driver.wanted = Some(wanted);
        driver
    }

    /// The controller `name` of every `K`, woken only when an object's spec changes (its
    /// `metadata.generation`), not by status writes (its own, every sync): for controllers
    /// that requeue themselves on a period, as the HPA controller's sync period.
    pub async fn on_spec_changes(name: &'static str, informers: &Informers) -> Self {
        let store = informers.all::<K>().await;
        let mut generations: HashMap<String, Option<i64>> = HashMap::new();
        let changes = informers.subscribe::<K>().filter(move |o| {
            let uid = o.meta().uid.clone().unwrap_or_default();
            let generation = o.meta().generation;
            let changed = match o.meta().deletion_timestamp {
                // Gone or going: forget it (a recreated object is new).
                Some(_) => generations.remove(&uid).is_none(),
                None => generations.insert(uid, generation) != Some(generation),
            };
            std::future::ready(changed)
        });
        Self::on_changes(name, informers, store, changes)
    }

    /// A driver woken by `changes` of the shared `store`'s objects, each timed from when it
    /// queued its key.
    fn on_changes(
        name: &'static str,
        informers: &Informers,
        store: Store<K>,
        changes: impl Stream<Item = Arc<K>> + Send + 'static,
    ) -> Self {
        let queued = Queued::default();
        let controller = Controller::for_shared_stream(stamped(&queued, changes), store.clone());
        Self::assemble(name, informers, controller, store, queued)
    }

    /// The controller `name` of the `K`s `config` selects from `api`, on a watch of its own:
    /// for the few objects of a kind the manager does not keep whole (bootstrap token
    /// Secrets, the `cluster-info` ConfigMap), where a shared informer of every Secret or
    /// ConfigMap would cost more memory than it saves watches.
    pub fn filtered(
        name: &'static str,
        informers: &Informers,
        api: kube::Api<K>,
        config: kube::runtime::watcher::Config,
    ) -> Self {
        let controller = Controller::new(api, config);
        let store = controller.store();
        Self::assemble(name, informers, controller, store, Queued::default())
    }

    /// A driver of `controller` (reading `store`, its changes timed in `queued`) with the
    /// default resync and back-off.
    fn assemble(
        name: &'static str,
        informers: &Informers,
        controller: Controller<K>,
        store: Store<K>,
        queued: Queued<K>,
    ) -> Self {
        Driver {
            name,
            informers: informers.clone(),
            controller,
            store,
            resync: RESYNC,
            wanted: None,
            first_retry: BASE_BACKOFF,
            queued,
        }
    }

    /// The store of every `K` (shared with the other controllers).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Also reconciles the controller owner (a `K`) of every changed `C`.
    pub fn owns<C>(mut self) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.controller = self
            .controller
            .owns_shared_stream(self.informers.subscribe::<C>());
        self
    }

    /// Also reconciles the objects `map` names for every changed `C`.
    pub fn watches<C, I>(mut self, map: impl Fn(Arc<C>) -> I + Send + Sync + 'static) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>> + 'static,
        I::IntoIter: Send,
    {
        self.controller = self
            .controller
            .watches_shared_stream(self.informers.subscribe::<C>(), map);
        self
    }

    /// Also reconciles the objects `map` names for every change of the `C`s `config` selects
    /// from `api` (a watch of its own, as [`Driver::filtered`]).
    pub fn watches_api<C, I>(
        mut self,
        api: kube::Api<C>,
        config: kube::runtime::watcher::Config,
        map: impl Fn(C) -> I + Send + Sync + 'static,
    ) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        I: IntoIterator<Item = ObjectRef<K>> + 'static,
        I::IntoIter: Send,
    {
        self.controller = self.controller.watches(api, config, map);
        self
    }

    /// Also reconciles the controller owner (a `K`) of every change of the `C`s `config`
    /// selects from `api` (a watch of its own, as [`Driver::filtered`]).
    pub fn owns_api<C>(mut self, api: kube::Api<C>, config: kube::runtime::watcher::Config) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.controller = self.controller.owns(api, config);
        self
    }

    /// Any other trigger or setting kube-runtime's `Controller` has (a metadata-only watch,
    /// a debounce), applied to the controller being built.
    pub fn with(mut self, build: impl FnOnce(Controller<K>) -> Controller<K>) -> Self {
        self.controller = build(self.controller);
        self
    }

    /// Also reconciles every `K` whenever a `C` changes (for controllers whose every object
    /// may depend on any `C`, as DaemonSets on nodes).
    pub fn watches_all<C>(self) -> Self
    where
        C: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let store = self.store.clone();
        self.watches::<C, _>(move |_| {
            store
                .state()
                .iter()
                .map(|o| ObjectRef::from(o.as_ref()))
                .collect::<Vec<_>>()
        })
    }

    /// Reconciles one object at a time (for controllers that hand out from a shared pool, as
    /// pod CIDRs or volumes, where two reconciles at once could give the same thing twice).
    pub fn one_at_a_time(self) -> Self {
        self.workers(1)
    }

    /// Reconciles at most `n` objects at once, as upstream's controllers run a fixed number
    /// of workers (`--concurrent-deployment-syncs=5` and the like). Without it every object
    /// due is reconciled at once: after a burst of changes, or a restart's first pass over
    /// thousands of objects, that is thousands of requests in flight together, each slowed
    /// by all the others, and 429s when their lane is full. Replaces a debounce set with
    /// [`Driver::with`].
    pub fn workers(mut self, n: u16) -> Self {
        self.controller = self
            .controller
            .with_config(kube::runtime::controller::Config::default().concurrency(n));
        self
    }

    /// Waits at least `delay` before the first retry of a failed key (default 5 ms), for
    /// reconciles whose failures are another system's (an SSH login node) and should not be
    /// retried at once.
    pub fn first_retry(mut self, delay: Duration) -> Self {
        self.first_retry = delay;
        self
    }

    /// Reconciles every object every `period` (default [`RESYNC`]).
    pub fn resync(mut self, period: Duration) -> Self {
        self.resync = period;
        self
    }

    /// Runs `reconcile` on each key until `shutdown`.
    pub async fn run<C, E, F, Fut>(self, reconcile: F, ctx: Arc<C>, shutdown: CancellationToken)
    where
        C: Send + Sync + 'static,
        E: Display + std::error::Error + Send + 'static,
        F: Fn(Arc<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let name = self.name;
        let failures: Arc<Mutex<HashMap<ObjectRef<K>, u32>>> = Arc::default();
        let on_success = failures.clone();
        let queued = self.queued.clone();
        let reconcile = move |obj: Arc<K>, ctx: Arc<C>| -> BoxFuture<'static, Result<Action, E>> {
            let key = ObjectRef::from(obj.as_ref());
            let since = queued.lock().expect("queued").remove(&key);
            if let Some(since) = since {
                minik8s_metrics::workqueue().waited(name, since.elapsed());
            }
            let item = minik8s_metrics::workqueue().start(name);
            let fut = reconcile(obj, ctx);
            let failures = on_success.clone();
            Box::pin(async move {
                let r = fut.await;
                item.done(r.is_ok());
                if r.is_ok() {
                    failures.lock().expect("failures").remove(&key);
                }
                r
            })
        };
        let first_retry = self.first_retry;
        let error_policy = move |obj: Arc<K>, e: &E, _: Arc<C>| -> Action {
            let key = ObjectRef::from(obj.as_ref());
            let n = {
                let mut f = failures.lock().expect("failures");
                let n = f.entry(key.clone()).or_insert(0);
                *n += 1;
                *n
            };
            // A 429 says when to come back (client-go waits its Retry-After too).
            let delay = backoff(n)
                .max(first_retry)
                .max(retry_after(e).unwrap_or_default());
            tracing::warn!(controller = name, object = %key, error = %e, retry_in = ?delay, "reconcile failed, retrying");
            Action::requeue(delay)
        };
        let period = self.resync;
        let (queued, store) = (self.queued.clone(), self.store.clone());
        // Once at start (the subscription began after the initial list), then every period;
        // keys queued for objects deleted before their reconcile are forgotten then.
        let ticks = futures::stream::unfold(true, move |first| {
            let (queued, store) = (queued.clone(), store.clone());
            async move {
                if !first {
                    tokio::time::sleep(period).await;
                }
                (queued.lock().expect("queued")).retain(|key, _| store.get(key).is_some());
                Some(((), false))
            }
        });
        let controller = match self.wanted {
            None => self.controller.reconcile_all_on(ticks),
            // A pass over the objects wanted alone (the scheduler's pending pods, not every pod).
            Some(wanted) => {
                let store = self.store.clone();
                let queued = self.queued.clone();
                let due = ticks.flat_map(move |()| {
                    let now = Instant::now();
                    let mut stamps = queued.lock().expect("queued");
                    let keys: Vec<ObjectRef<K>> = store
                        .state()
                        .iter()
                        .filter(|o| wanted(o))
                        .map(|o| ObjectRef::from(o.as_ref()))
                        .inspect(|key| {
                            stamps.entry(key.clone()).or_insert(now);
                        })
                        .collect();
                    drop(stamps);
                    futures::stream::iter(keys)
                });
                self.controller.reconcile_on(due)
            }
        };
        controller
            .graceful_shutdown_on(async move { shutdown.cancelled().await })
            .run(reconcile, error_policy, ctx)
            .for_each(|_| async {})
            .await;
        tracing::debug!(controller = name, "stopped");
    }
}

/// The wait a refused request asks for: a 429's `retryAfterSeconds` (at least a second),
/// found anywhere in the error's chain.
pub fn retry_after(e: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(kube::Error::Api(s)) = err.downcast_ref::<kube::Error>()
            && s.code == 429
        {
            let secs = s.details.as_ref().map_or(0, |d| d.retry_after_seconds);
            return Some(Duration::from_secs(u64::from(secs.max(1))));
        }
        next = err.source();
    }
    None
}

/// The delay before the `n`th retry (from 1): 5 ms doubling, at most [`MAX_BACKOFF`].
pub fn backoff(n: u32) -> Duration {
    BASE_BACKOFF
        .saturating_mul(1u32 << n.saturating_sub(1).min(20))
        .min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_429_is_retried_when_it_says() {
        let refused = |code: u16, secs: u32| {
            let status: kube::core::Status = serde_json::from_value(serde_json::json!({
                "status": "Failure", "code": code, "reason": "TooManyRequests",
                "details": {"retryAfterSeconds": secs}}))
            .unwrap();
            crate::Error::from(kube::Error::Api(Box::new(status)))
        };
        assert_eq!(retry_after(&refused(429, 3)), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(&refused(429, 0)), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(&refused(409, 3)), None);
    }

    #[test]
    fn back_off_doubles_per_failure_up_to_the_cap() {
        assert_eq!(backoff(1), Duration::from_millis(5));
        assert_eq!(backoff(2), Duration::from_millis(10));
        assert_eq!(backoff(5), Duration::from_millis(80));
        assert_eq!(backoff(12), Duration::from_millis(10_240).min(MAX_BACKOFF));
        assert_eq!(backoff(100), MAX_BACKOFF);
    }
}

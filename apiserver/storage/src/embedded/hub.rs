//! Routing of committed batches to the store's watches by key prefix: the writer hands a batch
//! only to the watches with a changed key under their prefix, so a commit wakes the watches it
//! concerns rather than every watch of the store (about 60 with the controller-manager's
//! informers). Each watch has a bounded queue; one that falls behind is flagged and told, and
//! catches up from the history table, as it did when it lagged behind a broadcast channel.

use crate::Event;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, mpsc};

/// One watch's end of the hub.
pub(super) struct Subscription {
    /// The batches with a key under the watch's prefix, in commit order.
    pub batches: mpsc::Receiver<Arc<[Event]>>,
    /// Set when a batch was dropped because the queue was full; `lag` is signalled then.
    pub lagged: Arc<AtomicBool>,
    pub lag: Arc<Notify>,
}

struct Sub {
    prefix: String,
    tx: mpsc::Sender<Arc<[Event]>>,
    lagged: Arc<AtomicBool>,
    lag: Arc<Notify>,
}

/// The watches of one store; `None` once the store is closed.
pub(super) struct Hub {
    subs: Mutex<Option<Vec<Sub>>>,
}

impl Hub {
    pub fn new() -> Self {
        Hub {
            subs: Mutex::new(Some(Vec::new())),
        }
    }

    /// A new watch of `prefix` with room for `buffer` batches; `None` once closed.
    pub fn subscribe(&self, prefix: &str, buffer: usize) -> Option<Subscription> {
        let (tx, batches) = mpsc::channel(buffer.max(1));
        let lagged = Arc::new(AtomicBool::new(false));
        let lag = Arc::new(Notify::new());
        self.subs.lock().expect("hub lock").as_mut()?.push(Sub {
            prefix: prefix.to_owned(),
            tx,
            lagged: lagged.clone(),
            lag: lag.clone(),
        });
        Some(Subscription {
            batches,
            lagged,
            lag,
        })
    }

    /// Hands a committed batch to every watch it concerns; forgets watches that are gone.
    pub fn publish(&self, batch: &Arc<[Event]>) {
        let mut guard = self.subs.lock().expect("hub lock");
        let Some(subs) = guard.as_mut() else { return };
        subs.retain(|s| {
            if s.tx.is_closed() {
                return false;
            }
            if !batch.iter().any(|e| e.kv.key.starts_with(&s.prefix)) {
                return true;
            }
            match s.tx.try_send(batch.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    s.lagged.store(true, Ordering::Release);
                    s.lag.notify_one();
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// Ends every watch (their queues close once drained).
    pub fn close(&self) {
        self.subs.lock().expect("hub lock").take();
    }
}

//! Named tasks. Every task a component spawns goes through [`spawn`] or [`spawn_on`] with a
//! name: its log lines carry it (a `task` span with `name`), and its end is logged at debug
//! level, so a task that stops early, or one still running at shutdown, can be told apart
//! from the others. Tasks on a [`TaskTracker`] are awaited at shutdown by whoever owns the
//! tracker; a task spawned with [`spawn`] ends with what it serves (a connection, a
//! request) or watches a shutdown token itself.
//!
//! (tokio can name tasks itself only in `tokio_unstable` builds; a span works in every build
//! and reaches the logs, where the names are read.)

use std::future::Future;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// The future with its name attached (a span) and its end logged.
fn named<F>(name: &'static str, fut: F) -> impl Future<Output = F::Output> + Send + 'static
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    async move {
        let out = fut.await;
        tracing::debug!("task ended");
        out
    }
    .instrument(tracing::info_span!("task", name))
}

/// Spawns `fut` as the task `name`.
pub fn spawn<F>(name: &'static str, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(named(name, fut))
}

/// Spawns `fut` as the task `name` on `tasks` (which shutdown waits for).
pub fn spawn_on<F>(tasks: &TaskTracker, name: &'static str, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tasks.spawn(named(name, fut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn named_tasks_run_and_return_their_output() {
        assert_eq!(spawn("answer", async { 42 }).await.unwrap(), 42);
        let tasks = TaskTracker::new();
        let h = spawn_on(&tasks, "tracked", async { "done" });
        tasks.close();
        tasks.wait().await;
        assert_eq!(h.await.unwrap(), "done");
    }
}

//! minik8s controllers: ordinary API clients on kube-runtime. One `controller-manager`
//! runs them all (see [`manager`]); each controller is a module with a reconcile function,
//! a `run` function that hands it to the one [`driver`], and pure decision functions that
//! the unit tests exercise without a cluster.

pub mod bootstrap;
pub mod certificates;
pub mod cli;
pub mod cron;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod driver;
pub mod endpoints;
pub mod expectations;
pub mod gc;
pub mod history;
pub mod hpa;
pub mod informer;
pub mod job;
pub mod leader;
pub mod manager;
pub mod mirroring;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod podgc;
pub mod protection;
pub mod replicaset;
pub mod rootca;
pub mod scheduler;
pub mod simnodes;
pub mod statefulset;
#[cfg(test)]
pub(crate) mod testing;
pub mod util;
pub mod volumebinding;

/// Why a reconcile failed (it is retried with back-off).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("api: {0}")]
    Kube(#[from] kube::Error),
    /// An object could not be (de)serialized.
    #[error("serialization: {0}")]
    Json(#[from] serde_json::Error),
    /// An object lacks something the controller needs.
    #[error("{0}")]
    Invalid(String),
}

/// Results of reconcile functions.
pub type Result<T, E = Error> = std::result::Result<T, E>;

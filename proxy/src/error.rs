//! The proxy's errors.

/// Why a proxy step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Running `iptables`, `iptables-restore` or `iptables-save`.
    #[error("{program}: {message}")]
    Iptables {
        /// The program.
        program: &'static str,
        /// What it said, or why it did not run.
        message: String,
    },
    /// Watching the API.
    #[error(transparent)]
    Watch(#[from] kube::runtime::watcher::Error),
    /// An API call failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The cluster DNS could not start.
    #[error("cluster DNS: {0}")]
    Dns(String),
    /// The router could not start.
    #[error("router: {0}")]
    Router(String),
}

/// The proxy's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

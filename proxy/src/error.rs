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
}

/// The proxy's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

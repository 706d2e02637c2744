//! The kubelet's errors, named after the step that failed.

use std::path::PathBuf;

/// Why a kubelet step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting to the CRI socket.
    #[error("connecting to the container runtime at {path}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// A CRI call answered with an error.
    #[error("CRI {call}: {status}")]
    Cri {
        /// The call (`RunPodSandbox`, …).
        call: &'static str,
        /// What the runtime said.
        #[source]
        status: Box<tonic::Status>,
    },
    /// Starting or talking to containerd.
    #[error("containerd: {0}")]
    Containerd(String),
    /// Starting a node daemon (containerd, the registry).
    #[error("{0}")]
    Daemon(String),
    /// Starting, or pushing to, the local image registry.
    #[error("registry: {0}")]
    Registry(String),
    /// A call to the apiserver.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// Reading or writing a file.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A pod that cannot run as written (a missing ConfigMap key, a bad volume).
    #[error("{0}")]
    Pod(String),
}

impl Error {
    /// The error as upstream's kubelet words a runtime's answer in events and container
    /// statuses: `rpc error: code = NotFound desc = …` for a CRI call, else the error.
    pub fn runtime_message(&self) -> String {
        match self {
            Error::Cri { status, .. } => format!(
                "rpc error: code = {:?} desc = {}",
                status.code(),
                status.message()
            ),
            other => other.to_string(),
        }
    }
}

/// The kubelet's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds the file to an I/O error.
pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}

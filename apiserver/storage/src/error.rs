//! Errors of the storage layer, named after what failed.

/// A storage operation's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `create` found the key already present.
    #[error("key {key} already exists")]
    AlreadyExists {
        /// The key.
        key: String,
    },
    /// The key is not present.
    #[error("key {key} not found")]
    NotFound {
        /// The key.
        key: String,
    },
    /// A compare-and-swap found another `mod_revision` than the caller expected.
    #[error("key {key} was modified: expected revision {expected}, found {}", current.mod_revision)]
    Conflict {
        /// The key.
        key: String,
        /// The revision the caller expected.
        expected: i64,
        /// The key's current value, so the caller can retry without reading again.
        current: Box<crate::KeyValue>,
    },
    /// The requested revision is older than the compacted history.
    #[error("revision {requested} has been compacted (history starts at {compacted})")]
    Compacted {
        /// The revision asked for.
        requested: i64,
        /// The oldest revision still available.
        compacted: i64,
    },
    /// The requested revision is newer than the store's current revision.
    #[error("revision {requested} is in the future (current revision is {current})")]
    FutureRevision {
        /// The revision asked for.
        requested: i64,
        /// The store's current revision.
        current: i64,
    },
    /// A key or request the store cannot hold.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// A watch fell too far behind and could not be caught up.
    #[error("watch fell behind and was dropped")]
    WatchLagged,
    /// Opening the embedded database failed.
    #[error("opening embedded store at {path}")]
    Open {
        /// The database file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: redb::Error,
    },
    /// The embedded database failed.
    #[error("embedded store")]
    Embedded(#[from] redb::Error),
    /// A record in the embedded database could not be decoded.
    #[error("corrupt record in embedded store: {0}")]
    Corrupt(String),
    /// Talking to etcd failed.
    #[error("etcd: {0}")]
    Etcd(etcd_client::Error),
    /// etcd cannot answer now: no member reachable, or no leader (quorum lost).
    #[error("etcd is unavailable: {0}")]
    Unavailable(String),
    /// A storage endpoint could not be parsed.
    #[error("invalid storage endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file-system or process operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The storage layer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Embedded(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

impl From<etcd_client::Error> for Error {
    /// Sorts etcd's failures: those that mean it cannot answer now (the connection failed,
    /// gRPC `Unavailable`, or etcd's "no leader" and "request timed out" when quorum is lost)
    /// become [`Error::Unavailable`], which the apiserver answers with 503.
    fn from(e: etcd_client::Error) -> Self {
        use etcd_client::Error as E;
        let unavailable = match &e {
            E::TransportError(_) | E::IoError(_) => true,
            E::GRpcStatus(status) => {
                matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                ) || ["no leader", "request timed out", "leader changed"]
                    .iter()
                    .any(|m| status.message().contains(m))
            }
            _ => false,
        };
        if unavailable {
            let detail = match &e {
                E::GRpcStatus(status) => status.message().to_owned(),
                other => other.to_string(),
            };
            Error::Unavailable(detail)
        } else {
            Error::Etcd(e)
        }
    }
}

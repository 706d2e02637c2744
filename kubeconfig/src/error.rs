//! Errors of PKI and kubeconfig generation.

use std::path::PathBuf;

/// What failed while making or reading certificates and kubeconfigs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing a file failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Generating, signing or parsing a certificate or key failed.
    #[error("certificate {what}")]
    Cert {
        /// Which certificate or step.
        what: String,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// Input that is not what it should be (a PEM without a certificate, …).
    #[error("{0}")]
    Invalid(String),
    /// A kubeconfig could not be encoded.
    #[error("encoding kubeconfig {path}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_yaml::Error,
    },
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

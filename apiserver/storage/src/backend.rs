//! Choosing a backend: a parsed storage endpoint and the [`Storage`] enum that dispatches the
//! [`Store`] trait to the backend it names.

use crate::etcd::EtcdTls;
use crate::metrics;
use crate::{
    Deleted, Embedded, Error, Etcd, KeyValue, RangeRequest, RangeResult, Result, Store, WatchIndex,
    WatchStream,
};
use bytes::Bytes;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Instant;

/// Where the store lives: `embedded:///path/to/dir` (or a plain path) or
/// `etcd://host:port[,host:port…]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// The embedded store in this folder.
    Embedded(PathBuf),
    /// An etcd cluster at these client URLs (`http://host:port`).
    Etcd(Vec<String>),
}

impl FromStr for Endpoint {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::Endpoint {
            endpoint: s.into(),
            reason: reason.into(),
        };
        if let Some(rest) = s.strip_prefix("etcd://") {
            let hosts: Vec<String> = rest
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("http://{h}"))
                .collect();
            if hosts.is_empty() {
                return Err(bad("no etcd host given"));
            }
            if let Some(h) = hosts.iter().find(|h| !h[7..].contains(':')) {
                return Err(bad(&format!("{h} has no port")));
            }
            return Ok(Endpoint::Etcd(hosts));
        }
        let path = s.strip_prefix("embedded://").unwrap_or(s);
        if path.is_empty() {
            return Err(bad("no folder given for the embedded store"));
        }
        if path.contains("://") {
            return Err(bad(
                "unknown scheme (use embedded:///dir or etcd://host:port)",
            ));
        }
        Ok(Endpoint::Embedded(PathBuf::from(path)))
    }
}

/// The store the apiserver runs on: one of the backends, chosen by an [`Endpoint`].
#[derive(Clone, Debug)]
pub enum Storage {
    /// The embedded redb store.
    Embedded(Embedded),
    /// An etcd cluster.
    Etcd(Etcd),
}

impl Storage {
    /// Opens the store an endpoint names.
    pub async fn open(endpoint: &Endpoint) -> Result<Self> {
        Self::open_with(
            endpoint,
            None,
            crate::embedded::DEFAULT_CACHE_BYTES,
            crate::embedded::DEFAULT_HISTORY_AGE,
        )
        .await
    }

    /// Opens the store an endpoint names, reaching etcd over TLS when `tls` is given; the
    /// embedded store gets a page cache of `cache_bytes` and keeps `history_age` of history
    /// at least.
    pub async fn open_with(
        endpoint: &Endpoint,
        tls: Option<&EtcdTls>,
        cache_bytes: usize,
        history_age: std::time::Duration,
    ) -> Result<Self> {
        Ok(match endpoint {
            Endpoint::Embedded(dir) => Storage::Embedded(Embedded::open_with(
                dir,
                crate::EmbeddedOptions {
                    cache_bytes,
                    history_age,
                    ..Default::default()
                },
            )?),
            Endpoint::Etcd(hosts) => Storage::Etcd(Etcd::connect_with(hosts, tls).await?),
        })
    }

    /// Flushes and closes the store (the embedded file is released; etcd needs nothing).
    pub async fn close(&self) -> Result<()> {
        match self {
            Storage::Embedded(e) => e.close().await,
            Storage::Etcd(_) => Ok(()),
        }
    }
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Storage::Embedded($s) => $e.await,
            Storage::Etcd($s) => $e.await,
        }
    };
}

impl Store for Storage {
    async fn current_revision(&self) -> Result<i64> {
        dispatch!(self, s => s.current_revision())
    }
    async fn compacted_revision(&self) -> Result<i64> {
        dispatch!(self, s => s.compacted_revision())
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let t = Instant::now();
        let r = dispatch!(self, s => s.get(key));
        metrics::observe("get", key, t);
        r
    }
    async fn range(&self, req: RangeRequest) -> Result<RangeResult> {
        let (t, key) = (Instant::now(), req.prefix.clone());
        let r = dispatch!(self, s => s.range(req));
        metrics::observe("list", &key, t);
        r
    }
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        let t = Instant::now();
        let r = dispatch!(self, s => s.create(key, value));
        metrics::observe("create", key, t);
        r
    }
    async fn update(&self, key: &str, value: Bytes, expected: i64) -> Result<KeyValue> {
        let t = Instant::now();
        let r = dispatch!(self, s => s.update(key, value, expected));
        metrics::observe("update", key, t);
        r
    }
    async fn delete(&self, key: &str, expected: Option<i64>) -> Result<Deleted> {
        let t = Instant::now();
        let r = dispatch!(self, s => s.delete(key, expected));
        metrics::observe("delete", key, t);
        r
    }
    async fn watch(&self, prefix: &str, start_revision: i64) -> Result<WatchStream> {
        dispatch!(self, s => s.watch(prefix, start_revision))
    }
    async fn compact(&self, revision: i64) -> Result<()> {
        dispatch!(self, s => s.compact(revision))
    }
    fn index(&self, prefix: &str, index: WatchIndex) -> Result<()> {
        match self {
            Storage::Embedded(s) => s.index(prefix, index),
            Storage::Etcd(s) => s.index(prefix, index),
        }
    }
    async fn range_where(&self, req: RangeRequest, value: &str) -> Result<Option<RangeResult>> {
        let (t, key) = (Instant::now(), req.prefix.clone());
        let r = dispatch!(self, s => s.range_where(req, value));
        metrics::observe("list", &key, t);
        r
    }
    async fn watch_where(
        &self,
        prefix: &str,
        start_revision: i64,
        value: &str,
    ) -> Result<WatchStream> {
        dispatch!(self, s => s.watch_where(prefix, start_revision, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_as_documented() {
        let table = [
            (
                "embedded:///var/lib/x",
                Some(Endpoint::Embedded("/var/lib/x".into())),
            ),
            ("/var/lib/x", Some(Endpoint::Embedded("/var/lib/x".into()))),
            (
                "etcd://127.0.0.1:2379,10.0.0.2:2379",
                Some(Endpoint::Etcd(vec![
                    "http://127.0.0.1:2379".into(),
                    "http://10.0.0.2:2379".into(),
                ])),
            ),
            ("etcd://", None),
            ("etcd://localhost", None),
            ("embedded://", None),
            ("mysql://x", None),
        ];
        for (input, want) in table {
            assert_eq!(input.parse::<Endpoint>().ok(), want, "{input}");
        }
    }
}

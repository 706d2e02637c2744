//! The apiserver's side of the store: the watch cache that decodes each event once for every
//! watcher, in-memory copies kept in step with a key prefix (`follow`), and history
//! compaction by age (`compactor`).

pub mod broken;
pub mod compactor;
pub mod follow;
pub mod watchcache;

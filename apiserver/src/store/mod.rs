//! The apiserver's side of the store: the watch cache that decodes each event once for every
//! watcher, in-memory copies kept in step with a key prefix (`follow`), history compaction by
//! age (`compactor`), and watches found by a field's value (`watchindex`).

pub mod broken;
pub mod compactor;
pub mod follow;
pub mod watchcache;
pub mod watchindex;

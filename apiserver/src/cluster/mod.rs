//! What the apiserver keeps in the cluster itself: the objects every cluster has from the
//! start (`bootstrap`) and `default/kubernetes`'s endpoints, one per live apiserver
//! (`endpoints`, upstream's lease endpoint reconciler).

pub mod bootstrap;
pub mod endpoints;

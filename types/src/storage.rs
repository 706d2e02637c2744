//! Names shared by the parts that bind and provision persistent volumes: the scheduler
//! (which picks a node for a claim waiting for its first consumer), the binder controller and
//! the kubelet's node-local provisioner. The annotations are upstream's.

/// The node-local folder provisioner each kubelet runs for its own node.
pub const LOCAL_PATH_PROVISIONER: &str = "minik8s.io/local-path";

/// On a claim: the node the scheduler chose for its first consumer.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// On a claim: the provisioner asked to make its volume.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// On a claim: the older spelling of [`STORAGE_PROVISIONER`] that provisioners still read.
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";

/// On a claim: its binding is complete.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";

/// On a claim or volume: the binder (not the user) bound it.
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// On a volume: the provisioner that made it (and deletes it).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// On a claim: held while a pod uses it (StorageObjectInUseProtection, upstream's name).
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// On a volume: held while a claim is bound to it (StorageObjectInUseProtection).
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// On a provisioned volume with reclaim policy Delete: held by its provisioner until the
/// storage behind it is gone (upstream's external-provisioner finalizer).
pub const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

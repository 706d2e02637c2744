//! Shared informers against a real apiserver: one store per kind, ready after the first
//! list, without managedFields.

use minik8s_conformance::Cluster;
use std::time::Duration;

#[test]
fn shared_informers_list_once_and_drop_managed_fields() {
    let c = Cluster::start();
    c.ok(&["create", "configmap", "one", "--from-literal=a=b"]);
    let informers = minik8s_controllers::informer::Informers::new(
        c.client(),
        tokio_util::task::TaskTracker::new(),
        c.shutdown_token(),
    );
    let (a, b) = c.block_on(async {
        // Two concurrent waiters both get the store once it has listed.
        let both = async {
            tokio::join!(
                informers.all::<k8s_openapi::api::core::v1::ConfigMap>(),
                informers.all::<k8s_openapi::api::core::v1::ConfigMap>()
            )
        };
        tokio::time::timeout(Duration::from_secs(10), both)
            .await
            .expect("ready within 10 s")
    });
    let one = b
        .state()
        .into_iter()
        .find(|cm| cm.metadata.name.as_deref() == Some("one"))
        .expect("the second handle sees the same store");
    assert!(
        one.metadata
            .managed_fields
            .as_ref()
            .is_none_or(Vec::is_empty)
    );
    assert_eq!(a.state().len(), b.state().len());
}

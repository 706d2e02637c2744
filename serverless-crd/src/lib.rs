//! minik8s serverless: the `Function` custom resource and, to come, its controller, gateway
//! (activator and autoscaler) and the Workflow resources. An API client only: the apiserver
//! learns these kinds from their CRDs at run time.

pub mod controller;
pub mod types;

pub use types::{Function, FunctionSpec, FunctionStatus};

/// Installs (or updates) the CRDs by server-side apply, as the cluster's bootstrap does.
pub async fn install(client: kube::Client) -> Result<(), kube::Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<CustomResourceDefinition> = Api::all(client);
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("minik8s").force(),
            &Patch::Apply(&crd),
        )
        .await?;
    }
    Ok(())
}

/// The CRDs this crate serves, as `minik8s up` installs them.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![Function::crd()]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_checked_in_crds_are_current() {
        let mut text = String::new();
        for crd in super::crds() {
            text.push_str(&format!("---\n{}", serde_yaml::to_string(&crd).unwrap()));
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds.yaml");
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            text,
            "serverless-crd/crds.yaml is stale: cargo run -p minik8s-serverless --bin crdgen > serverless-crd/crds.yaml"
        );
    }
}

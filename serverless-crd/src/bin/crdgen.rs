//! Prints the serverless CRDs as YAML (checked in as `serverless-crd/crds.yaml`).

fn main() {
    for crd in minik8s_serverless::crds() {
        print!(
            "---\n{}",
            serde_yaml::to_string(&crd).expect("a CRD serializes")
        );
    }
}

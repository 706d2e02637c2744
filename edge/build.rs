//! Generates the edge protocol (`proto/edge.proto`) with tonic: the edgelet serves `Edgelet`
//! and `EdgeAdmin`, the cloud serves `Registry`; each side calls the others.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/edge.proto");
    tonic_prost_build::configure().compile_protos(&["proto/edge.proto"], &["proto"])?;
    Ok(())
}

//! Generates the device plugin API (`proto/deviceplugin.proto`) with tonic: the kubelet serves
//! `Registration` and calls plugins' `DevicePlugin`; tests serve `DevicePlugin`. Also gRPC's
//! health protocol (`proto/health.proto`), which gRPC probes call.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    println!("cargo:rerun-if-changed=proto/health.proto");
    tonic_prost_build::configure().compile_protos(
        &["proto/deviceplugin.proto", "proto/health.proto"],
        &["proto"],
    )?;
    Ok(())
}

//! Generates the device plugin API (`proto/deviceplugin.proto`) with tonic: the kubelet serves
//! `Registration` and calls plugins' `DevicePlugin`; tests serve `DevicePlugin`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    tonic_prost_build::configure().compile_protos(&["proto/deviceplugin.proto"], &["proto"])?;
    Ok(())
}

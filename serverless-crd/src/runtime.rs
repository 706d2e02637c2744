//! The function runtime as the controllers and the gateway see it: the Python server and
//! base its image runs, the image's name, the port it serves on, and the label and
//! annotation its pods carry.

/// The invocation server the Python runtime image runs (with the base, its hash tags the
/// image).
pub const PYTHON_SERVER: &str = include_str!("../runtime/server.py");
/// The base mode of the same server (function modules loaded on request).
pub const PYTHON_BASE: &str = include_str!("../runtime/base.py");

/// The runtime image of `python3` functions and of bases, as `hack/images.sh` builds and
/// tags it: `minik8s/function-python:py-<first 12 hex digits of the SHA-256 of the server
/// followed by the base>`.
pub fn python_image() -> String {
    let both = [PYTHON_SERVER.as_bytes(), PYTHON_BASE.as_bytes()].concat();
    let digest = ring::digest::digest(&ring::digest::SHA256, &both);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("minik8s/function-python:py-{}", &hex[..12])
}
/// The label that names a pod's function.
pub const FUNCTION_LABEL: &str = "serverless.minik8s.io/function";
/// The template annotation that changes with the code (rolls the pods).
pub const CODE_HASH: &str = "serverless.minik8s.io/code-hash";
/// The port the runtime serves on.
pub const RUNTIME_PORT: i32 = 8080;

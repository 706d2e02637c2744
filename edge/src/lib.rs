//! Edge nodes, as KubeEdge's CloudCore/EdgeCore on virtual-kubelet: an `edgelet` on each edge
//! machine runs the pods it is given on the machine's own containerd (the kubelet's planner,
//! runtime and volume code, through the crates) and never talks to the Kubernetes API; the
//! cloud's *edge registry* admits edges (bootstrap token, node certificates) and serves each
//! as a virtual node whose provider is a gRPC client of that edgelet.
//!
//! - [`proto`]: the edge protocol (`proto/edge.proto`), versioned ([`PROTOCOL`]) in every
//!   request, over mutual TLS between cloud and edge.
//! - [`store`]: the edgelet's crash-safe local store (every pod spec and volume it was given,
//!   its configuration and certificates), so an edgelet restarted with no link recreates
//!   nothing and loses nothing.
//! - [`local`]: the edgelet's in-process API for the kubelet's pod worker, served from the
//!   store (OpenYurt's YurtHub local cache, without the apiserver behind it).
//! - [`agent`]: the edgelet itself; [`admin`]: what `edgectl` asks of it.
//! - [`tunnel`]: the kubelet API's streams (logs, exec, attach, port-forward) over the link.
//! - [`cloud`]: the registry and the virtual nodes' provider.

pub mod agent;
pub mod cloud;
pub mod local;
pub mod store;
pub mod tls;
pub mod tunnel;

/// The generated edge protocol.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    tonic::include_proto!("minik8s.edge.v1");
}

/// The edge protocol's version, sent in every request.
pub const PROTOCOL: u32 = 2;
/// The edge components' version.
pub const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"), "-minik8s-edge");
/// The virtual nodes' provider name (their taint's value).
pub const PROVIDER: &str = "edge";
/// The label every edge node carries.
pub const ROLE_LABEL: &str = "node-role.kubernetes.io/edge";
/// The annotation by which the node lifecycle controller leaves a node's pods in place while
/// it is unreachable (edge autonomy; `"true"` on every edge node).
pub const AUTONOMY_ANNOTATION: &str = "node.minik8s.io/autonomy";
/// The annotation holding the edgelet's address (`host:port`).
pub const ADDRESS_ANNOTATION: &str = "edge.minik8s.io/address";
/// The largest message either side accepts; a larger one is refused with an error reply.
pub const MAX_MESSAGE: usize = 4 << 20;
/// The default port of the edgelet's cloud-facing service.
pub const EDGELET_PORT: u16 = 10350;
/// The default address of the edgelet's admin service (loopback only).
pub const ADMIN_ADDRESS: &str = "127.0.0.1:10351";
/// The default port of the cloud's registry.
pub const REGISTRY_PORT: u16 = 10360;

/// A request header from `node`.
pub fn hello(node: &str) -> Option<proto::Hello> {
    Some(proto::Hello {
        version: PROTOCOL,
        node: node.to_owned(),
    })
}

/// Checks a request's header: present and of this protocol version.
#[allow(clippy::result_large_err)]
pub fn check_hello(hello: Option<&proto::Hello>) -> Result<&proto::Hello, tonic::Status> {
    let Some(h) = hello else {
        return Err(tonic::Status::invalid_argument(
            "the request has no hello (protocol version and node)",
        ));
    };
    if h.version != PROTOCOL {
        return Err(tonic::Status::failed_precondition(format!(
            "edge protocol version mismatch: this side speaks v{PROTOCOL}, the peer speaks v{}",
            h.version
        )));
    }
    Ok(h)
}

/// A `Status` message for a JSON body that does not parse.
pub fn bad_json(what: &str, e: serde_json::Error) -> tonic::Status {
    tonic::Status::invalid_argument(format!("{what} is not valid JSON: {e}"))
}

/// Now, RFC 3339 (seconds).
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_of_another_protocol_version_is_told_both_versions() {
        assert!(check_hello(hello("n").as_ref()).is_ok());
        let other = proto::Hello {
            version: PROTOCOL + 1,
            node: "n".into(),
        };
        let e = check_hello(Some(&other)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(
            e.message().contains(&format!("v{PROTOCOL}")),
            "{}",
            e.message()
        );
        assert!(
            e.message().contains(&format!("v{}", PROTOCOL + 1)),
            "{}",
            e.message()
        );
        assert_eq!(
            check_hello(None).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}

//! The kubelet endpoint of every node this process serves, on one port: `containerLogs`
//! (what `kubectl logs` reaches through the apiserver), `/pods`, `/metrics` and `/healthz`,
//! with the kubelet's TLS (a self-signed serving certificate, client certificates from the
//! cluster CA in `system:masters`) from the shared serving code.

use crate::{Error, ProviderError, Shared};
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

/// Binds the endpoint; returns its address and the future that serves it until shutdown.
pub(crate) async fn bind(
    listen: SocketAddr,
    client_ca: &std::path::Path,
    shared: Arc<Shared>,
) -> Result<(SocketAddr, impl Future<Output = ()> + use<>), Error> {
    let tls = minik8s_metrics::serving::self_signed_tls(
        client_ca,
        &[shared.cfg.address.clone(), "localhost".to_owned()],
    )
    .map_err(|e| Error::Server(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Error::Server(format!("{listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Server(e.to_string()))?;
    let shutdown = shared.shutdown.clone();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/pods", get(pods))
        .route("/metrics", get(metrics))
        .with_state(shared);
    let serve = minik8s_metrics::serving::serve_tls(
        listener,
        tls,
        app,
        minik8s_metrics::serving::Access::Group("system:masters"),
        shutdown,
    );
    Ok((addr, serve))
}

fn status(code: StatusCode, message: String) -> Response {
    (code, [("content-type", "text/plain")], message).into_response()
}

/// `GET /containerLogs/{ns}/{pod}/{container}`: from the provider of the pod's node.
async fn container_logs(
    State(s): State<Arc<Shared>>,
    Path((ns, name, container)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let pod = s
        .pods
        .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&ns));
    let served = pod
        .as_ref()
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .and_then(|n| s.served(&n));
    let Some(served) = served else {
        return status(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{name} is not on a node this process serves"),
        );
    };
    let opts = minik8s_kubelet::logs::Options::from_query(&q);
    match served
        .provider
        .container_logs(&ns, &name, &container, &opts)
        .await
    {
        Ok(text) => (StatusCode::OK, [("content-type", "text/plain")], text).into_response(),
        Err(ProviderError::NotFound(m)) => status(StatusCode::NOT_FOUND, m),
        Err(ProviderError::NotSupported(m)) => status(StatusCode::NOT_IMPLEMENTED, m),
        Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /pods`: the pods bound to the nodes this process serves.
async fn pods(State(s): State<Arc<Shared>>) -> Response {
    let items: Vec<_> = s
        .pods
        .state()
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|sp| sp.node_name.as_deref())
                .is_some_and(|n| s.served(n).is_some())
        })
        .map(|p| serde_json::to_value(p.as_ref()).unwrap_or_default())
        .collect();
    axum::Json(serde_json::json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items,
    }))
    .into_response()
}

/// `GET /metrics`: the virtual-node series.
async fn metrics() -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            minik8s_metrics::CONTENT_TYPE,
        )],
        minik8s_metrics::encode(&[crate::metrics::COMPONENT, "controller-manager"], &[]),
    )
        .into_response()
}

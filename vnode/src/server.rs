//! The kubelet endpoint of every node this process serves, on one port: `containerLogs`
//! (what `kubectl logs` reaches through the apiserver), `exec`, `attach` and `portForward`
//! (forwarded to a provider's own kubelet API), `/pods`, `/metrics` and `/healthz`,
//! with the kubelet's TLS (a self-signed serving certificate, client certificates from the
//! cluster CA in `system:masters`) from the shared serving code.

use crate::{Error, ProviderError, Shared};
use axum::Router;
use axum::extract::{Path, Query, Request, State};
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
        .route("/exec/{ns}/{pod}/{container}", get(stream).post(stream))
        .route("/attach/{ns}/{pod}/{container}", get(stream).post(stream))
        .route("/portForward/{ns}/{pod}", get(stream).post(stream))
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

/// The node serving pod `ns/name`.
fn serving(s: &Shared, ns: &str, name: &str) -> Option<Arc<crate::Served>> {
    let pod = s
        .pods
        .get(&kube::runtime::reflector::ObjectRef::new(name).within(ns));
    pod.as_ref()
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .and_then(|n| s.served(&n))
}

/// The kubelet's 404 for a pod not here.
fn not_served(ns: &str, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        format!("pod {ns}/{name} is not on a node this process serves"),
    )
}

/// Forwards a stream request to the kubelet API of the pod's node; 501 when its provider
/// has none.
async fn forward(s: &Shared, served: &crate::Served, req: Request) -> Response {
    match served.provider.kubelet_api().await {
        Ok(conn) => {
            let node = served.info.lock().expect("node info").name.clone();
            let lost = format!("the connection to node {node} was lost before the stream ended");
            minik8s_kubelet::stream::forward(conn, req, &lost, &s.tasks, &s.shutdown).await
        }
        Err(ProviderError::NotSupported(m)) => status(
            StatusCode::NOT_IMPLEMENTED,
            format!("not supported by this node's provider: {m}"),
        ),
        Err(ProviderError::NotFound(m)) => status(StatusCode::NOT_FOUND, m),
        Err(e) => status(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `exec`, `attach` and `portForward` (`/{verb}/{ns}/{pod}[/{container}]`): forwarded to the
/// kubelet API of the pod's node.
async fn stream(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let mut path = req.uri().path().split('/').skip(2);
    let (ns, name) = (
        path.next().unwrap_or_default().to_owned(),
        path.next().unwrap_or_default().to_owned(),
    );
    match serving(&s, &ns, &name) {
        Some(served) => forward(&s, &served, req).await,
        None => not_served(&ns, &name),
    }
}

/// `GET /containerLogs/{ns}/{pod}/{container}`: from the kubelet API of the pod's node, or
/// its provider's logs.
async fn container_logs(
    State(s): State<Arc<Shared>>,
    Path((ns, name, container)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    let Some(served) = serving(&s, &ns, &name) else {
        return not_served(&ns, &name);
    };
    let forwarded = forward(&s, &served, req).await;
    if forwarded.status() != StatusCode::NOT_IMPLEMENTED {
        return forwarded;
    }
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

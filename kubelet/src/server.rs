//! The kubelet's HTTPS server (port 10250 by default): container logs for the apiserver's
//! `pods/log`, `exec`, `attach` and `portForward` (relayed to the runtime's stream server),
//! `/stats/summary`, Prometheus `/metrics` and `/metrics/resource`, and `/healthz`. Clients must present a certificate from the cluster CA in the
//! `system:masters` group (the apiserver's kubelet-client identity); the serving certificate
//! is self-signed, as upstream's kubelet makes one when none is given.
//!
//! The stream handlers (logs, exec, attach, port-forward) are also a [`streams`] router of
//! their own, which the edgelet serves over the edge link with its own pods.

use crate::cri::{Cri, labels};
use crate::error::{Error, Result, io};
use crate::logs;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The node's pods as the stream handlers see them (the kubelet's informer, or the edgelet's
/// store).
pub type Pods = Arc<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>;

/// What the stream handlers share.
#[derive(Clone)]
pub struct StreamState {
    /// The runtime.
    pub cri: Cri,
    /// The node's pods.
    pub pods: Pods,
    /// The streams being relayed, waited for at shutdown.
    pub tasks: tokio_util::task::TaskTracker,
    /// Ends the relayed streams.
    pub shutdown: CancellationToken,
}

/// What the other handlers share.
#[derive(Clone)]
struct Shared {
    cri: Cri,
    pods: Store<Pod>,
    node: String,
    cpu: Arc<crate::stats::NodeCpu>,
}

/// The kubelet API's stream handlers: `containerLogs` (with `follow`, and over WebSocket),
/// `exec`, `attach` and `portForward` of the pods in `state`.
pub fn streams(state: StreamState) -> Router {
    Router::new()
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .route("/exec/{ns}/{pod}/{container}", get(exec).post(exec))
        .route("/attach/{ns}/{pod}/{container}", get(attach).post(attach))
        .route(
            "/portForward/{ns}/{pod}",
            get(port_forward).post(port_forward),
        )
        .with_state(state)
}

/// The group a client certificate must carry.
const ALLOWED_GROUP: &str = "system:masters";

/// Binds the server; returns the bound address and the future that serves until `shutdown`.
pub async fn bind(
    listen: SocketAddr,
    client_ca: &std::path::Path,
    node: &str,
    cri: Cri,
    pods: Store<Pod>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let tls = minik8s_metrics::serving::self_signed_tls(
        client_ca,
        &[node.to_owned(), "localhost".to_owned()],
    )
    .map_err(|e| Error::Pod(format!("kubelet server: {e}")))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(io(format!("{listen}")))?;
    let addr = listener.local_addr().map_err(io(format!("{listen}")))?;
    let conns = tokio_util::task::TaskTracker::new();
    let informer = pods.clone();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/stats/summary", get(summary))
        .route("/pods", get(node_pods))
        .route("/metrics", get(metrics))
        .route("/metrics/resource", get(resource_metrics))
        .with_state(Shared {
            cri: cri.clone(),
            pods,
            node: node.to_owned(),
            cpu: Arc::new(crate::stats::NodeCpu::default()),
        })
        .merge(streams(StreamState {
            cri,
            pods: Arc::new(move || informer.state()),
            tasks: conns.clone(),
            shutdown: shutdown.clone(),
        }));
    let serve = async move {
        minik8s_metrics::serving::serve_tls(
            listener,
            tls,
            app,
            minik8s_metrics::serving::Access::Group(ALLOWED_GROUP),
            shutdown,
        )
        .await;
        // The exec, attach and port-forward streams the handlers started.
        conns.close();
        conns.wait().await;
    };
    Ok((addr, serve))
}

/// `GET /metrics`: the kubelet's own series.
async fn metrics(State(s): State<Shared>) -> Response {
    let m = crate::metrics::get();
    m.refresh(&s.cri, &s.node).await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            minik8s_metrics::CONTENT_TYPE,
        )],
        minik8s_metrics::encode(&["kubelet"], &[]),
    )
        .into_response()
}

/// `GET /metrics/resource`: CPU and memory of the node, its pods and containers.
async fn resource_metrics(State(s): State<Shared>) -> Response {
    match crate::stats::summary(&s.cri, &s.node, &s.cpu).await {
        Ok(v) => (
            [(
                axum::http::header::CONTENT_TYPE,
                minik8s_metrics::CONTENT_TYPE,
            )],
            minik8s_metrics::encode(&[], &[&crate::metrics::resource_registry(&v)]),
        )
            .into_response(),
        Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /stats/summary`.
async fn summary(State(s): State<Shared>) -> Response {
    match crate::stats::summary(&s.cri, &s.node, &s.cpu).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /pods`: the pods bound to this node as the kubelet sees them (upstream's PodList).
async fn node_pods(State(s): State<Shared>) -> Response {
    let items: Vec<Pod> = s.pods.state().iter().map(|p| (**p).clone()).collect();
    axum::Json(serde_json::json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items,
    }))
    .into_response()
}

/// The pod `ns/name` if it is on this node.
fn pod_of(s: &StreamState, ns: &str, name: &str) -> Option<std::sync::Arc<Pod>> {
    (s.pods)()
        .into_iter()
        .find(|p| p.namespace().as_deref() == Some(ns) && p.name_any() == name)
}

/// The pod's containers named `container`, newest first.
async fn containers_of(
    s: &StreamState,
    pod: &Pod,
    container: &str,
) -> Result<Vec<crate::cri::Container>, Response> {
    let by = HashMap::from([
        (
            labels::POD_UID.to_owned(),
            crate::static_pods::runtime_uid(pod),
        ),
        (labels::CONTAINER_NAME.to_owned(), container.to_owned()),
    ]);
    let mut found = s
        .cri
        .containers(by)
        .await
        .map_err(|e| status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    found.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    Ok(found)
}

/// The id of the pod's newest container named `container`.
async fn container_id(s: &StreamState, pod: &Pod, container: &str) -> Result<String, Response> {
    containers_of(s, pod, container)
        .await?
        .first()
        .map(|c| c.id.clone())
        .ok_or_else(|| {
            status(
                StatusCode::NOT_FOUND,
                format!("container {container} not found in pod {}", pod.name_any()),
            )
        })
}

fn flag(q: &[(String, String)], key: &str) -> bool {
    q.iter()
        .any(|(k, v)| k == key && minik8s_types::parse_bool(v) == Some(true))
}

/// `exec`: runs `command` in the container over an upgraded connection.
async fn exec(
    state: State<StreamState>,
    path: Path<(String, String, String)>,
    query: Query<Vec<(String, String)>>,
    req: axum::http::Request<Body>,
) -> Response {
    container_stream(true, state, path, query, req).await
}

/// `attach`: the container's main process's streams over an upgraded connection.
async fn attach(
    state: State<StreamState>,
    path: Path<(String, String, String)>,
    query: Query<Vec<(String, String)>>,
    req: axum::http::Request<Body>,
) -> Response {
    container_stream(false, state, path, query, req).await
}

/// Exec (`exec` true: `command` from the query) or attach, relayed to the runtime.
async fn container_stream(
    exec: bool,
    State(s): State<StreamState>,
    Path((ns, name, container)): Path<(String, String, String)>,
    Query(q): Query<Vec<(String, String)>>,
    req: axum::http::Request<Body>,
) -> Response {
    let Some(pod) = pod_of(&s, &ns, &name) else {
        return status(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{name} is not on this node"),
        );
    };
    let container_id = match container_id(&s, &pod, &container).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    let (tty, stdin, stdout, stderr) = (
        flag(&q, "tty"),
        flag(&q, "stdin"),
        flag(&q, "stdout"),
        flag(&q, "stderr"),
    );
    if !(stdin || stdout || stderr) {
        return status(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr".into(),
        );
    }
    let url = if exec {
        let cmd = q
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let request = crate::cri::ExecRequest {
            container_id,
            cmd,
            tty,
            stdin,
            stdout,
            stderr,
        };
        s.cri.exec(request).await
    } else {
        let request = crate::cri::AttachRequest {
            container_id,
            stdin,
            tty,
            stdout,
            stderr,
        };
        s.cri.attach(request).await
    };
    let url = match url {
        Ok(u) => u,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let streams = crate::stream::Streams {
        stdin,
        stdout,
        stderr,
        tty,
    };
    crate::stream::serve(&url, req, Some(streams), &s.tasks, &s.shutdown).await
}

/// `portForward`: streams to ports of the pod's network namespace (SPDY).
async fn port_forward(
    State(s): State<StreamState>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<Vec<(String, String)>>,
    req: axum::http::Request<Body>,
) -> Response {
    let Some(pod) = pod_of(&s, &ns, &name) else {
        return status(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{name} is not on this node"),
        );
    };
    let by = HashMap::from([(
        labels::POD_UID.to_owned(),
        crate::static_pods::runtime_uid(&pod),
    )]);
    let mut sandboxes = match s.cri.sandboxes(by).await {
        Ok(v) => v,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    sandboxes.sort_by_key(|x| std::cmp::Reverse(x.created_at));
    let Some(sandbox) = sandboxes.first() else {
        return status(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{name} has no sandbox"),
        );
    };
    let ports: Vec<i32> = q
        .iter()
        .filter(|(k, _)| k == "ports" || k == "port")
        .flat_map(|(_, v)| {
            v.split(',')
                .filter_map(|p| p.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    let url = match s.cri.port_forward(&sandbox.id, ports).await {
        Ok(u) => u,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    crate::stream::serve(&url, req, None, &s.tasks, &s.shutdown).await
}

fn status(code: StatusCode, message: String) -> Response {
    (code, message).into_response()
}

/// `GET /containerLogs/{ns}/{pod}/{container}?follow&tailLines&timestamps&previous&sinceSeconds&sinceTime&limitBytes`
async fn container_logs(
    State(s): State<StreamState>,
    Path((ns, name, container)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
    req: axum::extract::Request,
) -> Response {
    // A WebSocket client (upstream's wsstream protocols) gets the log in messages.
    let ws = if req
        .headers()
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
    {
        use axum::extract::FromRequestParts;
        let (mut parts, _) = req.into_parts();
        match axum::extract::ws::WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => Some(ws),
            Err(e) => return e.into_response(),
        }
    } else {
        None
    };
    let truthy = |k: &str| {
        q.get(k)
            .is_some_and(|v| minik8s_types::parse_bool(v) == Some(true))
    };
    let Some(pod) = pod_of(&s, &ns, &name) else {
        return status(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{name} is not on this node"),
        );
    };
    let found = match containers_of(&s, &pod, &container).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let previous = truthy("previous");
    let Some(target) = found.get(usize::from(previous)) else {
        let what = if previous {
            "previous terminated container"
        } else {
            "container"
        };
        return status(
            StatusCode::BAD_REQUEST,
            format!("{what} \"{container}\" in pod \"{name}\" not found"),
        );
    };
    let id = target.id.clone();
    let path = match s.cri.container_status(&id).await {
        Ok(Some(st)) => st.log_path,
        Ok(None) => return status(StatusCode::NOT_FOUND, format!("container {id} is gone")),
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let opts = logs::Options::from_query(&q);
    let text = tokio::fs::read_to_string(&path).await.unwrap_or_default();
    let (mut lines, consumed) = logs::parse(&text);
    if !truthy("follow") {
        lines.extend(logs::unfinished(&text[consumed..]));
        let first = logs::render(&lines, &opts);
        if let Some(ws) = ws {
            return websocket_log(ws, futures::stream::iter([Ok(bytes::Bytes::from(first))]));
        }
        return (StatusCode::OK, [("content-type", "text/plain")], first).into_response();
    }
    let first = logs::render(&lines, &opts);
    // Follow: what is there now, then new lines as they come, until the container stops.
    let cri = s.cri.clone();
    let stream = futures::stream::unfold(
        (Some(first), consumed, path, false),
        move |(pending, mut offset, path, done)| {
            let cri = cri.clone();
            let id = id.clone();
            let opts = logs::Options {
                tail: None,
                ..opts.clone()
            };
            async move {
                if let Some(p) = pending {
                    return Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(p)),
                        (None, offset, path, done),
                    ));
                }
                if done {
                    return None;
                }
                loop {
                    let text = tokio::fs::read_to_string(&path).await.unwrap_or_default();
                    if text.len() > offset {
                        let (lines, consumed) = logs::parse(&text[offset..]);
                        if consumed > 0 {
                            offset += consumed;
                            let chunk = logs::render(&lines, &opts);
                            return Some((
                                Ok(bytes::Bytes::from(chunk)),
                                (None, offset, path, false),
                            ));
                        }
                    }
                    let running = matches!(
                        cri.container_status(&id).await,
                        Ok(Some(st)) if st.state == crate::cri::ContainerState::ContainerRunning as i32
                    );
                    if !running {
                        // What came before the container stopped, the unfinished last
                        // line included, then the end.
                        let text = tokio::fs::read_to_string(&path).await.unwrap_or_default();
                        let rest = text.get(offset..).unwrap_or_default();
                        let (mut lines, consumed) = logs::parse(rest);
                        lines.extend(logs::unfinished(&rest[consumed..]));
                        if lines.is_empty() {
                            return None;
                        }
                        let chunk = logs::render(&lines, &opts);
                        return Some((
                            Ok(bytes::Bytes::from(chunk)),
                            (None, text.len(), path, true),
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        },
    );
    if let Some(ws) = ws {
        return websocket_log(ws, stream);
    }
    (
        StatusCode::OK,
        [("content-type", "text/plain")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// A log over WebSocket, as upstream serves `pods/log` to a WebSocket client: each chunk a
/// binary message (`binary.k8s.io`, or no protocol) or base64 text (`base64.binary.k8s.io`),
/// then a normal close.
fn websocket_log<S>(ws: axum::extract::ws::WebSocketUpgrade, chunks: S) -> Response
where
    S: futures::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
{
    use axum::extract::ws::{CloseFrame, Message};
    use base64::Engine;
    use futures::StreamExt;
    ws.protocols(["binary.k8s.io", "base64.binary.k8s.io"])
        .on_upgrade(move |mut socket| async move {
            let base64 = socket
                .protocol()
                .is_some_and(|p| p.as_bytes() == b"base64.binary.k8s.io");
            let mut chunks = std::pin::pin!(chunks);
            while let Some(Ok(chunk)) = chunks.next().await {
                if chunk.is_empty() {
                    continue;
                }
                let msg = if base64 {
                    Message::Text(
                        base64::engine::general_purpose::STANDARD
                            .encode(&chunk)
                            .into(),
                    )
                } else {
                    Message::Binary(chunk)
                };
                if socket.send(msg).await.is_err() {
                    return;
                }
            }
            let _ = socket
                .send(Message::Close(Some(CloseFrame {
                    code: 1000,
                    reason: "".into(),
                })))
                .await;
        })
        .into_response()
}

//! `exec`, `attach` and `portForward` on the kubelet server: the kubelet asks the runtime for a
//! streaming URL (CRI `Exec`/`Attach`/`PortForward`) and relays the client's upgraded
//! connection (WebSocket or SPDY) to containerd's stream server. The runtime speaks the
//! channel protocol up to v4; kubectl's v5 (v4 plus a stdin-close frame) is offered to it as
//! v4 and answered as v5, the frames passing through unchanged.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::Empty;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The v5 channel protocol kubectl asks for, and the v4 the runtime knows.
const V5: &str = "v5.channel.k8s.io";
const V4: &str = "v4.channel.k8s.io";

/// Headers of an upgrade that pass through a relay.
const PASSED: [header::HeaderName; 6] = [
    header::UPGRADE,
    header::CONNECTION,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_EXTENSIONS,
];

fn bad_gateway(message: String) -> Response {
    (StatusCode::BAD_GATEWAY, message).into_response()
}

/// Relays an upgrade request (its headers in `headers`, its connection in `upgrade`) to the
/// runtime's streaming `url`, answering the client with the runtime's answer.
/// The relay's tasks run on `tasks` and end at `shutdown`.
pub async fn relay(
    url: &str,
    headers: &HeaderMap,
    upgrade: hyper::upgrade::OnUpgrade,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Response {
    let Ok(uri) = url.parse::<axum::http::Uri>() else {
        return bad_gateway(format!("invalid streaming URL {url}"));
    };
    let host = uri.host().unwrap_or("127.0.0.1").to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let tcp = match tokio::net::TcpStream::connect((host.as_str(), port)).await {
        Ok(t) => t,
        Err(e) => return bad_gateway(format!("dial {host}:{port}: {e}")),
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await {
            Ok(c) => c,
            Err(e) => return bad_gateway(e.to_string()),
        };
    let stop = shutdown.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = conn.with_upgrades() => {}
            _ = stop.cancelled() => {}
        }
    });
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = Request::get(path).header(header::HOST, format!("{host}:{port}"));
    let offered_v5 = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == V5);
    for name in PASSED.iter().chain([&header::HeaderName::from_static(
        "x-stream-protocol-version",
    )]) {
        for value in headers.get_all(name) {
            if *name == header::SEC_WEBSOCKET_PROTOCOL {
                // The runtime does not know v5: offer v4 in its place.
                let rewritten: Vec<String> = value
                    .to_str()
                    .unwrap_or_default()
                    .split(',')
                    .map(|p| {
                        if p.trim() == V5 {
                            V4.to_owned()
                        } else {
                            p.trim().to_owned()
                        }
                    })
                    .collect();
                req = req.header(name, rewritten.join(", "));
            } else {
                req = req.header(name, value);
            }
        }
    }
    let req = match req.body(Empty::<bytes::Bytes>::new()) {
        Ok(r) => r,
        Err(e) => return bad_gateway(e.to_string()),
    };
    let mut resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return bad_gateway(e.to_string()),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let mut answer = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (name, value) in resp.headers() {
        if *name == header::SEC_WEBSOCKET_PROTOCOL && offered_v5 && value == V4 {
            answer = answer.header(name, HeaderValue::from_static(V5));
        } else {
            answer = answer.header(name, value);
        }
    }
    let runtime_side = hyper::upgrade::on(&mut resp);
    let stop = shutdown.clone();
    tasks.spawn(async move {
        let (Ok(client), Ok(runtime)) = (upgrade.await, runtime_side.await) else {
            return;
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut runtime = hyper_util::rt::TokioIo::new(runtime);
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut runtime) => {}
            _ = stop.cancelled() => {}
        }
    });
    answer
        .body(Body::empty())
        .unwrap_or_else(|e| bad_gateway(e.to_string()))
}

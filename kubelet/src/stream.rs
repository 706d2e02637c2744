//! `exec`, `attach` and `portForward` on the kubelet server: the kubelet asks the runtime for a
//! streaming URL (CRI `Exec`/`Attach`/`PortForward`) and relays the client's upgraded
//! connection (SPDY, or WebSocket up to v4) to containerd's stream server as is. The runtime's
//! WebSocket side stops at v4, which cannot close stdin alone, so kubectl's default, the v5
//! channel protocol over WebSocket, is translated here to SPDY toward the runtime
//! ([`translate`], on [`crate::spdy`]); so is v4, which clients such as the Python client
//! send in text frames.

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
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

/// An HTTP/1.1 connection (with upgrades, on `tasks` until `shutdown`) to the runtime's
/// streaming `url`: its sender, `host:port` and path.
async fn connect(
    url: &str,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<
    (
        hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>,
        String,
        String,
    ),
    String,
> {
    let uri = url
        .parse::<axum::http::Uri>()
        .map_err(|e| format!("invalid streaming URL {url}: {e}"))?;
    let host = uri.host().unwrap_or("127.0.0.1").to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("dial {host}:{port}: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    let stop = shutdown.clone();
    minik8s_task::spawn_on(tasks, "runtime-connection", async move {
        tokio::select! {
            _ = conn.with_upgrades() => {}
            _ = stop.cancelled() => {}
        }
    });
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    Ok((sender, format!("{host}:{port}"), path))
}

/// Relays an upgrade request (its headers in `headers`, its connection in `upgrade`) to the
/// runtime's streaming `url`, answering the client with the runtime's answer.
/// The relay's tasks run on `tasks` and end at `shutdown`.
async fn relay(
    url: &str,
    headers: &HeaderMap,
    upgrade: hyper::upgrade::OnUpgrade,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Response {
    let (mut sender, host_port, path) = match connect(url, tasks, shutdown).await {
        Ok(c) => c,
        Err(e) => return bad_gateway(e),
    };
    let mut req = Request::get(path).header(header::HOST, host_port);
    for name in PASSED.iter().chain([&header::HeaderName::from_static(
        "x-stream-protocol-version",
    )]) {
        for value in headers.get_all(name) {
            req = req.header(name, value);
        }
    }
    let req = match req.body(Empty::<bytes::Bytes>::new()) {
        Ok(r) => r,
        Err(e) => return bad_gateway(e.to_string()),
    };
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return bad_gateway(e.to_string()),
    };
    answer(resp, upgrade, None, tasks, shutdown)
}

/// Answers the client with `resp`, the server's answer; when it switched protocols, the
/// client's upgraded connection (`upgrade`) and the server's are joined (on `tasks`, until
/// `shutdown`). With `lost` (a message), a WebSocket channel stream whose server end goes
/// away without closing it tells the client so on its error channel first.
fn answer(
    mut resp: hyper::Response<hyper::body::Incoming>,
    upgrade: hyper::upgrade::OnUpgrade,
    lost: Option<String>,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Response {
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let mut answer = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (name, value) in resp.headers() {
        answer = answer.header(name, value);
    }
    let channels = resp
        .headers()
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::wsframes::Channels::of);
    let server_side = hyper::upgrade::on(&mut resp);
    let stop = shutdown.clone();
    minik8s_task::spawn_on(tasks, "stream-relay", async move {
        let (Ok(client), Ok(server)) = (upgrade.await, server_side.await) else {
            return;
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut server = hyper_util::rt::TokioIo::new(server);
        match (lost, channels) {
            (Some(lost), Some(channels)) => tokio::select! {
                _ = crate::wsframes::relay(client, server, channels, &lost) => {}
                _ = stop.cancelled() => {}
            },
            _ => tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = stop.cancelled() => {}
            },
        }
    });
    answer
        .body(Body::empty())
        .unwrap_or_else(|e| bad_gateway(e.to_string()))
}

/// Forwards a kubelet API request (`req`: logs, exec, attach, port-forward; upgrades
/// included) over `io`, a connection to another kubelet API server (a virtual node's end of
/// a tunnel to its edge), and answers with that server's answer. The forwarded connection
/// and any upgraded stream run on `tasks` until `shutdown`. An exec or attach over WebSocket
/// whose connection ends before its server closed it ends with `lost` on its error channel.
pub async fn forward<I>(
    io: I,
    mut req: Request<Body>,
    lost: &str,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Response
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake::<_, Body>(hyper_util::rt::TokioIo::new(io))
            .await
        {
            Ok(c) => c,
            Err(e) => return bad_gateway(e.to_string()),
        };
    let stop = shutdown.clone();
    minik8s_task::spawn_on(tasks, "forwarded-connection", async move {
        tokio::select! {
            _ = conn.with_upgrades() => {}
            _ = stop.cancelled() => {}
        }
    });
    let upgrade = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = Request::builder().method(parts.method).uri(path);
    for (name, value) in &parts.headers {
        out = out.header(name, value);
    }
    let out = match out.body(body) {
        Ok(r) => r,
        Err(e) => return bad_gateway(e.to_string()),
    };
    match sender.send_request(out).await {
        Ok(resp) => answer(resp, upgrade, Some(lost.to_owned()), tasks, shutdown),
        Err(e) => bad_gateway(e.to_string()),
    }
}

/// kubectl's port-forward over WebSocket: SPDY carried in binary messages.
const TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

/// Whether a WebSocket upgrade request offers subprotocol `protocol`.
fn offers(headers: &HeaderMap, protocol: &str) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
        && headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim() == protocol)
}

/// Serves a streaming request for the runtime's `url`: exec/attach (`streams`) over WebSocket
/// v5 translated, port-forward (`None`) tunnelled over WebSocket unwrapped, anything else
/// (SPDY, WebSocket up to v4) relayed as is.
pub async fn serve(
    url: &str,
    mut req: Request<axum::body::Body>,
    streams: Option<Streams>,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Response {
    use axum::extract::FromRequestParts;
    use axum::extract::ws::WebSocketUpgrade;
    // Exec and attach over WebSocket v5 or v4 are translated (the client may send its
    // channels in text frames, as the Python client does, and v4's status must reach it
    // before the close); older versions and SPDY are relayed.
    let protocol = match streams {
        Some(_) => [V5, V4].into_iter().find(|p| offers(req.headers(), p)),
        None => offers(req.headers(), TUNNEL).then_some(TUNNEL),
    };
    let Some(protocol) = protocol else {
        let upgrade = hyper::upgrade::on(&mut req);
        return relay(url, req.headers(), upgrade, tasks, shutdown).await;
    };
    let (mut parts, _) = req.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(e) => return e.into_response(),
    };
    match streams {
        Some(streams) => translate(url, ws, protocol, streams, tasks, shutdown).await,
        None => tunnel(url, ws, tasks, shutdown).await,
    }
}

/// Serves port-forward tunnelled over WebSocket: the SPDY bytes in the client's binary
/// messages go to the runtime's SPDY port-forward session as they are, and its bytes come
/// back as binary messages.
async fn tunnel(
    url: &str,
    ws: axum::extract::ws::WebSocketUpgrade,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Response {
    use axum::extract::ws::Message;
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let upgraded = match dial_spdy(url, "portforward.k8s.io", tasks, shutdown).await {
        Ok(u) => u,
        Err(e) => return bad_gateway(e),
    };
    let shutdown = shutdown.clone();
    ws.protocols([TUNNEL])
        .on_upgrade(move |socket| async move {
            let (mut rd, mut wr) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
            let (mut to_client, mut from_client) = socket.split();
            let up = async {
                while let Some(Ok(msg)) = from_client.next().await {
                    match msg {
                        Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                        Message::Close(_) => break,
                        _ => {}
                    }
                }
                let _ = wr.shutdown().await;
            };
            let down = async {
                let mut buf = vec![0u8; 32 * 1024];
                while let Ok(n) = rd.read(&mut buf).await {
                    if n == 0
                        || to_client
                            .send(Message::Binary(buf[..n].to_vec().into()))
                            .await
                            .is_err()
                    {
                        break;
                    }
                }
                let _ = to_client.send(Message::Close(None)).await;
            };
            tokio::select! {
                _ = async { tokio::join!(up, down) } => {}
                _ = shutdown.cancelled() => {}
            }
        })
        .into_response()
}

/// Which streams an exec or attach session has.
#[derive(Clone, Copy, Debug)]
pub struct Streams {
    /// The client sends stdin.
    pub stdin: bool,
    /// The client reads stdout.
    pub stdout: bool,
    /// The client reads stderr (none with a TTY).
    pub stderr: bool,
    /// A terminal (with resize messages).
    pub tty: bool,
}

/// Opens an SPDY session to the runtime's streaming `url`.
async fn dial_spdy(
    url: &str,
    protocol: &str,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<hyper::upgrade::Upgraded, String> {
    let (mut sender, host_port, path) = connect(url, tasks, shutdown).await?;
    let req = Request::post(path)
        .header(header::HOST, host_port)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", protocol)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let mut resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(format!("the runtime answered {}", resp.status()));
    }
    hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| e.to_string())
}

/// Serves a v5 or v4 WebSocket exec/attach session by translating it to SPDY toward the
/// runtime (whose WebSocket side stops at v4, which cannot close stdin alone): channel 0
/// (stdin) and 4 (resize) become data on those streams, v5's close of channel 0 closes
/// stdin, and the runtime's stdout, stderr and error (v4's Status) streams come back as
/// channels 1, 2 and 3, in binary or text frames as the client sends.
async fn translate(
    url: &str,
    ws: axum::extract::ws::WebSocketUpgrade,
    protocol: &'static str,
    streams: Streams,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Response {
    let upgraded = match dial_spdy(url, V4, tasks, shutdown).await {
        Ok(u) => u,
        Err(e) => return bad_gateway(e),
    };
    let tasks = tasks.clone();
    let shutdown = shutdown.clone();
    ws.protocols([protocol])
        .on_upgrade(move |socket| async move {
            if let Err(e) = pump(socket, upgraded, protocol, streams, &tasks, &shutdown).await {
                tracing::debug!(error = %e, "exec session");
            }
        })
        .into_response()
}

async fn pump(
    socket: axum::extract::ws::WebSocket,
    upgraded: hyper::upgrade::Upgraded,
    protocol: &str,
    streams: Streams,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> std::io::Result<()> {
    use crate::spdy::{Frame, Reader, Writer};
    use axum::extract::ws::Message;
    use futures::{SinkExt, StreamExt};

    let (rd, wr) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
    let mut w = Writer::new(wr)?;
    let error = w.open(&[("streamtype", "error")]).await?;
    let mut open = async |on: bool, kind: &str| -> std::io::Result<Option<u32>> {
        Ok(if on {
            Some(w.open(&[("streamtype", kind)]).await?)
        } else {
            None
        })
    };
    let stdin = open(streams.stdin, "stdin").await?;
    let stdout = open(streams.stdout, "stdout").await?;
    let stderr = open(streams.stderr && !streams.tty, "stderr").await?;
    let resize = open(streams.tty, "resize").await?;
    // Frames are read on their own task: a read cut off half way would lose the session.
    let (frames_tx, mut frames) = tokio::sync::mpsc::channel(64);
    let stop = shutdown.clone();
    minik8s_task::spawn_on(tasks, "exec-frames", async move {
        let mut r = Reader::new(rd);
        loop {
            let frame = tokio::select! {
                f = r.next() => f,
                _ = stop.cancelled() => return,
            };
            let end = frame.is_err();
            if frames_tx.send(frame).await.is_err() || end {
                return;
            }
        }
    });
    let (mut to_client, mut from_client) = socket.split();
    // Input the runtime no longer takes (its process is done) is dropped, not fatal: what
    // the process wrote is still on its way back and the session still closes cleanly.
    let mut runtime_takes_input = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            msg = from_client.next() => match msg.map(|m| m.map(|m| match m {
                // A text frame carries the channel as its first character, as a binary one.
                Message::Text(t) => Message::Binary(bytes::Bytes::from(t.as_str().as_bytes().to_vec())),
                other => other,
            })) {
                Some(Ok(Message::Binary(b))) if !b.is_empty() && runtime_takes_input => {
                    let sent = match (b[0], stdin, resize) {
                        (0, Some(id), _) => w.data(id, &b[1..], false).await,
                        (4, _, Some(id)) => w.data(id, &b[1..], false).await,
                        (255, Some(id), _) if protocol == V5 && b.get(1) == Some(&0) => {
                            w.data(id, &[], true).await
                        }
                        _ => Ok(()),
                    };
                    if let Err(e) = sent {
                        tracing::debug!(error = %e, "the runtime takes no more input");
                        runtime_takes_input = false;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            frame = frames.recv() => match frame {
                Some(Ok(Ok(Frame::Data { stream, data, .. }))) => {
                    let channel = if stream == error {
                        3
                    } else if Some(stream) == stdout {
                        1
                    } else if Some(stream) == stderr {
                        2
                    } else {
                        continue;
                    };
                    if !data.is_empty() {
                        let mut msg = Vec::with_capacity(data.len() + 1);
                        msg.push(channel);
                        msg.extend_from_slice(&data);
                        if to_client.send(Message::Binary(msg.into())).await.is_err() {
                            break;
                        }
                    }
                }
                Some(Ok(Err(ping))) => {
                    if w.pong(ping).await.is_err() {
                        runtime_takes_input = false;
                    }
                }
                Some(Ok(Ok(Frame::Other | Frame::Open { .. }))) => {}
                // The runtime ends the session once the process is done.
                Some(Ok(Ok(Frame::Reset | Frame::ResetStream { .. }))) | Some(Err(_)) | None => break,
            },
        }
    }
    let _ = w.shutdown().await;
    let _ = to_client
        .send(Message::Close(Some(axum::extract::ws::CloseFrame {
            code: 1000,
            reason: "".into(),
        })))
        .await;
    Ok(())
}

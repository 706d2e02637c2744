//! The runtime's stream server: what a CRI runtime serves at the URLs `Exec`, `Attach` and
//! `PortForward` return. The kubelet relays a client's upgraded connection there (SPDY/3.1;
//! it translates WebSocket clients to SPDY first), and the session runs on Docker: an exec
//! instance or an attach to the container's main process with stdin, stdout, stderr and tty
//! resizes, or connections to the pod's ports made inside the sandbox's network namespace.
//! As upstream's stream server: URLs are single-use tokens that expire after a minute, the
//! exec/attach protocols are `v4.channel.k8s.io` (a `Status` on the error stream at the end,
//! `NonZeroExitCode` with the exit code) and port-forward is `portforward.k8s.io`.

use bollard::Docker;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use minik8s_kubelet::spdy::{Frame, Reader, Writer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a URL stays valid (upstream's stream server: 1 minute).
const TOKEN_TTL: Duration = Duration::from_secs(60);
/// The exec/attach protocols served, in order of preference.
const EXEC_PROTOCOLS: [&str; 2] = ["v4.channel.k8s.io", "v5.channel.k8s.io"];
/// The port-forward protocol.
const PORT_FORWARD: &str = "portforward.k8s.io";

/// A session asked for by a CRI call, waiting for its client.
#[derive(Clone, Debug)]
pub enum Pending {
    /// `Exec`.
    Exec(cri::ExecRequest),
    /// `Attach`.
    Attach(cri::AttachRequest),
    /// `PortForward` into this sandbox (a Docker container id).
    PortForward(String),
}

/// The stream server.
pub struct Streams {
    docker: Docker,
    addr: SocketAddr,
    pending: Mutex<HashMap<String, (Instant, Pending)>>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

/// A process's output from Docker.
type Output = std::pin::Pin<
    Box<
        dyn futures::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>>
            + Send,
    >,
>;
/// A process's input to Docker.
type Input = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

type SharedWriter = Arc<tokio::sync::Mutex<Writer<WriteHalf<TokioIo<hyper::upgrade::Upgraded>>>>>;

impl Streams {
    /// Serves on a loopback port until `shutdown`.
    pub async fn start(
        docker: Docker,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Arc<Streams>, crate::Error> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|source| crate::Error::Io {
                what: "binding the docker runtime's stream server".into(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| crate::Error::Io {
            what: "the stream server's address".into(),
            source,
        })?;
        let streams = Arc::new(Streams {
            docker,
            addr,
            pending: Mutex::new(HashMap::new()),
            tasks: tasks.clone(),
            shutdown: shutdown.clone(),
        });
        let server = streams.clone();
        minik8s_task::spawn_on(tasks, "docker-streams", async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = server.shutdown.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "stream server accept");
                            continue;
                        }
                    },
                };
                let this = server.clone();
                minik8s_task::spawn_on(&server.tasks, "docker-stream-connection", async move {
                    let service = hyper::service::service_fn(move |req| {
                        let this = this.clone();
                        async move { Ok::<_, std::convert::Infallible>(this.handle(req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Ok(streams)
    }

    /// A single-use URL for `what`.
    pub fn register(&self, what: Pending) -> String {
        let kind = match &what {
            Pending::Exec(_) => "exec",
            Pending::Attach(_) => "attach",
            Pending::PortForward(_) => "portforward",
        };
        let token: String = (0..24)
            .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[fastrand(36)]))
            .collect();
        let mut pending = self.pending.lock().expect("pending");
        pending.retain(|_, (at, _)| at.elapsed() < TOKEN_TTL);
        pending.insert(token.clone(), (Instant::now(), what));
        format!("http://{}/{kind}/{token}", self.addr)
    }

    fn handle(self: &Arc<Self>, mut req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let token = req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let found = {
            let mut pending = self.pending.lock().expect("pending");
            pending
                .remove(&token)
                .filter(|(at, _)| at.elapsed() < TOKEN_TTL)
        };
        let Some((_, what)) = found else {
            return text(StatusCode::NOT_FOUND, "unknown or expired stream token");
        };
        let upgrade = req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !upgrade.eq_ignore_ascii_case("SPDY/3.1") {
            return text(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: missing upgrade headers in request",
            );
        }
        let offered: Vec<String> = req
            .headers()
            .get_all("x-stream-protocol-version")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|v| v.trim().to_owned())
            .collect();
        let served: &[&str] = match what {
            Pending::PortForward(_) => &[PORT_FORWARD],
            _ => &EXEC_PROTOCOLS,
        };
        let Some(protocol) = served
            .iter()
            .find(|p| offered.iter().any(|o| o == *p))
            .copied()
        else {
            return text(
                StatusCode::FORBIDDEN,
                &format!(
                    "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {served:?}"
                ),
            );
        };
        let on_upgrade = hyper::upgrade::on(&mut req);
        let this = self.clone();
        minik8s_task::spawn_on(&self.tasks, "docker-stream-session", async move {
            let Ok(upgraded) = on_upgrade.await else {
                return;
            };
            let result = match what {
                Pending::PortForward(sandbox) => this.port_forward(upgraded, &sandbox).await,
                other => this.exec_or_attach(upgraded, other).await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "stream session ended");
            }
        });
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "SPDY/3.1")
            .header("X-Stream-Protocol-Version", protocol)
            .body(Full::new(Bytes::new()))
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response"))
    }

    /// An exec or attach session: waits for the client's streams, runs the process on Docker,
    /// and relays until it ends.
    async fn exec_or_attach(
        self: Arc<Self>,
        upgraded: hyper::upgrade::Upgraded,
        what: Pending,
    ) -> std::io::Result<()> {
        let (stdin_on, stdout_on, stderr_on, tty) = match &what {
            Pending::Exec(r) => (r.stdin, r.stdout, r.stderr, r.tty),
            Pending::Attach(r) => (r.stdin, r.stdout, r.stderr, r.tty),
            Pending::PortForward(_) => return Ok(()),
        };
        let (rd, wr) = tokio::io::split(TokioIo::new(upgraded));
        let mut reader = Reader::new(rd);
        let writer: SharedWriter = Arc::new(tokio::sync::Mutex::new(Writer::new(wr)?));
        // The client's streams, by type, as they come: upstream waits for all it expects
        // (error; stdin, stdout as asked; stderr without a tty; resize with one).
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut early: Vec<Frame> = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let ready = |ids: &HashMap<String, u32>| {
            ids.contains_key("error")
                && (!stdout_on || ids.contains_key("stdout"))
                && (!stdin_on || ids.contains_key("stdin"))
                && (!stderr_on || tty || ids.contains_key("stderr"))
                && (!tty || ids.contains_key("resize"))
        };
        while !ready(&ids) {
            let frame = tokio::time::timeout_at(deadline, reader.next())
                .await
                .map_err(|_| std::io::Error::other("the client's streams did not come"))??;
            match frame {
                Ok(Frame::Open {
                    stream, headers, ..
                }) => {
                    writer.lock().await.reply(stream).await?;
                    if let Some((_, kind)) = headers.iter().find(|(k, _)| k == "streamtype") {
                        ids.insert(kind.clone(), stream);
                    }
                }
                Err(ping) => writer.lock().await.pong(ping).await?,
                Ok(other) => early.push(other),
            }
        }
        let error = ids["error"];
        let stdout = ids.get("stdout").copied();
        let stderr = ids.get("stderr").copied();

        // Start the process on Docker.
        let docker = &self.docker;
        let (mut output, mut input, exec_id, container): (Output, Input, Option<String>, String) =
            match &what {
                Pending::Exec(r) => {
                    let created = docker
                        .create_exec(
                            &r.container_id,
                            bollard::exec::CreateExecOptions {
                                cmd: Some(r.cmd.clone()),
                                attach_stdin: Some(r.stdin),
                                attach_stdout: Some(r.stdout),
                                attach_stderr: Some(r.stderr),
                                tty: Some(r.tty),
                                ..Default::default()
                            },
                        )
                        .await;
                    let created = match created {
                        Ok(c) => c,
                        Err(e) => {
                            return finish(&writer, error, &ids, &failure(&e.to_string())).await;
                        }
                    };
                    match docker
                        .start_exec(
                            &created.id,
                            Some(bollard::exec::StartExecOptions {
                                detach: false,
                                tty: r.tty,
                                ..Default::default()
                            }),
                        )
                        .await
                    {
                        Ok(bollard::exec::StartExecResults::Attached { output, input }) => {
                            (output, input, Some(created.id), r.container_id.clone())
                        }
                        Ok(bollard::exec::StartExecResults::Detached) => {
                            return finish(&writer, error, &ids, &success()).await;
                        }
                        Err(e) => {
                            return finish(&writer, error, &ids, &failure(&e.to_string())).await;
                        }
                    }
                }
                Pending::Attach(r) => {
                    let attached = docker
                        .attach_container(
                            &r.container_id,
                            Some(
                                bollard::query_parameters::AttachContainerOptionsBuilder::default()
                                    .stream(true)
                                    .stdin(r.stdin)
                                    .stdout(r.stdout)
                                    .stderr(r.stderr)
                                    .build(),
                            ),
                        )
                        .await;
                    match attached {
                        Ok(a) => (a.output, a.input, None, r.container_id.clone()),
                        Err(e) => {
                            return finish(&writer, error, &ids, &failure(&e.to_string())).await;
                        }
                    }
                }
                Pending::PortForward(_) => return Ok(()),
            };

        // Client → Docker: stdin, its end, and resizes, on their own task.
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<()>();
        let pump_writer = writer.clone();
        let resize_docker = docker.clone();
        let resize_target = (exec_id.clone(), container.clone());
        let mut ids_in = ids.clone();
        let input_task = minik8s_task::spawn_on(&self.tasks, "docker-stream-input", async move {
            let mut frames = early.into_iter();
            let mut resize_buf = Vec::new();
            loop {
                let frame = match frames.next() {
                    Some(f) => Ok(f),
                    None => tokio::select! {
                        _ = &mut done_rx => return,
                        f = reader.next() => match f {
                            Ok(f) => f,
                            Err(_) => return,
                        },
                    },
                };
                match frame {
                    Ok(Frame::Open {
                        stream, headers, ..
                    }) => {
                        if pump_writer.lock().await.reply(stream).await.is_err() {
                            return;
                        }
                        if let Some((_, kind)) = headers.iter().find(|(k, _)| k == "streamtype") {
                            ids_in.insert(kind.clone(), stream);
                        }
                    }
                    Ok(Frame::Data { stream, data, fin }) => {
                        if Some(&stream) == ids_in.get("stdin") {
                            if !data.is_empty() && input.write_all(&data).await.is_err() {
                                continue;
                            }
                            if fin {
                                let _ = input.shutdown().await;
                            }
                        } else if Some(&stream) == ids_in.get("resize") {
                            resize_buf.extend_from_slice(&data);
                            for size in sizes(&mut resize_buf) {
                                resize(&resize_docker, &resize_target, size).await;
                            }
                        }
                    }
                    Err(ping) => {
                        if pump_writer.lock().await.pong(ping).await.is_err() {
                            return;
                        }
                    }
                    Ok(Frame::Reset) => return,
                    Ok(Frame::ResetStream { .. } | Frame::Other) => {}
                }
            }
        });

        // Docker → client: the process's output until it ends.
        while let Some(chunk) = output.next().await {
            let Ok(chunk) = chunk else { break };
            let (stream, bytes) = match chunk {
                bollard::container::LogOutput::StdErr { message } => (stderr.or(stdout), message),
                other => (stdout, other.into_bytes()),
            };
            let Some(stream) = stream else { continue };
            if writer
                .lock()
                .await
                .data(stream, &bytes, false)
                .await
                .is_err()
            {
                break;
            }
        }
        let _ = done_tx.send(());
        let _ = input_task.await;
        let status = match exec_id {
            Some(id) => match exit_code(docker, &id).await {
                Some(0) | None => success(),
                Some(code) => exit_failure(&what, code),
            },
            None => success(),
        };
        finish(&writer, error, &ids, &status).await
    }

    /// A port-forward session: each request's data stream is a connection to the sandbox's
    /// port, made inside its network namespace; a failure goes to the request's error stream.
    async fn port_forward(
        self: Arc<Self>,
        upgraded: hyper::upgrade::Upgraded,
        sandbox: &str,
    ) -> std::io::Result<()> {
        let pid = self
            .docker
            .inspect_container(
                sandbox,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .ok()
            .and_then(|c| c.state)
            .and_then(|s| s.pid)
            .filter(|p| *p > 0);
        let (rd, wr) = tokio::io::split(TokioIo::new(upgraded));
        let mut reader = Reader::new(rd);
        let writer: SharedWriter = Arc::new(tokio::sync::Mutex::new(Writer::new(wr)?));
        // Per request id: its error stream; per data stream: where its bytes go.
        let mut errors: HashMap<String, u32> = HashMap::new();
        let mut sinks: HashMap<u32, tokio::sync::mpsc::Sender<Option<Vec<u8>>>> = HashMap::new();
        loop {
            let frame = tokio::select! {
                _ = self.shutdown.cancelled() => break,
                f = reader.next() => match f { Ok(f) => f, Err(_) => break },
            };
            match frame {
                Ok(Frame::Open {
                    stream, headers, ..
                }) => {
                    writer.lock().await.reply(stream).await?;
                    let get = |name: &str| {
                        headers
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    let request = get("requestid");
                    tracing::debug!(stream, ?headers, "port-forward stream opened");
                    match get("streamtype").as_str() {
                        "error" => {
                            errors.insert(request, stream);
                        }
                        "data" => {
                            let port: u16 = get("port").parse().unwrap_or(0);
                            let error = errors.get(&request).copied();
                            let (tx, rx) = tokio::sync::mpsc::channel(16);
                            sinks.insert(stream, tx);
                            let writer = writer.clone();
                            let sandbox = sandbox.to_owned();
                            minik8s_task::spawn_on(
                                &self.tasks,
                                "docker-port-forward",
                                async move {
                                    forward_one(writer, pid, &sandbox, port, stream, error, rx)
                                        .await;
                                },
                            );
                        }
                        _ => {}
                    }
                }
                Ok(Frame::Data { stream, data, fin }) => {
                    if let Some(tx) = sinks.get(&stream) {
                        if !data.is_empty() {
                            let _ = tx.send(Some(data)).await;
                        }
                        if fin {
                            let _ = tx.send(None).await;
                        }
                    }
                }
                Err(ping) => writer.lock().await.pong(ping).await?,
                // The client gave up on one connection: its bytes go nowhere now.
                Ok(Frame::ResetStream { stream }) => {
                    sinks.remove(&stream);
                }
                Ok(Frame::Reset) => break,
                Ok(Frame::Other) => {}
            }
        }
        let _ = writer.lock().await.shutdown().await;
        Ok(())
    }
}

/// An exec instance's exit code, once Docker has it (the output ends as the process does,
/// its exit code a moment later).
async fn exit_code(docker: &Docker, exec: &str) -> Option<i64> {
    for _ in 0..40 {
        let inspected = docker.inspect_exec(exec).await.ok()?;
        if inspected.running != Some(true) {
            return inspected.exit_code;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// One forwarded connection: dials the port inside the sandbox's network namespace, then
/// copies both ways until both sides are done.
async fn forward_one(
    writer: SharedWriter,
    pid: Option<i64>,
    sandbox: &str,
    port: u16,
    stream: u32,
    error: Option<u32>,
    mut from_client: tokio::sync::mpsc::Receiver<Option<Vec<u8>>>,
) {
    let dialed = match pid {
        Some(pid) => dial_in(pid, port).await,
        None => Err(std::io::Error::other("the sandbox is not running")),
    };
    let tcp = match dialed {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(sandbox, port, error = %e, "port-forward: dialling the pod failed");
            let message = format!(
                "error forwarding port {port} to pod {sandbox}, uid : failed to connect to localhost:{port} inside namespace of {sandbox}: {e}"
            );
            let mut w = writer.lock().await;
            if let Some(id) = error {
                let _ = w.data(id, message.as_bytes(), true).await;
            }
            let _ = w.data(stream, &[], true).await;
            return;
        }
    };
    tracing::debug!(sandbox, port, stream, "port-forward: connected");
    let (mut rd, mut wr) = tcp.into_split();
    let up = async {
        while let Some(Some(bytes)) = from_client.recv().await {
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if writer
                        .lock()
                        .await
                        .data(stream, &buf[..n], false)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = writer.lock().await.data(stream, &[], true).await;
    };
    tokio::join!(up, down);
    // As upstream's server: the error stream closes too, empty when all went well (the
    // client waits for it before it closes its local connection).
    if let Some(id) = error {
        let _ = writer.lock().await.data(id, &[], true).await;
    }
}

/// A TCP connection to 127.0.0.1:`port` made inside the network namespace of process `pid`
/// (a thread of its own enters it, dials and ends; the socket stays in that namespace).
async fn dial_in(pid: i64, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("netns-dial".into())
        .spawn(move || {
            let dialed = (|| -> std::io::Result<std::net::TcpStream> {
                let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
                rustix::thread::move_into_link_name_space(
                    std::os::fd::AsFd::as_fd(&ns),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
                std::net::TcpStream::connect_timeout(
                    &SocketAddr::from(([127, 0, 0, 1], port)),
                    Duration::from_secs(5),
                )
            })();
            let _ = tx.send(dialed);
        })?;
    let std_stream = rx
        .await
        .map_err(|_| std::io::Error::other("the namespace thread ended without an answer"))??;
    std_stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(std_stream)
}

/// The terminal sizes complete in `buf` (JSON objects, one after another), removed from it.
fn sizes(buf: &mut Vec<u8>) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(buf).into_iter::<serde_json::Value>();
    let mut used = 0;
    while let Some(Ok(v)) = de.next() {
        used = de.byte_offset();
        let w = v
            .get("Width")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        let h = v
            .get("Height")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0);
        out.push((w as u16, h as u16));
    }
    buf.drain(..used);
    out
}

async fn resize(docker: &Docker, target: &(Option<String>, String), (w, h): (u16, u16)) {
    if w == 0 || h == 0 {
        return;
    }
    let _ = match &target.0 {
        Some(exec) => {
            docker
                .resize_exec(
                    exec,
                    bollard::exec::ResizeExecOptions {
                        height: h,
                        width: w,
                    },
                )
                .await
        }
        None => {
            docker
                .resize_container_tty(
                    &target.1,
                    bollard::query_parameters::ResizeContainerTTYOptionsBuilder::default()
                        .h(i32::from(h))
                        .w(i32::from(w))
                        .build(),
                )
                .await
        }
    };
}

fn success() -> String {
    r#"{"metadata":{},"status":"Success"}"#.to_owned()
}

fn failure(message: &str) -> String {
    serde_json::json!({"metadata": {}, "status": "Failure", "message": message}).to_string()
}

/// Upstream's status for a process that exited non-zero (kubectl exits with its code).
fn exit_failure(what: &Pending, code: i64) -> String {
    let cmd = match what {
        Pending::Exec(r) => format!("{:?}", r.cmd),
        _ => String::new(),
    };
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command {cmd}, exit code {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
    .to_string()
}

/// Ends a session: the status on the error stream, every stream closed, the connection shut.
async fn finish(
    writer: &SharedWriter,
    error: u32,
    ids: &HashMap<String, u32>,
    status: &str,
) -> std::io::Result<()> {
    let mut w = writer.lock().await;
    w.data(error, status.as_bytes(), true).await?;
    for (kind, id) in ids {
        if kind != "error" {
            let _ = w.data(*id, &[], true).await;
        }
    }
    w.shutdown().await
}

fn text(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(message.to_owned())))
        .unwrap_or_default()
}

/// A random index below `n` (tokens need not be secret from the machine's root, only
/// unguessable across requests; the time and a counter through a hash do).
fn fastrand(n: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() % n as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_messages_read_as_they_complete() {
        let mut buf = br#"{"Width":80,"Height":24}{"Width":100,"#.to_vec();
        assert_eq!(sizes(&mut buf), [(80, 24)]);
        buf.extend_from_slice(br#""Height":30}"#);
        assert_eq!(sizes(&mut buf), [(100, 30)]);
        assert!(buf.is_empty());
    }

    #[test]
    fn a_non_zero_exit_is_upstreams_status() {
        let what = Pending::Exec(cri::ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), "exit 3".into()],
            ..Default::default()
        });
        let status: serde_json::Value = serde_json::from_str(&exit_failure(&what, 3)).unwrap();
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0]["message"], "3");
    }
}

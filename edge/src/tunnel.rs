//! Streams over the edge link (KubeEdge's CloudStream/EdgeStream, on the edge protocol): for
//! each kubelet API request of an edge pod (logs, exec, attach, port-forward), the cloud opens
//! one `Stream` call and runs an HTTP/1.1 connection over it; the edgelet serves that
//! connection with the kubelet's own stream handlers over its pods and runtime. A call's
//! frames carry the connection's bytes, so SPDY, WebSocket (v4, v5) and chunked logs cross
//! unchanged, each direction flow-controlled by the call's HTTP/2 stream and a small queue.

use crate::proto::{Hello, StreamFrame};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The largest frame's data.
pub const CHUNK: usize = 32 * 1024;
/// Frames queued per direction before the writer waits.
pub const QUEUE: usize = 16;

/// Joins a call's two directions into one connection: what is written to the returned end
/// leaves as frames through `out` (each made by `frame`), and the data of the frames arriving
/// on `incoming` is read from it. Ends (EOF, then the frames' sender dropped) when either
/// side ends, the call fails or `stop` fires.
pub fn join<S, T>(
    incoming: S,
    out: mpsc::Sender<T>,
    frame: fn(StreamFrame) -> T,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) -> DuplexStream
where
    S: Stream<Item = Result<StreamFrame, tonic::Status>> + Send + Unpin + 'static,
    T: Send + 'static,
{
    let (near, far) = tokio::io::duplex(CHUNK * 2);
    let (mut rd, mut wr) = tokio::io::split(far);
    let stop = stop.clone();
    // The call failed or went away: the whole connection ends at once (not only one
    // direction), so nothing it carried lingers at either end.
    let failed = CancellationToken::new();
    minik8s_task::spawn_on(tasks, "edge-stream", async move {
        let outgoing = async {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = tokio::select! {
                    r = rd.read(&mut buf) => match r {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    },
                    _ = out.closed() => {
                        failed.cancel();
                        break;
                    }
                };
                let f = StreamFrame {
                    hello: None,
                    data: buf[..n].to_vec(),
                };
                if out.send(frame(f)).await.is_err() {
                    failed.cancel();
                    break;
                }
            }
            drop(out);
        };
        let incoming = async {
            let mut incoming = incoming;
            while let Some(f) = incoming.next().await {
                match f {
                    Ok(f) if f.data.is_empty() => {}
                    Ok(f) => {
                        if wr.write_all(&f.data).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "edge stream failed");
                        failed.cancel();
                        break;
                    }
                }
            }
            let _ = wr.shutdown().await;
        };
        tokio::select! {
            _ = async { tokio::join!(outgoing, incoming) } => {}
            _ = failed.cancelled() => {}
            _ = stop.cancelled() => {}
        }
    });
    near
}

/// The cloud's first frame: the hello, no data.
pub fn opening(hello: Option<Hello>) -> StreamFrame {
    StreamFrame {
        hello,
        data: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two joined ends, as the two sides of a call: bytes cross both ways, and closing one
    /// side's writing ends the other's reading.
    #[tokio::test]
    async fn bytes_cross_both_ways_and_an_end_is_seen() {
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let (a_out, b_in) = mpsc::channel::<Result<StreamFrame, tonic::Status>>(QUEUE);
        let (b_out, a_in) = mpsc::channel::<Result<StreamFrame, tonic::Status>>(QUEUE);
        let mut a = join(
            tokio_stream::wrappers::ReceiverStream::new(a_in),
            a_out,
            Ok,
            &tasks,
            &stop,
        );
        let mut b = join(
            tokio_stream::wrappers::ReceiverStream::new(b_in),
            b_out,
            Ok,
            &tasks,
            &stop,
        );
        let big = vec![7u8; CHUNK * 5 + 3];
        let writer = {
            let big = big.clone();
            async move {
                a.write_all(&big).await.unwrap();
                a.shutdown().await.unwrap();
                let mut back = Vec::new();
                a.read_to_end(&mut back).await.unwrap();
                back
            }
        };
        let echo = async move {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.unwrap();
            b.write_all(b"done").await.unwrap();
            b.shutdown().await.unwrap();
            got
        };
        let (back, got) = tokio::join!(writer, echo);
        assert_eq!(got, big);
        assert_eq!(back, b"done");
    }

    /// A failed call (the link lost) ends the connection's reading.
    #[tokio::test]
    async fn a_failed_call_ends_the_connection() {
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let (out, _keep) = mpsc::channel::<StreamFrame>(QUEUE);
        let failed = futures::stream::iter([Err(tonic::Status::unavailable("link lost"))]);
        let mut conn = join(failed, out, |f| f, &tasks, &stop);
        let mut got = Vec::new();
        conn.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
    }
}

//! The server's side of a relayed WebSocket channel stream (`*.channel.k8s.io`: exec and
//! attach), followed frame by frame so that a stream whose server end goes away without a
//! close frame (an edge whose link was lost) still ends as upstream's streams end: a `Status`
//! on the error channel (3), then a close. Bytes pass unchanged; only frame boundaries are
//! tracked.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The error channel of the channel protocols.
const ERROR_CHANNEL: u8 = 3;
/// WebSocket opcodes.
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;

/// How a channel protocol writes its channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channels {
    /// A binary frame whose first byte is the channel (`channel.k8s.io` up to v5).
    Binary,
    /// A text frame: the channel as an ASCII digit, then the data in base64
    /// (`base64.channel.k8s.io`, `v4.base64.channel.k8s.io`).
    Base64,
}

impl Channels {
    /// The framing of the negotiated subprotocol `protocol` (`None`: not a channel protocol).
    pub fn of(protocol: &str) -> Option<Channels> {
        match protocol.trim() {
            "channel.k8s.io" | "v2.channel.k8s.io" | "v3.channel.k8s.io" | "v4.channel.k8s.io"
            | "v5.channel.k8s.io" => Some(Channels::Binary),
            "base64.channel.k8s.io" | "v4.base64.channel.k8s.io" => Some(Channels::Base64),
            _ => None,
        }
    }

    /// The frames that end a stream with `message`: a failure `Status` on the error channel
    /// and a normal close.
    pub fn failure(self, message: &str) -> Vec<u8> {
        let status = serde_json::json!({
            "metadata": {}, "status": "Failure", "message": message,
            "reason": "InternalError", "code": 500,
        })
        .to_string();
        let mut out = match self {
            Channels::Binary => {
                let mut payload = vec![ERROR_CHANNEL];
                payload.extend_from_slice(status.as_bytes());
                frame(BINARY, &payload)
            }
            Channels::Base64 => {
                use base64::Engine;
                let mut payload = vec![b'0' + ERROR_CHANNEL];
                payload.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(status)
                        .as_bytes(),
                );
                frame(TEXT, &payload)
            }
        };
        out.extend(frame(CLOSE, &1000u16.to_be_bytes()));
        out
    }
}

/// One unmasked, final frame (as a server sends).
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// Where a stream of frames stands.
#[derive(Debug, Default)]
pub struct Frames {
    /// The header read so far of the frame being read.
    header: Vec<u8>,
    /// Payload bytes of the current frame still to come.
    left: u64,
    /// A close frame has been seen.
    pub closed: bool,
}

impl Frames {
    /// Follows `bytes`, the next bytes of the stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let n = self.left.min(bytes.len() as u64) as usize;
                self.left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            self.header.push(bytes[0]);
            bytes = &bytes[1..];
            if let Some(len) = self.header_done() {
                if self.header[0] & 0x0f == CLOSE {
                    self.closed = true;
                }
                self.header.clear();
                self.left = len;
            }
        }
    }

    /// The payload length once the header is complete.
    fn header_done(&self) -> Option<u64> {
        let h = &self.header;
        if h.len() < 2 {
            return None;
        }
        let masked = h[1] & 0x80 != 0;
        let (extra, len) = match h[1] & 0x7f {
            126 => (2, None),
            127 => (8, None),
            n => (0, Some(u64::from(n))),
        };
        let need = 2 + extra + if masked { 4 } else { 0 };
        if h.len() < need {
            return None;
        }
        Some(len.unwrap_or_else(|| {
            h[2..2 + extra]
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
        }))
    }

    /// Whether the stream is between frames.
    pub fn between(&self) -> bool {
        self.left == 0 && self.header.is_empty()
    }
}

/// Joins a client's upgraded connection to a server's: the client's bytes pass as they are;
/// the server's too, followed frame by frame, and when the server's end goes (EOF or an
/// error) between frames and before a close, the client gets `lost` as the stream's failure.
/// Ends when the server's side does.
pub async fn relay<C, S>(client: C, server: S, channels: Channels, lost: &str)
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_rd, mut client_wr) = tokio::io::split(client);
    let (mut server_rd, mut server_wr) = tokio::io::split(server);
    let up = async {
        let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
        let _ = server_wr.shutdown().await;
        // The client is done sending; what the server still sends decides the end.
        std::future::pending::<()>().await;
    };
    let down = async {
        let mut frames = Frames::default();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match server_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    frames.feed(&buf[..n]);
                    if client_wr.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
        if !frames.closed && frames.between() {
            tracing::info!(message = %lost, "a relayed stream's server went away before closing it");
            let _ = client_wr.write_all(&channels.failure(lost)).await;
        }
        let _ = client_wr.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_followed_across_reads_and_lengths() {
        let mut f = Frames::default();
        let mut stream = frame(BINARY, b"\x01hello");
        stream.extend(frame(BINARY, &vec![7u8; 300]));
        stream.extend(frame(BINARY, &vec![7u8; 70_000]));
        // A client's masked frame too.
        stream.extend([0x82, 0x80 | 3, 1, 2, 3, 4, 9, 9, 9]);
        for chunk in stream.chunks(5) {
            f.feed(chunk);
        }
        assert!(f.between());
        assert!(!f.closed);
        f.feed(&frame(BINARY, b"\x01partial")[..4]);
        assert!(!f.between());
        let mut f = Frames::default();
        f.feed(&Channels::Binary.failure("gone"));
        assert!(f.closed && f.between());
    }

    #[test]
    fn the_failure_is_a_status_on_the_error_channel() {
        let out = Channels::Binary.failure("the link to node edge-a was lost");
        assert_eq!(out[0], 0x82);
        let len = usize::from(out[1]);
        assert_eq!(out[2], ERROR_CHANNEL);
        let status: serde_json::Value = serde_json::from_slice(&out[3..2 + len]).unwrap();
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["message"], "the link to node edge-a was lost");
        assert_eq!(&out[2 + len..], &[0x88, 2, 0x03, 0xe8]);
        let text = Channels::Base64.failure("x");
        assert_eq!(text[0], 0x81);
        assert_eq!(text[2], b'3');
        assert_eq!(
            Channels::of("v4.base64.channel.k8s.io"),
            Some(Channels::Base64)
        );
        assert_eq!(Channels::of("SPDY/3.1+portforward.k8s.io"), None);
    }

    #[tokio::test]
    async fn a_server_gone_between_frames_ends_the_stream_with_the_message() {
        let (client, mut client_far) = tokio::io::duplex(1 << 16);
        let (server, mut server_far) = tokio::io::duplex(1 << 16);
        server_far
            .write_all(&frame(BINARY, b"\x01out"))
            .await
            .unwrap();
        drop(server_far);
        let mut got = Vec::new();
        let (_, read) = tokio::join!(
            relay(client, server, Channels::Binary, "the link was lost"),
            client_far.read_to_end(&mut got)
        );
        read.unwrap();
        let mut expected = frame(BINARY, b"\x01out");
        expected.extend(Channels::Binary.failure("the link was lost"));
        assert_eq!(got, expected);
    }
}

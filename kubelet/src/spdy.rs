//! A small SPDY/3.1 codec, as much as the Kubernetes streaming protocols need: the client
//! side toward the runtime's stream server (streams opened by the client with a `streamtype`
//! header), and the server side of a runtime's stream server (streams the client opened, read
//! with their headers and answered with a reply); data frames both ways, FIN to close a
//! direction, PING answered. Header blocks are zlib streams (one per direction, for the whole
//! session) primed with the spec's dictionary. Go's spdystream keeps no flow-control windows,
//! so none are kept here.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const PING: u16 = 6;
/// Flag closing the sender's direction of a stream.
pub const FIN: u8 = 0x01;

/// The header names that start the spec's dictionary, each written length-prefixed.
const DICTIONARY_WORDS: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The rest of the spec's dictionary, written as is.
const DICTIONARY_TAIL: &str = "100101201202205206300302303304305306307402405406407408409410\
411412413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved \
Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server \
Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov \
Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,\
image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivate\
max-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// The SPDY/3 header compression dictionary (1,423 bytes).
pub fn dictionary() -> Vec<u8> {
    let mut out = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        out.extend_from_slice(&(w.len() as u32).to_be_bytes());
        out.extend_from_slice(w.as_bytes());
    }
    out.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    out
}

fn bad(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// One frame read from the peer.
#[derive(Debug)]
pub enum Frame {
    /// Data on a stream; `fin` closes the peer's direction.
    Data {
        /// The stream.
        stream: u32,
        /// The bytes.
        data: Vec<u8>,
        /// Whether the peer is done sending on it.
        fin: bool,
    },
    /// The peer opens a stream (SYN_STREAM) with these headers (names lowercase).
    Open {
        /// The stream.
        stream: u32,
        /// Its headers.
        headers: Vec<(String, String)>,
        /// Whether the peer sends nothing on it.
        fin: bool,
    },
    /// The peer ends the session (GOAWAY).
    Reset,
    /// The peer ends one stream (RST_STREAM).
    ResetStream {
        /// The stream.
        stream: u32,
    },
    /// Anything else (replies, settings, pings already answered).
    Other,
}

/// Writes frames to the server (header compression state included).
pub struct Writer<W> {
    io: W,
    deflate: Compress,
    next_stream: u32,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    /// A writer over the upgraded connection's write half.
    pub fn new(io: W) -> io::Result<Self> {
        let mut deflate = Compress::new(Compression::default(), true);
        deflate
            .set_dictionary(&dictionary())
            .map_err(|e| bad(e.to_string()))?;
        Ok(Writer {
            io,
            deflate,
            next_stream: 1,
        })
    }

    fn compress(&mut self, block: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(block.len() + 64);
        let start = self.deflate.total_in();
        loop {
            let done = (self.deflate.total_in() - start) as usize;
            out.reserve(256);
            self.deflate
                .compress_vec(&block[done..], &mut out, FlushCompress::Sync)
                .map_err(|e| bad(e.to_string()))?;
            if (self.deflate.total_in() - start) as usize == block.len()
                && out.capacity() > out.len()
            {
                return Ok(out);
            }
        }
    }

    async fn control(&mut self, kind: u16, flags: u8, body: &[u8]) -> io::Result<()> {
        let mut frame = Vec::with_capacity(8 + body.len());
        frame.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
        frame.extend_from_slice(&kind.to_be_bytes());
        frame.push(flags);
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(body);
        self.io.write_all(&frame).await
    }

    fn header_block(&mut self, headers: &[(&str, &str)]) -> io::Result<Vec<u8>> {
        let mut block = Vec::new();
        block.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (name, value) in headers {
            for s in [name, value] {
                block.extend_from_slice(&(s.len() as u32).to_be_bytes());
                block.extend_from_slice(s.as_bytes());
            }
        }
        self.compress(&block)
    }

    /// Opens a stream with the given headers (names lowercase); returns its id.
    pub async fn open(&mut self, headers: &[(&str, &str)]) -> io::Result<u32> {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut body = Vec::new();
        body.extend_from_slice(&id.to_be_bytes());
        body.extend_from_slice(&0u32.to_be_bytes()); // associated-to stream
        body.extend_from_slice(&[0, 0]); // priority, slot
        body.extend_from_slice(&self.header_block(headers)?);
        self.control(SYN_STREAM, 0, &body).await?;
        Ok(id)
    }

    /// Accepts a stream the peer opened (SYN_REPLY, no headers): Go's client waits for it.
    pub async fn reply(&mut self, stream: u32) -> io::Result<()> {
        let mut body = Vec::new();
        body.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        body.extend_from_slice(&self.header_block(&[])?);
        self.control(SYN_REPLY, 0, &body).await
    }

    /// Sends `data` on `stream` (and closes this side of it with `fin`).
    pub async fn data(&mut self, stream: u32, data: &[u8], fin: bool) -> io::Result<()> {
        for (i, chunk) in data.chunks(0xff_ffff).enumerate() {
            let last = (i + 1) * 0xff_ffff >= data.len();
            self.data_frame(stream, chunk, fin && last).await?;
        }
        if data.is_empty() {
            self.data_frame(stream, &[], fin).await?;
        }
        Ok(())
    }

    async fn data_frame(&mut self, stream: u32, data: &[u8], fin: bool) -> io::Result<()> {
        let mut frame = Vec::with_capacity(8 + data.len());
        frame.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        frame.push(if fin { FIN } else { 0 });
        frame.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        frame.extend_from_slice(data);
        self.io.write_all(&frame).await
    }

    /// Answers a PING with the same id.
    pub async fn pong(&mut self, id: u32) -> io::Result<()> {
        self.control(PING, 0, &id.to_be_bytes()).await
    }

    /// Flushes and shuts the write half.
    pub async fn shutdown(&mut self) -> io::Result<()> {
        self.io.shutdown().await
    }
}

/// Reads frames from the server (header decompression state included).
pub struct Reader<R> {
    io: R,
    inflate: Decompress,
    dictionary: Vec<u8>,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    /// A reader over the upgraded connection's read half.
    pub fn new(io: R) -> Self {
        Reader {
            io,
            inflate: Decompress::new(true),
            dictionary: dictionary(),
        }
    }

    /// Runs a compressed header block through the session's inflate stream; its bytes.
    fn inflate(&mut self, block: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(4096);
        let start = self.inflate.total_in();
        loop {
            let done = (self.inflate.total_in() - start) as usize;
            if done == block.len() {
                return Ok(out);
            }
            let before = out.len();
            out.reserve(4096);
            match self
                .inflate
                .decompress_vec(&block[done..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(&self.dictionary)
                        .map_err(|e| bad(e.to_string()))?;
                }
                Err(e) => return Err(bad(format!("header block: {e}"))),
            }
            if (self.inflate.total_in() - start) as usize == done && out.len() == before {
                return Err(bad("header block: no progress"));
            }
        }
    }

    /// Reads the next frame; a PING's id comes back as `Err(Ok(id))` for the caller to answer.
    pub async fn next(&mut self) -> io::Result<Result<Frame, u32>> {
        let mut head = [0u8; 8];
        self.io.read_exact(&mut head).await?;
        let flags = head[4];
        let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let mut body = vec![0u8; len];
        self.io.read_exact(&mut body).await?;
        if head[0] & 0x80 == 0 {
            let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
            return Ok(Ok(Frame::Data {
                stream,
                data: body,
                fin: flags & FIN != 0,
            }));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        match kind {
            // SYN_STREAM (10 bytes before the block), SYN_REPLY and HEADERS (4 bytes).
            1 if body.len() >= 10 => {
                let stream = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) & 0x7fff_ffff;
                let block = self.inflate(&body[10..])?;
                return Ok(Ok(Frame::Open {
                    stream,
                    headers: headers(&block)?,
                    fin: flags & FIN != 0,
                }));
            }
            2 | 8 if body.len() >= 4 => {
                self.inflate(&body[4..])?;
            }
            3 if body.len() >= 4 => {
                let stream = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) & 0x7fff_ffff;
                return Ok(Ok(Frame::ResetStream { stream }));
            }
            3 | 7 => return Ok(Ok(Frame::Reset)),
            6 if body.len() >= 4 => {
                return Ok(Err(u32::from_be_bytes([
                    body[0], body[1], body[2], body[3],
                ])));
            }
            _ => {}
        }
        Ok(Ok(Frame::Other))
    }
}

/// The name/value pairs of a decompressed header block.
fn headers(block: &[u8]) -> io::Result<Vec<(String, String)>> {
    // The count, then each name and value, each length-prefixed.
    let mut at = 4usize;
    let mut word = || -> io::Result<String> {
        let len = block
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| bad("header block: truncated"))?;
        let text = block
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| bad("header block: truncated"))?;
        at += 4 + len;
        Ok(String::from_utf8_lossy(text).into_owned())
    };
    let count = block
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| bad("header block: truncated"))?;
    let mut out = Vec::new();
    for _ in 0..count.min(256) {
        let name = word()?;
        let value = word()?;
        out.push((name.to_ascii_lowercase(), value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dictionary_is_the_specs() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b"enq=0."));
    }

    #[tokio::test]
    async fn header_blocks_round_trip_through_the_session_streams() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let mut w = Writer::new(client).unwrap();
        let mut r = Reader::new(server);
        let a = w.open(&[("streamtype", "error")]).await.unwrap();
        let b = w.open(&[("streamtype", "stdout")]).await.unwrap();
        assert_eq!((a, b), (1, 3));
        w.data(b, b"hi", true).await.unwrap();
        // SYN_STREAMs read back with their headers through one inflate stream, then the
        // data.
        match r.next().await.unwrap() {
            Ok(Frame::Open {
                stream, headers, ..
            }) => {
                assert_eq!(stream, 1);
                assert_eq!(headers, [("streamtype".to_owned(), "error".to_owned())]);
            }
            other => panic!("{other:?}"),
        }
        match r.next().await.unwrap() {
            Ok(Frame::Open {
                stream, headers, ..
            }) => {
                assert_eq!(stream, 3);
                assert_eq!(headers, [("streamtype".to_owned(), "stdout".to_owned())]);
            }
            other => panic!("{other:?}"),
        }
        match r.next().await.unwrap() {
            Ok(Frame::Data { stream, data, fin }) => {
                assert_eq!((stream, data.as_slice(), fin), (3, &b"hi"[..], true));
            }
            other => panic!("{other:?}"),
        }
        w.pong(7).await.unwrap();
        assert!(matches!(r.next().await.unwrap(), Err(7)));
        // A server's reply reads as another frame, its header block inflated.
        w.reply(3).await.unwrap();
        assert!(matches!(r.next().await.unwrap(), Ok(Frame::Other)));
    }
}

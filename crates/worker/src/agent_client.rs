//! The worker's side of the agent protocol: length-prefixed frames over one persistent
//! Unix-socket connection per sandbox (runtime/python/README.md).
//!
//! Hand-written on purpose: this is the hot path of every warm invocation. A request is one
//! vectored `write` of an 8-byte header and the payload; a reply is a 16-byte header (length,
//! status, flags, exec_us) read with usually one `read`, then the body. The body's length is
//! checked against the limit before a byte of it is buffered.

use bytes::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use std::io::{IoSlice, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Room beyond the result limit for an error answer (a handler's message and traceback; the
/// agent truncates long messages to fit).
pub const ERROR_MARGIN_BYTES: usize = 64 * 1024;

/// Request header: u32 BE payload length, op, 3 zero bytes.
const REQ_HEADER: usize = 8;
/// Response header: u32 BE body length, u16 BE status, u16 BE flags, u64 BE exec_us.
const RESP_HEADER: usize = 16;
/// Response flag: the exec_us field is present.
const FLAG_EXEC_US: u16 = 1;
const OP_HEALTH: u8 = b'H';
const OP_INVOKE: u8 = b'I';
const OP_LOAD: u8 = b'L';
/// Receive buffer for headers and small bodies; a larger body is read straight into its own.
const RBUF_SIZE: usize = 16 * 1024;

/// One response from the agent.
#[derive(Debug, Clone)]
pub struct AgentReply {
    pub status: u16,
    /// Handler time measured inside the agent (the frame's exec_us, when flagged present).
    pub exec_us: Option<u64>,
    pub body: Bytes,
}

/// The connection failed: the agent died or spoke nonsense. The sandbox is not reusable.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent closed the connection")]
    Closed,
    #[error("agent connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("agent sent a malformed response: {0}")]
    Malformed(String),
    /// The agent announced a body over the limit: it was not read, so the connection is lost.
    #[error("the sandbox's answer of {size} bytes is over the limit of {limit} bytes")]
    TooLarge { size: usize, limit: usize },
}

/// A persistent connection to one agent.
///
/// The socket is registered with the runtime for reading only. A Unix socket signals "writable"
/// every time its peer reads (the kernel's `unix_write_space`), so a socket registered for both
/// woke a sleeping runtime thread once per request for nothing: when the agent took the request
/// in. Requests fit the socket buffer (they alternate with replies), so a write almost never
/// blocks; when one does, a duplicate of the socket is registered for writing until it is done.
pub struct AgentConn {
    sock: AsyncFd<UnixStream>,
    /// Received bytes not yet consumed are `rbuf[start..end]`.
    rbuf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The largest result body read (an error answer may add [`ERROR_MARGIN_BYTES`]).
    max_result: usize,
}

impl AgentConn {
    /// Connects to the agent at `path`; a 200 body over `max_result` bytes is never read.
    pub async fn connect(path: &Path, max_result: usize) -> std::io::Result<Self> {
        // tokio's connect does not block the thread; its socket comes back non-blocking.
        let stream = tokio::net::UnixStream::connect(path).await?.into_std()?;
        Ok(AgentConn {
            sock: register(stream, Interest::READABLE)?,
            rbuf: vec![0u8; RBUF_SIZE].into_boxed_slice(),
            start: 0,
            end: 0,
            max_result,
        })
    }

    /// Op `I`: calls the handler with `args` (JSON; empty means `{}`).
    pub async fn invoke(&mut self, args: &[u8]) -> Result<AgentReply, AgentError> {
        self.request(OP_INVOKE, args).await
    }

    /// Op `H`: after start-up this says whether the handler imported (or that the agent is
    /// generic, waiting for [`AgentConn::load`]).
    pub async fn health(&mut self) -> Result<AgentReply, AgentError> {
        self.request(OP_HEALTH, &[]).await
    }

    /// Op `L`: specializes a generic agent to one function (env, chdir into `code_dir`, import
    /// `handler`). Answers as health does afterwards; 409 if a handler is already loaded.
    pub async fn load(
        &mut self,
        handler: &str,
        code_dir: &str,
        env: &[(String, String)],
    ) -> Result<AgentReply, AgentError> {
        let payload = serde_json::to_vec(&LoadRequest {
            handler,
            code_dir,
            env: EnvMap(env),
        })
        .map_err(std::io::Error::from)?;
        self.request(OP_LOAD, &payload).await
    }

    async fn request(&mut self, op: u8, payload: &[u8]) -> Result<AgentReply, AgentError> {
        if self.start != self.end {
            return Err(AgentError::Malformed(
                "bytes arrived before a request was sent".into(),
            ));
        }
        let len = u32::try_from(payload.len()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "request payload over 4 GiB",
            )
        })?;
        let mut hdr = [0u8; REQ_HEADER];
        hdr[..4].copy_from_slice(&len.to_be_bytes());
        hdr[4] = op;
        let written = self.write_now(&hdr, payload)?;
        if written < REQ_HEADER + payload.len() {
            self.write_rest(&hdr, payload, written).await?;
        }
        self.read_reply().await
    }

    /// Writes what the socket takes without waiting; how many bytes of header + payload.
    fn write_now(&self, hdr: &[u8], payload: &[u8]) -> Result<usize, AgentError> {
        let mut written = 0;
        while written < hdr.len() + payload.len() {
            match write_from(self.sock.get_ref(), hdr, payload, written) {
                Ok(0) => return Err(AgentError::Closed),
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(written)
    }

    /// The rest of a request the socket buffer did not take at once (a large payload): waits
    /// for room through a duplicate of the socket registered for writing while it lasts.
    async fn write_rest(
        &self,
        hdr: &[u8],
        payload: &[u8],
        mut written: usize,
    ) -> Result<(), AgentError> {
        let w = register(self.sock.get_ref().try_clone()?, Interest::WRITABLE)?;
        while written < hdr.len() + payload.len() {
            let mut ready = w.writable().await?;
            match ready.try_io(|s| write_from(s.get_ref(), hdr, payload, written)) {
                Ok(Ok(0)) => return Err(AgentError::Closed),
                Ok(Ok(n)) => written += n,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    async fn read_reply(&mut self) -> Result<AgentReply, AgentError> {
        while self.end - self.start < RESP_HEADER {
            if self.start > 0 {
                self.rbuf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            match read_some(&self.sock, &mut self.rbuf[self.end..]).await? {
                0 => return Err(AgentError::Closed),
                n => self.end += n,
            }
        }
        let mut hdr = [0u8; RESP_HEADER];
        hdr.copy_from_slice(&self.rbuf[self.start..self.start + RESP_HEADER]);
        self.start += RESP_HEADER;
        let head = parse_header(&hdr)?;

        // Code in the sandbox may bypass the agent's own check: never buffer more.
        let limit = if head.status == 200 {
            self.max_result
        } else {
            self.max_result.saturating_add(ERROR_MARGIN_BYTES)
        };
        if head.len > limit {
            return Err(AgentError::TooLarge {
                size: head.len,
                limit: self.max_result,
            });
        }

        let mut body = vec![0u8; head.len];
        let mut have = head.len.min(self.end - self.start);
        body[..have].copy_from_slice(&self.rbuf[self.start..self.start + have]);
        self.start += have;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        while have < head.len {
            match read_some(&self.sock, &mut body[have..]).await? {
                0 => return Err(AgentError::Closed),
                n => have += n,
            }
        }
        Ok(AgentReply {
            status: head.status,
            exec_us: head.exec_us,
            body: Bytes::from(body),
        })
    }
}

/// One write of header + payload from byte `written` on (vectored while the header is not out).
fn write_from(
    mut sock: &UnixStream,
    hdr: &[u8],
    payload: &[u8],
    written: usize,
) -> std::io::Result<usize> {
    if written < hdr.len() {
        sock.write_vectored(&[IoSlice::new(&hdr[written..]), IoSlice::new(payload)])
    } else {
        sock.write(&payload[written - hdr.len()..])
    }
}

/// Registers a socket with the runtime for `interest`.
fn register(sock: UnixStream, interest: Interest) -> std::io::Result<AsyncFd<UnixStream>> {
    // SAFETY: the `UnixStream` owns its descriptor and is only reached through `get_ref`, so the
    // descriptor stays open and the same for as long as the `AsyncFd` lives.
    unsafe { AsyncFd::register_with_interest(sock, interest) }.map_err(|e| e.into_parts().1)
}

/// Reads into `buf` once the socket has data; 0 means the agent closed it.
async fn read_some(sock: &AsyncFd<UnixStream>, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        let mut ready = sock.readable().await?;
        match ready.try_io(|s| s.get_ref().read(buf)) {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(r) => return r,
            Err(_would_block) => {}
        }
    }
}

/// A decoded response header.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    len: usize,
    status: u16,
    exec_us: Option<u64>,
}

fn parse_header(h: &[u8; RESP_HEADER]) -> Result<Head, AgentError> {
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let status = u16::from_be_bytes([h[4], h[5]]);
    let flags = u16::from_be_bytes([h[6], h[7]]);
    let exec_us = u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
    if !(100..=599).contains(&status) {
        return Err(AgentError::Malformed(format!("status {status}")));
    }
    if flags & !FLAG_EXEC_US != 0 {
        return Err(AgentError::Malformed(format!("unknown flags {flags:#x}")));
    }
    let exec_us = if flags & FLAG_EXEC_US != 0 {
        Some(exec_us)
    } else if exec_us != 0 {
        return Err(AgentError::Malformed("exec_us set but not flagged".into()));
    } else {
        None
    };
    Ok(Head {
        len,
        status,
        exec_us,
    })
}

/// The `L` payload: `{"handler": ..., "code_dir": ..., "env": {K: V, ...}}`.
#[derive(serde::Serialize)]
struct LoadRequest<'a> {
    handler: &'a str,
    code_dir: &'a str,
    env: EnvMap<'a>,
}

/// Env pairs serialized as a JSON object without building a map.
struct EnvMap<'a>(&'a [(String, String)]);

impl Serialize for EnvMap<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{UnixListener, UnixStream};

    fn reply(status: u16, exec_us: Option<u64>, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&status.to_be_bytes());
        v.extend_from_slice(&(exec_us.is_some() as u16).to_be_bytes());
        v.extend_from_slice(&exec_us.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    /// Reads one request frame: (op, payload).
    async fn read_frame(s: &mut UnixStream) -> Option<(u8, Vec<u8>)> {
        let mut hdr = [0u8; 8];
        s.read_exact(&mut hdr).await.ok()?;
        assert_eq!(&hdr[5..], &[0, 0, 0], "reserved bytes are zero");
        let len = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.ok()?;
        Some((hdr[4], payload))
    }

    fn listen() -> (tempfile::TempDir, std::path::PathBuf, UnixListener) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = UnixListener::bind(&path).unwrap();
        (dir, path, listener)
    }

    #[test]
    fn headers_decode_and_bad_ones_are_malformed() {
        let ok = reply(200, Some(17), b"");
        let h: [u8; 16] = ok[..16].try_into().unwrap();
        assert_eq!(
            parse_header(&h).unwrap(),
            Head {
                len: 0,
                status: 200,
                exec_us: Some(17)
            }
        );
        let mut bad = h;
        bad[7] = 3; // unknown flag bit
        assert!(matches!(parse_header(&bad), Err(AgentError::Malformed(_))));
        let mut bad = h;
        bad[7] = 0; // exec_us without its flag
        assert!(matches!(parse_header(&bad), Err(AgentError::Malformed(_))));
        let mut bad = h;
        bad[4..6].copy_from_slice(&0u16.to_be_bytes());
        assert!(matches!(parse_header(&bad), Err(AgentError::Malformed(_))));
        let mut bad = h;
        bad[4..6].copy_from_slice(&(b'H' as u16 * 256 + b'T' as u16).to_be_bytes()); // "HT"TP
        assert!(matches!(parse_header(&bad), Err(AgentError::Malformed(_))));
    }

    #[tokio::test]
    async fn round_trips_over_a_unix_socket_with_split_writes() {
        let (_dir, path, listener) = listen();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            for i in 0..3u64 {
                let (op, payload) = read_frame(&mut s).await.unwrap();
                let frame = if i < 2 {
                    assert_eq!(op, b'I');
                    assert_eq!(payload, format!("{{\"i\":{i}}}").into_bytes());
                    reply(200, Some(5 + i), b"{\"ok\":true}")
                } else {
                    assert_eq!((op, payload.len()), (b'H', 0));
                    reply(500, None, b"{\"type\":\"X\"}")
                };
                // the header byte by byte, then the body in two pieces
                for b in &frame[..16] {
                    s.write_all(&[*b]).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                s.write_all(&frame[16..20]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                s.write_all(&frame[20..]).await.unwrap();
            }
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        for i in 0..2u64 {
            let r = c.invoke(format!("{{\"i\":{i}}}").as_bytes()).await.unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.exec_us, Some(5 + i));
            assert_eq!(&r.body[..], b"{\"ok\":true}");
        }
        let r = c.health().await.unwrap();
        assert_eq!((r.status, r.exec_us), (500, None));
        assert_eq!(&r.body[..], b"{\"type\":\"X\"}");
        server.await.unwrap();
        assert!(matches!(
            c.invoke(b"{}").await,
            Err(AgentError::Closed | AgentError::Io(_))
        ));
    }

    #[tokio::test]
    async fn a_large_payload_and_body_round_trip() {
        let (_dir, path, listener) = listen();
        let big = vec![b'x'; 3 << 20];
        let expect = big.clone();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let (op, payload) = read_frame(&mut s).await.unwrap();
            assert_eq!(op, b'I');
            assert!(payload == expect);
            s.write_all(&reply(200, Some(1), &payload)).await.unwrap();
            let (_, small) = read_frame(&mut s).await.unwrap();
            s.write_all(&reply(200, None, &small)).await.unwrap();
        });
        let mut c = AgentConn::connect(&path, 4 << 20).await.unwrap();
        // Over the socket buffer: the write waits for room, then the connection reads only.
        let r = c.invoke(&big).await.unwrap();
        assert_eq!(r.status, 200);
        assert!(r.body[..] == big[..]);
        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!(&r.body[..], b"{}");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_before_it_is_read() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = read_frame(&mut s).await;
            // Announces 1 GiB; sends only the header.
            let mut frame = reply(200, Some(1), b"");
            frame[..4].copy_from_slice(&(1u32 << 30).to_be_bytes());
            let _ = s.write_all(&frame).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = AgentConn::connect(&path, 1000).await.unwrap();
        match c.invoke(b"{}").await {
            Err(AgentError::TooLarge { size, limit }) => {
                assert_eq!((size, limit), (1 << 30, 1000));
            }
            other => panic!("{other:?}"),
        }
        assert!(c.rbuf.len() < 1 << 20);
    }

    #[tokio::test]
    async fn error_answers_get_the_margin_and_no_more() {
        let (_dir, path, listener) = listen();
        let limit = 1000;
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            // an error answer within the margin is read; one past it is refused
            let _ = read_frame(&mut s).await;
            let within = vec![b'e'; limit + ERROR_MARGIN_BYTES];
            s.write_all(&reply(500, Some(2), &within)).await.unwrap();
            let _ = read_frame(&mut s).await;
            let mut frame = reply(413, Some(2), b"");
            frame[..4].copy_from_slice(&((limit + ERROR_MARGIN_BYTES + 1) as u32).to_be_bytes());
            let _ = s.write_all(&frame).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = AgentConn::connect(&path, limit).await.unwrap();
        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!((r.status, r.body.len()), (500, limit + ERROR_MARGIN_BYTES));
        match c.invoke(b"{}").await {
            Err(AgentError::TooLarge { size, limit: l }) => {
                assert_eq!((size, l), (limit + ERROR_MARGIN_BYTES + 1, limit));
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_reply_that_is_not_a_frame_is_malformed() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = read_frame(&mut s).await;
            // an old HTTP agent's answer
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                .await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        assert!(matches!(
            c.invoke(b"{}").await,
            Err(AgentError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn a_header_cut_short_is_closed() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = read_frame(&mut s).await;
            let _ = s.write_all(&reply(200, None, b"{}")[..10]).await;
        });
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        assert!(matches!(c.health().await, Err(AgentError::Closed)));
    }

    #[tokio::test]
    async fn a_body_cut_short_is_closed() {
        let (_dir, path, listener) = listen();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = read_frame(&mut s).await;
            let frame = reply(200, Some(1), &[b'a'; 40000]);
            let _ = s.write_all(&frame[..30000]).await;
        });
        let mut c = AgentConn::connect(&path, 1 << 20).await.unwrap();
        assert!(matches!(c.invoke(b"{}").await, Err(AgentError::Closed)));
    }

    #[tokio::test]
    async fn load_sends_the_specified_frame() {
        let (_dir, path, listener) = listen();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut hdr = [0u8; 8];
            s.read_exact(&mut hdr).await.unwrap();
            let len = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
            assert_eq!(&hdr[4..], b"L\0\0\0");
            let mut payload = vec![0u8; len];
            s.read_exact(&mut payload).await.unwrap();
            s.write_all(&reply(200, None, b"{\"status\":\"ok\"}"))
                .await
                .unwrap();
            payload
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        let env = vec![
            ("GREETING".to_string(), "hi \"there\"".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let r = c.load("pkg.mod.fn", "/code", &env).await.unwrap();
        assert_eq!((r.status, r.exec_us), (200, None));
        let payload = server.await.unwrap();
        assert_eq!(
            payload,
            br#"{"handler":"pkg.mod.fn","code_dir":"/code","env":{"GREETING":"hi \"there\"","EMPTY":""}}"#
        );
    }

    #[tokio::test]
    async fn the_real_agent_loads_and_invokes_in_generic_mode() {
        let agent = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../runtime/python/hearth_agent.py"
        );
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("code");
        std::fs::create_dir(&code).unwrap();
        std::fs::write(
            code.join("main.py"),
            "import os\n\
             def main(args):\n\
             \x20   with open('data.txt') as f:\n\
             \x20       data = f.read()\n\
             \x20   return {'n': args['n'] + 1, 'data': data, 'env': os.environ.get('GREETING')}\n",
        )
        .unwrap();
        std::fs::write(code.join("data.txt"), "relative").unwrap();
        let sock = dir.path().join("a.sock");
        let mut cmd = tokio::process::Command::new("python3");
        cmd.args(["-I", "-S", agent, "--generic", "--socket"])
            .arg(&sock)
            .current_dir(dir.path())
            .kill_on_drop(true); // killed when the test ends, also on panic
        let _child = cmd.spawn().unwrap();

        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut c = loop {
            match AgentConn::connect(&sock, 1 << 20).await {
                Ok(c) => break c,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => panic!("the agent did not listen: {e}"),
            }
        };
        let r = c.health().await.unwrap();
        assert_eq!(r.status, 200);
        let health: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(health["status"], "generic");

        let r = c.invoke(b"{}").await.unwrap();
        assert_eq!(r.status, 503);

        let env = vec![("GREETING".to_string(), "hello".to_string())];
        let r = c
            .load("main.main", code.to_str().unwrap(), &env)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        let loaded: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(loaded["status"], "ok");

        let r = c.invoke(br#"{"n": 41}"#).await.unwrap();
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert!(r.exec_us.is_some());
        let result: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            result,
            serde_json::json!({"n": 42, "data": "relative", "env": "hello"})
        );

        let r = c.load("main.main", "/code", &[]).await.unwrap();
        assert_eq!(r.status, 409);
        assert_eq!(c.invoke(br#"{"n": 1}"#).await.unwrap().status, 200);
    }
}

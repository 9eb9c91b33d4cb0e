//! The worker's side of the agent protocol: HTTP/1.1 over one persistent Unix-socket connection
//! per sandbox (runtime/python/README.md).
//!
//! Hand-written on purpose: this is the hot path of every warm invocation, and a request is one
//! `write` and usually one `read`. Response headers are parsed with `httparse`.

use bytes::{Bytes, BytesMut};
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Room beyond the result limit for an error answer (a handler's message and traceback; the
/// agent truncates long messages to fit).
pub const ERROR_MARGIN_BYTES: usize = 64 * 1024;

/// One response from the agent.
#[derive(Debug, Clone)]
pub struct AgentReply {
    pub status: u16,
    /// Handler time measured inside the agent (`X-Exec-Us`).
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
pub struct AgentConn {
    stream: UnixStream,
    buf: BytesMut,
    req: Vec<u8>,
    /// The largest result body read (an error answer may add [`ERROR_MARGIN_BYTES`]).
    max_result: usize,
}

impl AgentConn {
    /// Connects to the agent at `path`; a 200 body over `max_result` bytes is never read.
    pub async fn connect(path: &Path, max_result: usize) -> std::io::Result<Self> {
        let stream = UnixStream::connect(path).await?;
        Ok(AgentConn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            req: Vec::with_capacity(4096),
            max_result,
        })
    }

    /// `POST /invoke` with the arguments as body.
    pub async fn invoke(&mut self, args: &[u8]) -> Result<AgentReply, AgentError> {
        self.request("POST /invoke", args).await
    }

    /// `GET /health`: after start-up this says whether the handler imported.
    pub async fn health(&mut self) -> Result<AgentReply, AgentError> {
        self.request("GET /health", &[]).await
    }

    async fn request(&mut self, line: &str, body: &[u8]) -> Result<AgentReply, AgentError> {
        self.req.clear();
        self.req.extend_from_slice(line.as_bytes());
        self.req
            .extend_from_slice(b" HTTP/1.1\r\nHost: agent\r\nContent-Length: ");
        self.req
            .extend_from_slice(itoa_buf(body.len() as u64).as_bytes());
        self.req.extend_from_slice(b"\r\n\r\n");
        if body.len() <= 64 * 1024 {
            self.req.extend_from_slice(body);
            self.stream.write_all(&self.req).await?;
        } else {
            self.stream.write_all(&self.req).await?;
            self.stream.write_all(body).await?;
        }
        self.read_response().await
    }

    async fn read_response(&mut self) -> Result<AgentReply, AgentError> {
        loop {
            if let Some((head_len, status, exec_us, content_len)) = parse_head(&self.buf)? {
                // Code in the sandbox may bypass the agent's own check: never buffer more.
                let limit = if status == 200 {
                    self.max_result
                } else {
                    self.max_result.saturating_add(ERROR_MARGIN_BYTES)
                };
                if content_len > limit {
                    return Err(AgentError::TooLarge {
                        size: content_len,
                        limit: self.max_result,
                    });
                }
                let total = head_len + content_len;
                if self.buf.capacity() < total {
                    self.buf.reserve(total - self.buf.len());
                }
                while self.buf.len() < total {
                    if self.stream.read_buf(&mut self.buf).await? == 0 {
                        return Err(AgentError::Closed);
                    }
                }
                let mut msg = self.buf.split_to(total);
                let body = msg.split_off(head_len).freeze();
                return Ok(AgentReply {
                    status,
                    exec_us,
                    body,
                });
            }
            if self.buf.len() > 64 * 1024 {
                return Err(AgentError::Malformed("response headers too long".into()));
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(16 * 1024);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(AgentError::Closed);
            }
        }
    }
}

/// Parses a response head: (head length, status, X-Exec-Us, Content-Length), or None if incomplete.
/// A parsed response head: (head length, status, X-Exec-Us, Content-Length).
type Head = (usize, u16, Option<u64>, usize);

fn parse_head(buf: &[u8]) -> Result<Option<Head>, AgentError> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => {
            let status = resp.code.unwrap_or(0);
            let mut exec_us = None;
            let mut content_len = None;
            for h in resp.headers.iter() {
                if h.name.eq_ignore_ascii_case("content-length") {
                    content_len = parse_u64(h.value).map(|v| v as usize);
                } else if h.name.eq_ignore_ascii_case("x-exec-us") {
                    exec_us = parse_u64(h.value);
                }
            }
            let content_len = content_len
                .ok_or_else(|| AgentError::Malformed("missing Content-Length".into()))?;
            Ok(Some((n, status, exec_us, content_len)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(AgentError::Malformed(e.to_string())),
    }
}

fn parse_u64(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

fn itoa_buf(v: u64) -> String {
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_incrementally() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Exec-Us: 17\r\n\r\n{}";
        assert!(parse_head(&full[..20]).unwrap().is_none());
        let (n, status, exec, len) = parse_head(full).unwrap().unwrap();
        assert_eq!((status, exec, len), (200, Some(17), 2));
        assert_eq!(&full[n..], b"{}");
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[tokio::test]
    async fn round_trips_over_a_unix_socket_with_split_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            for _ in 0..2 {
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                }
                let body = b"{\"ok\":true}";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Exec-Us: 5\r\n\r\n",
                    body.len()
                );
                s.write_all(head.as_bytes()).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                s.write_all(body).await.unwrap();
            }
        });
        let mut c = AgentConn::connect(&path, 1024).await.unwrap();
        for _ in 0..2 {
            let r = c.invoke(b"{}").await.unwrap();
            assert_eq!(r.status, 200);
            assert_eq!(r.exec_us, Some(5));
            assert_eq!(&r.body[..], b"{\"ok\":true}");
        }
        server.await.unwrap();
        assert!(matches!(
            c.invoke(b"{}").await,
            Err(AgentError::Closed | AgentError::Io(_))
        ));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            // Announces 1 GiB; sends only the head.
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                .await;
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        });
        let mut c = AgentConn::connect(&path, 1000).await.unwrap();
        match c.invoke(b"{}").await {
            Err(AgentError::TooLarge { size, limit }) => {
                assert_eq!((size, limit), (1 << 30, 1000));
            }
            other => panic!("{other:?}"),
        }
        assert!(c.buf.capacity() < 1 << 20);
    }
}

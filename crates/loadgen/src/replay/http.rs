//! Persistent HTTP/1.1 connections to a Hearth API, pooled so that many invocations can be in
//! flight at once (one per connection, as HTTP/1.1 allows).

use crate::error::{LoadgenError, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

type Sender = SendRequest<Full<Bytes>>;

/// What came back for one request.
pub struct Exchange {
    /// When the request was handed to the connection.
    pub sent: Instant,
    /// When the whole answer had arrived (or the request failed).
    pub done: Instant,
    /// The status and body, or why there was none.
    pub answer: std::result::Result<(u16, Bytes), String>,
}

/// At most `max` connections; idle ones are reused.
pub struct Pool {
    addr: SocketAddr,
    host: HeaderValue,
    /// `Bearer <key>`, if the API needs one.
    authorization: Option<HeaderValue>,
    idle: Mutex<Vec<Sender>>,
    permits: Semaphore,
    max: usize,
    opened: AtomicUsize,
    waits: AtomicUsize,
    timeout: Duration,
}

/// `http://HOST:PORT` → the socket address and Host header. The replay pool speaks plain HTTP
/// only (it measures the server, and TLS would add the client's crypto to every sample).
fn parse_url(url: &str) -> Result<(SocketAddr, String)> {
    if url.starts_with("https://") {
        return Err(LoadgenError::Config(format!(
            "{url:?}: the load generator speaks plain http:// only; replay against a plain \
             listener (docs/security.md)"
        )));
    }
    let bad = || LoadgenError::Config(format!("bad URL {url:?}: expected http://HOST:PORT"));
    let host = url
        .strip_prefix("http://")
        .ok_or_else(bad)?
        .trim_end_matches('/');
    if host.is_empty() || host.contains('/') {
        return Err(bad());
    }
    let addr = host
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(bad)?;
    Ok((addr, host.to_string()))
}

impl Pool {
    pub fn new(url: &str, max: usize, timeout: Duration, api_key: Option<&str>) -> Result<Self> {
        let (addr, host) = parse_url(url)?;
        let max = max.max(1);
        let authorization = api_key
            .map(|k| HeaderValue::from_str(&format!("Bearer {k}")))
            .transpose()
            .map_err(|_| LoadgenError::Config("the API key is not a valid header value".into()))?;
        Ok(Pool {
            addr,
            authorization,
            host: HeaderValue::from_str(&host)
                .map_err(|e| LoadgenError::Config(format!("bad host {host:?}: {e}")))?,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(max),
            max,
            opened: AtomicUsize::new(0),
            waits: AtomicUsize::new(0),
            timeout,
        })
    }

    /// Connections opened so far.
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// Requests that found every connection busy and had to wait for one.
    pub fn waits(&self) -> usize {
        self.waits.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    async fn connect(&self) -> std::result::Result<Sender, String> {
        let stream = TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.addr))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake with {}: {e}", self.addr))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection closed: {e}");
            }
        });
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(sender)
    }

    /// Opens `n` connections ahead of time, so the first sends do not pay for connecting.
    pub async fn preopen(&self, n: usize) -> Result<()> {
        for _ in 0..n.min(self.max) {
            let s = self.connect().await.map_err(LoadgenError::Replay)?;
            self.put_back(s);
        }
        Ok(())
    }

    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(s) = idle.pop() {
            if s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    fn put_back(&self, s: Sender) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(s);
    }

    /// POSTs `body` to `path` on an idle (or new) connection.
    pub async fn post(&self, path: &str, body: Bytes) -> Exchange {
        let permit = match self.permits.try_acquire() {
            Ok(p) => Ok(p),
            Err(_) => {
                self.waits.fetch_add(1, Ordering::Relaxed);
                self.permits.acquire().await
            }
        };
        let fail = |sent, e: String| Exchange {
            sent,
            done: Instant::now(),
            answer: Err(e),
        };
        let Ok(_permit) = permit else {
            return fail(Instant::now(), "the connection pool was closed".into());
        };
        let mut sender = match self.take_idle() {
            Some(s) => s,
            None => match self.connect().await {
                Ok(s) => s,
                Err(e) => return fail(Instant::now(), e),
            },
        };
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, "application/json");
        if let Some(a) = &self.authorization {
            req = req.header(AUTHORIZATION, a.clone());
        }
        let req = req.body(Full::new(body));
        let req = match req {
            Ok(r) => r,
            Err(e) => return fail(Instant::now(), format!("bad request for {path}: {e}")),
        };
        let sent = Instant::now();
        let exchange = async {
            let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        let answer = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(format!("request failed: {e}")),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        };
        let done = Instant::now();
        if answer.is_ok() {
            self.put_back(sender);
        }
        Exchange { sent, done, answer }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_must_be_http_host_port() {
        assert!(super::parse_url("http://127.0.0.1:7878/").is_ok());
        for bad in ["127.0.0.1:7878", "http://", "http://127.0.0.1:7878/v1"] {
            let err = super::parse_url(bad).unwrap_err().to_string();
            assert!(err.contains("expected http://HOST:PORT"), "{bad}: {err}");
        }
        let err = super::parse_url("https://x:1").unwrap_err().to_string();
        assert!(err.contains("plain http:// only"), "{err}");
    }
}

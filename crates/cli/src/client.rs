//! A small blocking HTTP/1.1 client with one persistent connection.
//!
//! The CLI, the benchmarks and the integration tests all use it. Blocking I/O on a dedicated
//! thread per connection is the lowest-overhead way to drive a closed loop, so benchmark numbers
//! measure the server, not the client's runtime.
//!
//! `https://` URLs speak TLS (rustls), trusting the certificates in `$HEARTH_CA_FILE` if set,
//! else the system's roots; `http://` ones stay plain TCP.

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A client error.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad URL {0:?}: expected http://HOST:PORT or https://HOST:PORT")]
    BadUrl(String),
    /// What the client trusts could not be loaded (`$HEARTH_CA_FILE`).
    #[error("{0}")]
    Trust(String),
    /// The handshake failed (an untrusted certificate, a server that does not speak TLS).
    #[error("TLS with {addr} failed: {error}")]
    Tls { addr: String, error: std::io::Error },
    #[error("cannot reach {addr}: {source} (is hearth running? start it with `hearth up`)")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed response: {0}")]
    Malformed(String),
    #[error("header {0} must not contain a line break")]
    Header(String),
}

/// A response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    /// The body read as one of the wire types of `hearth_api`; `None` when it is not one.
    pub fn typed<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.body).ok()
    }
    /// The body as an error answer (`{"error": {"code", "message", ...}}`); `None` when it is not one.
    pub fn error_body(&self) -> Option<hearth_api::ErrorBody> {
        hearth_api::ErrorBody::parse(&self.body)
    }
    /// The message of an error answer, else the body as text.
    pub fn error_message(&self) -> String {
        self.error_body()
            .map_or_else(|| self.text(), |e| e.error.message)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An open connection: plain TCP, or TLS over it.
enum Conn {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// What an `https://` client needs: whom to trust, and the name the certificate must carry.
struct TlsTarget {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

/// The trust of `https://` clients that were given none: `$HEARTH_CA_FILE`, else the system's
/// roots; loaded once per process.
fn default_tls() -> Result<Arc<ClientConfig>, ClientError> {
    static DEFAULT: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            let ca = std::env::var_os("HEARTH_CA_FILE").filter(|v| !v.is_empty());
            hearth_service::tls::client_config("HEARTH_CA_FILE", ca.as_deref().map(Path::new))
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(ClientError::Trust)
}

/// The name in `HOST:PORT` (`[v6]:PORT` too) that the server's certificate must carry.
fn server_name(host: &str) -> Option<ServerName<'static>> {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    ServerName::try_from(name).ok().map(|n| n.to_owned())
}

/// One persistent connection to a Hearth API.
pub struct Client {
    addr: SocketAddr,
    host: String,
    /// Set for `https://` URLs.
    tls: Option<TlsTarget>,
    stream: Option<Conn>,
    buf: Vec<u8>,
    req: Vec<u8>,
    timeout: Option<Duration>,
    /// Sent as `Authorization: Bearer …`.
    token: Option<String>,
    /// Sent with every request (e.g. `Idempotency-Key`).
    headers: Vec<(String, String)>,
}

impl Client {
    /// `url` is `http://HOST:PORT` or `https://HOST:PORT` (a trailing slash is fine).
    pub fn new(url: &str) -> Result<Self, ClientError> {
        let (rest, https) = match url.strip_prefix("https://") {
            Some(rest) => (rest, true),
            None => (
                url.strip_prefix("http://")
                    .ok_or_else(|| ClientError::BadUrl(url.into()))?,
                false,
            ),
        };
        let host = rest.trim_end_matches('/').to_string();
        if host.contains('/') || host.is_empty() {
            return Err(ClientError::BadUrl(url.into()));
        }
        let addr = host
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| ClientError::BadUrl(url.into()))?;
        let tls = if https {
            Some(TlsTarget {
                config: default_tls()?,
                name: server_name(&host).ok_or_else(|| ClientError::BadUrl(url.into()))?,
            })
        } else {
            None
        };
        Ok(Client {
            addr,
            host,
            tls,
            stream: None,
            buf: Vec::with_capacity(16 * 1024),
            req: Vec::with_capacity(1024),
            timeout: None,
            token: default_api_key(),
            headers: Vec::new(),
        })
    }

    /// Uses `token` as the API key instead of the default one ([`default_api_key`]).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// Sends `name: value` with every request from now on (None: stops sending `name`). A
    /// value with a line break is refused.
    pub fn set_header(&mut self, name: &str, value: Option<&str>) -> Result<(), ClientError> {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        if let Some(v) = value {
            if [name, v].iter().any(|s| s.contains(['\r', '\n'])) {
                return Err(ClientError::Header(name.to_string()));
            }
            self.headers.push((name.to_string(), v.to_string()));
        }
        Ok(())
    }

    /// Trusts only the certificates in the PEM file `ca` for an `https://` URL (instead of
    /// `$HEARTH_CA_FILE` or the system's roots); no effect on `http://`.
    pub fn with_ca_file(mut self, ca: &Path) -> Result<Self, ClientError> {
        if let Some(t) = &mut self.tls {
            t.config = hearth_service::tls::client_config("the CA file", Some(ca))
                .map_err(|e| ClientError::Trust(e.to_string()))?;
            self.stream = None;
        }
        Ok(self)
    }

    /// Sets a read timeout for responses (None waits forever).
    pub fn with_timeout(mut self, t: Option<Duration>) -> Self {
        self.timeout = t;
        self
    }

    fn stream(&mut self) -> Result<&mut Conn, ClientError> {
        if self.stream.is_none() {
            let s = TcpStream::connect(self.addr).map_err(|e| ClientError::Connect {
                addr: self.addr.to_string(),
                source: e,
            })?;
            s.set_nodelay(true)?;
            s.set_read_timeout(self.timeout)?;
            let conn = match &self.tls {
                None => Conn::Plain(s),
                Some(t) => Conn::Tls(Box::new(self.handshake(t, s)?)),
            };
            self.stream = Some(conn);
            self.buf.clear();
        }
        match self.stream.as_mut() {
            Some(s) => Ok(s),
            None => Err(ClientError::Malformed("no connection".into())),
        }
    }

    /// Completes the TLS handshake now, so that an untrusted or non-TLS server is reported as
    /// such rather than as a broken request.
    fn handshake(
        &self,
        t: &TlsTarget,
        mut tcp: TcpStream,
    ) -> Result<StreamOwned<ClientConnection, TcpStream>, ClientError> {
        let tls_err = |error: std::io::Error| ClientError::Tls {
            addr: self.addr.to_string(),
            error,
        };
        let mut conn = ClientConnection::new(Arc::clone(&t.config), t.name.clone())
            .map_err(|e| tls_err(std::io::Error::other(e)))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).map_err(tls_err)?;
        }
        Ok(StreamOwned::new(conn, tcp))
    }

    pub fn get(&mut self, path: &str) -> Result<Response, ClientError> {
        self.request("GET", path, None)
    }

    pub fn delete(&mut self, path: &str) -> Result<Response, ClientError> {
        self.request("DELETE", path, None)
    }

    pub fn post(&mut self, path: &str, body: &[u8]) -> Result<Response, ClientError> {
        self.request("POST", path, Some(body))
    }

    pub fn put(&mut self, path: &str, body: &[u8]) -> Result<Response, ClientError> {
        self.request("PUT", path, Some(body))
    }

    /// Sends a request; a stale keep-alive connection is replaced once.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, ClientError> {
        let reused = self.stream.is_some();
        match self.try_request(method, path, body) {
            Err(ClientError::Io(e)) if reused && is_stale(&e) => {
                self.stream = None;
                self.try_request(method, path, body)
            }
            other => other,
        }
    }

    fn try_request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Response, ClientError> {
        self.req.clear();
        let _ = write!(
            self.req,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n",
            self.host
        );
        if let Some(t) = &self.token {
            let _ = write!(self.req, "Authorization: Bearer {t}\r\n");
        }
        for (n, v) in &self.headers {
            let _ = write!(self.req, "{n}: {v}\r\n");
        }
        if let Some(b) = body {
            let _ = write!(
                self.req,
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            );
        }
        self.req.extend_from_slice(b"\r\n");
        if let Some(b) = body {
            self.req.extend_from_slice(b);
        }
        let req = std::mem::take(&mut self.req);
        let res = self.stream().and_then(|s| Ok(s.write_all(&req)?));
        self.req = req;
        if let Err(e) = res {
            self.stream = None;
            return Err(e);
        }
        let res = self.read_response();
        if res.is_err() {
            self.stream = None;
        }
        res
    }

    fn read_response(&mut self) -> Result<Response, ClientError> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            match resp.parse(&self.buf) {
                Ok(httparse::Status::Complete(head)) => {
                    let status = resp.code.unwrap_or(0);
                    let headers: Vec<(String, String)> = resp
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    let len = headers
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                        .and_then(|(_, v)| v.trim().parse::<usize>().ok());
                    let close = headers.iter().any(|(k, v)| {
                        k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close")
                    });
                    let no_body = status == 204 || status == 304 || (100..200).contains(&status);
                    let body = match len {
                        _ if no_body => {
                            self.buf.drain(..head);
                            Vec::new()
                        }
                        Some(len) => {
                            while self.buf.len() < head + len {
                                let n = self.read_more(&mut chunk)?;
                                if n == 0 {
                                    return Err(ClientError::Malformed("truncated body".into()));
                                }
                            }
                            let body = self.buf[head..head + len].to_vec();
                            self.buf.drain(..head + len);
                            body
                        }
                        None => {
                            // No length: the body runs to the end of the connection.
                            while self.read_more(&mut chunk)? > 0 {}
                            let body = self.buf[head..].to_vec();
                            self.buf.clear();
                            self.stream = None;
                            body
                        }
                    };
                    if close {
                        self.stream = None;
                    }
                    return Ok(Response {
                        status,
                        headers,
                        body,
                    });
                }
                Ok(httparse::Status::Partial) => {
                    if self.read_more(&mut chunk)? == 0 {
                        return Err(ClientError::Io(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "connection closed before a response",
                        )));
                    }
                }
                Err(e) => return Err(ClientError::Malformed(e.to_string())),
            }
        }
    }

    fn read_more(&mut self, chunk: &mut [u8]) -> Result<usize, ClientError> {
        let n = self.stream()?.read(chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }
}

fn is_stale(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}

/// The API key the CLI sends: `$HEARTH_API_KEY`, else the operator key a local `hearth up` wrote
/// in the default data directory (`admin.key`, or `controller/admin.key` for a cluster).
pub fn default_api_key() -> Option<String> {
    if let Ok(k) = std::env::var("HEARTH_API_KEY") {
        let k = k.trim().to_string();
        return (!k.is_empty()).then_some(k);
    }
    let dir = std::env::var_os("HEARTH_DATA_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(hearth_service::serving::default_data_dir);
    [
        dir.join("admin.key"),
        dir.join("controller").join("admin.key"),
    ]
    .iter()
    .find_map(|f| std::fs::read_to_string(f).ok())
    .map(|k| k.trim().to_string())
    .filter(|k| !k.is_empty())
}

/// The default API address: `$HEARTH_URL`, else the local single node.
pub fn default_url() -> String {
    std::env::var("HEARTH_URL").unwrap_or_else(|_| "http://127.0.0.1:7878".into())
}

//! The only way out of a build sandbox: an allow-listing HTTP proxy on a Unix socket.
//!
//! A dependency build runs `pip` on hostile input (a requirements file names what gets
//! downloaded, and an sdist's build runs its code), so the build sandbox has no network of its
//! own: its network namespace holds only `lo`. When the operator configures a package index
//! (`build.index_url`), the worker starts one of these proxies per build on a Unix socket inside
//! the build's run directory; a few lines of Python in the sandbox ([`FORWARDER`]) listen on
//! the sandbox's own `127.0.0.1:3128` and pass each connection to that socket, and pip is told
//! `--proxy http://127.0.0.1:3128`. The proxy then lets through only
//!
//! * `CONNECT host:port` (HTTPS) to an allowed host and port, as a tunnel, and
//! * `GET`/`HEAD` in absolute form (`GET http://host:port/path`) to an allowed host and port,
//!   one request per connection (it adds `Connection: close`, so a kept-alive client connection
//!   can never carry a second request to another host);
//!
//! everything else gets `403`. Names are resolved on the host after the check, so the sandbox
//! can neither resolve nor reach anything else. Each connection is bounded in head size, in
//! bytes carried from upstream (`max_download_bytes`, all connections of the build together)
//! and in idle time; the build's own wall-clock limit bounds the rest.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;

/// Where the sandbox's forwarder listens (inside the build sandbox's own network namespace).
pub const SANDBOX_PROXY_ADDR: &str = "127.0.0.1:3128";
/// The proxy's socket inside the build sandbox.
pub const SANDBOX_PROXY_SOCKET: &str = "/hearth/run/proxy.sock";
/// The most bytes of a request head (request line and headers) the proxy reads.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// A connection with nothing moving for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections the proxy serves at once; more wait in the socket's backlog.
pub const MAX_CONNECTIONS: usize = 32;

/// Runs in the build sandbox before pip (`python3 -c FORWARDER &`): accepts TCP connections on
/// [`SANDBOX_PROXY_ADDR`] and pipes each to [`SANDBOX_PROXY_SOCKET`]. Standard library only.
pub const FORWARDER: &str = r#"import socket, threading
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def serve(c):
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        u.connect("/hearth/run/proxy.sock")
    except OSError:
        c.close()
        return
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
    pipe(c, u)
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 3128))
l.listen(64)
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Hosts (and ports) a build may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<(String, u16)>,
}

/// A URL the allow list cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadUrl(String);

impl AllowList {
    /// Allows the host and port of an `http://` or `https://` URL (an index URL).
    pub fn allow_url(&mut self, url: &str) -> Result<(), BadUrl> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| BadUrl("an index URL must start with http:// or https://".into()))?;
        let default_port = match scheme {
            "https" => 443,
            "http" => 80,
            _ => {
                return Err(BadUrl(
                    "an index URL must start with http:// or https://".into(),
                ))
            }
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if authority.contains('@') {
            return Err(BadUrl(
                "an index URL must not carry credentials: give them in a netrc of the build".into(),
            ));
        }
        let (host, port) = split_host_port(authority, default_port)
            .ok_or_else(|| BadUrl("an index URL needs a host (and a valid port)".into()))?;
        self.allow(host, port);
        Ok(())
    }

    /// Allows `host:port` (a download host an index links to, e.g. files.pythonhosted.org).
    pub fn allow(&mut self, host: &str, port: u16) {
        let host = host.to_ascii_lowercase();
        if !self.allows(&host, port) {
            self.entries.push((host, port));
        }
    }

    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.entries
            .iter()
            .any(|(h, p)| *p == port && h.eq_ignore_ascii_case(host))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `host[:port]` or `[v6]:port` → (host, port); None when malformed.
fn split_host_port(authority: &str, default_port: u16) -> Option<(&str, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        match after.strip_prefix(':') {
            Some(p) => (h, p.parse().ok()?),
            None if after.is_empty() => (h, default_port),
            None => return None,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (authority, default_port),
        }
    };
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b));
    (valid && port != 0).then_some((host, port))
}

/// What one build's proxy carried, for its log.
#[derive(Debug, Default)]
pub struct ProxyCounters {
    /// Bytes from upstream servers to the sandbox, all connections together.
    pub downloaded: AtomicU64,
    /// Requests refused (a host not allowed, a malformed request, the byte budget spent).
    pub refused: AtomicU64,
}

/// A running proxy; it stops when dropped.
pub struct BuildProxy {
    task: JoinHandle<()>,
    counters: Arc<ProxyCounters>,
}

impl BuildProxy {
    /// Listens on `socket` (which must not exist) and serves until dropped.
    pub fn start(
        socket: &Path,
        allow: AllowList,
        max_download_bytes: u64,
    ) -> std::io::Result<BuildProxy> {
        let listener = UnixListener::bind(socket)?;
        let counters = Arc::new(ProxyCounters::default());
        let shared = Arc::new(Shared {
            allow,
            max_download_bytes,
            counters: counters.clone(),
            slots: tokio::sync::Semaphore::new(MAX_CONNECTIONS),
        });
        let task = tokio::spawn(async move {
            loop {
                let conn = match listener.accept().await {
                    Ok((conn, _)) => conn,
                    Err(e) => {
                        // Out of descriptors, say: wait instead of spinning.
                        tracing::warn!(error = %e, "build proxy accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let Ok(_slot) = shared.slots.acquire().await else {
                        return;
                    };
                    if let Err(e) = serve(conn, &shared).await {
                        tracing::debug!(error = %e, "build proxy connection ended");
                    }
                });
            }
        });
        Ok(BuildProxy { task, counters })
    }

    pub fn counters(&self) -> &ProxyCounters {
        &self.counters
    }
}

impl Drop for BuildProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    allow: AllowList,
    max_download_bytes: u64,
    counters: Arc<ProxyCounters>,
    slots: tokio::sync::Semaphore,
}

/// The request head: its bytes, and where the head ends in them.
async fn read_head(conn: &mut UnixStream) -> std::io::Result<Option<(Vec<u8>, usize)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = find_head_end(&buf) {
            return Ok(Some((buf, end)));
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Ok(None);
        }
        let n = tokio::time::timeout(IDLE_TIMEOUT, conn.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

async fn refuse(conn: &mut UnixStream, shared: &Shared, status: &str) -> std::io::Result<()> {
    shared.counters.refused.fetch_add(1, Ordering::Relaxed);
    let body = format!("{status}: this build may reach only its package index\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(msg.as_bytes()).await?;
    conn.shutdown().await
}

/// One parsed request: what it asks for and where it goes.
struct Request {
    method: String,
    host: String,
    port: u16,
    /// For absolute-form requests: the head to send upstream (origin form, `Connection: close`).
    upstream_head: Option<Vec<u8>>,
}

fn parse(head: &[u8]) -> Option<Request> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    if !req.parse(head).ok()?.is_complete() {
        return None;
    }
    let method = req.method?.to_string();
    let target = req.path?;
    if method == "CONNECT" {
        let (host, port) = split_host_port(target, 443)?;
        return Some(Request {
            method,
            host: host.to_string(),
            port,
            upstream_head: None,
        });
    }
    if method != "GET" && method != "HEAD" {
        return None;
    }
    let rest = target.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.contains('@') {
        return None;
    }
    let (host, port) = split_host_port(authority, 80)?;
    let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        // Hop-by-hop and proxy headers stay here; the body-less methods need no framing.
        if matches!(
            name.as_str(),
            "connection"
                | "proxy-connection"
                | "keep-alive"
                | "proxy-authorization"
                | "te"
                | "upgrade"
                | "content-length"
                | "transfer-encoding"
        ) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Some(Request {
        method,
        host: host.to_string(),
        port,
        upstream_head: Some(out),
    })
}

async fn serve(mut conn: UnixStream, shared: &Shared) -> std::io::Result<()> {
    let Some((head, end)) = read_head(&mut conn).await? else {
        return refuse(&mut conn, shared, "431 Request Header Fields Too Large").await;
    };
    let Some(req) = parse(&head[..end]) else {
        return refuse(&mut conn, shared, "403 Forbidden").await;
    };
    if !shared.allow.allows(&req.host, req.port) {
        tracing::info!(host = %req.host, port = req.port, method = %req.method,
            "build proxy refused a destination outside the allow list");
        return refuse(&mut conn, shared, "403 Forbidden").await;
    }
    let upstream = tokio::time::timeout(
        IDLE_TIMEOUT,
        TcpStream::connect((req.host.as_str(), req.port)),
    )
    .await;
    let mut upstream = match upstream {
        Ok(Ok(s)) => s,
        _ => return refuse(&mut conn, shared, "502 Bad Gateway").await,
    };
    match req.upstream_head {
        None => {
            conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
            // Bytes the client sent after the head (a TLS hello) go upstream first.
            upstream.write_all(&head[end..]).await?;
        }
        Some(h) => upstream.write_all(&h).await?,
    }
    let (mut cr, mut cw) = conn.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let up = async {
        let r = copy_bounded(&mut cr, &mut uw, None).await;
        let _ = uw.shutdown().await;
        r
    };
    let down = async {
        let r = copy_bounded(
            &mut ur,
            &mut cw,
            Some((&shared.counters.downloaded, shared.max_download_bytes)),
        )
        .await;
        let _ = cw.shutdown().await;
        r
    };
    let (a, b) = tokio::join!(up, down);
    a.and(b)
}

/// Copies until EOF, an idle timeout, or (downstream) the build's byte budget is spent.
async fn copy_bounded<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    budget: Option<(&AtomicU64, u64)>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::time::timeout(IDLE_TIMEOUT, r.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Ok(());
        }
        if let Some((used, max)) = budget {
            let total = used.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
            if total > max {
                return Err(std::io::Error::other(
                    "the build's download budget is spent",
                ));
            }
        }
        w.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A one-shot upstream on loopback that answers any request with `body` and records what
    /// it was sent.
    async fn upstream(body: &'static str) -> (u16, tokio::sync::oneshot::Receiver<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut got = vec![0u8; 4096];
            let n = s.read(&mut got).await.unwrap();
            got.truncate(n);
            let _ = tx.send(got);
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(resp.as_bytes()).await.unwrap();
        });
        (port, rx)
    }

    async fn ask(sock: &Path, req: &str) -> String {
        let mut c = UnixStream::connect(sock).await.unwrap();
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    fn proxy(
        allowed_port: u16,
        budget: u64,
    ) -> (tempfile::TempDir, std::path::PathBuf, BuildProxy) {
        let t = tempfile::tempdir().unwrap();
        let sock = t.path().join("proxy.sock");
        let mut allow = AllowList::default();
        allow
            .allow_url(&format!("http://127.0.0.1:{allowed_port}/simple"))
            .unwrap();
        let p = BuildProxy::start(&sock, allow, budget).unwrap();
        (t, sock, p)
    }

    #[tokio::test]
    async fn only_the_index_is_reachable() {
        let (port, seen) = upstream("index page").await;
        let (other, _) = upstream("secret").await;
        let (_t, sock, p) = proxy(port, 1 << 20);

        // An absolute-form GET to the index goes through, as one request in origin form.
        let r = ask(
            &sock,
            &format!("GET http://127.0.0.1:{port}/simple/x/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n"),
        )
        .await;
        assert!(r.ends_with("index page"), "{r}");
        let sent = String::from_utf8(seen.await.unwrap()).unwrap();
        assert!(sent.starts_with("GET /simple/x/ HTTP/1.1\r\n"), "{sent}");
        assert!(sent.contains("Connection: close"), "{sent}");
        assert!(!sent.contains("keep-alive"), "{sent}");

        // Another port of the same host, another host, CONNECT elsewhere, other methods: 403.
        for req in [
            format!("GET http://127.0.0.1:{other}/ HTTP/1.1\r\n\r\n"),
            format!("GET http://localhost:{port}/ HTTP/1.1\r\n\r\n"),
            format!("CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n"),
            format!("POST http://127.0.0.1:{port}/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            format!("GET http://user@127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
            "GET /relative HTTP/1.1\r\n\r\n".to_string(),
        ] {
            let r = ask(&sock, &req).await;
            assert!(r.starts_with("HTTP/1.1 403"), "{req} → {r}");
        }
        assert!(p.counters().refused.load(Ordering::Relaxed) >= 6);
    }

    #[tokio::test]
    async fn connect_tunnels_to_the_index_and_the_budget_cuts_it() {
        let (port, _) = upstream("0123456789").await;
        let (_t, sock, _p) = proxy(port, 1 << 20);
        let mut c = UnixStream::connect(&sock).await.unwrap();
        c.write_all(
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.starts_with("HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK"),
            "{out}"
        );
        assert!(out.ends_with("0123456789"));

        // A budget smaller than the answer: the copy stops before the body gets through.
        let (port, _) = upstream("0123456789").await;
        let (_t, sock, p) = proxy(port, 8);
        let r = ask(
            &sock,
            &format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(!r.contains("0123456789"), "{r}");
        assert!(p.counters().downloaded.load(Ordering::Relaxed) > 8);
    }

    #[tokio::test]
    async fn an_endless_head_is_refused_without_reading_it_all() {
        let (port, _) = upstream("x").await;
        let (_t, sock, _p) = proxy(port, 1 << 20);
        let mut c = UnixStream::connect(&sock).await.unwrap();
        let junk = vec![b'a'; MAX_HEAD_BYTES + 4096];
        let _ = c.write_all(&junk).await;
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out).await;
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 431"));
    }

    #[test]
    fn index_urls_give_host_and_port() {
        let mut a = AllowList::default();
        a.allow_url("https://pypi.org/simple").unwrap();
        a.allow_url("http://[::1]:8080/simple/").unwrap();
        a.allow_url("http://Mirror.Example:3141").unwrap();
        assert!(a.allows("pypi.org", 443));
        assert!(!a.allows("pypi.org", 80));
        assert!(a.allows("::1", 8080));
        assert!(a.allows("mirror.example", 3141));
        for bad in [
            "ftp://x/",
            "pypi.org/simple",
            "https://u:p@pypi.org/simple",
            "https://:443/",
            "https://h:0/",
            "https://h:99999/",
            "https://bad host/",
        ] {
            assert!(a.clone().allow_url(bad).is_err(), "{bad}");
        }
    }
}

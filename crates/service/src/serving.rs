//! The serving skeleton both services run (the worker's and the controller's `server`): bind,
//! serve an axum router until told to stop, then stop accepting, let open requests finish and
//! cut off what is still open after the grace period. The accept loop is hyper's own, so that
//! every connection is bounded: a header timeout, an idle timeout, and a cap on connections
//! under the open-file limit. TLS is optional ([`load_tls`]); its handshake is bounded by the
//! header timeout, and without it connections are plain TCP exactly as before.

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Sleep;
use tower_service::Service;

/// Why a server stopped with an error; `S` is the error of starting its service.
#[derive(Debug, thiserror::Error)]
pub enum ServeError<S: std::error::Error + 'static> {
    #[error("cannot listen on {0}: {1}")]
    Bind(String, std::io::Error),
    #[error("{0}")]
    Start(#[source] S),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// The listener's TLS from the `tls_cert` and `tls_key` settings (both or neither, which the
/// configs check): `None` serves plain HTTP. The files are read off the async threads.
pub async fn load_tls(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<Arc<rustls::ServerConfig>>, crate::tls::TlsError> {
    let (Some(cert), Some(key)) = (cert, key) else {
        return Ok(None);
    };
    let (cert, key) = (cert.to_path_buf(), key.to_path_buf());
    tokio::task::spawn_blocking(move || crate::tls::server_config(&cert, &key))
        .await
        .map_err(|e| crate::tls::TlsError::Read {
            setting: "tls_cert",
            source: std::io::Error::other(e.to_string()),
        })?
        .map(Some)
}

/// Loads what a client trusts ([`crate::tls::client_config`]) off the async threads.
pub async fn load_client_tls(
    setting: &'static str,
    ca: Option<&Path>,
) -> Result<Arc<rustls::ClientConfig>, crate::tls::TlsError> {
    let ca = ca.map(Path::to_path_buf);
    tokio::task::spawn_blocking(move || crate::tls::client_config(setting, ca.as_deref()))
        .await
        .map_err(|e| crate::tls::TlsError::Read {
            setting,
            source: std::io::Error::other(e.to_string()),
        })?
}

/// Creates the data directory if needed and returns its canonical path, so that what lives in
/// it (registry, sandbox bundles) does not depend on the working directory. It is private to
/// the service's user (0700: it holds function secrets), created so whatever the umask, and an
/// existing one is made private too. Sandboxes reach their code through bind mounts, which do
/// not depend on the modes of the directories above it.
pub fn open_data_dir(dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let dir = std::fs::canonicalize(dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

/// `$HEARTH_DATA_DIR`, else `$XDG_DATA_HOME/hearth`, else `~/.local/share/hearth`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME") {
        return PathBuf::from(d).join("hearth");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/share/hearth"),
        None => PathBuf::from("/var/lib/hearth"),
    }
}

/// CPUs of this host: what a status report assumes when a worker's status does not say.
pub fn host_cpus() -> f64 {
    available_cpus() as f64
}

/// The CPUs this process may use (affinity and cgroup quota), read once: std's
/// `available_parallelism` reads the cgroup hierarchy from /proc and /sys on every call, dozens
/// of system calls, which cost a worker with the default concurrency a third of its CPU when it
/// was asked on every invocation (bench/RESULTS.md).
pub fn available_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called (within a
/// tokio runtime), not when the future is first polled: a signal that arrives right after the
/// server is up must stop it gracefully, not meet the default action and kill the process.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind: SignalKind, name: &'static str| {
        let s = signal(kind);
        async move {
            match s {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, signal = name, "cannot listen for a signal");
                    std::future::pending::<()>().await;
                }
            }
        }
    };
    let term = listen(SignalKind::terminate(), "SIGTERM");
    let int = listen(SignalKind::interrupt(), "SIGINT");
    async move {
        tokio::select! {
            _ = term => {}
            _ = int => {}
        }
    }
}

/// Binds `listen` (`IP:PORT`) and rewrites it to the address it got, since port 0 asks for any
/// free one: the service then knows and reports its real address.
pub async fn bind<S: std::error::Error + 'static>(
    listen: &mut String,
) -> Result<(TcpListener, SocketAddr), ServeError<S>> {
    let listener = TcpListener::bind(listen.as_str())
        .await
        .map_err(|e| ServeError::Bind(listen.clone(), e))?;
    let addr = listener.local_addr()?;
    *listen = addr.to_string();
    Ok((listener, addr))
}

/// Waits (in a task) for `stop`, then calls `begin_shutdown` (the service refuses new
/// invocations) and turns the returned flag true (the server and background tasks wind down).
pub fn on_stop(
    stop: impl Future<Output = ()> + Send + 'static,
    begin_shutdown: impl FnOnce() + Send + 'static,
) -> watch::Receiver<bool> {
    let (stopping_tx, stopping_rx) = watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutting down: refusing new invocations, finishing in-flight ones");
        begin_shutdown();
        let _ = stopping_tx.send(true);
    });
    stopping_rx
}

/// Limits on the connections of the HTTP edge: hostile or broken clients must not hold file
/// descriptors forever or exhaust them (slowloris, idle floods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// From the first byte of a request head to its end; a slower head closes the connection.
    pub header_read_timeout: Duration,
    /// A connection with no request running and no bytes moving for this long is closed (a
    /// keep-alive connection waiting for its next request, a client that never sends one, or
    /// one that stopped reading its answer).
    pub idle_timeout: Duration,
    /// Most open connections; a connection over it is answered 503 `too_many_connections`
    /// and closed at once. Lowered at start to what the open-file limit allows.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_read_timeout: Duration::from_millis(DEFAULT_HEADER_READ_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// The largest handler result passed on, by default (AWS Lambda's synchronous limit).
pub const DEFAULT_MAX_RESULT_BYTES: usize = 6 * 1024 * 1024;
/// What `max_result_bytes` may be set to at most.
const MAX_RESULT_BYTES_CEILING: usize = 1024 * 1024 * 1024;

/// Range checks of the size, time and connection limits both services have.
pub fn check_limits(
    max_result_bytes: usize,
    async_max_bytes: usize,
    header_read_timeout_ms: u64,
    idle_timeout_ms: u64,
    max_connections: usize,
) -> Result<(), crate::config_loader::ConfigError> {
    let bad = |m: String| Err(crate::config_loader::ConfigError::Invalid(m));
    if !(1024..=MAX_RESULT_BYTES_CEILING).contains(&max_result_bytes) {
        return bad(format!(
            "max_result_bytes must be between 1024 and {MAX_RESULT_BYTES_CEILING}, got {max_result_bytes}"
        ));
    }
    if async_max_bytes == 0 {
        return bad("async_max_bytes must be positive".into());
    }
    for (key, ms) in [
        ("header_read_timeout_ms", header_read_timeout_ms),
        ("idle_timeout_ms", idle_timeout_ms),
    ] {
        if !(1..=3_600_000).contains(&ms) {
            return bad(format!("{key} must be between 1 and 3600000, got {ms}"));
        }
    }
    if !(1..=10_000_000).contains(&max_connections) {
        return bad(format!(
            "max_connections must be between 1 and 10000000, got {max_connections}"
        ));
    }
    Ok(())
}

/// A namespace's share of the async store when its setting is not given: a quarter of the
/// shared bound (at least 1), so that tenants filling their shares leave the others room.
pub fn default_namespace_share(shared: usize) -> usize {
    (shared / 4).max(1)
}

/// The per-namespace limits both services have, for [`check_namespace_limits`].
pub struct NamespaceLimits {
    pub async_max_records: usize,
    pub async_max_bytes: usize,
    pub async_max_records_per_namespace: Option<usize>,
    pub async_max_bytes_per_namespace: Option<usize>,
    pub max_functions_per_namespace: u64,
    pub max_code_bytes_per_namespace: Option<u64>,
}

/// Range checks of the per-namespace limits: positive, and a namespace's async share, when
/// given, no larger than the whole store.
pub fn check_namespace_limits(
    l: &NamespaceLimits,
) -> Result<(), crate::config_loader::ConfigError> {
    let bad = |m: String| Err(crate::config_loader::ConfigError::Invalid(m));
    if l.async_max_records == 0 {
        return bad("async_max_records must be positive".into());
    }
    if let Some(n) = l.async_max_records_per_namespace {
        if !(1..=l.async_max_records).contains(&n) {
            return bad(format!(
                "async_max_records_per_namespace must be between 1 and async_max_records ({}), got {n}",
                l.async_max_records
            ));
        }
    }
    if let Some(n) = l.async_max_bytes_per_namespace {
        if !(1..=l.async_max_bytes).contains(&n) {
            return bad(format!(
                "async_max_bytes_per_namespace must be between 1 and async_max_bytes ({}), got {n}",
                l.async_max_bytes
            ));
        }
    }
    if !(1..=1_000_000).contains(&l.max_functions_per_namespace) {
        return bad(format!(
            "max_functions_per_namespace must be between 1 and 1000000, got {}",
            l.max_functions_per_namespace
        ));
    }
    if l.max_code_bytes_per_namespace == Some(0) {
        return bad("max_code_bytes_per_namespace must be positive".into());
    }
    Ok(())
}

pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// File descriptors kept out of the connection cap for everything else the process opens
/// (sandbox sockets and runc's pipes, the registry, code files, outgoing connections).
const FD_RESERVE: u64 = 256;

/// Raises the soft open-file limit to the hard one (logging both) and returns how many
/// connections fit under it: the soft limit less a reserve, at least 16.
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot read RLIMIT_NOFILE");
        return 1024u64.saturating_sub(FD_RESERVE);
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        } else {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot raise RLIMIT_NOFILE");
        }
    }
    tracing::info!(
        soft_before = before,
        soft = lim.rlim_cur,
        hard = lim.rlim_max,
        "open-file limit"
    );
    fd_budget(lim.rlim_cur)
}

/// Connections that fit under an open-file limit of `soft`.
fn fd_budget(soft: u64) -> u64 {
    let reserve = FD_RESERVE.min(soft / 4);
    soft.saturating_sub(reserve).max(16)
}

/// What a connection over the cap gets before it is closed.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 92\r\n\r\n\
{\"error\":{\"code\":\"too_many_connections\",\"message\":\"too many open connections; retry later\"}}";

/// Serves `app` on `listener` (TCP_NODELAY on every connection, HTTP/1.1) until `stopping`
/// turns true; then awaits `drain`, accepts no more connections, and returns once every open
/// connection is done. Whatever is still open `cutoff` after stopping is cut off. `limits`
/// bound each connection's header time and idle time and the number of connections. With `tls`
/// every connection is TLS, its handshake bounded by the header read timeout.
pub async fn serve_until_stopped(
    listener: TcpListener,
    app: Router,
    stopping: watch::Receiver<bool>,
    drain: impl Future<Output = ()> + Send + 'static,
    cutoff: Duration,
    limits: ConnLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    let fd_budget = usize::try_from(raise_fd_limit()).unwrap_or(usize::MAX);
    let max_connections = limits.max_connections.min(fd_budget).max(1);
    if max_connections < limits.max_connections {
        tracing::info!(
            max_connections,
            configured = limits.max_connections,
            "max_connections lowered to fit the open-file limit"
        );
    }
    let limits = ConnLimits {
        max_connections,
        ..limits
    };
    let mut graceful_rx = stopping.clone();
    let mut serve_task = tokio::spawn(accept_loop(
        listener,
        app,
        async move {
            let _ = graceful_rx.wait_for(|s| *s).await;
            drain.await;
        },
        limits,
        tls.map(tokio_rustls::TlsAcceptor::from),
    ));
    let mut grace_rx = stopping;
    tokio::select! {
        res = &mut serve_task => {
            res.map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        _ = async {
            let _ = grace_rx.wait_for(|s| *s).await;
            tokio::time::sleep(cutoff).await;
        } => {
            tracing::warn!("grace period over with requests still running");
            serve_task.abort();
        }
    }
    Ok(())
}

/// Accepts until `stop` resolves, then drains: connections open before the stop finish their
/// requests and close, while new connections are still accepted and served one request each
/// (keep-alive off), so a client gets the service's own answer (503 `shutting_down` for an
/// invocation) instead of a refused connection. Once the old connections are done, the listener
/// closes.
async fn accept_loop(
    listener: TcpListener,
    app: Router,
    stop: impl Future<Output = ()>,
    limits: ConnLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let graceful = GracefulShutdown::new();
    let open = Arc::new(AtomicUsize::new(0));
    let mut builder = http1::Builder::new();
    // The header and idle timeouts are the connection's own (hyper's header timer would also
    // cut idle keep-alive connections at the header timeout).
    builder.keep_alive(true).header_read_timeout(None);
    let conns = Connections {
        app,
        limits,
        tls,
        open,
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => conns.serve(tcp, &builder, Some(graceful.watcher())),
                Err(e) => accept_error(&e).await,
            },
        }
    }
    builder.keep_alive(false);
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    loop {
        tokio::select! {
            biased;
            _ = &mut drained => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => conns.serve(tcp, &builder, None),
                Err(e) => accept_error(&e).await,
            },
        }
    }
    drop(listener);
}

/// What serving one connection needs.
struct Connections {
    app: Router,
    limits: ConnLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Open connections, for the cap.
    open: Arc<AtomicUsize>,
}

impl Connections {
    /// Serves `tcp` in its own task (refused at once over the cap); `watcher` makes it part of a
    /// graceful shutdown.
    fn serve(
        &self,
        tcp: TcpStream,
        builder: &http1::Builder,
        watcher: Option<hyper_util::server::graceful::Watcher>,
    ) {
        let limits = self.limits;
        if self.open.load(Ordering::Relaxed) >= limits.max_connections {
            // Answer without waiting on the peer and free the descriptor at once (a TLS client
            // could not read a plain answer: it only sees the close).
            if self.tls.is_none() {
                let _ = tcp.try_write(REFUSAL);
            }
            drop(tcp);
            tracing::debug!(
                limit = limits.max_connections,
                "connection refused: too many"
            );
            return;
        }
        let _ = tcp.set_nodelay(true);
        let counted = ConnCount::new(&self.open);
        let shared = Arc::new(ConnShared::default());
        let io = TokioIo::new(WatchedIo::new(tcp, Arc::clone(&shared), limits));
        let router = self.app.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let guard = RequestGuard::new(Arc::clone(&shared));
            let mut router = router.clone();
            async move {
                let resp = router.call(req).await;
                drop(guard);
                resp
            }
        });
        let builder = builder.clone();
        let Some(acceptor) = &self.tls else {
            tokio::spawn(async move {
                finish(builder.serve_connection(io, service), watcher).await;
                drop(counted);
            });
            return;
        };
        // The handshake runs in the connection's task, so a slow one never holds up accepting.
        let handshake = acceptor.accept(io.into_inner());
        tokio::spawn(async move {
            let mut tls = match tokio::time::timeout(limits.header_read_timeout, handshake).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake not complete within the header read timeout");
                    return;
                }
            };
            // The handshake's bytes are not a request head: the head's clock starts afresh.
            tls.get_mut().0.handshake_done();
            finish(
                builder.serve_connection(TokioIo::new(tls), service),
                watcher,
            )
            .await;
            drop(counted);
        });
    }
}

/// Serves a connection to its end, as part of the graceful shutdown when `watcher` is given.
async fn finish<C>(conn: C, watcher: Option<hyper_util::server::graceful::Watcher>)
where
    C: hyper_util::server::graceful::GracefulConnection,
    C::Error: std::fmt::Display,
{
    let res = match watcher {
        Some(w) => w.watch(conn).await,
        None => conn.await,
    };
    if let Err(e) = res {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Out of descriptors (EMFILE/ENFILE) or a connection reset before accept: wait a little
/// rather than spin on the error.
async fn accept_error(e: &std::io::Error) {
    match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM) => {
            tracing::warn!(error = %e, "accept failed; pausing");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        _ => tracing::debug!(error = %e, "accept failed"),
    }
}

/// One open connection, counted until dropped.
struct ConnCount(Arc<AtomicUsize>);

impl ConnCount {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        ConnCount(Arc::clone(open))
    }
}

impl Drop for ConnCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a connection's service tells its IO: how many requests run, and how many have begun.
#[derive(Default)]
struct ConnShared {
    running: AtomicUsize,
    begun: AtomicU64,
}

/// A request from its head to its answer; while one runs, the connection never times out
/// (a long invocation keeps its connection).
struct RequestGuard(Arc<ConnShared>);

impl RequestGuard {
    fn new(shared: Arc<ConnShared>) -> Self {
        shared.running.fetch_add(1, Ordering::Relaxed);
        shared.begun.fetch_add(1, Ordering::Relaxed);
        RequestGuard(shared)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A TCP stream that ends itself (a `TimedOut` error, which makes hyper close the connection)
/// when a request head takes longer than the header timeout from its first byte, or when no
/// request runs and no byte moved for the idle timeout. Both are checked only when a read or
/// write would wait, so the fast path costs a few clock reads and atomics per request.
struct WatchedIo {
    inner: TcpStream,
    shared: Arc<ConnShared>,
    limits: ConnLimits,
    /// When bytes last moved.
    last_io: Instant,
    /// When the first byte of a head not yet handed to the service arrived.
    head_started: Option<Instant>,
    /// `shared.begun` when `head_started` was set: a change means the head was complete.
    begun_seen: u64,
    timer: Option<Pin<Box<Sleep>>>,
}

impl WatchedIo {
    fn new(inner: TcpStream, shared: Arc<ConnShared>, limits: ConnLimits) -> Self {
        WatchedIo {
            inner,
            shared,
            limits,
            last_io: Instant::now(),
            head_started: None,
            begun_seen: 0,
            timer: None,
        }
    }

    /// A TLS handshake is over: what it read does not count toward a request head.
    fn handshake_done(&mut self) {
        self.head_started = None;
        self.last_io = Instant::now();
    }

    /// Bytes moved: the connection is not idle, and a fresh head may have started.
    /// A write's outcome: progress resets the clocks; a write that cannot go on waits on the
    /// connection's deadline.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        res: Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        match res {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.on_progress(false);
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.poll_deadline(cx).map(Err),
        }
    }

    fn on_progress(&mut self, read: bool) {
        let now = Instant::now();
        self.last_io = now;
        let begun = self.shared.begun.load(Ordering::Relaxed);
        if begun != self.begun_seen {
            self.head_started = None;
            self.begun_seen = begun;
        }
        if read && self.head_started.is_none() && self.shared.running.load(Ordering::Relaxed) == 0 {
            self.head_started = Some(now);
            self.begun_seen = begun;
        }
    }

    /// The IO would wait: Ready(error) if a deadline passed, else Pending with the timer armed.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        if self.shared.running.load(Ordering::Relaxed) > 0 {
            return Poll::Pending;
        }
        if self.shared.begun.load(Ordering::Relaxed) != self.begun_seen {
            self.head_started = None;
        }
        let idle_deadline = self.last_io + self.limits.idle_timeout;
        let (deadline, what) = match self.head_started {
            Some(t) => {
                let head = t + self.limits.header_read_timeout;
                if head < idle_deadline {
                    (
                        head,
                        "request head not complete within the header read timeout",
                    )
                } else {
                    (idle_deadline, "connection idle past the idle timeout")
                }
            }
            None => (idle_deadline, "connection idle past the idle timeout"),
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        // The timer only ever moves earlier here; a deadline that moved later (the usual case
        // after a request) is found when the timer fires, which saves a timer update per request.
        let timer = match &mut self.timer {
            Some(t) => {
                if deadline < t.deadline() {
                    t.as_mut().reset(deadline);
                }
                t
            }
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        loop {
            match timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) if tokio::time::Instant::now() >= deadline => {
                    return Poll::Ready(std::io::Error::new(std::io::ErrorKind::TimedOut, what));
                }
                Poll::Ready(()) => timer.as_mut().reset(deadline),
            }
        }
    }
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.on_progress(true);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_deadline(cx).map(Err),
        }
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let res = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after_write(cx, res)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let res = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after_write(cx, res)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_rest() {
        assert_eq!(fd_budget(1024), 768);
        assert_eq!(fd_budget(1_048_576), 1_048_320);
        assert_eq!(fd_budget(64), 48);
        assert_eq!(fd_budget(8), 16);
    }

    #[test]
    fn the_refusal_is_one_complete_json_answer() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }

    async fn serve(limits: ConnLimits) -> (SocketAddr, watch::Sender<bool>) {
        serve_with(limits, None).await
    }

    async fn serve_with(
        limits: ConnLimits,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> (SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "ok"
            }),
        );
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            let _ = serve_until_stopped(
                listener,
                app,
                rx,
                std::future::ready(()),
                Duration::from_secs(5),
                limits,
                tls,
            )
            .await;
        });
        (addr, tx)
    }

    /// Reads until EOF; the bytes read.
    async fn read_to_close(s: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
        out
    }

    #[tokio::test]
    async fn a_half_sent_head_is_closed_at_the_header_timeout_but_a_slow_handler_is_not() {
        let (addr, _stop) = serve(ConnLimits {
            header_read_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_secs(60),
            max_connections: 100,
        })
        .await;
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        // EOF (not the 20 s guard) proves the server closed it.
        let got = tokio::time::timeout(Duration::from_secs(20), async {
            let mut b = Vec::new();
            slow.read_to_end(&mut b).await.map(|_| b)
        })
        .await;
        assert!(matches!(got, Ok(Ok(_)) | Ok(Err(_))), "still open");
        // A request whose handler outlives both timeouts still gets its answer.
        let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let body = read_to_close(&mut ok).await;
        assert!(String::from_utf8_lossy(&body).starts_with("HTTP/1.1 200"));
    }

    /// A TLS listener for `localhost` (a self-signed certificate loaded from PEM files), and a
    /// client config trusting it.
    fn tls_pair() -> (Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>) {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert, ck.cert.pem()).unwrap();
        std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
        let server = crate::tls::server_config(&cert, &key).unwrap();
        let client = crate::tls::client_config("tls_ca", Some(&cert)).unwrap();
        (server, client)
    }

    #[tokio::test]
    async fn over_tls_the_head_clock_starts_after_the_handshake() {
        let (server, client) = tls_pair();
        let (addr, _stop) = serve_with(
            ConnLimits {
                header_read_timeout: Duration::from_millis(100),
                idle_timeout: Duration::from_secs(60),
                max_connections: 100,
            },
            Some(server),
        )
        .await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client)
            .connect(name, tcp)
            .await
            .unwrap();
        // Quiet for longer than the header timeout but well under the idle timeout: a fresh
        // connection waiting for its first request, not a slow head.
        tokio::time::sleep(Duration::from_millis(400)).await;
        tls.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut out)).await;
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn idle_connections_are_closed_and_over_the_cap_get_503() {
        let (addr, _stop) = serve(ConnLimits {
            header_read_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_millis(200),
            max_connections: 2,
        })
        .await;
        let mut a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        // Let the server accept both before the third arrives.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let refused = String::from_utf8_lossy(&read_to_close(&mut c).await).to_string();
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.contains("too_many_connections"));
        // The idle ones are closed by the server (EOF), freeing the slots.
        assert!(read_to_close(&mut a).await.is_empty());
        let mut d = tokio::net::TcpStream::connect(addr).await.unwrap();
        d.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let body = read_to_close(&mut d).await;
        assert!(String::from_utf8_lossy(&body).starts_with("HTTP/1.1 200"));
    }
}

//! The serving skeleton both services run (the worker's and the controller's `server`): bind,
//! serve an axum router until told to stop, then stop accepting, let open requests finish and
//! cut off what is still open after the grace period.

use axum::serve::ListenerExt;
use axum::Router;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Why a server stopped with an error; `S` is the error of starting its service.
#[derive(Debug, thiserror::Error)]
pub enum ServeError<S: std::error::Error + 'static> {
    #[error("cannot listen on {0}: {1}")]
    Bind(String, std::io::Error),
    #[error("{0}")]
    Start(#[source] S),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
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
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
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

/// Serves `app` on `listener` (TCP_NODELAY on every connection) until `stopping` turns true; then
/// accepts no more connections, awaits `drain` and returns once every open connection is done.
/// Whatever is still open `cutoff` after stopping is cut off.
pub async fn serve_until_stopped(
    listener: TcpListener,
    app: Router,
    stopping: watch::Receiver<bool>,
    drain: impl Future<Output = ()> + Send + 'static,
    cutoff: Duration,
) -> std::io::Result<()> {
    let mut graceful_rx = stopping.clone();
    let mut serve_task = tokio::spawn(async move {
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = graceful_rx.wait_for(|s| *s).await;
                drain.await;
            })
            .await
    });
    let mut grace_rx = stopping;
    tokio::select! {
        res = &mut serve_task => {
            res.map_err(|e| std::io::Error::other(e.to_string()))??;
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

//! Runs a worker: binds, serves, and shuts down gracefully on SIGTERM or Ctrl-C.

use crate::config::WorkerConfig;
use crate::worker::{StartError, Worker};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {0}: {1}")]
    Bind(String, std::io::Error),
    #[error("{0}")]
    Start(#[from] StartError),
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
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

/// Serves the worker API until `stop` resolves, then drains and removes every sandbox.
pub async fn serve(
    config: WorkerConfig,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let mut config = config;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| ServeError::Bind(config.listen.clone(), e))?;
    let addr = listener.local_addr()?;
    // Port 0 asks for any free port: name the worker after the one it got.
    config.listen = addr.to_string();
    let grace = Duration::from_secs(config.shutdown_grace_s);
    let worker = Worker::start(config).await?;
    tracing::info!(
        %addr,
        worker = worker.id(),
        backend = worker.backend_name(),
        data_dir = %worker.config().data_dir.display(),
        "hearth worker listening"
    );
    let app = crate::api::router(Arc::clone(&worker));
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let membership = worker.config().controller.clone().map(|controller| {
        let url = worker
            .config()
            .advertise_url
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"));
        let interval = Duration::from_millis(worker.config().status_interval_ms);
        tokio::spawn(crate::membership::run(
            Arc::clone(&worker),
            controller,
            url,
            interval,
            stopping_rx.clone(),
        ))
    });
    let w2 = Arc::clone(&worker);
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutting down: refusing new invocations, finishing in-flight ones");
        w2.begin_shutdown();
        let _ = stopping_tx.send(true);
    });
    let mut graceful_rx = stopping_rx.clone();
    let mut serve_task = tokio::spawn(async move {
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = graceful_rx.wait_for(|s| *s).await;
            })
            .await
    });
    // The server returns once every connection is done; a request still running after the
    // grace period is cut off and its sandbox killed below.
    let mut grace_rx = stopping_rx;
    tokio::select! {
        res = &mut serve_task => {
            res.map_err(|e| std::io::Error::other(e.to_string()))??;
        }
        _ = async {
            let _ = grace_rx.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!("grace period over with requests still running");
            serve_task.abort();
        }
    }
    if let Some(m) = membership {
        let _ = tokio::time::timeout(Duration::from_secs(2), m).await;
    }
    worker.shutdown(grace).await;
    Ok(())
}

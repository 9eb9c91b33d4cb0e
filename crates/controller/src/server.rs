//! Runs a controller: binds, serves, and shuts down gracefully on SIGTERM or Ctrl-C.

use crate::config::ControllerConfig;
use crate::controller::{Controller, StartError};
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

/// Serves the controller API until `stop` resolves, then lets in-flight invocations finish
/// (up to the grace period). `ready` gets the bound address once the API is up.
pub async fn serve(
    config: ControllerConfig,
    stop: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<std::net::SocketAddr>>,
) -> Result<(), ServeError> {
    let mut config = config;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| ServeError::Bind(config.listen.clone(), e))?;
    let addr = listener.local_addr()?;
    config.listen = addr.to_string();
    let grace = Duration::from_secs(config.shutdown_grace_s);
    let controller = Controller::start(config).await?;
    tracing::info!(
        %addr,
        balance = %controller.config().balance,
        data_dir = %controller.config().data_dir.display(),
        static_workers = controller.config().workers.len(),
        "hearth controller listening"
    );
    let app = crate::api::router(Arc::clone(&controller));
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let mut graceful_rx = stopping_rx.clone();
    let c2 = Arc::clone(&controller);
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutting down: refusing new invocations, finishing in-flight ones");
        c2.begin_shutdown();
        let _ = stopping_tx.send(true);
    });
    if let Some(tx) = ready {
        let _ = tx.send(addr);
    }
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let c3 = Arc::clone(&controller);
    let mut serve_task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = graceful_rx.wait_for(|s| *s).await;
                // Async invocations have no connection to keep the server up: wait for them.
                c3.drain(grace).await;
            })
            .await
    });
    // The server returns once every connection is done; one still open after the grace period
    // is cut off.
    let mut grace_rx = stopping_rx;
    tokio::select! {
        res = &mut serve_task => {
            res.map_err(|e| std::io::Error::other(e.to_string()))??;
        }
        _ = async {
            let _ = grace_rx.wait_for(|s| *s).await;
            tokio::time::sleep(grace + Duration::from_secs(1)).await;
        } => {
            tracing::warn!("grace period over with requests still running");
            serve_task.abort();
        }
    }
    Ok(())
}

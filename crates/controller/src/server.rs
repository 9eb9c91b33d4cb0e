//! Runs a controller: binds, serves, and shuts down gracefully on SIGTERM or Ctrl-C.

use crate::config::ControllerConfig;
use crate::errors::StartError;
use crate::facade::Controller;
use hearth_service::serving;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Why the server stopped with an error.
pub type ServeError = serving::ServeError<StartError>;

/// Serves the controller API until `stop` resolves, then lets in-flight invocations finish
/// (up to the grace period). `ready` gets the bound address once the API is up.
pub async fn serve(
    mut config: ControllerConfig,
    stop: impl Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<std::net::SocketAddr>>,
) -> Result<(), ServeError> {
    let tls = serving::load_tls(config.tls_cert.as_deref(), config.tls_key.as_deref()).await?;
    let (listener, addr) = serving::bind(&mut config.listen).await?;
    let grace = Duration::from_secs(config.shutdown_grace_s);
    let limits = config.conn_limits();
    let controller = Controller::start(config).await.map_err(ServeError::Start)?;
    tracing::info!(
        %addr,
        tls = tls.is_some(),
        balance = %controller.config().balance,
        data_dir = %controller.config().data_dir.display(),
        static_workers = controller.config().workers.len(),
        runtime_threads = controller.config().effective_runtime_threads(),
        "hearth controller listening"
    );
    let app = crate::api::router(Arc::clone(&controller));
    let c2 = Arc::clone(&controller);
    let stopping = serving::on_stop(stop, move || c2.begin_shutdown());
    if let Some(tx) = ready {
        let _ = tx.send(addr);
    }
    // Async invocations have no connection to keep the server up: wait for them.
    let drain = async move { controller.drain(grace).await };
    // A connection still open a second after the grace period is cut off.
    serving::serve_until_stopped(
        listener,
        app,
        stopping,
        drain,
        grace + Duration::from_secs(1),
        limits,
        tls,
    )
    .await?;
    Ok(())
}

//! Runs a worker: binds, serves, and shuts down gracefully on SIGTERM or Ctrl-C.

use crate::config::WorkerConfig;
use crate::facade::{StartError, Worker};
use hearth_service::serving;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use hearth_service::serving::shutdown_signal;

/// Why the server stopped with an error.
pub type ServeError = serving::ServeError<StartError>;

/// Serves the worker API until `stop` resolves, then drains and removes every sandbox.
pub async fn serve(
    mut config: WorkerConfig,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let tls = serving::load_tls(config.tls_cert.as_deref(), config.tls_key.as_deref()).await?;
    // Only a worker that joins a controller is a client; its trust is loaded (and checked) now.
    let client_tls = match &config.controller {
        Some(_) => Some(serving::load_client_tls("tls_ca", config.tls_ca.as_deref()).await?),
        None => None,
    };
    // Port 0 asks for any free port: the worker is named after the one it got.
    let (listener, addr) = serving::bind(&mut config.listen).await?;
    let grace = Duration::from_secs(config.shutdown_grace_s);
    let limits = config.conn_limits();
    let worker = Worker::start(config).await.map_err(ServeError::Start)?;
    tracing::info!(
        %addr,
        tls = tls.is_some(),
        worker = worker.id(),
        backend = worker.backend_name(),
        runtime_threads = worker.config().effective_runtime_threads(),
        data_dir = %worker.config().data_dir.display(),
        "hearth worker listening"
    );
    let app = crate::api::router(Arc::clone(&worker));
    let w2 = Arc::clone(&worker);
    let stopping = serving::on_stop(stop, move || w2.begin_shutdown());
    let scheme = if tls.is_some() { "https" } else { "http" };
    let membership =
        worker
            .config()
            .controller
            .clone()
            .zip(client_tls)
            .map(|(controller, client_tls)| {
                let url = worker
                    .config()
                    .advertise_url
                    .clone()
                    .unwrap_or_else(|| format!("{scheme}://{addr}"));
                let interval = Duration::from_millis(worker.config().status_interval_ms);
                tokio::spawn(crate::membership::run(
                    Arc::clone(&worker),
                    controller,
                    url,
                    interval,
                    client_tls,
                    stopping.clone(),
                ))
            });
    // Published in the cluster's store, every controller finds this worker and polls it.
    let store_membership = match worker.config().store.clone() {
        Some(store) => {
            let url = worker
                .config()
                .advertise_url
                .clone()
                .unwrap_or_else(|| format!("{scheme}://{addr}"));
            Some(tokio::spawn(crate::membership::join_store(
                Arc::clone(&worker),
                store,
                url,
                stopping.clone(),
            )))
        }
        None => None,
    };
    // A worker in a cluster keeps its connections open for a moment after the stop, answering
    // 503 `shutting_down`, until its controllers have seen it leave: closing idle keep-alive
    // connections at once could cut a request a controller is sending on one at that instant.
    let linger = if worker.config().store.is_some() {
        Duration::from_millis(1200)
    } else if worker.config().controller.is_some() {
        Duration::from_millis(300)
    } else {
        Duration::ZERO
    };
    // A request still running after the grace period is cut off and its sandbox killed below.
    serving::serve_until_stopped(
        listener,
        app,
        stopping,
        tokio::time::sleep(linger),
        grace,
        limits,
        tls,
    )
    .await?;
    if let Some(m) = membership {
        let _ = tokio::time::timeout(Duration::from_secs(2), m).await;
    }
    // Drained: the membership goes now (controllers already stopped sending work when its
    // status said it was shutting down).
    if let Some(task) = store_membership {
        task.abort();
        if let Ok(Some(m)) = task.await {
            let _ = tokio::time::timeout(Duration::from_secs(2), m.leave()).await;
        }
    }
    worker.shutdown(grace).await;
    Ok(())
}

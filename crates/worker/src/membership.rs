//! Joining a controller: the worker pushes its status to `PUT /v1/cluster/workers/{id}` every
//! `status_interval_ms` (the first push joins it) and says goodbye with a `DELETE` when it shuts
//! down. The controller balances on these reports, stale by up to one interval by design.
//!
//! The report ([`StatusReport::from_status`]) is built from the typed [`Worker::status`]: the load
//! (the normalized 1-minute load average plus the queued invocations per CPU), the queue
//! (`queue.length`, `queue.running`), free memory and the sandboxes per function.

use crate::facade::Worker;
use bytes::Bytes;
use hearth_api::StatusReport;
use hearth_service::error::error_chain;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

/// A new random incarnation id.
pub fn new_incarnation() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Percent-encodes a worker id for use as one path segment.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client for `http://` and `https://` controllers; `https://` trusts `tls`.
fn client(tls: Arc<rustls::ClientConfig>) -> HttpClient {
    Client::builder(TokioExecutor::new()).build(hearth_service::tls::client_connector(tls, None))
}

async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    credential: Option<&hyper::header::HeaderValue>,
    body: Bytes,
    timeout: Duration,
) -> Result<StatusCode, String> {
    let mut req = Request::builder()
        .method(method)
        .uri(url)
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(c) = credential {
        req = req.header(hyper::header::AUTHORIZATION, c.clone());
    }
    let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = client.request(req).await.map_err(|e| error_chain(&e))?;
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        Ok(status)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

/// Pushes status to `controller` until `stopping` turns true, then leaves.
pub async fn run(
    worker: Arc<Worker>,
    controller: String,
    url: String,
    interval: Duration,
    tls: Arc<rustls::ClientConfig>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let client = client(tls);
    let incarnation = new_incarnation();
    let endpoint = format!(
        "{}/v1/cluster/workers/{}",
        controller.trim_end_matches('/'),
        path_segment(worker.id())
    );
    let timeout = interval.max(Duration::from_secs(1));
    // This worker's own credential proves to the controller who it is; it is good for joining,
    // pushing this worker's status and leaving, nothing else.
    let credential = worker.auth().worker_secret().and_then(|k| k.header_value());
    let mut joined: Option<bool> = None;
    // Each push of this incarnation is numbered: the controller refuses a replayed one.
    let mut seq = 0u64;
    loop {
        if *stopping.borrow() {
            break;
        }
        seq += 1;
        let mut report = StatusReport::from_status(
            &worker.status(),
            &url,
            &incarnation,
            hearth_service::serving::host_cpus(),
        );
        report.seq = seq;
        let body = serde_json::to_vec(&report)
            .map(Bytes::from)
            .unwrap_or_default();
        let res = send(
            &client,
            Method::PUT,
            &endpoint,
            credential.as_ref(),
            body,
            timeout,
        )
        .await;
        match res {
            Ok(s) if s.is_success() => {
                if joined != Some(true) {
                    tracing::info!(%controller, %url, "joined the controller");
                }
                joined = Some(true);
            }
            other => {
                if joined != Some(false) {
                    let why = match other {
                        Ok(s) => format!("it answered {s}"),
                        Err(e) => e,
                    };
                    tracing::warn!(%controller, error = %why, "cannot push status to the controller; retrying every interval");
                }
                joined = Some(false);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stopping.wait_for(|s| *s) => break,
        }
    }
    match send(
        &client,
        Method::DELETE,
        &endpoint,
        credential.as_ref(),
        Bytes::new(),
        Duration::from_secs(1),
    )
    .await
    {
        Ok(_) => tracing::info!(%controller, "left the controller"),
        Err(e) => {
            tracing::warn!(%controller, error = %e, "could not tell the controller we are leaving")
        }
    }
}

/// Joins the cluster through its state store: connects (retrying with back-off until it
/// works or the worker stops) and publishes this worker under a lease kept alive in the
/// background. Returns the membership to leave at the end (None when stopped first).
pub async fn join_store(
    worker: Arc<Worker>,
    store: String,
    url: String,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Option<Box<dyn hearth_service::store::Membership>> {
    use hearth_service::store::{
        etcd::EtcdStore, ClusterState, MemberKind, MemberRecord, StoreUrl,
    };
    let store_url = StoreUrl::parse(&store);
    let endpoints = match &store_url {
        Ok(StoreUrl::Etcd(e)) => e.clone(),
        _ => {
            tracing::error!("store must be an etcds:// or etcd:// URL to join a cluster by");
            return None;
        }
    };
    let access = worker.config().store_access();
    if let Ok(u) = &store_url {
        access.warn_at_start(u);
    }
    let ttl = worker.config().lease_ttl_ms;
    let me = MemberRecord {
        name: worker.id().to_string(),
        url,
        incarnation: new_incarnation(),
    };
    let mut wait = Duration::from_millis(200);
    loop {
        if *stopping.borrow() {
            return None;
        }
        let joined = async {
            // Read again on every try: the operator may fix a file meanwhile.
            let credentials = access.load().await?;
            let s = EtcdStore::connect_with(&endpoints, "/hearth", ttl, &credentials).await?;
            s.join(MemberKind::Worker, &me, ttl).await
        }
        .await;
        match joined {
            Ok(m) => {
                tracing::info!(worker = %me.name, "joined the cluster's membership");
                return Some(m);
            }
            Err(e) => tracing::warn!(error = %e, "cannot join the cluster's store; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopping.changed() => {}
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ids_become_one_path_segment() {
        assert_eq!(path_segment("127.0.0.1:7878"), "127.0.0.1:7878");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }
}

//! The controller's side of membership: where each worker is, which functions it already has,
//! and a signal that fires when it leaves so that invocations waiting on it end at once; and the
//! two tasks that keep the ring honest without a push: the status-deadline sweep and the polling
//! of the config's static workers. Joining and leaving themselves are the [`crate::driver`]'s,
//! under the policy's lock.

use crate::facade::Controller;
use bytes::Bytes;
use dashmap::DashMap;
use hearth_api::{StatusReport, WorkerStatus};
use hearth_core::balance::WorkerId;
use hyper::Method;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A new random incarnation id (of this controller's membership).
pub fn new_incarnation() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// One incarnation of a worker, as the controller knows it.
pub struct Member {
    pub id: WorkerId,
    pub name: String,
    pub url: String,
    pub incarnation: String,
    /// Polled by the controller (from its config) rather than pushing.
    pub is_static: bool,
    /// Functions registered on this incarnation: name → the controller's version.
    registered: Arc<DashMap<String, u64>>,
    /// Serializes registrations on this worker, so concurrent first invocations register once.
    pub registering: Arc<tokio::sync::Mutex<()>>,
    gone: watch::Sender<bool>,
    last: Mutex<Option<(StatusReport, Instant)>>,
    /// This process's own connection pool (made at first use).
    forwarder: Arc<std::sync::OnceLock<crate::forward::Forwarder>>,
    /// `Bearer <the controller's token for this worker>`: sent to this worker only, and only
    /// once its credential was verified (its push, or its identity proof).
    credential: Option<hyper::header::HeaderValue>,
    /// The last push number taken from this incarnation.
    last_seq: Arc<std::sync::atomic::AtomicU64>,
}

impl Member {
    /// This worker process's pool: `base` with a pool of its own and this worker's token.
    pub fn forwarder(&self, base: &crate::forward::Forwarder) -> &crate::forward::Forwarder {
        self.forwarder
            .get_or_init(|| base.fresh_with(self.credential.clone()))
    }

    /// Takes push number `seq` of this incarnation: false if it is not above the last one (a
    /// replay, or a push overtaken by a later one).
    pub fn take_seq(&self, seq: u64) -> bool {
        use std::sync::atomic::Ordering;
        self.last_seq
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                (seq > last).then_some(seq)
            })
            .is_ok()
    }

    pub fn new(
        id: WorkerId,
        report: &StatusReport,
        is_static: bool,
        credential: Option<hyper::header::HeaderValue>,
    ) -> Self {
        Member {
            id,
            name: report.worker.clone(),
            url: report.url.trim_end_matches('/').to_string(),
            incarnation: report.incarnation.clone(),
            is_static,
            registered: Arc::new(DashMap::new()),
            registering: Arc::new(tokio::sync::Mutex::new(())),
            gone: watch::channel(false).0,
            last: Mutex::new(None),
            forwarder: Arc::new(std::sync::OnceLock::new()),
            credential,
            last_seq: Arc::new(std::sync::atomic::AtomicU64::new(report.seq)),
        }
    }

    /// The same incarnation coming back after it was marked gone: what it has registered is
    /// still there, but it gets a fresh leave signal.
    pub fn rejoined(&self) -> Self {
        Member {
            id: self.id,
            name: self.name.clone(),
            url: self.url.clone(),
            incarnation: self.incarnation.clone(),
            is_static: self.is_static,
            registered: Arc::clone(&self.registered),
            registering: Arc::clone(&self.registering),
            gone: watch::channel(false).0,
            last: Mutex::new(self.last.lock().clone()),
            forwarder: Arc::clone(&self.forwarder),
            credential: self.credential.clone(),
            last_seq: Arc::clone(&self.last_seq),
        }
    }

    pub fn same_process(&self, report: &StatusReport) -> bool {
        self.incarnation == report.incarnation && self.url == report.url.trim_end_matches('/')
    }

    pub fn has(&self, function: &str, version: u64) -> bool {
        self.registered.get(function).is_some_and(|v| *v == version)
    }

    pub fn registered_as(&self, function: &str, version: u64) {
        self.registered.insert(function.to_string(), version);
    }

    /// Forgets a function (deleted, or the worker lost it); true if it was registered.
    pub fn forget(&self, function: &str) -> bool {
        self.registered.remove(function).is_some()
    }

    /// Fires the leave signal.
    pub fn mark_gone(&self) {
        self.gone.send_replace(true);
    }

    pub fn is_gone(&self) -> bool {
        *self.gone.borrow()
    }

    /// Resolves once the worker has left.
    pub fn gone(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.gone.subscribe();
        async move {
            let _ = rx.wait_for(|g| *g).await;
        }
    }

    pub fn set_report(&self, report: StatusReport) {
        *self.last.lock() = Some((report, Instant::now()));
    }

    pub fn report(&self) -> Option<(StatusReport, Instant)> {
        self.last.lock().clone()
    }

    /// The memory of this worker's largest GPU by its last report (MiB); None without GPUs.
    pub fn largest_gpu_mb(&self) -> Option<u64> {
        self.last
            .lock()
            .as_ref()
            .and_then(|(r, _)| hearth_api::largest_gpu_mb(&r.gpus))
    }

    /// When the last report arrived (without copying it).
    pub fn report_at(&self) -> Option<Instant> {
        self.last.lock().as_ref().map(|(_, at)| *at)
    }
}

/// Workers that miss their status deadline leave the ring.
pub(crate) async fn sweep(c: Weak<Controller>) {
    loop {
        let period = {
            let Some(c) = c.upgrade() else { return };
            let timeout_ms = c.config().status_timeout_ms;
            c.driver().expire(timeout_ms);
            Duration::from_millis((timeout_ms / 4).clamp(10, 1000))
        };
        tokio::time::sleep(period).await;
    }
}

/// Probes every live worker's `/healthz` each `probe_interval_ms`: one that does not answer
/// within `probe_timeout_ms` (frozen, stuck, or gone) leaves the ring until it reports again.
/// Its running invocations are not ended: it may thaw and finish them.
pub(crate) async fn probe(c: Weak<Controller>) {
    loop {
        let Some(ctl) = c.upgrade() else { return };
        let every = ctl.config().probe_interval_ms;
        if every == 0 {
            return;
        }
        let timeout = Duration::from_millis(ctl.config().probe_timeout_ms);
        let live: Vec<Arc<Member>> = ctl
            .driver()
            .members()
            .into_iter()
            .filter(|m| ctl.driver().is_up(m.id))
            .collect();
        let mut probes = tokio::task::JoinSet::new();
        for m in live {
            let ctl = Arc::clone(&ctl);
            probes.spawn(async move {
                let sent = ctl
                    .forwarder()
                    .send(Method::GET, &m.url, "/healthz", Bytes::new(), timeout)
                    .await;
                let why = match sent {
                    Ok(a) if a.is_success() => return,
                    Ok(a) => format!("its health probe answered {}", a.status),
                    Err(e) => format!("its health probe failed: {e}"),
                };
                ctl.driver().leave(m.id, &why, "suspected");
            });
        }
        drop(ctl);
        while probes.join_next().await.is_some() {}
        tokio::time::sleep(Duration::from_millis(every)).await;
    }
}

/// What a worker's `GET /v1/cluster/identity` answers.
#[derive(serde::Deserialize)]
struct Identity {
    worker: String,
    credential: String,
    proof: String,
}

/// Asks the worker at `url` to prove, before it is sent anything, that it holds the credential
/// of the worker it claims to be (`name`, when the store says who it is): the proof is an HMAC
/// with its controller token of a fresh challenge and of `url` itself, so a process elsewhere
/// that relays the challenge to the real worker gets a proof that does not fit its own URL.
/// The answer is the header to call it with.
async fn verify_worker(
    ctl: &Controller,
    url: &str,
    name: Option<&str>,
    timeout: Duration,
) -> Result<Verified, String> {
    let (Some(master), Some(keys)) = (ctl.auth().cluster_key(), ctl.auth().keys()) else {
        return Err("authentication is off".into());
    };
    let nonce = format!("{:032x}", rand::random::<u128>());
    let a = ctl
        .forwarder()
        .send(
            Method::GET,
            url,
            &format!("/v1/cluster/identity?nonce={nonce}"),
            Bytes::new(),
            timeout,
        )
        .await
        .map_err(|e| e.to_string())?;
    if !a.is_success() {
        return Err(format!("its identity answered {}", a.status));
    }
    let id: Identity =
        serde_json::from_slice(&a.body).map_err(|_| "unreadable identity".to_string())?;
    let bound = keys
        .worker_credential(&id.credential)
        .is_some_and(|c| c.worker == id.worker);
    if !bound || name.is_some_and(|n| n != id.worker) {
        return Err("it has no valid worker credential for its id".into());
    }
    if !master.check_identity(&id.credential, &nonce, url, &id.proof) {
        return Err("its identity proof is wrong".into());
    }
    let header = master
        .header_for(&id.credential)
        .ok_or_else(|| "unusable credential".to_string())?;
    Ok(Verified {
        forwarder: ctl.forwarder().fresh_with(Some(header)),
        worker: id.worker,
        credential: Some(id.credential),
    })
}

/// A polled worker that proved who it is: the forwarder with its token, and the credential
/// it proved, which must stay valid for the controller to keep calling it.
#[derive(Clone)]
struct Verified {
    forwarder: crate::forward::Forwarder,
    worker: String,
    credential: Option<String>,
}

impl Verified {
    /// False once its credential was revoked (here or at another controller of the cluster).
    fn still_valid(&self, ctl: &Controller) -> bool {
        match (&self.credential, ctl.auth().keys()) {
            (Some(id), Some(keys)) => keys.worker_credential(id).is_some(),
            (None, _) => true,
            (Some(_), None) => false,
        }
    }
}

/// Polls a worker's status every `status_interval_ms` as its report: a static worker from the
/// config, or one found in the cluster's membership (`published`: its name and the incarnation
/// it published there). Without an incarnation (a static worker), a lower uptime than last time
/// means it restarted. With authentication on, the worker first proves who it is
/// ([`verify_worker`]), and only then is called with its own controller token.
pub(crate) async fn poll_worker(
    c: Weak<Controller>,
    url: String,
    published: Option<(String, String)>,
) {
    let url = url.trim_end_matches('/').to_string();
    let mut incarnation = 0u64;
    let mut last_uptime = 0u64;
    let mut verified: Option<Verified> = None;
    loop {
        let Some(ctl) = c.upgrade() else { return };
        let interval = Duration::from_millis(ctl.config().status_interval_ms);
        let timeout = interval.max(Duration::from_secs(1));
        if let Some(v) = verified.as_ref().filter(|v| !v.still_valid(&ctl)) {
            ctl.evict(&v.worker, "its worker credential was revoked");
            verified = None;
        }
        if verified.is_none() {
            if ctl.auth().enabled() {
                let name = published.as_ref().map(|(n, _)| n.as_str());
                match verify_worker(&ctl, &url, name, timeout).await {
                    Ok(v) => verified = Some(v),
                    Err(why) => {
                        tracing::debug!(%url, %why, "a polled worker did not prove who it is");
                    }
                }
            } else {
                verified = Some(Verified {
                    forwarder: ctl.forwarder().clone(),
                    worker: String::new(),
                    credential: None,
                });
            }
        }
        let Some(fwd) = verified.as_ref().map(|v| v.forwarder.clone()) else {
            drop(ctl);
            tokio::time::sleep(interval).await;
            continue;
        };
        let header = fwd.credential().cloned();
        let sent = fwd
            .send(Method::GET, &url, "/v1/status", Bytes::new(), timeout)
            .await;
        match sent {
            Ok(a) if a.is_success() => match serde_json::from_slice::<WorkerStatus>(&a.body) {
                Ok(status) => {
                    let uptime = status.uptime_s;
                    if uptime < last_uptime {
                        incarnation += 1; // it restarted
                    }
                    last_uptime = uptime;
                    let inc = published
                        .as_ref()
                        .map(|(_, i)| i.clone())
                        .unwrap_or_else(|| format!("static-{incarnation}"));
                    let report = StatusReport::from_status(
                        &status,
                        &url,
                        &inc,
                        hearth_service::serving::host_cpus(),
                    );
                    if let Err(e) = ctl.on_report_from(report, true, header) {
                        tracing::warn!(%url, error = %e, "unusable status from a static worker");
                    }
                }
                Err(e) => {
                    tracing::warn!(%url, error = %e, "unreadable status from a static worker");
                }
            },
            Ok(a) => {
                tracing::debug!(%url, status = %a.status, "static worker answered an error");
                verified = None;
            }
            Err(e) => {
                tracing::debug!(%url, error = %e, "static worker unreachable");
                verified = None;
            }
        }
        drop(ctl);
        tokio::time::sleep(interval).await;
    }
}

//! The worker's HTTP edge (DESIGN.md §4): routes, request reading, and the one place where the
//! facade's domain errors become status codes and error bodies.

use crate::backend::SandboxError;
use crate::errors::{
    InvokeError, PrewarmError, ProactiveBatchError, RegisterError, UnregisterError,
};
use crate::facade::{started, CallDeadline, Worker, PROACTIVE_CREATE_WAIT};
use crate::gpu::GpuRefusal;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use hearth_api::namespace::namespace_of;
use hearth_api::ErrorCode;
use hearth_api::{
    AsyncRecord, PrewarmAnswer, ProactiveRequest, ProactiveStarted, WorkerStatus,
    MAX_PROACTIVE_BODY_BYTES, PROACTIVE_STREAM_TYPE,
};
use hearth_core::gpu::GpuReject;
use hearth_service::async_api::{self, ListQuery};
use hearth_service::auth::{Access, Action, Principal};
use hearth_service::error::ApiError;
use hearth_service::http::{
    invoke_request, json_bytes, metrics_for, present, prewarm_count, registration_request,
    InvokeQuery,
};
use hearth_service::registry::{FunctionState, Registered};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// The router of one worker.
pub fn router(worker: Arc<Worker>) -> Router {
    let max_body = worker.config().max_body_bytes;
    let max_code = worker.config().max_code_bytes;
    let routes = Router::new()
        .route(
            "/v1/functions/{name}",
            put(register)
                .layer(DefaultBodyLimit::max(max_code))
                .get(show)
                .delete(remove),
        )
        .route("/v1/functions", get(list))
        .route("/v1/runtimes", get(runtimes))
        .route(
            "/v1/functions/{name}/invoke",
            post(invoke).layer(DefaultBodyLimit::max(max_body)),
        )
        .route("/v1/functions/{name}/prewarm", post(prewarm))
        .route("/v1/invocations", get(dead_letters))
        .route("/v1/invocations/{id}", get(invocation))
        .route(
            "/v1/cluster/proactive",
            post(proactive).layer(DefaultBodyLimit::max(MAX_PROACTIVE_BODY_BYTES)),
        )
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics));
    let auth = std::sync::Arc::clone(worker.auth());
    // The identity proof is asked for before the controller sends any credential: it needs
    // none, and shows only the worker's id and its credential's public id.
    let open = Router::new()
        .route("/v1/cluster/identity", get(identity))
        .with_state(Arc::clone(&worker));
    hearth_service::keys_api::protect(routes.with_state(worker), auth).merge(open)
}

#[derive(serde::Deserialize)]
struct IdentityQuery {
    nonce: String,
}

/// `GET /v1/cluster/identity?nonce=N` (no credential): proves to a controller that polls this
/// worker that it holds its credential (an HMAC with its controller token of the challenge
/// and of the URL it is reached at), so that the controller sends its token for this worker
/// only to this worker. 404 when the worker has no credential.
async fn identity(
    State(w): State<Arc<Worker>>,
    query: Result<Query<IdentityQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Some(secret) = w.auth().worker_secret() else {
        return Err(ApiError::not_found("worker credential", "identity"));
    };
    let nonce = query
        .ok()
        .map(|Query(q)| q.nonce)
        .filter(|n| (16..=64).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| ApiError::bad_request("nonce must be 16 to 64 hex digits"))?;
    let c = w.config();
    let url = c.advertise_url.clone().unwrap_or_else(|| {
        let scheme = if c.tls_cert.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", c.listen)
    });
    Ok(Json(json!({
        "worker": w.id(),
        "credential": secret.credential(),
        "proof": secret.prove(&nonce, &url),
    })))
}

/// 403 unless `p` may write functions here: a worker that belongs to a controller takes its
/// functions from that controller only, so that its own `admin.key` (or any other key) cannot
/// put another tenant's code under a name the controller routes to it (issue 31, item 3).
fn require_function_writer(w: &Worker, p: &Principal) -> Result<(), ApiError> {
    let managed = w.config().controller.is_some() || w.config().store.is_some();
    if managed && !p.is_cluster() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            "this worker's functions are managed by its controller: register, delete and prewarm them there",
        ));
    }
    Ok(())
}

/// `PUT /v1/functions/{name}` query: `wait=true` answers once the build is over.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterQuery {
    #[serde(default)]
    wait: bool,
}

/// `PUT /v1/functions/{name}` body: the spec's fields plus `code`. Answers at once, with
/// `"state": "building"` while its dependencies are built (or, with `?wait=true`, when the
/// state is final).
async fn register(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    headers: HeaderMap,
    query: Result<Query<RegisterQuery>, QueryRejection>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let key = p.authorized_key(&name, Access::Manage)?;
    require_function_writer(&w, &p)?;
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let cluster_version = async_api::function_version(&headers, &p)?;
    let (spec, code) = registration_request(&name, &key, body, w.config().max_code_bytes)?;
    let (mut reg, created) = w
        .register_versioned(spec, code, cluster_version)
        .await
        .map_err(register_error)?;
    if q.wait && reg.state == FunctionState::Building {
        if let Some(now) = w.wait_built(&reg.spec.name, reg.spec.version).await {
            reg = now;
        }
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(present_function(&reg))).into_response())
}

/// A function as the API shows it: its spec, its build `state`, and when that failed the
/// tail of its `build_log`.
fn present_function(r: &Registered) -> Value {
    let mut v = present(&r.spec);
    v["state"] = json!(r.state.as_str());
    if let (FunctionState::Failed, Some(log)) = (r.state, &r.build_log) {
        v["build_log"] = json!(log);
    }
    v
}

/// `GET /v1/runtimes`: the runtime images functions may name (any key that may manage
/// functions may read it).
async fn runtimes(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    if p.require(Action::Operate).is_err() {
        p.require(Action::Manage(p.namespace()))?;
    }
    let all: Vec<Value> = w
        .runtimes()
        .into_iter()
        .map(|r| json!({"name": r.name, "digest": r.digest, "bytes": r.bytes, "source": r.source}))
        .collect();
    Ok(Json(json!({ "runtimes": all })))
}

async fn list(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    let all = p.require(Action::Operate).is_ok();
    if !all {
        p.require(Action::Manage(p.namespace()))?;
    }
    let stats = w.stats().pool;
    let fns: Vec<Value> = w
        .registry()
        .list()
        .into_iter()
        .filter(|r| all || namespace_of(&r.spec.name) == p.namespace())
        .map(|r| {
            let mut v = present_function(&r);
            if let Some(s) = stats.function(&r.spec.name) {
                v["pool"] = json!(s);
            }
            v
        })
        .collect();
    Ok(Json(json!({ "functions": fns })))
}

async fn show(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let name = p.authorized_key(&name, Access::Manage)?;
    let r = w
        .registry()
        .get(&name)
        .ok_or_else(|| ApiError::unknown_function(&name))?;
    let stats = w.stats().pool;
    let mut v = present_function(&r);
    let pool = stats
        .function(&name)
        .map(|s| json!(s))
        .unwrap_or_else(|| json!({"warm": 0, "running": 0, "starting": 0}));
    v["pool"] = pool;
    v["characteristics"] = w
        .characteristics(&name)
        .map(|c| json!(c))
        .unwrap_or_else(|| {
            json!({"invocations": 0, "warm_ms": 0.0, "cold_ms": 0.0, "init_ms": 0.0,
               "warm_samples": 0, "cold_samples": 0, "iat_ewma_ms": 0.0,
               "last_arrival_ago_ms": null, "memory_mb": r.spec.memory_mb})
        });
    Ok(Json(v))
}

async fn remove(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = p.authorized_key(&name, Access::Manage)?;
    require_function_writer(&w, &p)?;
    w.unregister(&name).map_err(|e| match e {
        UnregisterError::UnknownFunction(name) => ApiError::unknown_function(&name),
        UnregisterError::Storage(m) => ApiError::internal(m),
    })?;
    Ok(StatusCode::NO_CONTENT)
}

async fn invoke(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    headers: async_api::InvokeHeaders,
    query: Result<Query<InvokeQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let result = async {
        let name = p.authorized_key(&name, Access::Invoke)?;
        let (q, args) = invoke_request(query, body, w.config().max_body_bytes)?;
        let idempotency_key = headers.idempotency_key()?;
        let id = headers.invocation_id(&p)?;
        let call = CallDeadline {
            deadline_ms: headers.deadline_ms()?,
            elapsed_us: headers.elapsed_us(&p)?,
            drop_late: headers.drop_late()?.unwrap_or(false),
        };
        let slot = w.admit_call(&name).map_err(|e| e.api_error())?;
        if let Some(id) = id {
            // A controller's invocation: a repeat of the id runs once.
            let kept = w.invoke_once(name, &id, args, call).await;
            drop(slot);
            return Ok(async_api::kept_response(kept.0, kept.1.clone()));
        }
        if q.is_async || idempotency_key.is_some() {
            // A synchronous call with a key runs as a durable invocation without retries and
            // answers with its result, so that a repeat gets the same one.
            let retries = (!q.is_async).then_some(0);
            let timeout = w
                .registry()
                .get(&name)
                .map(|r| std::time::Duration::from_millis(r.spec.timeout_ms + 5_000));
            let a = w
                .invoke_async(name, args, p.owner(), idempotency_key, retries, slot)
                .await
                .map_err(api_error)?;
            return Ok(async_api::respond(w.delivery(), &a, q.is_async, timeout).await);
        }
        let answer = w.invoke(&name, &args, t0, call).await.map_err(api_error)?;
        drop(slot);
        Ok(json_bytes(StatusCode::OK, answer.to_vec()))
    }
    .await;
    result.unwrap_or_else(|e: ApiError| e.into_response())
}

/// The one place a failed invocation becomes an HTTP status and an error body.
pub fn api_error(e: InvokeError) -> ApiError {
    let message = e.to_string();
    match e {
        InvokeError::ShuttingDown => ApiError::shutting_down(),
        InvokeError::UnknownFunction(name) => ApiError::unknown_function(&name),
        InvokeError::Building(name) => {
            let mut e = ApiError::new(StatusCode::CONFLICT, ErrorCode::FunctionBuilding, message)
                .with("function", json!(name))
                .with("state", json!("building"));
            e.retry_after_s = Some(1);
            e
        }
        InvokeError::BuildFailed(name) => ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::FunctionBuildFailed,
            message,
        )
        .with("function", json!(name))
        .with("state", json!("failed")),
        InvokeError::QueueFull { .. } => {
            let mut e = ApiError::new(StatusCode::TOO_MANY_REQUESTS, ErrorCode::QueueFull, message);
            e.retry_after_s = Some(1);
            e
        }
        InvokeError::NoMemory { .. } | InvokeError::AsyncStoreFull => ApiError::overloaded(message),
        InvokeError::AsyncNamespaceFull(e) => async_api::store_error(e),
        InvokeError::AsyncStore(_) => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Internal,
                message,
            );
            e.retry_after_s = Some(1);
            e
        }
        InvokeError::TooLarge { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::InsufficientMemory,
            message,
        ),
        InvokeError::Start { function, error } => start_error(&function, error),
        InvokeError::Timeout { .. } => {
            ApiError::new(StatusCode::GATEWAY_TIMEOUT, ErrorCode::Timeout, message)
        }
        InvokeError::DeadlinePassed {
            deadline_ms,
            late_by_us,
            ..
        } => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::DeadlinePassed,
            message,
        )
        .with("deadline_ms", json!(deadline_ms))
        .with("late_by_us", json!(late_by_us)),
        InvokeError::Sandbox(error) => {
            let code = match error {
                SandboxError::OutOfMemory { .. } => ErrorCode::OutOfMemory,
                SandboxError::ResultTooLarge { .. } => ErrorCode::ResultTooLarge,
                _ => ErrorCode::SandboxCrashed,
            };
            ApiError::new(StatusCode::BAD_GATEWAY, code, message)
        }
        InvokeError::Handler(f) => {
            let (status, code) = match f.agent_status {
                // No 400 arm: the arguments were checked to be JSON before they were sent, and
                // the sandbox's word (a handler can forge the agent's answer) never makes the
                // caller's request the one at fault. An agent's 400 is a bad gateway.
                // The agent refused a result over max_result_bytes (the sandbox is kept).
                413 => (StatusCode::BAD_GATEWAY, ErrorCode::ResultTooLarge),
                _ => (StatusCode::BAD_GATEWAY, ErrorCode::HandlerError),
            };
            ApiError::new(status, code, message)
                .with("type", json!(f.kind))
                .with("traceback", json!(f.traceback))
                .with("cold", json!(f.cold))
                .with("worker", json!(f.worker))
                .with("timing", json!(f.timing))
        }
        InvokeError::Gpu(e) => gpu_error(e),
        InvokeError::Internal(m) => ApiError::internal(m),
    }
}

/// A `gpu` function this worker cannot run: 400 `no_gpu`, naming the field at fault and, for
/// too little memory, the most this worker's GPUs have (`max`).
fn gpu_error(e: GpuRefusal) -> ApiError {
    let message = e.to_string();
    let err = ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::NoGpu, message.clone());
    match e {
        GpuRefusal::NoGpu { .. } => err.with("field", json!("device")),
        GpuRefusal::TooLittleMemory { largest_mb, .. }
        | GpuRefusal::Scheduler {
            reason: GpuReject::TooLarge { largest_mb, .. },
            ..
        } => err
            .with("field", json!("gpu_memory_mb"))
            .with("max", json!(largest_mb)),
        // A passing condition of the worker (its GPU scheduler tracks a bounded number of
        // functions with work at once), not of the request: retry later or elsewhere.
        GpuRefusal::Scheduler {
            reason: GpuReject::TooManyFunctions,
            ..
        } => ApiError::overloaded(message),
        GpuRefusal::Scheduler { .. } => ApiError::bad_request(message),
    }
}

fn start_error(name: &str, e: SandboxError) -> ApiError {
    match e {
        SandboxError::InitFailed {
            kind,
            message,
            traceback,
        } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::InitError,
            format!("{name} failed to initialize: {kind}: {message}"),
        )
        .with("type", json!(kind))
        .with("traceback", json!(traceback)),
        SandboxError::OutOfMemory { .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::OutOfMemory,
            e.to_string(),
        ),
        other => ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::SandboxStartFailed,
            other.to_string(),
        ),
    }
}

fn register_error(e: RegisterError) -> ApiError {
    match e {
        RegisterError::TooMuchMemory { .. } | RegisterError::UnknownRuntime { .. } => {
            ApiError::bad_request(e.to_string())
        }
        RegisterError::Gpu(e) => gpu_error(e),
        RegisterError::Code(e) => e.into(),
    }
}

fn prewarm_error(e: PrewarmError) -> ApiError {
    match e {
        PrewarmError::ShuttingDown => ApiError::shutting_down(),
        PrewarmError::BadCount => ApiError::bad_request(e.to_string()),
        PrewarmError::UnknownFunction(name) => ApiError::unknown_function(&name),
        PrewarmError::NoMemory { .. } => ApiError::overloaded(e.to_string()),
        PrewarmError::StartFailed(m) => {
            ApiError::new(StatusCode::BAD_GATEWAY, ErrorCode::SandboxStartFailed, m)
        }
        PrewarmError::Gpu(e) => gpu_error(e),
        PrewarmError::OnGpu(_) => ApiError::bad_request(e.to_string()),
        PrewarmError::NotReady(e) => api_error(e),
    }
}

async fn prewarm(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<PrewarmAnswer>, ApiError> {
    let name = p.authorized_key(&name, Access::Manage)?;
    require_function_writer(&w, &p)?;
    w.prewarm(&name, prewarm_count(&body)?)
        .await
        .map(Json)
        .map_err(prewarm_error)
}

/// `POST /v1/cluster/proactive`: a controller's commands on this worker's proactive sandboxes.
/// The platform's own call, so only this worker's controller (its controller token) may send
/// it; any function of any namespace may be named. With `Accept:
/// application/x-ndjson` the answer streams: the results as soon as the commands are applied,
/// then a line per create as it ends (`hearth_api::PROACTIVE_STREAM_TYPE`).
async fn proactive(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    p.require(Action::Command)?;
    let body = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(MAX_PROACTIVE_BODY_BYTES)
        } else {
            ApiError::bad_request(format!("could not read the request body: {r}"))
        }
    })?;
    let req: ProactiveRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid proactive request: {e}")))?;
    let stream = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(PROACTIVE_STREAM_TYPE));
    if !stream {
        let answer = w.proactive(&req.commands).await.map_err(batch_error)?;
        return Ok(Json(answer).into_response());
    }
    let batch = w.proactive_begin(&req.commands).map_err(batch_error)?;
    let mut first = serde_json::to_vec(&batch.answer)
        .map_err(|e| ApiError::internal(format!("could not write the answer: {e}")))?;
    first.push(b'\n');
    // One line per create as it ends, in the order they end; the channel closes (and the
    // answer ends) once every create has a line or the wait ran out.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(
        batch.creating.len() + 1,
    );
    let _ = tx.try_send(Ok(Bytes::from(first)));
    let deadline = tokio::time::Instant::now() + PROACTIVE_CREATE_WAIT;
    for (index, task) in batch.creating {
        let tx = tx.clone();
        let name = req.commands[index].function.clone();
        tokio::spawn(async move {
            let Ok(done) = tokio::time::timeout_at(deadline, task).await else {
                return;
            };
            let line = ProactiveStarted {
                index,
                result: started(&name, done),
            };
            if let Ok(mut bytes) = serde_json::to_vec(&line) {
                bytes.push(b'\n');
                let _ = tx.send(Ok(Bytes::from(bytes))).await;
            }
        });
    }
    drop(tx);
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(([(CONTENT_TYPE, PROACTIVE_STREAM_TYPE)], body).into_response())
}

/// A batch refused whole.
fn batch_error(e: ProactiveBatchError) -> ApiError {
    match e {
        ProactiveBatchError::Disabled => {
            ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, e.to_string())
        }
        ProactiveBatchError::ShuttingDown => ApiError::shutting_down(),
        ProactiveBatchError::TooManyCommands { .. }
        | ProactiveBatchError::BadFunctionName { .. } => ApiError::bad_request(e.to_string()),
    }
}

async fn invocation(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<AsyncRecord>, ApiError> {
    async_api::invocation_record(w.delivery(), &id, &p).await
}

async fn dead_letters(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    async_api::dead_letters(w.delivery(), &p, query).await
}

async fn status(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<WorkerStatus>, ApiError> {
    p.require(Action::Operate)?;
    Ok(Json(w.status()))
}

async fn metrics(
    State(w): State<Arc<Worker>>,
    Extension(p): Extension<Principal>,
) -> Result<Response, ApiError> {
    metrics_for(&p, w.metrics.encode(&w.stats(), w.gpu_gauges().as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduler_refusal(reason: GpuReject) -> ApiError {
        api_error(InvokeError::Gpu(GpuRefusal::Scheduler {
            function: "f".into(),
            reason,
        }))
    }

    #[test]
    fn too_many_gpu_functions_is_overloaded_and_retryable() {
        let e = scheduler_refusal(GpuReject::TooManyFunctions);
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.code, ErrorCode::Overloaded);
        assert_eq!(e.retry_after_s, Some(1));
    }

    #[test]
    fn gpu_refusals_of_the_request_are_400_and_name_the_field() {
        let e = scheduler_refusal(GpuReject::TooLarge {
            needed_mb: 100,
            largest_mb: 80,
        });
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, ErrorCode::NoGpu)
        );
        let details = e.details.expect("details");
        assert_eq!(details.get("field"), Some(&json!("gpu_memory_mb")));
        assert_eq!(details.get("max"), Some(&json!(80)));
        for reason in [GpuReject::BadWeight, GpuReject::BadFunction] {
            let e = scheduler_refusal(reason);
            assert_eq!(
                (e.status, e.code),
                (StatusCode::BAD_REQUEST, ErrorCode::BadRequest)
            );
        }
    }
}

//! The controller's HTTP edge: the workers' public API (DESIGN.md §4), so a client cannot tell a
//! cluster from a single worker, plus the membership endpoints workers push to. Routes, request
//! reading, and the one place where the facade's domain errors become status codes and error
//! bodies; a worker's own answers pass through unchanged.

use crate::errors::{InvokeError, PrewarmError, RegisterError, ReportError, UnregisterError};
use crate::facade::{CallDeadline, Controller};
use crate::forward::Answer;
use crate::status::ControllerStatus;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use hearth_api::namespace::namespace_of;
use hearth_api::ErrorCode;
use hearth_api::{PrewarmAnswer, StatusReport};
use hearth_service::async_api::{self, ListQuery};
use hearth_service::auth::{Access, Action, Principal, WorkerSecret};
use hearth_service::error::ApiError;
use hearth_service::http::{
    invoke_request, json_bytes, json_error, metrics_for, present, prewarm_count, registered,
    registration_request, InvokeQuery,
};
use hearth_service::keys_api;
use hearth_service::registry::RegistryError;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// The controller's router.
pub fn router(c: Arc<Controller>) -> Router {
    let max_body = c.config().max_body_bytes;
    let max_code = c.config().max_code_bytes;
    let routes = Router::new()
        .route(
            "/v1/functions/{name}",
            put(register)
                .layer(DefaultBodyLimit::max(max_code))
                .get(show)
                .delete(remove),
        )
        .route("/v1/functions", get(list))
        .route(
            "/v1/functions/{name}/invoke",
            post(invoke).layer(DefaultBodyLimit::max(max_body)),
        )
        .route("/v1/functions/{name}/prewarm", post(prewarm))
        .route("/v1/invocations", get(dead_letters))
        .route("/v1/invocations/{id}", get(invocation))
        .route("/v1/status", get(status))
        .route("/v1/cluster/workers", get(workers))
        .route("/v1/cluster/workers/{id}", put(report).delete(leave))
        .route(
            "/v1/cluster/credentials",
            get(credentials)
                .post(create_credential)
                .layer(DefaultBodyLimit::max(MAX_CREDENTIAL_REQUEST_BYTES)),
        )
        .route(
            "/v1/cluster/credentials/{id}",
            axum::routing::delete(revoke_credential),
        )
        .route("/metrics", get(metrics));
    let auth = Arc::clone(c.auth());
    hearth_service::keys_api::protect(routes.with_state(c), auth)
}

async fn register(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let key = p.authorized_key(&name, Access::Manage)?;
    let (spec, code) = registration_request(&name, &key, body, c.config().max_code_bytes)?;
    let (reg, created) = c.register(spec, code).await.map_err(register_error)?;
    Ok(registered(&reg.spec, created))
}

async fn list(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    let all = p.require(Action::Operate).is_ok();
    if !all {
        p.require(Action::Manage(p.namespace()))?;
    }
    let fns: Vec<Value> = c
        .registry()
        .list()
        .into_iter()
        .filter(|r| all || namespace_of(&r.spec.name) == p.namespace())
        .map(|r| {
            let mut v = present(&r.spec);
            v["pool"] = json!(c.sandboxes(&r.spec.name).pool);
            v
        })
        .collect();
    Ok(Json(json!({ "functions": fns })))
}

async fn show(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let name = p.authorized_key(&name, Access::Manage)?;
    let r = c
        .registry()
        .get(&name)
        .ok_or_else(|| ApiError::unknown_function(&name))?;
    let mut v = present(&r.spec);
    let s = c.sandboxes(&name);
    v["pool"] = json!(s.pool);
    v["workers"] = json!(s.workers);
    v["balancing"] = json!(c.balancing(&name));
    Ok(Json(v))
}

async fn remove(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = p.authorized_key(&name, Access::Manage)?;
    c.unregister(&name).await.map_err(|e| match e {
        UnregisterError::UnknownFunction(name) => ApiError::unknown_function(&name),
        UnregisterError::Registry(e) => registry_error(e),
        UnregisterError::Store(e) => async_api::store_error(e),
    })?;
    Ok(StatusCode::NO_CONTENT)
}

async fn invoke(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    headers: async_api::InvokeHeaders,
    query: Result<Query<InvokeQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let result = async {
        let name = p.authorized_key(&name, Access::Invoke)?;
        let (q, args) = invoke_request(query, body, c.config().max_body_bytes)?;
        let idempotency_key = headers.idempotency_key()?;
        let deadline = CallDeadline {
            deadline_ms: headers.deadline_ms()?,
            drop_late: headers.drop_late()?,
        };
        let slot = c
            .admit_namespace(namespace_of(&name))
            .map_err(|e| e.api_error())?;
        if q.is_async || idempotency_key.is_some() {
            // A synchronous call with a key runs as a durable invocation without retries and
            // answers with its result, so that a repeat gets the same one.
            let retries = (!q.is_async).then_some(0);
            let timeout = c.registry().get(&name).map(|r| {
                std::time::Duration::from_millis(
                    r.spec.timeout_ms + c.config().forward_grace_ms + 1_000,
                )
            });
            let a = c
                .invoke_async(&name, args, p.owner(), idempotency_key, retries, slot)
                .await
                .map_err(invoke_error)?;
            return Ok(async_api::respond(c.delivery(), &a, q.is_async, timeout).await);
        }
        let _slot = slot;
        match c.invoke(&name, args, t0, deadline).await {
            Ok(answer) => Ok(json_bytes(StatusCode::OK, answer.to_vec())),
            Err(InvokeError::WorkerAnswer(a)) => Ok(pass_through(a)),
            Err(e) => Err(invoke_error(e)),
        }
    }
    .await;
    result.unwrap_or_else(|e: ApiError| e.into_response())
}

/// The one place a failed invocation becomes an HTTP status and an error body. A worker's own
/// answer is not an error of ours: the invoke handler passes it on.
pub fn invoke_error(e: InvokeError) -> ApiError {
    let message = e.to_string();
    let unavailable = |code| {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message.clone());
        e.retry_after_s = Some(1);
        e
    };
    match e {
        InvokeError::ShuttingDown => unavailable(ErrorCode::ShuttingDown),
        InvokeError::UnknownFunction(name) => ApiError::unknown_function(&name),
        InvokeError::NoWorkers => unavailable(ErrorCode::NoWorkers),
        InvokeError::Overloaded { .. } | InvokeError::AsyncStoreFull => {
            ApiError::overloaded(message)
        }
        InvokeError::AsyncStore(_) => unavailable(ErrorCode::Internal),
        InvokeError::AsyncNamespaceFull(e) => hearth_service::async_api::store_error(e),
        InvokeError::WorkerUnavailable { .. } => unavailable(ErrorCode::WorkerUnavailable),
        InvokeError::WorkerFailed { worker, .. } => {
            let mut e = ApiError::new(StatusCode::BAD_GATEWAY, ErrorCode::WorkerFailed, message)
                .with("worker", json!(worker));
            e.retry_after_s = Some(1);
            e
        }
        InvokeError::WorkerTimeout { .. } => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::WorkerTimeout,
            message,
        ),
        InvokeError::WorkerRefused { status, .. } => ApiError::new(
            worker_status(status),
            ErrorCode::WorkerRefusedFunction,
            message,
        ),
        InvokeError::WorkerAnswer(a) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::Internal,
            format!("the worker's answer (HTTP {}) was not passed on", a.status),
        ),
        InvokeError::NoGpuWorker { largest_mb, .. } => {
            let e = unavailable(ErrorCode::NoGpu).with("field", json!("device"));
            match largest_mb {
                Some(mb) => e.with("largest_gpu_mb", json!(mb)),
                None => e,
            }
        }
        InvokeError::Internal(m) => ApiError::internal(m),
    }
}

/// A status a worker answered with, kept as it is.
fn worker_status(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY)
}

fn registry_error(e: RegistryError) -> ApiError {
    e.into()
}

fn register_error(e: RegisterError) -> ApiError {
    match e {
        RegisterError::Registry(e) => registry_error(e),
        RegisterError::Packing(m) => ApiError::internal(m),
        RegisterError::TooMuchMemory { largest_mb, .. } => ApiError::bad_request(e.to_string())
            .with("field", json!("memory_mb"))
            .with("min", json!(hearth_api::function::MIN_MEMORY_MB))
            .with("max", json!(largest_mb)),
        RegisterError::TooMuchGpuMemory { largest_mb, .. } => {
            ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::NoGpu, e.to_string())
                .with("field", json!("gpu_memory_mb"))
                .with("min", json!(1))
                .with("max", json!(largest_mb))
        }
        RegisterError::Store(e) => async_api::store_error(e),
    }
}

fn prewarm_error(e: PrewarmError) -> ApiError {
    let message = e.to_string();
    match e {
        PrewarmError::Invoke(e) => invoke_error(e),
        PrewarmError::WorkerRefused { status, .. } => {
            let code = if status == StatusCode::TOO_MANY_REQUESTS.as_u16() {
                ErrorCode::Overloaded
            } else {
                ErrorCode::PrewarmFailed
            };
            ApiError::new(worker_status(status), code, message)
        }
        PrewarmError::UnreadableAnswer { .. } => {
            ApiError::new(StatusCode::BAD_GATEWAY, ErrorCode::Internal, message)
        }
    }
}

/// A worker's answer, passed through.
fn pass_through(a: Answer) -> Response {
    let mut resp = (
        a.status,
        [(header::CONTENT_TYPE, "application/json")],
        a.body,
    )
        .into_response();
    if let Some(v) = a.retry_after {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

async fn prewarm(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<PrewarmAnswer>, ApiError> {
    let name = p.authorized_key(&name, Access::Manage)?;
    let count = prewarm_count(&body)?;
    if count == 0 || count > 1000 {
        return Err(ApiError::bad_request("count must be between 1 and 1000"));
    }
    c.prewarm(&name, count)
        .await
        .map(Json)
        .map_err(prewarm_error)
}

async fn invocation(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<hearth_api::AsyncRecord>, ApiError> {
    async_api::invocation_record(c.delivery(), &id, &p).await
}

async fn dead_letters(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    async_api::dead_letters(c.delivery(), &p, query).await
}

async fn status(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<ControllerStatus>, ApiError> {
    p.require(Action::Operate)?;
    Ok(Json(c.status()))
}

async fn workers(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    p.require(Action::Operate)?;
    Ok(Json(json!({ "workers": c.status().workers })))
}

/// `PUT /v1/cluster/workers/{id}`: a worker's status push (the first one joins it).
async fn report(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Json<StatusReport>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    // A worker reports for its own id only, with its own credential.
    p.require(Action::Report(&id))?;
    let Json(report) = body.map_err(|r| json_error(r, 1 << 20))?;
    if report.worker != id {
        return Err(ApiError::bad_request(
            "the report's worker differs from the URL's",
        ));
    }
    let credential = match &p {
        Principal::Member { credential, .. } => Some(credential.as_str()),
        _ => None,
    };
    c.on_report(report, credential).map_err(|e| match e {
        ReportError::Stale { .. } => {
            ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, e.to_string())
        }
        ReportError::Unusable => ApiError::bad_request(e.to_string()),
    })?;
    Ok(Json(
        json!({"status_timeout_ms": c.config().status_timeout_ms}),
    ))
}

/// `DELETE /v1/cluster/workers/{id}`: a worker leaves (graceful shutdown).
async fn leave(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    p.require(Action::Report(&id))?;
    if c.on_leave(&id) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("live worker", &id))
    }
}

async fn metrics(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
) -> Result<Response, ApiError> {
    metrics_for(&p, c.metrics.encode(&c.loads()))
}

/// Largest `POST /v1/cluster/credentials` body (a worker id and a description).
const MAX_CREDENTIAL_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewCredential {
    /// The one worker id the credential may join as.
    worker: String,
    #[serde(default)]
    description: String,
}

/// `POST /v1/cluster/credentials` (operator only): a worker credential bound to one worker id.
/// The answer holds, once, the worker's token, the controller's token for it and the file to
/// give the worker (`cluster_key_file`); only the worker token's hash is kept.
async fn create_credential(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    body: Result<Json<NewCredential>, JsonRejection>,
) -> Result<Response, ApiError> {
    p.require(Action::Credentials)?;
    let Json(req) = body.map_err(|r| json_error(r, MAX_CREDENTIAL_REQUEST_BYTES))?;
    let auth = c.auth();
    let keys = keys_api::store(auth)?;
    let master = auth
        .cluster_key()
        .ok_or_else(|| ApiError::internal("this controller has no cluster key"))?;
    let (info, token) = keys
        .create_worker(&req.worker, &req.description)
        .map_err(keys_api::auth_error)?;
    // In a cluster the credential is valid once every controller can learn it.
    if let (Some(cluster), Some(record)) = (auth.replica(), keys.record(&info.id)) {
        let doc = serde_json::to_value(&record).unwrap_or_default();
        if let Err(e) = cluster.put_doc(keys_api::KEYS_KIND, &info.id, &doc).await {
            let _ = keys.revoke(&info.id);
            return Err(async_api::store_error(e));
        }
    }
    let controller_token = master.controller_token(&info.id);
    let mut v = info.to_json();
    v["credential"] = json!(token);
    v["controller_token"] = json!(controller_token);
    v["file"] = json!(WorkerSecret::file_text(&token, &controller_token));
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

/// `GET /v1/cluster/credentials` (operator only): every worker credential, without secrets.
async fn credentials(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    p.require(Action::Credentials)?;
    let list: Vec<Value> = keys_api::store(c.auth())?
        .list_workers()
        .iter()
        .map(|w| w.to_json())
        .collect();
    Ok(Json(json!({ "credentials": list })))
}

/// `DELETE /v1/cluster/credentials/{id}` (operator only): revokes a worker credential and takes
/// its worker out of the ring at once; its next push is a 401.
async fn revoke_credential(
    State(c): State<Arc<Controller>>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    p.require(Action::Credentials)?;
    let keys = keys_api::store(c.auth())?;
    let info = keys
        .worker_credential(&id)
        .ok_or_else(|| ApiError::not_found("worker credential", &id))?;
    if let Some(cluster) = c.auth().replica() {
        cluster
            .delete_doc(keys_api::KEYS_KIND, &id)
            .await
            .map_err(async_api::store_error)?;
    }
    keys.revoke(&id).map_err(keys_api::auth_error)?;
    c.evict(&info.worker, "its worker credential was revoked");
    Ok(StatusCode::NO_CONTENT)
}

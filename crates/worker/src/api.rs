//! The public HTTP API (DESIGN.md §4), served by axum. The controller serves the same API, so the
//! request-reading and answer helpers here are public and shared with it.

use crate::error::ApiError;
use crate::invocations::AsyncInvocations;
use crate::registry::CodeSource;
use crate::worker::{Invoked, Worker};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use hearth_core::{ColdReason, FunctionSpec};
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::Write;
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
        .route(
            "/v1/functions/{name}/invoke",
            post(invoke).layer(DefaultBodyLimit::max(max_body)),
        )
        .route("/v1/functions/{name}/prewarm", post(prewarm))
        .route("/v1/invocations/{id}", get(invocation))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics));
    with_common_endpoints(routes).with_state(worker)
}

/// What every Hearth API has besides its own routes (the worker's and the controller's):
/// `/healthz`, and JSON errors for unknown paths (404) and methods (405).
pub fn with_common_endpoints<S>(routes: Router<S>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    routes
        .route("/healthz", get(healthz))
        .fallback(no_such_endpoint)
        .method_not_allowed_fallback(method_not_allowed)
}

/// 404 for paths the API does not have.
async fn no_such_endpoint() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}

/// Prometheus text with its content type (`GET /metrics`).
pub fn metrics_response(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// 405 for methods a path does not take.
async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this endpoint",
    )
}

/// A body that could not be read: 413 over the limit, else 400.
fn body_error(rej: BytesRejection, limit: usize) -> ApiError {
    if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(limit)
    } else {
        ApiError::bad_request(format!("could not read the request body: {rej}"))
    }
}

/// A JSON body that could not be read: 413 over the limit, else 400.
pub fn json_error(rej: JsonRejection, limit: usize) -> ApiError {
    if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(limit)
    } else {
        ApiError::bad_request(rej.body_text())
    }
}

/// `PUT /v1/functions/{name}` body: the spec's fields plus `code`.
async fn register(
    State(w): State<Arc<Worker>>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (spec, code) = registration_request(&name, body, w.config().max_code_bytes)?;
    let (reg, created) = w.register(spec, code)?;
    Ok(registered(&reg.spec, created))
}

/// The answer to a registration: the spec, with 201 when the function is new, else 200.
pub fn registered(spec: &FunctionSpec, created: bool) -> Response {
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, Json(json!(spec))).into_response()
}

/// A registration request for the function `name`, read and validated: 413 for a body over
/// `max_code`, 400 for anything else wrong. The controller reads registrations with the same rules.
pub fn registration_request(
    name: &str,
    body: Result<Json<Value>, JsonRejection>,
    max_code: usize,
) -> Result<(FunctionSpec, Option<CodeSource>), ApiError> {
    let Json(body) = body.map_err(|r| json_error(r, max_code))?;
    parse_registration(name, body)
}

/// A registration body (the spec's fields plus `code`) for the function `name`, validated.
fn parse_registration(
    name: &str,
    mut body: Value,
) -> Result<(FunctionSpec, Option<CodeSource>), ApiError> {
    let obj = body
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    let code = match obj.remove("code") {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::from_value::<CodeSource>(v).map_err(|e| {
            ApiError::bad_request(format!(
                "code must be one of {{\"path\": ...}}, {{\"archive\": base64 tar.gz}}, {{\"files\": {{...}}}}: {e}"
            ))
        })?),
    };
    if let Some(other) = obj.get("name") {
        if other.as_str() != Some(name) {
            return Err(ApiError::bad_request(
                "the body's name differs from the URL's",
            ));
        }
    }
    obj.remove("version");
    obj.insert("name".into(), json!(name));
    let mut spec: FunctionSpec = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("invalid function spec: {e}")))?;
    spec.validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((spec, code))
}

async fn list(State(w): State<Arc<Worker>>) -> Json<Value> {
    let stats = w.stats().pool;
    let fns: Vec<Value> = w
        .registry()
        .list()
        .into_iter()
        .map(|r| {
            let mut v = json!(*r.spec);
            if let Some((_, s)) = stats.functions.iter().find(|(n, _)| *n == r.spec.name) {
                v["pool"] = json!(s);
            }
            v
        })
        .collect();
    Json(json!({ "functions": fns }))
}

async fn show(
    State(w): State<Arc<Worker>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let r = w
        .registry()
        .get(&name)
        .ok_or_else(|| ApiError::unknown_function(&name))?;
    let stats = w.stats().pool;
    let mut v = json!(*r.spec);
    let pool = stats
        .functions
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| json!(s))
        .unwrap_or_else(|| json!({"warm": 0, "running": 0, "starting": 0}));
    v["pool"] = pool;
    v["characteristics"] = w.characteristics(&name).unwrap_or_else(|| {
        json!({"invocations": 0, "warm_ms": 0.0, "cold_ms": 0.0, "init_ms": 0.0,
               "warm_samples": 0, "cold_samples": 0, "iat_ewma_ms": 0.0,
               "last_arrival_ago_ms": null, "memory_mb": r.spec.memory_mb})
    });
    Ok(Json(v))
}

async fn remove(
    State(w): State<Arc<Worker>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    w.unregister(&name)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `?async=true` on an invocation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeQuery {
    #[serde(default, rename = "async")]
    pub is_async: bool,
}

/// The query and arguments of an invocation request: 400 for a bad query or arguments that are
/// not JSON, 413 for a body over `max_body`.
pub fn invoke_request(
    query: Result<Query<InvokeQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
    max_body: usize,
) -> Result<(InvokeQuery, Bytes), ApiError> {
    let Query(q) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let body = body.map_err(|r| body_error(r, max_body))?;
    Ok((q, arguments(&body)?))
}

/// Checks the arguments are JSON; an empty body means `{}`.
fn arguments(body: &Bytes) -> Result<Bytes, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Bytes::from_static(b"{}"));
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    Ok(body.clone())
}

async fn invoke(
    State(w): State<Arc<Worker>>,
    Path(name): Path<String>,
    query: Result<Query<InvokeQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let t0 = Instant::now();
    let result = async {
        let (q, args) = invoke_request(query, body, w.config().max_body_bytes)?;
        if q.is_async {
            return invoke_async(&w, name, args);
        }
        let ok = w.invoke(&name, &args, t0).await?;
        Ok(success_response(&w, &ok))
    }
    .await;
    result.unwrap_or_else(|e| e.into_response())
}

fn invoke_async(w: &Arc<Worker>, name: String, args: Bytes) -> Result<Response, ApiError> {
    if w.registry().get(&name).is_none() {
        return Err(ApiError::unknown_function(&name));
    }
    let id = w.invocations.start(&name).ok_or_else(|| {
        ApiError::overloaded("too many async invocations are pending or kept; retry later")
    })?;
    let worker = Arc::clone(w);
    let task_id = id.clone();
    tokio::spawn(async move {
        let t0 = Instant::now();
        let (status, body) = match worker.invoke(&name, &args, t0).await {
            Ok(ok) => (200, Bytes::from(success_body(&worker, &ok))),
            Err(e) => (
                e.status.as_u16(),
                Bytes::from(e.body().to_string().into_bytes()),
            ),
        };
        worker.invocations.finish(&task_id, status, body);
    });
    Ok(accepted(&id))
}

/// 202 for an accepted async invocation, with where its result will be.
pub fn accepted(id: &str) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "status": "running", "url": format!("/v1/invocations/{id}")})),
    )
        .into_response()
}

/// `{"result": ..., "cold": ..., "worker": ..., "timing": {...}}`, written directly: the result is
/// already JSON text from the agent and is not parsed again.
fn success_body(w: &Worker, ok: &Invoked) -> Vec<u8> {
    let mut b = Vec::with_capacity(ok.result.len() + 192);
    b.extend_from_slice(b"{\"result\":");
    b.extend_from_slice(&ok.result);
    let _ = write!(b, ",\"cold\":{}", ok.cold.is_some());
    if let Some(reason) = ok.cold {
        let _ = write!(b, ",\"cold_reason\":\"{}\"", reason.as_str());
        if let ColdReason::Expired { ago_us } | ColdReason::Evicted { ago_us } = reason {
            let _ = write!(
                b,
                ",\"cold_reason_policy\":\"{}\",\"cold_reason_ago_us\":{ago_us}",
                w.config().keepalive.name()
            );
        }
    }
    b.extend_from_slice(b",\"worker\":");
    let _ = serde_json::to_writer(&mut b, w.id());
    let t = &ok.timing;
    let _ = write!(
        b,
        ",\"timing\":{{\"queue\":{},\"init\":{},\"exec\":{},\"overhead\":{},\"e2e\":{}}}}}",
        t.queue, t.init, t.exec, t.overhead, t.e2e
    );
    b
}

fn success_response(w: &Worker, ok: &Invoked) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        success_body(w, ok),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrewarmBody {
    #[serde(default = "one")]
    count: u32,
}

fn one() -> u32 {
    1
}

/// The `count` of a prewarm request; an empty body means 1.
pub fn prewarm_count(body: &Bytes) -> Result<u32, ApiError> {
    let req: PrewarmBody = if body.iter().all(u8::is_ascii_whitespace) {
        PrewarmBody { count: 1 }
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid prewarm request: {e}")))?
    };
    Ok(req.count)
}

async fn prewarm(
    State(w): State<Arc<Worker>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    w.prewarm(&name, prewarm_count(&body)?).await.map(Json)
}

async fn invocation(
    State(w): State<Arc<Worker>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    invocation_record(&w.invocations, &id)
}

/// `GET /v1/invocations/{id}`: an async invocation's record, 404 if unknown or expired.
pub fn invocation_record(
    invocations: &AsyncInvocations,
    id: &str,
) -> Result<Json<Value>, ApiError> {
    invocations
        .get(id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found("invocation", id))
}

async fn status(State(w): State<Arc<Worker>>) -> Json<Value> {
    Json(w.status())
}

/// `GET /healthz`.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn metrics(State(w): State<Arc<Worker>>) -> Response {
    metrics_response(w.metrics.encode(&w.stats()))
}

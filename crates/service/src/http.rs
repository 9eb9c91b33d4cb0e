//! The HTTP edge both services share: reading requests (bodies, queries, registrations) with
//! the same limits and errors, the endpoints every Hearth API has, and answer helpers.

use crate::auth::Principal;
use crate::error::ApiError;
use crate::registry::CodeSource;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::Query;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hearth_api::ErrorCode;
use hearth_api::FunctionSpec;
use serde::Deserialize;
use serde_json::{json, Value};

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
    ApiError::new(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such endpoint",
    )
}

/// `GET /metrics` for `p`: every function's metrics for the operator and a `*` metrics key,
/// only its own namespace's functions for a namespace's admin or metrics key, 403 for anyone
/// else.
pub fn metrics_for(p: &Principal, text: String) -> Result<Response, ApiError> {
    use crate::auth::Action;
    if p.require(Action::Metrics("*")).is_ok() {
        return Ok(metrics_response(text));
    }
    p.require(Action::Metrics(p.namespace()))?;
    Ok(metrics_response(crate::metrics::scope_to_namespace(
        &text,
        p.namespace(),
    )))
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
        ErrorCode::MethodNotAllowed,
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

/// The answer to a registration: the spec, with 201 when the function is new, else 200.
pub fn registered(spec: &FunctionSpec, created: bool) -> Response {
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, Json(present(spec))).into_response()
}

/// A registration request for the function `name` (as the URL has it), stored under `key` (its
/// namespace's key, [`hearth_api::namespace`]), read and validated: 413 for a body over
/// `max_code`, 400 for anything else wrong. The controller reads registrations with the same rules.
pub fn registration_request(
    name: &str,
    key: &str,
    body: Result<Json<Value>, JsonRejection>,
    max_code: usize,
) -> Result<(FunctionSpec, Option<CodeSource>), ApiError> {
    let Json(body) = body.map_err(|r| json_error(r, max_code))?;
    parse_registration(name, key, body)
}

/// A registration body (the spec's fields plus `code`) for the function `name`, validated.
fn parse_registration(
    name: &str,
    key: &str,
    mut body: Value,
) -> Result<(FunctionSpec, Option<CodeSource>), ApiError> {
    let obj = body
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    let code = match obj.remove("code") {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::from_value::<CodeSource>(v).map_err(|e| {
            ApiError::bad_request(format!(
                "code must be one of {{\"archive\": base64 tar.gz}}, {{\"files\": {{...}}}} or, where the server allows it, {{\"path\": ...}}: {e}"
            ))
        })?),
    };
    if let Some(other) = obj.remove("name") {
        if other.as_str() != Some(name) && other.as_str() != Some(key) {
            return Err(ApiError::bad_request(
                "the body's name differs from the URL's",
            ));
        }
    }
    obj.remove("version");
    obj.remove("namespace");
    obj.insert("name".into(), json!(key));
    let mut spec: FunctionSpec = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("invalid function spec: {e}")))?;
    spec.validate().map_err(spec_error)?;
    Ok((spec, code))
}

/// A spec as its owner sees it: its name inside its namespace, and the namespace.
pub fn present(spec: &FunctionSpec) -> Value {
    let (ns, name) = hearth_api::namespace::split_key(&spec.name);
    let mut v = json!(spec);
    v["name"] = json!(name);
    v["namespace"] = json!(ns);
    v
}

/// A refused spec: 400, with `field`, `min` and `max` in the error for a number out of range.
fn spec_error(e: hearth_api::SpecError) -> ApiError {
    let err = ApiError::bad_request(e.to_string());
    match e.range() {
        Some((field, min, max)) => out_of_range(err, field, min, max),
        None => err,
    }
}

/// Adds a range's field and bounds to an error (integers as integers).
fn out_of_range(err: ApiError, field: &str, min: f64, max: f64) -> ApiError {
    let num = |v: f64| {
        if v.fract() == 0.0 && v.abs() < 9.0e15 {
            json!(v as i64)
        } else {
            json!(v)
        }
    };
    err.with("field", json!(field))
        .with("min", num(min))
        .with("max", num(max))
}

/// Most sandboxes one prewarm request may ask for, on a worker and through a controller.
pub const MAX_PREWARM_COUNT: u32 = 1000;

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrewarmBody {
    /// Wider than the range, so that an out-of-range number gets the range's answer.
    #[serde(default = "one")]
    count: i64,
}

fn one() -> i64 {
    1
}

/// The `count` of a prewarm request (1..=[`MAX_PREWARM_COUNT`]); an empty body means 1.
pub fn prewarm_count(body: &Bytes) -> Result<u32, ApiError> {
    let req: PrewarmBody = if body.iter().all(u8::is_ascii_whitespace) {
        PrewarmBody { count: 1 }
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid prewarm request: {e}")))?
    };
    match u32::try_from(req.count) {
        Ok(n) if (1..=MAX_PREWARM_COUNT).contains(&n) => Ok(n),
        _ => Err(out_of_range(
            ApiError::bad_request(format!(
                "count must be between 1 and {MAX_PREWARM_COUNT}, got {}",
                req.count
            )),
            "count",
            1.0,
            f64::from(MAX_PREWARM_COUNT),
        )),
    }
}

/// A JSON answer already serialized (e.g. an [`hearth_api::InvokeAnswer`]).
pub fn json_bytes(status: StatusCode, body: impl Into<Bytes>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.into(),
    )
        .into_response()
}

/// `GET /healthz`.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

//! The HTTP edge of async delivery, shared by the worker and the controller: the
//! `Idempotency-Key` and `Hearth-Invocation-Id` headers, `202` answers, records by id, the
//! dead-letter list, and a synchronous call with an idempotency key (answered with the first
//! call's result).

use crate::auth::{Action, Principal};
use crate::delivery::{record_of, Accepted, Delivery};
use crate::error::ApiError;
use crate::store::{DeadLetterFilter, StoreError};
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_api::{AsyncAccepted, AsyncRecord, AsyncState, ErrorCode};
use serde::Deserialize;
use serde_json::{json, Value};
use std::time::Duration;

/// A client's key that makes a repeated call return the first call's invocation.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The invocation id a controller sends a worker, so that a repeat runs once.
pub const INVOCATION_ID: &str = "hearth-invocation-id";
/// The cluster-wide version of a function a controller registers on a worker: several
/// controllers registering the same version register it once.
pub const FUNCTION_VERSION: &str = "hearth-function-version";
/// A call's own deadline in ms, counted from when the platform accepted it (Atoll's per-request
/// deadline); it replaces the function's `deadline_ms` for this call.
pub const DEADLINE_MS: &str = "hearth-deadline-ms";
/// The µs a controller had already spent on an invocation when it forwarded it: the worker's
/// share of the deadline is what is left.
pub const ELAPSED_US: &str = "hearth-elapsed-us";
/// `true` (or `1`): a call whose deadline has passed before it starts is refused (504
/// `deadline_passed`) rather than run late; the controller forwards it to the worker.
pub const DROP_LATE: &str = "hearth-drop-late";
/// Set on an answer that is the first call's, for a repeated idempotency key.
pub const REPLAYED: &str = "hearth-idempotent-replay";
/// The longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 256;
/// The most records one dead-letter listing returns.
pub const MAX_LISTED: usize = 1000;

/// The headers an invoke reads, taken from the request without copying its header map (the
/// invoke path is hot).
pub struct InvokeHeaders {
    idempotency_key: Option<HeaderValue>,
    invocation_id: Option<HeaderValue>,
    deadline_ms: Option<HeaderValue>,
    elapsed_us: Option<HeaderValue>,
    drop_late: Option<HeaderValue>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for InvokeHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(InvokeHeaders {
            idempotency_key: parts.headers.get(IDEMPOTENCY_KEY).cloned(),
            invocation_id: parts.headers.get(INVOCATION_ID).cloned(),
            deadline_ms: parts.headers.get(DEADLINE_MS).cloned(),
            elapsed_us: parts.headers.get(ELAPSED_US).cloned(),
            drop_late: parts.headers.get(DROP_LATE).cloned(),
        })
    }
}

impl InvokeHeaders {
    /// The `Idempotency-Key`: 1 to 256 visible ASCII characters.
    pub fn idempotency_key(&self) -> Result<Option<String>, ApiError> {
        idempotency_key_of(self.idempotency_key.as_ref())
    }

    /// The `Hearth-Invocation-Id` of a request from the cluster itself (a controller, or
    /// anyone when authentication is off); a client's is ignored.
    pub fn invocation_id(&self, p: &Principal) -> Result<Option<String>, ApiError> {
        invocation_id_of(self.invocation_id.as_ref(), p)
    }

    /// `Hearth-Deadline-Ms`: a whole number of ms from 1 to 15 minutes.
    pub fn deadline_ms(&self) -> Result<Option<u64>, ApiError> {
        let max = hearth_api::MAX_TIMEOUT_MS;
        number_in(self.deadline_ms.as_ref(), 1..=max, || {
            format!("Hearth-Deadline-Ms must be a whole number of milliseconds from 1 to {max}")
        })
    }

    /// `Hearth-Elapsed-Us` of a request from the cluster itself (0 when absent); a client's is
    /// ignored (it would buy its invocation priority under `srsf`).
    pub fn elapsed_us(&self, p: &Principal) -> Result<u64, ApiError> {
        if !p.is_cluster() {
            return Ok(0);
        }
        let max = hearth_api::MAX_TIMEOUT_MS * 1000;
        let e = number_in(self.elapsed_us.as_ref(), 0..=max, || {
            format!("Hearth-Elapsed-Us must be a whole number of microseconds up to {max}")
        })?;
        Ok(e.unwrap_or(0))
    }

    /// `Hearth-Drop-Late`: `true`/`false` (any case) or `1`/`0`; `None` when absent.
    pub fn drop_late(&self) -> Result<Option<bool>, ApiError> {
        flag(self.drop_late.as_ref(), || {
            "Hearth-Drop-Late must be true, false, 1 or 0".to_string()
        })
    }
}

/// A header holding a yes/no flag: `None` when absent, a 400 with `message` when it is
/// anything else.
fn flag(
    v: Option<&HeaderValue>,
    message: impl FnOnce() -> String,
) -> Result<Option<bool>, ApiError> {
    let Some(v) = v else {
        return Ok(None);
    };
    match v.to_str().map(str::trim) {
        Ok(s) if s == "1" || s.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Ok(s) if s == "0" || s.eq_ignore_ascii_case("false") => Ok(Some(false)),
        _ => Err(ApiError::bad_request(message())),
    }
}

/// A header holding a whole number in `range`: `None` when absent, a 400 with `message` when
/// it is anything else.
fn number_in(
    v: Option<&HeaderValue>,
    range: std::ops::RangeInclusive<u64>,
    message: impl FnOnce() -> String,
) -> Result<Option<u64>, ApiError> {
    let Some(v) = v else {
        return Ok(None);
    };
    match v.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(n) if range.contains(&n) => Ok(Some(n)),
        _ => Err(ApiError::bad_request(message())),
    }
}

fn idempotency_key_of(v: Option<&HeaderValue>) -> Result<Option<String>, ApiError> {
    let Some(v) = v else {
        return Ok(None);
    };
    let ok = |s: &str| {
        (1..=MAX_IDEMPOTENCY_KEY_LEN).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
    };
    match v.to_str() {
        Ok(s) if ok(s) => Ok(Some(s.to_string())),
        _ => Err(ApiError::bad_request(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
        ))),
    }
}

fn invocation_id_of(v: Option<&HeaderValue>, p: &Principal) -> Result<Option<String>, ApiError> {
    if !p.is_cluster() {
        return Ok(None);
    }
    let Some(v) = v else {
        return Ok(None);
    };
    match v.to_str() {
        Ok(s) if (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(Some(s.to_ascii_lowercase()))
        }
        _ => Err(ApiError::bad_request(
            "Hearth-Invocation-Id must be 1 to 64 hex digits",
        )),
    }
}

/// The `Hearth-Function-Version` of a registration from the cluster itself; a client's is
/// ignored.
pub fn function_version(headers: &HeaderMap, p: &Principal) -> Result<Option<u64>, ApiError> {
    if !p.is_cluster() {
        return Ok(None);
    }
    number_in(headers.get(FUNCTION_VERSION), 0..=u64::MAX, || {
        "Hearth-Function-Version must be a number".into()
    })
}

/// `202 Accepted` with the invocation's id; marked when it is a repeated key's first call.
pub fn accepted(a: &Accepted) -> Response {
    let mut resp = (StatusCode::ACCEPTED, Json(AsyncAccepted::new(&a.id))).into_response();
    if a.replay {
        resp.headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    resp
}

/// An answer kept as status and JSON body.
pub fn kept_response(status: u16, body: Bytes) -> Response {
    crate::http::json_bytes(
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        body,
    )
}

/// A store error as the edge answers it.
pub fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Full(_) => ApiError::overloaded(e.to_string()),
        StoreError::NamespaceFull {
            ref namespace,
            setting,
            max,
            ..
        } => {
            let namespace = namespace.clone();
            let mut err = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::NamespaceLimit,
                e.to_string(),
            )
            .with("namespace", json!(namespace))
            .with("setting", json!(setting))
            .with("limit", json!(max));
            err.retry_after_s = Some(1);
            err
        }
        StoreError::Unavailable(_) => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Internal,
                e.to_string(),
            );
            e.retry_after_s = Some(1);
            e
        }
        e => ApiError::internal(e.to_string()),
    }
}

/// `GET /v1/invocations/{id}`: the record, 404 if unknown, expired, or not the reader's.
pub async fn invocation_record(
    delivery: &Delivery,
    id: &str,
    reader: &Principal,
) -> Result<Json<AsyncRecord>, ApiError> {
    let bad = || ApiError::not_found("invocation", id);
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let rec = delivery.store().get(id).await.map_err(store_error)?;
    match rec {
        Some(r) if reader.may_read(&r.owner, hearth_api::namespace::namespace_of(&r.function)) => {
            Ok(Json(record_of(&r)))
        }
        _ => Err(bad()),
    }
}

/// `GET /v1/invocations?status=failed[&function=…][&limit=…]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub status: String,
    #[serde(default)]
    pub function: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

/// The dead-letter list: failed invocations, newest first, of the namespace the key manages
/// (all for the operator).
pub async fn dead_letters(
    delivery: &Delivery,
    p: &Principal,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    if q.status != "failed" {
        return Err(ApiError::bad_request(
            "only status=failed (the dead-letter list) can be listed",
        ));
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_LISTED).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {MAX_LISTED}"
        )));
    }
    let namespace = if p.require(Action::Operate).is_ok() {
        None
    } else {
        p.require(Action::Manage(p.namespace()))?;
        Some(p.namespace().to_string())
    };
    let function = match q.function {
        Some(f) => Some(p.authorized_key(&f, crate::auth::Access::Manage)?),
        None => None,
    };
    let filter = DeadLetterFilter {
        namespace,
        function,
    };
    let list = delivery
        .dead_letters(&filter, limit)
        .await
        .map_err(store_error)?;
    let records: Vec<AsyncRecord> = list.iter().map(record_of).collect();
    Ok(Json(json!({ "invocations": records })))
}

/// The answer to a durably accepted invocation: 202 with its id for an async call, else the
/// invocation's answer once it is done (waited for up to `timeout`, 60 s if the function's is
/// unknown).
pub async fn respond(
    delivery: &Delivery,
    a: &Accepted,
    is_async: bool,
    timeout: Option<Duration>,
) -> Response {
    if is_async {
        return accepted(a);
    }
    answer_when_done(delivery, a, timeout.unwrap_or(Duration::from_secs(60))).await
}

/// A synchronous call with an idempotency key: the answer of the key's one invocation, waited
/// for up to `timeout`; 504 with the id when it is still running then.
pub async fn answer_when_done(delivery: &Delivery, a: &Accepted, timeout: Duration) -> Response {
    let rec = match delivery.wait(&a.id, timeout).await {
        Ok(r) => r,
        Err(e) => return store_error(e).into_response(),
    };
    let mut resp = match rec {
        Some(r) if r.state != AsyncState::Running => match (r.http_status, r.answer) {
            (Some(status), Some(answer)) => kept_response(status, Bytes::from(answer)),
            _ => ApiError::internal("the invocation's record has no answer").into_response(),
        },
        Some(_) => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::Timeout,
            "the invocation is still running; read its result by id",
        )
        .with("id", json!(a.id))
        .into_response(),
        None => ApiError::not_found("invocation", &a.id).into_response(),
    };
    if let Ok(v) = HeaderValue::from_str(&a.id) {
        resp.headers_mut().insert(INVOCATION_ID, v);
    }
    if a.replay {
        resp.headers_mut()
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    resp
}

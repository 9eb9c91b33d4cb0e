//! API errors: every failure the API reports, with its HTTP status and a stable code.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_api::ErrorCode;

/// An error answer: `{"error": {"code", "message", ...details}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: hearth_api::ErrorCode,
    pub message: String,
    /// Extra fields merged into the error object (e.g. a handler's traceback, timing).
    pub details: Option<serde_json::Map<String, serde_json::Value>>,
    /// Seconds for `Retry-After` on 429/503.
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        code: hearth_api::ErrorCode,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
            retry_after_s: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
    }
    pub fn not_found(what: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("{what} {name:?} not found"),
        )
    }
    pub fn unknown_function(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownFunction,
            format!("function {name:?} is not registered"),
        )
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("request body is larger than the limit of {limit} bytes"),
        )
    }
    pub fn overloaded(message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Overloaded,
            message,
        );
        e.retry_after_s = Some(1);
        e
    }
    pub fn shutting_down() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::ShuttingDown,
            "the worker is shutting down",
        );
        e.retry_after_s = Some(1);
        e
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            message,
        )
    }
    /// Adds a field to the error object.
    pub fn with(mut self, key: &str, value: serde_json::Value) -> Self {
        self.details
            .get_or_insert_with(serde_json::Map::new)
            .insert(key.to_string(), value);
        self
    }

    /// The typed error body.
    pub fn error_body(&self) -> hearth_api::ErrorBody {
        let mut b = hearth_api::ErrorBody::new(self.code.clone(), self.message.clone());
        if let Some(d) = &self.details {
            b.error.details = d.clone();
        }
        b
    }

    /// What this error leaves in an async invocation's record: the answer a synchronous call
    /// would have got.
    pub fn async_outcome(&self) -> hearth_api::AsyncOutcome {
        hearth_api::AsyncOutcome::Failed {
            http_status: self.status.as_u16(),
            error: self.error_body(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.error_body())).into_response();
        if let Some(s) = self.retry_after_s {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

/// An error with its causes (a refused connection or a TLS failure sits a few sources down).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

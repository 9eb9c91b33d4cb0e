//! The error body every Hearth API answers with: `{"error": {"code", "message", ...details}}`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Defines [`ErrorCode`] from one list of variants and wire names, so the names, the parser and
/// the list of known codes cannot drift apart.
macro_rules! error_codes {
    ($($variant:ident => $name:literal,)*) => {
        /// The stable codes of error answers. Which HTTP status goes with a code is the HTTP
        /// edge's business (each service's `api.rs`); clients branch on the code.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($variant,)*
            /// A code this version does not know (a newer peer): kept as sent.
            Other(String),
        }

        impl ErrorCode {
            /// Every code this version knows.
            pub const NAMED: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $(ErrorCode::$variant => $name,)*
                    ErrorCode::Other(s) => s,
                }
            }
        }
    };
}

error_codes! {
    BadRequest => "bad_request",
    NotFound => "not_found",
    UnknownFunction => "unknown_function",
    MethodNotAllowed => "method_not_allowed",
    PayloadTooLarge => "payload_too_large",
    CodeTooLarge => "code_too_large",
    Conflict => "conflict",
    Overloaded => "overloaded",
    QueueFull => "queue_full",
    InsufficientMemory => "insufficient_memory",
    NoGpu => "no_gpu",
    ShuttingDown => "shutting_down",
    Timeout => "timeout",
    DeadlinePassed => "deadline_passed",
    HandlerError => "handler_error",
    InitError => "init_error",
    FunctionBuilding => "function_building",
    FunctionBuildFailed => "function_build_failed",
    SandboxCrashed => "sandbox_crashed",
    SandboxStartFailed => "sandbox_start_failed",
    OutOfMemory => "out_of_memory",
    ResultTooLarge => "result_too_large",
    TooManyConnections => "too_many_connections",
    NoWorkers => "no_workers",
    WorkerUnavailable => "worker_unavailable",
    WorkerFailed => "worker_failed",
    WorkerTimeout => "worker_timeout",
    WorkerRefusedFunction => "worker_refused_function",
    Unauthorized => "unauthorized",
    Forbidden => "forbidden",
    QuotaConcurrency => "quota_concurrency",
    QuotaRate => "quota_rate",
    QuotaKeys => "quota_keys",
    FairShare => "fair_share",
    NamespaceLimit => "namespace_limit",
    LastOperatorKey => "last_operator_key",
    AuthDisabled => "auth_disabled",
    PrewarmFailed => "prewarm_failed",
    Internal => "internal",
}

impl ErrorCode {
    /// The code named `s` (an unknown name becomes [`ErrorCode::Other`]).
    pub fn parse(s: &str) -> Self {
        Self::NAMED
            .iter()
            .find(|c| c.as_str() == s)
            .cloned()
            .unwrap_or_else(|| ErrorCode::Other(s.to_string()))
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s: Cow<'de, str> = Deserialize::deserialize(d)?;
        Ok(ErrorCode::parse(&s))
    }
}

/// The error object: a code, a message for people, and details that depend on the code (a
/// handler's `type` and `traceback`, the `timing` of a run that raised, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    pub code: ErrorCode,
    pub message: String,
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorBody {
            error: ErrorObject {
                code,
                message: message.into(),
                details: Map::new(),
            },
        }
    }

    /// Reads an error answer; `None` when the body is not one.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }

    /// The JSON text.
    pub fn to_vec(&self) -> Vec<u8> {
        // Serializing a string, a map of JSON values and a code cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_kept() {
        for c in ErrorCode::NAMED {
            let j = serde_json::to_string(c).unwrap();
            assert_eq!(&serde_json::from_str::<ErrorCode>(&j).unwrap(), c);
        }
        let c: ErrorCode = serde_json::from_str("\"brand_new\"").unwrap();
        assert_eq!(c, ErrorCode::Other("brand_new".into()));
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"brand_new\"");
    }

    #[test]
    fn details_sit_beside_code_and_message() {
        let mut b = ErrorBody::new(ErrorCode::HandlerError, "f raised ValueError: x");
        b.error.details.insert("type".into(), "ValueError".into());
        let v: Value = serde_json::from_slice(&b.to_vec()).unwrap();
        assert_eq!(v["error"]["code"], "handler_error");
        assert_eq!(v["error"]["type"], "ValueError");
        assert_eq!(ErrorBody::parse(&b.to_vec()), Some(b));
        assert_eq!(ErrorBody::parse(b"{\"result\":1}"), None);
    }
}

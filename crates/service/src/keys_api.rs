//! The key management endpoints both services have (`/v1/keys`), and [`protect`], which puts a
//! service's routes behind authentication.
//!
//! The operator (a `*` admin key) manages keys of every namespace; a namespace's admin manages
//! its own namespace's keys. A new key's token is in the answer to its creation and nowhere else.

use crate::auth::{Action, Auth, AuthError, Principal, Role, Scope};
use crate::error::ApiError;
use crate::http::{json_error, with_common_endpoints};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::handler::Handler;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Extension, Json, Router};
use hearth_api::ErrorCode;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// `routes` (a service's own, with their state) plus `/v1/keys`, all behind `auth`; `/healthz`
/// and the JSON 404/405 answers stay open.
/// The kind of document keys are replicated as in the cluster's store.
pub const KEYS_KIND: &str = "keys";

pub fn protect(routes: Router, auth: Arc<Auth>) -> Router {
    let keys = Router::new()
        .route(
            "/v1/keys",
            get(list).post(create.layer(DefaultBodyLimit::max(MAX_KEY_REQUEST_BYTES))),
        )
        .route("/v1/keys/{id}", delete(revoke))
        .with_state(Arc::clone(&auth));
    let protected = routes
        .merge(keys)
        .route_layer(axum::middleware::from_fn_with_state(
            auth,
            crate::auth::middleware,
        ));
    with_common_endpoints(protected)
}

/// Largest `POST /v1/keys` body (a namespace, a role and a description of at most 200 bytes).
const MAX_KEY_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    /// `*` (operator only) or a namespace; default: the caller's own.
    namespace: Option<String>,
    role: Role,
    #[serde(default)]
    description: String,
}

pub fn store(auth: &Auth) -> Result<&crate::auth::KeyStore, ApiError> {
    auth.keys().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::AuthDisabled,
            "authentication is off on this service: there are no keys",
        )
    })
}

/// The HTTP form of a key store error: a limit is a 429 naming it.
pub fn auth_error(e: AuthError) -> ApiError {
    match e {
        AuthError::BadRequest(m) => ApiError::bad_request(m),
        AuthError::Limit(m) => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, ErrorCode::QuotaKeys, m)
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// May `p` manage keys of `scope`?
fn may_manage(p: &Principal, scope: &Scope) -> Result<(), ApiError> {
    p.require(Action::Keys(scope.as_str()))
}

async fn create(
    State(auth): State<Arc<Auth>>,
    Extension(p): Extension<Principal>,
    body: Result<Json<NewKey>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(|r| json_error(r, MAX_KEY_REQUEST_BYTES))?;
    let scope = match req.namespace {
        Some(ns) => Scope::parse(&ns).map_err(auth_error)?,
        None => Scope::Namespace(p.namespace().to_string()),
    };
    may_manage(&p, &scope)?;
    if scope == Scope::All && req.role == Role::Invoke {
        return Err(ApiError::bad_request(
            "a key of every namespace (\"*\") must be an admin or metrics key",
        ));
    }
    let keys = store(&auth)?;
    let (info, token) = keys
        .create(scope, req.role, &req.description)
        .map_err(auth_error)?;
    // In a cluster the key is valid once every controller can learn it.
    if let (Some(cluster), Some(record)) = (auth.replica(), keys.record(&info.id)) {
        let doc = serde_json::to_value(&record).unwrap_or_default();
        if let Err(e) = cluster.put_doc(KEYS_KIND, &info.id, &doc).await {
            let _ = keys.revoke(&info.id);
            return Err(crate::async_api::store_error(e));
        }
    }
    let mut v = info.to_json();
    v["key"] = json!(token);
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

async fn list(
    State(auth): State<Arc<Auth>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    let all = p.require(Action::Keys("*")).is_ok();
    if !all {
        p.require(Action::Keys(p.namespace()))?;
    }
    let keys: Vec<Value> = store(&auth)?
        .list()
        .into_iter()
        .filter(|k| all || k.scope == Scope::Namespace(p.namespace().to_string()))
        .map(|k| k.to_json())
        .collect();
    Ok(Json(json!({ "keys": keys })))
}

async fn revoke(
    State(auth): State<Arc<Auth>>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let keys = store(&auth)?;
    // Someone else's key is "not found" to a caller who may not manage it.
    let info = keys
        .get(&id)
        .filter(|k| may_manage(&p, &k.scope).is_ok())
        .ok_or_else(|| ApiError::not_found("key", &id))?;
    let operator_keys = keys
        .list()
        .iter()
        .filter(|k| k.scope == Scope::All && k.role == Role::Admin)
        .count();
    if info.scope == Scope::All && info.role == Role::Admin && operator_keys == 1 {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::LastOperatorKey,
            "this is the last operator key; create another one before deleting it",
        ));
    }
    if let Some(cluster) = auth.replica() {
        cluster
            .delete_doc(KEYS_KIND, &id)
            .await
            .map_err(crate::async_api::store_error)?;
    }
    keys.revoke(&id).map_err(auth_error)?;
    Ok(StatusCode::NO_CONTENT)
}

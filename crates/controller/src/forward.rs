//! Requests to workers over persistent HTTP/1.1 connections (hyper-util's pooled client).
//!
//! Every failure is classified by what the controller can prove: a request that could not even
//! connect never reached the worker ([`ForwardError::NotStarted`]); any later failure may have
//! happened after the worker began running it ([`ForwardError::MaybeStarted`],
//! [`ForwardError::TimedOut`]). Only the first kind is ever retried.

use bytes::Bytes;
use hearth_api::{ErrorBody, ErrorCode};
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// A worker's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<HeaderValue>,
    pub body: Bytes,
}

impl Answer {
    /// A 2xx answer.
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }

    /// A 200 answer: what a worker sends with an invocation's result.
    pub fn is_ok(&self) -> bool {
        self.status == StatusCode::OK
    }

    /// The worker refused because it is shutting down (503), whatever the body says.
    pub fn is_unavailable(&self) -> bool {
        self.status == StatusCode::SERVICE_UNAVAILABLE
    }

    /// The worker refused because it is overloaded (429).
    pub fn is_overloaded(&self) -> bool {
        self.status == StatusCode::TOO_MANY_REQUESTS
    }

    /// The worker does not have the function (it lost it, e.g. a fresh data directory): 404
    /// with `unknown_function`.
    pub fn lost_function(&self) -> bool {
        self.status == StatusCode::NOT_FOUND
            && self.error_code() == Some(ErrorCode::UnknownFunction)
    }

    /// The worker is shutting down: 503 with `shutting_down`.
    pub fn shutting_down(&self) -> bool {
        self.is_unavailable() && self.error_code() == Some(ErrorCode::ShuttingDown)
    }

    fn error_code(&self) -> Option<ErrorCode> {
        ErrorBody::parse(&self.body).map(|b| b.error.code)
    }

    /// The message of an error answer, or the start of the body when it is not one.
    pub fn error_message(&self) -> String {
        match ErrorBody::parse(&self.body) {
            Some(b) => b.error.message,
            None => String::from_utf8_lossy(&self.body)
                .chars()
                .take(300)
                .collect(),
        }
    }
}

/// Why a request to a worker failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    #[error("could not reach the worker: {0}")]
    NotStarted(String),
    #[error("the connection to the worker failed: {0}")]
    MaybeStarted(String),
    #[error("the worker did not answer within {0:?}")]
    TimedOut(Duration),
}

/// The pooled client.
#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `Bearer <cluster key>`: workers serve the controller only with it.
    credential: Option<HeaderValue>,
}

impl Forwarder {
    pub fn new(connect_timeout: Duration, credential: Option<HeaderValue>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .build(connector);
        Forwarder { client, credential }
    }

    /// Sends one request to `base` (`http://HOST:PORT`) + `path`; the whole exchange (connect,
    /// send, wait, read) is bounded by `timeout`.
    pub async fn send(
        &self,
        method: Method,
        base: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, ForwardError> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header(CONTENT_TYPE, "application/json");
        if let Some(c) = &self.credential {
            req = req.header(AUTHORIZATION, c.clone());
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| ForwardError::NotStarted(format!("bad request to {base}{path}: {e}")))?;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(|e| {
                if e.is_connect() {
                    ForwardError::NotStarted(error_chain(&e))
                } else {
                    ForwardError::MaybeStarted(error_chain(&e))
                }
            })?;
            let status = resp.status();
            let retry_after = resp.headers().get(RETRY_AFTER).cloned();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| ForwardError::MaybeStarted(error_chain(&e)))?
                .to_bytes();
            Ok(Answer {
                status,
                retry_after,
                body,
            })
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ForwardError::TimedOut(timeout))?
    }
}

/// An error with its causes ("connection refused" sits a few sources down).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

//! Requests to workers over persistent HTTP/1.1 connections (hyper-util's pooled client), plain
//! for `http://` workers and TLS (rustls) for `https://` ones.
//!
//! Every failure is classified by what the controller can prove: a request that could not even
//! connect never reached the worker ([`ForwardError::NotStarted`]); any later failure may have
//! happened after the worker began running it ([`ForwardError::MaybeStarted`],
//! [`ForwardError::TimedOut`]). Only the first kind is ever retried.

use bytes::Bytes;
use hearth_api::{ErrorBody, ErrorCode};
use hearth_service::error::error_chain;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

/// A worker's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<HeaderValue>,
    pub body: Bytes,
}

impl Answer {
    /// What the client gets for a worker's answer over `limit` bytes: 502 `result_too_large`
    /// (the worker's bytes are dropped unread, and the connection with them).
    fn too_large(limit: usize) -> Self {
        let body = ErrorBody::new(
            ErrorCode::ResultTooLarge,
            format!(
                "the worker's answer is larger than the controller's limit of {limit} bytes \
                 (max_result_bytes plus {ANSWER_MARGIN_BYTES} for the answer's fields)"
            ),
        );
        Answer {
            status: StatusCode::BAD_GATEWAY,
            retry_after: None,
            body: Bytes::from(body.to_vec()),
        }
    }

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

/// Room in a worker's answer beyond its result: the answer's own fields (timing, worker, cold
/// reason) and error details (a traceback).
pub const ANSWER_MARGIN_BYTES: usize = 64 * 1024;

/// The pooled client.
#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `Bearer <a worker's controller token>` on a member's own forwarder; none on the shared
    /// one, so that nothing reaches a worker with another worker's token.
    credential: Option<HeaderValue>,
    /// The most bytes read of one answer; a larger one is never buffered.
    max_answer_bytes: usize,
    /// What the client was built with, for [`Self::fresh`].
    connect_timeout: Duration,
    tls: Arc<rustls::ClientConfig>,
}

impl Forwarder {
    /// `tls` is what `https://` workers are checked against; `http://` ones stay plain TCP.
    pub fn new(
        connect_timeout: Duration,
        credential: Option<HeaderValue>,
        tls: Arc<rustls::ClientConfig>,
    ) -> Self {
        let client = Self::client(connect_timeout, Arc::clone(&tls));
        Forwarder {
            client,
            credential,
            max_answer_bytes: hearth_service::serving::DEFAULT_MAX_RESULT_BYTES
                + ANSWER_MARGIN_BYTES,
            connect_timeout,
            tls,
        }
    }

    /// The same settings with a pool of its own: one per worker process, so that a restarted
    /// worker at the same address is never sent a request over a connection of the process
    /// that died (that failure could not be told from a worker that died mid-request).
    pub fn fresh(&self) -> Forwarder {
        Forwarder {
            client: Self::client(self.connect_timeout, Arc::clone(&self.tls)),
            ..self.clone()
        }
    }

    /// The credential this forwarder sends, if any.
    pub fn credential(&self) -> Option<&HeaderValue> {
        self.credential.as_ref()
    }

    /// [`Self::fresh`] sending `credential` (one worker's controller token) instead.
    pub fn fresh_with(&self, credential: Option<HeaderValue>) -> Forwarder {
        Forwarder {
            credential,
            ..self.fresh()
        }
    }

    fn client(
        connect_timeout: Duration,
        tls: Arc<rustls::ClientConfig>,
    ) -> Client<HttpsConnector<HttpConnector>, Full<Bytes>> {
        let connector = hearth_service::tls::client_connector(tls, Some(connect_timeout));
        Client::builder(TokioExecutor::new())
            // Under the workers' default idle_timeout_ms (60 s): a pooled connection is given
            // up here before the worker closes it, so a request never races the worker's close
            // (that failure could not be told from a worker that died mid-request).
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(1024)
            .build(connector)
    }

    /// Caps what is read of an answer at `max_result_bytes` plus [`ANSWER_MARGIN_BYTES`].
    pub fn with_max_answer_bytes(mut self, max_result_bytes: usize) -> Self {
        self.max_answer_bytes = max_result_bytes.saturating_add(ANSWER_MARGIN_BYTES);
        self
    }

    /// Sends one request to `base` (`http://HOST:PORT` or `https://HOST:PORT`) + `path`; the
    /// whole exchange (connect, TLS handshake, send, wait, read) is bounded by `timeout`. A
    /// failed handshake is a connect error: the request never went out.
    pub async fn send(
        &self,
        method: Method,
        base: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Answer, ForwardError> {
        self.send_with(method, base, path, body, timeout, &[]).await
    }

    /// [`Self::send`] with more headers (an invocation's id, its deadline …).
    pub async fn send_with(
        &self,
        method: Method,
        base: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
        extra: &[(&'static str, HeaderValue)],
    ) -> Result<Answer, ForwardError> {
        let req = self.request(method, base, path, body, extra)?;
        let exchange = async {
            let resp = self.client.request(req).await.map_err(sent_error)?;
            let status = resp.status();
            let retry_after = resp.headers().get(RETRY_AFTER).cloned();
            let limit = self.max_answer_bytes;
            let declared = resp
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit as u64) {
                // Dropping the response unread closes the connection.
                return Ok(Answer::too_large(limit));
            }
            let body = match Limited::new(resp.into_body(), limit).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return Ok(Answer::too_large(limit));
                }
                Err(e) => return Err(ForwardError::MaybeStarted(error_chain(&*e))),
            };
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

    /// Sends one request whose answer is read a line at a time (`application/x-ndjson`, asked
    /// for with `Accept`): the status comes back as soon as the head does, and [`Lines`] reads
    /// the body as it arrives. The whole exchange is bounded by `timeout`; no line may be
    /// longer than `max_line` bytes.
    pub async fn send_streamed(
        &self,
        method: Method,
        base: &str,
        path: &str,
        body: Bytes,
        timeout: Duration,
        max_line: usize,
    ) -> Result<(StatusCode, Lines), ForwardError> {
        let accept = HeaderValue::from_static(hearth_api::PROACTIVE_STREAM_TYPE);
        let req = self.request(method, base, path, body, &[("accept", accept)])?;
        let deadline = tokio::time::Instant::now() + timeout;
        let resp = tokio::time::timeout_at(deadline, self.client.request(req))
            .await
            .map_err(|_| ForwardError::TimedOut(timeout))?
            .map_err(sent_error)?;
        let status = resp.status();
        Ok((
            status,
            Lines {
                body: resp.into_body(),
                buf: Vec::new(),
                max_line,
                deadline,
                timeout,
                ended: false,
            },
        ))
    }

    fn request(
        &self,
        method: Method,
        base: &str,
        path: &str,
        body: Bytes,
        extra: &[(&'static str, HeaderValue)],
    ) -> Result<Request<Full<Bytes>>, ForwardError> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header(CONTENT_TYPE, "application/json");
        if let Some(c) = &self.credential {
            req = req.header(AUTHORIZATION, c.clone());
        }
        for (name, value) in extra {
            req = req.header(*name, value.clone());
        }
        req.body(Full::new(body))
            .map_err(|e| ForwardError::NotStarted(format!("bad request to {base}{path}: {e}")))
    }
}

/// What a failed request proves: one that could not connect never reached the worker.
fn sent_error(e: hyper_util::client::legacy::Error) -> ForwardError {
    if e.is_connect() {
        ForwardError::NotStarted(error_chain(&e))
    } else {
        ForwardError::MaybeStarted(error_chain(&e))
    }
}

/// A streamed answer's body, a line at a time.
pub struct Lines {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
    max_line: usize,
    deadline: tokio::time::Instant,
    timeout: Duration,
    ended: bool,
}

impl Lines {
    /// The next line (without its newline); `None` once the answer ended. A last line with
    /// no newline still counts.
    pub async fn next(&mut self) -> Result<Option<Bytes>, ForwardError> {
        loop {
            if let Some(at) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=at).collect();
                line.pop();
                return Ok(Some(Bytes::from(line)));
            }
            if self.ended {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(Bytes::from(std::mem::take(&mut self.buf))));
            }
            if self.buf.len() > self.max_line {
                return Err(ForwardError::MaybeStarted(format!(
                    "a line of the answer is longer than {} bytes",
                    self.max_line
                )));
            }
            let frame = tokio::time::timeout_at(self.deadline, self.body.frame())
                .await
                .map_err(|_| ForwardError::TimedOut(self.timeout))?;
            match frame {
                None => self.ended = true,
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(ForwardError::MaybeStarted(error_chain(&e))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot server on loopback: reads one request, then `answer` writes the response.
    async fn one_shot<F, Fut>(answer: F) -> String
    where
        F: FnOnce(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            answer(s).await;
        });
        format!("http://{addr}")
    }

    /// A one-shot server answering 200 with `len` bytes, chunked or with a length.
    async fn huge_answer(len: usize, chunked: bool) -> String {
        one_shot(move |mut s| async move {
            let chunk = vec![b'x'; 64 * 1024];
            if chunked {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await;
                let mut sent = 0;
                while sent < len {
                    let head = format!("{:x}\r\n", chunk.len());
                    if s.write_all(head.as_bytes()).await.is_err()
                        || s.write_all(&chunk).await.is_err()
                        || s.write_all(b"\r\n").await.is_err()
                    {
                        return;
                    }
                    sent += chunk.len();
                }
            } else {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&chunk).await;
            }
        })
        .await
    }

    #[tokio::test]
    async fn an_answer_over_the_cap_is_a_502_result_too_large_and_not_buffered() {
        let tls = hearth_service::tls::client_config("tls_ca", None).unwrap();
        let f = Forwarder::new(Duration::from_secs(1), None, tls).with_max_answer_bytes(1024);
        for chunked in [false, true] {
            let base = huge_answer(10 * 1024 * 1024, chunked).await;
            let a = f
                .send(
                    Method::POST,
                    &base,
                    "/x",
                    Bytes::new(),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            assert_eq!(a.status, StatusCode::BAD_GATEWAY, "chunked {chunked}");
            assert_eq!(a.error_code(), Some(ErrorCode::ResultTooLarge));
            assert!(
                a.error_message().contains("66560 bytes"),
                "{}",
                a.error_message()
            );
        }
    }

    /// A one-shot server answering 200 with `chunks` as a chunked body.
    async fn chunked_answer(chunks: &'static [&'static str]) -> String {
        one_shot(move |mut s| async move {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            for c in chunks {
                let _ = s
                    .write_all(format!("{:x}\r\n{c}\r\n", c.len()).as_bytes())
                    .await;
                let _ = s.flush().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
        })
        .await
    }

    #[tokio::test]
    async fn a_streamed_answer_reads_whole_lines_across_chunks_and_caps_their_length() {
        let tls = hearth_service::tls::client_config("tls_ca", None).unwrap();
        let f = Forwarder::new(Duration::from_secs(1), None, tls);
        let base = chunked_answer(&["{\"a\":", "1}\n{\"b\"", ":2}\n", "tail"]).await;
        let (status, mut lines) = f
            .send_streamed(
                Method::POST,
                &base,
                "/",
                Bytes::new(),
                Duration::from_secs(5),
                64,
            )
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        let mut got = Vec::new();
        while let Some(line) = lines.next().await.unwrap() {
            got.push(String::from_utf8(line.to_vec()).unwrap());
        }
        assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "tail"]);

        let base = chunked_answer(&["0123456789", "0123456789", "0123456789\n"]).await;
        let (_, mut lines) = f
            .send_streamed(
                Method::POST,
                &base,
                "/",
                Bytes::new(),
                Duration::from_secs(5),
                15,
            )
            .await
            .unwrap();
        let e = lines.next().await.unwrap_err();
        assert!(e.to_string().contains("longer than 15 bytes"), "{e}");
    }
}

//! Requests for models that remote replicas serve. The pipeline has checked the body (every
//! check that needs no tokenizer) and passed the gate; here [`forward`] has the router pick a
//! replica and sends the body unchanged, and [`pass`] passes the answer back frame by frame as
//! it arrives — an SSE stream is never buffered.
//!
//! Retries happen in `router::dispatch`, before the first byte. After it, a replica that fails
//! or a deadline that passes ends an SSE stream with an OpenAI error event and `[DONE]`; a
//! JSON answer cut short is cut short for the client too (the connection is aborted, so the
//! client sees an incomplete response rather than a well-formed lie). A client that leaves
//! drops the stream, which closes the connection to the replica, which aborts the generation
//! there.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::scope::RequestScope;
use super::sse;
use super::state::AppState;
use crate::error::ApiError;
use crate::metrics::RouterMetrics;
use crate::router::dispatch::{ProxyRequest, Routed};
use crate::router::policy::Key;
use crate::router::queue::QueueClass;
use crate::router::replica::InFlightHere;
use crate::router::{affinity, Router};

/// The header that names the replica that answered.
pub static X_SLUICE_REPLICA: HeaderName = HeaderName::from_static("x-sluice-replica");
/// Requests with the same session id go to the same replica.
pub static X_SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");

/// Where a checked request goes.
#[derive(Debug)]
pub struct Forward<'a> {
    pub path: &'static str,
    pub model: String,
    /// The prompt's leading text (or token bytes), for prefix affinity.
    pub affinity: &'a [u8],
    /// Sent on as `x-request-id`.
    pub request_id: &'a str,
    /// Its place in the model's queue.
    pub class: QueueClass,
}

/// The affinity key of a request: its session header, else its prompt's prefix.
fn key(router: &Router, headers: &HeaderMap, affinity_bytes: &[u8]) -> Option<Key> {
    let session = headers
        .get(&X_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 256);
    match session {
        Some(s) => Some(Key {
            hash: affinity::session_key(s),
            session: true,
        }),
        None => affinity::prefix_key(affinity_bytes, router.config().affinity_prefix_bytes).map(
            |hash| Key {
                hash,
                session: false,
            },
        ),
    }
}

/// Sends the body to a replica serving the model (retried on another before the first byte);
/// resolves with the answer's head and first frame.
pub async fn forward(
    s: &AppState,
    router: &Router,
    headers: &HeaderMap,
    body: Bytes,
    to: Forward<'_>,
) -> Result<Routed, ApiError> {
    let mut fwd = vec![
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
        (
            HeaderName::from_static("x-request-id"),
            HeaderValue::from_str(to.request_id).map_err(|_| ApiError::Internal)?,
        ),
    ];
    if let Some(a) = headers.get(header::ACCEPT) {
        fwd.push((header::ACCEPT, a.clone()));
    }
    let req = ProxyRequest {
        path: to.path,
        model: to.model,
        key: key(router, headers, to.affinity),
        headers: fwd,
        body,
        deadline: s.limits.request_timeout.map(|d| Instant::now() + d),
        class: Some(to.class),
    };
    Ok(router.dispatch(&req).await?)
}

/// Headers of the replica's answer not passed on: hop-by-hop ones, and `x-request-id`, which
/// the gateway sets itself (it sent the replica the same id).
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "x-request-id"
    )
}

/// What the body stream owns while the answer is passed on.
struct Passing {
    first: Option<Bytes>,
    rest: Incoming,
    sse: bool,
    until: Option<Instant>,
    deadline: std::time::Duration,
    scope: RequestScope,
    guard: InFlightHere,
    status: u16,
    metrics: RouterMetrics,
    done: bool,
}

/// The replica's answer as this request's response, passed on frame by frame; the scope (and
/// with it the gate and the replica's in-flight count) ends with the body.
pub fn pass(routed: Routed, scope: RequestScope, s: &AppState) -> Response {
    let head = routed.head;
    let sse = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut resp = Response::builder().status(head.status);
    for (k, v) in &head.headers {
        // An SSE stream may gain an error event, so its length is not the replica's.
        if hop_by_hop(k) || (sse && k == header::CONTENT_LENGTH) {
            continue;
        }
        resp = resp.header(k, v);
    }
    if let Ok(v) = HeaderValue::from_str(routed.replica.as_str()) {
        resp = resp.header(&X_SLUICE_REPLICA, v);
    }
    let state = Passing {
        first: routed.first,
        rest: routed.rest,
        sse,
        until: s.limits.request_timeout.map(|d| Instant::now() + d),
        deadline: s.limits.request_timeout.unwrap_or_default(),
        scope,
        guard: routed.guard,
        status: head.status.as_u16(),
        metrics: s.metrics.router.clone(),
        done: false,
    };
    let body = stream::unfold(state, |mut p| async move { p.next().await.map(|b| (b, p)) });
    resp.body(Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::Internal.into_response())
}

impl Passing {
    /// The next piece of the answer; `None` once it has ended.
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            self.scope.first_token();
            return Some(Ok(first));
        }
        let next = match self.until {
            Some(t) => tokio::time::timeout_at(t, self.rest.frame())
                .await
                .map_err(|_| ApiError::Timeout(self.deadline)),
            None => Ok(self.rest.frame().await),
        };
        match next {
            Ok(None) => {
                self.scope.ended(self.status);
                None
            }
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Some(Ok(data)),
                // Trailers: nothing to pass on in an HTTP/1 body.
                Err(_) => Some(Ok(Bytes::new())),
            },
            Ok(Some(Err(e))) => {
                let replica = self.guard.replica();
                tracing::warn!(replica = %replica.url(), "answer broke mid-stream: {e}");
                replica.failure();
                let err = ApiError::BadGateway(
                    "The replica failed while answering; the answer is incomplete".into(),
                );
                Some(self.fail(err))
            }
            Err(timeout) => Some(self.fail(timeout)),
        }
    }

    /// Ends the answer after a failure: an SSE error event and `[DONE]`, or an aborted body.
    fn fail(&mut self, err: ApiError) -> Result<Bytes, std::io::Error> {
        self.metrics
            .broken_streams
            .with_label_values(&[self.guard.replica().url().as_str()])
            .inc();
        self.scope.fail(&err);
        self.done = true;
        if self.sse {
            Ok(sse::error_ending(&err))
        } else {
            Err(std::io::Error::other(err.to_string()))
        }
    }
}

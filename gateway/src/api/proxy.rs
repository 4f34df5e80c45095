//! Requests for models that remote replicas serve. The pipeline has checked the body (every
//! check that needs no tokenizer) and passed the gate; here [`forward`] has the router pick a
//! replica and sends the body unchanged, and [`pass`] passes the answer back frame by frame as
//! it arrives — an SSE stream is never buffered.
//!
//! Retries happen in `router::dispatch`, before the first byte. After it, a streamed answer
//! whose replica fails continues on another replica (`super::resume`); a deadline that passes,
//! or a failure that cannot be resumed, ends an SSE stream with an OpenAI error event and
//! `[DONE]`; a JSON answer cut short is cut short for the client too (the connection is
//! aborted, so the client sees an incomplete response rather than a well-formed lie). A client
//! that leaves drops the stream, which closes the connection to the replica (also one
//! continuing a stream), which aborts the generation there.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::internal::{remaining_header, X_SLUICE_TOKEN_IDS};
use super::resume::{self, Over, Resumption};
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
    /// The request's own deadline, forwarded as the time left (`X-Sluice-Deadline-Ms`).
    pub deadline: Option<std::time::Instant>,
    /// The longest prompt's estimated tokens, to route it to replicas that take it.
    pub prompt_tokens: usize,
    /// A streamed answer: `(choices per prompt, prompts, include_usage)`, made resumable.
    pub stream: Option<(usize, usize, bool)>,
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
/// resolves with the answer's head and first frame, and for a stream what resuming it needs.
pub async fn forward(
    s: &AppState,
    router: &Arc<Router>,
    headers: &HeaderMap,
    body: Bytes,
    to: Forward<'_>,
) -> Result<(Routed, Option<Resumption>), ApiError> {
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
    if let Some(d) = to.deadline {
        fwd.push(remaining_header(d));
    }
    if to.stream.is_some() {
        fwd.push(resume::token_ids_header());
    }
    let timeout = s.limits.request_timeout.map(|d| Instant::now() + d);
    let req = ProxyRequest {
        path: to.path,
        model: to.model,
        key: key(router, headers, to.affinity),
        headers: fwd,
        body,
        deadline: earliest(timeout, to.deadline.map(Instant::from_std)),
        class: Some(to.class),
        prompt_tokens: Some(to.prompt_tokens),
    };
    let routed = router.dispatch(&req).await.map_err(|e| {
        let passed = to.deadline.is_some_and(|d| std::time::Instant::now() >= d);
        match passed {
            true => ApiError::DeadlineExceeded { stage: "prefill" },
            false => ApiError::from(e),
        }
    })?;
    if let Some(tokens) = routed.refused_prompt_tokens {
        s.metrics.demand.refused_prompt(&req.model, tokens);
    }
    let resumption = to.stream.map(|(n, prompts, usage)| {
        let mut r = Resumption::new(router.clone(), req, n, prompts).with_usage(usage);
        r.deadline = to.deadline;
        r
    });
    Ok((routed, resumption))
}

/// The replica answered with token ids (a replica that does not know the extension, or
/// another server, answers without them and its streams cannot be resumed).
fn sends_ids(headers: &HeaderMap) -> bool {
    headers
        .get(&X_SLUICE_TOKEN_IDS)
        .is_some_and(|v| v.as_bytes() == b"1")
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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
    /// The request's own deadline: a timeout at it is `deadline_exceeded`.
    own_deadline: Option<std::time::Instant>,
    scope: RequestScope,
    guard: InFlightHere,
    status: u16,
    metrics: RouterMetrics,
    /// A streamed answer that continues elsewhere when its replica fails.
    resume: Option<Resumption>,
    done: bool,
}

/// Why reading the replica's answer stopped short.
enum Stopped {
    Broke(hyper::Error),
    TimedOut,
}

/// The replica's answer as this request's response, passed on frame by frame; the scope (and
/// with it the gate and the replica's in-flight count) ends with the body.
pub fn pass(
    (routed, resume): (Routed, Option<Resumption>),
    scope: RequestScope,
    s: &AppState,
) -> Response {
    let head = routed.head;
    let sse = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut resp = Response::builder().status(head.status);
    for (k, v) in &head.headers {
        // An SSE stream may gain an error event, so its length is not the replica's.
        if hop_by_hop(k) || (sse && k == header::CONTENT_LENGTH) || *k == X_SLUICE_TOKEN_IDS {
            continue;
        }
        resp = resp.header(k, v);
    }
    if let Ok(v) = HeaderValue::from_str(routed.replica.as_str()) {
        resp = resp.header(&X_SLUICE_REPLICA, v);
    }
    let timeout = s.limits.request_timeout.map(|d| Instant::now() + d);
    let own_deadline = scope.deadline;
    let state = Passing {
        first: routed.first,
        rest: routed.rest,
        sse,
        until: earliest(timeout, own_deadline.map(Instant::from_std)),
        deadline: s.limits.request_timeout.unwrap_or_default(),
        own_deadline,
        scope,
        guard: routed.guard,
        status: head.status.as_u16(),
        metrics: s.metrics.router.clone(),
        // Only a successful stream from a replica that sends token ids is resumed; anything
        // else passes on as it is.
        resume: resume.filter(|_| sse && head.status.is_success() && sends_ids(&head.headers)),
        done: false,
    };
    let body = stream::unfold(state, |mut p| async move { p.next().await.map(|b| (b, p)) });
    resp.body(Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::Internal.into_response())
}

impl Passing {
    /// The next piece of the answer; `None` once it has ended.
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        let mut out = Vec::new();
        while !self.done {
            let read = match self.first.take() {
                Some(first) => {
                    // A replica's error answer carries no token: it ends unserved or refused.
                    if (200..300).contains(&self.status) {
                        self.scope.first_token();
                    }
                    Ok(Some(first))
                }
                None => self.frame().await,
            };
            let step = match read {
                Ok(Some(data)) => self.relay(data, &mut out).await,
                Ok(None) if self.resume.is_some() => self.continue_stream(!out.is_empty()).await,
                Ok(None) => {
                    self.scope.ended(self.status);
                    self.done = true;
                    Ok(true)
                }
                Err(Stopped::Broke(e)) => {
                    let replica = self.guard.replica();
                    tracing::warn!(replica = %replica.url(), "answer broke mid-stream: {e}");
                    replica.failure();
                    self.count_broken();
                    self.continue_stream(!out.is_empty()).await
                }
                Err(Stopped::TimedOut) => Err(self.timeout_error()),
            };
            match step {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    match self.fail(e) {
                        Ok(b) => out.extend_from_slice(&b),
                        Err(e) => return Some(Err(e)),
                    }
                    break;
                }
            }
        }
        (!out.is_empty() || !self.done).then(|| Ok(Bytes::from(out)))
    }

    /// The next data frame of the replica's answer, `None` at its end.
    async fn frame(&mut self) -> Result<Option<Bytes>, Stopped> {
        let next = match self.until {
            Some(t) => tokio::time::timeout_at(t, self.rest.frame())
                .await
                .map_err(|_| Stopped::TimedOut)?,
            None => self.rest.frame().await,
        };
        match next {
            None => Ok(None),
            // Trailers: nothing to pass on in an HTTP/1 body.
            Some(Ok(frame)) => Ok(Some(frame.into_data().unwrap_or_default())),
            Some(Err(e)) => Err(Stopped::Broke(e)),
        }
    }

    /// Passes `data` on (through the resumption's reading when there is one); `Ok(true)`
    /// when a piece is ready to send.
    async fn relay(&mut self, data: Bytes, out: &mut Vec<u8>) -> Result<bool, ApiError> {
        let Some(r) = self.resume.as_mut() else {
            out.extend_from_slice(&data);
            return Ok(true);
        };
        out.extend_from_slice(&r.feed(&data));
        match r.over() {
            Over::No => Ok(!out.is_empty()),
            Over::Failed => {
                match r.expired() {
                    Some(stage) => self.scope.fail(&ApiError::DeadlineExceeded { stage }),
                    None => self.scope.ended(self.status),
                }
                self.done = true;
                Ok(true)
            }
            Over::Done if r.complete() => {
                let (end, (completion, prompt)) = r.ending();
                out.extend_from_slice(&end);
                self.scope.succeed(completion, prompt);
                self.done = true;
                Ok(true)
            }
            // A continuation ended and other choices wait for theirs.
            Over::Done => self.continue_stream(!out.is_empty()).await,
        }
    }

    /// Continues the answer's unfinished choices on another replica; a stream that cannot
    /// be resumed fails.
    async fn continue_stream(&mut self, pending: bool) -> Result<bool, ApiError> {
        let Some(r) = self.resume.as_mut() else {
            return Err(ApiError::BadGateway(
                "The replica failed while answering; the answer is incomplete".into(),
            ));
        };
        let routed = r.continue_next().await?;
        tracing::info!(replica = %routed.replica, "the stream continues on another replica");
        self.rest = routed.rest;
        self.guard = routed.guard;
        self.first = routed.first;
        Ok(pending)
    }

    fn timeout_error(&self) -> ApiError {
        match self.own_deadline {
            Some(d) if std::time::Instant::now() >= d => {
                ApiError::DeadlineExceeded { stage: "decode" }
            }
            _ => ApiError::Timeout(self.deadline),
        }
    }

    fn count_broken(&self) {
        self.metrics
            .broken_streams
            .with_label_values(&[self.guard.replica().url().as_str()])
            .inc();
    }

    /// Ends the answer after a failure: an SSE error event and `[DONE]`, or an aborted body.
    fn fail(&mut self, err: ApiError) -> Result<Bytes, std::io::Error> {
        if !matches!(err, ApiError::BadGateway(_)) {
            self.count_broken();
        }
        self.scope.fail(&err);
        self.done = true;
        if self.sse {
            Ok(sse::error_ending(&err))
        } else {
            Err(std::io::Error::other(err.to_string()))
        }
    }
}

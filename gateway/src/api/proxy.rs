//! Requests for models that remote replicas serve. The gateway has checked the body (every
//! check that needs no tokenizer, `validate::*_checked`), applied the tenant's rate limit and
//! the admission queue; here it picks a replica, sends the body unchanged, and passes the
//! answer back frame by frame as it arrives — an SSE stream is never buffered.
//!
//! Retries happen in `router::dispatch`, before the first byte. After it, a replica that fails
//! or a deadline that passes ends an SSE stream with an OpenAI error event and `[DONE]`; a
//! JSON answer cut short is cut short for the client too (the connection is aborted, so the
//! client sees an incomplete response rather than a well-formed lie). A client that leaves
//! drops the stream, which closes the connection to the replica, which aborts the generation
//! there.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::api::scope::RequestScope;
use crate::api::AppState;
use crate::error::ApiError;
use crate::metrics::RouterMetrics;
use crate::router::dispatch::ProxyRequest;
use crate::router::policy::Key;
use crate::router::replica::InFlightHere;
use crate::router::{affinity, Router};
use crate::tenants::Tenant;

/// The header that names the replica that answered.
pub static X_SLUICE_REPLICA: HeaderName = HeaderName::from_static("x-sluice-replica");
/// Requests with the same session id go to the same replica.
pub static X_SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");

/// What the API layer learned about a request to proxy.
#[derive(Debug)]
pub struct ProxyCall {
    pub path: &'static str,
    pub model: String,
    pub priority: i32,
    /// Tokens reserved from the tenant's budget: the prompt estimated at four bytes a token,
    /// plus what the request may generate. Not refunded (the answer is not parsed).
    pub reserve_tokens: u64,
    /// The prompt's leading text (or token bytes), for prefix affinity.
    pub affinity: Vec<u8>,
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

/// Rate limit, admission, routing; then the replica's answer as this request's response.
pub async fn generate(
    s: &Arc<AppState>,
    router: &Arc<Router>,
    tenant: &Arc<Tenant>,
    headers: &HeaderMap,
    body: Bytes,
    call: ProxyCall,
    mut scope: RequestScope,
) -> Response {
    match route(s, router, tenant, headers, body, &call, &mut scope).await {
        Ok(resp) => stream_answer(resp, scope, s),
        Err(e) => {
            scope.fail(&e);
            e.into_response()
        }
    }
}

async fn route(
    s: &Arc<AppState>,
    router: &Arc<Router>,
    tenant: &Arc<Tenant>,
    headers: &HeaderMap,
    body: Bytes,
    call: &ProxyCall,
    scope: &mut RequestScope,
) -> Result<crate::router::dispatch::Routed, ApiError> {
    if !router.serves(&call.model) {
        return Err(ApiError::ModelNotFound(call.model.clone()));
    }
    let reservation = s
        .limiter
        .check(tenant, call.reserve_tokens, std::time::Instant::now())
        .map_err(|e| ApiError::TooManyRequests {
            message: e.to_string(),
            retry_after: e.retry_after,
            reason: e.metric_label(),
        })?;
    // Nothing to refund: the reservation stands as the request's cost.
    drop(reservation);
    super::completions::admit(s, tenant, call.priority, scope).await?;
    let mut fwd = vec![
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
        (
            HeaderName::from_static("x-request-id"),
            HeaderValue::from_str(&scope.id).map_err(|_| ApiError::Internal)?,
        ),
    ];
    if let Some(a) = headers.get(header::ACCEPT) {
        fwd.push((header::ACCEPT, a.clone()));
    }
    let req = ProxyRequest {
        path: call.path,
        model: call.model.clone(),
        key: key(router, headers, &call.affinity),
        headers: fwd,
        body,
        deadline: s.limits.request_timeout.map(|d| Instant::now() + d),
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

fn stream_answer(
    routed: crate::router::dispatch::Routed,
    scope: RequestScope,
    s: &Arc<AppState>,
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
    let body = stream::unfold(state, |mut p| async move {
        if p.done {
            return None;
        }
        if let Some(first) = p.first.take() {
            p.scope.first_token();
            return Some((Ok(first), p));
        }
        let next = match p.until {
            Some(t) => tokio::time::timeout_at(t, p.rest.frame())
                .await
                .map_err(|_| ApiError::Timeout(p.deadline)),
            None => Ok(p.rest.frame().await),
        };
        match next {
            Ok(None) => {
                p.scope.ended(p.status);
                None
            }
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => Some((Ok(data), p)),
                // Trailers: nothing to pass on in an HTTP/1 body.
                Err(_) => Some((Ok(Bytes::new()), p)),
            },
            Ok(Some(Err(e))) => {
                tracing::warn!(replica = %p.guard.replica().url(), "answer broke mid-stream: {e}");
                p.guard.replica().failure();
                let err = ApiError::BadGateway(
                    "The replica failed while answering; the answer is incomplete".into(),
                );
                fail(p, err)
            }
            Err(timeout) => fail(p, timeout),
        }
    });
    resp.body(Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::Internal.into_response())
}

/// Ends the answer after a failure: an SSE error event and `[DONE]`, or an aborted body.
fn fail(mut p: Passing, err: ApiError) -> Option<(Result<Bytes, std::io::Error>, Passing)> {
    p.metrics
        .broken_streams
        .with_label_values(&[p.guard.replica().url().as_str()])
        .inc();
    p.scope.fail(&err);
    p.done = true;
    if p.sse {
        let json = serde_json::to_string(&err.body()).expect("error bodies serialise");
        let event = Bytes::from(format!("data: {json}\n\ndata: [DONE]\n\n"));
        Some((Ok(event), p))
    } else {
        Some((Err(std::io::Error::other(err.to_string())), p))
    }
}

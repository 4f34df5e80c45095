//! One request's way to a replica: bind (`super::queue`), send, and wait for the first byte of
//! the answer.
//! Until that byte is in hand nothing has reached the client, so a failed connect, a broken
//! exchange, a 502/503/429 or a timeout is retried on another replica — at most
//! `max_attempts` in all, after a jittered exponential backoff, never past the request's
//! deadline. Once the first byte is in hand the answer is committed to that replica and the
//! caller streams the rest (`crate::api::proxy`). A 400 refusing the prompt as too long is
//! retried the same way on a replica that takes longer prompts, while one is ready
//! (`super::bounds`).
//!
//! Every attempt is counted in `sluice_gateway_upstream_requests_total{replica,status}`;
//! failures feed the replica's outlier ejection (a 429 does not: the replica is full, not
//! broken).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, StatusCode};
use rand::Rng;
use tokio::time::Instant;

use crate::admission::AdmissionError;
use crate::router::bounds;
use crate::router::policy::Key;
use crate::router::queue::QueueClass;
use crate::router::remote::{RemoteError, ReplicaUrl};
use crate::router::replica::InFlightHere;
use crate::router::{NoPick, Router};

/// A request to route.
#[derive(Debug, Clone)]
pub struct ProxyRequest {
    pub path: &'static str,
    pub model: String,
    pub key: Option<Key>,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// The request's deadline, if it has one.
    pub deadline: Option<Instant>,
    /// A generation's place in its model's queue: it waits there for a replica with room.
    /// `None` (a tokenizer call) goes to a ready replica at once.
    pub class: Option<QueueClass>,
    /// The longest prompt's estimated tokens: only replicas that take it are picked
    /// (`super::bounds`). `None`: any replica.
    pub prompt_tokens: Option<usize>,
}

/// An answer committed to a replica: its head, the first body frame, and the rest to stream.
#[derive(Debug)]
pub struct Routed {
    pub replica: ReplicaUrl,
    pub head: hyper::http::response::Parts,
    pub first: Option<Bytes>,
    pub rest: Incoming,
    /// Holds the replica's in-flight count until the answer has been passed on.
    pub guard: InFlightHere,
    pub attempts: u32,
    /// The answer refuses the prompt as too long (`bounds::refused_as_too_long`) and no ready
    /// replica takes longer ones: the prompt's estimated tokens, at least one past the
    /// refusing replica's bound.
    pub refused_prompt_tokens: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("no replica serves the model '{0}'")]
    UnknownModel(String),
    #[error("no healthy replica serves the model '{0}' right now")]
    NoneHealthy(String),
    #[error("every replica serving '{0}' is at its concurrency limit")]
    AllAtCap(String),
    #[error("the request failed on {attempts} replica(s); last: {last}")]
    Failed {
        attempts: u32,
        #[source]
        last: RemoteError,
    },
    #[error("the request's deadline passed before a replica answered")]
    Deadline(Duration),
    /// Refused by the model's queue: full, shed, or no room in time.
    #[error("{0}")]
    Queue(AdmissionError),
    #[error("no replica serving '{model}' became ready within {:.1}s", waited.as_secs_f64())]
    HoldTimeout { model: String, waited: Duration },
    #[error("the request's deadline passed while it waited in the queue")]
    DeadlineInQueue,
}

impl RouteError {
    fn from_no_pick(n: NoPick, model: &str) -> Self {
        match n {
            NoPick::UnknownModel => Self::UnknownModel(model.to_string()),
            NoPick::NoneHealthy => Self::NoneHealthy(model.to_string()),
            NoPick::AllAtCap => Self::AllAtCap(model.to_string()),
        }
    }
}

/// Statuses another replica may answer better.
fn retryable(s: StatusCode) -> bool {
    matches!(
        s,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
    )
}

enum Attempt {
    Answer(Routed),
    /// Failed before the first byte; `counts` says whether it counts against the replica.
    Failed {
        err: RemoteError,
        counts: bool,
    },
}

impl Router {
    /// Routes `req`, retrying before the first byte; see the module doc. A request with a
    /// [`QueueClass`] first waits in its model's queue for a replica with room
    /// (`super::queue`); retries go to another ready replica at once.
    pub async fn dispatch(&self, req: &ProxyRequest) -> Result<Routed, RouteError> {
        let mut bound = match &req.class {
            Some(class) => Some(self.bind(req, class).await?),
            None => None,
        };
        let started = Instant::now();
        let mut tried: Vec<ReplicaUrl> = Vec::new();
        let mut last: Option<RemoteError> = None;
        let mut tokens = req.prompt_tokens;
        for attempt in 0..self.config().max_attempts {
            if attempt > 0 && !self.back_off(attempt, req.deadline).await {
                break;
            }
            let guard = match bound.take() {
                Some(g) => g,
                None => match self.pick(&req.model, req.key, &tried, tokens) {
                    Ok((replica, _)) => replica.begin(),
                    Err(n) => {
                        return Err(match last {
                            Some(last) => RouteError::Failed {
                                attempts: attempt,
                                last,
                            },
                            None => RouteError::from_no_pick(n, &req.model),
                        })
                    }
                },
            };
            match self.try_replica(req, guard, attempt).await {
                Ok(routed) => return Ok(routed),
                Err((url, err)) => {
                    if let RemoteError::Status {
                        status: StatusCode::BAD_REQUEST,
                        ..
                    } = err
                    {
                        // Refused as too long: the prompt is longer than that replica takes.
                        let past = self.past_bound_of(&url, &req.model);
                        tokens = past.max(tokens);
                    }
                    tried.push(url);
                    last = Some(err);
                }
            }
        }
        let deadline_passed = req.deadline.is_some_and(|d| Instant::now() >= d);
        match last {
            Some(RemoteError::Timeout { .. }) if deadline_passed => {
                Err(RouteError::Deadline(started.elapsed()))
            }
            Some(last) => Err(RouteError::Failed {
                attempts: tried.len() as u32,
                last,
            }),
            // Only with zero attempts configured, which validation refuses.
            None => Err(RouteError::Deadline(started.elapsed())),
        }
    }

    /// Waits before retry `attempt` (jittered, doubling); false when that would pass the
    /// deadline.
    async fn back_off(&self, attempt: u32, deadline: Option<Instant>) -> bool {
        let base = self
            .config()
            .backoff
            .saturating_mul(1 << (attempt - 1).min(10));
        let jitter = rand::rng().random_range(0.5..1.5);
        let wait = base.mul_f64(jitter);
        if deadline.is_some_and(|d| Instant::now() + wait >= d) {
            return false;
        }
        tokio::time::sleep(wait).await;
        self.metrics.retries.inc();
        true
    }

    /// One attempt on the replica `guard` counts `req` in flight on, bounded by the upstream
    /// timeout and the deadline; a failure is counted and fed to the replica's health.
    async fn try_replica(
        &self,
        req: &ProxyRequest,
        guard: InFlightHere,
        attempt: u32,
    ) -> Result<Routed, (ReplicaUrl, RemoteError)> {
        let cfg = self.config();
        let replica = guard.replica().clone();
        let url = replica.url().clone();
        let mut limit = cfg.upstream_timeout;
        if let Some(d) = req.deadline {
            limit = limit.min(d.saturating_duration_since(Instant::now()));
        }
        let final_attempt = attempt + 1 == cfg.max_attempts;
        let outcome =
            match tokio::time::timeout(limit, self.attempt(req, guard, final_attempt)).await {
                Ok(o) => o,
                Err(_) => Attempt::Failed {
                    err: RemoteError::Timeout {
                        url: url.clone(),
                        after: limit,
                    },
                    counts: true,
                },
            };
        match outcome {
            Attempt::Answer(mut routed) => {
                routed.attempts = attempt + 1;
                Ok(routed)
            }
            Attempt::Failed { err, counts } => {
                tracing::debug!(replica = %url, "attempt failed: {err}");
                if !matches!(err, RemoteError::Status { .. }) {
                    self.metrics
                        .upstream_requests
                        .with_label_values(&[url.as_str(), err.metric_label()])
                        .inc();
                }
                if counts {
                    replica.failure();
                }
                Err((url, err))
            }
        }
    }

    /// One attempt, up to the first body frame.
    async fn attempt(
        &self,
        req: &ProxyRequest,
        guard: InFlightHere,
        final_attempt: bool,
    ) -> Attempt {
        let replica = guard.replica().clone();
        let url = replica.url().clone();
        let resp = match replica
            .backend
            .send(Method::POST, req.path, &req.headers, req.body.clone())
            .await
        {
            Ok(r) => r,
            Err(err) => return Attempt::Failed { err, counts: true },
        };
        let status = resp.status();
        if retryable(status) && !final_attempt {
            self.metrics
                .upstream_requests
                .with_label_values(&[url.as_str(), status.as_str()])
                .inc();
            return Attempt::Failed {
                err: RemoteError::Status { url, status },
                counts: status != StatusCode::TOO_MANY_REQUESTS,
            };
        }
        let (head, mut body) = resp.into_parts();
        let first = loop {
            match body.frame().await {
                None => break None,
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) if d.is_empty() => continue,
                    Ok(d) => break Some(d),
                    // Trailers before any data: nothing to send first.
                    Err(_) => break None,
                },
                Some(Err(source)) => {
                    return Attempt::Failed {
                        err: RemoteError::Body { url, source },
                        counts: true,
                    }
                }
            }
        };
        self.metrics
            .upstream_requests
            .with_label_values(&[url.as_str(), status.as_str()])
            .inc();
        let too_long = bounds::refused_as_too_long(&head, first.as_ref());
        if too_long && !final_attempt && self.outreached(&req.model, &replica) {
            return Attempt::Failed {
                err: RemoteError::Status { url, status },
                counts: false,
            };
        }
        let refused_prompt_tokens = too_long.then(|| {
            let past = bounds::past_bound(&replica, &req.model);
            past.unwrap_or(0).max(req.prompt_tokens.unwrap_or(0))
        });
        if status.is_server_error() {
            replica.failure();
        } else if status != StatusCode::TOO_MANY_REQUESTS {
            replica.success();
        }
        Attempt::Answer(Routed {
            replica: url,
            head,
            first,
            rest: body,
            guard,
            attempts: 0,
            refused_prompt_tokens,
        })
    }
}

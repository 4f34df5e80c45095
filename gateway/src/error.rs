//! Every error the HTTP API returns, and the one place each becomes a status code and
//! OpenAI's `{"error": {"message", "type", "param", "code"}}` body. Messages are written for
//! API users: they give the offending field and the allowed range, never paths or panics.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use sluice_engine::{Field, Invalid, SubmitError};

use crate::admission::AdmissionError;
use crate::api::types::{ErrorBody, ErrorDetail};
use crate::rate_limit::RateLimited;
use crate::router::dispatch::RouteError;
use crate::router::remote::RemoteError;

/// The `Retry-After` of a 503.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, a wrong type, an out-of-range value, an unsupported field.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    #[error("{0}")]
    Unauthorized(String),
    #[error("The model '{0}' does not exist")]
    ModelNotFound(String),
    #[error("The request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// Queue full, rate limited, shed: come back later.
    #[error("{message}")]
    TooManyRequests {
        message: String,
        /// `None`: retrying cannot help (the request is larger than the whole allowance).
        retry_after: Option<Duration>,
        reason: &'static str,
    },
    /// Not ready yet, or draining.
    #[error("{0}")]
    Unavailable(String),
    #[error("The request did not finish within its deadline of {0:?}")]
    Timeout(Duration),
    /// Something failed inside; the detail goes to the log, not to the client.
    #[error("The server had an error while processing your request")]
    Internal,
    #[error("Not found")]
    RouteNotFound,
    #[error("Method not allowed")]
    MethodNotAllowed,
    #[error("The request body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// Replicas failed or could not be reached.
    #[error("{0}")]
    BadGateway(String),
    /// The request's own deadline (`X-Sluice-Deadline-Ms` or the tenant's default) passed;
    /// `stage` is `queue`, `prefill` or `decode`.
    #[error("The request's deadline passed in the {stage} stage")]
    DeadlineExceeded { stage: &'static str },
}

impl ApiError {
    pub fn bad(message: impl Into<String>, param: impl Into<String>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::ModelNotFound(_) | Self::RouteNotFound => StatusCode::NOT_FOUND,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Self::DeadlineExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Why a request was refused, for `sluice_gateway_rejections_total{reason}`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::BadRequest { code: Some(c), .. } => c,
            Self::BadRequest { .. } => "invalid_request",
            Self::Unauthorized(_) => "unauthorized",
            Self::ModelNotFound(_) => "model_not_found",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::TooManyRequests { reason, .. } => reason,
            Self::Unavailable(_) => "unavailable",
            Self::Timeout(_) => "timeout",
            Self::Internal => "internal",
            Self::RouteNotFound => "route_not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::BodyTimeout(_) => "body_timeout",
            Self::BadGateway(_) => "upstream_failed",
            Self::DeadlineExceeded { .. } => "deadline_exceeded",
        }
    }

    /// The OpenAI error body.
    pub fn body(&self) -> ErrorBody {
        let (kind, param, code): (&'static str, Option<String>, Option<String>) = match self {
            Self::BadRequest { param, code, .. } => (
                "invalid_request_error",
                param.clone(),
                code.map(str::to_string),
            ),
            Self::Unauthorized(_) => (
                "invalid_request_error",
                None,
                Some("invalid_api_key".into()),
            ),
            Self::ModelNotFound(_) => (
                "invalid_request_error",
                Some("model".into()),
                Some("model_not_found".into()),
            ),
            Self::PayloadTooLarge { .. } => ("invalid_request_error", None, None),
            Self::TooManyRequests { reason, .. } => {
                ("rate_limit_error", None, Some((*reason).to_string()))
            }
            Self::Unavailable(_) => ("service_unavailable", None, None),
            Self::Timeout(_) => ("timeout", None, None),
            Self::Internal => ("internal_error", None, None),
            Self::BadGateway(_) => ("upstream_error", None, None),
            Self::DeadlineExceeded { .. } => {
                ("timeout_error", None, Some("deadline_exceeded".into()))
            }
            Self::RouteNotFound | Self::MethodNotAllowed | Self::BodyTimeout(_) => {
                ("invalid_request_error", None, None)
            }
        };
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind,
                param,
                code,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), Json(self.body())).into_response();
        // A 503 is temporary by definition (loading, draining, a pool scaling from zero).
        let retry_after = match &self {
            Self::TooManyRequests { retry_after, .. } => *retry_after,
            Self::Unavailable(_) => Some(UNAVAILABLE_RETRY_AFTER),
            _ => None,
        };
        if let Some(retry_after) = retry_after {
            let secs = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            resp.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&secs.to_string()).expect("digits are a valid header"),
            );
        }
        resp
    }
}

/// Routing failures: no replica for the model, none healthy or free, or every attempt failed
/// before the first byte.
impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::UnknownModel(m) => ApiError::ModelNotFound(m),
            RouteError::NoneHealthy(_) => ApiError::Unavailable(format!("{e}; retry shortly")),
            RouteError::AllAtCap(_) => ApiError::TooManyRequests {
                message: e.to_string(),
                retry_after: Some(Duration::from_secs(1)),
                reason: "replicas_at_capacity",
            },
            RouteError::Deadline(after) => ApiError::Timeout(after),
            RouteError::Queue(e) => e.into(),
            RouteError::HoldTimeout { .. } => {
                ApiError::Unavailable(format!("The model is scaling up: {e}; retry shortly"))
            }
            RouteError::DeadlineInQueue => ApiError::DeadlineExceeded { stage: "queue" },
            RouteError::Failed {
                last: RemoteError::Timeout { after, .. },
                ..
            } => ApiError::Timeout(after),
            // A too-long refusal whose retry on a replica taking longer prompts found none
            // free in time (`router::bounds`): the refusal stands.
            RouteError::Failed {
                last:
                    RemoteError::Status {
                        status: StatusCode::BAD_REQUEST,
                        ..
                    },
                ..
            } => ApiError::BadRequest {
                message: "the prompt is longer than the replica it reached takes (its \
                          --max-prompt-tokens or context), and none that takes longer prompts \
                          was free in time. Please reduce the length of the prompt, or retry."
                    .into(),
                param: None,
                code: Some("context_length_exceeded"),
            },
            RouteError::Failed { attempts, .. } => {
                tracing::warn!("{e}");
                ApiError::BadGateway(format!(
                    "The request failed on {attempts} replica(s) before any answer; retry later"
                ))
            }
        }
    }
}

/// The tenant's rate limit: come back when the bucket has refilled.
impl From<RateLimited> for ApiError {
    fn from(e: RateLimited) -> Self {
        ApiError::TooManyRequests {
            message: e.to_string(),
            retry_after: e.retry_after,
            reason: e.metric_label(),
        }
    }
}

/// The admission queue's refusals.
impl From<AdmissionError> for ApiError {
    fn from(e: AdmissionError) -> Self {
        ApiError::TooManyRequests {
            message: e.to_string(),
            retry_after: Some(e.retry_after().unwrap_or(Duration::from_secs(1))),
            reason: e.metric_label(),
        }
    }
}

/// The OpenAI names of the request fields whose name depends on the endpoint: the prompt
/// (`messages` or `prompt`) and the log-probability count (`top_logprobs` or `logprobs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub prompt: &'static str,
    pub logprobs: &'static str,
}

impl Params {
    /// The OpenAI parameter an engine field is sent as.
    pub fn name(&self, field: Field) -> &'static str {
        match field {
            Field::Prompt => self.prompt,
            Field::Logprobs => self.logprobs,
            f => f.name(),
        }
    }

    /// An engine range error, naming the OpenAI parameter.
    pub fn invalid(&self, e: &Invalid) -> ApiError {
        let param = self.name(e.field());
        let message = match e.value() {
            "" => format!("'{param}' {}", e.rule()),
            v => format!("{v} is not a valid value for '{param}': it {}", e.rule()),
        };
        ApiError::bad(message, param)
    }

    /// The engine's refusals of a prompt echoed alone (`max_tokens: 0`): the one token the
    /// engine runs, and the answer drops, needs its place in the context too.
    pub fn prompt_only_error(&self, e: SubmitError) -> ApiError {
        match e {
            SubmitError::ContextLength {
                max_model_len,
                prompt_tokens,
                ..
            } => ApiError::BadRequest {
                message: format!(
                    "this model's maximum context length is {max_model_len} tokens; a prompt \
                     echoed alone (max_tokens 0) may have {} at most (one more token runs and \
                     is dropped), and this one has {prompt_tokens}. Please reduce the length \
                     of the prompt.",
                    max_model_len.saturating_sub(1)
                ),
                param: Some(self.prompt.to_string()),
                code: Some("context_length_exceeded"),
            },
            e => self.submit_error(e),
        }
    }

    /// The engine's refusals at submission.
    pub fn submit_error(&self, e: SubmitError) -> ApiError {
        match e {
            SubmitError::ContextLength { .. } => ApiError::BadRequest {
                message: format!("{e}. Please reduce the length of the prompt or of max_tokens."),
                param: Some(self.prompt.to_string()),
                code: Some("context_length_exceeded"),
            },
            SubmitError::QueueFull { .. } => ApiError::TooManyRequests {
                message: e.to_string(),
                retry_after: Some(Duration::from_secs(1)),
                reason: "queue_full",
            },
            SubmitError::ShuttingDown => ApiError::Unavailable(
                "The server is shutting down; retry on another replica".into(),
            ),
            SubmitError::InvalidRequest(invalid) => self.invalid(&invalid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A too-long refusal whose retry found no replica reads as the refusal, not as a failed
    /// exchange.
    #[test]
    fn a_refusal_left_without_a_retry_stays_a_refusal() {
        let url = crate::router::remote::ReplicaUrl::parse("http://127.0.0.1:9").unwrap();
        let status = |status| {
            ApiError::from(RouteError::Failed {
                attempts: 1,
                last: RemoteError::Status {
                    url: url.clone(),
                    status,
                },
            })
        };
        let refused = status(StatusCode::BAD_REQUEST);
        assert!(
            matches!(
                refused,
                ApiError::BadRequest {
                    code: Some("context_length_exceeded"),
                    ..
                }
            ),
            "{refused:?}"
        );
        assert_eq!(
            status(StatusCode::BAD_GATEWAY).status(),
            StatusCode::BAD_GATEWAY
        );
    }

    #[test]
    fn every_error_has_the_openai_shape_and_a_status() {
        let cases = [
            (
                ApiError::bad("temperature 3 is not in 0..2", "temperature"),
                400,
            ),
            (
                ApiError::Unauthorized("Incorrect API key provided".into()),
                401,
            ),
            (ApiError::ModelNotFound("gpt-9".into()), 404),
            (ApiError::PayloadTooLarge { limit: 10 }, 413),
            (
                ApiError::TooManyRequests {
                    message: "queue full".into(),
                    retry_after: Some(Duration::from_millis(1500)),
                    reason: "queue_full",
                },
                429,
            ),
            (ApiError::Unavailable("draining".into()), 503),
            (ApiError::Internal, 500),
            (ApiError::BadGateway("replicas failed".into()), 502),
        ];
        for (e, status) in cases {
            assert_eq!(e.status().as_u16(), status);
            let v = serde_json::to_value(e.body()).unwrap();
            let err = &v["error"];
            assert!(err["message"].is_string() && err["type"].is_string(), "{v}");
            assert!(
                err.get("param").is_some() && err.get("code").is_some(),
                "{v}"
            );
        }
        let resp = ApiError::TooManyRequests {
            message: "x".into(),
            retry_after: Some(Duration::from_millis(1500)),
            reason: "queue_full",
        }
        .into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn engine_range_errors_name_the_openai_parameter() {
        let chat = Params {
            prompt: "messages",
            logprobs: "top_logprobs",
        };
        let text = Params {
            prompt: "prompt",
            logprobs: "logprobs",
        };
        let too_many = sluice_engine::SamplingParams {
            logprobs: Some(21),
            ..Default::default()
        };
        let e = too_many.check(None).unwrap_err();
        assert_eq!(e.field(), Field::Logprobs);
        for (params, name) in [(chat, "top_logprobs"), (text, "logprobs")] {
            let ApiError::BadRequest { message, param, .. } = params.invalid(&e) else {
                panic!("not a 400");
            };
            assert_eq!(param.as_deref(), Some(name));
            assert!(message.contains(&format!("'{name}'")), "{message}");
        }
        let hot = sluice_engine::SamplingParams {
            temperature: 2.5,
            ..Default::default()
        };
        let ApiError::BadRequest { message, param, .. } =
            chat.invalid(&hot.check(None).unwrap_err())
        else {
            panic!("not a 400");
        };
        assert_eq!(param.as_deref(), Some("temperature"));
        assert_eq!(
            message,
            "2.5 is not a valid value for 'temperature': it must be in [0, 2]"
        );
    }
}

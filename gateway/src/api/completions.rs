//! The generation endpoints: a request for the model served in this process goes through
//! validation, rate limit, admission and the local engine; a request for any other model is
//! checked as far as the gateway can without its tokenizer and handed to [`super::proxy`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use sluice_engine::Request as EngineRequest;

use super::generate::{self, Generation, Kind};
use super::scope::RequestScope;
use super::types::*;
use super::{parse_json, proxy, read_body, validate, AppState, RequestId};
use crate::admission::AdmissionError;
use crate::backend::Backend;
use crate::error::{from_submit, ApiError};
use crate::tenants::Tenant;

fn scope(s: &AppState, tenant: &Tenant, id: &RequestId, route: &'static str) -> RequestScope {
    RequestScope::new(
        id.0.clone(),
        tenant.name.clone(),
        route,
        Instant::now(),
        s.metrics.clone(),
        s.in_flight.enter(),
    )
}

/// Rate limit, admission and submission for a prepared request.
async fn start(
    s: &Arc<AppState>,
    backend: &Arc<dyn Backend>,
    tenant: &Arc<Tenant>,
    prepared: validate::Prepared,
    scope: &mut RequestScope,
    prompt_param: &str,
) -> Result<Vec<sluice_engine::EventStream>, ApiError> {
    let max_len = backend.max_model_len();
    // Fail on context length before spending any of the tenant's budget.
    for p in &prepared.prompts {
        let max = prepared
            .sampling
            .max_tokens
            .unwrap_or(max_len.saturating_sub(p.len()));
        if p.len() >= max_len || p.len() + max > max_len {
            return Err(from_submit(
                sluice_engine::SubmitError::ContextLength {
                    max_model_len: max_len,
                    prompt_tokens: p.len(),
                    max_tokens: max.max(1),
                },
                prompt_param,
            ));
        }
    }
    let n = prepared.sampling.n;
    let reserve: usize = prepared
        .prompts
        .iter()
        .map(|p| p.len() + n * prepared.sampling.max_tokens.unwrap_or(max_len - p.len()))
        .sum();
    let reservation = s
        .limiter
        .check(tenant, reserve as u64, std::time::Instant::now())
        .map_err(|e| ApiError::TooManyRequests {
            message: e.to_string(),
            retry_after: e.retry_after,
            reason: e.metric_label(),
        })?;
    let prompt_tokens: usize = prepared.prompts.iter().map(Vec::len).sum();
    scope.on_done(Box::new(move |completion| {
        let used = prompt_tokens + completion;
        reservation.refund(
            reserve.saturating_sub(used) as u64,
            std::time::Instant::now(),
        );
    }));
    admit(s, tenant, prepared.priority, scope).await?;
    let mut streams = Vec::with_capacity(prepared.prompts.len());
    for prompt in prepared.prompts {
        let req = EngineRequest {
            prompt,
            sampling: prepared.sampling.clone(),
            priority: prepared.priority,
        };
        streams.push(
            backend
                .submit(req)
                .map_err(|e| from_submit(e, prompt_param))?,
        );
    }
    Ok(streams)
}

/// Waits in the admission queue; the permit is held until the request's scope ends.
pub(super) async fn admit(
    s: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    priority: i32,
    scope: &mut RequestScope,
) -> Result<(), ApiError> {
    let priority_label = priority.to_string();
    s.metrics
        .queue_depth
        .with_label_values(&[&priority_label])
        .inc();
    let admitted = s.admission.admit(tenant, priority).await;
    s.metrics
        .queue_depth
        .with_label_values(&[&priority_label])
        .dec();
    let permit = admitted.map_err(|e: AdmissionError| ApiError::TooManyRequests {
        message: e.to_string(),
        retry_after: Some(match &e {
            AdmissionError::QueueFull { retry_after } => *retry_after,
            _ => Duration::from_secs(1),
        }),
        reason: e.metric_label(),
    })?;
    s.metrics
        .queue_wait
        .with_label_values(&[&priority_label])
        .observe(permit.waited().as_secs_f64());
    scope.on_done(Box::new(move |_| drop(permit)));
    Ok(())
}

/// A parsed generation request.
enum Parsed {
    Chat(Box<ChatCompletionRequest>),
    Completion(Box<CompletionRequest>),
}

impl Parsed {
    fn model(&self) -> &str {
        match self {
            Parsed::Chat(r) => &r.model,
            Parsed::Completion(r) => &r.model,
        }
    }
}

async fn generation(
    s: Arc<AppState>,
    kind: Kind,
    tenant: Arc<Tenant>,
    id: RequestId,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let route = match kind {
        Kind::Chat => "/v1/chat/completions",
        Kind::Completion => "/v1/completions",
    };
    let mut scope = scope(&s, &tenant, &id, route);
    let parsed = match parse_generation(&s, kind, &headers, body).await {
        Ok(p) => p,
        Err(e) => {
            scope.fail(&e);
            return e.into_response();
        }
    };
    if !s.is_local(parsed.1.model()) {
        if let Some(router) = s.router.clone() {
            return match proxy_call(&s, route, &parsed.1, &scope) {
                Ok(call) => {
                    proxy::generate(&s, &router, &tenant, &headers, parsed.0, call, scope).await
                }
                Err(e) => {
                    scope.fail(&e);
                    e.into_response()
                }
            };
        }
    }
    match prepare_and_start(&s, parsed.1, &tenant, &mut scope).await {
        Ok((streams, prepared_stream, n, logprobs, include_usage, backend)) => {
            let g = Generation {
                kind,
                id: match kind {
                    Kind::Chat => format!("chatcmpl-{}", id.0),
                    Kind::Completion => format!("cmpl-{}", id.0),
                },
                created: generate::unix_now(),
                model: s.served_model.clone().unwrap_or_default(),
                streams,
                n,
                logprobs,
                include_usage,
                deadline: s.limits.request_timeout,
                tokenizer: backend.model().clone(),
                scope,
            };
            if prepared_stream {
                generate::stream(g)
            } else {
                match generate::respond(g).await {
                    Ok(r) => r,
                    Err(e) => e.into_response(),
                }
            }
        }
        Err(e) => {
            scope.fail(&e);
            e.into_response()
        }
    }
}

/// The body, read and parsed (refused while draining, before it is read).
async fn parse_generation(
    s: &AppState,
    kind: Kind,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Parsed), ApiError> {
    s.check_draining()?;
    let bytes = read_body(s, headers, body).await?;
    let parsed = match kind {
        Kind::Chat => Parsed::Chat(Box::new(parse_json(&bytes)?)),
        Kind::Completion => Parsed::Completion(Box::new(parse_json(&bytes)?)),
    };
    Ok((bytes, parsed))
}

/// Checks a request for a remote model as far as the gateway can without its tokenizer.
fn proxy_call(
    s: &AppState,
    route: &'static str,
    parsed: &Parsed,
    scope: &RequestScope,
) -> Result<proxy::ProxyCall, ApiError> {
    let (checked, affinity, prompt_bytes, model) = match parsed {
        Parsed::Chat(req) => {
            if s.log_prompts {
                tracing::info!(request_id = %scope.id, messages = ?req.messages, "prompt");
            }
            let (checked, messages) = validate::chat_checked(req, None)?;
            let text = crate::router::affinity::chat_text(
                messages
                    .iter()
                    .map(|m| (m.role.as_str(), m.content.as_str())),
            );
            let len = text.len();
            (checked, text, len, &req.model)
        }
        Parsed::Completion(req) => {
            if s.log_prompts {
                tracing::info!(request_id = %scope.id, prompt = ?req.prompt, "prompt");
            }
            let checked = validate::completion_checked(req, None)?;
            let (affinity, len) = match &req.prompt {
                PromptSpec::Text(t) => (t.as_bytes().to_vec(), t.len()),
                PromptSpec::Texts(ts) => (
                    ts.first()
                        .map(|t| t.as_bytes().to_vec())
                        .unwrap_or_default(),
                    ts.iter().map(String::len).sum(),
                ),
                // Token ids count four bytes each: one token.
                PromptSpec::Tokens(t) => (crate::router::affinity::token_bytes(t), t.len() * 4),
                PromptSpec::TokenLists(ls) => (
                    ls.first()
                        .map(|l| crate::router::affinity::token_bytes(l))
                        .unwrap_or_default(),
                    ls.iter().map(|l| l.len() * 4).sum(),
                ),
            };
            (checked, affinity, len, &req.model)
        }
    };
    let prompts = match parsed {
        Parsed::Completion(r) => match &r.prompt {
            PromptSpec::Texts(ts) => ts.len(),
            PromptSpec::TokenLists(ls) => ls.len(),
            _ => 1,
        },
        Parsed::Chat(_) => 1,
    };
    let generated = checked.sampling.max_tokens.unwrap_or(0) * checked.sampling.n * prompts;
    Ok(proxy::ProxyCall {
        path: route,
        model: model.clone(),
        priority: checked.priority,
        reserve_tokens: (prompt_bytes.div_ceil(4) + generated) as u64,
        affinity,
    })
}

type Started = (
    Vec<sluice_engine::EventStream>,
    bool,
    usize,
    bool,
    bool,
    Arc<dyn Backend>,
);

async fn prepare_and_start(
    s: &Arc<AppState>,
    parsed: Parsed,
    tenant: &Arc<Tenant>,
    scope: &mut RequestScope,
) -> Result<Started, ApiError> {
    check_model(s, parsed.model())?;
    let backend = s.backend()?.clone();
    let model = backend.model().clone();
    let (prepared, param, logprobs) = match parsed {
        Parsed::Chat(req) => {
            if s.log_prompts {
                tracing::info!(request_id = %scope.id, messages = ?req.messages, "prompt");
            }
            let p = validate::chat(&req, &model)?;
            let lp = p.sampling.logprobs.is_some();
            (p, "messages", lp)
        }
        Parsed::Completion(req) => {
            if s.log_prompts {
                tracing::info!(request_id = %scope.id, prompt = ?req.prompt, "prompt");
            }
            let p = validate::completion(&req, &model)?;
            let lp = p.sampling.logprobs.is_some();
            (p, "prompt", lp)
        }
    };
    let (stream, n, include_usage) = (prepared.stream, prepared.sampling.n, prepared.include_usage);
    let streams = start(s, &backend, tenant, prepared, scope, param).await?;
    Ok((streams, stream, n, logprobs, include_usage, backend))
}

/// The model is served in this process.
pub(super) fn check_model(s: &AppState, model: &str) -> Result<(), ApiError> {
    if s.is_local(model) {
        Ok(())
    } else {
        Err(ApiError::ModelNotFound(model.to_string()))
    }
}

/// Creates a chat completion (OpenAI's schema; SSE when `stream` is true).
#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatCompletionRequest,
    responses((status = 200, body = ChatCompletion), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 429, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub(super) async fn chat_completions(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generation(s, Kind::Chat, tenant, id, headers, body).await
}

/// Creates a text completion (OpenAI's legacy schema; SSE when `stream` is true).
#[utoipa::path(post, path = "/v1/completions", request_body = CompletionRequest,
    responses((status = 200, body = Completion), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 413, body = ErrorBody), (status = 429, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
pub(super) async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generation(s, Kind::Completion, tenant, id, headers, body).await
}

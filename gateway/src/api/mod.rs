//! The HTTP API: OpenAI's endpoints plus tokenize/detokenize, health, readiness, metrics and
//! the OpenAPI document. [`app`] builds the router so tests can drive it with
//! `tower::ServiceExt::oneshot`; `crate::server` puts it on a socket.

pub mod generate;
pub mod scope;
pub mod types;
pub mod validate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use prometheus::{Encoder, Registry, TextEncoder};
use serde::de::DeserializeOwned;
use sluice_engine::Request as EngineRequest;
use utoipa::OpenApi;

use crate::admission::{Admission, AdmissionError};
use crate::backend::Backend;
use crate::error::{from_submit, ApiError};
use crate::metrics::GatewayMetrics;
use crate::rate_limit::RateLimiter;
use crate::tenants::{Tenant, Tenants};
use generate::{Generation, Kind};
use scope::{InFlight, RequestScope};
use types::*;

/// Limits applied to every request.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub max_body_bytes: usize,
    /// Time allowed to receive the body once headers are in.
    pub body_timeout: Duration,
    /// Total time allowed for a generation, if any.
    pub request_timeout: Option<Duration>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 4 << 20,
            body_timeout: Duration::from_secs(30),
            request_timeout: None,
        }
    }
}

/// Shared by every handler.
#[derive(Debug)]
pub struct AppState {
    /// Set once the model has loaded; until then generation answers 503.
    pub backend: OnceLock<Arc<dyn Backend>>,
    pub served_model: String,
    pub tenants: Tenants,
    pub limiter: RateLimiter,
    pub admission: Admission,
    pub metrics: GatewayMetrics,
    pub registry: Registry,
    pub draining: AtomicBool,
    pub in_flight: Arc<InFlight>,
    pub limits: HttpLimits,
    pub log_prompts: bool,
}

impl AppState {
    pub fn is_ready(&self) -> bool {
        self.backend.get().is_some() && !self.draining.load(Ordering::Acquire)
    }

    fn backend(&self) -> Result<&Arc<dyn Backend>, ApiError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::Unavailable(
                "The server is draining; retry on another replica".into(),
            ));
        }
        self.backend.get().ok_or_else(|| {
            ApiError::Unavailable("The model is still loading; retry shortly".into())
        })
    }
}

/// The request id: the caller's `x-request-id`, or a new one.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

#[derive(OpenApi)]
#[openapi(
    info(title = "sluice", description = "OpenAI-compatible inference gateway"),
    paths(
        chat_completions,
        completions,
        list_models,
        get_model,
        tokenize,
        detokenize,
        health,
        ready
    ),
    components(schemas(ErrorBody, ErrorDetail))
)]
struct ApiDoc;

/// The OpenAPI document of this API.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

pub fn app(state: Arc<AppState>) -> Router {
    let authed = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .merge(authed)
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

async fn request_id(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_string)
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
    req.extensions_mut().insert(RequestId(id.clone()));
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(X_REQUEST_ID.clone(), v);
    }
    resp
}

async fn authenticate(State(s): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match s.tenants.authenticate(header) {
        Ok(t) => {
            req.extensions_mut().insert(t);
            next.run(req).await
        }
        Err(e) => {
            s.metrics
                .rejections
                .with_label_values(&[e.metric_label()])
                .inc();
            ApiError::Unauthorized(e.to_string()).into_response()
        }
    }
}

/// Reads a body within the size and time limits and parses it, naming the field of a type
/// error.
async fn parse_body<T: DeserializeOwned>(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let limit = s.limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let bytes: Bytes = match tokio::time::timeout(
        s.limits.body_timeout,
        axum::body::to_bytes(body, limit),
    )
    .await
    {
        Err(_) => return Err(ApiError::BodyTimeout(s.limits.body_timeout)),
        Ok(Err(e)) => {
            // `to_bytes` reports the limit as an error whose source is `LengthLimitError`.
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return Err(if too_large {
                ApiError::PayloadTooLarge { limit }
            } else {
                ApiError::bad("The request body could not be read", "body")
            });
        }
        Ok(Ok(b)) => b,
    };
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let syntax = inner.is_syntax() || inner.is_eof();
        // serde_path_to_error writes "." for the root and "?" where the path is unknown.
        let param = (!syntax && path != "." && path != "?").then_some(path);
        let message = match (&param, syntax) {
            (_, true) => format!("The request body is not valid JSON: {inner}"),
            (Some(p), _) => format!("Invalid value for '{p}': {inner}"),
            (None, _) => format!("Invalid request body: {inner}"),
        };
        ApiError::BadRequest {
            message,
            param,
            code: None,
        }
    })
}

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
    let priority_label = prepared.priority.to_string();
    s.metrics
        .queue_depth
        .with_label_values(&[&priority_label])
        .inc();
    let admitted = s.admission.admit(tenant, prepared.priority).await;
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
    match prepare_and_start(&s, kind, &tenant, &headers, body, &mut scope).await {
        Ok((streams, prepared_stream, n, logprobs, include_usage, backend)) => {
            let g = Generation {
                kind,
                id: match kind {
                    Kind::Chat => format!("chatcmpl-{}", id.0),
                    Kind::Completion => format!("cmpl-{}", id.0),
                },
                created: generate::unix_now(),
                model: s.served_model.clone(),
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
    kind: Kind,
    tenant: &Arc<Tenant>,
    headers: &HeaderMap,
    body: Body,
    scope: &mut RequestScope,
) -> Result<Started, ApiError> {
    let backend = s.backend()?.clone();
    let model = backend.model().clone();
    let (prepared, param, logprobs) = match kind {
        Kind::Chat => {
            let req: ChatCompletionRequest = parse_body(s, headers, body).await?;
            check_model(s, &req.model)?;
            if s.log_prompts {
                tracing::info!(request_id = %scope.id, messages = ?req.messages, "prompt");
            }
            let p = validate::chat(&req, &model)?;
            let lp = p.sampling.logprobs.is_some();
            (p, "messages", lp)
        }
        Kind::Completion => {
            let req: CompletionRequest = parse_body(s, headers, body).await?;
            check_model(s, &req.model)?;
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

fn check_model(s: &AppState, model: &str) -> Result<(), ApiError> {
    if model == s.served_model {
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
async fn chat_completions(
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
async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Arc<Tenant>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generation(s, Kind::Completion, tenant, id, headers, body).await
}

fn model_card(s: &AppState) -> ModelCard {
    ModelCard {
        id: s.served_model.clone(),
        object: "model",
        created: 0,
        owned_by: "sluice",
        max_model_len: s.backend.get().map_or(0, |b| b.max_model_len()),
    }
}

/// Lists the served models.
#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList)))]
async fn list_models(State(s): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![model_card(&s)],
    })
}

/// One served model.
#[utoipa::path(get, path = "/v1/models/{id}", params(("id" = String, Path)),
    responses((status = 200, body = ModelCard), (status = 404, body = ErrorBody)))]
async fn get_model(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    check_model(&s, &id)?;
    Ok(Json(model_card(&s)))
}

/// Tokenises a prompt (as completions would) or chat messages (as chat would).
#[utoipa::path(post, path = "/tokenize", request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeResponse), (status = 400, body = ErrorBody)))]
async fn tokenize(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let backend = s.backend()?.clone();
    let req: TokenizeRequest = parse_body(&s, &headers, body).await?;
    if let Some(m) = &req.model {
        check_model(&s, m)?;
    }
    let model = backend.model();
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => {
            let tok = model.tokenizer();
            let mut ids: Vec<u32> = if tok.add_bos() {
                tok.bos_id().into_iter().collect()
            } else {
                Vec::new()
            };
            ids.extend(tok.encode(p, false).map_err(|_| ApiError::Internal)?);
            ids
        }
        (None, Some(msgs)) => {
            let m = validate::chat_messages(msgs)?;
            validate::chat_prompt(model, &m, req.add_generation_prompt.unwrap_or(true))?
        }
        _ => {
            return Err(ApiError::bad(
                "give exactly one of 'prompt' or 'messages'",
                "prompt",
            ))
        }
    };
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len: backend.max_model_len(),
    }))
}

/// Turns token ids back into text.
#[utoipa::path(post, path = "/detokenize", request_body = DetokenizeRequest,
    responses((status = 200, body = DetokenizeResponse), (status = 400, body = ErrorBody)))]
async fn detokenize(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let backend = s.backend()?.clone();
    let req: DetokenizeRequest = parse_body(&s, &headers, body).await?;
    if let Some(m) = &req.model {
        check_model(&s, m)?;
    }
    let vocab = backend.model().config().vocab_size;
    let ids = req
        .tokens
        .iter()
        .map(|&t| {
            u32::try_from(t)
                .ok()
                .filter(|&t| (t as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::bad(
                        format!("token id {t} is outside the vocabulary (0..{vocab})"),
                        "tokens",
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let prompt = backend
        .model()
        .tokenizer()
        .decode(&ids, false)
        .map_err(|_| ApiError::Internal)?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/health", responses((status = 200)))]
async fn health() -> StatusCode {
    StatusCode::OK
}

/// Readiness: the model is loaded and the server is not draining.
#[utoipa::path(get, path = "/ready", responses((status = 200), (status = 503, body = ErrorBody)))]
async fn ready(State(s): State<Arc<AppState>>) -> Response {
    if s.is_ready() {
        StatusCode::OK.into_response()
    } else if s.draining.load(Ordering::Acquire) {
        ApiError::Unavailable("draining".into()).into_response()
    } else {
        ApiError::Unavailable("the model is loading".into()).into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&s.registry.gather(), &mut buf) {
        tracing::error!("encoding metrics: {e}");
        return ApiError::Internal.into_response();
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], buf).into_response()
}

/// The OpenAPI document, with `model` constrained to the id this server serves.
async fn openapi_json(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let mut doc = serde_json::to_value(openapi()).expect("the OpenAPI document serialises");
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|v| v.as_object_mut())
    {
        for name in [
            "ChatCompletionRequest",
            "CompletionRequest",
            "TokenizeRequest",
            "DetokenizeRequest",
        ] {
            if let Some(model) = schemas
                .get_mut(name)
                .and_then(|v| v.pointer_mut("/properties/model"))
                .and_then(|v| v.as_object_mut())
            {
                model.insert("enum".into(), serde_json::json!([s.served_model]));
            }
        }
    }
    Json(doc)
}

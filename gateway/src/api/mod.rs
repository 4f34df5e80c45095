//! The HTTP API: OpenAI's endpoints plus tokenize/detokenize, health, readiness, metrics and
//! the OpenAPI document. [`app`] builds the router so tests can drive it with
//! `tower::ServiceExt::oneshot`; `crate::server` puts it on a socket.

mod completions;
pub mod generate;
pub mod proxy;
pub mod scope;
mod tokens;
pub mod types;
pub mod validate;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus::{Encoder, Registry, TextEncoder};
use serde::de::DeserializeOwned;
use utoipa::OpenApi;

use crate::admission::Admission;
use crate::backend::Backend;
use crate::error::ApiError;
use crate::metrics::GatewayMetrics;
use crate::rate_limit::RateLimiter;
use crate::router::Router as ReplicaRouter;
use crate::tenants::Tenants;
use scope::InFlight;
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
    /// Set once the local model has loaded; until then its requests answer 503.
    pub backend: OnceLock<Arc<dyn Backend>>,
    /// The id of the model served in this process, if any (`--model`).
    pub served_model: Option<String>,
    /// Remote replicas, when `--upstream`/`--discover` are given. A request for the local
    /// model runs here; any other model is routed.
    pub router: Option<Arc<ReplicaRouter>>,
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
    /// Ready when not draining and something can generate: the local model has loaded, or a
    /// replica is healthy.
    pub fn is_ready(&self) -> bool {
        !self.draining.load(Ordering::Acquire)
            && (self.backend.get().is_some()
                || self.router.as_ref().is_some_and(|r| r.any_eligible()))
    }

    fn is_local(&self, model: &str) -> bool {
        self.served_model.as_deref() == Some(model)
    }

    /// Every model served, here and by replicas, with its context length when known.
    fn all_models(&self) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        if let Some(m) = &self.served_model {
            out.push((
                m.clone(),
                self.backend.get().map_or(0, |b| b.max_model_len()),
            ));
        }
        for m in self.router.iter().flat_map(|r| r.models()) {
            if !out.iter().any(|(id, _)| *id == m.id) {
                out.push((m.id, m.max_model_len.unwrap_or(0)));
            }
        }
        out
    }

    fn check_draining(&self) -> Result<(), ApiError> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ApiError::Unavailable(
                "The server is draining; retry on another replica".into(),
            ));
        }
        Ok(())
    }

    fn backend(&self) -> Result<&Arc<dyn Backend>, ApiError> {
        self.check_draining()?;
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
        completions::chat_completions,
        completions::completions,
        list_models,
        get_model,
        tokens::tokenize,
        tokens::detokenize,
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

/// Liveness: 200 while the process serves HTTP (the model may still be loading).
pub const HEALTH_PATH: &str = "/health";
/// Readiness: 200 once the model is loaded (routing only: once a replica is healthy); 503
/// before that and while draining.
pub const READY_PATH: &str = "/ready";
/// Prometheus text exposition of the engine's and the gateway's series.
pub const METRICS_PATH: &str = "/metrics";

pub fn app(state: Arc<AppState>) -> Router {
    let authed = Router::new()
        .route("/v1/chat/completions", post(completions::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{id}", get(get_model))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .merge(authed)
        .route(HEALTH_PATH, get(health))
        .route(READY_PATH, get(ready))
        .route(METRICS_PATH, get(metrics))
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

/// Reads a body within the size and time limits.
async fn read_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
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
    Ok(bytes)
}

/// Parses JSON, naming the field of a type error.
fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
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

fn model_card(id: String, max_model_len: usize) -> ModelCard {
    ModelCard {
        id,
        object: "model",
        created: 0,
        owned_by: "sluice",
        max_model_len,
    }
}

/// Lists the served models: this process's and every healthy replica's.
#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList)))]
async fn list_models(State(s): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: s
            .all_models()
            .into_iter()
            .map(|(id, len)| model_card(id, len))
            .collect(),
    })
}

/// One served model.
#[utoipa::path(get, path = "/v1/models/{id}", params(("id" = String, Path)),
    responses((status = 200, body = ModelCard), (status = 404, body = ErrorBody)))]
async fn get_model(
    State(s): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    s.all_models()
        .into_iter()
        .find(|(m, _)| *m == id)
        .map(|(m, len)| Json(model_card(m, len)))
        .ok_or(ApiError::ModelNotFound(id))
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
    } else if s.served_model.is_some() {
        ApiError::Unavailable("the model is loading".into()).into_response()
    } else {
        ApiError::Unavailable("no replica is healthy yet".into()).into_response()
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
                let ids: Vec<String> = s.all_models().into_iter().map(|(id, _)| id).collect();
                model.insert("enum".into(), serde_json::json!(ids));
            }
        }
    }
    Json(doc)
}

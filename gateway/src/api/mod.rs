//! The HTTP API: OpenAI's endpoints plus tokenize/detokenize, health, readiness, metrics and
//! the OpenAPI document. [`app`] builds the router so tests can drive it with
//! `tower::ServiceExt::oneshot`; `crate::server` puts it on a socket.

mod beam;
mod body;
mod endpoint;
mod gate;
pub mod generate;
mod guided;
pub mod internal;
mod logprobs;
mod pipeline;
pub mod proxy;
mod resume;
mod schema;
pub mod scope;
mod sse;
mod state;
mod tokens;
pub mod tools;
pub mod types;
pub mod validate;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus::{Encoder, TextEncoder};
use utoipa::OpenApi;

pub use gate::{Ask, Gate};
pub use state::{AppState, HttpLimits, RequestId};

use crate::error::ApiError;
use crate::router::replica::ServedModel;
use types::*;

static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

#[derive(OpenApi)]
#[openapi(
    info(title = "sluice", description = "OpenAI-compatible inference gateway"),
    paths(
        pipeline::chat_completions,
        pipeline::completions,
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
        .route("/v1/chat/completions", post(pipeline::chat_completions))
        .route("/v1/completions", post(pipeline::completions))
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

fn model_card(m: ServedModel) -> ModelCard {
    ModelCard {
        id: m.id,
        object: "model",
        created: 0,
        owned_by: "sluice",
        max_model_len: m.max_model_len.unwrap_or(0),
        max_prompt_tokens: m.max_prompt_tokens,
    }
}

/// Lists the served models: this process's and every healthy replica's.
#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList)))]
async fn list_models(State(s): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: s.all_models().into_iter().map(model_card).collect(),
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
        .find(|m| m.id == id)
        .map(|m| Json(model_card(m)))
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
    s.metrics.prompt_bursts.flush();
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
                let ids: Vec<String> = s.all_models().into_iter().map(|m| m.id).collect();
                model.insert("enum".into(), serde_json::json!(ids));
            }
        }
    }
    Json(doc)
}

//! `/tokenize` and `/detokenize`: answered with the local model's tokenizer, or sent to a
//! replica serving the named model (the gateway holds no tokenizer for remote models).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;

use serde::de::DeserializeOwned;

use super::body::{parse_json, read_body};
use super::state::AppState;
use super::types::*;
use super::validate;
use crate::backend::LocalBackend;
use crate::error::ApiError;

/// Sends `/tokenize` or `/detokenize` for a remote model to a replica serving it.
async fn proxy_tokens(
    s: &Arc<AppState>,
    path: &'static str,
    model: Option<&str>,
    bytes: Bytes,
) -> Option<Result<Response, ApiError>> {
    let router = s.router.as_ref()?;
    let model = match model {
        Some(m) if s.is_local(m) => return None,
        Some(m) => m.to_string(),
        None if s.served_model.is_some() => return None,
        None => router.models().first()?.id.clone(),
    };
    let req = crate::router::dispatch::ProxyRequest {
        path,
        model,
        key: None,
        headers: vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body: bytes,
        deadline: None,
        class: None,
        prompt_tokens: None,
    };
    Some(match router.dispatch(&req).await {
        Err(e) => Err(e.into()),
        Ok(r) => {
            let rest = r.rest.collect().await.map(|b| b.to_bytes());
            match rest {
                Ok(rest) => {
                    let mut body = r.first.map(|b| b.to_vec()).unwrap_or_default();
                    body.extend_from_slice(&rest);
                    let mut resp = Response::builder().status(r.head.status);
                    if let Some(ct) = r.head.headers.get(header::CONTENT_TYPE) {
                        resp = resp.header(header::CONTENT_TYPE, ct);
                    }
                    resp.body(Body::from(body)).map_err(|_| ApiError::Internal)
                }
                Err(_) => Err(ApiError::BadGateway(
                    "The replica failed while answering".into(),
                )),
            }
        }
    })
}

/// `/tokenize`'s and `/detokenize`'s bodies.
trait TokenRequest: DeserializeOwned {
    const PATH: &'static str;
    fn model(&self) -> Option<&str>;
}

impl TokenRequest for TokenizeRequest {
    const PATH: &'static str = "/tokenize";
    fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }
}

impl TokenRequest for DetokenizeRequest {
    const PATH: &'static str = "/detokenize";
    fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }
}

/// A token request to answer here with the local model, or a replica's answer to it.
enum Here<T> {
    Local(T, Arc<LocalBackend>),
    Answered(Response),
}

/// Reads a token request and sends it to a replica when one serves its model.
async fn receive<T: TokenRequest>(
    s: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Here<T>, ApiError> {
    s.check_draining()?;
    let bytes = read_body(s, headers, body).await?;
    let req: T = parse_json(&bytes)?;
    if let Some(r) = proxy_tokens(s, T::PATH, req.model(), bytes).await {
        return r.map(Here::Answered);
    }
    let backend = s.backend()?.clone();
    if let Some(m) = req.model() {
        s.check_model(m)?;
    }
    Ok(Here::Local(req, backend))
}

/// Tokenises a prompt (as completions would) or chat messages (as chat would).
#[utoipa::path(post, path = "/tokenize", request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeResponse), (status = 400, body = ErrorBody)))]
pub(super) async fn tokenize(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, backend) = match receive::<TokenizeRequest>(&s, &headers, body).await? {
        Here::Local(req, backend) => (req, backend),
        Here::Answered(resp) => return Ok(resp),
    };
    let model = backend.model();
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => model
            .tokenizer()
            .encode_prompt(p)
            .map_err(|_| ApiError::Internal)?,
        (None, Some(msgs)) => {
            let m = validate::chat_messages(msgs)?;
            let end =
                validate::chat_end(req.add_generation_prompt, req.continue_final_message, &m)?;
            let kwargs = validate::template_kwargs(
                req.chat_template_kwargs.as_ref(),
                req.documents.as_ref(),
            )?;
            let own = req.chat_template.as_deref();
            validate::request_template_allowed(own.is_some(), s.trust_request_chat_template)?;
            validate::chat_prompt((model, own), &m, None, end, kwargs.as_ref())?
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
    })
    .into_response())
}

/// Turns token ids back into text.
#[utoipa::path(post, path = "/detokenize", request_body = DetokenizeRequest,
    responses((status = 200, body = DetokenizeResponse), (status = 400, body = ErrorBody)))]
pub(super) async fn detokenize(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, backend) = match receive::<DetokenizeRequest>(&s, &headers, body).await? {
        Here::Local(req, backend) => (req, backend),
        Here::Answered(resp) => return Ok(resp),
    };
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
    Ok(Json(DetokenizeResponse { prompt }).into_response())
}

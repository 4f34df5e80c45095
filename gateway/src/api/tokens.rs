//! `/tokenize` and `/detokenize`: answered with the local model's tokenizer, or sent to a
//! replica serving the named model (the gateway holds no tokenizer for remote models).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;

use super::completions::check_model;
use super::types::*;
use super::{parse_json, read_body, validate, AppState};
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

/// Tokenises a prompt (as completions would) or chat messages (as chat would).
#[utoipa::path(post, path = "/tokenize", request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeResponse), (status = 400, body = ErrorBody)))]
pub(super) async fn tokenize(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    s.check_draining()?;
    let bytes = read_body(&s, &headers, body).await?;
    let req: TokenizeRequest = parse_json(&bytes)?;
    if let Some(r) = proxy_tokens(&s, "/tokenize", req.model.as_deref(), bytes).await {
        return r;
    }
    let backend = s.backend()?.clone();
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
    s.check_draining()?;
    let bytes = read_body(&s, &headers, body).await?;
    let req: DetokenizeRequest = parse_json(&bytes)?;
    if let Some(r) = proxy_tokens(&s, "/detokenize", req.model.as_deref(), bytes).await {
        return r;
    }
    let backend = s.backend()?.clone();
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
    Ok(Json(DetokenizeResponse { prompt }).into_response())
}

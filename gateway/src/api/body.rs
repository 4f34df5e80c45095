//! Reading a request body within the size and time limits, and parsing it as JSON with the
//! failing field named.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap};
use serde::de::DeserializeOwned;

use super::state::AppState;
use crate::error::ApiError;

/// Reads a body within the size and time limits.
pub(super) async fn read_body(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
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
pub(super) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
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

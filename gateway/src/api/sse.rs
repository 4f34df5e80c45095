//! Server-sent events as OpenAI streams them: one `data: {json}` event per chunk, `data: [DONE]`
//! last. A failure after the first byte cannot change the status any more, so it ends the stream
//! with [`error_ending`], the same on the local and the proxied path.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use serde::Serialize;

use crate::error::ApiError;

/// The event that ends every stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// One `data:` event holding `v` as JSON.
pub fn event(v: &impl Serialize) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut buf, v).expect("response types serialise");
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

/// The end of a stream that failed: the OpenAI error body as an event, then `[DONE]`.
pub fn error_ending(e: &ApiError) -> Bytes {
    let mut buf = event(&e.body()).to_vec();
    buf.extend_from_slice(DONE);
    Bytes::from(buf)
}

/// A 200 response streaming `body` as `text/event-stream`.
pub fn response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_ends_with_the_error_event_then_done() {
        let bytes = error_ending(&ApiError::Internal);
        let text = std::str::from_utf8(&bytes).unwrap();
        let events: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(events.len(), 2, "{text}");
        let json: serde_json::Value =
            serde_json::from_str(events[0].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(json["error"]["type"], "internal_error");
        assert_eq!(events[1], "data: [DONE]");
    }
}

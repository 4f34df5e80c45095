//! Exact mid-stream resumption of a proxied SSE answer.
//!
//! A streamed request is sent to its replica with `X-Sluice-Token-Ids: 1`, so every chunk
//! carries its choices' token ids and each finishing chunk the choice's usage
//! (`super::internal`). [`Resumption`] reads the stream event by event: it records the ids the
//! client has, strips the internal fields, and passes the chunk on. The replica's usage chunk
//! and `[DONE]` are held back: the gateway ends the stream itself with the usage of every
//! choice summed (prompts counted once).
//!
//! When the replica fails after the first byte (a reset, an answer cut short), each unfinished
//! choice continues on another replica through a continuation request: the original body with
//! `sluice_resume: {index, token_ids}` and `X-Sluice-Resume: 1`. That replica prefills prompt and
//! output, replays the output (sampler, detokeniser, stop strings) and streams what comes next,
//! as choice 0 without the opening chunk; here its chunks are renumbered and given the first
//! answer's `id` and `created`. With greedy or seeded sampling on batch-invariant kernels (the
//! CPU kernels) the client's text is byte for byte the uninterrupted run's; on a backend that
//! is not batch invariant (candle on a GPU) the stream continues, but the text may differ
//! from what the failed replica would have written. Choices resume one after another.
//!
//! The new replica's renderer reads the output sent before (`Render::resumed`): completions'
//! log-probability `text_offset`s go on, and a chat answer read as tool calls continues its
//! call reader (a call that starts after the break gets a new random id, as any call does).

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::internal::{remaining_header, X_SLUICE_DEADLINE_MS, X_SLUICE_RESUME};
use super::sse;
use crate::error::ApiError;
use crate::router::dispatch::{ProxyRequest, Routed};
use crate::router::Router;

/// What one choice has sent so far.
#[derive(Debug, Default, Clone)]
struct ChoiceLog {
    ids: Vec<u32>,
    /// `(prompt, completion, cached)` tokens, from the chunk that finished it.
    usage: Option<(u64, u64, u64)>,
    finished: bool,
}

/// How the current replica's stream ended, as far as its events say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// Still streaming.
    No,
    /// `[DONE]` arrived.
    Done,
    /// It sent an error event (passed on, with `[DONE]`): the answer ends there.
    Failed,
}

/// The state of one resumable streamed answer.
#[derive(Debug)]
pub struct Resumption {
    router: Arc<Router>,
    req: ProxyRequest,
    /// Choices per prompt.
    n: usize,
    include_usage: bool,
    choices: Vec<ChoiceLog>,
    /// The first chunk's `id`, `object`, `created` and `model`, repeated on every chunk.
    head: Option<Map<String, Value>>,
    /// The choice the current stream continues (its chunks number it 0).
    current: Option<usize>,
    buf: Vec<u8>,
    over: Over,
    resumes_left: usize,
    pub deadline: Option<std::time::Instant>,
    /// The stage named by a replica's `deadline_exceeded` error event.
    expired: Option<&'static str>,
}

impl Resumption {
    /// For a request of `prompts × n` choices sent as `req` (which asked for token ids).
    pub fn new(router: Arc<Router>, req: ProxyRequest, n: usize, prompts: usize) -> Self {
        let total = n * prompts;
        Self {
            router,
            req,
            n,
            include_usage: false,
            choices: vec![ChoiceLog::default(); total],
            head: None,
            current: None,
            buf: Vec::new(),
            over: Over::No,
            // Each choice may be resumed a few times (a second replica may fail too).
            resumes_left: 3 * total,
            deadline: None,
            expired: None,
        }
    }

    /// Whether the client asked for the usage chunk.
    pub fn with_usage(mut self, include_usage: bool) -> Self {
        self.include_usage = include_usage;
        self
    }

    pub fn over(&self) -> Over {
        self.over
    }

    /// The stage a replica's deadline passed in, when its error event said so.
    pub fn expired(&self) -> Option<&'static str> {
        self.expired
    }

    /// Every choice has finished.
    pub fn complete(&self) -> bool {
        self.choices.iter().all(|c| c.finished)
    }

    /// Reads a piece of the replica's stream; returns what goes on to the client.
    pub fn feed(&mut self, data: &[u8]) -> Bytes {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(end) = find(&self.buf, b"\n\n") {
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            if self.over != Over::No {
                continue;
            }
            out.extend_from_slice(&self.event(&event));
        }
        Bytes::from(out)
    }

    /// One whole event (with its blank line).
    fn event(&mut self, event: &[u8]) -> Vec<u8> {
        let Some(data) = event.strip_prefix(b"data: ") else {
            return event.to_vec();
        };
        let data = data.trim_ascii_end();
        if data == b"[DONE]" {
            self.over = Over::Done;
            return Vec::new();
        }
        let Ok(Value::Object(mut chunk)) = serde_json::from_slice::<Value>(data) else {
            return event.to_vec();
        };
        if let Some(e) = chunk.get("error") {
            self.over = Over::Failed;
            self.expired = deadline_stage(e);
            let mut out = event.to_vec();
            out.extend_from_slice(sse::DONE);
            return out;
        }
        if self.head.is_none() {
            let keep = ["id", "object", "created", "model"];
            let head = keep
                .iter()
                .filter_map(|k| chunk.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect();
            self.head = Some(head);
        }
        match self.chunk(&mut chunk) {
            true => sse::event(&chunk).to_vec(),
            false => Vec::new(),
        }
    }

    /// Records and strips a chunk's internal fields; false when nothing is left to send.
    fn chunk(&mut self, chunk: &mut Map<String, Value>) -> bool {
        let usage_only = chunk.get("usage").is_some_and(|u| !u.is_null());
        if usage_only {
            // The replica's total; the gateway sends its own at the end.
            return false;
        }
        if let Some(head) = &self.head {
            for (k, v) in head {
                chunk.insert(k.clone(), v.clone());
            }
        }
        let Some(Value::Array(choices)) = chunk.get_mut("choices") else {
            return true;
        };
        let had = choices.len();
        choices.retain_mut(|c| self.choice(c));
        had == 0 || !choices.is_empty()
    }

    /// Records one choice of a chunk and renumbers it; false when it carries nothing for the
    /// client (a piece of tool call held back, sent only for its token ids).
    fn choice(&mut self, c: &mut Value) -> bool {
        let Some(c) = c.as_object_mut() else {
            return true;
        };
        let index = match self.current {
            Some(k) => k,
            None => c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize,
        };
        c.insert("index".into(), Value::from(index));
        let Some(log) = self.choices.get_mut(index) else {
            return true;
        };
        if let Some(Value::Array(ids)) = c.remove("token_ids") {
            log.ids
                .extend(ids.iter().filter_map(|v| v.as_u64()).map(|v| v as u32));
        }
        if let Some(u) = c.remove("sluice_usage") {
            let get = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            let cached = u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            log.usage = Some((get("prompt_tokens"), get("completion_tokens"), cached));
        }
        if c.get("finish_reason").is_some_and(|f| !f.is_null()) {
            log.finished = true;
        }
        let empty_delta = c
            .get("delta")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty);
        let nothing = |k: &str| c.get(k).is_none_or(Value::is_null);
        !(empty_delta && nothing("logprobs") && nothing("finish_reason"))
    }

    /// The end of the answer: the summed usage (when asked for) and `[DONE]`; and the totals
    /// `(completion, prompt)`.
    pub fn ending(&self) -> (Bytes, (usize, usize)) {
        let (mut prompt, mut completion, mut cached) = (0, 0, 0);
        for (i, c) in self.choices.iter().enumerate() {
            let Some((p, t, k)) = c.usage else { continue };
            completion += t;
            if i % self.n == 0 {
                prompt += p;
                cached += k;
            }
        }
        let mut out = Vec::new();
        if self.include_usage {
            let mut chunk = self.head.clone().unwrap_or_default();
            chunk.insert("choices".into(), Value::Array(Vec::new()));
            let usage = serde_json::json!({
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            });
            chunk.insert("usage".into(), usage);
            chunk.insert("system_fingerprint".into(), Value::Null);
            out.extend_from_slice(&sse::event(&chunk));
        }
        out.extend_from_slice(sse::DONE);
        (Bytes::from(out), (completion as usize, prompt as usize))
    }

    /// Sends the first unfinished choice to another replica as a continuation; resolves with
    /// its answer's head and first frame.
    pub async fn continue_next(&mut self) -> Result<Routed, ApiError> {
        let broken = || ApiError::BadGateway("The replica failed while answering".into());
        let Some(k) = self.choices.iter().position(|c| !c.finished) else {
            return Err(broken());
        };
        if self.resumes_left == 0 {
            return Err(broken());
        }
        self.resumes_left -= 1;
        let req = self.continuation(k)?;
        let routed = self.router.dispatch(&req).await?;
        if !routed.head.status.is_success() {
            tracing::warn!(status = %routed.head.status, "a continuation was refused");
            return Err(broken());
        }
        self.current = Some(k);
        self.buf.clear();
        self.over = Over::No;
        Ok(routed)
    }

    /// The continuation request of choice `k`.
    fn continuation(&self, k: usize) -> Result<ProxyRequest, ApiError> {
        let mut body: Map<String, Value> =
            serde_json::from_slice(&self.req.body).map_err(|_| ApiError::Internal)?;
        let resume = serde_json::json!({"index": k, "token_ids": self.choices[k].ids});
        body.insert("sluice_resume".into(), resume);
        let mut req = self.req.clone();
        req.body = Bytes::from(serde_json::to_vec(&body).map_err(|_| ApiError::Internal)?);
        req.headers.retain(|(h, _)| *h != X_SLUICE_DEADLINE_MS);
        if let Some(d) = self.deadline {
            req.headers.push(remaining_header(d));
        }
        req.headers
            .push((X_SLUICE_RESUME.clone(), HeaderValue::from_static("1")));
        tracing::info!(
            choice = k,
            tokens = self.choices[k].ids.len(),
            "resuming a stream"
        );
        Ok(req)
    }
}

/// The stage of a `deadline_exceeded` error (its message names it).
fn deadline_stage(e: &Value) -> Option<&'static str> {
    if e.get("code").and_then(Value::as_str) != Some("deadline_exceeded") {
        return None;
    }
    let message = e.get("message").and_then(Value::as_str).unwrap_or("");
    ["queue", "prefill", "decode"]
        .into_iter()
        .find(|s| message.contains(&format!("the {s} stage")))
}

/// Where `needle` starts in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The header that asks a replica for token ids.
pub fn token_ids_header() -> (HeaderName, HeaderValue) {
    (
        super::internal::X_SLUICE_TOKEN_IDS.clone(),
        HeaderValue::from_static("1"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::GatewayMetrics;
    use crate::router::RouterConfig;

    fn resumption(n: usize, prompts: usize) -> Resumption {
        let metrics = GatewayMetrics::register(&prometheus::Registry::new())
            .unwrap()
            .router;
        let req = ProxyRequest {
            path: "/v1/chat/completions",
            model: "m".into(),
            key: None,
            headers: Vec::new(),
            body: Bytes::from_static(br#"{"model":"m","stream":true}"#),
            deadline: None,
            class: None,
            prompt_tokens: None,
        };
        Resumption::new(
            Router::new(RouterConfig::default(), metrics),
            req,
            n,
            prompts,
        )
        .with_usage(true)
    }

    fn events(b: &[u8]) -> Vec<Value> {
        std::str::from_utf8(b)
            .unwrap()
            .split_terminator("\n\n")
            .map(|e| {
                let d = e.strip_prefix("data: ").unwrap();
                serde_json::from_str(d).unwrap_or(Value::String(d.into()))
            })
            .collect()
    }

    #[test]
    fn ids_and_usage_are_recorded_stripped_and_summed() {
        let mut r = resumption(2, 1);
        let usage = |c: u64| {
            format!(
                r#""sluice_usage":{{"prompt_tokens":5,"completion_tokens":{c},"total_tokens":0,"prompt_tokens_details":{{"cached_tokens":0}}}}"#
            )
        };
        let stream = format!(
            "data: {{\"id\":\"a\",\"created\":1,\"choices\":[{{\"index\":1,\"delta\":{{\"content\":\"x\"}},\"token_ids\":[7,8]}}]}}\n\n\
             data: {{\"id\":\"a\",\"created\":1,\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\",{}}}]}}\n\n\
             data: {{\"id\":\"a\",\"created\":1,\"choices\":[{{\"index\":1,\"delta\":{{}},\"finish_reason\":\"length\",{}}}]}}\n\n\
             data: {{\"id\":\"a\",\"created\":1,\"choices\":[],\"usage\":{{\"prompt_tokens\":5}}}}\n\ndata: [DONE]\n\n",
            usage(3),
            usage(4)
        );
        // Split mid-event: the reader waits for whole events.
        let (a, b) = stream.as_bytes().split_at(30);
        let mut out = r.feed(a).to_vec();
        out.extend_from_slice(&r.feed(b));
        let ev = events(&out);
        assert_eq!(ev.len(), 3, "{ev:?}");
        assert_eq!(ev[0]["choices"][0]["delta"]["content"], "x");
        assert!(ev[0]["choices"][0].get("token_ids").is_none());
        assert!(ev[1]["choices"][0].get("sluice_usage").is_none());
        assert_eq!(r.choices[1].ids, [7, 8]);
        assert!(r.complete() && r.over() == Over::Done);
        let (end, totals) = r.ending();
        let end = events(&end);
        assert_eq!(end[0]["usage"]["completion_tokens"], 7);
        assert_eq!(end[0]["usage"]["prompt_tokens"], 5);
        assert_eq!(end[0]["id"], "a");
        assert_eq!(end[1], Value::String("[DONE]".into()));
        assert_eq!(totals, (7, 5));
    }

    #[test]
    fn a_continuation_is_renumbered_and_carries_the_first_head() {
        let mut r = resumption(2, 1);
        r.feed(b"data: {\"id\":\"a\",\"created\":1,\"choices\":[{\"index\":1,\"delta\":{\"content\":\"x\"},\"token_ids\":[7]}]}\n\n");
        let req = r.continuation(0).unwrap();
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(body["sluice_resume"]["index"], 0);
        assert!(req.headers.iter().any(|(h, _)| *h == X_SLUICE_RESUME));
        let req = r.continuation(1).unwrap();
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(body["sluice_resume"]["token_ids"], serde_json::json!([7]));
        r.current = Some(1);
        let out = r.feed(b"data: {\"id\":\"b\",\"created\":2,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"y\"},\"token_ids\":[9]}]}\n\n");
        let ev = events(&out);
        assert_eq!(ev[0]["id"], "a");
        assert_eq!(ev[0]["created"], 1);
        assert_eq!(ev[0]["choices"][0]["index"], 1);
        assert_eq!(r.choices[1].ids, [7, 9]);
    }

    #[test]
    fn a_deadline_error_names_its_stage() {
        let mut r = resumption(1, 1);
        let out = r.feed(b"data: {\"error\":{\"message\":\"The request's deadline passed in the decode stage\",\"code\":\"deadline_exceeded\"}}\n\n");
        assert!(out.ends_with(sse::DONE));
        assert_eq!((r.over(), r.expired()), (Over::Failed, Some("decode")));
    }
}

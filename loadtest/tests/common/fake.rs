//! An in-process fake OpenAI server with programmable timing, for the load tester's tests and
//! its self-benchmark. It does exactly what its [`Scenario`] says, so the figures the load
//! tester reports can be checked against what the fake did.

#![allow(dead_code)] // Each test binary uses a different part of it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};

/// What the fake does.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Delay before the first token.
    pub ttft: Duration,
    /// Delay per further token (a two-token chunk waits twice this).
    pub per_token: Duration,
    /// Every `double_every`-th chunk after the first carries two tokens (0: never).
    pub double_every: usize,
    /// Every `fail_every`-th request (1-based) is answered 429 (0: never).
    pub fail_every: u64,
    /// Honour `stream_options.continuous_usage_stats` (per-chunk cumulative usage).
    pub per_chunk_usage: bool,
    /// Honour `stream_options.include_usage` (final usage chunk) and send usage unstreamed.
    pub usage: bool,
    /// Serve `/tokenize` (one token per space-separated word, plus one BOS).
    pub tokenize: bool,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            ttft: Duration::from_millis(50),
            per_token: Duration::from_millis(10),
            double_every: 3,
            fail_every: 0,
            per_chunk_usage: true,
            usage: true,
            tokenize: true,
        }
    }
}

impl Scenario {
    /// Answers at once: for the self-benchmark.
    pub fn instant() -> Self {
        Self {
            ttft: Duration::ZERO,
            per_token: Duration::ZERO,
            double_every: 0,
            ..Self::default()
        }
    }
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub requests: AtomicU64,
    pub prompts: Mutex<Vec<String>>,
}

struct AppState {
    scenario: Scenario,
    seen: Arc<Seen>,
    keep_prompts: bool,
}

/// Starts the fake on 127.0.0.1:0; returns its base URL and what it sees.
pub async fn start(scenario: Scenario) -> (String, Arc<Seen>) {
    start_with(scenario, true).await
}

/// As [`start`]; `keep_prompts: false` for the benchmark (no lock per request).
pub async fn start_with(scenario: Scenario, keep_prompts: bool) -> (String, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let state = Arc::new(AppState {
        scenario,
        seen: seen.clone(),
        keep_prompts,
    });
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/v1/chat/completions", post(complete))
        .route("/v1/completions", post(complete))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Without TCP_NODELAY, Nagle plus delayed ACKs hold small SSE frames back ~40 ms.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}))
}

async fn tokenize(State(s): State<Arc<AppState>>, Json(body): Json<Value>) -> Response {
    if !s.scenario.tokenize {
        return StatusCode::NOT_FOUND.into_response();
    }
    let prompt = body["prompt"].as_str().unwrap_or("");
    let count = prompt.split_whitespace().count() + 1;
    Json(json!({"count": count, "tokens": vec![0; count]})).into_response()
}

fn prompt_of(body: &Value) -> String {
    body["prompt"]
        .as_str()
        .or_else(|| body["messages"][0]["content"].as_str())
        .unwrap_or("")
        .to_string()
}

async fn complete(State(s): State<Arc<AppState>>, Json(body): Json<Value>) -> Response {
    let n = s.seen.requests.fetch_add(1, Ordering::Relaxed) + 1;
    if s.keep_prompts {
        s.seen.prompts.lock().unwrap().push(prompt_of(&body));
    }
    let sc = s.scenario.clone();
    if sc.fail_every > 0 && n % sc.fail_every == 0 {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({"error": {"message": "slow down", "type": "rate_limit"}})),
        )
            .into_response();
    }
    let chat = body.get("messages").is_some();
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16).max(1);
    let prompt_tokens = prompt_of(&body).split_whitespace().count() as u64;
    let stream = body["stream"].as_bool().unwrap_or(false);
    if !stream {
        if !sc.ttft.is_zero() {
            tokio::time::sleep(sc.ttft + sc.per_token * (max_tokens as u32 - 1)).await;
        }
        let text = "x".repeat(max_tokens as usize);
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}})
        } else {
            json!({"index": 0, "text": text})
        };
        let mut v = json!({"choices": [choice]});
        if sc.usage {
            v["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens});
        }
        return Json(v).into_response();
    }
    let include_usage = sc.usage && body["stream_options"]["include_usage"].as_bool() == Some(true);
    let per_chunk = sc.per_chunk_usage
        && body["stream_options"]["continuous_usage_stats"].as_bool() == Some(true);

    // (tokens so far, chunk index, phase) → the next SSE frame.
    let stream = futures_util::stream::unfold((0u64, 0usize, 0u8), move |(sent, idx, phase)| {
        let sc = sc.clone();
        async move {
            match phase {
                0 if sent < max_tokens => {
                    let k = if idx > 0 && sc.double_every > 0 && idx % sc.double_every == 0 {
                        2.min(max_tokens - sent)
                    } else {
                        1
                    };
                    let wait = if idx == 0 {
                        sc.ttft
                    } else {
                        sc.per_token * k as u32
                    };
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    let text = "t ".repeat(k as usize);
                    let choice = if chat {
                        json!({"index": 0, "delta": {"content": text}})
                    } else {
                        json!({"index": 0, "text": text})
                    };
                    let mut v = json!({"choices": [choice]});
                    if per_chunk {
                        v["usage"] = json!({"prompt_tokens": prompt_tokens,
                            "completion_tokens": sent + k});
                    }
                    let frame = format!("data: {v}\n\n");
                    Some((
                        Ok::<_, Infallible>(Bytes::from(frame)),
                        (sent + k, idx + 1, 0),
                    ))
                }
                0 => {
                    let frame = if include_usage {
                        let v = json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                            "completion_tokens": sent}});
                        format!("data: {v}\n\ndata: [DONE]\n\n")
                    } else {
                        "data: [DONE]\n\n".to_string()
                    };
                    Some((Ok(Bytes::from(frame)), (sent, idx, 1)))
                }
                _ => None,
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

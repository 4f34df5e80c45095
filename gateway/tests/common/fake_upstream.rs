//! A fake OpenAI-compatible replica that answers at once: `/v1/models`, `/health`, `/metrics`
//! (vLLM names, values the test sets) and chat/completions as JSON or SSE. Its behaviour is
//! programmable per test — refuse the next requests with a status, or break streams after the
//! first chunk — and it counts what it served. The gateway tests route to it, and
//! `make bench-gateway` measures the gateway in front of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

#[derive(Debug, Default)]
pub struct Fake {
    pub model: String,
    /// Answers to `/health` with 503 while false.
    pub healthy: AtomicBool,
    /// The next this many generations answer `refuse_status`.
    pub refuse_next: AtomicUsize,
    pub refuse_status: Mutex<u16>,
    /// Streams send one chunk, then the connection breaks.
    pub break_streams: AtomicBool,
    /// Values exported as `vllm:num_requests_waiting` / `_running`.
    pub waiting: AtomicU64,
    pub running: AtomicU64,
    /// Export no vLLM series at all (as a plain OpenAI server would).
    pub no_metrics: AtomicBool,
    /// Milliseconds each generation waits before answering.
    pub delay_ms: AtomicU64,
    /// Generations answered (any status).
    pub served: AtomicUsize,
    /// The last generation's request body and `x-session-id`.
    pub last_body: Mutex<Option<Bytes>>,
    /// When not 0, a replica with this many sequence slots: it exports the figure as
    /// `sluice_engine_max_num_seqs`, runs at most that many generations at once (each holding
    /// its slot for `delay_ms`), queues the rest, and exports the live counts as running and
    /// waiting (added to `running` and `waiting`).
    pub max_num_seqs: AtomicU64,
    pub live_running: AtomicU64,
    pub live_waiting: AtomicU64,
    /// The most generations that ran at once.
    pub peak_running: AtomicU64,
    /// When not 0, listed on `/v1/models` as `max_prompt_tokens` (`--max-prompt-tokens`), and
    /// a generation whose body has more bytes is refused as a replica refuses a prompt past
    /// its bound (400 `context_length_exceeded`). The fake counts a token per byte of the
    /// body: more than the gateway's bytes / 4 estimate of the prompt, so an estimate that
    /// runs short is caught here as a tokenising replica catches it.
    pub max_prompt_tokens: AtomicU64,
    slot_free: tokio::sync::Notify,
}

impl Fake {
    pub fn new(model: &str) -> Arc<Self> {
        Arc::new(Self {
            model: model.into(),
            healthy: AtomicBool::new(true),
            refuse_status: Mutex::new(503),
            ..Self::default()
        })
    }

    pub fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }

    /// Waits for a sequence slot when the fake has a capacity; the slot is held until the
    /// returned guard drops.
    async fn slot(self: &Arc<Self>) -> Option<Slot> {
        let cap = self.max_num_seqs.load(Ordering::SeqCst);
        if cap == 0 {
            return None;
        }
        self.live_waiting.fetch_add(1, Ordering::SeqCst);
        loop {
            let freed = self.slot_free.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            let took = self
                .live_running
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                    (r < cap).then_some(r + 1)
                });
            if let Ok(before) = took {
                self.peak_running.fetch_max(before + 1, Ordering::SeqCst);
                break;
            }
            freed.await;
        }
        self.live_waiting.fetch_sub(1, Ordering::SeqCst);
        Some(Slot(self.clone()))
    }
}

/// A sequence slot of a fake with a capacity.
struct Slot(Arc<Fake>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.live_running.fetch_sub(1, Ordering::SeqCst);
        self.0.slot_free.notify_waiters();
    }
}

/// Serves `fake` on 127.0.0.1:`port` (0: any) until the task is aborted, which also closes
/// every open connection (as a killed process would).
pub async fn serve(fake: Arc<Fake>, port: u16) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    serve_on(fake, std::net::Ipv4Addr::LOCALHOST, port).await
}

/// As [`serve`], on another loopback address (127.0.0.2 ...), so several fakes can share a
/// port as pods behind one Service do.
pub async fn serve_on(
    fake: Arc<Fake>,
    ip: std::net::Ipv4Addr,
    port: u16,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                continue;
            };
            let _ = sock.set_nodelay(true);
            let svc = hyper_util::service::TowerToHyperService::new(app.clone());
            while conns.try_join_next().is_some() {}
            conns.spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
            });
        }
    });
    (addr, task)
}

async fn models(State(f): State<Arc<Fake>>) -> Response {
    let bound = match f.max_prompt_tokens.load(Ordering::SeqCst) {
        0 => String::new(),
        n => format!(r#","max_prompt_tokens":{n}"#),
    };
    let body = format!(
        r#"{{"object":"list","data":[{{"id":"{}","object":"model","max_model_len":2048{bound}}}]}}"#,
        f.model
    );
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn health(State(f): State<Arc<Fake>>) -> StatusCode {
    if f.healthy.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn metrics(State(f): State<Arc<Fake>>) -> Response {
    if f.no_metrics.load(Ordering::SeqCst) {
        return "process_cpu_seconds_total 1\n".into_response();
    }
    let cap = f.max_num_seqs.load(Ordering::SeqCst);
    let mut text = format!(
        "vllm:num_requests_waiting{{model_name=\"{m}\"}} {}\nvllm:num_requests_running{{model_name=\"{m}\"}} {}\nvllm:kv_cache_usage_perc{{model_name=\"{m}\"}} 0.1\n",
        f.waiting.load(Ordering::SeqCst) + f.live_waiting.load(Ordering::SeqCst),
        f.running.load(Ordering::SeqCst) + f.live_running.load(Ordering::SeqCst),
        m = f.model
    );
    if cap > 0 {
        text += &format!(
            "sluice_engine_max_num_seqs{{model_name=\"{}\"}} {cap}\n",
            f.model
        );
    }
    text.into_response()
}

const CHUNK: &str = r#"data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;

async fn generate(State(f): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    f.served.fetch_add(1, Ordering::SeqCst);
    let _ = headers;
    let _slot = f.slot().await;
    let delay = f.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    *f.last_body.lock().unwrap() = Some(body.clone());
    let bound = f.max_prompt_tokens.load(Ordering::SeqCst);
    if bound > 0 && body.len() as u64 > bound {
        let error = serde_json::json!({"error": {
            "message": format!("this server takes prompts of at most {bound} tokens, and this one has {}", body.len()),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}});
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            error.to_string(),
        )
            .into_response();
    }
    let refuse = f
        .refuse_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if refuse {
        let status = StatusCode::from_u16(*f.refuse_status.lock().unwrap()).unwrap();
        let body = r#"{"error":{"message":"refused by the fake","type":"service_unavailable","param":null,"code":null}}"#;
        return (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    }
    let stream = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["stream"].as_bool())
        .unwrap_or(false);
    if !stream {
        let body = format!(
            r#"{{"id":"x","object":"chat.completion","created":0,"model":"{}","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}}}"#,
            f.model
        );
        return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    }
    if f.break_streams.load(Ordering::SeqCst) {
        // The first chunk goes out; a moment later the connection breaks.
        let first = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from(format!(
            "{CHUNK}\n\n"
        )))]);
        let broken = futures_util::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            Err(std::io::Error::other("the fake breaks the stream"))
        });
        let body = Body::from_stream(futures_util::StreamExt::chain(first, broken));
        return ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    }
    let chunks: Vec<Result<Bytes, std::io::Error>> = {
        vec![
            Ok(Bytes::from(format!("{CHUNK}\n\n"))),
            Ok(Bytes::from(format!("{CHUNK}\n\n"))),
            Ok(Bytes::from_static(b"data: [DONE]\n\n")),
        ]
    };
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

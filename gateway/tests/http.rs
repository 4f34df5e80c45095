//! The router driven in-process (`oneshot`) and over a real socket: validation and error
//! mapping, tenants and fairness, rate limits, queue timeout, drain and disconnects. The model
//! and engine are real.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use common::*;
use sluice_gateway::admission::AdmissionConfig;
use sluice_gateway::api::HttpLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn errors_have_status_and_openai_shape() {
    let (s, _e) = state(Setup {
        limits: HttpLimits {
            max_body_bytes: 1000,
            ..HttpLimits::default()
        },
        ..Setup::default()
    });
    let chat = |extra: &str| {
        format!(
            r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#
        )
    };
    // (method, path, body, status, param)
    type Case<'a> = (&'a str, &'a str, Option<String>, u16, Option<&'a str>);
    let cases: Vec<Case<'_>> = vec![
        (
            "POST",
            "/v1/chat/completions",
            Some("{not json".into()),
            400,
            None,
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(chat(r#", "temperature": 2.5"#)),
            400,
            Some("temperature"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(chat(r#", "n": 17"#)),
            400,
            Some("n"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(chat(r#", "max_tokens": -5"#)),
            400,
            Some("max_tokens"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(chat(r#", "top_p": "high""#)),
            400,
            Some("top_p"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(chat(r#", "tools": [{"type": "function"}]"#)),
            400,
            Some("tools"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(chat(r#", "max_tokens": 5000"#)),
            400,
            Some("messages"),
        ),
        (
            "POST",
            "/v1/completions",
            Some(format!(
                r#"{{"model": "{MODEL}", "prompt": [1, 2, 999999]}}"#
            )),
            400,
            Some("prompt"),
        ),
        (
            "POST",
            "/v1/completions",
            Some(format!(
                r#"{{"model": "{MODEL}", "prompt": "{}"}}"#,
                "x".repeat(2000)
            )),
            413,
            None,
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(r#"{"model": "nope", "messages": []}"#.into()),
            404,
            Some("model"),
        ),
        // Only an assistant message that calls tools may leave out its content.
        (
            "POST",
            "/v1/chat/completions",
            Some(format!(
                r#"{{"model": "{MODEL}", "messages": [{{"role": "user"}}]}}"#
            )),
            400,
            Some("messages[0].content"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            Some(format!(
                r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}, {{"role": "assistant", "content": null}}]}}"#
            )),
            400,
            Some("messages[1].content"),
        ),
        ("GET", "/v1/models/nope", None, 404, Some("model")),
        ("GET", "/v1/chat/completions", None, 405, None),
        ("GET", "/nothing/here", None, 404, None),
    ];
    for (method, path, body, status, param) in cases {
        let (got, _, v) = call(&s, method, path, None, body.clone()).await;
        assert_eq!(got.as_u16(), status, "{method} {path} {body:?}: {v}");
        assert_openai_error(&v);
        assert_eq!(v["error"]["param"].as_str(), param, "{v}");
    }
    let (_, _, v) = call(
        &s,
        "POST",
        "/v1/chat/completions",
        None,
        Some(chat(r#", "max_tokens": 5000"#)),
    )
    .await;
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("1024") && msg.contains("5000"), "{msg}");
}

/// The engine's prompt tokens prefilled so far (`vllm:prompt_tokens_total`).
fn prompt_tokens_prefilled(s: &sluice_gateway::api::AppState) -> f64 {
    s.registry
        .gather()
        .iter()
        .filter(|f| f.name() == sluice_metrics::vllm::PROMPT_TOKENS_TOTAL)
        .flat_map(|f| f.get_metric())
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// `--max-prompt-tokens`: a prompt past it, alone or among a completion's prompts, is refused
/// with a 400 in the OpenAI shape naming the bound and its length, and nothing is prefilled;
/// a prompt within it, or truncated to it, is served.
#[tokio::test]
async fn prompts_past_the_servers_bound_are_refused_before_any_prefill() {
    let (s, _e) = state(Setup {
        max_prompt_tokens: Some(32),
        ..Setup::default()
    });
    let long = "the quick brown fox jumps over the lazy dog ".repeat(10);
    let refused = [
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "{long}"}}]}}"#
            ),
            "messages",
        ),
        (
            "/v1/completions",
            format!(r#"{{"model": "{MODEL}", "prompt": ["hi", "{long}"], "max_tokens": 2}}"#),
            "prompt",
        ),
    ];
    for (path, body, param) in refused {
        let (status, _, v) = call(&s, "POST", path, None, Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {v}");
        assert_openai_error(&v);
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("at most 32 tokens"), "{msg}");
    }
    assert_eq!(
        prompt_tokens_prefilled(&s),
        0.0,
        "a refused prompt was prefilled"
    );
    // The bound is on the model's card, for a gateway in front to read.
    let (_, _, card) = call(&s, "GET", &format!("/v1/models/{MODEL}"), None, None).await;
    assert_eq!(card["max_prompt_tokens"], 32, "{card}");
    let served = [
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 2}}"#
            ),
        ),
        (
            "/v1/completions",
            format!(
                r#"{{"model": "{MODEL}", "prompt": "{long}", "max_tokens": 2, "truncate_prompt_tokens": 32}}"#
            ),
        ),
    ];
    for (path, body) in served {
        let (status, _, v) = call(&s, "POST", path, None, Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {v}");
    }
    assert!(prompt_tokens_prefilled(&s) > 32.0);
}

const TWO_TENANTS: &str = r#"
[[tenants]]
name = "heavy"
weight = 1.0
[[tenants]]
name = "light"
weight = 1.0
[[tenants]]
name = "limited"
requests_per_minute = 2
[[keys]]
key = "sk-heavy"
tenant = "heavy"
[[keys]]
key = "sk-light"
tenant = "light"
[[keys]]
key = "sk-limited"
tenant = "limited"
"#;

#[tokio::test]
async fn keys_are_checked() {
    let (s, _e) = state(Setup {
        tenants: tenants(TWO_TENANTS),
        ..Setup::default()
    });
    for key in [None, Some("sk-wrong")] {
        let (st, _, v) = call(&s, "GET", "/v1/models", key, None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        assert_openai_error(&v);
    }
    let (st, _, _) = call(&s, "GET", "/v1/models", Some("sk-light"), None).await;
    assert_eq!(st, StatusCode::OK);
    // Health and readiness need no key.
    assert_eq!(
        call(&s, "GET", "/ready", None, None).await.0,
        StatusCode::OK
    );
}

/// One tenant floods a saturated server; the other's requests are still served promptly
/// (equal weights: about one of theirs per one of the flooder's once both queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flooding_tenant_does_not_starve_another() {
    let (s, _e) = state(Setup {
        tenants: tenants(TWO_TENANTS),
        admission: AdmissionConfig {
            max_in_flight: 1,
            max_queue: 100,
            queue_timeout: Duration::from_secs(120),
            late_after: None,
        },
        ..Setup::default()
    });
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (s, order) = (s.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let (st, _, v) = call(
                &s,
                "POST",
                "/v1/completions",
                Some("sk-heavy"),
                Some(completion(&format!("heavy {i}"), 2)),
            )
            .await;
            assert_eq!(st, StatusCode::OK, "{v}");
            order.lock().unwrap().push("heavy");
        }));
    }
    // Let the flood queue up first.
    while s.admission.queue_depth() < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for i in 0..4 {
        let (s, order) = (s.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let (st, _, v) = call(
                &s,
                "POST",
                "/v1/completions",
                Some("sk-light"),
                Some(completion(&format!("light {i}"), 2)),
            )
            .await;
            assert_eq!(st, StatusCode::OK, "{v}");
            order.lock().unwrap().push("light");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let last_light = order.iter().rposition(|t| *t == "light").unwrap();
    // FIFO would put all four light requests last (index 16..20); fair share interleaves them.
    assert!(last_light < 14, "light requests were starved: {order:?}");
}

#[tokio::test]
async fn rate_limits_answer_429_with_retry_after() {
    let (s, _e) = state(Setup {
        tenants: tenants(TWO_TENANTS),
        ..Setup::default()
    });
    for _ in 0..2 {
        let (st, _, v) = call(
            &s,
            "POST",
            "/v1/completions",
            Some("sk-limited"),
            Some(completion("hi", 1)),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    let (st, h, v) = call(
        &s,
        "POST",
        "/v1/completions",
        Some("sk-limited"),
        Some(completion("hi", 1)),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert_openai_error(&v);
    assert_eq!(v["error"]["code"], "rate_limit_requests");
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    // Another tenant is unaffected.
    let (st, _, _) = call(
        &s,
        "POST",
        "/v1/completions",
        Some("sk-light"),
        Some(completion("hi", 1)),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_request_times_out_with_429() {
    let (s, engine) = state(Setup {
        admission: AdmissionConfig {
            max_in_flight: 1,
            max_queue: 10,
            queue_timeout: Duration::from_millis(200),
            late_after: None,
        },
        ..Setup::default()
    });
    let long = {
        let s = s.clone();
        tokio::spawn(async move {
            call(
                &s,
                "POST",
                "/v1/completions",
                None,
                Some(completion("story", 300)),
            )
            .await
        })
    };
    wait_engine(&engine, |l| l.running == 1).await;
    let started = Instant::now();
    let (st, _, v) = call(
        &s,
        "POST",
        "/v1/completions",
        None,
        Some(completion("x", 1)),
    )
    .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["error"]["code"], "queue_timeout");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(long.await.unwrap().0, StatusCode::OK);
}

async fn serve(
    s: Arc<sluice_gateway::api::AppState>,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<bool>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let app = sluice_gateway::api::app(s.clone());
    let run = tokio::spawn(sluice_gateway::server::run(
        listener,
        app,
        s,
        sluice_gateway::server::ServeOptions {
            header_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(60),
        },
        async {
            let _ = rx.await;
        },
    ));
    (addr, tx, run)
}

async fn post_raw(addr: std::net::SocketAddr, path: &str, body: &str) -> tokio::net::TcpStream {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    sock
}

async fn read_response(mut sock: tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), sock.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// SIGTERM's drain: in-flight requests complete, new ones get 503, `run` returns drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drain_finishes_in_flight_and_refuses_new() {
    let (s, engine) = state(Setup::default());
    let (addr, stop, run) = serve(s.clone()).await;
    let body = format!(
        r#"{{"model": "{MODEL}", "prompt": "Once", "max_tokens": 64, "ignore_eos": true}}"#
    );
    let in_flight = post_raw(addr, "/v1/completions", &body).await;
    wait_engine(&engine, |l| l.running == 1).await;
    stop.send(()).unwrap();
    while !s.draining.load(std::sync::atomic::Ordering::Acquire) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = read_response(post_raw(addr, "/v1/completions", &body).await).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    let done = read_response(in_flight).await;
    assert!(done.starts_with("HTTP/1.1 200"), "{done}");
    assert!(done.contains("\"completion_tokens\":64"), "{done}");
    assert!(run.await.unwrap(), "drained within the timeout");
}

/// A client that disconnects mid-stream aborts its sequence: the engine ends with nothing
/// running and no used blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disconnect_aborts_the_sequence() {
    let (s, engine) = state(Setup::default());
    let (addr, _stop, _run) = serve(s.clone()).await;
    for stream in [true, false] {
        let body = format!(
            r#"{{"model": "{MODEL}", "prompt": "Once", "max_tokens": 500, "ignore_eos": true, "stream": {stream}}}"#
        );
        let mut sock = post_raw(addr, "/v1/completions", &body).await;
        wait_engine(&engine, |l| l.running == 1).await;
        if stream {
            let mut first = [0u8; 64];
            let n = sock.read(&mut first).await.unwrap();
            assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
        }
        drop(sock);
        wait_engine(&engine, |l| {
            l.running == 0 && l.waiting == 0 && l.kv_blocks_used == 0
        })
        .await;
        assert_eq!(
            engine.metrics().finished_count("abort"),
            if stream { 1 } else { 2 },
            "stream: {stream}"
        );
    }
}

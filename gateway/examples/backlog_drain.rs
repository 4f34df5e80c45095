//! How long a backlog takes to drain when a second replica becomes ready, with late binding
//! (requests wait in the gateway until a replica has room) against early binding (each request
//! goes to a replica at once and waits there).
//!
//! A routing gateway runs in this process (the library, default router settings but the
//! binding) in front of fake replicas, also in this process, that model an engine's batch: at
//! most `--max-num-seqs` requests run at once, each for `--service-ms`, the rest queue; they
//! export vLLM's running/waiting series and `sluice_engine_max_num_seqs` as a sluice replica
//! does. `--backlog` requests are sent at once to a pool of one replica; once they are all in
//! the gateway, a second replica starts and is announced. The drain time is from that moment to
//! the last answer.
//!
//! ```text
//! cargo run --release -p sluice-gateway --example backlog_drain -- --backlog 100
//! ```

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use sluice_gateway::admission::{Admission, AdmissionConfig};
use sluice_gateway::api::{AppState, HttpLimits};
use sluice_gateway::metrics::GatewayMetrics;
use sluice_gateway::rate_limit::RateLimiter;
use sluice_gateway::router::remote::ReplicaUrl;
use sluice_gateway::router::{Binding, Router, RouterConfig};
use sluice_gateway::tenants::Tenants;

#[derive(Debug, Clone, Copy)]
struct Args {
    backlog: usize,
    max_num_seqs: u64,
    service_ms: u64,
}

fn args() -> Args {
    let mut a = Args {
        backlog: 100,
        max_num_seqs: 4,
        service_ms: 200,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let v = pair.get(1).map(String::as_str).unwrap_or("");
        let n: u64 = v.parse().unwrap_or_else(|_| panic!("{}: '{v}'", pair[0]));
        match pair[0].as_str() {
            "--backlog" => a.backlog = n as usize,
            "--max-num-seqs" => a.max_num_seqs = n,
            "--service-ms" => a.service_ms = n,
            f => panic!("unknown flag {f} (--backlog, --max-num-seqs, --service-ms)"),
        }
    }
    a
}

/// A replica with `cap` sequence slots, each request holding one for `service`.
#[derive(Debug, Default)]
struct Fake {
    cap: u64,
    service: Duration,
    running: AtomicU64,
    waiting: AtomicU64,
    served: AtomicUsize,
    freed: tokio::sync::Notify,
}

impl Fake {
    async fn run_one(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            let took = self
                .running
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                    (r < self.cap).then_some(r + 1)
                });
            if took.is_ok() {
                break;
            }
            freed.await;
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        tokio::time::sleep(self.service).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.served.fetch_add(1, Ordering::SeqCst);
        self.freed.notify_waiters();
    }
}

async fn generate(State(f): State<Arc<Fake>>) -> impl IntoResponse {
    f.run_one().await;
    axum::Json(
        serde_json::json!({"id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}]}),
    )
}

async fn metrics(State(f): State<Arc<Fake>>) -> String {
    format!(
        "vllm:num_requests_waiting{{model_name=\"m\"}} {}\nvllm:num_requests_running{{model_name=\"m\"}} {}\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.1\n{}{{model_name=\"m\"}} {}\n",
        f.waiting.load(Ordering::SeqCst),
        f.running.load(Ordering::SeqCst),
        sluice_gateway::metrics::MAX_NUM_SEQS,
        f.cap
    )
}

async fn replica(a: Args) -> (Arc<Fake>, ReplicaUrl) {
    let fake = Arc::new(Fake {
        cap: a.max_num_seqs,
        service: Duration::from_millis(a.service_ms),
        ..Fake::default()
    });
    let app = axum::Router::new()
        .route(
            "/v1/models",
            get(|| async { r#"{"object":"list","data":[{"id":"m","object":"model"}]}"# }),
        )
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/chat/completions", post(generate))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, ReplicaUrl::from_addr(addr))
}

/// A routing gateway with `binding`; returns its address and router.
async fn gateway(binding: Binding, backlog: usize) -> (SocketAddr, Arc<Router>) {
    let registry = prometheus::Registry::new();
    let metrics = GatewayMetrics::register(&registry).unwrap();
    let cfg = RouterConfig {
        binding,
        max_queue: backlog.max(1024),
        ..RouterConfig::default()
    };
    let router = Router::new(cfg, metrics.router.clone());
    let tenants = Tenants::open();
    let state = Arc::new(AppState {
        backend: OnceLock::new(),
        served_model: None,
        router: Some(router.clone()),
        limiter: RateLimiter::new(&tenants),
        tenants,
        admission: Admission::new(AdmissionConfig {
            max_in_flight: 4096,
            max_queue: 1024,
            queue_timeout: Duration::from_secs(600),
            late_after: None,
        }),
        metrics,
        registry,
        draining: AtomicBool::new(false),
        in_flight: Arc::default(),
        limits: HttpLimits::default(),
        log_prompts: false,
        trust_request_chat_template: false,
        max_prompt_tokens: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = sluice_gateway::api::app(state);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, router)
}

/// One run: the backlog on one replica, then a second; returns the drain time and who served
/// how many.
async fn run(binding: Binding, a: Args) -> (Duration, usize, usize) {
    let (first, first_url) = replica(a).await;
    let (addr, router) = gateway(binding, a.backlog).await;
    let slot = router.add_source();
    router.set_source(slot, BTreeSet::from([first_url]));
    while !router.ready_for("m", Instant::now()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let body = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#;
    let url = format!("http://{addr}/v1/chat/completions");
    let answers: Vec<_> = (0..a.backlog)
        .map(|_| {
            let req = hyper::Request::post(&url)
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    body.as_bytes(),
                )))
                .unwrap();
            let client = client.clone();
            tokio::spawn(async move { client.request(req).await.map(|r| r.status().as_u16()) })
        })
        .collect();
    // Every request is in: on the replica (early) or in the gateway's queue (late).
    loop {
        let in_flight: usize = router.replicas().values().map(|r| r.in_flight()).sum();
        if in_flight + router.queue("m").depth() >= a.backlog {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t0 = Instant::now();
    let (second, second_url) = replica(a).await;
    let slot = router.add_source();
    router.set_source(slot, BTreeSet::from([second_url]));
    for h in answers {
        assert_eq!(h.await.unwrap().unwrap(), 200);
    }
    let drain = t0.elapsed();
    (
        drain,
        first.served.load(Ordering::SeqCst),
        second.served.load(Ordering::SeqCst),
    )
}

#[tokio::main]
async fn main() {
    let a = args();
    println!(
        "backlog {} requests, max_num_seqs {}, service {} ms; second replica ready after the backlog formed",
        a.backlog, a.max_num_seqs, a.service_ms
    );
    println!("binding  drain_s  first  second");
    for binding in [Binding::Early, Binding::Late] {
        let (drain, first, second) = run(binding, a).await;
        println!(
            "{:<7}  {:>7.2}  {:>5}  {:>6}",
            binding.label(),
            drain.as_secs_f64(),
            first,
            second
        );
    }
}

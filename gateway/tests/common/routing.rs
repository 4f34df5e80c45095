//! A routing gateway in this process, in front of whatever replicas a test names, and a small
//! HTTP client for talking to it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sluice_gateway::admission::{Admission, AdmissionConfig};
use sluice_gateway::api::{AppState, HttpLimits};
use sluice_gateway::discovery::{self, Source};
use sluice_gateway::metrics::GatewayMetrics;
use sluice_gateway::rate_limit::RateLimiter;
use sluice_gateway::router::{Router, RouterConfig};
use sluice_gateway::tenants::Tenants;

/// Router settings quick enough for tests: polls and checks every 50 ms.
pub fn quick_config() -> RouterConfig {
    RouterConfig {
        poll_interval: Duration::from_millis(50),
        stale_after: Duration::from_millis(500),
        health_interval: Duration::from_millis(50),
        ..RouterConfig::default()
    }
}

pub struct Gateway {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    pub router: Arc<Router>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts a routing gateway fed by `sources`.
pub async fn gateway(cfg: RouterConfig, sources: Vec<Source>, limits: HttpLimits) -> Gateway {
    let registry = prometheus::Registry::new();
    let metrics = GatewayMetrics::register(&registry).unwrap();
    let router = Router::new(cfg, metrics.router.clone());
    let tenants = Tenants::open();
    let state = Arc::new(AppState {
        backend: OnceLock::new(),
        served_model: None,
        router: Some(router.clone()),
        limiter: RateLimiter::new(&tenants),
        tenants,
        admission: Admission::new(AdmissionConfig {
            max_in_flight: 1024,
            max_queue: 1024,
            queue_timeout: Duration::from_secs(30),
            late_after: None,
        }),
        metrics,
        registry,
        draining: AtomicBool::new(false),
        in_flight: Arc::default(),
        limits,
        log_prompts: false,
        trust_request_chat_template: false,
        max_prompt_tokens: None,
    });
    for s in sources {
        discovery::spawn(s, router.clone(), Duration::from_millis(50));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(sluice_gateway::server::run(
        listener,
        sluice_gateway::api::app(state.clone()),
        state.clone(),
        sluice_gateway::server::ServeOptions {
            header_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(5),
        },
        async {
            let _ = rx.await;
        },
    ));
    Gateway {
        addr,
        state,
        router,
        _stop: tx,
    }
}

pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// An answer: status, headers, body as text (or the error that cut it short).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Result<String, String>,
}

impl Answer {
    pub fn replica(&self) -> Option<String> {
        self.headers
            .get("x-sluice-replica")
            .map(|v| v.to_str().unwrap().to_string())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.body.as_ref().unwrap()).unwrap()
    }
}

pub async fn send(
    base: &str,
    method: &str,
    path: &str,
    body: Option<String>,
    headers: &[(&str, &str)],
) -> Result<Answer, String> {
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    let resp = client().request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .map_err(|e| e.to_string());
    Ok(Answer {
        status,
        headers,
        body,
    })
}

pub async fn post(base: &str, path: &str, body: String, headers: &[(&str, &str)]) -> Answer {
    send(base, "POST", path, Some(body), headers).await.unwrap()
}

pub async fn get(base: &str, path: &str) -> Answer {
    send(base, "GET", path, None, &[]).await.unwrap()
}

/// The value of one series (summed over label sets matching every `labels` pair).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `cond` every 20 ms until it holds or `within` passes.
pub async fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn chat(model: &str, content: &str, stream: bool) -> String {
    serde_json::json!({"model": model, "stream": stream, "max_tokens": 4,
        "messages": [{"role": "user", "content": content}]})
    .to_string()
}

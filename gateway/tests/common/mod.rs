//! Harness for gateway tests: the real model behind a real engine, the router driven with
//! `oneshot` or served on 127.0.0.1:0.
#![allow(dead_code)]

pub mod fake_upstream;
pub mod processes;
pub mod routing;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use sluice_engine::{Engine, EngineConfig, EngineHandle};
use sluice_gateway::admission::{Admission, AdmissionConfig};
use sluice_gateway::api::{AppState, HttpLimits};
use sluice_gateway::backend::LocalBackend;
use sluice_gateway::metrics::GatewayMetrics;
use sluice_gateway::rate_limit::RateLimiter;
use sluice_gateway::tenants::Tenants;
use sluice_models::{registry, Model, ModelOptions};
use tower::ServiceExt;

pub const MODEL: &str = "smollm2-135m-instruct";

pub fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let dir = std::env::var_os("SLUICE_MODEL_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/cache"));
        let loc = registry::resolve(MODEL, &dir)
            .unwrap_or_else(|e| panic!("{e} (the gateway tests need the real model: make model)"));
        // SLUICE_TEST_BACKEND=candle runs the HTTP tests on the candle backend (CPU).
        let backend = match std::env::var("SLUICE_TEST_BACKEND") {
            Ok(b) => b.parse().expect("SLUICE_TEST_BACKEND is kernels or candle"),
            Err(_) => sluice_models::Backend::Kernels,
        };
        let options = ModelOptions {
            backend,
            ..ModelOptions::default()
        };
        Arc::new(Model::load(&loc.path, &options).expect("model loads"))
    })
    .clone()
}

pub struct Setup {
    pub tenants: Tenants,
    pub admission: AdmissionConfig,
    pub limits: HttpLimits,
    /// `--max-prompt-tokens`.
    pub max_prompt_tokens: Option<usize>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            tenants: Tenants::open(),
            admission: AdmissionConfig {
                max_in_flight: 64,
                max_queue: 256,
                queue_timeout: Duration::from_secs(30),
                late_after: None,
            },
            limits: HttpLimits::default(),
            max_prompt_tokens: None,
        }
    }
}

pub fn state(setup: Setup) -> (Arc<AppState>, EngineHandle) {
    let registry = prometheus::Registry::new();
    let model = model();
    let mut ec = EngineConfig::for_model(&model);
    ec.model_name = MODEL.into();
    ec.num_kv_blocks = Some(1024);
    ec.max_model_len = Some(1024);
    let engine = Engine::start_with_registry(model, ec, registry.clone()).unwrap();
    let state = Arc::new(AppState {
        backend: OnceLock::new(),
        served_model: Some(MODEL.into()),
        router: None,
        limiter: RateLimiter::new(&setup.tenants),
        tenants: setup.tenants,
        admission: Admission::new(setup.admission),
        metrics: GatewayMetrics::register(&registry).unwrap(),
        registry,
        draining: AtomicBool::new(false),
        in_flight: Arc::default(),
        limits: setup.limits,
        log_prompts: false,
        trust_request_chat_template: false,
        max_prompt_tokens: setup.max_prompt_tokens,
    });
    state
        .backend
        .set(Arc::new(LocalBackend::new(MODEL.into(), engine.clone())))
        .unwrap();
    (state, engine)
}

/// Writes an API keys file and returns its tenants.
pub fn tenants(toml: &str) -> Tenants {
    let path = std::env::temp_dir().join(format!(
        "sluice-keys-{}-{}.toml",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::write(&path, toml).unwrap();
    let t = Tenants::from_file(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    t
}

/// Sends one request through the router; returns status, headers and JSON (or text).
pub async fn call(
    state: &Arc<AppState>,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<String>,
) -> (StatusCode, axum::http::HeaderMap, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let req = req
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, Body::from))
        .unwrap();
    let resp = sluice_gateway::api::app(state.clone())
        .oneshot(req)
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, headers, v)
}

pub fn completion(prompt: &str, max_tokens: usize) -> String {
    serde_json::json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": true})
    .to_string()
}

pub fn assert_openai_error(v: &serde_json::Value) {
    let e = &v["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
}

/// Waits for `cond` on the engine's load.
pub async fn wait_engine(engine: &EngineHandle, cond: impl Fn(&sluice_engine::Load) -> bool) {
    for _ in 0..12_000 {
        if cond(&engine.load()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out: {:?}", engine.load());
}

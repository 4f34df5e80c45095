//! Harness for engine tests on the real default model.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sluice_engine::{
    Engine, EngineConfig, EngineHandle, Event, FinishReason, MatchedStop, PromptLogprobs, Request,
    SamplingParams, TokenLogprob, Usage,
};
use sluice_models::{registry, Backend, Model, ModelOptions};

pub fn model_dir() -> PathBuf {
    std::env::var_os("SLUICE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/cache"))
}

/// The backend most tests run on: `SLUICE_TEST_BACKEND` (`kernels` or `candle`), else the
/// kernels.
pub fn test_backend() -> Backend {
    match std::env::var("SLUICE_TEST_BACKEND") {
        Ok(b) => b.parse().expect("SLUICE_TEST_BACKEND is kernels or candle"),
        Err(_) => Backend::Kernels,
    }
}

/// One model per test binary, on the test backend; fails (never skips) when it is missing.
pub fn model() -> Arc<Model> {
    model_on(test_backend())
}

/// The default model on the CPU with `backend`, loaded once per test binary.
pub fn model_on(backend: Backend) -> Arc<Model> {
    static KERNELS: OnceLock<Arc<Model>> = OnceLock::new();
    static CANDLE: OnceLock<Arc<Model>> = OnceLock::new();
    let cell = match backend {
        Backend::Kernels => &KERNELS,
        Backend::Candle => &CANDLE,
    };
    cell.get_or_init(|| {
        let path = match registry::resolve(registry::default_model().name, &model_dir()) {
            Ok(loc) => loc.path,
            Err(e) => panic!("{e} (the engine tests need the real model: run `make model`)"),
        };
        let options = ModelOptions {
            backend,
            ..ModelOptions::default()
        };
        Arc::new(Model::load(&path, &options).expect("the model loads"))
    })
    .clone()
}

/// The default config with a small KV pool (tests need far less than 1 GiB).
pub fn config() -> EngineConfig {
    let mut c = EngineConfig::for_model(&model());
    c.num_kv_blocks = Some(2048);
    c
}

pub fn start(f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    start_on(test_backend(), f)
}

/// An engine on the model with `backend`, configured by `f`.
pub fn start_on(backend: Backend, f: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    let mut c = config();
    f(&mut c);
    Engine::start(model_on(backend), c).expect("the engine starts")
}

/// A chat prompt for `text`, tokenised as the gateway would.
pub fn prompt(text: &str) -> Vec<u32> {
    let m = model();
    let tpl = m.chat_template().expect("the model has a chat template");
    let rendered = tpl
        .render(
            &[sluice_models::chat_template::ChatMessage::new("user", text)],
            true,
        )
        .unwrap();
    m.tokenizer().encode(&rendered, true).unwrap()
}

pub fn request(prompt: Vec<u32>, sampling: SamplingParams) -> Request {
    Request {
        prompt,
        sampling,
        priority: 0,
        ..Request::default()
    }
}

/// One choice's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub text: String,
    pub deltas: Vec<String>,
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub reason: FinishReason,
    pub matched: Option<MatchedStop>,
    pub usage: Usage,
    /// The request's prompt log-probabilities, when it asked (the same in every choice).
    pub prompt_logprobs: Option<PromptLogprobs>,
}

/// Collects a stream until every choice finished; prompt log-probabilities must come once,
/// before any delta.
pub fn collect(mut stream: sluice_engine::EventStream, n: usize) -> Vec<Choice> {
    let mut choices: Vec<Option<Choice>> = vec![None; n];
    let mut partial: Vec<(Vec<String>, Vec<u32>, Vec<TokenLogprob>)> = vec![Default::default(); n];
    let mut prompt_logprobs = None;
    let mut done = 0;
    while done < n {
        match stream
            .blocking_next()
            .expect("the stream ends only after every finish")
        {
            Event::Prompt(p) => {
                let nothing_yet = partial.iter().all(|p| p.0.is_empty()) && done == 0;
                assert!(nothing_yet && prompt_logprobs.is_none(), "late or repeated");
                prompt_logprobs = Some(p);
            }
            Event::Delta(d) => {
                assert!(choices[d.index].is_none(), "delta after finish");
                let p = &mut partial[d.index];
                p.0.push(d.text);
                p.1.extend(d.token_ids);
                p.2.extend(d.logprobs);
            }
            Event::Finish(f) => {
                let (deltas, ids, lps) = std::mem::take(&mut partial[f.index]);
                choices[f.index] = Some(Choice {
                    text: deltas.concat(),
                    deltas,
                    token_ids: ids,
                    logprobs: lps,
                    reason: f.reason,
                    matched: f.matched_stop,
                    usage: f.usage,
                    prompt_logprobs: prompt_logprobs.clone(),
                });
                done += 1;
            }
        }
    }
    assert!(
        stream.blocking_next().is_none(),
        "nothing after the last finish"
    );
    choices.into_iter().map(|c| c.unwrap()).collect()
}

pub fn run(engine: &EngineHandle, req: Request) -> Vec<Choice> {
    let n = req.sampling.n;
    collect(engine.submit(req).expect("accepted"), n)
}

/// Runs `reqs` one at a time on `alone`, then all together on `engine`: each request's first
/// choice both ways, (together, alone).
pub fn together_and_alone(
    alone: &EngineHandle,
    engine: &EngineHandle,
    reqs: &[Request],
) -> Vec<(Choice, Choice)> {
    let solo: Vec<_> = reqs
        .iter()
        .map(|r| run(alone, r.clone()).remove(0))
        .collect();
    let streams: Vec<_> = reqs
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    let together = streams.into_iter().map(|s| collect(s, 1).remove(0));
    together.zip(solo).collect()
}

/// [`together_and_alone`], asserting that each request gives the same tokens, text and
/// finish both ways.
pub fn assert_together_match_alone(alone: &EngineHandle, engine: &EngineHandle, reqs: &[Request]) {
    for (i, (got, want)) in together_and_alone(alone, engine, reqs).iter().enumerate() {
        assert_eq!(got.token_ids, want.token_ids, "request {i}");
        assert_eq!(got.text, want.text, "request {i}");
        assert_eq!(got.reason, want.reason, "request {i}");
    }
}

/// [`assert_together_match_alone`] on an engine whose KV pool holds only `blocks` blocks of
/// up to `max_model_len` tokens a sequence, so that some are preempted and recomputed; asserts
/// that preemption happened. Returns the small engine, for checks on what it holds after.
pub fn assert_preempted_match_alone(
    alone: &EngineHandle,
    reqs: &[Request],
    blocks: usize,
    max_model_len: usize,
) -> EngineHandle {
    let engine = start(|c| {
        c.num_kv_blocks = Some(blocks);
        c.max_model_len = Some(max_model_len);
    });
    assert_together_match_alone(alone, &engine, reqs);
    assert!(
        engine.metrics().preemptions.get() > 0,
        "the pool was too small: preemptions must have happened"
    );
    engine
}

/// Waits for `cond` on the engine's load, failing after a generous timeout.
pub fn wait_for(engine: &EngineHandle, what: &str, cond: impl Fn(&sluice_engine::Load) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let l = engine.load();
        if cond(&l) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {l:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sum of tokens fed to forward calls so far (the `sluice_engine_batch_tokens` histogram).
pub fn tokens_fed(engine: &EngineHandle) -> f64 {
    engine.metrics().batch_tokens.get_sample_sum()
}

pub const TOPICS: &[&str] = &[
    "Name three colours.",
    "What is the capital of France?",
    "Write a haiku about rivers.",
    "Explain what a CPU does in two sentences.",
    "Count from one to ten in words.",
    "Give me a short recipe for pancakes.",
    "Why is the sky blue?",
    "Tell me a fun fact about octopuses.",
];

//! A model that scores more ids than its tokenizer has (a padded embedding table, as many real
//! checkpoints and the synthetic Llama-3-8B shape with the default tokenizer have): the engine
//! samples only ids the tokenizer can turn into text, and `logit_bias` may not name the others.
//!
//! The model is written by the `synth` example of `sluice-models` (`make test` builds every
//! example first): one random layer of the default shape, vocabulary padded to 65,536 ids, so a
//! quarter of a near-uniform distribution lies past the tokenizer's 49,152.

mod common;

use std::process::Command;
use std::sync::Arc;

use sluice_engine::{Engine, EngineConfig, FinishReason, SamplingParams};
use sluice_models::{Backend, Model, ModelOptions};

use common::{collect, request};

const PADDED: usize = 65_536;

fn padded_model(backend: Backend) -> Arc<Model> {
    let target = std::env::current_exe().unwrap();
    let synth = target
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples")
        .join(format!("synth{}", std::env::consts::EXE_SUFFIX));
    assert!(
        synth.is_file(),
        "{} missing: run `cargo build -p sluice-models --example synth` (make test does)",
        synth.display()
    );
    // One file per call: the tests run at once in one process.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out =
        std::env::temp_dir().join(format!("sluice-padded-{}-{call}.gguf", std::process::id()));
    let run = Command::new(&synth)
        .args([
            "--layers",
            "1",
            "--dtype",
            "q8_0",
            "--vocab",
            &PADDED.to_string(),
        ])
        .arg("--out")
        .arg(&out)
        .env("SLUICE_MODEL_DIR", common::model_dir())
        .output()
        .expect("synth runs");
    assert!(
        run.status.success(),
        "synth failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let options = ModelOptions {
        backend,
        ..ModelOptions::default()
    };
    let model = Model::load(&out, &options).expect("the padded model loads");
    std::fs::remove_file(&out).ok();
    assert_eq!(model.config().vocab_size, PADDED);
    assert!(model.tokenizer().vocab_size() < PADDED);
    Arc::new(model)
}

#[test]
fn ids_past_the_tokenizer_are_never_sampled_or_biased() {
    let model = padded_model(common::test_backend());
    let text_vocab = model.tokenizer().vocab_size();
    let mut config = EngineConfig::for_model(&model);
    config.num_kv_blocks = Some(256);
    config.max_model_len = Some(512);
    let engine = Engine::start(model.clone(), config).expect("the engine starts");
    let prompt = model.tokenizer().encode("Hello there", true).unwrap();
    let sampling = SamplingParams {
        n: 4,
        temperature: 1.0,
        seed: Some(7),
        max_tokens: Some(32),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let stream = engine
        .submit(request(prompt.clone(), sampling.clone()))
        .expect("accepted");
    for c in collect(stream, 4) {
        assert_eq!(c.reason, FinishReason::Length, "{c:?}");
        assert_eq!(c.token_ids.len(), 32);
        assert!(
            c.token_ids.iter().all(|&t| (t as usize) < text_vocab),
            "sampled an id past the tokenizer's {text_vocab}: {:?}",
            c.token_ids
        );
    }
    // A bias may not name an id the tokenizer lacks.
    let mut biased = sampling;
    biased.logit_bias = [(PADDED as u32 - 1, 100.0)].into();
    assert!(matches!(
        engine.submit(request(prompt, biased)),
        Err(sluice_engine::SubmitError::InvalidRequest(_))
    ));
}

/// Greedy and seeded sampled choices on the candle backend, whose device picks the token from
/// the row alone (`Logits::Pick`, bounded by the tokenizer's ids): the same tokens (and, where
/// asked, log-probabilities, the top ones' too) as the host sampler picks from whole rows,
/// none past the tokenizer. This random model's greedy path
/// repeats a few ids below the bound (`models/tests/picked_rows.rs` checks a bound that
/// bites); its draws, over a near-uniform row, would land past it a quarter of the time.
#[test]
fn tokens_picked_by_the_model_stay_below_the_tokenizer() {
    let model = padded_model(Backend::Candle);
    let sluice_models::Network::Candle(net) = model.network() else {
        panic!("the candle backend loads a candle network");
    };
    let text_vocab = model.tokenizer().vocab_size();
    let prompt = model.tokenizer().encode("Hello there", true).unwrap();
    let plain = SamplingParams {
        max_tokens: Some(32),
        ignore_eos: true,
        seed: Some(11),
        ..SamplingParams::default()
    };
    let cases = [
        SamplingParams {
            temperature: 0.0,
            ..plain.clone()
        },
        plain.clone(),
        SamplingParams {
            temperature: 0.7,
            min_p: 0.2,
            ..plain.clone()
        },
        SamplingParams {
            temperature: 0.0,
            logprobs: Some(0),
            ..plain.clone()
        },
        SamplingParams {
            logprobs: Some(0),
            ..plain.clone()
        },
        SamplingParams {
            temperature: 0.0,
            logprobs: Some(5),
            ..plain.clone()
        },
        SamplingParams {
            logprobs: Some(20),
            ..plain.clone()
        },
        SamplingParams {
            top_k: 40,
            top_p: 0.9,
            ..plain.clone()
        },
        SamplingParams {
            top_k: 5,
            temperature: 1.5,
            logprobs: Some(3),
            ..plain.clone()
        },
        // Top-p over the whole row: this near-uniform row's nucleus reaches past the top 64,
        // so it comes back whole (65,536 ids), and is cut at the tokenizer all the same.
        SamplingParams {
            top_p: 0.95,
            logprobs: Some(2),
            ..plain.clone()
        },
        SamplingParams {
            top_p: 0.3,
            temperature: 0.05,
            ..plain.clone()
        },
        // Bias and penalties, made on the device before its pick.
        SamplingParams {
            temperature: 0.0,
            repetition_penalty: 1.5,
            logit_bias: [(300, 4.0), (301, -100.0)].into_iter().collect(),
            ..plain.clone()
        },
        SamplingParams {
            frequency_penalty: 1.2,
            presence_penalty: 0.6,
            top_k: 30,
            ..plain.clone()
        },
        SamplingParams {
            temperature: 0.3,
            top_p: 0.9,
            repetition_penalty: 1.3,
            ..plain.clone()
        },
        // End-of-sequence held back all the way (min_tokens = max_tokens): a −∞ change on the
        // device.
        SamplingParams {
            min_tokens: 32,
            temperature: 0.0,
            ..plain.clone()
        },
        SamplingParams {
            min_tokens: 32,
            presence_penalty: 0.5,
            ..plain.clone()
        },
    ];
    for params in cases {
        let mut runs = Vec::new();
        for on_device in [true, false] {
            net.set_device_argmax(on_device);
            net.set_device_draws(on_device);
            let mut config = EngineConfig::for_model(&model);
            config.num_kv_blocks = Some(256);
            config.max_model_len = Some(512);
            let engine = Engine::start(model.clone(), config).expect("the engine starts");
            let stream = engine
                .submit(request(prompt.clone(), params.clone()))
                .expect("accepted");
            let c = collect(stream, 1).remove(0);
            assert_eq!(c.token_ids.len(), 32, "{c:?}");
            assert!(
                c.token_ids.iter().all(|&t| (t as usize) < text_vocab),
                "picked an id past the tokenizer's {text_vocab}: {:?}",
                c.token_ids
            );
            assert_eq!(
                c.logprobs.len(),
                if params.logprobs.is_some() { 32 } else { 0 }
            );
            runs.push((c.token_ids, c.logprobs));
        }
        let [(device, device_lp), (host, host_lp)] = &runs[..] else {
            unreachable!("two runs")
        };
        assert_eq!(
            device, host,
            "picked on the device and sampled on the host, at T {}",
            params.temperature
        );
        for (d, h) in device_lp.iter().zip(host_lp) {
            let ids = |t: &[(u32, f32)]| t.iter().map(|x| x.0).collect::<Vec<_>>();
            assert_eq!(ids(&d.top), ids(&h.top));
            assert_eq!(d.top.len(), params.logprobs.unwrap_or(0));
            let close = |a: f32, b: f32| (a - b).abs() <= 1e-4;
            assert!(close(d.logprob, h.logprob), "{d:?} against {h:?}");
            assert!(d.top.iter().zip(&h.top).all(|(a, b)| close(a.1, b.1)));
        }
    }
}

//! The `synth` example: random-weight GGUFs of named shapes load with both backends and
//! give finite logits, the same seed writes the same bytes, and `--truncate-from` keeps a real
//! model's first layers.

mod common;

use std::path::{Path, PathBuf};

use sluice_models::{Backend, Logits, Model, ModelOptions, SeqChunk, StepBatch};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Loads a model and returns the last row of logits after a short prompt.
fn last_logits(path: &Path) -> (Model, Vec<f32>) {
    last_logits_on(path, Backend::Kernels)
}

fn last_logits_on(path: &Path, backend: Backend) -> (Model, Vec<f32>) {
    let options = ModelOptions {
        backend,
        ..Default::default()
    };
    let model = Model::load(path, &options).unwrap();
    let mut kv = model.new_kv_store(2, 16).unwrap();
    let batch = StepBatch {
        seqs: vec![SeqChunk {
            tokens: vec![1, 504, 2365, 6354, 16438],
            start_pos: 0,
            block_table: vec![0, 1],
            logits: Logits::Last,
        }],
    };
    let row = model
        .forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    (model, row.into_iter().next().unwrap())
}

#[test]
fn small_synthetic_models_load_and_give_finite_logits() {
    for dtype in ["q4_1", "q4_k", "q8_0", "f16"] {
        let path = scratch(&format!("smollm2-2l-{dtype}.gguf"));
        common::synth(
            &["--shape", "smollm2-135m", "--layers", "2", "--dtype", dtype],
            &path,
        );
        let (model, row) = last_logits(&path);
        assert_eq!(model.config().block_count, 2);
        assert_eq!(model.config().embedding_length, 576);
        assert_eq!(
            (model.config().head_count, model.config().head_count_kv),
            (9, 3)
        );
        assert_eq!(row.len(), 49152);
        assert!(
            row.iter().all(|x| x.is_finite()),
            "{dtype}: non-finite logits"
        );
        let spread = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            spread > 0.0 && spread < 100.0,
            "{dtype}: logits up to {spread}"
        );
        // The candle backend on the same file: Q8_0 and Q4_K run through candle's quantized
        // products on the CPU, Q4_1 and f16 as f32 (see `candle::linear`).
        let (_, on_candle) = last_logits_on(&path, Backend::Candle);
        let max = row
            .iter()
            .zip(&on_candle)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("{dtype}: candle vs kernels max |Δ logit| {max:.5} (logits up to {spread:.3})");
        assert!(
            max <= 0.05 * spread,
            "{dtype}: candle and the kernels differ by {max} (logits up to {spread})"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let (a, b, c) = (scratch("a.gguf"), scratch("b.gguf"), scratch("c.gguf"));
    let args = ["--shape", "smollm2-135m", "--layers", "1", "--seed", "7"];
    common::synth(&args, &a);
    common::synth(&args, &b);
    common::synth(
        &["--shape", "smollm2-135m", "--layers", "1", "--seed", "8"],
        &c,
    );
    let (a_bytes, b_bytes) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert!(a_bytes == b_bytes, "same seed, different files");
    assert!(
        a_bytes != std::fs::read(&c).unwrap(),
        "different seeds, same file"
    );
    for p in [a, b, c] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn a_truncated_default_model_keeps_its_first_layers() {
    let path = scratch("truncated.gguf");
    let src = common::model_path();
    common::synth(
        &["--truncate-from", src.to_str().unwrap(), "--layers", "4"],
        &path,
    );
    let (model, row) = last_logits(&path);
    assert_eq!(model.config().block_count, 4);
    assert!(row.iter().all(|x| x.is_finite()));
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 40 << 20, "truncated model is {size} bytes");
    assert_eq!(
        model.tokenizer().encode("Hello, world!", false).unwrap(),
        common::model()
            .tokenizer()
            .encode("Hello, world!", false)
            .unwrap()
    );
    std::fs::remove_file(&path).unwrap();
}

/// Llama-3-8B's shape cut to one layer: a 715 MB file (the 128256 × 4096 embedding and output
/// in Q4_K), about 25 s here, mostly writing it; on request, to keep CI's budget
/// (`cargo test -p sluice-models --test synth -- --ignored`).
#[test]
#[ignore]
fn llama3_8b_shape_writes_and_loads() {
    let path = scratch("llama3-8b-1l.gguf");
    common::synth(
        &["--shape", "llama3-8b", "--layers", "1", "--dtype", "q4_k"],
        &path,
    );
    let (model, row) = last_logits(&path);
    let c = model.config();
    assert_eq!(
        (c.embedding_length, c.head_count, c.head_count_kv),
        (4096, 32, 8)
    );
    assert_eq!((c.feed_forward_length, c.vocab_size), (14336, 128_256));
    assert_eq!(row.len(), 128_256);
    assert!(row.iter().all(|x| x.is_finite()));
    std::fs::remove_file(&path).unwrap();
}

//! Shared harness for tests that run the real default model.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sluice_models::{registry, Backend, Model, ModelOptions};

/// The model cache the tests read: `SLUICE_MODEL_DIR`, else `models/cache`.
pub fn model_dir() -> PathBuf {
    std::env::var_os("SLUICE_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("cache"))
}

/// An example binary of this package, which `cargo test` builds beside the test binaries.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} missing: cargo test builds the examples",
        bin.display()
    );
    bin
}

/// Runs the `synth` example with `args`, writing `out`; fails with its stderr.
pub fn synth(args: &[&str], out: &Path) {
    let run = Command::new(example_bin("synth"))
        .args(args)
        .arg("--out")
        .arg(out)
        .env("SLUICE_MODEL_DIR", model_dir())
        .output()
        .expect("synth runs");
    assert!(
        run.status.success(),
        "synth {args:?} failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// A 2-layer random-weight model of the default model's shape in f16 on the candle backend
/// (`tag` names its scratch folder). On the CPU its products run in f32 with no 8-bit rounding
/// of the activations, which would turn last-bit differences between two ways of computing a
/// row into visible ones.
pub fn f16_candle_model(tag: &str) -> Model {
    let dir = std::env::temp_dir().join(format!("sluice-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("smollm2-2l-f16.gguf");
    synth(
        &["--shape", "smollm2-135m", "--layers", "2", "--dtype", "f16"],
        &path,
    );
    let options = ModelOptions {
        backend: Backend::Candle,
        ..Default::default()
    };
    let model = Model::load(&path, &options).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    model
}

/// The default model's file. Fails (never skips) when it is missing.
pub fn model_path() -> PathBuf {
    match registry::resolve(registry::default_model().name, &model_dir()) {
        Ok(loc) => loc.path,
        Err(e) => panic!("{e} (the model tests need the real model: run `make model`)"),
    }
}

/// `../shared/golden`, relative to the workspace root, or `SLUICE_GOLDEN_DIR`.
pub fn golden_dir() -> PathBuf {
    std::env::var_os("SLUICE_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden"))
}

/// Every line of a golden JSONL file.
pub fn golden_lines(name: &str) -> Vec<serde_json::Value> {
    let path = golden_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read golden file {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden line is JSON"))
        .collect()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// One model for the whole test binary: loading takes seconds.
pub fn model() -> &'static sluice_models::Model {
    model_on(Backend::Kernels)
}

/// The default model on the CPU with `backend`, loaded once per test binary.
pub fn model_on(backend: Backend) -> &'static sluice_models::Model {
    static KERNELS: OnceLock<sluice_models::Model> = OnceLock::new();
    static CANDLE: OnceLock<sluice_models::Model> = OnceLock::new();
    let cell = match backend {
        Backend::Kernels => &KERNELS,
        Backend::Candle => &CANDLE,
    };
    cell.get_or_init(|| {
        let options = sluice_models::ModelOptions {
            backend,
            ..Default::default()
        };
        sluice_models::Model::load(&model_path(), &options).expect("the default model loads")
    })
}

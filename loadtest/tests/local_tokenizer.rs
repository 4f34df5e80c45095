//! `--tokenizer` with the real default model file: the GGUF vocabulary rebuilt here must
//! tokenise exactly as llama.cpp does (the golden ids in `../shared/golden`), and a run against a
//! server without `/tokenize` must send prompts of exactly the requested length by it.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use common::fake::{self, Scenario};
use sluice_loadtest::config::{Args, Config};
use sluice_loadtest::prompt::Calibration;
use sluice_loadtest::session;
use sluice_loadtest::tokenizer::LocalTokenizer;

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model, from `SLUICE_MODEL_DIR` or the repository's `models/cache`. Missing is a
/// failure, not a skip: CI fetches it first.
fn model_path() -> PathBuf {
    let dir = std::env::var_os("SLUICE_MODEL_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/cache"),
        PathBuf::from,
    );
    let path = dir.join(MODEL_FILE);
    assert!(
        path.is_file(),
        "{} is missing: run `make model` (or set SLUICE_MODEL_DIR)",
        path.display()
    );
    path
}

fn load() -> LocalTokenizer {
    LocalTokenizer::load(&model_path()).expect("the default model's tokenizer loads")
}

#[test]
fn gguf_tokenizer_matches_llama_cpp_golden_ids() {
    let tok = load();
    assert!(
        tok.describe().contains("pre-tokenizer smollm"),
        "{}",
        tok.describe()
    );
    let golden =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/tokenize.jsonl");
    let text =
        std::fs::read_to_string(&golden).unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
    let mut checked = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let want: Vec<u32> = v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect();
        let text = v["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
        // The model adds no BOS (tokenizer.ggml.add_bos_token is false): counts are the ids.
        assert_eq!(tok.count(text).unwrap(), want.len(), "{text:?}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} golden lines");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_have_the_requested_length_by_the_local_tokenizer() {
    let path = model_path();
    let sc = Scenario {
        ttft: Duration::from_millis(1),
        per_token: Duration::from_millis(1),
        ..Scenario::default()
    };
    // A server without /tokenize: the local file counts.
    let (base, seen) = fake::start(Scenario {
        tokenize: false,
        ..sc.clone()
    })
    .await;
    let cfg = |base: &str, extra: &[&str]| {
        let mut v = vec![
            "sluice-loadtest",
            "--url",
            base,
            "--quiet",
            "--requests",
            "4",
        ];
        v.extend_from_slice(&["--input-len", "200", "--output-len", "2"]);
        v.extend_from_slice(&["--tokenizer", path.to_str().unwrap()]);
        v.extend_from_slice(extra);
        Config::from_args(Args::try_parse_from(v).unwrap()).unwrap()
    };
    let r = session::execute(cfg(&base, &[])).await.unwrap();
    let Calibration::Counted { by, verified, .. } = &r.calibration else {
        panic!("{:?}", r.calibration)
    };
    assert!(by.contains("local GGUF tokenizer"), "{by}");
    assert_eq!(*verified, Some((256, 256)));
    assert!(r
        .notes
        .iter()
        .any(|n| n.contains("server /tokenize not usable")));
    let tok = load();
    let prompts = seen.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 4);
    for p in &prompts {
        assert_eq!(tok.count(p).unwrap(), 200, "{p:?}");
    }

    // A server with /tokenize is preferred, unless --no-tokenize says otherwise.
    let (base, _) = fake::start(sc).await;
    let r = session::execute(cfg(&base, &[])).await.unwrap();
    assert!(r.calibration.by_server(), "{:?}", r.calibration);
    let r = session::execute(cfg(&base, &["--no-tokenize"]))
        .await
        .unwrap();
    assert!(!r.calibration.by_server(), "{:?}", r.calibration);
    assert!(
        r.calibration.to_string().contains("GGUF"),
        "{}",
        r.calibration
    );
}

#[test]
fn a_file_that_is_no_tokenizer_is_a_clear_error() {
    let p = std::env::temp_dir().join(format!("lt-not-a-tokenizer-{}.json", std::process::id()));
    std::fs::write(&p, "{\"hello\": 1}").unwrap();
    let e = LocalTokenizer::load(&p).unwrap_err().to_string();
    std::fs::remove_file(&p).ok();
    assert!(e.contains("not a tokenizer.json or GGUF"), "{e}");
}

//! The `generate` example's command-line contract (`--json`, last line of stdout), run as a real
//! process on the real model.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// The example binary cargo built beside this test (`target/<profile>/examples/generate`).
fn generate_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir
        .join("examples")
        .join(format!("generate{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} missing: `make test` builds it (cargo build --examples)",
        bin.display()
    );
    bin
}

fn run(args: &[&str]) -> Output {
    Command::new(generate_bin())
        .arg("--model")
        .arg(common::model_path())
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the example runs")
}

fn last_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    serde_json::from_str(stdout.lines().last().expect("some output"))
        .expect("the last line is JSON")
}

#[test]
fn tokenize_matches_llama_cpp() {
    for line in common::golden_lines("tokenize.jsonl").iter().take(6) {
        let text = line["text"].as_str().unwrap();
        let plain = last_json(&run(&["--json", "--tokenize", text]));
        assert_eq!(
            common::ids(&plain["ids"]),
            common::ids(&line["ids"]),
            "{text:?}"
        );
        let special = last_json(&run(&["--json", "--tokenize", text, "--parse-special"]));
        assert_eq!(
            common::ids(&special["ids"]),
            common::ids(&line["ids_parse_special"]),
            "{text:?}"
        );
    }
}

#[test]
fn messages_render_like_llama_cpp_and_decode_greedily() {
    let line = &common::golden_lines("greedy.jsonl")[1];
    let messages = line["messages"].to_string();
    let out = last_json(&run(&[
        "--json",
        "--messages",
        &messages,
        "--max-tokens",
        "6",
    ]));
    assert_eq!(
        common::ids(&out["prompt_ids"]),
        common::ids(&line["prompt_ids"])
    );
    let ids = common::ids(&out["ids"]);
    assert!(!ids.is_empty() && ids.len() <= 6, "{ids:?}");
    let text = common::model().tokenizer().decode(&ids, true).unwrap();
    assert_eq!(out["text"].as_str().unwrap(), text);
}

#[test]
fn forced_ids_give_one_step_per_token_close_to_llama_cpp() {
    let line = &common::golden_lines("greedy.jsonl")[3];
    let prompt = line["prompt_ids"].to_string();
    let greedy = common::ids(&line["greedy_ids"]);
    let force = serde_json::to_string(&greedy[..8]).unwrap();
    let out = last_json(&run(&[
        "--json",
        "--prompt-ids",
        &prompt,
        "--force-ids",
        &force,
        "--top",
        "10",
    ]));
    let steps = out["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 8);
    let reference = line["steps_top10"].as_array().unwrap();
    for (step, want) in steps.iter().zip(reference) {
        let step = step.as_array().unwrap();
        assert_eq!(step.len(), 10);
        let lps: Vec<f64> = step.iter().map(|p| p[1].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "not sorted: {lps:?}");
        // The most likely token carries a logprob close to llama.cpp's for that token.
        let (id, lp) = (step[0][0].as_u64().unwrap(), lps[0]);
        if let Some(theirs) = want
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p[0].as_u64() == Some(id))
        {
            assert!(
                (theirs[1].as_f64().unwrap() - lp).abs() < 0.6,
                "{id}: {lp} vs {theirs}"
            );
        }
    }
}

/// Runs the example with exactly `args` and returns its stderr, asserting that it failed.
fn run_failing(args: &[&str]) -> String {
    let out = Command::new(generate_bin()).args(args).output().unwrap();
    assert!(!out.status.success(), "expected a failure for {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_model_fails_with_how_to_get_it() {
    let err = run_failing(&[
        "--model",
        "smollm2-135m-instruct",
        "--model-dir",
        "/nonexistent",
        "--json",
        "--tokenize",
        "x",
    ]);
    assert!(
        err.contains("SmolLM2-135M-Instruct.Q4_1.gguf") && err.contains("make model"),
        "{err}"
    );

    let dir = std::env::temp_dir().join(format!("sluice-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("broken.gguf");
    std::fs::write(&bad, b"GGUF but not really").unwrap();
    let err = run_failing(&[
        "--model",
        bad.to_str().unwrap(),
        "--json",
        "--tokenize",
        "x",
    ]);
    assert!(err.contains("broken.gguf") && err.contains("GGUF"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

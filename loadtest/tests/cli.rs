//! The binary itself: flags and `SLUICE_LOADTEST_*` variables, the files it writes (vLLM's JSON
//! keys, per-request JSONL, SVG) and the exit status `--max-error-rate` sets.

mod common;

use std::process::Command;
use std::time::Duration;

use common::fake::{self, Scenario};

async fn run_bin(args: Vec<String>, envs: Vec<(&'static str, String)>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice-loadtest"))
            .args(&args)
            .envs(envs)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_vllm_json_per_request_lines_and_a_plot() {
    let sc = Scenario {
        ttft: Duration::from_millis(5),
        per_token: Duration::from_millis(1),
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let dir = std::env::temp_dir().join(format!("lt-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, jsonl, svg) = (dir.join("r.json"), dir.join("r.jsonl"), dir.join("r.svg"));
    let args = vec![
        "--json".to_string(),
        json.display().to_string(),
        "--per-request".into(),
        jsonl.display().to_string(),
        "--plot".into(),
        svg.display().to_string(),
        "--endpoint".into(),
        "completions".into(),
    ];
    let envs = vec![
        ("SLUICE_LOADTEST_URL", base),
        ("SLUICE_LOADTEST_REQUESTS", "6".to_string()),
        ("SLUICE_LOADTEST_CONCURRENCY", "3".to_string()),
        ("SLUICE_LOADTEST_OUTPUT_LEN", "4".to_string()),
        ("SLUICE_LOADTEST_QUIET", "true".to_string()),
    ];
    let (code, stdout, stderr) = run_bin(args, envs).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("request throughput"), "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for key in [
        "completed",
        "failed",
        "duration",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "request_goodput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p90_ttft_ms",
        "p95_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "median_e2el_ms",
        "p99_e2el_ms",
        "config",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["completed"], 6);
    assert_eq!(v["model_id"], "fake-model");
    assert_eq!(v["config"]["endpoint"], "completions");
    assert_eq!(v["config"]["mode"]["concurrency"], 3);
    let lines = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(lines.lines().count(), 6);
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(first["output_tokens"], 4);
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_error_rate_sets_exit_status_3() {
    let sc = Scenario {
        ttft: Duration::from_millis(1),
        per_token: Duration::ZERO,
        fail_every: 2,
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let args: Vec<String> = [
        "--url",
        &base,
        "--requests",
        "10",
        "--quiet",
        "--max-error-rate",
        "0.2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (code, stdout, stderr) = run_bin(args, vec![]).await;
    assert_eq!(code, 3, "{stdout}{stderr}");
    assert!(stdout.contains("http_429:5"), "{stdout}");
    assert!(stderr.contains("above --max-error-rate"), "{stderr}");

    let (code, _, stderr) = run_bin(vec!["--rate=0".into()], vec![]).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("--rate"), "{stderr}");
}

/// Starts the binary with `args`, waits until the fake has seen `sent` requests, then sends
/// `signals` SIGTERMs (a moment apart) and returns the exit status and stderr.
async fn signalled_run(
    args: Vec<String>,
    seen: &fake::Seen,
    sent: u64,
    signals: usize,
) -> (i32, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_sluice-loadtest"))
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.requests.load(std::sync::atomic::Ordering::Relaxed) < sent {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never started sending"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..signals {
        let kill = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_ends_the_run_early_with_a_report_of_everything_sent() {
    let sc = Scenario {
        ttft: Duration::from_millis(50),
        per_token: Duration::from_millis(20),
        ..Scenario::default()
    };
    let (base, seen) = fake::start(sc).await;
    let json = std::env::temp_dir().join(format!("lt-stop-{}.json", std::process::id()));
    let args: Vec<String> = [
        "--url",
        &base,
        "--rate",
        "20",
        "--arrival",
        "constant",
        "--duration",
        "600",
        "--output-len",
        "10",
        "--quiet",
        "--json",
        &json.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (code, stderr) = signalled_run(args, &seen, 6, 1).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("stopping"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // Every request the server saw was waited for and counted, and none failed.
    let sent = seen.requests.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent >= 6);
    assert_eq!(v["completed"].as_u64(), Some(sent), "{v}");
    assert_eq!(v["failed"].as_u64(), Some(0), "{v}");
    let notes = v["notes"].to_string();
    assert!(notes.contains("stopped early by a signal"), "{notes}");
    // Far fewer than 600 s at 20/s: nothing was sent after the signal.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        seen.requests.load(std::sync::atomic::Ordering::Relaxed),
        sent
    );
    std::fs::remove_file(&json).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_quits_without_waiting() {
    // Answers take minutes: only the second signal can end this run.
    let sc = Scenario {
        ttft: Duration::from_secs(300),
        ..Scenario::default()
    };
    let (base, seen) = fake::start(sc).await;
    let args: Vec<String> = [
        "--url",
        &base,
        "--rate",
        "20",
        "--duration",
        "600",
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (code, stderr) = signalled_run(args, &seen, 2, 2).await;
    assert_eq!(code, 130, "{stderr}");
    assert!(stderr.contains("quitting without a report"), "{stderr}");
}

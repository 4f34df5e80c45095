//! The load tester against an in-process fake OpenAI server whose timing is known: the reported
//! figures must match what the fake did. Tolerances are one-sided where the clock allows it
//! (a sleep never ends early) and generous above, so a busy machine does not fail them.

mod common;

use std::time::Duration;

use clap::Parser;
use common::fake::{self, Scenario};
use sluice_loadtest::config::{Args, Config};
use sluice_loadtest::prompt::Calibration;
use sluice_loadtest::report::Report;
use sluice_loadtest::session;

/// Slack above the fake's delays for scheduling noise (ms).
const SLACK_MS: f64 = 40.0;

async fn run(base: &str, args: &[&str]) -> Report {
    let mut v = vec!["sluice-loadtest", "--url", base, "--quiet"];
    v.extend_from_slice(args);
    let cfg = Config::from_args(Args::try_parse_from(v).unwrap()).unwrap();
    session::execute(cfg).await.unwrap()
}

fn within(name: &str, got: f64, want: f64, slack: f64) {
    assert!(
        got >= want - 0.5 && got <= want + slack,
        "{name}: {got:.2} ms, want {want} ms (+0..+{slack})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_figures_match_the_fake() {
    // 50 ms to the first token, 10 ms per token, every third chunk two tokens, per-chunk usage.
    let (base, seen) = fake::start(Scenario::default()).await;
    let r = run(
        &base,
        &[
            "--concurrency",
            "4",
            "--requests",
            "20",
            "--input-len",
            "32",
            "--output-len",
            "8",
        ],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!((s.completed, s.failed), (20, 0));
    assert_eq!(seen.requests.load(std::sync::atomic::Ordering::Relaxed), 20);
    assert_eq!(s.total_output_tokens, 160);
    assert_eq!(s.token_sources.get("usage"), Some(&20));
    within("TTFT mean", s.ttft.mean, 50.0, SLACK_MS);
    within("TTFT p50", s.ttft.median, 50.0, SLACK_MS);
    // Two-token chunks wait 20 ms and count as two 10 ms gaps: every ITL sample is ~10 ms.
    within("ITL mean", s.itl.mean, 10.0, 10.0);
    within("ITL p50", s.itl.median, 10.0, 10.0);
    assert_eq!(
        s.itl.count,
        20 * 7,
        "one ITL sample per token after the first"
    );
    assert_eq!(s.itl_exact_requests, 20);
    within("TPOT mean", s.tpot.mean, 10.0, 10.0);
    // E2E = 50 + 7 × 10 ms.
    within("E2E mean", s.e2el.mean, 120.0, SLACK_MS * 2.0);
    // 20 requests in 5 waves of 4, each ≥ 120 ms.
    assert!(
        s.duration >= 0.6 && s.duration < 3.0,
        "duration {}",
        s.duration
    );
    assert!((s.request_throughput * s.duration - 20.0).abs() < 1e-6);
    assert!((s.output_throughput * s.duration - 160.0).abs() < 1e-6);
    assert_eq!(s.max_in_flight, 4);
    // The fake's /tokenize counts words: prompts are exactly --input-len tokens.
    assert!(
        matches!(
            r.calibration,
            Calibration::Counted {
                ref by,
                overhead: 1,
                verified: Some((256, 256)),
                ..
            } if by == "server /tokenize"
        ),
        "{:?}",
        r.calibration
    );
    let prompts = seen.prompts.lock().unwrap();
    assert!(prompts.iter().all(|p| p.split_whitespace().count() == 32));
    assert_eq!(s.total_input_tokens, 20 * 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_per_chunk_usage_tokens_are_spread_and_without_usage_chunks_counted() {
    let sc = Scenario {
        per_chunk_usage: false,
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let r = run(
        &base,
        &["--concurrency", "2", "--requests", "6", "--output-len", "8"],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!(s.itl_exact_requests, 0);
    assert_eq!(s.token_sources.get("usage"), Some(&6));
    // 8 tokens in 7 chunks (the fake doubles chunk 3 only; chunk 6 has one token left): 7 tokens
    // over 6 gaps, spread evenly; the mean per-token gap stays ~10 ms.
    within("ITL mean", s.itl.mean, 10.0, 10.0);
    within("TPOT mean", s.tpot.mean, 10.0, 10.0);

    let sc = Scenario {
        per_chunk_usage: false,
        usage: false,
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let r = run(
        &base,
        &["--concurrency", "2", "--requests", "4", "--output-len", "8"],
    )
    .await;
    let s = &r.points[0].summary;
    // With no usage the tool counts chunks (7 per request) and says so.
    assert_eq!(s.token_sources.get("chunks"), Some(&4));
    assert_eq!(s.total_output_tokens, 4 * 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_counted_by_status_and_gate_the_error_rate() {
    let sc = Scenario {
        fail_every: 4,
        ttft: Duration::from_millis(5),
        per_token: Duration::from_millis(1),
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let r = run(
        &base,
        &[
            "--concurrency",
            "1",
            "--requests",
            "20",
            "--output-len",
            "4",
            "--max-error-rate",
            "0.1",
        ],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!((s.completed, s.failed), (15, 5));
    assert_eq!(s.errors.get("http_429"), Some(&5));
    assert_eq!(s.error_types.get("http_429 rate_limit"), Some(&5));
    assert_eq!(r.error_rate_exceeded(), Some(0.25));
    let rec = r.points[0].records.iter().find(|r| !r.ok).unwrap();
    assert!(rec.error_message.as_deref().unwrap().contains("slow down"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_counts_queueing_behind_the_cap() {
    // 50 req/s offered, one slot, each request takes ≥ 100 ms: the backlog grows by 80 ms per
    // request and must show in the latency (no coordinated omission).
    let sc = Scenario {
        ttft: Duration::from_millis(100),
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let r = run(
        &base,
        &[
            "--rate",
            "50",
            "--arrival",
            "constant",
            "--max-concurrency",
            "1",
            "--requests",
            "10",
            "--output-len",
            "1",
        ],
    )
    .await;
    let recs = &r.points[0].records;
    for (i, rec) in recs.iter().enumerate() {
        assert!(
            (rec.scheduled_s - i as f64 * 0.02).abs() < 1e-9,
            "scheduled {}",
            rec.scheduled_s
        );
        // Request i waits for i predecessors of ≥ 100 ms each, less its 20 ms offset.
        let floor = 100.0 * (i as f64 + 1.0) - 20.0 * i as f64;
        assert!(
            rec.e2el_ms >= floor - 1.0,
            "request {i}: e2e {} < {floor}",
            rec.e2el_ms
        );
        assert!(rec.ttft_ms.unwrap() >= floor - 1.0);
    }
    assert!(recs[9].send_delay_ms >= 700.0, "{}", recs[9].send_delay_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_replay_keeps_scaled_inter_arrivals_and_token_scale() {
    let dir = std::env::temp_dir().join(format!("lt-trace-{}.csv", std::process::id()));
    std::fs::write(
        &dir,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46.0000000,40,8\n\
         2023-11-16 18:15:46.2000000,60,4\n\
         2023-11-16 18:15:46.6000000,20,6\n",
    )
    .unwrap();
    let sc = Scenario {
        ttft: Duration::from_millis(1),
        per_token: Duration::from_millis(1),
        ..Scenario::default()
    };
    let (base, seen) = fake::start(sc).await;
    let path = dir.to_str().unwrap();
    let r = run(
        &base,
        &["--trace", path, "--time-scale", "2", "--token-scale", "0.5"],
    )
    .await;
    std::fs::remove_file(&dir).ok();
    let recs = &r.points[0].records;
    let sched: Vec<f64> = recs.iter().map(|r| r.scheduled_s).collect();
    for (got, want) in sched.iter().zip([0.0, 0.1, 0.3]) {
        assert!((got - want).abs() < 1e-9, "{sched:?}");
    }
    // Sends happen at the scheduled times (an open loop with no cap: no waiting).
    assert!(recs.iter().all(|r| r.send_delay_ms < 50.0));
    let max: Vec<u32> = recs.iter().map(|r| r.max_tokens).collect();
    assert_eq!(max, vec![4, 2, 3]);
    assert_eq!(r.points[0].summary.total_input_tokens, 20 + 30 + 10);
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("time ÷2") && n.contains("×0.5")),
        "{:?}",
        r.notes
    );
    assert_eq!(seen.prompts.lock().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mooncake_shared_hash_ids_send_shared_prefixes() {
    let dir = std::env::temp_dir().join(format!("lt-mc-{}.jsonl", std::process::id()));
    std::fs::write(
        &dir,
        "{\"timestamp\": 0, \"input_length\": 1200, \"output_length\": 2, \"hash_ids\": [1, 2, 3]}\n\
         {\"timestamp\": 10, \"input_length\": 1100, \"output_length\": 2, \"hash_ids\": [1, 2, 9]}\n",
    )
    .unwrap();
    let sc = Scenario {
        ttft: Duration::from_millis(1),
        per_token: Duration::from_millis(1),
        ..Scenario::default()
    };
    let (base, seen) = fake::start(sc).await;
    let r = run(
        &base,
        &["--trace", dir.to_str().unwrap(), "--token-scale", "0.1"],
    )
    .await;
    std::fs::remove_file(&dir).ok();
    assert_eq!(r.points[0].summary.completed, 2);
    let mut prompts = seen.prompts.lock().unwrap().clone();
    prompts.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let words: Vec<Vec<&str>> = prompts
        .iter()
        .map(|p| p.split_whitespace().collect())
        .collect();
    // Blocks of 51 tokens (512 × 0.1): blocks 1 and 2 are shared, the third differs.
    assert_eq!((words[0].len(), words[1].len()), (120, 110));
    assert_eq!(words[0][..102], words[1][..102]);
    assert_ne!(words[0][102..110], words[1][102..110]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unstreamed_warmup_sweep_and_goodput() {
    let sc = Scenario {
        ttft: Duration::from_millis(20),
        per_token: Duration::from_millis(2),
        tokenize: false,
        ..Scenario::default()
    };
    let (base, seen) = fake::start(sc).await;
    let r = run(
        &base,
        &[
            "--no-stream",
            "--requests",
            "5",
            "--warmup",
            "3",
            "--output-len",
            "6",
            "--slo",
            "e2e=1000",
        ],
    )
    .await;
    let s = &r.points[0].summary;
    assert_eq!(seen.requests.load(std::sync::atomic::Ordering::Relaxed), 8);
    assert_eq!(s.completed, 5, "warm-up requests are not counted");
    assert_eq!(s.ttft.count, 0, "no TTFT without streaming");
    within("E2E mean", s.e2el.mean, 30.0, SLACK_MS);
    assert!((s.request_goodput.unwrap() - s.request_throughput).abs() < 1e-9);
    assert_eq!(r.calibration, Calibration::Approx4Chars);
    assert!(r.notes.iter().any(|n| n.contains("/tokenize not usable")));

    let r = run(
        &base,
        &[
            "--sweep",
            "--sweep-steps",
            "2",
            "--requests",
            "8",
            "--output-len",
            "2",
        ],
    )
    .await;
    let labels: Vec<&str> = r.points.iter().map(|p| p.label.as_str()).collect();
    assert_eq!(labels.len(), 4);
    assert_eq!(labels[0], "synchronous");
    assert_eq!(labels[3], "throughput");
    let sync = r.points[0].summary.request_throughput;
    let max = r.points[3].summary.request_throughput;
    assert!(max > sync, "max-throughput {max} ≤ synchronous {sync}");
    let json = r.to_json();
    assert_eq!(json["sweep"].as_array().unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_bounds_scheduling_in_both_loops() {
    let sc = Scenario {
        ttft: Duration::from_millis(20),
        per_token: Duration::from_millis(2),
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    for load in [["--concurrency", "2"], ["--rate", "40"]] {
        let mut args = vec!["--duration", "0.4", "--output-len", "3"];
        args.extend_from_slice(&load);
        let r = run(&base, &args).await;
        let recs = &r.points[0].records;
        assert!(recs.len() >= 4, "{load:?}: only {} requests", recs.len());
        // Nothing is scheduled after the duration; what was in flight is waited for.
        assert!(
            recs.iter().all(|r| r.scheduled_s <= 0.4 && r.ok),
            "{load:?}"
        );
    }
}

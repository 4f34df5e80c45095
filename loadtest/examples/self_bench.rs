//! The load tester's own ceiling: requests/s against the in-process fake answering at once, and
//! the cost of timing one streamed chunk (SSE parse + JSON + bookkeeping). The fake shares the
//! machine's cores with the client, so the request rates are lower bounds on the tool alone.
//!
//! `cargo run --release -p sluice-loadtest --example self_bench` (or `make bench-loadtest`).

#[path = "../tests/common/fake.rs"]
mod fake;

use std::time::{Duration, Instant};

use clap::Parser;
use sluice_loadtest::client::{Observed, StreamRecorder};
use sluice_loadtest::config::{Args, Config};
use sluice_loadtest::session;

/// Achieved req/s, ok, failed, and the mean lateness of sends against the schedule (ms).
async fn rate(base: &str, extra: &[&str]) -> (f64, u64, u64, f64) {
    let mut v = vec![
        "sluice-loadtest",
        "--url",
        base,
        "--quiet",
        "--input-len",
        "16",
    ];
    v.extend_from_slice(extra);
    let cfg = Config::from_args(Args::try_parse_from(v).expect("flags")).expect("config");
    let r = session::execute(cfg).await.expect("run");
    let p = &r.points[0];
    let late = p.records.iter().map(|r| r.send_delay_ms).sum::<f64>() / p.records.len() as f64;
    let s = &p.summary;
    (s.request_throughput, s.completed, s.failed, late)
}

fn per_chunk_overhead(chunks: usize) -> Duration {
    let mut stream = Vec::new();
    for i in 1..=chunks {
        let chunk = serde_json::json!({
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": " tok"}}],
            "usage": {"prompt_tokens": 16, "completion_tokens": i},
        });
        stream.push(format!("data: {chunk}\n\n"));
    }
    let t0 = Instant::now();
    let mut obs = Observed::default();
    let mut rec = StreamRecorder::default();
    for frame in &stream {
        // As in the client: one clock read per frame, relative to the scheduled time.
        rec.push(frame.as_bytes(), t0.elapsed(), &mut obs);
    }
    let spent = t0.elapsed();
    assert_eq!(obs.chunks.len(), chunks);
    spent / chunks as u32
}

#[tokio::main]
async fn main() {
    let (base, _) = fake::start_with(fake::Scenario::instant(), false).await;
    // Warm the pool and the fake.
    rate(
        &base,
        &[
            "--no-stream",
            "--requests",
            "2000",
            "--concurrency",
            "64",
            "--no-tokenize",
        ],
    )
    .await;
    for (name, args) in [
        (
            "unstreamed, closed loop 64",
            vec![
                "--no-stream",
                "--requests",
                "40000",
                "--concurrency",
                "64",
                "--output-len",
                "1",
            ],
        ),
        (
            "streamed 16 tokens, closed loop 64",
            vec![
                "--requests",
                "10000",
                "--concurrency",
                "64",
                "--output-len",
                "16",
            ],
        ),
        (
            "unstreamed, open loop 6000/s",
            vec![
                "--no-stream",
                "--requests",
                "30000",
                "--rate",
                "6000",
                "--output-len",
                "1",
            ],
        ),
        (
            "unstreamed, open loop 20000/s",
            vec![
                "--no-stream",
                "--requests",
                "60000",
                "--rate",
                "20000",
                "--output-len",
                "1",
            ],
        ),
    ] {
        let mut a = args.clone();
        a.push("--no-tokenize");
        let (rps, ok, failed, late) = rate(&base, &a).await;
        println!(
            "{name:<38} {rps:>9.0} req/s  ({ok} ok, {failed} failed; sends {late:.3} ms late on average)"
        );
    }
    let per = per_chunk_overhead(200_000);
    println!(
        "{:<38} {:>9.0} ns/chunk (SSE + JSON + timestamp)",
        "per-chunk timing overhead",
        per.as_nanos()
    );
}

//! The parser against real sluice `/metrics` text (captured from `sluice serve --model` with
//! SmolLM2-135M: idle after three requests, then with six more arriving), and the names
//! against what a sluice replica really exports.

use sluice_metrics::exposition::{parse, samples, SampleRef};
use sluice_metrics::{gateway, vllm, ReplicaLoad};

const IDLE: &str = include_str!("testdata/replica-idle.metrics");
const BUSY: &str = include_str!("testdata/replica-busy.metrics");

/// The value of the one sample named `name` whose labels include `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matches = |s: &SampleRef<'_>| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.label(k).as_deref() == Some(*v))
    };
    let mut found = samples(text).map(Result::unwrap).filter(matches);
    let first = found.next().map(|s| s.value);
    assert!(found.next().is_none(), "{name} {labels:?} is not unique");
    first
}

#[test]
fn every_line_of_a_real_replica_parses() {
    for text in [IDLE, BUSY] {
        let lines = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .count();
        let owned = parse(text).expect("a real exposition parses");
        assert_eq!(owned.len(), lines);
        // The borrowed and owned forms agree sample by sample.
        for (b, o) in samples(text).map(Result::unwrap).zip(&owned) {
            assert_eq!(b.to_sample(), *o);
            assert_eq!(b.timestamp, None);
        }
    }
}

#[test]
fn counters_gauges_and_histogram_buckets_read_their_values() {
    let m = [(vllm::MODEL_NAME, "smollm2-135m-instruct")];
    let v = |text, name| value(text, name, &m);
    assert_eq!(v(IDLE, vllm::E2E_REQUEST_LATENCY_SECONDS_COUNT), Some(3.0));
    assert_eq!(v(IDLE, vllm::PROMPT_TOKENS_TOTAL), Some(96.0));
    assert_eq!(v(IDLE, vllm::GENERATION_TOKENS_TOTAL), Some(24.0));
    assert_eq!(v(BUSY, vllm::PROMPT_TOKENS_TOTAL), Some(107.0));
    let inf = [
        (vllm::MODEL_NAME, "smollm2-135m-instruct"),
        (vllm::LE, "+Inf"),
    ];
    let bucket = |name: &str| value(IDLE, &format!("{name}_bucket"), &inf);
    assert_eq!(bucket(vllm::TIME_TO_FIRST_TOKEN_SECONDS), Some(3.0));
    assert_eq!(bucket(vllm::INTER_TOKEN_LATENCY_SECONDS), Some(21.0));
    // The gateway's own admission queue (the replica is a `sluice serve`).
    let queued: f64 = samples(IDLE)
        .map(Result::unwrap)
        .filter(|s| s.name == gateway::QUEUE_DEPTH)
        .map(|s| s.value)
        .sum();
    assert_eq!(queued, 0.0);
}

#[test]
fn a_replicas_load_is_read_from_its_metrics() {
    let idle = ReplicaLoad::from_text(IDLE);
    assert_eq!(
        (idle.waiting, idle.running, idle.kv_usage),
        (Some(0.0), Some(0.0), Some(0.0))
    );
    let busy = ReplicaLoad::from_text(BUSY);
    assert_eq!((busy.running, busy.waiting), (Some(1.0), Some(5.0)));
    assert!(busy.kv_usage.unwrap() > 0.0);
}

#[test]
fn the_names_are_what_a_sluice_replica_exports() {
    let exported = |name: &str| {
        let bucket = format!("{name}_bucket");
        samples(IDLE)
            .map(Result::unwrap)
            .any(|s| s.name == name || s.name == bucket)
    };
    for name in [
        vllm::NUM_REQUESTS_WAITING,
        vllm::NUM_REQUESTS_RUNNING,
        vllm::KV_CACHE_USAGE_PERC,
        vllm::TIME_TO_FIRST_TOKEN_SECONDS,
        vllm::INTER_TOKEN_LATENCY_SECONDS,
        vllm::E2E_REQUEST_LATENCY_SECONDS,
        vllm::REQUEST_QUEUE_TIME_SECONDS,
        vllm::REQUEST_PREFILL_TIME_SECONDS,
        vllm::REQUEST_DECODE_TIME_SECONDS,
        vllm::REQUEST_SUCCESS_TOTAL,
        vllm::PROMPT_TOKENS_TOTAL,
        vllm::GENERATION_TOKENS_TOTAL,
        vllm::NUM_PREEMPTIONS_TOTAL,
        vllm::PREFIX_CACHE_QUERIES_TOTAL,
        vllm::PREFIX_CACHE_HITS_TOTAL,
        gateway::QUEUE_DEPTH,
    ] {
        assert!(exported(name), "{name}");
    }
    // The success counter carries its reason label.
    let reasons = samples(IDLE)
        .map(Result::unwrap)
        .filter(|s| s.name == vllm::REQUEST_SUCCESS_TOTAL)
        .filter(|s| s.label(vllm::FINISHED_REASON).is_some())
        .count();
    assert!(reasons > 0);
}

#[test]
fn the_ttft_buckets_are_the_exported_ones() {
    let bounds: Vec<f64> = samples(IDLE)
        .map(Result::unwrap)
        .filter(|s| s.name == "vllm:time_to_first_token_seconds_bucket")
        .filter_map(|s| s.label(vllm::LE).and_then(|le| le.parse().ok()))
        .filter(|le: &f64| le.is_finite())
        .collect();
    assert_eq!(bounds, vllm::TTFT_BUCKETS);
}

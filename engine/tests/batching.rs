//! Continuous batching on the real model: outputs do not depend on what shares the batch,
//! preemption and aborts leave nothing behind, priorities and chunked prefill hold.

mod common;

use std::time::Instant;

use common::*;
use sluice_engine::{FinishReason, SamplingParams};

/// 64 greedy requests of mixed prompt and output lengths, all in flight together, give
/// exactly the tokens each gives alone (on an engine without prefix caching, so the cached
/// path is checked against the computed one too).
#[test]
fn sixty_four_concurrent_requests_match_their_solo_runs() {
    let reqs: Vec<_> = (0..64)
        .map(|i| {
            let text = format!("{} (variant {i})", TOPICS[i % TOPICS.len()]);
            let p = if i % 5 == 0 {
                prompt(&text.repeat(1 + i % 4))
            } else {
                prompt(&text)
            };
            request(p, SamplingParams::greedy(4 + (i * 7) % 29))
        })
        .collect();
    let solo_engine = start(|c| c.enable_prefix_caching = false);
    let engine = start(|c| c.max_num_batched_tokens = 512);
    assert_together_match_alone(&solo_engine, &engine, &reqs);
    wait_for(&engine, "idle", |l| l.running == 0 && l.waiting == 0);
    assert!(engine.metrics().batch_sequences.get_sample_sum() > 0.0);
}

/// A pool far too small for the load: sequences are preempted and recomputed, every
/// request still completes with its solo output, and the preemptions are counted.
#[test]
fn a_small_kv_pool_preempts_and_still_matches_solo_output() {
    let reqs: Vec<_> = (0..12)
        .map(|i| {
            request(
                prompt(&format!("{} Please answer at length. ({i})", TOPICS[i % 8])),
                SamplingParams::greedy(48),
            )
        })
        .collect();
    // 12 × ~90 tokens need ~72 blocks of 16; give it 24.
    let engine = assert_preempted_match_alone(&start(|_| {}), &reqs, 24, 256);
    wait_for(&engine, "idle", |l| {
        l.running == 0 && l.waiting == 0 && l.kv_blocks_used == 0
    });
}

/// Dropping 100 streams mid-generation aborts them all within a step: nothing running,
/// nothing waiting, no block held (cached blocks are not held).
#[test]
fn dropping_a_hundred_streams_frees_everything() {
    let engine = start(|c| c.max_num_seqs = 64);
    let mut streams: Vec<_> = (0..100)
        .map(|i| {
            let r = request(
                prompt(&format!("Tell me a long story, number {i}.")),
                SamplingParams::greedy(400),
            );
            engine.submit(r).unwrap()
        })
        .collect();
    // Let generation get going: the first 64 have produced text.
    for s in streams.iter_mut().take(64) {
        match s.blocking_next() {
            Some(sluice_engine::Event::Delta(_)) => {}
            other => panic!("expected a delta, got {other:?}"),
        }
    }
    drop(streams);
    wait_for(&engine, "every aborted sequence gone", |l| {
        l.running == 0 && l.waiting == 0 && l.kv_blocks_used == 0
    });
    assert_eq!(engine.metrics().finished_count("abort"), 100);
}

/// Higher priority is admitted first: with one sequence at a time, a high-priority request
/// submitted after a low-priority one finishes before the low one starts.
#[test]
fn higher_priority_is_admitted_first() {
    let engine = start(|c| c.max_num_seqs = 1);
    let first = engine
        .submit(request(prompt(TOPICS[0]), SamplingParams::greedy(24)))
        .unwrap();
    wait_for(&engine, "the first request running", |l| l.running == 1);
    let mut low = request(prompt(TOPICS[1]), SamplingParams::greedy(8));
    low.priority = -1;
    let mut high = request(prompt(TOPICS[2]), SamplingParams::greedy(8));
    high.priority = 5;
    let low = engine.submit(low).unwrap();
    let high = engine.submit(high).unwrap();
    let t_low = std::thread::spawn(move || {
        let mut low = low;
        let first_event = low.blocking_next();
        let at = Instant::now();
        assert!(first_event.is_some());
        at
    });
    collect(first, 1);
    let high = collect(high, 1);
    let high_done = Instant::now();
    assert_eq!(high[0].reason, FinishReason::Length);
    assert!(
        t_low.join().unwrap() >= high_done,
        "the low-priority request started before the high-priority one finished"
    );
}

/// Chunked prefill: while a long prompt prefills in chunks, a running decode gets a token
/// every step.
#[test]
fn a_long_prefill_does_not_stall_running_decodes() {
    let engine = start(|c| {
        c.max_num_batched_tokens = 32;
        c.max_num_seqs = 8;
    });
    let mut decoding = engine
        .submit(request(prompt(TOPICS[3]), SamplingParams::greedy(200)))
        .unwrap();
    // Wait for its first token: it is now decoding.
    assert!(matches!(
        decoding.blocking_next(),
        Some(sluice_engine::Event::Delta(_))
    ));
    let long = prompt(&"The quick brown fox jumps over the lazy dog. ".repeat(30));
    assert!(long.len() > 300);
    let steps_needed = long.len() / 31;
    let mut long_stream = engine
        .submit(request(long, SamplingParams::greedy(1)))
        .unwrap();
    let first_long = long_stream.blocking_next();
    assert!(first_long.is_some());
    // Everything the decoder produced up to now arrived while the long prompt prefilled.
    let mut tokens = 0;
    while let Some(ev) = decoding.try_next() {
        if let sluice_engine::Event::Delta(d) = ev {
            tokens += d.token_ids.len();
        }
    }
    assert!(
        tokens + 1 >= steps_needed,
        "the decode got {tokens} tokens during a {steps_needed}-step prefill"
    );
}

/// After `shutdown`, new requests are refused and accepted ones still finish.
#[test]
fn shutdown_drains_and_refuses_new_work() {
    let engine = start(|_| {});
    let s = engine
        .submit(request(prompt(TOPICS[4]), SamplingParams::greedy(6)))
        .unwrap();
    engine.shutdown();
    assert_eq!(
        engine
            .submit(request(prompt(TOPICS[4]), SamplingParams::greedy(6)))
            .unwrap_err(),
        sluice_engine::SubmitError::ShuttingDown
    );
    let c = collect(s, 1);
    assert_eq!(c[0].reason, FinishReason::Length);
    assert_eq!(c[0].usage.completion_tokens, 6);
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while !engine.is_stopped() {
        assert!(Instant::now() < deadline, "the engine thread did not exit");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Sixteen requests with log-probabilities, each alone on a roomy engine, then together on an
/// engine that chunks their prefills (32 tokens a step), preempts them (a pool of 24 blocks)
/// and serves half of them a cached prefix (they share the first request's long prompt, which
/// runs first): every token is the same and every log-probability agrees within 1e-3.
fn logprobs_agree_alone_and_in_a_batch_of_16(backend: sluice_models::Backend) {
    let shared = format!("{} Answer briefly.", TOPICS[3].repeat(6));
    let reqs: Vec<_> = (0..16)
        .map(|i| {
            let text = if i % 2 == 0 {
                format!("{shared} ({i})")
            } else {
                format!("{} ({i})", TOPICS[i % TOPICS.len()])
            };
            let mut params = SamplingParams::greedy(40 + i % 5);
            params.logprobs = Some(1);
            request(prompt(&text), params)
        })
        .collect();
    let solo_engine = start_on(backend, |c| c.enable_prefix_caching = false);
    let solo: Vec<_> = reqs
        .iter()
        .map(|r| run(&solo_engine, r.clone()).remove(0))
        .collect();
    let engine = start_on(backend, |c| {
        c.num_kv_blocks = Some(24);
        c.max_model_len = Some(256);
        c.max_num_batched_tokens = 32;
        c.max_num_seqs = 16;
    });
    let first = run(&engine, reqs[0].clone()).remove(0);
    let streams: Vec<_> = reqs[1..]
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    let together: Vec<_> = std::iter::once(first)
        .chain(streams.into_iter().map(|s| collect(s, 1).remove(0)))
        .collect();
    for (i, (got, want)) in together.iter().zip(&solo).enumerate() {
        assert_eq!(got.token_ids, want.token_ids, "request {i}");
        for (j, (a, b)) in got.logprobs.iter().zip(&want.logprobs).enumerate() {
            let d = (a.logprob - b.logprob).abs();
            assert!(d <= 1e-3, "request {i} token {j}: |Δ logprob| {d}");
        }
    }
    let m = engine.metrics();
    assert!(m.preemptions.get() > 0, "no preemption happened");
    assert!(m.prefix_hits.get() > 0, "no prefix-cache hit happened");
    assert!(tokens_fed(&engine) > 0.0);
}

#[test]
fn logprobs_agree_alone_and_in_a_batch_of_16_on_the_kernels() {
    logprobs_agree_alone_and_in_a_batch_of_16(sluice_models::Backend::Kernels);
}

#[test]
fn logprobs_agree_alone_and_in_a_batch_of_16_on_candle() {
    logprobs_agree_alone_and_in_a_batch_of_16(sluice_models::Backend::Candle);
}

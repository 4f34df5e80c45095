//! Resumed choices and deadlines on the real model.

mod common;

use std::time::{Duration, Instant};

use common::*;
use sluice_engine::{Event, FinishReason, Request, Resume, SamplingParams, Stage};

fn seeded(seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_tokens: Some(max_tokens),
        ..SamplingParams::default()
    }
}

/// Resumes choice `index` of `whole` after each of a few of its deltas, as a gateway does
/// with what the client has (the token ids of the deltas sent), and checks the text and the
/// tokens go on exactly as in the uninterrupted run, with the same usage.
fn check_resumes(
    engine: &sluice_engine::EngineHandle,
    req: &Request,
    whole: &Choice,
    index: usize,
) {
    let d = whole.deltas.len();
    assert!(d >= 4, "too short to resume: {:?}", whole.deltas);
    let stream_ids = delta_ids(engine, req, index);
    assert_eq!(stream_ids.len(), d);
    for cut in [1, 2, d / 2, d - 1] {
        // The token ids of the first `cut` deltas and their text.
        let mut ids = Vec::new();
        let mut text = String::new();
        for (t, i) in whole.deltas[..cut].iter().zip(&stream_ids[..cut]) {
            text.push_str(t);
            ids.extend(i);
        }
        let mut sampling = req.sampling.clone();
        sampling.n = 1;
        let resumed = run(
            engine,
            Request {
                prompt: req.prompt.clone(),
                sampling,
                resume: Some(Resume {
                    choice: index,
                    output: ids.clone(),
                }),
                ..Request::default()
            },
        )
        .remove(0);
        assert_eq!(text + &resumed.text, whole.text, "cut after delta {cut}");
        ids.extend(&resumed.token_ids);
        assert_eq!(ids, whole.token_ids, "cut after delta {cut}");
        assert_eq!(resumed.reason, whole.reason);
        assert_eq!(
            resumed.usage.completion_tokens,
            whole.usage.completion_tokens
        );
    }
}

/// The token ids of each delta of choice `index` (the collected choice concatenates them).
fn delta_ids(engine: &sluice_engine::EngineHandle, req: &Request, index: usize) -> Vec<Vec<u32>> {
    let mut s = engine.submit(req.clone()).unwrap();
    let mut out = Vec::new();
    let mut left = req.sampling.n;
    while left > 0 {
        match s.blocking_next().unwrap() {
            Event::Delta(d) if d.index == index => out.push(d.token_ids),
            Event::Delta(_) | Event::Prompt(_) => {}
            Event::Finish(_) => left -= 1,
        }
    }
    out
}

#[test]
fn a_resumed_greedy_choice_continues_exactly() {
    let engine = start(|_| {});
    let p = prompt("Reply with only these characters, repeated three times: 🦀 日本語 é ✓");
    let req = request(p, SamplingParams::greedy(40));
    let whole = run(&engine, req.clone()).remove(0);
    check_resumes(&engine, &req, &whole, 0);
}

/// Seeded sampling with penalties and a stop string whose prefixes (`s`, `se`, …) hold text
/// back across the break; choice 2 of three keeps its own random stream.
#[test]
fn a_resumed_seeded_choice_continues_exactly() {
    let engine = start(|_| {});
    let mut params = seeded(7, 48);
    params.n = 3;
    params.presence_penalty = 0.5;
    params.repetition_penalty = 1.1;
    params.stop = vec!["sea and sky".into()];
    let req = request(prompt("Write a short poem about the sea."), params);
    let whole = run(&engine, req.clone());
    check_resumes(&engine, &req, &whole[2], 2);
    check_resumes(&engine, &req, &whole[0], 0);
}

/// A resume counts its output in the usage and the budget: one token short of `max_tokens`
/// it adds one; at `max_tokens` it finishes at once (its finish was lost); past it, it is
/// refused.
#[test]
fn a_resume_at_the_end_finishes_at_once() {
    let engine = start(|_| {});
    let req = request(prompt(TOPICS[0]), SamplingParams::greedy(3));
    let whole = run(&engine, req.clone()).remove(0);
    // max_tokens 3 ends at 3 tokens: a resume from 2 outputs adds one, from 3 adds none.
    let mut r = req.clone();
    r.resume = Some(Resume {
        choice: 0,
        output: whole.token_ids[..2].to_vec(),
    });
    let one = run(&engine, r).remove(0);
    assert_eq!(one.usage.completion_tokens, 3);
    assert_eq!(one.reason, FinishReason::Length);
    let mut full = req.clone();
    full.resume = Some(Resume {
        choice: 0,
        output: whole.token_ids.clone(),
    });
    let none = run(&engine, full).remove(0);
    assert_eq!(
        (none.text.as_str(), none.reason),
        ("", FinishReason::Length)
    );
    assert_eq!(none.usage.completion_tokens, 3);
    let mut past = req;
    let mut output = whole.token_ids.clone();
    output.push(whole.token_ids[0]);
    past.resume = Some(Resume { choice: 0, output });
    assert!(engine.submit(past).is_err());
}

/// A deadline already passed at submission ends the request in the queue; one that passes
/// while it generates stops it at a step boundary, as a deadline (never `length`), and frees
/// its blocks.
#[test]
fn a_deadline_stops_the_sequence_and_frees_its_blocks() {
    let engine = start(|_| {});
    let mut late = request(prompt(TOPICS[1]), SamplingParams::greedy(20));
    late.deadline = Some(Instant::now());
    let got = run(&engine, late).remove(0);
    assert_eq!(got.reason, FinishReason::Deadline(Stage::Queue));
    assert_eq!(got.usage.completion_tokens, 0);

    let mut params = SamplingParams::greedy(100_000.min(engine.max_model_len() - 64));
    params.ignore_eos = true;
    let mut long = request(prompt(TOPICS[5]), params);
    long.deadline = Some(Instant::now() + Duration::from_millis(400));
    let got = run(&engine, long).remove(0);
    let stage = if got.deltas.is_empty() {
        Stage::Prefill
    } else {
        Stage::Decode
    };
    assert_eq!(got.reason, FinishReason::Deadline(stage), "{:?}", got.text);
    wait_for(&engine, "the blocks", |l| {
        l.running == 0 && l.kv_blocks_used == 0 && engine.metrics().finished_count("deadline") >= 2
    });
    assert_eq!(engine.metrics().finished_count("length"), 0);
}

//! Sampling, stopping, streaming text and submission errors on the real model.

mod common;

use common::*;
use sluice_engine::{Event, FinishReason, MatchedStop, SamplingParams, SubmitError};

fn sampled(seed: u64, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens: Some(max_tokens),
        ..SamplingParams::default()
    }
}

/// The same seed gives the same tokens alone and in a busy batch; another seed differs.
#[test]
fn seeded_sampling_is_reproducible_whatever_shares_the_batch() {
    let engine = start(|_| {});
    let p = prompt("Write a short poem about the sea.");
    let alone = run(&engine, request(p.clone(), sampled(42, 32))).remove(0);
    let noise: Vec<_> = (0..7)
        .map(|i| {
            engine
                .submit(request(prompt(TOPICS[i]), sampled(1000 + i as u64, 40)))
                .unwrap()
        })
        .collect();
    let busy = run(&engine, request(p.clone(), sampled(42, 32))).remove(0);
    for s in noise {
        collect(s, 1);
    }
    assert_eq!(alone.token_ids, busy.token_ids);
    let other = run(&engine, request(p, sampled(43, 32))).remove(0);
    assert_ne!(alone.token_ids, other.token_ids);
}

/// A stop string that spans two tokens ends the text right before it; it is never emitted,
/// not even in part.
#[test]
fn a_stop_string_split_across_tokens_cuts_the_text() {
    let engine = start(|_| {});
    let m = model();
    let tok = m.tokenizer();
    let p = prompt("Explain how rain forms, in detail.");
    let full = run(&engine, request(p.clone(), SamplingParams::greedy(60))).remove(0);
    // A boundary between two tokens with two plain characters on each side (ASCII letters or
    // a space, at least one letter), so the stop string spans both tokens. (It used to demand
    // a boundary inside a word, which depends on what the model happens to say.)
    let ids = &full.token_ids;
    let (stop, expected) = (1..ids.len() - 1)
        .find_map(|k| {
            let before = tok.decode(&ids[..k], true).unwrap();
            let after = tok.decode(&ids[k..k + 1], true).unwrap();
            let tail: String = before.chars().rev().take(2).collect();
            let head: String = after.chars().take(2).collect();
            let ok = |s: &str| {
                s.len() == 2
                    && s.chars().all(|c| c.is_ascii_alphabetic() || c == ' ')
                    && s.chars().any(|c| c.is_ascii_alphabetic())
            };
            (ok(&tail) && ok(&head)).then(|| {
                let stop = format!("{}{}", tail.chars().rev().collect::<String>(), head);
                let cut = full.text.find(&stop).expect("the stop occurs in the text");
                (stop, full.text[..cut].to_string())
            })
        })
        .unwrap_or_else(|| panic!("no token boundary inside a word in {:?}", full.text));
    let mut params = SamplingParams::greedy(60);
    params.stop = vec!["no such stop string".into(), stop.clone()];
    let got = run(&engine, request(p, params)).remove(0);
    assert_eq!(got.text, expected);
    assert_eq!(got.reason, FinishReason::Stop);
    assert_eq!(got.matched, Some(MatchedStop::Text(stop.clone())));
    for d in &got.deltas {
        assert!(!d.contains(&stop));
    }
}

/// Text streams without broken characters, and the deltas add up to the decoded output.
#[test]
fn streamed_text_never_breaks_a_character() {
    let engine = start(|_| {});
    let p = prompt("Reply with only these characters, repeated three times: 🦀 日本語 é ✓");
    let got = run(&engine, request(p, SamplingParams::greedy(40))).remove(0);
    let m = model();
    let tok = m.tokenizer();
    assert_eq!(got.text, tok.decode(&got.token_ids, true).unwrap());
    let whole_has_fffd = got.text.contains('\u{FFFD}');
    for d in &got.deltas {
        assert!(whole_has_fffd || !d.contains('\u{FFFD}'), "delta {d:?}");
    }
    assert!(
        got.text.chars().any(|c| c.len_utf8() > 1),
        "the model was expected to echo multi-byte text: {:?}",
        got.text
    );
}

/// n > 1: greedy choices equal the single greedy answer; seeded choice 0 equals the n = 1
/// request with that seed; the prompt is computed once and shared.
#[test]
fn n_choices_share_the_prompt() {
    let engine = start(|_| {});
    let p = prompt(&"Describe a forest at dawn, with birds and light. ".repeat(3));
    let greedy = run(&engine, request(p.clone(), SamplingParams::greedy(12))).remove(0);
    let fresh = start(|_| {});
    let mut params = SamplingParams::greedy(12);
    params.n = 3;
    params.ignore_eos = true;
    let before = tokens_fed(&fresh);
    let choices = run(&fresh, request(p.clone(), params));
    let fed = tokens_fed(&fresh) - before;
    assert_eq!(choices.len(), 3);
    for c in &choices {
        assert_eq!(c.token_ids, greedy.token_ids);
        assert_eq!(c.usage.completion_tokens, 12);
        assert_eq!(c.usage.prompt_tokens, p.len());
    }
    // The parent prefills the prompt; each other choice recomputes only the prompt's partial
    // last block (plus its first token); then every choice decodes its remaining tokens.
    let bs = fresh.config().block_size;
    let expected = p.len() + 11 + 2 * (p.len() % bs + 11);
    assert_eq!(fed as usize, expected);

    let mut params = sampled(7, 24);
    params.n = 4;
    let four = run(&engine, request(p.clone(), params));
    let one = run(&engine, request(p, sampled(7, 24))).remove(0);
    assert_eq!(four[0].token_ids, one.token_ids);
    let distinct: std::collections::HashSet<_> = four.iter().map(|c| &c.token_ids).collect();
    assert!(
        distinct.len() > 1,
        "four sampled choices were all identical"
    );
}

/// Penalties, logit bias, min_tokens, ignore_eos and stop tokens change what is generated.
#[test]
fn penalties_bias_and_stop_tokens_apply() {
    let engine = start(|_| {});
    // Plain completion of a repetitive text: greedy decoding keeps repeating it.
    let p = model()
        .tokenizer()
        .encode(&"one two three, one two three, ".repeat(4), false)
        .unwrap();
    let greedy = |max| SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max)
    };
    let plain = run(&engine, request(p.clone(), greedy(40))).remove(0);
    let distinct = |ids: &[u32]| ids.iter().collect::<std::collections::HashSet<_>>().len();
    for f in [
        |s: &mut SamplingParams| s.frequency_penalty = 2.0,
        |s: &mut SamplingParams| s.presence_penalty = 2.0,
        |s: &mut SamplingParams| s.repetition_penalty = 1.8,
    ] {
        let mut params = greedy(40);
        f(&mut params);
        let got = run(&engine, request(p.clone(), params)).remove(0);
        assert!(
            distinct(&got.token_ids) > distinct(&plain.token_ids),
            "penalised {:?} is no more varied than {:?}",
            got.text,
            plain.text
        );
    }
    // Banning the greedy first token changes the first token; forcing one repeats it.
    let mut ban = SamplingParams::greedy(5);
    ban.logit_bias.insert(plain.token_ids[0], -100.0);
    let banned = run(&engine, request(p.clone(), ban)).remove(0);
    assert_ne!(banned.token_ids[0], plain.token_ids[0]);
    let forced_id = model().tokenizer().encode(" river", false).unwrap()[0];
    let mut force = SamplingParams::greedy(5);
    force.logit_bias.insert(forced_id, 100.0);
    let forced = run(&engine, request(p.clone(), force)).remove(0);
    assert_eq!(forced.token_ids, vec![forced_id; 5]);

    // A short answer ends with EOS; min_tokens holds it off, ignore_eos runs to the limit.
    let short = prompt("Answer with one word: what colour is grass?");
    let eos = run(&engine, request(short.clone(), SamplingParams::greedy(64))).remove(0);
    assert_eq!(eos.reason, FinishReason::Stop);
    assert!(matches!(eos.matched, Some(MatchedStop::Token(_))));
    let n = eos.usage.completion_tokens;
    let mut min = SamplingParams::greedy(64);
    min.min_tokens = n + 5;
    let longer = run(&engine, request(short.clone(), min)).remove(0);
    assert!(longer.usage.completion_tokens >= n + 5);
    let mut ign = SamplingParams::greedy(30);
    ign.ignore_eos = true;
    let all = run(&engine, request(short.clone(), ign)).remove(0);
    assert_eq!(all.reason, FinishReason::Length);
    assert_eq!(all.usage.completion_tokens, 30);

    // A stop token ends the choice and is not part of the text.
    let stop_at = plain.token_ids[3];
    let first = plain.token_ids.iter().position(|&t| t == stop_at).unwrap();
    let mut st = SamplingParams::greedy(40);
    st.stop_token_ids = vec![stop_at];
    let stopped = run(&engine, request(p, st)).remove(0);
    assert_eq!(stopped.token_ids, plain.token_ids[..first]);
    assert_eq!(stopped.matched, Some(MatchedStop::Token(stop_at)));
    assert_eq!(stopped.usage.completion_tokens, first + 1);
}

/// Log-probabilities: one entry per token, the greedy token is the most likely, the top
/// alternatives come sorted.
#[test]
fn logprobs_come_with_every_token() {
    let engine = start(|_| {});
    let mut params = SamplingParams::greedy(16);
    params.logprobs = Some(5);
    params.ignore_eos = true;
    let got = run(&engine, request(prompt(TOPICS[6]), params)).remove(0);
    assert_eq!(got.logprobs.len(), got.token_ids.len());
    for (lp, &t) in got.logprobs.iter().zip(&got.token_ids) {
        assert_eq!(lp.token, t);
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0].0, t);
        assert_eq!(lp.top[0].1, lp.logprob);
        assert!(lp.logprob <= 0.0);
        assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
    }
}

/// Bad words: the output never holds a banned token sequence (a one-token word is never
/// chosen, a longer one's last token is held back right after the rest of it), on the host
/// path and the device-pick path alike; an empty word or a token outside the vocabulary is
/// refused.
#[test]
fn bad_words_are_never_completed() {
    let engine = start(|_| {});
    let p = prompt(TOPICS[1]);
    let free = run(&engine, request(p.clone(), SamplingParams::greedy(24))).remove(0);
    let ids = free.token_ids.clone();
    assert!(ids.len() >= 4, "{ids:?}");
    let (single, pair) = (vec![ids[0]], ids[1..3].to_vec());
    for logprobs in [None, Some(3)] {
        let mut params = SamplingParams::greedy(24);
        params.bad_words = vec![single.clone(), pair.clone()];
        params.logprobs = logprobs;
        let got = run(&engine, request(p.clone(), params)).remove(0).token_ids;
        assert!(!got.contains(&single[0]), "{got:?}");
        assert!(!got.windows(2).any(|w| w == pair.as_slice()), "{got:?}");
    }
    for bad in [vec![Vec::new()], vec![vec![49_152]]] {
        let mut params = SamplingParams::greedy(4);
        params.bad_words = bad;
        assert!(engine.submit(request(p.clone(), params)).is_err());
    }
}

/// An allow-list: every token drawn is listed, greedy or sampled; the greedy one is the
/// listed id the model finds most likely there (each listed id's log-probability found by
/// forcing it); an empty, unsorted or out-of-vocabulary list is refused.
#[test]
fn allowed_token_ids_bound_every_draw() {
    let engine = start(|_| {});
    let p = prompt(TOPICS[3]);
    let free = run(&engine, request(p.clone(), SamplingParams::greedy(8))).remove(0);
    // Not the free answer's first token: the list changes the answer.
    let mut allowed: Vec<u32> = vec![free.token_ids[1], 11, 30, 1_000, 20_000];
    allowed.retain(|&t| t != free.token_ids[0]);
    allowed.sort_unstable();
    allowed.dedup();
    for params in [SamplingParams::greedy(12), sampled(7, 12)] {
        let mut params = params;
        params.allowed_token_ids = Some(allowed.clone());
        let got = run(&engine, request(p.clone(), params)).remove(0).token_ids;
        assert!(got.iter().all(|t| allowed.contains(t)), "{got:?}");
        assert_eq!(got.len(), 12, "no end-of-sequence id is listed");
    }
    let mut greedy = SamplingParams::greedy(1);
    greedy.allowed_token_ids = Some(allowed.clone());
    let first = run(&engine, request(p.clone(), greedy)).remove(0).token_ids[0];
    let best = allowed
        .iter()
        .map(|&t| (forced_logprob(&engine, &p, t), t))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    assert_eq!(first, best.1);
    for bad in [vec![], vec![30, 11], vec![11, 11], vec![49_152]] {
        let mut params = SamplingParams::greedy(4);
        params.allowed_token_ids = Some(bad);
        assert!(engine.submit(request(p.clone(), params)).is_err());
    }
}

/// The log-probability of `next` after `prefix`, found by forcing it: the greedy token under
/// a +100 bias, whose reported log-probability is the raw one (before bias).
fn forced_logprob(engine: &sluice_engine::EngineHandle, prefix: &[u32], next: u32) -> f32 {
    let mut force = SamplingParams::greedy(1);
    force.logprobs = Some(0);
    force.logit_bias.insert(next, 100.0);
    let got = run(engine, request(prefix.to_vec(), force)).remove(0);
    assert_eq!(got.token_ids, [next]);
    got.logprobs[0].logprob
}

/// Prompt log-probabilities: one per prompt token after the first, each the token's
/// log-probability after the tokens before it (checked against forcing that token after
/// that prefix, at chunk boundaries and elsewhere), with sorted alternatives; gathered over
/// several steps for a long prompt, sent once before any output of any choice, whole even
/// when the prefix cache holds the prompt (which then supplies none of it), and an empty
/// list for a prompt of one token.
#[test]
fn prompt_logprobs_cover_every_prompt_token() {
    let engine = start(|_| {});
    let mut long = Vec::new();
    for t in TOPICS.iter().cycle().take(40) {
        long.extend(prompt(t));
    }
    assert!(
        long.len() > 300,
        "{} tokens: must span two steps' rows",
        long.len()
    );
    // Cache the prompt first.
    run(&engine, request(long.clone(), SamplingParams::greedy(1)));
    let mut params = SamplingParams::greedy(3);
    params.prompt_logprobs = Some(2);
    params.n = 2;
    params.temperature = 0.8;
    let got = run(&engine, request(long.clone(), params));
    let prompt = got[0].prompt_logprobs.clone().expect("asked for");
    assert_eq!(got[1].prompt_logprobs.as_ref(), Some(&prompt));
    assert_eq!(got[0].usage.cached_prompt_tokens, 0);
    let lps = prompt.logprobs;
    assert_eq!(
        (lps.len(), prompt.ranks.len()),
        (long.len() - 1, long.len() - 1)
    );
    for ((lp, &t), &rank) in lps.iter().zip(&long[1..]).zip(&prompt.ranks) {
        assert_eq!(lp.token, t);
        assert!(lp.logprob <= 0.0 && lp.top.len() == 2, "{lp:?}");
        assert!(lp.top[0].1 >= lp.top[1].1 && lp.top[0].1 >= lp.logprob - 1e-6);
        // Rank 1 is the most likely (the top's first, up to ties); rank 2 the second's.
        assert_eq!(rank == 1, lp.logprob == lp.top[0].1, "{lp:?} rank {rank}");
        assert!(rank != 2 || lp.logprob == lp.top[1].1, "{lp:?} rank {rank}");
    }
    for p in [1, 17, 254, 255, 256, 257, long.len() - 2] {
        let want = forced_logprob(&engine, &long[..=p], long[p + 1]);
        let diff = (lps[p].logprob - want).abs();
        assert!(diff < 1e-3, "position {p}: {} vs {want}", lps[p].logprob);
    }
    let mut one = SamplingParams::greedy(1);
    one.prompt_logprobs = Some(0);
    let got = run(&engine, request(long[..1].to_vec(), one)).remove(0);
    let empty = got.prompt_logprobs.unwrap();
    assert!(empty.logprobs.is_empty() && empty.ranks.is_empty());
}

/// Prompt log-probabilities under preemption by recompute: in a pool far too small, each
/// request's list is still whole, sent once, and what it is alone; nothing is left held.
#[test]
fn prompt_logprobs_survive_preemption() {
    let reqs: Vec<_> = (0..8)
        .map(|i| {
            let mut params = SamplingParams::greedy(40);
            params.prompt_logprobs = Some(1);
            let text = format!("{} Please answer at length. ({i})", TOPICS[i % 8]);
            request(prompt(&text.repeat(2)), params)
        })
        .collect();
    let engine = start(|c| {
        c.num_kv_blocks = Some(24);
        c.max_model_len = Some(256);
    });
    let pairs = together_and_alone(&start(|_| {}), &engine, &reqs);
    for (i, (got, want)) in pairs.into_iter().enumerate() {
        let got = got.prompt_logprobs.unwrap().logprobs;
        let want = want.prompt_logprobs.unwrap().logprobs;
        assert_eq!(got.len(), reqs[i].prompt.len() - 1, "request {i}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.token, w.token, "request {i}");
            assert!(
                (g.logprob - w.logprob).abs() < 1e-3,
                "request {i}: {g:?} vs {w:?}"
            );
        }
    }
    assert!(
        engine.metrics().preemptions.get() > 0,
        "the pool must have been too small"
    );
    wait_for(&engine, "idle", |l| {
        l.running == 0 && l.waiting == 0 && l.kv_blocks_used == 0
    });
}

/// A request that cannot fit, a full queue and bad parameters fail at submission.
#[test]
fn submission_errors_are_typed() {
    let engine = start(|c| {
        c.max_model_len = Some(128);
        c.max_waiting = 2;
        c.max_num_seqs = 1;
    });
    let p = prompt(TOPICS[0]);
    assert!(matches!(
        engine.submit(request(p.clone(), SamplingParams::greedy(128))),
        Err(SubmitError::ContextLength {
            max_model_len: 128,
            ..
        })
    ));
    assert!(matches!(
        engine.submit(request(vec![], SamplingParams::greedy(1))),
        Err(SubmitError::InvalidRequest(_))
    ));
    let running = engine
        .submit(request(p.clone(), SamplingParams::greedy(60)))
        .unwrap();
    wait_for(&engine, "one running", |l| l.running == 1);
    let w1 = engine
        .submit(request(p.clone(), SamplingParams::greedy(2)))
        .unwrap();
    let w2 = engine
        .submit(request(p.clone(), SamplingParams::greedy(2)))
        .unwrap();
    let full = engine.submit(request(p.clone(), SamplingParams::greedy(2)));
    assert_eq!(full.unwrap_err(), SubmitError::QueueFull { max_waiting: 2 });
    for s in [running, w1, w2] {
        collect(s, 1);
    }
    // Room again.
    assert!(engine.submit(request(p, SamplingParams::greedy(2))).is_ok());
}

/// A 400-token prefix processed once is reused: the second request reports cached prompt
/// tokens and prefills only what follows the prefix.
#[test]
fn a_shared_prefix_is_prefilled_once() {
    let engine = start(|_| {});
    let doc = "Sluice routes requests across replicas and batches them continuously. ".repeat(32);
    let a = prompt(&format!("{doc}\nQuestion: what does it route?"));
    let b = prompt(&format!("{doc}\nQuestion: how does it batch?"));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared >= 400, "shared prefix {shared}");
    let first = run(&engine, request(a, SamplingParams::greedy(4))).remove(0);
    assert_eq!(first.usage.cached_prompt_tokens, 0);
    let before = tokens_fed(&engine);
    let hits_before = engine.metrics().prefix_hits.get();
    let second = run(&engine, request(b.clone(), SamplingParams::greedy(4))).remove(0);
    let fed = (tokens_fed(&engine) - before) as usize;
    let bs = engine.config().block_size;
    let cached = second.usage.cached_prompt_tokens;
    assert_eq!(cached, shared / bs * bs);
    assert_eq!(fed, b.len() - cached + 3, "prefilled tokens plus 3 decodes");
    assert_eq!(
        engine.metrics().prefix_hits.get() - hits_before,
        cached as u64
    );
    // And the answer is the one computed without the cache.
    let cold = start(|c| c.enable_prefix_caching = false);
    let reference = run(&cold, request(b, SamplingParams::greedy(4))).remove(0);
    assert_eq!(second.token_ids, reference.token_ids);
}

/// Dropping a stream ends the request as aborted; its finish is counted.
#[test]
fn a_dropped_stream_is_aborted() {
    let engine = start(|_| {});
    let mut s = engine
        .submit(request(prompt(TOPICS[5]), SamplingParams::greedy(300)))
        .unwrap();
    assert!(matches!(s.blocking_next(), Some(Event::Delta(_))));
    drop(s);
    // The load gauges drop when the blocks are released, a moment before the finish is
    // counted: wait for all three, then check nothing else finished it.
    wait_for(&engine, "abort", |l| {
        l.running == 0 && l.kv_blocks_used == 0 && engine.metrics().finished_count("abort") >= 1
    });
    assert_eq!(engine.metrics().finished_count("abort"), 1);
    assert_eq!(engine.metrics().finished_count("stop"), 0);
    assert_eq!(engine.metrics().finished_count("length"), 0);
}

/// A schema of the shapes structured outputs use: nested object, enum, bounded integer,
/// array with bounds, optional field.
fn person_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "colour": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                     "minItems": 1, "maxItems": 3},
            "address": {"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"], "additionalProperties": false}
        },
        "required": ["name", "age", "colour", "tags", "address"],
        "additionalProperties": false
    })
}

/// Checks `v` against [`person_schema`] by hand.
fn is_person(v: &serde_json::Value) -> bool {
    let o = v.as_object().unwrap();
    let age = o["age"].as_i64().unwrap();
    let tags = o["tags"].as_array().unwrap();
    o.len() == 5
        && o["name"].as_str().unwrap().chars().count() <= 20
        && (0..=120).contains(&age)
        && ["red", "green", "blue"].contains(&o["colour"].as_str().unwrap())
        && (1..=3).contains(&tags.len())
        && o["address"]["city"].is_string()
}

/// Every choice of a sampled request (n = 4, temperature 1) is valid JSON for the schema,
/// ends as a stop, and logprobs stay those of the raw distribution.
#[test]
fn constrained_choices_all_match_their_schema() {
    let engine = start(|_| {});
    let grammar = sluice_engine::Grammar::JsonSchema(person_schema());
    let constraint = engine.compile(&grammar).expect("the schema compiles");
    let sampling = SamplingParams {
        n: 4,
        temperature: 1.0,
        seed: Some(7),
        max_tokens: Some(200),
        logprobs: Some(0),
        constraint: Some(constraint),
        ..SamplingParams::default()
    };
    let choices = run(
        &engine,
        request(prompt("Describe a person as JSON."), sampling),
    );
    for c in &choices {
        assert_eq!(c.reason, FinishReason::Stop, "{:?}", c.text);
        let v: serde_json::Value = serde_json::from_str(&c.text).expect(&c.text);
        assert!(is_person(&v), "{v}");
        assert!(c.logprobs.iter().all(|l| l.logprob <= 0.0));
    }
    let cost = engine.mask_cost();
    assert!(cost.masks > 0, "{cost:?}");
}

/// Out of tokens before the JSON closes: `length`, as OpenAI's.
#[test]
fn a_constrained_choice_cut_by_max_tokens_is_length() {
    let engine = start(|_| {});
    let constraint = engine
        .compile(&sluice_engine::Grammar::JsonSchema(person_schema()))
        .unwrap();
    let sampling = SamplingParams {
        constraint: Some(constraint),
        ..SamplingParams::greedy(5)
    };
    let c = run(&engine, request(prompt("A person as JSON."), sampling)).remove(0);
    assert_eq!(c.reason, FinishReason::Length);
    assert_eq!(c.token_ids.len(), 5);
    assert!(c.text.starts_with("{\""), "{:?}", c.text);
}

/// An enum forces one of its values, and the choice stops when the grammar is complete;
/// invalid schemas and unsupported keywords are refused when compiled.
#[test]
fn a_grammar_ends_the_choice_and_bad_schemas_are_refused() {
    let engine = start(|_| {});
    let yes_no = serde_json::json!({"enum": ["yes", "no"]});
    let constraint = engine
        .compile(&sluice_engine::Grammar::JsonSchema(yes_no))
        .unwrap();
    let sampling = SamplingParams {
        constraint: Some(constraint),
        ..SamplingParams::greedy(20)
    };
    let c = run(&engine, request(prompt("Is water wet?"), sampling)).remove(0);
    assert!(c.text == "\"yes\"" || c.text == "\"no\"", "{:?}", c.text);
    assert_eq!(c.reason, FinishReason::Stop);
    for (schema, says) in [
        (serde_json::json!({"type": "strin"}), "strin"),
        (serde_json::json!({"type": "object", "if": {}}), "if"),
    ] {
        let e = engine
            .compile(&sluice_engine::Grammar::JsonSchema(schema))
            .unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
    }
}

/// A pool too small for the load: constrained sequences are preempted and recomputed, and
/// their matchers (which live with the choice) stay in step: every output is still valid and
/// equals its solo run.
#[test]
fn constrained_sequences_survive_preemption() {
    let solo_engine = start(|_| {});
    let constraint = solo_engine
        .compile(&sluice_engine::Grammar::JsonSchema(person_schema()))
        .unwrap();
    let reqs: Vec<_> = (0..4)
        .map(|i| {
            let sampling = SamplingParams {
                constraint: Some(constraint.clone()),
                ..SamplingParams::greedy(40)
            };
            request(prompt(&format!("{} As JSON. ({i})", TOPICS[i])), sampling)
        })
        .collect();
    // 4 × ~80 tokens need ~20 blocks of 16; give it 10.
    assert_preempted_match_alone(&solo_engine, &reqs, 10, 128);
}

/// A grammar that dead-ends mid-generation (its first literal leads to a lexeme nothing
/// matches, so after it no token is allowed) ends the choice with a grammar finish that says
/// why, n = 2 alike, and frees the choices' KV blocks; a resumed output the grammar rejects
/// ends the same way before any step.
#[test]
fn a_grammar_that_dead_ends_fails_the_choice_and_frees_its_blocks() {
    let engine = start(|_| {});
    let dead_end =
        sluice_engine::Grammar::Lark("start: \"{\" NOTHING\nNOTHING: /a/ & /b/\n".into());
    let constraint = engine.compile(&dead_end).expect("the grammar compiles");
    let sampling = SamplingParams {
        n: 2,
        constraint: Some(constraint.clone()),
        ..SamplingParams::greedy(20)
    };
    let choices = run(&engine, request(prompt("Say something as JSON."), sampling));
    for c in &choices {
        let FinishReason::Grammar(why) = &c.reason else {
            panic!("{:?} after {:?}", c.reason, c.text);
        };
        assert!(why.contains("allows no token"), "{why}");
        assert_eq!(c.text, "{");
    }
    wait_for(&engine, "the blocks freed", |l| l.kv_blocks_used == 0);
    let json = engine
        .compile(&sluice_engine::Grammar::JsonSchema(person_schema()))
        .unwrap();
    let mut req = request(
        prompt("A person as JSON."),
        SamplingParams {
            constraint: Some(json),
            ..SamplingParams::greedy(20)
        },
    );
    req.resume = Some(sluice_engine::Resume {
        choice: 0,
        output: model().tokenizer().encode("Hello", false).unwrap(),
    });
    let c = run(&engine, req).remove(0);
    assert!(
        matches!(c.reason, FinishReason::Grammar(_)),
        "{:?}",
        c.reason
    );
    wait_for(&engine, "the blocks freed", |l| l.kv_blocks_used == 0);
}

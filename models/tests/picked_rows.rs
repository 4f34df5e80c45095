//! Rows that ask for a picked token alone ([`Logits::Pick`]: a greedy id, a draw at a
//! temperature, a top list, a nucleus), through the real model: the candle backend answers
//! them with the token the pick chooses from the whole row on the host (below the row's
//! bound) and its log-probability there (a top list as the host's top k; a nucleus's with the
//! row's mass, or the row whole where the list does not hold the nucleus), in an ordinary
//! step beside whole rows and in a decode step on the fixed inputs a GPU replays; with
//! `set_device_argmax(false)` and `set_device_draws(false)` it answers them whole, and the CPU
//! kernels always do. Whole rows come back as they would without picked rows beside them.

mod common;

use sluice_models::host_logits::Row;
use sluice_models::logits::{
    holds_nucleus, log_normaliser, log_softmax, max, max_abs_diff, softmax_weights, sum_of, top_k,
    top_logprobs,
};
use sluice_models::{
    Backend, HostLogits, Logits, Model, Network, Nucleus, Pick, SeqChunk, StepBatch,
};

const BLOCK: usize = 16;
const PER_SEQ: usize = 4;

/// Sequence `s`'s token at position `p`: deterministic, past the special tokens.
fn token(s: usize, p: usize) -> u32 {
    (100 + (s * 7919 + p * 104_729) % 40_000) as u32
}

/// What each sequence asks in the decode step: as in the prefill, a row where it asked none
/// (so that every sequence decodes and the step takes the fixed inputs' path).
fn decode_ask(ask: &[Logits]) -> Vec<Logits> {
    ask.iter()
        .map(|a| if *a == Logits::None { Logits::Last } else { *a })
        .collect()
}

/// A prefill of `lens[s]` tokens per sequence asking as `ask[s]` says, then one decode step
/// of them all asking as [`decode_ask`] says; both steps' logits.
fn run(m: &Model, lens: &[usize], ask: &[Logits]) -> Vec<HostLogits> {
    let mut kv = m.new_kv_store(lens.len() * PER_SEQ, BLOCK).unwrap();
    let table = |s: usize| (s * PER_SEQ..(s + 1) * PER_SEQ).map(|b| b as u32).collect();
    let prefill = StepBatch {
        seqs: (0..lens.len())
            .map(|s| SeqChunk {
                tokens: (0..lens[s]).map(|p| token(s, p)).collect(),
                start_pos: 0,
                block_table: table(s),
                logits: ask[s],
            })
            .collect(),
    };
    let decode_ask = decode_ask(ask);
    let decode = StepBatch {
        seqs: (0..lens.len())
            .map(|s| SeqChunk {
                tokens: vec![token(s, lens[s])],
                start_pos: lens[s],
                block_table: table(s),
                logits: decode_ask[s],
            })
            .collect(),
    };
    [prefill, decode]
        .iter()
        .map(|b| m.forward_host(b, &mut kv).unwrap())
        .collect()
}

/// A row's weight at `n`'s temperature, as the host sums it.
fn mass(row: &[f32], n: Nucleus) -> f32 {
    let mut w = Vec::new();
    softmax_weights(row, max(row), 1.0 / n.temperature, &mut w);
    sum_of(&w, |x| x) as f32
}

/// Whether a row's top 64 hold `n`'s nucleus, as the host finds it.
fn held(row: &[f32], n: Nucleus) -> bool {
    let top: Vec<(u32, f32)> = top_k(row, 64)
        .into_iter()
        .map(|i| (i, row[i as usize]))
        .collect();
    holds_nucleus(&top, 1.0 / n.temperature, mass(row, n), n.top_p)
}

/// Checks `got` against whole rows `want` for sequences asking `ask` (every sampled sequence
/// has a row): picked rows as `picks_whole` says (whole, or their token), whole rows equal.
/// How many nuclei came back as top lists and how many whole.
fn check(got: &HostLogits, want: &HostLogits, ask: &[Logits], picks_whole: bool) -> [usize; 2] {
    let sampled: Vec<&Logits> = ask.iter().filter(|a| **a != Logits::None).collect();
    assert_eq!(got.rows(), sampled.len());
    let mut nuclei = [0, 0];
    for (i, a) in sampled.into_iter().enumerate() {
        let whole = want.row(i);
        match (a, got.get(i)) {
            (Logits::Pick(pick @ Pick::Top { nucleus, .. }), Row::Logits(r))
                if !picks_whole && nucleus.is_some() =>
            {
                let n = nucleus.unwrap();
                let d = max_abs_diff(&[r.to_vec()], &[whole.to_vec()]);
                assert!(d <= 1e-4, "row {i}: max |Δ logit| {d}");
                assert!(!held(&whole[..pick.below() as usize], n), "row {i}: held");
                nuclei[1] += 1;
            }
            (Logits::Pick(pick @ Pick::Top { k, nucleus, .. }), Row::Top(t)) if !picks_whole => {
                let row = &whole[..pick.below() as usize];
                let want: Vec<u32> = top_k(row, *k);
                let got: Vec<u32> = t.logits.iter().map(|c| c.0).collect();
                assert_eq!(got, want, "row {i}");
                for &(id, l) in &t.logits {
                    assert!((l - row[id as usize]).abs() <= 1e-4, "row {i}: id {id}");
                }
                let d = (t.log_z - log_normaliser(row)).abs();
                assert!(d <= 1e-4, "row {i}: log normaliser off by {d}");
                assert_eq!(t.mass.is_some(), nucleus.is_some(), "row {i}");
                if let (Some(n), Some(got)) = (nucleus, t.mass) {
                    let want = mass(row, *n);
                    assert!(
                        (got - want).abs() <= 1e-4 * want,
                        "row {i}: mass {got} vs {want}"
                    );
                    assert!(
                        held(row, *n),
                        "row {i}: the top list does not hold the nucleus"
                    );
                    nuclei[0] += 1;
                }
            }
            (Logits::Pick(pick), Row::Picked(p)) if !picks_whole => {
                assert!(p.id < pick.below(), "row {i}: {} past {pick:?}", p.id);
                assert_eq!(p.id, pick.on_host(whole), "row {i}: {pick:?}");
                let row = &whole[..pick.below() as usize];
                let want = log_softmax(row)[p.id as usize];
                match p.logprob {
                    Some(got) => assert!((got - want).abs() <= 1e-4, "row {i}: {got} vs {want}"),
                    None => assert_eq!(pick.logprobs(), None, "row {i}: no logprob"),
                }
                assert_eq!(p.logprob.is_some(), pick.logprobs().is_some(), "row {i}");
                let top = top_logprobs(row, pick.top_logprobs());
                assert_eq!(p.top.len(), top.len(), "row {i}");
                for (g, w) in p.top.iter().zip(&top) {
                    assert!(
                        g.0 == w.0 && (g.1 - w.1).abs() <= 1e-4,
                        "row {i}: {g:?} against {w:?}"
                    );
                }
            }
            (_, Row::Logits(r)) if picks_whole || *a == Logits::Last => {
                let d = max_abs_diff(&[r.to_vec()], &[whole.to_vec()]);
                assert!(d <= 1e-4, "row {i}: max |Δ logit| {d}");
            }
            (a, row) => panic!("row {i} asked {a:?}, came back {row:?}"),
        }
    }
    nuclei
}

#[test]
fn picked_rows_come_back_as_the_token_picked_on_the_host_or_whole() {
    let lens = [9, 17, 4, 30, 12, 21, 6, 15, 11, 8];
    let vocab = 49_152;
    let draw = |below, temperature, min_p, uniform, logprobs| {
        Logits::Pick(Pick::Draw {
            below,
            temperature,
            min_p,
            uniform,
            logprobs,
        })
    };
    let argmax = |below, logprobs| Logits::Pick(Pick::Argmax { below, logprobs });
    let nucleus = |temperature, top_p| {
        Logits::Pick(Pick::Top {
            below: vocab,
            k: 64,
            nucleus: Some(Nucleus { temperature, top_p }),
        })
    };
    let ask = [
        argmax(vocab, None),
        Logits::Last,
        Logits::None,
        // Below the ids a prompt's argmax lands on: the bound must bite.
        argmax(100, Some(5)),
        draw(vocab, 0.8, 0.0, 0.37, Some(20)),
        // Flattened, floored, and bounded below the likely ids again.
        draw(vocab, 1.7, 0.02, 0.91, None),
        draw(100, 1.0, 0.0, 0.5, Some(3)),
        Logits::Pick(Pick::Top {
            below: vocab,
            k: 40,
            nucleus: None,
        }),
        // Top-p over the whole row: a sharp nucleus the top 64 hold, a flat one they do not.
        nucleus(0.2, 0.5),
        nucleus(2.0, 0.99),
    ];
    // Every sampled row whole: the reference.
    let all_whole: Vec<Logits> = ask
        .iter()
        .map(|a| match a {
            Logits::Pick(_) => Logits::Last,
            other => *other,
        })
        .collect();
    let candle = common::model_on(Backend::Candle);
    let Network::Candle(net) = candle.network() else {
        panic!("the candle backend loads a candle network");
    };
    net.set_cuda_graphs(false);
    let want = run(candle, &lens, &all_whole);
    net.set_cuda_graphs(true);
    let before = net.cuda_graphs().steps;
    let picked = run(candle, &lens, &ask);
    assert_eq!(
        net.cuda_graphs().steps - before,
        1,
        "the decode step took the fixed inputs"
    );
    net.set_device_argmax(false);
    net.set_device_draws(false);
    let whole = run(candle, &lens, &ask);
    net.set_device_argmax(true);
    net.set_device_draws(true);
    net.set_cuda_graphs(false);
    let eager = run(candle, &lens, &ask);
    for (step, ask) in [ask.to_vec(), decode_ask(&ask)].iter().enumerate() {
        let nuclei = check(&picked[step], &want[step], ask, false);
        assert_eq!(nuclei, [1, 1], "step {step}: one nucleus held, one whole");
        check(&eager[step], &want[step], ask, false);
        check(&whole[step], &want[step], ask, true);
    }
    let kernels = common::model_on(Backend::Kernels);
    let want = run(kernels, &lens, &all_whole);
    let got = run(kernels, &lens, &ask);
    for (step, ask) in [ask.to_vec(), decode_ask(&ask)].iter().enumerate() {
        check(&got[step], &want[step], ask, true);
    }
}

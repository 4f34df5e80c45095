//! Rows that ask for their greedy id alone ([`Logits::Greedy`]), through the real model: the
//! candle backend answers them with the id the sampler would pick from the whole row (below
//! the row's bound), in an ordinary step beside whole rows and in a decode step on the fixed
//! inputs a GPU replays; with `set_device_argmax(false)` it answers them whole, and the CPU
//! kernels always do. Whole rows come back as they would without greedy rows beside them.

mod common;

use sluice_models::host_logits::Row;
use sluice_models::logits::{argmax, max_abs_diff};
use sluice_models::{Backend, HostLogits, Logits, Model, Network, SeqChunk, StepBatch};

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

/// Checks `got` against whole rows `want` for sequences asking `ask` (every sampled sequence
/// has a row): greedy rows as `greedy_whole` says (whole, or their id), whole rows equal.
fn check(got: &HostLogits, want: &HostLogits, ask: &[Logits], greedy_whole: bool) {
    let sampled: Vec<&Logits> = ask.iter().filter(|a| **a != Logits::None).collect();
    assert_eq!(got.rows(), sampled.len());
    for (i, a) in sampled.into_iter().enumerate() {
        let whole = want.row(i);
        match (a, got.get(i)) {
            (Logits::Greedy { below }, Row::Greedy(id)) if !greedy_whole => {
                assert_eq!(id, argmax(&whole[..*below as usize]), "row {i}");
            }
            (_, Row::Logits(r)) if greedy_whole || *a == Logits::Last => {
                let d = max_abs_diff(&[r.to_vec()], &[whole.to_vec()]);
                assert!(d <= 1e-4, "row {i}: max |Δ logit| {d}");
            }
            (a, row) => panic!("row {i} asked {a:?}, came back {row:?}"),
        }
    }
}

#[test]
fn greedy_rows_come_back_as_the_sampler_s_greedy_id_or_whole() {
    let lens = [9, 17, 4, 30, 12];
    let vocab = 49_152;
    let ask = [
        Logits::Greedy { below: vocab },
        Logits::Last,
        Logits::None,
        // Below the ids a prompt's argmax lands on: the bound must bite.
        Logits::Greedy { below: 100 },
        Logits::Greedy { below: vocab },
    ];
    // Every sampled row whole: the reference.
    let all_whole: Vec<Logits> = ask
        .iter()
        .map(|a| match a {
            Logits::Greedy { .. } => Logits::Last,
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
    let whole = run(candle, &lens, &ask);
    net.set_device_argmax(true);
    net.set_cuda_graphs(false);
    let eager = run(candle, &lens, &ask);
    for (step, ask) in [ask.to_vec(), decode_ask(&ask)].iter().enumerate() {
        check(&picked[step], &want[step], ask, false);
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

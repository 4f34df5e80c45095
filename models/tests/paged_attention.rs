//! The candle backend's paged-attention op against its gather path through a whole model:
//! teacher-forced log-probabilities of a ragged batch (prefill chunks, then decodes of every
//! sequence together) agree within 1e-4 whichever path each row takes.

mod common;

use sluice_models::candle::AttentionPath;
use sluice_models::logits::{log_softmax, max_abs_diff};
use sluice_models::{Logits, Model, Network, SeqChunk, StepBatch};

const BLOCK: usize = 16;
const DECODES: usize = 6;

/// Each sequence prefilled whole but its last `DECODES` tokens, which are then fed one decode
/// step at a time, all sequences together; every row's logprobs.
fn forced(m: &Model, seqs: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let per_seq = seqs.iter().map(Vec::len).max().unwrap().div_ceil(BLOCK);
    let mut kv = m.new_kv_store(seqs.len() * per_seq, BLOCK).unwrap();
    let table = |s: usize| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect::<Vec<_>>();
    let mut batch = StepBatch {
        seqs: seqs
            .iter()
            .enumerate()
            .map(|(s, t)| SeqChunk {
                tokens: t[..t.len() - DECODES].to_vec(),
                start_pos: 0,
                block_table: table(s),
                logits: Logits::All,
            })
            .collect(),
    };
    let mut rows = m
        .forward(&batch, &mut kv)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    for d in (1..=DECODES).rev() {
        batch.seqs = seqs
            .iter()
            .enumerate()
            .map(|(s, t)| SeqChunk {
                tokens: vec![t[t.len() - d]],
                start_pos: t.len() - d,
                block_table: table(s),
                logits: Logits::Last,
            })
            .collect();
        rows.extend(
            m.forward(&batch, &mut kv)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap(),
        );
    }
    rows.iter().map(|r| log_softmax(r)).collect()
}

/// Deterministic token ids below `vocab`, skipping the special tokens.
fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (100 + x % (vocab as u64 - 100)) as u32
        })
        .collect()
}

#[test]
fn paged_and_gathered_attention_give_the_same_logprobs() {
    let m = common::f16_candle_model("paged");
    let Network::Candle(candle) = m.network() else {
        panic!("the candle backend loads a candle network");
    };
    let vocab = m.config().vocab_size;
    // Contexts from 8 to 75 positions: within a block, on a boundary, across several.
    let seqs: Vec<Vec<u32>> = [8, 16, 17, 33, 50, 75]
        .iter()
        .enumerate()
        .map(|(s, &n)| tokens(s as u64 + 1, n, vocab))
        .collect();
    let mut by_path = Vec::new();
    for path in [
        AttentionPath::Gather,
        AttentionPath::Paged,
        AttentionPath::Split,
    ] {
        candle.set_attention(path);
        by_path.push(forced(&m, &seqs));
    }
    for (name, rows) in [("paged", &by_path[1]), ("split", &by_path[2])] {
        let d = max_abs_diff(&by_path[0], rows);
        eprintln!(
            "{name} against gather: max |Δ logprob| {d} over {} rows",
            rows.len()
        );
        assert!(d <= 1e-4, "{name} against gather: max |Δ logprob| {d}");
    }
}

//! Decode steps run from fixed inputs (the path a GPU captures as CUDA graphs, run eagerly on
//! the CPU) against ordinary steps, through a whole model on the candle backend: the same
//! schedule of prefills, decodes of changing sets of sequences (padded to different buckets,
//! a bucket used again) and a step mixing a prefill with decodes gives the same logits either
//! way, so padding rows write only the pool's scratch block and every bucket's inputs are
//! rewritten in full each step. The capture itself needs a GPU: `make check-gpu` compares it.

mod common;

use sluice_models::logits::max_abs_diff;
use sluice_models::{Logits, Model, Network, SeqChunk, StepBatch};

const BLOCK: usize = 16;
const PER_SEQ: usize = 8;

/// Sequence `s`'s token at position `p`: deterministic, past the special tokens.
fn token(s: usize, p: usize, vocab: usize) -> u32 {
    (100 + (s * 7919 + p * 104_729) % (vocab - 100)) as u32
}

/// What one sequence feeds in a step.
enum Feed {
    Prefill(usize),
    Decode,
}

/// Runs `schedule` (per step, which sequences feed what) on a fresh pool; every step's logits.
fn run(m: &Model, schedule: &[Vec<(usize, Feed)>]) -> Vec<Vec<Vec<f32>>> {
    let vocab = m.config().vocab_size;
    let mut kv = m.new_kv_store(8 * PER_SEQ, BLOCK).unwrap();
    let mut len = [0usize; 8];
    let mut out = Vec::new();
    for step in schedule {
        let mut batch = StepBatch::new();
        for (s, feed) in step {
            let n = match feed {
                Feed::Prefill(n) => *n,
                Feed::Decode => 1,
            };
            let start = len[*s];
            batch.push(SeqChunk {
                tokens: (start..start + n).map(|p| token(*s, p, vocab)).collect(),
                start_pos: start,
                block_table: (s * PER_SEQ..(s + 1) * PER_SEQ).map(|b| b as u32).collect(),
                logits: Logits::Last,
            });
            len[*s] += n;
        }
        out.push(
            m.forward(&batch, &mut kv)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap(),
        );
    }
    out
}

#[test]
fn replayed_decode_steps_give_the_logits_of_ordinary_ones() {
    let m = common::f16_candle_model("replay");
    let Network::Candle(candle) = m.network() else {
        panic!("the candle backend loads a candle network");
    };
    let prompts = [8, 16, 17, 33, 50, 75, 5];
    let decode = |seqs: &[usize]| seqs.iter().map(|&s| (s, Feed::Decode)).collect::<Vec<_>>();
    let all: Vec<usize> = (0..prompts.len()).collect();
    let schedule = vec![
        prompts
            .iter()
            .enumerate()
            .map(|(s, &n)| (s, Feed::Prefill(n)))
            .collect(),
        decode(&all),                                    // 7 rows: bucket 8
        decode(&[0, 2, 4]),                              // bucket 4
        decode(&[5]),                                    // bucket 1
        decode(&all),                                    // bucket 8 again
        vec![(1, Feed::Decode), (7, Feed::Prefill(20))], // a prefill beside a decode: ordinary
        decode(&[0, 1, 2, 3, 4, 5, 6, 7]),
        decode(&[3, 7]),
        decode(&[6, 5, 4, 3, 2, 1, 0, 7]), // another order of the same sequences
    ];
    candle.set_cuda_graphs(false);
    let plain = run(&m, &schedule);
    assert_eq!(candle.cuda_graphs().steps, 0);
    candle.set_cuda_graphs(true);
    let replayed = run(&m, &schedule);
    let status = candle.cuda_graphs();
    // Every step but the two with a prefill took the path; on the CPU none is captured.
    assert_eq!(status.steps, 7, "{status:?}");
    assert_eq!((status.replayed, status.captured), (0, 0), "{status:?}");
    for (i, (a, b)) in plain.iter().zip(&replayed).enumerate() {
        assert_eq!(a.len(), b.len(), "step {i}: rows");
        let d = max_abs_diff(a, b);
        assert!(d <= 1e-4, "step {i}: max |Δ logit| {d}");
    }
}

/// Two threads stepping one model at once, each with its own pool, with the path on: both
/// finish with the logits of a lone run. (Steps of a model run one at a time; the lock that
/// makes them once sat inside the CPU pool, where a thread waiting for its parallel work ran
/// the other thread's step and waited on itself.)
#[test]
fn concurrent_steps_of_one_model_finish_with_their_own_logits() {
    let m = std::sync::Arc::new(common::f16_candle_model("replay-threads"));
    let Network::Candle(candle) = m.network() else {
        panic!("the candle backend loads a candle network");
    };
    candle.set_cuda_graphs(true);
    let schedule = || {
        let mut steps = vec![vec![(0, Feed::Prefill(30)), (1, Feed::Prefill(9))]];
        steps.extend((0..6).map(|_| vec![(0, Feed::Decode), (1, Feed::Decode)]));
        steps
    };
    let alone = run(&m, &schedule());
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..2 {
        let (m, tx) = (m.clone(), tx.clone());
        std::thread::spawn(move || tx.send(run(&m, &schedule())).unwrap());
    }
    for _ in 0..2 {
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("both threads finish: no step waits on another forever");
        for (i, (a, b)) in alone.iter().zip(&got).enumerate() {
            let d = max_abs_diff(a, b);
            assert!(d <= 1e-4, "step {i}: max |Δ logit| {d}");
        }
    }
}

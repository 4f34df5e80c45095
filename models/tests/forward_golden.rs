//! The forward pass against llama.cpp's reference outputs (../shared/golden/greedy.jsonl) and its
//! batch-invariance contract, on the real default model, for both backends: the CPU kernels
//! (bit-equal alone and in any batch) and candle's tensors on the CPU (within 1e-3 in
//! log-probability).

mod common;

use candle_core::Tensor;
use sluice_models::logits::{log_softmax, top_logprobs};
use sluice_models::{Backend, KvStore, Logits, Model, SeqChunk, StepBatch};

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().expect("logits are a 2-D f32 tensor")
}

/// A fresh KV store and a contiguous block table for a sequence of up to `tokens` positions.
fn kv_for(m: &Model, tokens: usize) -> (KvStore, Vec<u32>) {
    let kv = m.new_kv_store(tokens.div_ceil(16) + 1, 16).unwrap();
    let table = (0..kv.num_blocks() as u32).collect();
    (kv, table)
}

#[test]
fn logprobs_agree_with_llama_cpp_along_the_greedy_paths() {
    agrees_with_llama_cpp(common::model_on(Backend::Kernels));
}

#[test]
fn candle_logprobs_agree_with_llama_cpp_along_the_greedy_paths() {
    agrees_with_llama_cpp(common::model_on(Backend::Candle));
}

/// Teacher-forced along llama.cpp's greedy paths: top-1 agreement >= 95 %, mean |Δ logprob|
/// over the reference's top 10 <= 0.15.
fn agrees_with_llama_cpp(m: &Model) {
    let (mut same_top1, mut positions, mut abs_diff, mut compared) = (0usize, 0usize, 0f64, 0usize);
    for line in common::golden_lines("greedy.jsonl") {
        let prompt = common::ids(&line["prompt_ids"]);
        let greedy = common::ids(&line["greedy_ids"]);
        let steps = line["steps_top10"].as_array().unwrap();
        assert_eq!(steps.len(), greedy.len());
        // Feed the prompt and all but the last reference token; keep the rows from the prompt's
        // last token on: the predictions after the prompt and after each forced token.
        let mut tokens = prompt.clone();
        tokens.extend_from_slice(&greedy[..greedy.len() - 1]);
        let (mut kv, table) = kv_for(m, tokens.len());
        let batch = StepBatch {
            seqs: vec![SeqChunk {
                tokens: tokens.clone(),
                start_pos: 0,
                block_table: table,
                logits: Logits::All,
            }],
        };
        let out = rows(&m.forward(&batch, &mut kv).unwrap());
        for (i, step) in steps.iter().enumerate() {
            let row = &out[prompt.len() - 1 + i];
            let lp = log_softmax(row);
            let reference: Vec<(u32, f32)> = step
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
                .collect();
            positions += 1;
            if top_logprobs(row, 1)[0].0 == reference[0].0 {
                same_top1 += 1;
            }
            for (id, want) in &reference {
                abs_diff += f64::from((lp[*id as usize] - want).abs());
                compared += 1;
            }
        }
    }
    let top1 = same_top1 as f64 / positions as f64;
    let mad = abs_diff / compared as f64;
    eprintln!(
        "{} backend: top-1 agreement {top1:.4} over {positions} positions; mean |Δ logprob| \
         {mad:.4}",
        m.backend()
    );
    assert!(top1 >= 0.95, "top-1 agreement {top1:.4} < 0.95");
    assert!(
        mad <= 0.15,
        "mean absolute logprob difference {mad:.4} > 0.15"
    );
}

/// Sixteen prompts of different lengths, built from the golden chats.
fn sixteen_prompts() -> Vec<Vec<u32>> {
    let lines = common::golden_lines("greedy.jsonl");
    (0..16)
        .map(|i| {
            let line = &lines[i % lines.len()];
            let mut p = common::ids(&line["prompt_ids"]);
            p.extend(
                common::ids(&line["greedy_ids"])
                    .into_iter()
                    .take(i * 3 % 40),
            );
            p.truncate(p.len() - i % 5);
            p
        })
        .collect()
}

#[test]
fn a_sequence_gets_the_same_bits_alone_in_a_batch_and_in_chunks() {
    same_alone_in_a_batch_and_in_chunks(common::model_on(Backend::Kernels), bits_equal);
}

#[test]
fn candle_gives_a_sequence_the_same_logprobs_alone_in_a_batch_and_in_chunks() {
    same_alone_in_a_batch_and_in_chunks(common::model_on(Backend::Candle), logprobs_close);
}

/// Sixteen sequences alone, then all in one ragged batch, then prefilled in chunks beside the
/// others' decodes: every logits row agrees with the sequence's own run under `same`.
fn same_alone_in_a_batch_and_in_chunks(m: &Model, same: fn(&[f32], &[f32]) -> bool) {
    let prompts = sixteen_prompts();
    let lens: std::collections::BTreeSet<usize> = prompts.iter().map(Vec::len).collect();
    assert!(
        lens.len() >= 8,
        "the prompts should differ in length: {lens:?}"
    );
    let per_seq = prompts
        .iter()
        .map(|p| p.len() + 2)
        .max()
        .unwrap()
        .div_ceil(16);
    let table = |s: usize| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect::<Vec<u32>>();
    let new_kv = || m.new_kv_store(16 * per_seq, 16).unwrap();

    // Alone: prefill whole, then one decode step with a fixed token.
    let mut alone = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        let mut kv = new_kv();
        let prefill = StepBatch {
            seqs: vec![SeqChunk {
                tokens: p.clone(),
                start_pos: 0,
                block_table: table(s),
                logits: Logits::Last,
            }],
        };
        let a = rows(&m.forward(&prefill, &mut kv).unwrap()).remove(0);
        let decode = StepBatch {
            seqs: vec![SeqChunk {
                tokens: vec![28],
                start_pos: p.len(),
                block_table: table(s),
                logits: Logits::Last,
            }],
        };
        let b = rows(&m.forward(&decode, &mut kv).unwrap()).remove(0);
        alone.push((a, b));
    }

    // Together: one ragged batch of all sixteen prefills, then one batch of sixteen decodes.
    let mut kv = new_kv();
    let prefill = StepBatch {
        seqs: prompts
            .iter()
            .enumerate()
            .map(|(s, p)| SeqChunk {
                tokens: p.clone(),
                start_pos: 0,
                block_table: table(s),
                logits: Logits::Last,
            })
            .collect(),
    };
    let together = rows(&m.forward(&prefill, &mut kv).unwrap());
    let decode = StepBatch {
        seqs: prompts
            .iter()
            .enumerate()
            .map(|(s, p)| SeqChunk {
                tokens: vec![28],
                start_pos: p.len(),
                block_table: table(s),
                logits: Logits::Last,
            })
            .collect(),
    };
    let together_decode = rows(&m.forward(&decode, &mut kv).unwrap());
    for s in 0..16 {
        assert!(
            same(&alone[s].0, &together[s]),
            "prefill logits of sequence {s} differ in a batch"
        );
        assert!(
            same(&alone[s].1, &together_decode[s]),
            "decode logits of sequence {s} differ in a batch"
        );
    }

    // Chunked, mixed with other sequences' decodes: each prompt in chunks of 1..=13 tokens while
    // the previously finished ones decode alongside it.
    let mut kv = new_kv();
    let mut done: Vec<usize> = Vec::new();
    for (s, p) in prompts.iter().enumerate() {
        let chunk = 1 + s % 13;
        let mut start = 0;
        while start < p.len() {
            let end = (start + chunk).min(p.len());
            let last = end == p.len();
            let mut seqs = vec![SeqChunk {
                tokens: p[start..end].to_vec(),
                start_pos: start,
                block_table: table(s),
                logits: if last { Logits::Last } else { Logits::None },
            }];
            // Earlier sequences re-run their decode position (same token, same slot).
            for &o in &done {
                seqs.push(SeqChunk {
                    tokens: vec![28],
                    start_pos: prompts[o].len(),
                    block_table: table(o),
                    logits: Logits::Last,
                });
            }
            let out = rows(&m.forward(&StepBatch { seqs }, &mut kv).unwrap());
            let mut it = out.iter();
            if last {
                assert!(
                    same(&alone[s].0, it.next().unwrap()),
                    "chunked prefill of sequence {s} differs"
                );
            }
            for &o in &done {
                assert!(
                    same(&alone[o].1, it.next().unwrap()),
                    "decode of {o} differs beside a prefill"
                );
            }
            start = end;
        }
        done.push(s);
    }
}

fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every log-probability within 1e-3.
fn logprobs_close(a: &[f32], b: &[f32]) -> bool {
    let worst = log_softmax(a)
        .iter()
        .zip(log_softmax(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    if worst > 1e-3 {
        eprintln!("max |Δ logprob| {worst}");
    }
    a.len() == b.len() && worst <= 1e-3
}

#[test]
fn bad_batches_are_refused_before_anything_runs() {
    refuses_bad_batches(common::model_on(Backend::Kernels));
}

#[test]
fn candle_refuses_bad_batches_before_anything_runs() {
    refuses_bad_batches(common::model_on(Backend::Candle));
}

#[test]
fn a_store_made_for_one_backend_is_refused_by_the_other() {
    let kernels = common::model_on(Backend::Kernels);
    let candle = common::model_on(Backend::Candle);
    let batch = StepBatch {
        seqs: vec![SeqChunk {
            tokens: vec![1],
            start_pos: 0,
            block_table: vec![0],
            logits: Logits::Last,
        }],
    };
    let mut kv = kernels.new_kv_store(1, 16).unwrap();
    let err = candle.forward(&batch, &mut kv).unwrap_err().to_string();
    assert!(err.contains("made for the kernels backend"), "{err}");
    let mut kv = candle.new_kv_store(1, 16).unwrap();
    let err = kernels.forward(&batch, &mut kv).unwrap_err().to_string();
    assert!(err.contains("made for the candle backend"), "{err}");
}

fn refuses_bad_batches(m: &Model) {
    let mut kv = m.new_kv_store(2, 16).unwrap();
    let chunk = |tokens: Vec<u32>, start_pos, block_table: Vec<u32>| StepBatch {
        seqs: vec![SeqChunk {
            tokens,
            start_pos,
            block_table,
            logits: Logits::Last,
        }],
    };
    let cases = [
        (chunk(vec![1; 17], 0, vec![0]), "needs 2 blocks"),
        (chunk(vec![1], 0, vec![5]), "outside the KV store"),
        (chunk(vec![49152], 0, vec![0]), "outside the vocabulary"),
        (chunk(vec![], 0, vec![0]), "feeds no tokens"),
        (
            chunk(vec![1], 8192, vec![0; 513]),
            "beyond the context length",
        ),
    ];
    for (batch, want) in cases {
        let err = m.forward(&batch, &mut kv).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
    // An empty batch is valid and returns no rows.
    let out = m.forward(&StepBatch::new(), &mut kv).unwrap();
    assert_eq!(out.dims(), &[0, m.config().vocab_size]);
}

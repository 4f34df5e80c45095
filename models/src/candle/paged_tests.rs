//! The paged-attention op against the gather path on the CPU: ragged batches mixing decodes
//! and prefill chunks, contexts across block boundaries, scattered block tables, GQA.

use candle_core::{DType, Device, Tensor};

use super::attention::{attend, AttentionPath, StepPlan};
use super::emulator::{self, as_f32s, Arg};
use super::paged::{self as paged_op, kernel_supports, PagedAttention, PagedMeta};
use crate::batch::{Logits, SeqChunk, StepBatch};
use crate::config::LlamaConfig;
use crate::logits::max_abs_diff;

const BLOCK: usize = 16;
const BLOCKS: usize = 40;

/// A one-layer config of this attention shape (the other tests of the pool use it too).
pub(super) fn config(heads: usize, kv_heads: usize, head_dim: usize) -> LlamaConfig {
    LlamaConfig {
        architecture: "llama".into(),
        name: "paged-test".into(),
        block_count: 1,
        embedding_length: heads * head_dim,
        feed_forward_length: 4,
        head_count: heads,
        head_count_kv: kv_heads,
        head_dim,
        rope_dimension: head_dim,
        rope_freq_base: 10_000.0,
        rms_norm_eps: 1e-5,
        context_length: BLOCK * BLOCKS,
        vocab_size: 8,
    }
}

/// Deterministic values in about [-2, 2).
fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 4096) as f32 / 1024.0 - 2.0
        })
        .collect()
}

/// A chunk of `tokens` tokens from `start_pos`, its blocks scattered over the pool.
fn chunk(seq: u32, start_pos: usize, tokens: usize) -> SeqChunk {
    let blocks = (start_pos + tokens).div_ceil(BLOCK) as u32;
    SeqChunk {
        tokens: vec![1; tokens],
        start_pos,
        // Sequence `seq`'s block `b` lives at a pool block no other sequence uses.
        block_table: (0..blocks)
            .map(|b| (b * 7 + seq * 3) % BLOCKS as u32)
            .collect(),
        logits: Logits::Last,
    }
}

struct Case {
    config: LlamaConfig,
    k: Tensor,
    v: Tensor,
    q: Tensor,
}

impl Case {
    fn new(config: LlamaConfig, rows: usize) -> Self {
        let dev = &Device::Cpu;
        let slots = BLOCK * BLOCKS;
        let pool = |seed| {
            Tensor::from_vec(
                noise(seed, slots * config.kv_width()),
                (slots, config.kv_width()),
                dev,
            )
            .and_then(|t| t.to_dtype(DType::F16))
            .unwrap()
        };
        let (h, hd) = (config.head_count, config.head_dim);
        Self {
            k: pool(1),
            v: pool(2),
            q: Tensor::from_vec(noise(3, rows * h * hd), (rows, h, hd), dev).unwrap(),
            config,
        }
    }

    /// Attention rows of `batch`, whose tokens read query rows `q_from..`.
    fn attend(&self, batch: &StepBatch, path: AttentionPath, q_from: usize) -> Vec<Vec<f32>> {
        let plan = StepPlan::new(batch, &self.config, (BLOCK, path), &Device::Cpu).expect("a plan");
        let q = self.q.narrow(0, q_from, batch.num_tokens()).unwrap();
        attend(&q, (&self.k, &self.v), &plan, &self.config)
            .unwrap()
            .to_vec2()
            .unwrap()
    }
}

/// Decodes at contexts 1, 16, 17, 41 and 200 with prefill chunks of 7 tokens across a block
/// boundary and 20 tokens from position 30.
fn ragged() -> StepBatch {
    StepBatch {
        seqs: vec![
            chunk(0, 40, 1),
            chunk(1, 13, 7),
            chunk(2, 0, 1),
            chunk(3, 15, 1),
            chunk(4, 30, 20),
            chunk(5, 16, 1),
            chunk(6, 199, 1),
        ],
    }
}

#[test]
fn paged_rows_agree_with_the_gather_path() {
    for (heads, kv_heads, hd) in [(6, 2, 16), (4, 4, 8), (8, 1, 64), (9, 3, 64)] {
        let case = Case::new(config(heads, kv_heads, hd), 64);
        let batch = ragged();
        let gather = case.attend(&batch, AttentionPath::Gather, 0);
        for path in [
            AttentionPath::Paged,
            AttentionPath::Split,
            AttentionPath::Auto,
        ] {
            let got = case.attend(&batch, path, 0);
            let d = max_abs_diff(&gather, &got);
            assert!(
                d <= 1e-4,
                "{path:?} differs by {d} ({heads} heads, {kv_heads} KV, head_dim {hd})"
            );
        }
    }
}

#[test]
fn a_paged_row_is_the_same_alone_and_in_a_batch() {
    let case = Case::new(config(6, 2, 32), 64);
    let batch = ragged();
    let together = case.attend(&batch, AttentionPath::Paged, 0);
    let mut row = 0;
    for s in &batch.seqs {
        let alone = StepBatch {
            seqs: vec![s.clone()],
        };
        let got = case.attend(&alone, AttentionPath::Paged, row);
        for (j, r) in got.iter().enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(r), bits(&together[row + j]), "row {} differs", row + j);
        }
        row += s.tokens.len();
    }
}

#[test]
fn attention_paths_parse() {
    for (s, p) in [
        ("auto", AttentionPath::Auto),
        ("gather", AttentionPath::Gather),
        ("paged", AttentionPath::Paged),
        ("split", AttentionPath::Split),
    ] {
        assert_eq!(s.parse::<AttentionPath>().unwrap(), p);
    }
    assert!("flash".parse::<AttentionPath>().is_err());
    let cpu = &Device::Cpu;
    assert_eq!(AttentionPath::Auto.on(cpu), AttentionPath::Paged);
    assert_eq!(AttentionPath::Split.on(cpu), AttentionPath::Split);
}

#[test]
fn the_kernel_takes_the_usual_llama_shapes() {
    // SmolLM2 (9/3 heads of 64), Llama-3-8B (32/8 of 128), 8 query heads a KV head of 256.
    for (group, hd) in [(3, 64), (4, 128), (8, 256), (1, 32)] {
        assert!(kernel_supports(group, hd), "group {group}, head_dim {hd}");
    }
    // Not a multiple of a warp, too wide for a lane's registers, too many outputs a thread.
    for (group, hd) in [(3, 80), (1, 512), (16, 256)] {
        assert!(!kernel_supports(group, hd), "group {group}, head_dim {hd}");
    }
}

/// The op over `batch`'s rows, as the step plan builds it.
fn paged_op(case: &Case, batch: &StepBatch) -> PagedAttention {
    let mut meta = PagedMeta::default();
    let mut row = 0;
    for s in &batch.seqs {
        meta.push_chunk(row, s.start_pos, s.tokens.len(), &s.block_table, BLOCK);
        row += s.tokens.len();
    }
    let c = &case.config;
    PagedAttention {
        rows: meta.rows(),
        meta: Tensor::new(meta.into_words(), &Device::Cpu).unwrap(),
        heads: c.head_count,
        kv_heads: c.head_count_kv,
        head_dim: c.head_dim,
        block_size: BLOCK,
        splits: 1,
    }
}

/// What both attention kernels take after their outputs, in paged.cu's order: the queries,
/// the pools, the rows' metadata, the op's scalars.
fn kernel_inputs(case: &Case, op: &PagedAttention) -> Vec<Arg> {
    let flat_f32 = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let flat_f16 = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<half::f16>().unwrap();
    let (ints, scale) = op.kernel_scalars();
    let mut args = vec![
        Arg::f32s(&flat_f32(&case.q)),
        Arg::f16s(&flat_f16(&case.k)),
        Arg::f16s(&flat_f16(&case.v)),
        Arg::u32s(&op.meta.to_vec1::<u32>().unwrap()),
    ];
    args.extend(Arg::ints(&ints));
    args.push(Arg::F32(scale));
    args
}

/// The CPU op over `batch`'s rows, flattened.
fn on_cpu(case: &Case, batch: &StepBatch) -> Vec<f32> {
    let q = case.q.narrow(0, 0, batch.num_tokens()).unwrap();
    let out = paged_op::attend(&q, &case.k, &case.v, &paged_op(case, batch)).unwrap();
    out.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// The largest difference between two outputs of the same length ([`max_abs_diff`] over them
/// as one row each).
fn max_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    max_abs_diff(&[got.to_vec()], &[want.to_vec()])
}

/// paged.cu's one-pass kernel over `op`'s rows under the host emulation, with `grid`; its
/// output.
fn emulated(
    case: &Case,
    op: &PagedAttention,
    grid: super::operands::Grid,
) -> Result<Vec<f32>, String> {
    let mut args = vec![Arg::f32s(&vec![0.0; op.rows * op.heads * op.head_dim])];
    args.extend(kernel_inputs(case, op));
    let out = emulator::launch("paged_attention_f16", grid, args)?;
    Ok(as_f32s(&out[0]))
}

/// Rows for the kernel's tiles of 64 positions: a decode at context 200 (three whole tiles and
/// part of a fourth), a prefill chunk whose rows see 63, 64 and 65 positions, a first token.
/// Small: every barrier of the emulation is a rendezvous of OS threads.
fn across_tiles() -> StepBatch {
    StepBatch {
        seqs: vec![chunk(0, 199, 1), chunk(1, 62, 3), chunk(2, 0, 1)],
    }
}

/// paged.cu, compiled for the host and run under the emulation of CUDA's execution model
/// (`emulator.rs`: no GPU here), with the grid and arguments its CUDA launch takes from the
/// op, computes what the CPU op computes: SmolLM2's shape, Llama-3-8B's, a group of one, and
/// the kernel's limits (8 heads of 256 a KV head: every lane's K registers, every thread's
/// outputs); one tile, several, a chunk across two.
#[test]
fn the_cuda_kernel_agrees_with_the_cpu_op_under_emulation() {
    for (heads, kv_heads, hd) in [(9, 3, 64), (32, 8, 128), (4, 4, 32), (8, 1, 256)] {
        let case = Case::new(config(heads, kv_heads, hd), 64);
        let batch = across_tiles();
        let op = paged_op(&case, &batch);
        let got = emulated(&case, &op, op.grid()).unwrap_or_else(|e| panic!("{e}"));
        let d = max_diff(&got, &on_cpu(&case, &batch));
        assert!(
            d <= 1e-5,
            "differs by {d} ({heads} heads, {kv_heads} KV, head_dim {hd})"
        );
    }
}

/// The split path (paged.cu's split and combining kernels, under the emulation) computes what
/// the CPU op computes, whether the splits outnumber a row's tiles (empty runs) or not, and
/// for a first token (one position, one non-empty run).
#[test]
fn the_split_cuda_kernels_agree_with_the_cpu_op_under_emulation() {
    // Every barrier of the emulation is a rendezvous of OS threads: few launches.
    for (heads, kv_heads, hd, splits) in [(9, 3, 64, [2, 16]), (32, 8, 128, [3, 3])] {
        let case = Case::new(config(heads, kv_heads, hd), 64);
        let batch = across_tiles();
        let want = on_cpu(&case, &batch);
        for splits in splits {
            let op = PagedAttention {
                splits,
                ..paged_op(&case, &batch)
            };
            let (acc_len, stats_len) = op.part_lens();
            let mut args = vec![
                Arg::f32s(&vec![0.0; acc_len]),
                Arg::f32s(&vec![0.0; stats_len]),
            ];
            args.extend(kernel_inputs(&case, &op));
            let parts = emulator::launch("paged_attention_split_f16", op.grid(), args)
                .unwrap_or_else(|e| panic!("{e}"));
            let mut args = vec![
                Arg::f32s(&vec![0.0; op.rows * op.heads * op.head_dim]),
                Arg::Buf(parts[0].clone()),
                Arg::Buf(parts[1].clone()),
            ];
            args.extend(Arg::ints(&op.combine_ints()));
            let out = emulator::launch("paged_attention_combine_f32", op.combine_grid(), args)
                .unwrap_or_else(|e| panic!("{e}"));
            let d = max_diff(&as_f32s(&out[0]), &want);
            assert!(
                d <= 1e-5,
                "{splits} splits differ by {d} ({heads} heads, {kv_heads} KV)"
            );
        }
    }
}

/// Small steps split each row over several blocks, large ones do not; the count depends on
/// the step's shape alone.
#[test]
fn small_steps_split_their_rows() {
    assert_eq!(paged_op::splits_for(1, 3), 16, "one stream of SmolLM2");
    assert_eq!(paged_op::splits_for(16, 8), 4, "16 streams of Llama-3-8B");
    assert_eq!(paged_op::splits_for(64, 8), 1, "64 streams of Llama-3-8B");
    assert_eq!(paged_op::splits_for(512, 3), 1, "a prefill chunk");
}

/// The emulation is strict enough to fail a kernel: shared memory one word short of what the
/// kernel's layout needs is a sanitizer's report, not a quiet result.
#[test]
fn the_emulation_fails_a_launch_short_of_shared_memory() {
    let case = Case::new(config(9, 3, 64), 64);
    let op = paged_op(&case, &across_tiles());
    let mut grid = op.grid();
    grid.shared_bytes -= 4;
    let err = emulated(&case, &op, grid).expect_err("a launch short of shared memory fails");
    assert!(err.contains("AddressSanitizer"), "{err}");
}

//! Paged attention: each query row attends to its sequence's context by reading the f16 block
//! pool in place through the sequence's block table, with an online softmax in f32.
//!
//! One candle custom op over `(q, k_pool, v_pool)`, with the rows' metadata (which block table,
//! how many positions each row sees) in a `u32` tensor built once per step by the plan. The CPU
//! implementation runs the same host logic as the CUDA one (`paged.cu`, compiled to PTX by
//! `build.rs` under the `cuda` feature) and is what the tests compare with the gather path.
//!
//! Each (row, KV head) pair is one task: it walks the context block by block in table order,
//! widening K and V to f32 as it loads them, and serves every query head of its GQA group. A
//! row's result depends only on its own query, context and that fixed order, never on the rest
//! of the batch.

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Shape, Storage, Tensor};
use half::f16;
use rayon::prelude::*;

use super::operands::cpu_slice;
#[cfg(any(feature = "cuda", test))]
use super::operands::Grid;
use crate::kernels::dot;

/// The metadata of one step's paged rows, on the host, before it is uploaded.
///
/// Layout of the `u32` vector: for each paged row `i`, `[q_row, context, table_offset]` at
/// `3·i`, then every block table the rows name, concatenated (offsets are relative to the end
/// of the row entries).
#[derive(Debug, Default, Clone)]
pub(crate) struct PagedMeta {
    words: Vec<u32>,
    tables: Vec<u32>,
    rows: usize,
}

impl PagedMeta {
    /// Adds one sequence chunk's rows: `tokens` rows starting at step row `first_row` and
    /// position `start_pos`; row `j` sees positions `..= start_pos + j`.
    pub(crate) fn push_chunk(
        &mut self,
        first_row: usize,
        start_pos: usize,
        tokens: usize,
        table: &[u32],
        block_size: usize,
    ) {
        let offset = self.tables.len() as u32;
        let blocks = (start_pos + tokens).div_ceil(block_size);
        self.tables.extend_from_slice(&table[..blocks]);
        for j in 0..tokens {
            let context = start_pos + j + 1;
            self.words
                .extend_from_slice(&[(first_row + j) as u32, context as u32, offset]);
            self.rows += 1;
        }
    }

    /// How many query rows the op computes.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// The step rows, in output order.
    pub(crate) fn q_rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.chunks_exact(3).map(|w| w[0] as usize)
    }

    /// The flat `u32` vector the op reads.
    pub(crate) fn into_words(self) -> Vec<u32> {
        let mut words = self.words;
        words.extend(self.tables);
        words
    }
}

/// The op: `apply_op3(q, k_pool, v_pool)` gives `[rows, heads · head_dim]` f32.
#[derive(Debug, Clone)]
pub(crate) struct PagedAttention {
    /// `[3·rows + tables]` u32, on the op's device (see [`PagedMeta`]).
    pub meta: Tensor,
    pub rows: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Blocks per (row, KV head) of the CUDA kernel: 1 walks each row's context in one block,
    /// more split it into runs of tiles that a second kernel combines ([`splits_for`]). The CPU
    /// implementation walks every context whole.
    pub splits: usize,
}

/// Thread blocks a step's paged attention aims to have in flight on a GPU: an H100 has 132
/// multiprocessors, and a block of four warps hides little of a K or V row's load latency on
/// its own.
const SPLIT_TARGET_BLOCKS: usize = 512;
/// Most blocks one (row, KV head) is split over: 16 runs of one 64-position tile each cover a
/// context of 1,024 positions.
const MAX_SPLITS: usize = 16;

/// Blocks per (row, KV head) for a step of `rows` paged rows: a block per (row, KV head) when
/// those alone reach [`SPLIT_TARGET_BLOCKS`] (prefill, large batches), else enough splits to
/// reach it, at most [`MAX_SPLITS`]; one when `SLUICE_PAGED_SPLITS` is off (read once; on by
/// default), a switch for measuring one way against the other. It depends on the step's
/// shape alone, so a captured step (`replay.rs`) keeps its count whatever the contexts: the
/// kernel divides each row's own context among the splits, and leaves runs past it empty.
pub(crate) fn splits_for(rows: usize, kv_heads: usize) -> usize {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| super::env_switch("SLUICE_PAGED_SPLITS", true)) {
        return 1;
    }
    SPLIT_TARGET_BLOCKS
        .div_ceil((rows * kv_heads).max(1))
        .clamp(1, MAX_SPLITS)
}

/// Shapes the op checks its inputs against.
#[derive(Debug, Clone, Copy)]
struct Dims {
    n: usize,
    slots: usize,
}

impl PagedAttention {
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    fn out_shape(&self) -> Shape {
        Shape::from((self.rows, self.heads * self.head_dim))
    }

    /// Checks the three inputs' shapes and contiguity; returns their sizes.
    fn check(&self, q: &Layout, k: &Layout, v: &Layout) -> candle_core::Result<Dims> {
        if self.splits == 0 {
            candle_core::bail!("paged attention: no splits (one walks each context whole)");
        }
        let (n, heads, hd) = q.shape().dims3()?;
        if heads != self.heads || hd != self.head_dim || !self.heads.is_multiple_of(self.kv_heads) {
            candle_core::bail!(
                "paged attention: q is {:?}, expected [n, {}, {}] with {} KV heads",
                q.dims(),
                self.heads,
                self.head_dim,
                self.kv_heads
            );
        }
        let (slots, width) = k.shape().dims2()?;
        if width != self.kv_width() || v.dims() != k.dims() {
            candle_core::bail!(
                "paged attention: pools are {:?} and {:?}, expected [slots, {}]",
                k.dims(),
                v.dims(),
                self.kv_width()
            );
        }
        for (name, l) in [("q", q), ("k", k), ("v", v)] {
            if !l.is_contiguous() {
                candle_core::bail!("paged attention: {name} must be contiguous");
            }
        }
        Ok(Dims { n, slots })
    }
}

/// The softmax scale.
fn scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

/// One (row, KV head) task's running softmax state for its group's query heads.
struct Online {
    /// Per head: the running maximum score and the sum of `exp(score - max)`.
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[group, head_dim]`: the running weighted sum of values.
    acc: Vec<f32>,
}

/// Reusable buffers of one task: a block's K and V rows widened to f32, and its scores.
struct Scratch {
    k: Vec<f32>,
    v: Vec<f32>,
    scores: Vec<f32>,
}

/// What a task reads: the step's queries, one layer's pools and the rows' metadata.
struct Inputs<'a> {
    q: &'a [f32],
    k: &'a [f16],
    v: &'a [f16],
    meta: &'a [u32],
    rows: usize,
}

impl PagedAttention {
    /// One (row, KV head): writes the group's `[group, head_dim]` outputs into `out`.
    fn cpu_task(&self, inp: &Inputs<'_>, row: usize, kvh: usize, out: &mut [f32]) {
        let (hd, group, bs, kvw) = (
            self.head_dim,
            self.group(),
            self.block_size,
            self.kv_width(),
        );
        let w = &inp.meta[3 * row..3 * row + 3];
        let (q_row, context, offset) = (w[0] as usize, w[1] as usize, w[2] as usize);
        let table = &inp.meta[3 * inp.rows + offset..];
        let qs = &inp.q[(q_row * self.heads + kvh * group) * hd..][..group * hd];
        let sc = scale(hd);
        let path = dot::best_path();
        let mut st = Online {
            max: vec![f32::NEG_INFINITY; group],
            sum: vec![0.0; group],
            acc: vec![0.0; group * hd],
        };
        let mut buf = Scratch {
            k: vec![0.0; bs * hd],
            v: vec![0.0; bs * hd],
            scores: vec![0.0; bs],
        };
        for (b, &block) in table[..context.div_ceil(bs)].iter().enumerate() {
            let len = bs.min(context - b * bs);
            for p in 0..len {
                let at = (block as usize * bs + p) * kvw + kvh * hd;
                widen(&inp.k[at..at + hd], &mut buf.k[p * hd..(p + 1) * hd]);
                widen(&inp.v[at..at + hd], &mut buf.v[p * hd..(p + 1) * hd]);
            }
            for h in 0..group {
                let q = &qs[h * hd..(h + 1) * hd];
                for p in 0..len {
                    buf.scores[p] = dot::dot(path, q, &buf.k[p * hd..(p + 1) * hd]) * sc;
                }
                st.update(h, hd, &buf.scores[..len], &buf.v);
            }
        }
        for h in 0..group {
            let inv = 1.0 / st.sum[h];
            for (o, a) in out[h * hd..(h + 1) * hd]
                .iter_mut()
                .zip(&st.acc[h * hd..(h + 1) * hd])
            {
                *o = a * inv;
            }
        }
    }
}

impl Online {
    /// Folds one block's scores for head `h` (and the block's values) into the running state.
    fn update(&mut self, h: usize, hd: usize, scores: &[f32], v: &[f32]) {
        let block_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let new_max = self.max[h].max(block_max);
        let correction = (self.max[h] - new_max).exp();
        self.max[h] = new_max;
        let acc = &mut self.acc[h * hd..(h + 1) * hd];
        acc.iter_mut().for_each(|a| *a *= correction);
        let mut sum = 0f32;
        for (p, &s) in scores.iter().enumerate() {
            let e = (s - new_max).exp();
            sum += e;
            for (a, x) in acc.iter_mut().zip(&v[p * hd..(p + 1) * hd]) {
                *a += e * x;
            }
        }
        self.sum[h] = self.sum[h] * correction + sum;
    }
}

/// f16 to f32 (F16C where the CPU has it).
fn widen(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

impl CustomOp3 for PagedAttention {
    fn name(&self) -> &'static str {
        "paged-attention"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        ql: &Layout,
        k: &CpuStorage,
        kl: &Layout,
        v: &CpuStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = self.check(ql, kl, vl)?;
        let (meta_storage, meta_layout) = self.meta.storage_and_layout();
        let Storage::Cpu(meta_cpu) = &*meta_storage else {
            candle_core::bail!("paged attention: the metadata is not on the CPU");
        };
        let inp = Inputs {
            q: cpu_slice(q, ql, "paged attention (q)")?,
            k: cpu_slice(k, kl, "paged attention (k)")?,
            v: cpu_slice(v, vl, "paged attention (v)")?,
            meta: cpu_slice(meta_cpu, meta_layout, "paged attention (meta)")?,
            rows: self.rows,
        };
        self.check_meta(inp.meta, dims)?;
        let (group, hd) = (self.group(), self.head_dim);
        let mut out = vec![0f32; self.rows * self.heads * hd];
        out.par_chunks_mut(group * hd)
            .enumerate()
            .for_each(|(i, o)| self.cpu_task(&inp, i / self.kv_heads, i % self.kv_heads, o));
        Ok((CpuStorage::F32(out), self.out_shape()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        ql: &Layout,
        k: &candle_core::CudaStorage,
        kl: &Layout,
        v: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.check(ql, kl, vl)?;
        cuda::forward(self, (q, ql), (k, kl), (v, vl))
    }
}

impl PagedAttention {
    /// Every row's query row, context and block table within bounds (on the CPU, where the
    /// metadata can be read without a device round trip).
    fn check_meta(&self, meta: &[u32], dims: Dims) -> candle_core::Result<()> {
        let bs = self.block_size;
        if meta.len() < 3 * self.rows {
            candle_core::bail!("paged attention: metadata too short");
        }
        let tables = &meta[3 * self.rows..];
        for w in meta[..3 * self.rows].chunks_exact(3) {
            let (q_row, context, offset) = (w[0] as usize, w[1] as usize, w[2] as usize);
            let blocks = context.div_ceil(bs);
            let ok = q_row < dims.n
                && context > 0
                && offset + blocks <= tables.len()
                && tables[offset..offset + blocks]
                    .iter()
                    .all(|&b| (b as usize + 1) * bs <= dims.slots);
            if !ok {
                candle_core::bail!(
                    "paged attention: row {q_row} (context {context}) is out of bounds"
                );
            }
        }
        Ok(())
    }
}

/// Threads per block of the CUDA kernel; must match `THREADS` in paged.cu.
const THREADS: usize = 128;
/// Context positions per tile of the CUDA kernel; must match `TILE` in paged.cu.
#[cfg(any(feature = "cuda", test))]
const TILE: usize = 64;
/// Outputs one thread of the CUDA kernel keeps; must match `MAX_ACC` in paged.cu.
const MAX_ACC: usize = 16;
/// K elements one lane of the CUDA kernel holds; must match `MAX_KREG` in paged.cu.
const MAX_KREG: usize = 8;

/// Whether the CUDA kernel handles this shape: a lane holds `head_dim / 32` elements of a K row
/// (at most `MAX_KREG`), a thread at most `MAX_ACC` outputs of the group.
pub(crate) fn kernel_supports(group: usize, head_dim: usize) -> bool {
    head_dim.is_multiple_of(32)
        && head_dim <= 32 * MAX_KREG
        && group * head_dim <= THREADS * MAX_ACC
}

/// Whether the op runs on `device` for this attention shape (the CPU path handles any; on a
/// GPU, the kernel's limits). Where it does not, every row takes the gather path.
pub(crate) fn supported(device: &Device, heads: usize, kv_heads: usize, head_dim: usize) -> bool {
    !device.is_cuda() || kernel_supports(heads / kv_heads, head_dim)
}

#[cfg(any(feature = "cuda", test))]
impl PagedAttention {
    /// The CUDA kernel's grid: a block of `THREADS` per (row, KV head, split), with shared
    /// memory for the group's queries, a tile's scores per head, the running max, sum and
    /// correction per head, and a tile's slots (paged.cu's layout). With one split it is
    /// `paged_attention_f16`'s, with more `paged_attention_split_f16`'s.
    pub(crate) fn grid(&self) -> Grid {
        let group = self.group();
        let floats = group * self.head_dim + group * TILE + 3 * group + TILE;
        Grid {
            blocks: (self.rows as u32, self.kv_heads as u32, self.splits as u32),
            threads: THREADS as u32,
            shared_bytes: (floats * 4) as u32,
        }
    }

    /// `paged_attention_combine_f32`'s grid: a block per (row, KV head).
    pub(crate) fn combine_grid(&self) -> Grid {
        Grid {
            blocks: (self.rows as u32, self.kv_heads as u32, 1),
            threads: THREADS as u32,
            shared_bytes: 0,
        }
    }

    /// The split kernel's outputs, in f32s: every split's weighted values, then its maximum
    /// and sum per head.
    pub(crate) fn part_lens(&self) -> (usize, usize) {
        let parts = self.rows * self.heads * self.splits;
        (parts * self.head_dim, parts * 2)
    }

    /// The combining kernel's scalar arguments after its pointers: heads, KV heads, head
    /// dimension, splits.
    pub(crate) fn combine_ints(&self) -> [i32; 4] {
        [
            self.heads as i32,
            self.kv_heads as i32,
            self.head_dim as i32,
            self.splits as i32,
        ]
    }

    /// The kernel's scalar arguments after its pointers: rows, heads, KV heads, head
    /// dimension, block size; then the softmax scale.
    pub(crate) fn kernel_scalars(&self) -> ([i32; 5], f32) {
        let ints = [
            self.rows as i32,
            self.heads as i32,
            self.kv_heads as i32,
            self.head_dim as i32,
            self.block_size as i32,
        ];
        (ints, scale(self.head_dim))
    }
}

// Launching a kernel is an FFI call (the crate's other unsafe code is the CPU kernels').
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda {
    //! The CUDA launches: one thread block per (row, KV head), `THREADS` threads; split, a
    //! block per (row, KV head, split), then one per (row, KV head) to combine.

    use candle_core::cuda::cudarc::driver::{
        CudaSlice, CudaView, LaunchArgs, LaunchConfig, PushKernelArg,
    };
    use candle_core::cuda::WrapErr;
    use candle_core::{CudaDevice, CudaStorage, Layout, Shape};
    use half::f16;

    use super::{kernel_supports, PagedAttention};
    use crate::candle::operands::{held, view};

    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/paged.ptx"));

    /// The queries and one layer's key and value pools, as the kernels read them.
    type Inputs<'a> = (CudaView<'a, f32>, CudaView<'a, f16>, CudaView<'a, f16>);

    /// Pushes what both attention kernels take after their outputs, in paged.cu's order: the
    /// queries, the pools, the rows' metadata, then `kernel_scalars`.
    fn push_inputs<'a>(
        b: &mut LaunchArgs<'a>,
        (q, k, v): &'a Inputs<'_>,
        meta: &'a CudaView<'_, u32>,
        (ints, scale): &'a ([i32; 5], f32),
    ) {
        b.arg(q);
        b.arg(k);
        b.arg(v);
        b.arg(meta);
        for i in ints {
            b.arg(i);
        }
        b.arg(scale);
    }

    pub(super) fn forward(
        op: &PagedAttention,
        (q, ql): (&CudaStorage, &Layout),
        (k, kl): (&CudaStorage, &Layout),
        (v, vl): (&CudaStorage, &Layout),
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (group, hd) = (op.group(), op.head_dim);
        if !kernel_supports(group, hd) {
            candle_core::bail!("paged attention: no kernel for group {group} × head_dim {hd}");
        }
        let dev = &q.device;
        let inputs = (
            view::<f32>(q, ql)?,
            view::<f16>(k, kl)?,
            view::<f16>(v, vl)?,
        );
        // SAFETY: every element is written by the last kernel either pass launches (rows > 0
        // in any plan).
        let mut out = unsafe { dev.alloc::<f32>(op.rows * op.heads * hd) }?;
        if op.splits <= 1 {
            one_pass(op, dev, &inputs, &mut out)?;
        } else {
            split_passes(op, dev, &inputs, &mut out)?;
        }
        let out = CudaStorage::wrap_cuda_slice(out, dev.clone());
        Ok((out, op.out_shape()))
    }

    /// `paged_attention_f16`: a block walks each (row, KV head)'s whole context into `out`.
    fn one_pass(
        op: &PagedAttention,
        dev: &CudaDevice,
        inputs: &Inputs<'_>,
        out: &mut CudaSlice<f32>,
    ) -> candle_core::Result<()> {
        let func = dev.get_or_load_custom_func("paged_attention_f16", "sluice_paged", PTX)?;
        let scalars = op.kernel_scalars();
        held::<u32, _>(&op.meta, "paged attention", |meta| {
            let mut b = func.builder();
            b.arg(out);
            push_inputs(&mut b, inputs, &meta, &scalars);
            // SAFETY: the arguments match paged.cu's signature; every index the kernel forms
            // is within the tensors: the plan builds the metadata from a batch the KV store
            // validated.
            unsafe { b.launch(LaunchConfig::from(op.grid())) }.w()?;
            Ok(())
        })
    }

    /// `paged_attention_split_f16` into two part buffers (a block per run of each (row, KV
    /// head)'s context), then `paged_attention_combine_f32` from them into `out`.
    fn split_passes(
        op: &PagedAttention,
        dev: &CudaDevice,
        inputs: &Inputs<'_>,
        out: &mut CudaSlice<f32>,
    ) -> candle_core::Result<()> {
        let (acc_len, stats_len) = op.part_lens();
        // SAFETY: the split kernel writes every element of both (empty runs included).
        let mut part_acc = unsafe { dev.alloc::<f32>(acc_len) }?;
        let mut part_stats = unsafe { dev.alloc::<f32>(stats_len) }?;
        let split =
            dev.get_or_load_custom_func("paged_attention_split_f16", "sluice_paged", PTX)?;
        let scalars = op.kernel_scalars();
        held::<u32, _>(&op.meta, "paged attention", |meta| {
            let mut b = split.builder();
            b.arg(&mut part_acc);
            b.arg(&mut part_stats);
            push_inputs(&mut b, inputs, &meta, &scalars);
            // SAFETY: as the one-pass kernel's; the parts are sized by `part_lens`.
            unsafe { b.launch(LaunchConfig::from(op.grid())) }.w()?;
            Ok(())
        })?;
        let combine =
            dev.get_or_load_custom_func("paged_attention_combine_f32", "sluice_paged", PTX)?;
        let cints = op.combine_ints();
        let mut b = combine.builder();
        b.arg(out);
        b.arg(&part_acc);
        b.arg(&part_stats);
        for i in &cints {
            b.arg(i);
        }
        // SAFETY: the arguments match paged.cu's signature; the parts are the split kernel's,
        // for the same rows, heads and splits.
        unsafe { b.launch(LaunchConfig::from(op.combine_grid())) }.w()?;
        Ok(())
    }
}

/// Runs the op on `q` `[n, heads, head_dim]` against one layer's pools.
pub(crate) fn attend(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    op: &PagedAttention,
) -> candle_core::Result<Tensor> {
    q.apply_op3_no_bwd(k_pool, v_pool, op)
}

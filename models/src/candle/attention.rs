//! Attention over the block pool with candle ops, and the step's index tensors it reads.
//!
//! A step's sequences are attended in groups, each group one chain of batched ops: the
//! one-token decodes by context bucket, every multi-token prefill chunk on its own; contexts are
//! padded to the bucket (see [`CONTEXT_BUCKET`]). A group gathers its sequences' key
//! and value rows from the pool by slot (`index_select`), so the number of ops per layer does
//! not grow with the number of decodes. Padding is masked out with `-inf`; a prefill chunk's
//! token `i` (position `start_pos + i`) sees positions `..= start_pos + i`.

use candle_core::{DType, Device, Tensor};

use crate::batch::StepBatch;
use crate::config::LlamaConfig;
use crate::error::Result;

/// One group of sequences attended together.
#[derive(Debug)]
struct Group {
    /// Sequences, longest chunk, longest context.
    b: usize,
    l: usize,
    c: usize,
    /// `[b·l]`: the step's token row each padded query row reads (padding reads row 0).
    q_rows: Tensor,
    /// `[b·c]`: the pool slot of each padded context position (padding reads slot 0).
    kv_slots: Tensor,
    /// `[b, 1, 1, l, c]`: 0 where a query may look, `-inf` elsewhere.
    mask: Tensor,
}

/// Everything a step's forward pass indexes with, built once on the host and moved to the
/// device before the first layer.
#[derive(Debug)]
pub(crate) struct StepPlan {
    /// `[n]` token ids.
    pub tokens: Tensor,
    /// `[n]` positions.
    pub positions: Tensor,
    /// `[n, kv_width]`: each token's KV slot, repeated across the row (a scatter's index).
    pub write_index: Tensor,
    /// `[rows]`: the token rows whose logits the step returns.
    pub logit_rows: Tensor,
    /// How many rows that is.
    pub num_logit_rows: usize,
    groups: Vec<Group>,
    /// `[n]`: each token's row in the groups' outputs, concatenated.
    out_rows: Tensor,
}

impl StepPlan {
    pub(crate) fn new(
        batch: &StepBatch,
        config: &LlamaConfig,
        block_size: usize,
        device: &Device,
    ) -> Result<Self> {
        let slot = |table: &[u32], pos: usize| {
            table[pos / block_size] * block_size as u32 + (pos % block_size) as u32
        };
        let (mut tokens, mut positions, mut write_index) = (Vec::new(), Vec::new(), Vec::new());
        for s in &batch.seqs {
            for (j, &t) in s.tokens.iter().enumerate() {
                let pos = s.start_pos + j;
                tokens.push(t);
                positions.push(pos as u32);
                let sl = slot(&s.block_table, pos);
                write_index.extend(std::iter::repeat_n(sl, config.kv_width()));
            }
        }
        let n = tokens.len();
        let rows: Vec<u32> = batch.logit_rows().into_iter().map(|r| r as u32).collect();
        let (groups, out_rows) = plan_groups(batch, &slot, device)?;
        let u32s = |v: Vec<u32>| Tensor::from_vec(v, n, device);
        Ok(Self {
            tokens: u32s(tokens)?,
            positions: u32s(positions)?,
            write_index: Tensor::from_vec(write_index, (n, config.kv_width()), device)?,
            num_logit_rows: rows.len(),
            logit_rows: Tensor::from_vec(rows.clone(), rows.len(), device)?,
            groups,
            out_rows: Tensor::from_vec(out_rows, n, device)?,
        })
    }
}

/// Splits the batch into attention groups; returns them and each token's output row.
fn plan_groups(
    batch: &StepBatch,
    slot: &dyn Fn(&[u32], usize) -> u32,
    device: &Device,
) -> Result<(Vec<Group>, Vec<u32>)> {
    // Each sequence's first token row.
    let starts: Vec<usize> = batch
        .seqs
        .iter()
        .scan(0, |acc, s| {
            let start = *acc;
            *acc += s.tokens.len();
            Some(start)
        })
        .collect();
    let mut decodes = std::collections::BTreeMap::<usize, Vec<usize>>::new();
    for (i, s) in batch.seqs.iter().enumerate() {
        if s.tokens.len() == 1 {
            decodes
                .entry(padded_context(s.start_pos + 1))
                .or_default()
                .push(i);
        }
    }
    let mut members: Vec<Vec<usize>> = (0..batch.seqs.len())
        .filter(|&i| batch.seqs[i].tokens.len() > 1)
        .map(|i| vec![i])
        .collect();
    members.extend(decodes.into_values());
    let mut out_rows = vec![0u32; batch.num_tokens()];
    let mut groups = Vec::with_capacity(members.len());
    let mut base = 0;
    for m in members {
        let g = group(batch, &m, &starts, slot, device)?;
        for (bi, &si) in m.iter().enumerate() {
            for j in 0..batch.seqs[si].tokens.len() {
                out_rows[starts[si] + j] = (base + bi * g.l + j) as u32;
            }
        }
        base += g.b * g.l;
        groups.push(g);
    }
    Ok((groups, out_rows))
}

/// Contexts are padded to a multiple of this, and decodes grouped by it: a sequence's attention
/// then sums over the same length alone, beside any other decodes, or in prefill chunks
/// (candle's reductions are ordered by length, and the activations' 8-bit rounding turns a
/// last-bit difference into a visible one).
const CONTEXT_BUCKET: usize = 64;

fn padded_context(ctx: usize) -> usize {
    ctx.div_ceil(CONTEXT_BUCKET) * CONTEXT_BUCKET
}

/// The padded index tensors and mask of one group: one prefill chunk, or decodes of one
/// context bucket.
fn group(
    batch: &StepBatch,
    members: &[usize],
    starts: &[usize],
    slot: &dyn Fn(&[u32], usize) -> u32,
    device: &Device,
) -> Result<Group> {
    let seqs: Vec<_> = members.iter().map(|&i| &batch.seqs[i]).collect();
    let b = seqs.len();
    let l = seqs.iter().map(|s| s.tokens.len()).max().unwrap_or(1);
    // Every member of a group has the same padded context (a prefill chunk is alone).
    let c = padded_context(seqs[0].start_pos + seqs[0].tokens.len());
    let mut q_rows = vec![0u32; b * l];
    let mut kv_slots = vec![0u32; b * c];
    let mut mask = vec![f32::NEG_INFINITY; b * l * c];
    for (bi, s) in seqs.iter().enumerate() {
        let ctx = s.start_pos + s.tokens.len();
        for (p, out) in kv_slots[bi * c..bi * c + ctx].iter_mut().enumerate() {
            *out = slot(&s.block_table, p);
        }
        for j in 0..l {
            let row = &mut mask[(bi * l + j) * c..(bi * l + j + 1) * c];
            if j < s.tokens.len() {
                q_rows[bi * l + j] = (starts[members[bi]] + j) as u32;
                row[..=s.start_pos + j].fill(0.0);
            } else {
                // A padding row looks at one position so its softmax stays finite.
                row[0] = 0.0;
            }
        }
    }
    Ok(Group {
        b,
        l,
        c,
        q_rows: Tensor::from_vec(q_rows, b * l, device)?,
        kv_slots: Tensor::from_vec(kv_slots, b * c, device)?,
        mask: Tensor::from_vec(mask, (b, 1, 1, l, c), device)?,
    })
}

/// Attention for every token of the step: `q` `[n, heads, head_dim]` (RoPE applied) against
/// one layer's pools (`[slots, kv_width]` f16); returns `[n, heads · head_dim]`.
pub(crate) fn attend(
    q: &Tensor,
    pools: (&Tensor, &Tensor),
    plan: &StepPlan,
    config: &LlamaConfig,
) -> Result<Tensor> {
    let outs = plan
        .groups
        .iter()
        .map(|g| attend_group(q, pools, g, config))
        .collect::<Result<Vec<_>>>()?;
    let all = if outs.len() == 1 {
        outs.into_iter().next().expect("one group")
    } else {
        Tensor::cat(&outs, 0)?
    };
    Ok(all.index_select(&plan.out_rows, 0)?)
}

/// One group: `[b·l, heads · head_dim]`, padded rows included.
fn attend_group(
    q: &Tensor,
    (k_pool, v_pool): (&Tensor, &Tensor),
    g: &Group,
    config: &LlamaConfig,
) -> Result<Tensor> {
    let (heads, kv_heads, hd) = (config.head_count, config.head_count_kv, config.head_dim);
    let group = config.group_size();
    let (b, l, c) = (g.b, g.l, g.c);
    // Query heads sharing a KV head sit next to each other (head = kv_head · group + i), so
    // `[b, heads, l, hd]` reshapes to `[b, kv_heads, group · l, hd]` with no repeat of K or V.
    let q = q
        .index_select(&g.q_rows, 0)?
        .reshape((b, l, heads, hd))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, kv_heads, group * l, hd))?;
    let gather = |pool: &Tensor| -> Result<Tensor> {
        Ok(pool
            .index_select(&g.kv_slots, 0)?
            .to_dtype(DType::F32)?
            .reshape((b, c, kv_heads, hd))?
            .transpose(1, 2)?
            .contiguous()?)
    };
    let (k, v) = (gather(k_pool)?, gather(v_pool)?);
    let scale = 1.0 / (hd as f64).sqrt();
    // `k` transposed into a contiguous copy: candle 0.11's CPU batched matmul gave wrong rows
    // for a transposed right-hand side at some shapes.
    let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?
        .reshape((b, kv_heads, group, l, c))?
        .broadcast_add(&g.mask)?
        .reshape((b, kv_heads, group * l, c))?;
    let p = candle_nn::ops::softmax_last_dim(&scores)?;
    let out = p
        .matmul(&v)?
        .reshape((b, heads, l, hd))?
        .transpose(1, 2)?
        .reshape((b * l, heads * hd))?;
    Ok(out)
}

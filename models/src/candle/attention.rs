//! Attention over the block pool, and the step's index tensors it reads.
//!
//! Two paths, chosen per sequence chunk by [`AttentionPath`] from the chunk alone, so that a
//! sequence's rows take the same path whatever else is in the batch:
//!
//! - **paged** ([`super::paged`]): one custom op for all its rows, reading the f16 pool in place
//!   through each sequence's block table with an online softmax. On the CPU every row takes it
//!   by default: a row is then computed the same way in any batch and any chunking of its
//!   prompt. On a GPU, decodes (one-token chunks) take it by default.
//! - **gather**: a group of sequences is one chain of batched candle ops: the one-token decodes
//!   by context bucket, every multi-token prefill chunk on its own; contexts are padded to the
//!   bucket (see [`CONTEXT_BUCKET`]). A group gathers its sequences' key and value rows from
//!   the pool by slot (`index_select`), widens them to f32 and runs matmul and softmax.
//!   Padding is masked out with `-inf`. On a GPU, prefill chunks longer than
//!   [`PAGED_MAX_CHUNK`] take it by default: a chunk's rows share their context, which the
//!   batched products exploit and the per-row op does not (a device run decides whether the
//!   paged op should take them too: `gpucheck attention`).
//!
//! Either way a chunk's token `i` (position `start_pos + i`) sees positions `..= start_pos + i`.

use candle_core::{DType, Device, Tensor};

use super::paged::{self, PagedAttention, PagedMeta};

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
    /// `[n]`: each token's KV pool slot.
    pub slots: Tensor,
    /// `[rows]`: the token rows whose logits the step returns.
    pub logit_rows: Tensor,
    /// How many rows that is.
    pub num_logit_rows: usize,
    /// The paged op over the rows [`AttentionPath`] sends to it, if any.
    paged: Option<PagedAttention>,
    groups: Vec<Group>,
    /// `[n]`: each token's row in the outputs (paged rows first, then the groups'),
    /// concatenated; `None` when that is the identity.
    out_rows: Option<Tensor>,
}

/// Which attention path a step's sequence chunks take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionPath {
    /// The device's default: [`Paged`](Self::Paged) on the CPU, [`Split`](Self::Split) on a GPU.
    #[default]
    Auto,
    /// Every chunk gathered (the batched candle ops).
    Gather,
    /// Every chunk paged: each row computed alone, so a sequence's rows are the same in any
    /// batch and any chunking.
    Paged,
    /// Chunks of at most [`PAGED_MAX_CHUNK`] tokens (decodes) paged, longer ones gathered.
    Split,
}

impl std::str::FromStr for AttentionPath {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "gather" => Ok(Self::Gather),
            "paged" => Ok(Self::Paged),
            "split" => Ok(Self::Split),
            _ => Err(format!(
                "unknown attention path '{s}': auto, gather, paged or split"
            )),
        }
    }
}

/// Chunks of at most this many tokens take the paged op under [`AttentionPath::Split`].
pub const PAGED_MAX_CHUNK: usize = 1;

impl AttentionPath {
    /// What [`Auto`](Self::Auto) means on `device`; other paths stand for themselves.
    pub fn on(self, device: &Device) -> Self {
        match (self, device) {
            (Self::Auto, Device::Cpu) => Self::Paged,
            (Self::Auto, _) => Self::Split,
            (path, _) => path,
        }
    }

    /// The path a step of `config`'s model takes on `device`: `self` resolved by [`Self::on`],
    /// or gather where the paged op has no kernel for the model's attention shape.
    pub(crate) fn for_model(self, device: &Device, config: &LlamaConfig) -> Self {
        let (heads, kv_heads, hd) = (config.head_count, config.head_count_kv, config.head_dim);
        if paged::supported(device, heads, kv_heads, hd) {
            self.on(device)
        } else {
            Self::Gather
        }
    }

    /// Whether a chunk of `tokens` tokens is paged (`self` resolved by [`Self::for_model`]).
    pub(crate) fn pages(self, tokens: usize) -> bool {
        match self {
            Self::Split => tokens <= PAGED_MAX_CHUNK,
            Self::Gather => false,
            Self::Paged | Self::Auto => true,
        }
    }
}

impl StepPlan {
    pub(crate) fn new(
        batch: &StepBatch,
        config: &LlamaConfig,
        (block_size, path): (usize, AttentionPath),
        device: &Device,
    ) -> Result<Self> {
        let slot = |table: &[u32], pos: usize| slot_of(table, pos, block_size);
        let (mut tokens, mut positions, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        for s in &batch.seqs {
            for (j, &t) in s.tokens.iter().enumerate() {
                let pos = s.start_pos + j;
                tokens.push(t);
                positions.push(pos as u32);
                slots.push(slot(&s.block_table, pos));
            }
        }
        let n = tokens.len();
        let rows: Vec<u32> = batch.logit_rows().into_iter().map(|r| r as u32).collect();
        let path = path.for_model(device, config);
        let starts = first_rows(batch);
        let (paged, mut out_rows) = plan_paged(batch, &starts, config, (block_size, path), device)?;
        let groups = plan_groups(batch, &starts, &slot, path, &mut out_rows, device)?;
        // All rows paged, in order: the op's output is the answer as it stands.
        let identity =
            groups.is_empty() && out_rows.iter().enumerate().all(|(i, &r)| r as usize == i);
        let out_rows = if identity {
            None
        } else {
            Some(Tensor::from_vec(out_rows, n, device)?)
        };
        let u32s = |v: Vec<u32>| Tensor::from_vec(v, n, device);
        Ok(Self {
            tokens: u32s(tokens)?,
            positions: u32s(positions)?,
            slots: u32s(slots)?,
            num_logit_rows: rows.len(),
            logit_rows: Tensor::from_vec(rows.clone(), rows.len(), device)?,
            paged,
            groups,
            out_rows,
        })
    }

    /// A plan over tensors the caller keeps ([`super::replay`]): every row one decode token,
    /// paged by `paged`, with logits for `logit_rows`.
    pub(crate) fn decodes(
        (tokens, positions, slots): (&Tensor, &Tensor, &Tensor),
        logit_rows: &Tensor,
        paged: PagedAttention,
    ) -> Self {
        Self {
            tokens: tokens.clone(),
            positions: positions.clone(),
            slots: slots.clone(),
            num_logit_rows: logit_rows.elem_count(),
            logit_rows: logit_rows.clone(),
            paged: Some(paged),
            groups: Vec::new(),
            out_rows: None,
        }
    }
}

/// The pool slot of position `pos` of a sequence with block table `table`.
pub(crate) fn slot_of(table: &[u32], pos: usize, block_size: usize) -> u32 {
    table[pos / block_size] * block_size as u32 + (pos % block_size) as u32
}

/// Each sequence's first token row.
fn first_rows(batch: &StepBatch) -> Vec<usize> {
    batch
        .seqs
        .iter()
        .scan(0, |acc, s| {
            let start = *acc;
            *acc += s.tokens.len();
            Some(start)
        })
        .collect()
}

/// The paged op over the chunks `path` pages, and each token's output row so far (the paged
/// rows' set; the others are filled by [`plan_groups`]).
fn plan_paged(
    batch: &StepBatch,
    starts: &[usize],
    config: &LlamaConfig,
    (block_size, path): (usize, AttentionPath),
    device: &Device,
) -> Result<(Option<PagedAttention>, Vec<u32>)> {
    let mut meta = PagedMeta::default();
    for (s, &first) in batch.seqs.iter().zip(starts) {
        if path.pages(s.tokens.len()) {
            meta.push_chunk(
                first,
                s.start_pos,
                s.tokens.len(),
                &s.block_table,
                block_size,
            );
        }
    }
    let mut out_rows = vec![0u32; batch.num_tokens()];
    if meta.rows() == 0 {
        return Ok((None, out_rows));
    }
    for (i, row) in meta.q_rows().enumerate() {
        out_rows[row] = i as u32;
    }
    let rows = meta.rows();
    let words = meta.into_words();
    let len = words.len();
    Ok((
        Some(PagedAttention {
            meta: Tensor::from_vec(words, len, device)?,
            rows,
            heads: config.head_count,
            kv_heads: config.head_count_kv,
            head_dim: config.head_dim,
            block_size,
            splits: paged::splits_for(rows, config.head_count_kv),
        }),
        out_rows,
    ))
}

/// Splits the chunks `path` does not page into attention groups; returns them and sets each
/// of their tokens' output rows (after the paged op's rows).
fn plan_groups(
    batch: &StepBatch,
    starts: &[usize],
    slot: &dyn Fn(&[u32], usize) -> u32,
    path: AttentionPath,
    out_rows: &mut [u32],
    device: &Device,
) -> Result<Vec<Group>> {
    let gathered = |i: &usize| !path.pages(batch.seqs[*i].tokens.len());
    let mut decodes = std::collections::BTreeMap::<usize, Vec<usize>>::new();
    for (i, s) in batch.seqs.iter().enumerate() {
        if s.tokens.len() == 1 && gathered(&i) {
            decodes
                .entry(padded_context(s.start_pos + 1))
                .or_default()
                .push(i);
        }
    }
    let mut members: Vec<Vec<usize>> = (0..batch.seqs.len())
        .filter(|&i| batch.seqs[i].tokens.len() > 1 && gathered(&i))
        .map(|i| vec![i])
        .collect();
    members.extend(decodes.into_values());
    let mut groups = Vec::with_capacity(members.len());
    // Group outputs follow the paged op's rows.
    let mut base = (0..batch.seqs.len())
        .filter(|i| !gathered(i))
        .map(|i| batch.seqs[i].tokens.len())
        .sum::<usize>();
    for m in members {
        let g = group(batch, &m, starts, slot, device)?;
        for (bi, &si) in m.iter().enumerate() {
            for j in 0..batch.seqs[si].tokens.len() {
                out_rows[starts[si] + j] = (base + bi * g.l + j) as u32;
            }
        }
        base += g.b * g.l;
        groups.push(g);
    }
    Ok(groups)
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
    let mut outs = Vec::with_capacity(plan.groups.len() + 1);
    if let Some(op) = &plan.paged {
        outs.push(paged::attend(&q.contiguous()?, pools.0, pools.1, op)?);
    }
    for g in &plan.groups {
        outs.push(attend_group(q, pools, g, config)?);
    }
    let all = if outs.len() == 1 {
        outs.into_iter().next().expect("one output")
    } else {
        Tensor::cat(&outs, 0)?
    };
    Ok(match &plan.out_rows {
        Some(rows) => all.index_select(rows, 0)?,
        None => all,
    })
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

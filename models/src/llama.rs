//! The Llama network: weights as loaded from GGUF, and the ragged batched forward pass.
//!
//! Weights are dequantized to f32 at load and multiplied with the batch-invariant kernels in
//! [`crate::kernels`]; Q, K and V are fused into one projection, and so are gate and up, so a
//! layer runs four matrix products over all tokens of the step.

use candle_core::Tensor;
use rayon::prelude::*;

use crate::batch::StepBatch;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::host_logits::HostLogits;
use crate::kernels::activation::silu_mul;
use crate::kernels::attention::attend;
use crate::kernels::dot::best_path;
use crate::kernels::norm::rms_norm;
use crate::kernels::quant::QuantActs;
use crate::kernels::rope::RopeTable;
use crate::kv::{KernelPool, KvStore};
use crate::linear::Linear;
use crate::weights::WeightSource;

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    /// `[q; k; v]` stacked: `(heads + 2·kv_heads)·head_dim` rows.
    wqkv: Linear,
    wo: Linear,
    ffn_norm: Vec<f32>,
    /// `[gate; up]` stacked: `2·ff` rows.
    wgate_up: Linear,
    wdown: Linear,
}

/// A loaded Llama model, ready to run batches. Immutable: all per-step state lives in the
/// [`KvStore`] the caller passes and in buffers local to the call.
#[derive(Debug)]
pub struct Llama {
    config: LlamaConfig,
    embed: Linear,
    /// `None` when the output projection is tied to the embeddings.
    output: Option<Linear>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    rope: RopeTable,
    pool: rayon::ThreadPool,
}

impl Llama {
    /// Loads every tensor of the network, checking each shape against the config.
    pub fn load(file: &mut dyn WeightSource, config: LlamaConfig, threads: usize) -> Result<Self> {
        file.check_tensor_types()?;
        let (d, ff, hd) = (
            config.embedding_length,
            config.feed_forward_length,
            config.head_dim,
        );
        let kv = config.kv_width();
        let embed = Linear::load(file, "token_embd.weight", config.vocab_size, d)?;
        let output = if file.has_tensor("output.weight") {
            Some(Linear::load(file, "output.weight", config.vocab_size, d)?)
        } else {
            None
        };
        let output_norm = file.read_vector("output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(config.block_count);
        for i in 0..config.block_count {
            let name = |t: &str| format!("blk.{i}.{t}.weight");
            let q = Linear::load(file, &name("attn_q"), config.head_count * hd, d)?;
            let k = Linear::load(file, &name("attn_k"), kv, d)?;
            let v = Linear::load(file, &name("attn_v"), kv, d)?;
            let gate = Linear::load(file, &name("ffn_gate"), ff, d)?;
            let up = Linear::load(file, &name("ffn_up"), ff, d)?;
            layers.push(Layer {
                attn_norm: file.read_vector(&name("attn_norm"), d)?,
                wqkv: Linear::stack(vec![q, k, v])?,
                wo: Linear::load(file, &name("attn_output"), d, config.head_count * hd)?,
                ffn_norm: file.read_vector(&name("ffn_norm"), d)?,
                wgate_up: Linear::stack(vec![gate, up])?,
                wdown: Linear::load(file, &name("ffn_down"), d, ff)?,
            });
        }
        let rope = RopeTable::new(hd, config.rope_freq_base, config.context_length);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("sluice-compute-{i}"))
            .build()
            .map_err(|e| ModelError::Device(format!("cannot start compute threads: {e}")))?;
        Ok(Self {
            config,
            embed,
            output,
            output_norm,
            layers,
            rope,
            pool,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Bytes of weights one forward step streams (every matrix once, the vocabulary product
    /// included).
    pub fn weight_bytes(&self) -> usize {
        let head = self.output.as_ref().unwrap_or(&self.embed).bytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wo.bytes() + l.wgate_up.bytes() + l.wdown.bytes())
            .sum();
        head + layers
    }

    /// Floating-point operations (multiply and add counted apart) one token costs at context
    /// `ctx`: every matrix product plus attention's `q·K` and `p·V`.
    pub fn flops_per_token(&self, ctx: usize) -> f64 {
        let c = &self.config;
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let linear = |l: &Linear| (l.rows() * l.cols()) as f64;
        let per_layer: f64 = self
            .layers
            .iter()
            .map(|l| linear(&l.wqkv) + linear(&l.wo) + linear(&l.wgate_up) + linear(&l.wdown))
            .sum();
        let attention = (c.block_count * c.head_count * c.head_dim * ctx) as f64 * 2.0;
        2.0 * (per_layer + linear(head) + attention)
    }

    /// Compute threads this model runs on.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs one step over a ragged batch and returns logits `[rows, vocab]` for the rows the
    /// batch asks for, in sequence order (see [`StepBatch::num_logit_rows`]).
    pub fn forward(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<Tensor> {
        self.forward_host(batch, kv)?.into_tensor()
    }

    /// [`Llama::forward`]'s logits as the rows the vocabulary product wrote, uncopied.
    pub fn forward_host(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<HostLogits> {
        kv.validate(batch, &self.config)?;
        let pool = kv.kernel_pool()?;
        // The whole step runs on a compute thread: each kernel's `pool.install` then runs inline
        // and its parallel loop is shared by stealing between workers that are already awake,
        // instead of the caller sleeping and waking once per matrix product.
        Ok(self.pool.install(|| self.forward_on_pool(batch, pool)))
    }

    /// `forward` after validation, on one of the pool's threads.
    fn forward_on_pool(&self, batch: &StepBatch, kv: &mut KernelPool) -> HostLogits {
        let c = &self.config;
        let d = c.embedding_length;
        let n = batch.num_tokens();
        let tokens = TokenMap::new(batch);
        let mut x = vec![0.0f32; n * d];
        for (row, &t) in x
            .chunks_exact_mut(d)
            .zip(batch.seqs.iter().flat_map(|s| &s.tokens))
        {
            self.embed.row(t as usize, row);
        }
        let mut buf = StepBuffers::new(c, n);
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention_block(li, layer, batch, &tokens, kv, &mut x, &mut buf);
            self.feed_forward_block(layer, &mut x, &mut buf);
        }

        // Only the rows that need logits go through the final norm and the vocabulary product.
        let rows = batch.logit_rows();
        let mut selected = Vec::with_capacity(rows.len() * d);
        for &r in &rows {
            selected.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        let mut normed = vec![0.0f32; selected.len()];
        rms_norm(&selected, &self.output_norm, c.rms_norm_eps, &mut normed);
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0.0f32; rows.len() * c.vocab_size];
        head.apply(&self.pool, &normed, rows.len(), &mut buf.q8, &mut logits);
        HostLogits::new(logits, c.vocab_size)
    }

    /// One layer's attention half: norm, Q/K/V, RoPE, the KV write, attention over each
    /// sequence's blocks, the output projection added into `x`.
    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        li: usize,
        layer: &Layer,
        batch: &StepBatch,
        tokens: &TokenMap,
        kv: &mut KernelPool,
        x: &mut [f32],
        buf: &mut StepBuffers,
    ) {
        let c = &self.config;
        let (hd, heads, kv_w) = (c.head_dim, c.head_count, c.kv_width());
        let qkv_w = heads * hd + 2 * kv_w;
        let n = tokens.pos.len();
        rms_norm(x, &layer.attn_norm, c.rms_norm_eps, &mut buf.h);
        layer
            .wqkv
            .apply(&self.pool, &buf.h, n, &mut buf.q8, &mut buf.qkv);
        for (t, row) in buf.qkv.chunks_exact_mut(qkv_w).enumerate() {
            let (qk, v) = row.split_at_mut(heads * hd + kv_w);
            let pos = tokens.pos[t];
            self.rope.apply(qk, pos);
            let (_, k) = qk.split_at(heads * hd);
            let s = &batch.seqs[tokens.seq[t]];
            let block = s.block_table[pos / kv.block_size()] as usize;
            kv.write(li, block, pos % kv.block_size(), k, v);
        }
        let view = kv.view(li);
        let group = c.group_size();
        // Query heads per task: a KV head's whole group, which reads its keys and values
        // once for all of them, unless that leaves too few tasks for the threads. A head's
        // result is the same either way.
        let per_task = if n * c.head_count_kv >= 2 * self.pool.current_num_threads() {
            group
        } else {
            1
        };
        let (path, scale) = (best_path(), 1.0 / (hd as f32).sqrt());
        let qkv = &buf.qkv;
        self.pool.install(|| {
            buf.attn
                .par_chunks_mut(per_task * hd)
                .enumerate()
                .for_each_init(Vec::new, |scores, (i, out)| {
                    let (t, head) = (i * per_task / heads, i * per_task % heads);
                    let s = &batch.seqs[tokens.seq[t]];
                    let q = &qkv[t * qkv_w + head * hd..t * qkv_w + (head + per_task) * hd];
                    let ctx = tokens.pos[t] + 1;
                    let kv_head = head / group;
                    attend(
                        path,
                        q,
                        &view,
                        kv_head,
                        &s.block_table,
                        ctx,
                        scale,
                        scores,
                        out,
                    );
                });
        });
        layer
            .wo
            .apply(&self.pool, &buf.attn, n, &mut buf.q8, &mut buf.proj);
        add_into(x, &buf.proj);
    }

    /// One layer's feed-forward half: norm, gate and up, SiLU, down, added into `x`.
    fn feed_forward_block(&self, layer: &Layer, x: &mut [f32], buf: &mut StepBuffers) {
        let c = &self.config;
        let n = x.len() / c.embedding_length;
        rms_norm(x, &layer.ffn_norm, c.rms_norm_eps, &mut buf.h);
        layer
            .wgate_up
            .apply(&self.pool, &buf.h, n, &mut buf.q8, &mut buf.gate_up);
        silu_mul(&buf.gate_up, c.feed_forward_length, &mut buf.act);
        layer
            .wdown
            .apply(&self.pool, &buf.act, n, &mut buf.q8, &mut buf.proj);
        add_into(x, &buf.proj);
    }
}

/// Per token of a step: its sequence and its position.
struct TokenMap {
    seq: Vec<usize>,
    pos: Vec<usize>,
}

impl TokenMap {
    fn new(batch: &StepBatch) -> Self {
        let n = batch.num_tokens();
        let (mut seq, mut pos) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (si, s) in batch.seqs.iter().enumerate() {
            for j in 0..s.tokens.len() {
                seq.push(si);
                pos.push(s.start_pos + j);
            }
        }
        Self { seq, pos }
    }
}

/// The activations of one step, reused by every layer.
struct StepBuffers {
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    q8: QuantActs,
}

impl StepBuffers {
    fn new(c: &LlamaConfig, n: usize) -> Self {
        let (d, hd, ff) = (c.embedding_length, c.head_dim, c.feed_forward_length);
        Self {
            h: vec![0.0; n * d],
            qkv: vec![0.0; n * (c.head_count * hd + 2 * c.kv_width())],
            attn: vec![0.0; n * c.head_count * hd],
            proj: vec![0.0; n * d],
            gate_up: vec![0.0; n * 2 * ff],
            act: vec![0.0; n * ff],
            q8: QuantActs::default(),
        }
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

//! The Llama network: weights as loaded from GGUF, and the ragged batched forward pass.
//!
//! Weights are dequantized to f32 at load and multiplied with the batch-invariant kernels in
//! [`crate::kernels`]; Q, K and V are fused into one projection, and so are gate and up, so a
//! layer runs four matrix products over all tokens of the step.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::batch::{Logits, StepBatch};
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kernels::activation::silu_mul;
use crate::kernels::attention::attend;
use crate::kernels::dot::best_path;
use crate::kernels::norm::rms_norm;
use crate::kernels::quant::QuantActs;
use crate::kernels::rope::RopeTable;
use crate::kv::KvStore;
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

    /// Checks a batch against the model and the KV store before anything is written.
    fn validate(&self, batch: &StepBatch, kv: &KvStore) -> Result<()> {
        let bad = |m: String| Err(ModelError::InvalidBatch(m));
        for (i, s) in batch.seqs.iter().enumerate() {
            if s.tokens.is_empty() {
                return bad(format!("sequence {i} feeds no tokens"));
            }
            let end = s.start_pos + s.tokens.len();
            if end > self.rope.max_positions() {
                return bad(format!(
                    "sequence {i} reaches position {end}, beyond the context length {}",
                    self.rope.max_positions()
                ));
            }
            if let Some(t) = s
                .tokens
                .iter()
                .find(|t| **t as usize >= self.config.vocab_size)
            {
                return bad(format!("sequence {i}: token id {t} outside the vocabulary"));
            }
            if s.block_table.len() < kv.blocks_for(end) {
                return bad(format!(
                    "sequence {i} needs {} blocks for {end} positions, has {}",
                    kv.blocks_for(end),
                    s.block_table.len()
                ));
            }
            if let Some(b) = s
                .block_table
                .iter()
                .find(|b| **b as usize >= kv.num_blocks())
            {
                return bad(format!("sequence {i}: block {b} outside the KV store"));
            }
        }
        Ok(())
    }

    /// Runs one step over a ragged batch and returns logits `[rows, vocab]` for the rows the
    /// batch asks for, in sequence order (see [`StepBatch::num_logit_rows`]).
    pub fn forward(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<Tensor> {
        self.validate(batch, kv)?;
        // The whole step runs on a compute thread: each kernel's `pool.install` then runs inline
        // and its parallel loop is shared by stealing between workers that are already awake,
        // instead of the caller sleeping and waking once per matrix product.
        self.pool.install(|| self.forward_on_pool(batch, kv))
    }

    /// `forward` after validation, on one of the pool's threads.
    fn forward_on_pool(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<Tensor> {
        let c = &self.config;
        let (d, hd, ff) = (c.embedding_length, c.head_dim, c.feed_forward_length);
        let (heads, kv_w) = (c.head_count, c.kv_width());
        let qkv_w = heads * hd + 2 * kv_w;
        let n = batch.num_tokens();
        let path = best_path();
        let scale = 1.0 / (hd as f32).sqrt();

        // Per token: its sequence and its position.
        let mut token_seq = Vec::with_capacity(n);
        let mut token_pos = Vec::with_capacity(n);
        for (si, s) in batch.seqs.iter().enumerate() {
            for j in 0..s.tokens.len() {
                token_seq.push(si);
                token_pos.push(s.start_pos + j);
            }
        }
        let mut x = vec![0.0f32; n * d];
        for (row, &t) in x
            .chunks_exact_mut(d)
            .zip(batch.seqs.iter().flat_map(|s| &s.tokens))
        {
            self.embed.row(t as usize, row);
        }

        let mut h = vec![0.0f32; n * d];
        let mut qkv = vec![0.0f32; n * qkv_w];
        let mut attn = vec![0.0f32; n * heads * hd];
        let mut proj = vec![0.0f32; n * d];
        let mut gate_up = vec![0.0f32; n * 2 * ff];
        let mut act = vec![0.0f32; n * ff];
        let mut q8 = QuantActs::default();

        for (li, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, c.rms_norm_eps, &mut h);
            layer.wqkv.apply(&self.pool, &h, n, &mut q8, &mut qkv);
            for (t, row) in qkv.chunks_exact_mut(qkv_w).enumerate() {
                let (qk, v) = row.split_at_mut(heads * hd + kv_w);
                self.rope.apply(qk, token_pos[t]);
                let (_, k) = qk.split_at(heads * hd);
                let s = &batch.seqs[token_seq[t]];
                let pos = token_pos[t];
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
            self.pool.install(|| {
                attn.par_chunks_mut(per_task * hd)
                    .enumerate()
                    .for_each_init(Vec::new, |scores, (i, out)| {
                        let (t, head) = (i * per_task / heads, i * per_task % heads);
                        let s = &batch.seqs[token_seq[t]];
                        let q = &qkv[t * qkv_w + head * hd..t * qkv_w + (head + per_task) * hd];
                        let ctx = token_pos[t] + 1;
                        attend(
                            path,
                            q,
                            &view,
                            head / group,
                            &s.block_table,
                            ctx,
                            scale,
                            scores,
                            out,
                        );
                    });
            });
            layer.wo.apply(&self.pool, &attn, n, &mut q8, &mut proj);
            add_into(&mut x, &proj);

            rms_norm(&x, &layer.ffn_norm, c.rms_norm_eps, &mut h);
            layer
                .wgate_up
                .apply(&self.pool, &h, n, &mut q8, &mut gate_up);
            silu_mul(&gate_up, ff, &mut act);
            layer.wdown.apply(&self.pool, &act, n, &mut q8, &mut proj);
            add_into(&mut x, &proj);
        }

        // Only the rows that need logits go through the final norm and the vocabulary product.
        let mut rows = Vec::new();
        let mut offset = 0;
        for s in &batch.seqs {
            let len = s.tokens.len();
            match s.logits {
                Logits::None => {}
                Logits::Last => rows.push(offset + len - 1),
                Logits::All => rows.extend(offset..offset + len),
            }
            offset += len;
        }
        let mut selected = Vec::with_capacity(rows.len() * d);
        for &r in &rows {
            selected.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        let mut normed = vec![0.0f32; selected.len()];
        rms_norm(&selected, &self.output_norm, c.rms_norm_eps, &mut normed);
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0.0f32; rows.len() * c.vocab_size];
        head.apply(&self.pool, &normed, rows.len(), &mut q8, &mut logits);
        Ok(Tensor::from_vec(
            logits,
            (rows.len(), c.vocab_size),
            &Device::Cpu,
        )?)
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

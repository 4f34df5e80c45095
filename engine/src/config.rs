//! [`EngineConfig`]: the limits one engine schedules within.

use sluice_models::{KvStore, Model};

use crate::error::EngineError;

/// Limits and sizes for one engine. [`EngineConfig::for_model`] gives defaults sized for a CPU
/// replica of the model; every field can be overridden before [`crate::Engine::start`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The `model_name` label on every metric, and the name the gateway serves.
    pub model_name: String,
    /// Sequences in one step at most (decodes and prefill chunks together).
    pub max_num_seqs: usize,
    /// Tokens one forward call may feed: decode tokens plus prefill chunks. Smaller keeps
    /// inter-token latency low while long prompts prefill; larger prefills faster.
    pub max_num_batched_tokens: usize,
    /// Requests that may wait for admission; beyond it `submit` fails with `QueueFull`.
    pub max_waiting: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool. `None`: as many as `kv_cache_bytes` holds.
    pub num_kv_blocks: Option<usize>,
    /// Memory for the KV pool when `num_kv_blocks` is `None`, on the CPU.
    pub kv_cache_bytes: usize,
    /// On a GPU, when `num_kv_blocks` is `None`: the share of the device memory left free after
    /// the weights loaded that the KV pool takes (vLLM's `--gpu-memory-utilization`).
    pub gpu_memory_utilization: f64,
    /// Longest prompt + completion. `None`: the model's trained context.
    pub max_model_len: Option<usize>,
    /// Fraction of blocks kept free when admitting a new sequence, so running sequences can
    /// grow without preempting each other at once.
    pub watermark: f64,
    /// Reuse KV blocks across requests that share a prompt prefix.
    pub enable_prefix_caching: bool,
    /// Largest `n` (choices per request) accepted.
    pub max_n: usize,
}

impl EngineConfig {
    /// Defaults for a CPU replica: a step of 256 tokens (about half a second of prefill on two
    /// cores, so a decode never waits longer than that behind a long prompt), 64 sequences,
    /// 1 GiB of KV.
    pub fn for_model(model: &Model) -> Self {
        Self {
            model_name: model
                .path()
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| model.config().name.clone()),
            max_num_seqs: 64,
            max_num_batched_tokens: 256,
            max_waiting: 1024,
            block_size: sluice_models::kv::DEFAULT_BLOCK_SIZE,
            num_kv_blocks: None,
            kv_cache_bytes: 1 << 30,
            gpu_memory_utilization: 0.90,
            max_model_len: None,
            watermark: 0.01,
            enable_prefix_caching: true,
            max_n: 16,
        }
    }

    /// The figures the engine runs with, checked against the model.
    pub(crate) fn resolve(&self, model: &Model) -> Result<Resolved, EngineError> {
        let bad = |m: String| Err(EngineError::Config(m));
        if self.block_size == 0 {
            return bad("block_size must be at least 1".into());
        }
        if self.max_num_seqs == 0 {
            return bad("max_num_seqs must be at least 1".into());
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return bad(format!(
                "max_num_batched_tokens ({}) must be at least max_num_seqs ({}): every running \
                 sequence needs a token of each step",
                self.max_num_batched_tokens, self.max_num_seqs
            ));
        }
        if !(0.0..1.0).contains(&self.watermark) {
            return bad(format!("watermark {} must be in [0, 1)", self.watermark));
        }
        if self.max_n == 0 {
            return bad("max_n must be at least 1".into());
        }
        let context = model.config().context_length;
        let max_model_len = self.max_model_len.unwrap_or(context);
        if max_model_len == 0 || max_model_len > context {
            return bad(format!(
                "max_model_len {max_model_len} must be in 1..={context} (the model's context)"
            ));
        }
        let num_blocks = match self.num_kv_blocks {
            Some(n) => n,
            None => {
                self.budget_bytes(model)?
                    / KvStore::bytes_per_block(model.config(), self.block_size)
            }
        };
        // One sequence of the longest allowed length must fit, or it could never finish.
        let needed = max_model_len.div_ceil(self.block_size);
        if num_blocks < needed {
            return bad(format!(
                "{num_blocks} KV blocks of {} tokens cannot hold one sequence of max_model_len \
                 {max_model_len} ({needed} blocks); raise the KV budget or lower max_model_len",
                self.block_size
            ));
        }
        Ok(Resolved {
            max_model_len,
            num_blocks,
            watermark_blocks: (self.watermark * num_blocks as f64) as usize,
        })
    }
}

impl EngineConfig {
    /// Bytes for the KV pool: on a GPU a share of its free memory, else `kv_cache_bytes`.
    fn budget_bytes(&self, model: &Model) -> Result<usize, EngineError> {
        let free = model
            .device_memory()
            .map_err(|e| EngineError::Config(e.to_string()))?;
        let Some((free, total)) = free else {
            return Ok(self.kv_cache_bytes);
        };
        let u = self.gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return Err(EngineError::Config(format!(
                "--gpu-memory-utilization {u} must be in (0, 1]"
            )));
        }
        let bytes = (free as f64 * u) as usize;
        tracing::info!(
            free_mib = free >> 20,
            total_mib = total >> 20,
            kv_mib = bytes >> 20,
            "KV pool sized from free device memory × --gpu-memory-utilization {u}"
        );
        Ok(bytes)
    }
}

/// Figures derived from the config and the model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resolved {
    pub max_model_len: usize,
    pub num_blocks: usize,
    pub watermark_blocks: usize,
}

//! KV storage: a preallocated pool of fixed-size blocks per layer, wherever the model runs.
//!
//! The caller (the engine's block manager) decides which blocks a sequence owns and passes them as
//! a block table with every batch; the forward pass writes each new token's K and V to the slot
//! its position maps to (`block_table[pos / block_size]`, slot `pos % block_size`) and reads
//! attention through the same mapping. This type owns memory only, not allocation policy, and
//! hides where the memory is: the CPU kernels' pool in host memory, or the candle backend's
//! tensors on its device. A model makes the store its forward pass reads
//! ([`crate::Model::new_kv_store`]).

use crate::batch::StepBatch;
use crate::candle::DeviceKv;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kernels::attention::KvView;

/// Default tokens per block (vLLM's default too).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// The block pool of one model: its geometry, and the memory of the backend it was made for.
#[derive(Debug)]
pub struct KvStore {
    block_size: usize,
    num_blocks: usize,
    pool: Pool,
}

#[derive(Debug)]
enum Pool {
    Kernels(KernelPool),
    Candle(DeviceKv),
}

/// The CPU kernels' pool: per block and KV head, keys transposed (`[head_dim][slot]`) and values
/// as rows (`[slot][head_dim]`), the layout the attention kernel reads.
#[derive(Debug)]
pub(crate) struct KernelPool {
    block_size: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: Vec<LayerKv>,
}

#[derive(Debug)]
struct LayerKv {
    /// Half floats as bits (see `kernels::attention`): `u16` so a zeroed pool is mapped lazily.
    k: Vec<u16>,
    v: Vec<u16>,
}

/// Checks a pool's geometry; returns the K (or V) elements one layer holds.
pub(crate) fn pool_elements(
    config: &LlamaConfig,
    num_blocks: usize,
    block_size: usize,
) -> Result<usize> {
    if block_size == 0 || num_blocks == 0 {
        return Err(ModelError::InvalidBatch(
            "the KV store needs at least one block of at least one token".into(),
        ));
    }
    num_blocks
        .checked_mul(block_size)
        .and_then(|n| n.checked_mul(config.kv_width()))
        .ok_or_else(|| ModelError::InvalidBatch("KV store size overflows".into()))
}

impl KvStore {
    /// Allocates `num_blocks` blocks of `block_size` tokens for every layer of the model, in
    /// host memory for the CPU kernels (`Model::new_kv_store` picks the model's backend).
    pub fn new(config: &LlamaConfig, num_blocks: usize, block_size: usize) -> Result<Self> {
        let per_layer = pool_elements(config, num_blocks, block_size)?;
        let layers = (0..config.block_count)
            .map(|_| LayerKv {
                // Zeroed allocations are mapped lazily by the OS: untouched blocks cost nothing.
                k: vec![0; per_layer],
                v: vec![0; per_layer],
            })
            .collect();
        let pool = Pool::Kernels(KernelPool {
            block_size,
            kv_heads: config.head_count_kv,
            head_dim: config.head_dim,
            layers,
        });
        Ok(Self {
            block_size,
            num_blocks,
            pool,
        })
    }

    /// A store around the candle backend's device pool.
    pub(crate) fn on_device(pool: DeviceKv, num_blocks: usize, block_size: usize) -> Self {
        Self {
            block_size,
            num_blocks,
            pool: Pool::Candle(pool),
        }
    }

    /// Bytes one block takes across all layers (K and V), for sizing the pool from a budget.
    /// Both backends store half floats.
    pub fn bytes_per_block(config: &LlamaConfig, block_size: usize) -> usize {
        2 * config.block_count * block_size * config.kv_width() * std::mem::size_of::<u16>()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// The backend this store was made for, for messages.
    pub fn backend_name(&self) -> &'static str {
        match self.pool {
            Pool::Kernels(_) => "kernels",
            Pool::Candle(_) => "candle",
        }
    }

    /// The CPU kernels' pool, or an error when this store was made for another backend.
    pub(crate) fn kernel_pool(&mut self) -> Result<&mut KernelPool> {
        match &mut self.pool {
            Pool::Kernels(p) => Ok(p),
            Pool::Candle(_) => Err(wrong_backend("kernels", "candle")),
        }
    }

    /// The candle backend's pool, or an error when this store was made for another backend.
    pub(crate) fn device_pool(&mut self) -> Result<&mut DeviceKv> {
        match &mut self.pool {
            Pool::Candle(p) => Ok(p),
            Pool::Kernels(_) => Err(wrong_backend("candle", "kernels")),
        }
    }

    /// Checks a batch against the model and this store before anything is written: the same
    /// contract for every backend.
    pub(crate) fn validate(&self, batch: &StepBatch, config: &LlamaConfig) -> Result<()> {
        let bad = |m: String| Err(ModelError::InvalidBatch(m));
        for (i, s) in batch.seqs.iter().enumerate() {
            if s.tokens.is_empty() {
                return bad(format!("sequence {i} feeds no tokens"));
            }
            let end = s.start_pos + s.tokens.len();
            if end > config.context_length {
                return bad(format!(
                    "sequence {i} reaches position {end}, beyond the context length {}",
                    config.context_length
                ));
            }
            if let Some(t) = s.tokens.iter().find(|t| **t as usize >= config.vocab_size) {
                return bad(format!("sequence {i}: token id {t} outside the vocabulary"));
            }
            if s.block_table.len() < self.blocks_for(end) {
                return bad(format!(
                    "sequence {i} needs {} blocks for {end} positions, has {}",
                    self.blocks_for(end),
                    s.block_table.len()
                ));
            }
            if let Some(b) = s
                .block_table
                .iter()
                .find(|b| **b as usize >= self.num_blocks)
            {
                return bad(format!("sequence {i}: block {b} outside the KV store"));
            }
        }
        Ok(())
    }
}

fn wrong_backend(want: &str, have: &str) -> ModelError {
    ModelError::InvalidBatch(format!(
        "the {want} backend cannot run on a KV store made for the {have} backend; \
         make the store with Model::new_kv_store"
    ))
}

impl KernelPool {
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    pub(crate) fn view(&self, layer: usize) -> KvView<'_> {
        let l = &self.layers[layer];
        KvView {
            k: &l.k,
            v: &l.v,
            block_size: self.block_size,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// Writes one token's K and V (each `kv_heads × head_dim`) at `(block, slot)`.
    pub(crate) fn write(&mut self, layer: usize, block: usize, slot: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        // The layout alone (no pools borrowed), for the offsets.
        let view = KvView {
            k: &[],
            v: &[],
            block_size: self.block_size,
            kv_heads: self.kv_heads,
            head_dim: hd,
        };
        let l = &mut self.layers[layer];
        // Rounded to the nearest half float (ties to even), as llama.cpp's f16 cache stores them.
        let half = |x: f32| half::f16::from_f32_const(x).to_bits();
        for h in 0..view.kv_heads {
            let vo = view.v_offset(block, h, slot);
            for (o, x) in l.v[vo..vo + hd].iter_mut().zip(&v[h * hd..(h + 1) * hd]) {
                *o = half(*x);
            }
            for (d, x) in k[h * hd..(h + 1) * hd].iter().enumerate() {
                l.k[view.k_offset(block, h, slot, d)] = half(*x);
            }
        }
    }
}

//! KV storage: a preallocated pool of fixed-size blocks per layer.
//!
//! The caller (the engine's block manager) decides which blocks a sequence owns and passes them as
//! a block table with every batch; the forward pass writes each new token's K and V to the slot
//! its position maps to (`block_table[pos / block_size]`, slot `pos % block_size`) and reads
//! attention through the same mapping. This type owns memory only, not allocation policy.

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kernels::attention::KvView;

/// Default tokens per block (vLLM's default too).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Per-layer K and V pools in f32: per block and KV head, keys transposed (`[head_dim][slot]`)
/// and values as rows (`[slot][head_dim]`), the layout the attention kernel reads.
#[derive(Debug)]
pub struct KvStore {
    block_size: usize,
    num_blocks: usize,
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

impl KvStore {
    /// Allocates `num_blocks` blocks of `block_size` tokens for every layer of the model.
    pub fn new(config: &LlamaConfig, num_blocks: usize, block_size: usize) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(ModelError::InvalidBatch(
                "the KV store needs at least one block of at least one token".into(),
            ));
        }
        let per_layer = num_blocks
            .checked_mul(block_size)
            .and_then(|n| n.checked_mul(config.kv_width()))
            .ok_or_else(|| ModelError::InvalidBatch("KV store size overflows".into()))?;
        let layers = (0..config.block_count)
            .map(|_| LayerKv {
                // Zeroed allocations are mapped lazily by the OS: untouched blocks cost nothing.
                k: vec![0; per_layer],
                v: vec![0; per_layer],
            })
            .collect();
        Ok(Self {
            block_size,
            num_blocks,
            kv_heads: config.head_count_kv,
            head_dim: config.head_dim,
            layers,
        })
    }

    /// Bytes one block takes across all layers (K and V), for sizing the pool from a budget.
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

//! The candle backend's block pool: per layer, one f16 tensor of keys and one of values on the
//! device, `[num_blocks · block_size, kv_heads · head_dim]`, a row per slot (slot
//! `block · block_size + pos % block_size`).

use candle_core::{DType, Device, Tensor};

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kv::pool_elements;

/// Per-layer K and V rows in half floats, on the model's device.
#[derive(Debug)]
pub struct DeviceKv {
    layers: Vec<(Tensor, Tensor)>,
}

impl DeviceKv {
    /// Allocates the pool, zeroed. A device that cannot hold it gives an error naming the size,
    /// never an abort later.
    pub(crate) fn new(
        config: &LlamaConfig,
        num_blocks: usize,
        block_size: usize,
        device: &Device,
    ) -> Result<Self> {
        pool_elements(config, num_blocks, block_size)?;
        let shape = (num_blocks * block_size, config.kv_width());
        let alloc = || {
            Tensor::zeros(shape, DType::F16, device).map_err(|e| {
                ModelError::Device(format!(
                    "cannot allocate a KV pool of {num_blocks} blocks ({} MiB) on {:?}: {e}",
                    (num_blocks * crate::kv::KvStore::bytes_per_block(config, block_size)) >> 20,
                    device.location()
                ))
            })
        };
        let layers = (0..config.block_count)
            .map(|_| Ok((alloc()?, alloc()?)))
            .collect::<Result<_>>()?;
        Ok(Self { layers })
    }

    /// Writes the step's keys and values (`[n, kv_width]` f32 each) into the slots `index`
    /// names (`[n, kv_width]` u32, every element of a row the row's slot): one scatter each.
    pub(crate) fn write(&self, layer: usize, index: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
        let (kp, vp) = &self.layers[layer];
        kp.scatter_set(index, &k.to_dtype(DType::F16)?, 0)?;
        vp.scatter_set(index, &v.to_dtype(DType::F16)?, 0)?;
        Ok(())
    }

    /// A layer's key and value pools.
    pub(crate) fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }
}

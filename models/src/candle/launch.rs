//! What the custom ops' CUDA launches do alike: views of their operands and a grid of one
//! thread per item.

use candle_core::cuda::cudarc::driver::{CudaView, LaunchConfig};
use candle_core::cuda::CudaDType;
use candle_core::{CudaStorage, Layout, Storage, Tensor};

/// Threads per block of the one-thread-per-item kernels.
pub(crate) const THREADS: u32 = 256;

/// A grid of one thread per item, [`THREADS`] to a block (at least one block).
pub(crate) fn per_item(items: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((items as u32).div_ceil(THREADS).max(1), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The part of a contiguous storage that `layout` starts at.
pub(crate) fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    layout: &Layout,
) -> candle_core::Result<CudaView<'a, T>> {
    Ok(s.as_cuda_slice::<T>()?.slice(layout.start_offset()..))
}

/// A tensor an op holds beside its operands (metadata, tables), read-locked on the device
/// while `f` launches with it.
pub(crate) fn held<T: CudaDType, R>(
    t: &Tensor,
    op: &str,
    f: impl FnOnce(CudaView<'_, T>) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else {
        candle_core::bail!("{op}: an input is not on the GPU");
    };
    f(view::<T>(s, layout)?)
}

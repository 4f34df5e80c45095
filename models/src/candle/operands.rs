//! How the custom ops reach their operands: the contiguous slice of a CPU storage, a tensor an
//! op holds beside its operands (metadata, tables) read-locked while it runs, and on CUDA
//! views and a grid of one thread per item.

use candle_core::{CpuStorage, Layout, Storage, Tensor};

/// The contiguous slice of a CPU storage that `layout` covers.
pub(crate) fn cpu_slice<'a, T: candle_core::WithDType>(
    s: &'a CpuStorage,
    layout: &Layout,
    op: &str,
) -> candle_core::Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&s.as_slice::<T>()?[start..end]),
        None => candle_core::bail!("{op}: inputs must be contiguous"),
    }
}

/// A CPU tensor an op holds beside its operands, read-locked while `f` reads its values.
pub(crate) fn held_on_cpu<T: candle_core::WithDType, R>(
    t: &Tensor,
    op: &str,
    f: impl FnOnce(&[T]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("{op}: an input is not on the CPU");
    };
    f(cpu_slice(cpu, layout, op)?)
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::{held, per_item, view, THREADS};

#[cfg(feature = "cuda")]
mod cuda {
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
        if !layout.is_contiguous() {
            candle_core::bail!("a custom op's operand must be contiguous on the GPU");
        }
        Ok(s.as_cuda_slice::<T>()?.slice(layout.start_offset()..))
    }

    /// A device tensor an op holds beside its operands, read-locked while `f` launches with it.
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
}

//! How the custom ops reach their operands: the contiguous slice of a CPU storage, a tensor an
//! op holds beside its operands (metadata, tables) read-locked while it runs, the grid each
//! CUDA kernel is launched over, and on CUDA views.

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

/// Threads per block of the kernels that run a thread per item, and of the fused norm's
/// row blocks; must match `THREADS` in fused.cu.
#[cfg(any(feature = "cuda", test))]
pub(crate) const ITEM_THREADS: u32 = 256;

/// The grid a kernel is launched over: blocks in x, y and z, threads per block (in x), dynamic
/// shared memory. The one owner of each kernel's launch shape: the CUDA launch and the tests
/// that run the kernels under the host emulation (`emulator.rs`) both take it from the
/// op.
#[cfg(any(feature = "cuda", test))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grid {
    pub blocks: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: u32,
}

#[cfg(any(feature = "cuda", test))]
impl Grid {
    /// One thread per item, [`ITEM_THREADS`] to a block (at least one block).
    pub(crate) fn per_item(items: usize) -> Self {
        Grid {
            blocks: ((items as u32).div_ceil(ITEM_THREADS).max(1), 1, 1),
            threads: ITEM_THREADS,
            shared_bytes: 0,
        }
    }
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::{held, view};

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda::cudarc::driver::{CudaView, LaunchConfig};
    use candle_core::cuda::CudaDType;
    use candle_core::{CudaStorage, Layout, Storage, Tensor};

    use super::Grid;

    impl From<Grid> for LaunchConfig {
        fn from(g: Grid) -> Self {
            LaunchConfig {
                grid_dim: g.blocks,
                block_dim: (g.threads, 1, 1),
                shared_mem_bytes: g.shared_bytes,
            }
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

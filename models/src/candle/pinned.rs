//! How a step's logits reach the host ([`HostLogits`]): on a GPU, into page-locked buffers the
//! model keeps and lends one step at a time.
//!
//! The device copies into page-locked memory directly; pageable memory goes through a staging
//! buffer of the driver's, and a fresh allocation per step adds page faults on top (see
//! [`crate::host_logits`] for the sizes). A buffer is lent as a [`Lease`] inside the step's
//! [`HostLogits`] and comes back when they are dropped, after sampling; the model keeps at
//! most [`KEPT`] of them. The buffers are allocated without write-combining, since the CPU
//! reads them (write-combined memory is uncached for reads; cudarc's `alloc_pinned` asks for
//! it). Steps of more than [`MAX_PINNED_BYTES`] of logits (prompt log-probabilities over many
//! rows) copy through pageable memory, and so does every step once an allocation has failed
//! or `SLUICE_PINNED_LOGITS=0` turned the buffers off. On the CPU there is nothing to pin: the
//! rows are copied once out of the tensor.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::Tensor;

use crate::error::Result;
use crate::host_logits::HostLogits;

/// The most logits bytes a step copies into a page-locked buffer (a batch of 256 of
/// Llama-3's 128,256-token rows is 131 MB).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const MAX_PINNED_BYTES: usize = 256 << 20;

/// Buffers kept between steps; one is in use at a time when one engine drives the model.
const KEPT: usize = 2;

/// Whether `SLUICE_PINNED_LOGITS` leaves the buffers on (anything but `0`, `off` or `false`;
/// on by default): a switch for every binary, for measuring one copy against the other.
pub fn from_env() -> bool {
    super::env_switch("SLUICE_PINNED_LOGITS", true)
}

/// The model's page-locked buffers and whether steps use them.
#[derive(Debug)]
pub(crate) struct PinnedLogits {
    on: AtomicBool,
    #[cfg(feature = "cuda")]
    free: std::sync::Arc<cuda::Free>,
}

impl PinnedLogits {
    pub(crate) fn new(on: bool) -> Self {
        Self {
            on: AtomicBool::new(on),
            #[cfg(feature = "cuda")]
            free: Default::default(),
        }
    }

    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// `logits` (`[rows, vocab]` f32, on the model's device) on the host, copied once.
    pub(crate) fn to_host(&self, logits: &Tensor) -> Result<HostLogits> {
        #[cfg(feature = "cuda")]
        if let candle_core::Device::Cuda(dev) = logits.device() {
            let bytes = logits.elem_count() * std::mem::size_of::<f32>();
            if self.is_on() && bytes > 0 && bytes <= MAX_PINNED_BYTES {
                return self.copy_pinned(dev, logits);
            }
        }
        HostLogits::from_tensor(logits)
    }

    /// `logits` copied into a page-locked buffer; through pageable memory, and from now on,
    /// if none can be allocated.
    #[cfg(feature = "cuda")]
    fn copy_pinned(&self, dev: &candle_core::CudaDevice, logits: &Tensor) -> Result<HostLogits> {
        match cuda::copy(&self.free, dev, logits) {
            Ok(host) => Ok(host),
            Err(cuda::Failed::Alloc(e)) => {
                tracing::warn!(
                    error = %e,
                    bytes = logits.elem_count() * std::mem::size_of::<f32>(),
                    "cannot allocate page-locked memory for the logits; copying them through \
                     pageable memory from now on"
                );
                self.set(false);
                HostLogits::from_tensor(logits)
            }
            Err(cuda::Failed::Copy(e)) => Err(e.into()),
        }
    }
}

/// A buffer a [`Shelf`] keeps: what it holds, in values.
trait Buffer {
    fn capacity(&self) -> usize;
}

/// Buffers between steps: a step takes the smallest that fits and puts it back when done; at
/// most [`KEPT`] stay, the smallest going first.
#[derive(Debug)]
struct Shelf<B>(std::sync::Mutex<Vec<B>>);

impl<B> Default for Shelf<B> {
    fn default() -> Self {
        Self(std::sync::Mutex::new(Vec::new()))
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl<B: Buffer> Shelf<B> {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<B>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The smallest kept buffer of at least `len` values.
    fn take(&self, len: usize) -> Option<B> {
        let mut list = self.list();
        let fits = (0..list.len())
            .filter(|&i| list[i].capacity() >= len)
            .min_by_key(|&i| list[i].capacity());
        fits.map(|i| list.swap_remove(i))
    }

    /// Keeps `buf` for a later step; past [`KEPT`] buffers, the smallest is dropped (after the
    /// lock is released: freeing page-locked memory waits on the driver).
    fn put(&self, buf: B) {
        let dropped = {
            let mut list = self.list();
            list.push(buf);
            let smallest = (0..list.len()).min_by_key(|&i| list[i].capacity());
            smallest
                .filter(|_| list.len() > KEPT)
                .map(|i| list.swap_remove(i))
        };
        drop(dropped);
    }
}

// Page-locked memory is allocated and read through the driver's FFI (the crate's other unsafe
// code is the CPU kernels' and the kernel launches').
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
mod cuda {
    use std::sync::Arc;

    use candle_core::cuda::cudarc::driver::{DriverError, PinnedHostSlice};
    use candle_core::cuda::WrapErr;
    use candle_core::{CudaDevice, Tensor};

    use super::{Buffer, Shelf};
    use crate::candle::operands::held;
    use crate::host_logits::HostLogits;

    /// The buffers not lent out.
    pub(super) type Free = Shelf<PinnedHostSlice<f32>>;

    impl Buffer for PinnedHostSlice<f32> {
        fn capacity(&self) -> usize {
            self.len()
        }
    }

    /// A kept buffer of at least `len` values, or a new one of `len` rounded up to a power of
    /// two (so a growing batch allocates a few times, not every step).
    fn take(
        free: &Free,
        dev: &CudaDevice,
        len: usize,
    ) -> Result<PinnedHostSlice<f32>, DriverError> {
        if let Some(buf) = free.take(len) {
            return Ok(buf);
        }
        let ctx = dev.cuda_stream().context().clone();
        // SAFETY: the memory is uninitialised, and only its first `len` values are read, after
        // the copy that writes them has finished (`copy`). Flags 0: page-locked, cached for the
        // CPU's reads (not write-combined).
        unsafe { ctx.alloc_pinned_with_flags::<f32>(len.next_power_of_two(), 0) }
    }

    /// A buffer lent to one step's [`HostLogits`]: its first `len` values hold the logits.
    pub(crate) struct Lease {
        buf: Option<PinnedHostSlice<f32>>,
        ptr: *const f32,
        len: usize,
        free: Arc<Free>,
    }

    // SAFETY: `ptr` points into the buffer the lease owns (freed only by dropping that
    // buffer, which the lease does not do while it lives), and nothing writes the buffer while
    // it is lent, so sharing reads of it between threads is sound; `PinnedHostSlice` is itself
    // `Send` and `Sync`.
    unsafe impl Send for Lease {}
    unsafe impl Sync for Lease {}

    impl Lease {
        pub(crate) fn as_slice(&self) -> &[f32] {
            // SAFETY: `ptr` is valid for `len` values (see the `Send` impl), which the copy
            // wrote and the stream had finished writing before the lease was made.
            unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
        }
    }

    impl Drop for Lease {
        fn drop(&mut self) {
            if let Some(buf) = self.buf.take() {
                self.free.put(buf);
            }
        }
    }

    /// Why a copy into a page-locked buffer failed.
    pub(super) enum Failed {
        /// No buffer could be allocated: the caller copies through pageable memory instead.
        Alloc(DriverError),
        Copy(candle_core::Error),
    }

    /// `logits` copied into a buffer of `free`'s, the stream synchronised.
    pub(super) fn copy(
        free: &Arc<Free>,
        dev: &CudaDevice,
        logits: &Tensor,
    ) -> Result<HostLogits, Failed> {
        let (_, vocab) = logits.dims2().map_err(Failed::Copy)?;
        let logits = logits.contiguous().map_err(Failed::Copy)?;
        let len = logits.elem_count();
        let mut buf = take(free, dev, len).map_err(Failed::Alloc)?;
        let stream = dev.cuda_stream();
        let copied = held::<f32, _>(&logits, "logits", |view| {
            let dst = &mut buf.as_mut_slice().w()?[..len];
            // A plain slice of page-locked memory: the copy is asynchronous, hence the
            // synchronisation before anything reads it.
            stream.memcpy_dtoh(&view.slice(..len), dst).w()?;
            stream.synchronize().w()?;
            Ok(())
        });
        let ptr = copied.and_then(|()| buf.as_ptr().w());
        match ptr {
            Ok(ptr) => {
                let lease = Lease {
                    buf: Some(buf),
                    ptr,
                    len,
                    free: free.clone(),
                };
                Ok(HostLogits::pinned(lease, vocab))
            }
            Err(e) => {
                free.put(buf);
                Err(Failed::Copy(e))
            }
        }
    }
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::Lease;

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    impl Buffer for Vec<f32> {
        fn capacity(&self) -> usize {
            self.len()
        }
    }

    #[test]
    fn a_step_takes_the_smallest_buffer_that_fits() {
        let shelf = Shelf::default();
        for n in [64, 16, 32] {
            shelf.put(vec![0.0f32; n]);
        }
        // Three put back, two kept: the smallest went.
        assert_eq!(shelf.take(1).map(|b| b.len()), Some(32));
        assert_eq!(shelf.take(33).map(|b| b.len()), Some(64));
        assert!(shelf.take(1).is_none());
        shelf.put(vec![0.0; 8]);
        assert!(shelf.take(9).is_none(), "too small: the caller allocates");
        assert_eq!(shelf.take(8).map(|b| b.len()), Some(8));
    }

    #[test]
    fn on_the_cpu_the_rows_are_copied_out_whatever_the_switch() {
        let t = Tensor::arange(0f32, 12.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 4))
            .unwrap();
        for on in [true, false] {
            let host = PinnedLogits::new(on).to_host(&t).unwrap();
            assert_eq!((host.rows(), host.vocab()), (3, 4));
            assert_eq!(host.row(2), &[8.0, 9.0, 10.0, 11.0]);
        }
    }
}

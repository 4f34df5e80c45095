//! [`HostLogits`]: a step's logits rows in host memory, where sampling reads them.
//!
//! Every step ends with one row of logits per sampled sequence on the host: at batch 64,
//! 12.6 MB for the default model's 49,152-token vocabulary and 32.8 MB for Llama-3's. A GPU
//! step used to copy them through pageable memory into a fresh CPU tensor, which the engine
//! then copied again into a flat `Vec`: two copies and two rounds of page faults per step,
//! ~1 ms each at batch 64 on the CPU side alone, where the batch-64 target allows a step
//! 6.4 ms. Here a step's rows land once: on the CPU backends in the `Vec` the forward pass
//! filled, on a GPU in a reused page-locked buffer the device copies into directly
//! ([`crate::candle::pinned`]), and are read in place.

use candle_core::{Device, Tensor};

use crate::error::Result;

/// Logits `[rows, vocab]`, f32, row-major, on the host.
pub struct HostLogits {
    buf: Buf,
    rows: usize,
    vocab: usize,
}

/// Where the rows live.
enum Buf {
    Owned(Vec<f32>),
    /// A page-locked buffer lent by the model; it goes back when the logits are dropped.
    #[cfg(feature = "cuda")]
    Pinned(crate::candle::pinned::Lease),
}

impl HostLogits {
    /// `data` as rows of `vocab`.
    ///
    /// # Panics
    /// If `data` is not a whole number of rows (a bug in the backend that filled it).
    pub fn new(data: Vec<f32>, vocab: usize) -> Self {
        let rows = rows_of(data.len(), vocab);
        Self {
            buf: Buf::Owned(data),
            rows,
            vocab,
        }
    }

    /// Rows held in a page-locked buffer.
    #[cfg(feature = "cuda")]
    pub(crate) fn pinned(lease: crate::candle::pinned::Lease, vocab: usize) -> Self {
        let rows = rows_of(lease.as_slice().len(), vocab);
        Self {
            buf: Buf::Pinned(lease),
            rows,
            vocab,
        }
    }

    /// The rows of a `[rows, vocab]` f32 tensor on any device, copied once.
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        let (_, vocab) = t.dims2()?;
        Ok(Self::new(t.flatten_all()?.to_vec1::<f32>()?, vocab))
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Every row, one after another.
    pub fn as_slice(&self) -> &[f32] {
        match &self.buf {
            Buf::Owned(v) => v,
            #[cfg(feature = "cuda")]
            Buf::Pinned(lease) => lease.as_slice(),
        }
    }

    /// Row `i`.
    ///
    /// # Panics
    /// If `i` is not below [`HostLogits::rows`].
    pub fn row(&self, i: usize) -> &[f32] {
        assert!(i < self.rows, "row {i} of {} logits rows", self.rows);
        &self.as_slice()[i * self.vocab..(i + 1) * self.vocab]
    }

    /// The rows as a CPU tensor, for callers that compute on them with candle (owned rows
    /// move into it; a page-locked buffer's are copied and the buffer goes back).
    pub fn into_tensor(self) -> Result<Tensor> {
        let shape = (self.rows, self.vocab);
        Ok(match self.buf {
            Buf::Owned(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            #[cfg(feature = "cuda")]
            Buf::Pinned(lease) => Tensor::from_slice(lease.as_slice(), shape, &Device::Cpu)?,
        })
    }

    /// Each row as its own `Vec` (a copy).
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        (0..self.rows).map(|i| self.row(i).to_vec()).collect()
    }
}

impl std::fmt::Debug for HostLogits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match &self.buf {
            Buf::Owned(_) => "owned",
            #[cfg(feature = "cuda")]
            Buf::Pinned(_) => "page-locked",
        };
        f.debug_struct("HostLogits")
            .field("rows", &self.rows)
            .field("vocab", &self.vocab)
            .field("buffer", &place)
            .finish()
    }
}

/// Whole rows of `vocab` in `len` values.
fn rows_of(len: usize, vocab: usize) -> usize {
    assert!(
        vocab > 0 && len.is_multiple_of(vocab),
        "{len} logits are not whole rows of {vocab}"
    );
    len / vocab
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_in_place_and_copied_out_whole() {
        let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let l = HostLogits::new(data.clone(), 4);
        assert_eq!((l.rows(), l.vocab()), (3, 4));
        assert_eq!(l.row(1), &[4.0, 5.0, 6.0, 7.0]);
        assert_eq!(l.as_slice(), &data[..]);
        assert_eq!(l.to_vecs()[2], vec![8.0, 9.0, 10.0, 11.0]);
        let t = l.into_tensor().unwrap();
        assert_eq!(t.dims(), &[3, 4]);
        let back = HostLogits::from_tensor(&t).unwrap();
        assert_eq!(back.as_slice(), &data[..]);
    }

    #[test]
    fn an_empty_step_has_no_rows() {
        let l = HostLogits::new(Vec::new(), 49_152);
        assert_eq!(l.rows(), 0);
        assert!(l.as_slice().is_empty());
        assert_eq!(l.into_tensor().unwrap().dims(), &[0, 49_152]);
    }

    #[test]
    #[should_panic(expected = "not whole rows")]
    fn a_partial_row_is_a_bug() {
        HostLogits::new(vec![0.0; 5], 4);
    }

    #[test]
    #[should_panic(expected = "row 3 of 3")]
    fn a_row_past_the_end_is_a_bug() {
        HostLogits::new(vec![0.0; 12], 4).row(3);
    }
}

//! [`HostLogits`]: a step's logits rows in host memory, where sampling reads them.
//!
//! Every step ends with one row of logits per sampled sequence on the host: at batch 64,
//! 12.6 MB for the default model's 49,152-token vocabulary and 32.8 MB for Llama-3's. A GPU
//! step used to copy them through pageable memory into a fresh CPU tensor, which the engine
//! then copied again into a flat `Vec`: two copies and two rounds of page faults per step,
//! ~1 ms each at batch 64 on the CPU side alone, where the batch-64 target allows a step
//! 6.4 ms. Here a step's rows land once: on the CPU backends in the `Vec` the forward pass
//! filled, on a GPU in a reused page-locked buffer the device copies into directly
//! ([`crate::candle::pinned`]), and are read in place. A row whose sequence asked only for
//! the token a [`crate::Pick`] chooses ([`crate::Logits::Pick`]) may come back as that token
//! alone.

use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};

/// Logits rows `[rows, vocab]`, f32, row-major, on the host; some rows possibly reduced to
/// the token picked from them.
pub struct HostLogits {
    /// The whole rows, one after another.
    buf: Buf,
    vocab: usize,
    /// Each row in step order; `None` while every row is whole (the common case).
    slots: Option<Vec<Slot>>,
}

/// Where the rows live.
enum Buf {
    Owned(Vec<f32>),
    /// A page-locked buffer lent by the model; it goes back when the logits are dropped.
    #[cfg(feature = "cuda")]
    Pinned(crate::candle::pinned::Lease),
}

/// One row of a step with picked tokens in it.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    /// The `i`th whole row of the buffer.
    Whole(usize),
    /// What the model answered for the row's pick instead of the row.
    Answered(Answer),
}

/// A row's most likely ids for a caller that draws among them itself ([`crate::Pick::Top`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Top {
    /// `(id, logit)`, most likely first (the lower id first on ties).
    pub logits: Vec<(u32, f32)>,
    /// `ln Σ e^logit` over the row's ids below the pick's bound: a logit less it is that id's
    /// log-probability.
    pub log_z: f32,
    /// For a [`crate::Nucleus`]: the row's total weight at its temperature (`Σ e^((logit −
    /// max) / T)` over the ids below the bound, the most likely id's weight 1), which its
    /// `top_p` is a share of; the list holds the nucleus ([`crate::logits::holds_nucleus`]).
    pub mass: Option<f32>,
}

/// What a model answers for a [`crate::Pick`] on its device.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Picked(Picked),
    Top(Top),
}

/// A token picked from its row on the model's device ([`crate::Pick`]), with, when the pick
/// asks for them ([`crate::Pick::logprobs`]), its log-probability under the softmax of the
/// row's raw logits over the pick's ids (what a request's `logprobs` report, whatever its
/// temperature) and the pick's `top_logprobs` most likely ids with theirs, most likely first
/// (the lower id first on ties).
#[derive(Debug, Clone, PartialEq)]
pub struct Picked {
    pub id: u32,
    /// `None` when the pick asked for no log-probabilities: the model skipped the normaliser.
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

/// A row as the step returned it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row<'a> {
    Logits(&'a [f32]),
    /// The token picked from the row on the model's device ([`crate::Pick`]), for a sequence
    /// that asked for nothing else.
    Picked(&'a Picked),
    /// The row's most likely ids ([`crate::Pick::Top`]).
    Top(&'a Top),
}

impl HostLogits {
    /// `data` as whole rows of `vocab`.
    ///
    /// # Panics
    /// If `data` is not a whole number of rows (a bug in the backend that filled it).
    pub fn new(data: Vec<f32>, vocab: usize) -> Self {
        whole_rows(data.len(), vocab);
        Self {
            buf: Buf::Owned(data),
            vocab,
            slots: None,
        }
    }

    /// Rows held in a page-locked buffer.
    #[cfg(feature = "cuda")]
    pub(crate) fn pinned(lease: crate::candle::pinned::Lease, vocab: usize) -> Self {
        whole_rows(lease.as_slice().len(), vocab);
        Self {
            buf: Buf::Pinned(lease),
            vocab,
            slots: None,
        }
    }

    /// The rows of a `[rows, vocab]` f32 tensor on any device, copied once.
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        let (_, vocab) = t.dims2()?;
        Ok(Self::new(t.flatten_all()?.to_vec1::<f32>()?, vocab))
    }

    /// A step's rows from `self`'s whole rows and the picks answered apart: `picked` has an
    /// entry per row of the step, `true` for the rows `answers` answer (in order), `false` for
    /// those `self` holds (in order).
    ///
    /// # Panics
    /// If the counts do not match (a bug in the backend).
    pub(crate) fn with_picked(self, picked: &[bool], answers: Vec<Answer>) -> Self {
        let (mut whole, mut next) = (0, answers.into_iter());
        let slots: Vec<Slot> = picked
            .iter()
            .map(|&p| {
                if p {
                    Slot::Answered(next.next().expect("an answer per picked row"))
                } else {
                    whole += 1;
                    Slot::Whole(whole - 1)
                }
            })
            .collect();
        assert!(
            next.next().is_none() && whole == self.whole_rows(),
            "picked answers and whole rows do not make up the step"
        );
        Self {
            slots: Some(slots),
            ..self
        }
    }

    /// Rows the step returned (whole or picked).
    pub fn rows(&self) -> usize {
        self.slots.as_ref().map_or(self.whole_rows(), Vec::len)
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    fn whole_rows(&self) -> usize {
        self.whole().len() / self.vocab
    }

    /// The whole rows, one after another.
    fn whole(&self) -> &[f32] {
        match &self.buf {
            Buf::Owned(v) => v,
            #[cfg(feature = "cuda")]
            Buf::Pinned(lease) => lease.as_slice(),
        }
    }

    fn whole_row(&self, i: usize) -> &[f32] {
        &self.whole()[i * self.vocab..(i + 1) * self.vocab]
    }

    /// Row `i` as the step returned it.
    ///
    /// # Panics
    /// If `i` is not below [`HostLogits::rows`].
    pub fn get(&self, i: usize) -> Row<'_> {
        assert!(i < self.rows(), "row {i} of {} logits rows", self.rows());
        match self.slots.as_ref().map(|s| &s[i]) {
            None => Row::Logits(self.whole_row(i)),
            Some(&Slot::Whole(w)) => Row::Logits(self.whole_row(w)),
            Some(Slot::Answered(Answer::Picked(p))) => Row::Picked(p),
            Some(Slot::Answered(Answer::Top(t))) => Row::Top(t),
        }
    }

    /// Row `i`'s logits.
    ///
    /// # Panics
    /// If `i` is not below [`HostLogits::rows`], or row `i` came back as its picked token.
    pub fn row(&self, i: usize) -> &[f32] {
        match self.get(i) {
            Row::Logits(r) => r,
            Row::Picked(_) | Row::Top(_) => {
                panic!("row {i} came back as its picked token, not its logits")
            }
        }
    }

    /// The rows as a CPU tensor, for callers that compute on them with candle (owned rows
    /// move into it; a page-locked buffer's are copied and the buffer goes back). An error if
    /// some rows came back as picked tokens.
    pub fn into_tensor(self) -> Result<Tensor> {
        if self.slots.is_some() {
            return Err(ModelError::Unsupported(
                "logits with picked tokens in them are not a tensor".into(),
            ));
        }
        let shape = (self.whole_rows(), self.vocab);
        Ok(match self.buf {
            Buf::Owned(v) => Tensor::from_vec(v, shape, &Device::Cpu)?,
            #[cfg(feature = "cuda")]
            Buf::Pinned(lease) => Tensor::from_slice(lease.as_slice(), shape, &Device::Cpu)?,
        })
    }

    /// Each row's logits as its own `Vec` (a copy).
    ///
    /// # Panics
    /// As [`HostLogits::row`].
    pub fn to_vecs(&self) -> Vec<Vec<f32>> {
        (0..self.rows()).map(|i| self.row(i).to_vec()).collect()
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
            .field("rows", &self.rows())
            .field("whole_rows", &self.whole_rows())
            .field("vocab", &self.vocab)
            .field("buffer", &place)
            .finish()
    }
}

/// Checks that `len` values are whole rows of `vocab`.
fn whole_rows(len: usize, vocab: usize) {
    assert!(
        vocab > 0 && len.is_multiple_of(vocab),
        "{len} logits are not whole rows of {vocab}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picked(id: u32) -> Picked {
        Picked {
            id,
            logprob: Some(-(id as f32)),
            top: vec![(id, -(id as f32))],
        }
    }

    #[test]
    fn rows_are_read_in_place_and_copied_out_whole() {
        let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let l = HostLogits::new(data.clone(), 4);
        assert_eq!((l.rows(), l.vocab()), (3, 4));
        assert_eq!(l.row(1), &[4.0, 5.0, 6.0, 7.0]);
        assert_eq!(l.get(2), Row::Logits(&[8.0, 9.0, 10.0, 11.0]));
        assert_eq!(l.to_vecs()[2], vec![8.0, 9.0, 10.0, 11.0]);
        let t = l.into_tensor().unwrap();
        assert_eq!(t.dims(), &[3, 4]);
        let back = HostLogits::from_tensor(&t).unwrap();
        assert_eq!(back.to_vecs().concat(), data);
    }

    #[test]
    fn picked_tokens_take_their_rows_places_in_step_order() {
        let whole: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let (a, b) = (picked(7), picked(1));
        let both = vec![Answer::Picked(a.clone()), Answer::Picked(b.clone())];
        let l = HostLogits::new(whole, 4).with_picked(&[true, false, true, false], both);
        assert_eq!(l.rows(), 4);
        assert_eq!(l.get(0), Row::Picked(&a));
        assert_eq!(l.row(1), &[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(l.get(2), Row::Picked(&b));
        assert_eq!(l.row(3), &[4.0, 5.0, 6.0, 7.0]);
        assert!(l.into_tensor().is_err());
    }

    #[test]
    #[should_panic(expected = "picked token, not its logits")]
    fn a_picked_row_has_no_logits() {
        HostLogits::new(Vec::new(), 4)
            .with_picked(&[true], vec![Answer::Picked(picked(2))])
            .row(0);
    }

    #[test]
    #[should_panic(expected = "do not make up the step")]
    fn ids_and_rows_must_make_up_the_step() {
        HostLogits::new(vec![0.0; 4], 4).with_picked(&[true], vec![Answer::Picked(picked(2))]);
    }

    #[test]
    fn an_empty_step_has_no_rows() {
        let l = HostLogits::new(Vec::new(), 49_152);
        assert_eq!(l.rows(), 0);
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

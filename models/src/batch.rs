//! The ragged batch one forward call runs: any mix of prefill chunks and decode tokens from
//! different sequences, flattened into one token list.

use crate::logits;

/// Which of a sequence's rows the caller wants logits for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Logits {
    /// None: a prefill chunk that is not the end of its prompt.
    None,
    /// The last token's row only: what sampling needs.
    Last,
    /// Every token's row: prompt log-probabilities, or scoring forced continuations.
    All,
    /// The last token's row, of which the caller needs only the token [`Pick`] chooses from
    /// it and the log-probabilities the pick names (a sequence that reads nothing else in the
    /// row: no bias, penalties or grammar). A backend may answer with that token alone
    /// ([`crate::host_logits::Picked`]: the candle backend does, so a GPU copies a few
    /// kilobytes instead of the row; see [`crate::HostLogits::get`]) or with the whole row, as
    /// for [`Logits::Last`] (the CPU kernels do).
    Pick(Pick),
}

/// The token a row's sequence takes from it, for a model that chooses it on its device
/// ([`Logits::Pick`]): what the engine's sampler would choose from the whole row, the same
/// token up to exact ties and rounding at a boundary between two tokens' shares; with it,
/// when `logprobs` is `Some(n)` (a request's `logprobs` / `top_logprobs`), its
/// log-probability and those of the `n` most likely ids ([`crate::host_logits::Picked`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// The most likely id below `below` (greedy).
    Argmax { below: u32, logprobs: Option<usize> },
    /// A draw over the ids below `below` from the softmax at `temperature` (> 0), ids whose
    /// weight relative to the most likely one's is below `min_p` (0: none) left out: the
    /// id whose share of the cumulative weights in id order holds `uniform` (in [0, 1)) of
    /// the total, found block by block ([`crate::logits::pick_in_row`]).
    Draw {
        below: u32,
        temperature: f32,
        min_p: f32,
        uniform: f64,
        logprobs: Option<usize>,
    },
    /// The `k` most likely ids below `below` with their logits, and the row's log normaliser
    /// ([`crate::host_logits::Top`]): all that a draw from the top `k` (top-p within them
    /// included) and its log-probabilities read, so the caller draws it itself. With a
    /// [`Nucleus`] (top-p over the whole row), also the row's total weight at its temperature,
    /// or the whole row where the `k` do not hold the nucleus.
    Top {
        below: u32,
        k: usize,
        nucleus: Option<Nucleus>,
    },
}

/// Top-p over a whole row ([`Pick::Top`]): the fewest most likely ids whose weights at
/// `temperature` (> 0) reach `top_p` of the row's total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nucleus {
    pub temperature: f32,
    pub top_p: f32,
}

impl Pick {
    /// The ids the pick chooses among are those below this.
    pub fn below(&self) -> u32 {
        match *self {
            Pick::Argmax { below, .. } | Pick::Draw { below, .. } | Pick::Top { below, .. } => {
                below
            }
        }
    }

    /// Whether the caller reads the picked token's log-probability, and of how many of the
    /// most likely ids besides (`None` for a top list, which carries its logits).
    pub fn logprobs(&self) -> Option<usize> {
        match *self {
            Pick::Argmax { logprobs, .. } | Pick::Draw { logprobs, .. } => logprobs,
            Pick::Top { .. } => None,
        }
    }

    /// How many of the most likely ids the caller reads the log-probabilities of.
    pub fn top_logprobs(&self) -> usize {
        self.logprobs().unwrap_or(0)
    }

    /// The token this pick chooses from a whole row of logits, made on the host: what a
    /// model that picks on its device answers (up to exact ties and rounding), and what a
    /// caller that got the row whole makes of it.
    pub fn on_host(&self, row: &[f32]) -> u32 {
        let l = &row[..(self.below() as usize).min(row.len())];
        match *self {
            Pick::Draw {
                temperature,
                min_p,
                uniform,
                ..
            } => logits::draw_in_row(l, 1.0 / temperature, min_p.max(0.0), uniform),
            // Greedy; a top list's first id.
            Pick::Argmax { .. } | Pick::Top { .. } => logits::argmax(l),
        }
    }
}

/// One sequence's part of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqChunk {
    /// The tokens this step feeds for the sequence (a prefill chunk, or one decode token).
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]`: the number of tokens already in this sequence's KV cache.
    pub start_pos: usize,
    /// The KV blocks that hold positions `0..start_pos + tokens.len()`, in order.
    pub block_table: Vec<u32>,
    pub logits: Logits,
}

impl SeqChunk {
    /// Rows of logits the step returns for this sequence.
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            Logits::None => 0,
            Logits::Last | Logits::Pick(_) => usize::from(!self.tokens.is_empty()),
            Logits::All => self.tokens.len(),
        }
    }
}

/// A whole step: sequences in the order their logits come back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepBatch {
    pub seqs: Vec<SeqChunk>,
}

impl StepBatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, chunk: SeqChunk) {
        self.seqs.push(chunk);
    }

    /// Tokens fed in this step across all sequences.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// Rows of logits the forward call returns.
    pub fn num_logit_rows(&self) -> usize {
        self.seqs.iter().map(SeqChunk::logit_rows).sum()
    }

    /// For each row the step returns, in order, the token its sequence asks for alone
    /// ([`Logits::Pick`]), or `None` where it wants the whole row.
    pub fn picks(&self) -> Vec<Option<Pick>> {
        let mut out = Vec::with_capacity(self.num_logit_rows());
        for s in self.seqs.iter().filter(|s| !s.tokens.is_empty()) {
            match s.logits {
                Logits::None => {}
                Logits::Last => out.push(None),
                Logits::Pick(pick) => out.push(Some(pick)),
                Logits::All => out.extend(std::iter::repeat_n(None, s.tokens.len())),
            }
        }
        out
    }

    /// For each row the step returns, in order, the index of its sequence in `seqs`.
    pub fn logit_row_seqs(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.num_logit_rows());
        for (i, s) in self.seqs.iter().enumerate() {
            out.extend(std::iter::repeat_n(i, s.logit_rows()));
        }
        out
    }

    /// The flat token indices whose logits the step returns, in order.
    pub fn logit_rows(&self) -> Vec<usize> {
        let mut rows = Vec::with_capacity(self.num_logit_rows());
        let mut offset = 0;
        for s in &self.seqs {
            let len = s.tokens.len();
            match s.logits {
                Logits::None => {}
                Logits::Last | Logits::Pick(_) => {
                    rows.extend(offset + len.saturating_sub(1)..offset + len)
                }
                Logits::All => rows.extend(offset..offset + len),
            }
            offset += len;
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, logits: Logits) -> SeqChunk {
        SeqChunk {
            tokens: vec![1; n],
            start_pos: 0,
            block_table: vec![0],
            logits,
        }
    }

    #[test]
    fn picks_follow_the_returned_rows() {
        let argmax = |below| {
            Logits::Pick(Pick::Argmax {
                below,
                logprobs: None,
            })
        };
        let draw = Pick::Draw {
            below: 9,
            temperature: 0.7,
            min_p: 0.0,
            uniform: 0.25,
            logprobs: Some(3),
        };
        let batch = StepBatch {
            seqs: vec![
                seq(3, argmax(7)),
                seq(2, Logits::All),
                seq(4, Logits::None),
                seq(1, Logits::Last),
                seq(0, argmax(7)),
                seq(5, Logits::Pick(draw)),
            ],
        };
        assert_eq!(batch.logit_rows(), vec![2, 3, 4, 9, 14]);
        assert_eq!(batch.logit_row_seqs(), vec![0, 1, 1, 3, 5]);
        assert_eq!(
            batch.picks(),
            vec![
                Some(Pick::Argmax {
                    below: 7,
                    logprobs: None
                }),
                None,
                None,
                None,
                Some(draw)
            ]
        );
        assert_eq!((draw.below(), draw.top_logprobs()), (9, 3));
        assert_eq!(batch.num_logit_rows(), 5);
    }
}

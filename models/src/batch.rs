//! The ragged batch one forward call runs: any mix of prefill chunks and decode tokens from
//! different sequences, flattened into one token list.

/// Which of a sequence's rows the caller wants logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None: a prefill chunk that is not the end of its prompt.
    None,
    /// The last token's row only: what sampling needs.
    Last,
    /// Every token's row: prompt log-probabilities, or scoring forced continuations.
    All,
    /// The last token's row, of which the caller reads only the most likely id below `below`
    /// (greedy sampling with nothing else to read in the row: no log-probabilities, bias,
    /// penalties or grammar). A backend may answer with that id alone (the candle backend
    /// does, so a GPU copies 4 bytes instead of the row; see [`crate::HostLogits::get`]) or
    /// with the whole row, as for [`Logits::Last`] (the CPU kernels do).
    Greedy { below: u32 },
}

/// One sequence's part of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqChunk {
    /// The tokens this step feeds for the sequence (a prefill chunk, or one decode token).
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]`: the number of tokens already in this sequence's KV cache.
    pub start_pos: usize,
    /// The KV blocks that hold positions `0..start_pos + tokens.len()`, in order.
    pub block_table: Vec<u32>,
    pub logits: Logits,
}

/// A whole step: sequences in the order their logits come back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
        self.seqs
            .iter()
            .map(|s| match s.logits {
                Logits::None => 0,
                Logits::Last | Logits::Greedy { .. } => usize::from(!s.tokens.is_empty()),
                Logits::All => s.tokens.len(),
            })
            .sum()
    }

    /// For each row the step returns, in order, the bound of the greedy id its sequence asks
    /// for alone ([`Logits::Greedy`]), or `None` where it wants the whole row.
    pub fn greedy_rows(&self) -> Vec<Option<u32>> {
        let mut out = Vec::with_capacity(self.num_logit_rows());
        for s in self.seqs.iter().filter(|s| !s.tokens.is_empty()) {
            match s.logits {
                Logits::None => {}
                Logits::Last => out.push(None),
                Logits::Greedy { below } => out.push(Some(below)),
                Logits::All => out.extend(std::iter::repeat_n(None, s.tokens.len())),
            }
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
                Logits::Last | Logits::Greedy { .. } => {
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
    fn greedy_rows_follow_the_returned_rows() {
        let batch = StepBatch {
            seqs: vec![
                seq(3, Logits::Greedy { below: 7 }),
                seq(2, Logits::All),
                seq(4, Logits::None),
                seq(1, Logits::Last),
                seq(0, Logits::Greedy { below: 7 }),
                seq(5, Logits::Greedy { below: 9 }),
            ],
        };
        assert_eq!(batch.logit_rows(), vec![2, 3, 4, 9, 14]);
        assert_eq!(
            batch.greedy_rows(),
            vec![Some(7), None, None, None, Some(9)]
        );
        assert_eq!(batch.num_logit_rows(), 5);
    }
}

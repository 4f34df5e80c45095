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
                Logits::Last => usize::from(!s.tokens.is_empty()),
                Logits::All => s.tokens.len(),
            })
            .sum()
    }

    /// The flat token indices whose logits the step returns, in order.
    pub fn logit_rows(&self) -> Vec<usize> {
        let mut rows = Vec::with_capacity(self.num_logit_rows());
        let mut offset = 0;
        for s in &self.seqs {
            let len = s.tokens.len();
            match s.logits {
                Logits::None => {}
                Logits::Last => rows.extend(offset + len.saturating_sub(1)..offset + len),
                Logits::All => rows.extend(offset..offset + len),
            }
            offset += len;
        }
        rows
    }
}

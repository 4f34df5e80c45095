//! Which sequences run in the next step, and with how many tokens each.
//!
//! Every step: running sequences that decode (one token each) come first, oldest first; then
//! the rest of the token budget goes to prefill chunks of running sequences whose prompt is not
//! done; then waiting sequences are admitted by priority (higher first, arrival order within a
//! level) while the budget, `max_num_seqs` and the KV pool allow. Decodes therefore run in
//! every step: a long prompt delays them by at most one chunk.
//!
//! When a sequence needs a block and none is available, the most recently admitted running
//! sequence is preempted by recompute: its blocks are released (its full blocks stay in the
//! prefix cache, so recomputing them is often free) and it returns to the waiting queue ahead
//! of later arrivals of its priority.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::block_manager::{prefix_hashes, BlockManager};
use crate::sequence::Seq;

/// Waiting-queue order: priority (higher first), then arrival, then choice.
pub(crate) type QueueKey = (Reverse<i32>, u64, usize);

/// The scheduler's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_size: usize,
    pub watermark_blocks: usize,
}

#[derive(Debug)]
pub(crate) struct Scheduler {
    pub waiting: BTreeMap<QueueKey, Seq>,
    /// In admission order (the last is the newest).
    pub running: Vec<Seq>,
    pub blocks: BlockManager,
    budget: Budget,
    admissions: u64,
}

/// The outcome of planning one step.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Tokens to feed per running sequence (same indices as `running`; 0 = not this step).
    pub tokens: Vec<usize>,
    /// Sequences preempted while planning.
    pub preempted: usize,
    /// Prefix cache figures of the sequences admitted: tokens queried and found.
    pub cache_queried: usize,
    pub cache_hits: usize,
}

impl Scheduler {
    pub fn new(budget: Budget, blocks: BlockManager) -> Self {
        Self {
            waiting: BTreeMap::new(),
            running: Vec::new(),
            blocks,
            budget,
            admissions: 0,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn enqueue(&mut self, seq: Seq) {
        let key = queue_key(&seq);
        self.waiting.insert(key, seq);
    }

    /// Plans the next step; running sequences may be preempted and waiting ones admitted.
    pub fn plan(&mut self) -> Plan {
        let mut plan = Plan {
            tokens: vec![0; self.running.len()],
            ..Plan::default()
        };
        let mut left = self.budget.max_num_batched_tokens;
        let mut rows = RowsLeft(PROMPT_LOGPROB_ROWS);
        // Decodes, then prefill chunks of running sequences.
        for decodes in [true, false] {
            let mut i = 0;
            while i < self.running.len() {
                let rem = self.running[i].remaining();
                if (rem == 1) != decodes || plan.tokens[i] > 0 {
                    i += 1;
                    continue;
                }
                let want = rows.cap(&self.running[i], rem.min(left));
                if want == 0 && left > 0 {
                    // Gathering prompt log-probabilities, with no rows left this step.
                    i += 1;
                    continue;
                }
                if want == 0 {
                    break;
                }
                match self.grow(i, want, &mut plan, &mut left) {
                    Grown::Yes => {
                        rows.take(&self.running[i], want);
                        plan.tokens[i] = want;
                        left -= want;
                        i += 1;
                    }
                    Grown::SelfPreempted => break,
                }
            }
        }
        if plan.preempted == 0 {
            self.admit(&mut plan, (&mut left, &mut rows));
        }
        plan
    }

    /// Gives running sequence `i` the blocks for `n` more tokens, preempting the newest
    /// sequences while none are available.
    fn grow(&mut self, i: usize, n: usize, plan: &mut Plan, left: &mut usize) -> Grown {
        let bs = self.budget.block_size;
        let need = (self.running[i].num_computed + n).div_ceil(bs);
        while self.running[i].blocks.len() < need {
            if let Some(b) = self.blocks.allocate() {
                self.running[i].blocks.push(b);
                continue;
            }
            let victim = self.running.len() - 1;
            *left += plan.tokens.pop().expect("one entry per running sequence");
            self.preempt_last();
            plan.preempted += 1;
            if victim == i {
                return Grown::SelfPreempted;
            }
        }
        Grown::Yes
    }

    /// Moves the newest running sequence back to the waiting queue, releasing its blocks.
    fn preempt_last(&mut self) {
        let mut seq = self.running.pop().expect("a running sequence to preempt");
        self.blocks.release(&seq.blocks);
        seq.blocks.clear();
        seq.hashes.clear();
        seq.num_computed = 0;
        self.enqueue(seq);
    }

    /// Admits waiting sequences while they fit.
    fn admit(&mut self, plan: &mut Plan, (left, rows): (&mut usize, &mut RowsLeft)) {
        let bs = self.budget.block_size;
        while *left > 0 {
            let Some((&key, seq)) = self.waiting.first_key_value() else {
                break;
            };
            // Choice 0 of an n-way request brings its siblings with it after the prompt.
            let seats = 1 + seq.forks_left;
            if self.running.len() + seats > self.budget.max_num_seqs {
                break;
            }
            // The head gathers prompt log-probabilities and the step has no rows left for
            // them: it waits for the next step (admission keeps the queue's order).
            if rows.cap(seq, 1) == 0 {
                break;
            }
            // At least one token is computed, so the last prompt token's logits exist; the
            // rows the prompt's log-probabilities still need are computed too.
            let cacheable = seq.prompt_rows_from().unwrap_or(usize::MAX);
            let cacheable = cacheable.min(seq.tokens.len() - 1);
            let hashes = prefix_hashes(&seq.tokens[..cacheable], bs);
            let hits = self.blocks.cached_prefix_len(&hashes);
            let total = seq.tokens.len().div_ceil(bs);
            let takes = total - hits + self.blocks.unused_in_prefix(&hashes, hits);
            let available = self.blocks.num_available();
            // The watermark keeps room for running sequences to grow; with nothing running
            // there is nothing to protect, and the pool always holds one longest sequence.
            let reserve = if self.running.is_empty() {
                0
            } else {
                self.budget.watermark_blocks
            };
            if takes + reserve > available {
                break;
            }
            let mut seq = self.waiting.remove(&key).expect("first key exists");
            seq.blocks = self.blocks.acquire_prefix(&hashes[..hits]);
            seq.hashes = hashes[..hits].to_vec();
            seq.num_computed = hits * bs;
            plan.cache_queried += seq.tokens.len();
            plan.cache_hits += seq.num_computed;
            seq.cached_prompt.get_or_insert(seq.num_computed);
            self.admissions += 1;
            seq.admitted = self.admissions;
            let n = rows.cap(&seq, seq.remaining().min(*left));
            rows.take(&seq, n);
            let need = (seq.num_computed + n).div_ceil(bs);
            while seq.blocks.len() < need {
                let b = self
                    .blocks
                    .allocate()
                    .expect("checked against the available blocks");
                seq.blocks.push(b);
            }
            *left -= n;
            self.running.push(seq);
            plan.tokens.push(n);
        }
    }

    /// Adds a sequence straight to the running set (a forked choice sharing its parent's
    /// prompt blocks).
    pub fn add_running(&mut self, mut seq: Seq) {
        self.admissions += 1;
        seq.admitted = self.admissions;
        self.running.push(seq);
    }

    /// Removes running sequence `i`, releasing its blocks.
    pub fn finish_running(&mut self, i: usize) -> Seq {
        let seq = self.running.remove(i);
        self.blocks.release(&seq.blocks);
        seq
    }

    /// Tokens still to prefill across the queue and the running set.
    pub fn prefill_backlog(&self) -> usize {
        // A running sequence with one token left is decoding, not prefilling.
        let pending = |s: &Seq| if s.remaining() > 1 { s.remaining() } else { 0 };
        self.waiting.values().map(|s| s.remaining()).sum::<usize>()
            + self.running.iter().map(pending).sum::<usize>()
    }
}

enum Grown {
    Yes,
    SelfPreempted,
}

/// Most rows of logits one step gathers prompt log-probabilities from, across sequences:
/// each is a whole row (49k floats for the default model, 128k for Llama-3), so a long
/// prompt goes in chunks of at most this many tokens rather than the step's token budget.
pub(crate) const PROMPT_LOGPROB_ROWS: usize = 256;

/// What is left of a step's [`PROMPT_LOGPROB_ROWS`].
struct RowsLeft(usize);

impl RowsLeft {
    /// `want` tokens of `seq`, fewer where it gathers prompt log-probabilities.
    fn cap(&self, seq: &Seq, want: usize) -> usize {
        match seq.prompt_rows_from() {
            Some(_) => want.min(self.0),
            None => want,
        }
    }

    fn take(&mut self, seq: &Seq, n: usize) {
        if seq.prompt_rows_from().is_some() {
            self.0 -= n.min(self.0);
        }
    }
}

fn queue_key(seq: &Seq) -> QueueKey {
    (Reverse(seq.req.priority), seq.req.arrival_seq, seq.index)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use super::*;
    use crate::request::SamplingParams;
    use crate::sequence::RequestInfo;

    fn seq(prompt_len: usize, priority: i32, arrival_seq: u64) -> Seq {
        seq_with(
            prompt_len,
            priority,
            arrival_seq,
            SamplingParams::greedy(100),
        )
    }

    fn seq_with(prompt_len: usize, priority: i32, arrival_seq: u64, params: SamplingParams) -> Seq {
        let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
        let req = Arc::new(RequestInfo {
            params,
            max_tokens: 100,
            priority,
            prompt_len,
            arrival: Instant::now(),
            arrival_seq,
            events,
            eos: Vec::new(),
            grammar_eos: Vec::new(),
            deadline: None,
            choice_base: 0,
        });
        // Distinct tokens per request, so prompts share no cached prefix by accident.
        let tokens = (0..prompt_len as u32)
            .map(|t| t + 1000 * arrival_seq as u32)
            .collect();
        Seq::new(req, 0, tokens)
    }

    fn scheduler(num_blocks: usize, block_size: usize, max_tokens: usize) -> Scheduler {
        Scheduler::new(
            Budget {
                max_num_seqs: 4,
                max_num_batched_tokens: max_tokens,
                block_size,
                watermark_blocks: 0,
            },
            BlockManager::new(num_blocks, true),
        )
    }

    /// Applies a plan as the engine would after the forward pass (gathering prompt
    /// log-probabilities from flat rows), and samples token 7 for sequences that reached
    /// their end.
    fn apply(s: &mut Scheduler, plan: &Plan) {
        let row = vec![0.0f32; 4096];
        for (seq, &n) in s.running.iter_mut().zip(&plan.tokens) {
            seq.gather_prompt_logprobs((seq.num_computed, n), |_| &row);
            seq.num_computed += n;
            if n > 0 && seq.num_computed == seq.tokens.len() {
                seq.tokens.push(7);
            }
        }
    }

    /// Sequences gathering prompt log-probabilities share `PROMPT_LOGPROB_ROWS` rows a step
    /// (a long prompt goes in chunks of them; the next one waits its turn, and the queue
    /// behind it with it); others take the rest of the token budget.
    #[test]
    fn prompt_log_probability_rows_are_capped_per_step() {
        let mut s = scheduler(512, 16, 1024);
        let mut gathering = SamplingParams::greedy(4);
        gathering.prompt_logprobs = Some(1);
        s.enqueue(seq_with(400, 0, 1, gathering.clone()));
        s.enqueue(seq_with(400, 0, 2, gathering));
        s.enqueue(seq(100, 0, 3));
        let p = s.plan();
        assert_eq!(p.tokens, [PROMPT_LOGPROB_ROWS]);
        apply(&mut s, &p);
        let p = s.plan();
        let rest = 400 - PROMPT_LOGPROB_ROWS;
        assert_eq!(p.tokens, [rest, PROMPT_LOGPROB_ROWS - rest, 100]);
        apply(&mut s, &p);
        assert_eq!(
            s.running[0].prompt_rows_from(),
            None,
            "the first has all its rows"
        );
    }

    #[test]
    fn decodes_come_first_and_prefill_takes_the_rest_of_the_budget() {
        let mut s = scheduler(64, 4, 32);
        s.enqueue(seq(5, 0, 1));
        s.enqueue(seq(5, 0, 2));
        let p = s.plan();
        assert_eq!(p.tokens, [5, 5]);
        apply(&mut s, &p);
        s.enqueue(seq(100, 0, 3));
        let p = s.plan();
        assert_eq!(p.tokens, [1, 1, 30]);
        apply(&mut s, &p);
        // The long prompt continues in chunks next to the decodes.
        let p = s.plan();
        assert_eq!(p.tokens, [1, 1, 30]);
        assert_eq!(s.prefill_backlog(), 70);
    }

    #[test]
    fn the_newest_sequence_is_preempted_when_blocks_run_out() {
        let mut s = scheduler(4, 4, 64);
        s.enqueue(seq(8, 0, 1));
        s.enqueue(seq(7, 0, 2));
        let p = s.plan();
        assert_eq!(p.tokens, [8, 7]);
        assert_eq!(s.blocks.num_available(), 0);
        apply(&mut s, &p);
        // Both decode next: the first needs a third block; the second is evicted for it.
        let p = s.plan();
        assert_eq!(p.preempted, 1);
        assert_eq!(p.tokens, [1]);
        assert_eq!(s.running.len(), 1);
        let back = s.waiting.values().next().unwrap();
        assert_eq!((back.num_computed, back.blocks.len()), (0, 0));
        // Its prompt and sampled token are recomputed when it returns.
        assert_eq!(back.remaining(), 8);
    }

    #[test]
    fn priority_then_arrival_orders_admission() {
        let mut s = scheduler(64, 4, 64);
        s.budget.max_num_seqs = 1;
        s.enqueue(seq(3, 0, 1));
        s.enqueue(seq(3, 5, 2));
        s.enqueue(seq(3, 5, 3));
        s.plan();
        assert_eq!(s.running[0].req.arrival_seq, 2);
        let order: Vec<u64> = s.waiting.values().map(|q| q.req.arrival_seq).collect();
        assert_eq!(order, [3, 1]);
    }

    #[test]
    fn admission_waits_for_blocks_and_respects_the_watermark() {
        let mut s = scheduler(6, 4, 64);
        s.budget.watermark_blocks = 2;
        s.enqueue(seq(12, 0, 1)); // 3 blocks: alone, the watermark does not apply
        s.enqueue(seq(5, 0, 2)); // 2 blocks: 3 free − 2 < watermark 2
        let p = s.plan();
        assert_eq!(p.tokens, [12]);
        assert_eq!(s.waiting.len(), 1);
    }

    #[test]
    fn cached_prefix_blocks_skip_prefill() {
        let mut s = scheduler(16, 4, 64);
        let a = seq(10, 0, 1);
        let mut b = seq(10, 0, 2);
        b.tokens = a.tokens.clone();
        b.tokens[9] = 99;
        s.enqueue(a);
        let p = s.plan();
        apply(&mut s, &p);
        // Register the computed full blocks as the engine does.
        let hashes = prefix_hashes(&s.running[0].tokens[..8], 4);
        for (i, h) in hashes.iter().enumerate() {
            let blk = s.running[0].blocks[i];
            s.blocks.register(blk, *h);
        }
        s.enqueue(b);
        let p = s.plan();
        assert_eq!(p.tokens, [1, 2]);
        assert_eq!((p.cache_queried, p.cache_hits), (10, 8));
        assert_eq!(s.running[1].blocks[..2], s.running[0].blocks[..2]);
    }
}

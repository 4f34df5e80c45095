//! One replica: continuous batching by the profile's performance model, in closed form.
//!
//! Between events nothing about a replica changes but time, so it is advanced analytically
//! instead of step by step: with `b` sequences decoding and a prefill backlog, every step takes
//! `α + β·b + c/R` seconds for a prefill chunk of `c` tokens (`max_batched_tokens − b`, or the
//! whole backlog if smaller), each decoding sequence gains one token per step, and the head
//! prompt gains `c` tokens of prefill per step. A counter `v` of tokens each decoding sequence
//! has received since the replica started makes a decode finish an entry in a min-heap
//! (`v` at which it ends), so an event costs O(log n) whatever the batch. Prefill is FIFO; a
//! prompt's last chunk yields its first token. Sequences reserve KV for prompt + output when
//! admitted, so there is no preemption to model.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use sluice_policy::profile::Variant;
use sluice_policy::timeline::Request;

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    /// Waiting for its node (`node_ready_s`) and then its image and model; serves at `ready_s`.
    Starting {
        ready_s: f64,
    },
    Ready,
    /// Out of routing, finishing what it holds.
    Draining,
    Gone,
}

/// An f64 with a total order, for heaps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ord64(pub f64);

impl Eq for Ord64 {}

impl PartialOrd for Ord64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ord64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Something a replica did for a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Progress {
    FirstToken { req: u32, t: f64 },
    Finished { req: u32, t: f64 },
}

/// A replica takes new prompts while the ones it holds need less than this much prefill time:
/// enough to keep its prefill busy between routing decisions, short enough that a burst
/// waits at the gateway for whichever replica frees up (or starts) first.
pub const MAX_PREFILL_BACKLOG_S: f64 = 0.5;

/// Prefill left below this many tokens counts as done (floating-point slack).
const TOKEN_EPS: f64 = 1e-6;

#[derive(Debug, Clone)]
pub struct Replica {
    pub key: usize,
    pub node: usize,
    pub phase: Phase,
    /// Bumped whenever the next event moves, so stale heap entries are skipped.
    pub epoch: u64,
    alpha: f64,
    beta: f64,
    prefill_rate: f64,
    chunk: f64,
    kv_cap: u64,
    max_seqs: usize,
    prefill: VecDeque<(u32, f64)>,
    prefill_tokens: f64,
    decoding: BinaryHeap<Reverse<(Ord64, u32)>>,
    kv_of: Vec<(u32, u64)>,
    v: f64,
    kv_used: u64,
    last_s: f64,
    step_s: f64,
    prefill_per_s: f64,
}

impl Replica {
    pub fn new(key: usize, node: usize, v: &Variant, ready_s: f64, now: f64) -> Replica {
        let p = &v.perf;
        Replica {
            key,
            node,
            phase: Phase::Starting { ready_s },
            epoch: 0,
            alpha: p.itl_alpha_ms / 1000.0,
            beta: p.itl_beta_ms / 1000.0,
            prefill_rate: p.prefill_tokens_per_s,
            chunk: f64::from(p.max_batched_tokens),
            kv_cap: p.kv_cache_tokens,
            max_seqs: p.max_num_seqs as usize,
            prefill: VecDeque::new(),
            prefill_tokens: 0.0,
            decoding: BinaryHeap::new(),
            kv_of: Vec::new(),
            v: 0.0,
            kv_used: 0,
            last_s: now,
            step_s: 0.0,
            prefill_per_s: 0.0,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Sequences held (prefilling or decoding).
    pub fn seqs(&self) -> usize {
        self.prefill.len() + self.decoding.len()
    }

    /// Prompts admitted but not yet through prefill.
    pub fn prefilling(&self) -> usize {
        self.prefill.len()
    }

    pub fn kv_usage(&self) -> f64 {
        self.kv_used as f64 / self.kv_cap as f64
    }

    pub fn max_seqs(&self) -> usize {
        self.max_seqs
    }

    /// Whether a request of this size could ever run here.
    pub fn fits(&self, r: &Request) -> bool {
        u64::from(r.prompt_tokens) + u64::from(r.output_tokens) <= self.kv_cap
    }

    /// Whether the replica takes the request now: routable, a sequence slot and KV for its
    /// whole length, and a prefill backlog under [`MAX_PREFILL_BACKLOG_S`] (work beyond that
    /// waits at the gateway, where any replica, a new one included, can take it).
    pub fn can_admit(&self, r: &Request) -> bool {
        self.is_ready()
            && self.seqs() < self.max_seqs
            && self.kv_used + u64::from(r.prompt_tokens) + u64::from(r.output_tokens) <= self.kv_cap
            && (self.prefill.is_empty()
                || self.prefill_tokens / self.prefill_rate < MAX_PREFILL_BACKLOG_S)
    }

    /// Estimated seconds to this request's first token here, for least-load routing.
    pub fn estimated_ttft_s(&self, r: &Request) -> f64 {
        (self.prefill_tokens + f64::from(r.prompt_tokens)) / self.prefill_rate
            + self.alpha
            + self.beta * self.decoding.len() as f64
    }

    fn set_rates(&mut self) {
        let b = self.decoding.len() as f64;
        let decode = self.alpha + self.beta * b;
        if self.prefill.is_empty() {
            self.step_s = decode;
            self.prefill_per_s = 0.0;
        } else {
            let c = (self.chunk - b)
                .max(1.0)
                .min(self.prefill_tokens.max(TOKEN_EPS));
            self.step_s = decode + c / self.prefill_rate;
            self.prefill_per_s = c / self.step_s;
        }
    }

    /// Moves the replica's state to `now`.
    pub fn advance(&mut self, now: f64) {
        let dt = now - self.last_s;
        if dt > 0.0 {
            if !self.decoding.is_empty() {
                // At least one step of `v`'s own precision: hours into a long trace `v` is
                // large, and a time step of one ulp could otherwise leave it where it was.
                self.v = (self.v + dt / self.step_s).max(self.v.next_up());
            }
            if let Some(head) = self.prefill.front_mut() {
                let done = dt * self.prefill_per_s;
                head.1 -= done;
                self.prefill_tokens -= done;
            }
        }
        self.last_s = now;
    }

    /// When the next prefill or decode completes, if anything is running: always after the
    /// last event, by at least the time's own precision (a remainder below it would otherwise
    /// schedule the same instant again and again).
    pub fn next_event(&self) -> Option<f64> {
        let prefill = self
            .prefill
            .front()
            .map(|&(_, left)| self.last_s + left.max(0.0) / self.prefill_per_s);
        let decode = self
            .decoding
            .peek()
            .map(|Reverse((end, _))| self.last_s + (end.0 - self.v).max(0.0) * self.step_s);
        let next = match (prefill, decode) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        next.map(|t| t.max(self.last_s.next_up()))
    }

    /// Admits a request at `now`.
    pub fn admit(&mut self, now: f64, idx: u32, r: &Request) {
        self.advance(now);
        self.prefill
            .push_back((idx, f64::from(r.prompt_tokens).max(TOKEN_EPS)));
        self.prefill_tokens += f64::from(r.prompt_tokens);
        let kv = u64::from(r.prompt_tokens) + u64::from(r.output_tokens);
        self.kv_used += kv;
        self.kv_of.push((idx, kv));
        self.set_rates();
    }

    fn release(&mut self, idx: u32) {
        if let Some(pos) = self.kv_of.iter().position(|&(i, _)| i == idx) {
            self.kv_used -= self.kv_of.swap_remove(pos).1;
        }
    }

    /// Completes whatever is due at `now` (after [`Replica::advance`]).
    pub fn complete(&mut self, now: f64, requests: &[Request], out: &mut Vec<Progress>) {
        self.advance(now);
        loop {
            let head_done = self
                .prefill
                .front()
                .is_some_and(|&(_, left)| left <= TOKEN_EPS);
            if !head_done {
                break;
            }
            let (idx, left) = self.prefill.pop_front().expect("checked");
            self.prefill_tokens -= left.max(0.0);
            if self.prefill.is_empty() {
                self.prefill_tokens = 0.0;
            }
            out.push(Progress::FirstToken { req: idx, t: now });
            let rest = requests[idx as usize].output_tokens.saturating_sub(1);
            if rest == 0 {
                self.release(idx);
                out.push(Progress::Finished { req: idx, t: now });
            } else {
                self.decoding
                    .push(Reverse((Ord64(self.v + f64::from(rest)), idx)));
            }
        }
        // Done within a billionth of a token, or within `v`'s own precision once it is large.
        let slack = 1e-9_f64.max(self.v.abs() * 4.0 * f64::EPSILON);
        while let Some(&Reverse((end, idx))) = self.decoding.peek() {
            if end.0 > self.v + slack {
                break;
            }
            self.decoding.pop();
            self.release(idx);
            out.push(Progress::Finished { req: idx, t: now });
        }
        self.set_rates();
    }

    /// Spot reclaim: the prompts not yet answered go back to the gateway, decoding streams are
    /// cut. Returns (requeue, lost).
    pub fn kill(&mut self) -> (Vec<u32>, Vec<u32>) {
        let requeue = self.prefill.drain(..).map(|(i, _)| i).collect();
        let lost = self.decoding.drain().map(|Reverse((_, i))| i).collect();
        self.kv_of.clear();
        self.kv_used = 0;
        self.prefill_tokens = 0.0;
        self.phase = Phase::Gone;
        (requeue, lost)
    }
}

#[cfg(test)]
mod tests {
    use sluice_policy::profile::Profile;

    use super::*;

    /// Days into a trace the clock's and the token counter's precision are coarser than the
    /// completion slack: an event must still move time and finish what is due, never
    /// reschedule the same instant forever (a 24-hour trace hung the simulator this way).
    #[test]
    fn late_in_a_long_trace_every_event_makes_progress() {
        let profile = Profile::load("llama-3-8b").unwrap();
        let h100 = profile.variant("nvidia-h100-80gb").unwrap();
        let start = 7.0 * 86_400.0;
        let mut r = Replica::new(0, 0, h100, start, start);
        r.phase = Phase::Ready;
        let reqs: Vec<Request> = (0..4)
            .map(|i| Request {
                arrival_s: start,
                prompt_tokens: 100 + i,
                output_tokens: 3 + i,
            })
            .collect();
        // Weeks of decoding behind it: `v`'s own precision is well above a billionth.
        r.v = 3.0e7 + 0.3;
        for (i, q) in reqs.iter().enumerate() {
            r.admit(start, i as u32, q);
        }
        let (mut finished, mut events) = (0, 0);
        let mut out = Vec::new();
        while let Some(t) = r.next_event() {
            assert!(t > r.last_s, "event at {t} not after {}", r.last_s);
            r.complete(t, &reqs, &mut out);
            finished = out
                .iter()
                .filter(|p| matches!(p, Progress::Finished { .. }))
                .count();
            events += 1;
            assert!(events < 10_000, "no progress: {finished} of 4 finished");
        }
        assert_eq!(finished, 4);
    }
}

//! The gateway: one FIFO queue in front of the replicas and least-load routing.
//!
//! A request waits here until some ready replica can admit it (sequence slot, KV for its whole
//! length, a short prefill backlog); among those it goes to the least loaded relative to what
//! the replica's variant serves at SLO: sequences held divided by the variant's planned batch
//! (the capacity model's in-flight count at the SLO for the current request shape), so an H100
//! and an L4 reach their SLO limits together instead of the L4 being loaded like an H100.
//! Ties go to the earliest estimated first token. Work queues centrally rather than on replicas
//! so a replica that has just started takes the backlog at once. The queue is first come,
//! first served, except that a request no ready replica could ever hold (a long prompt while
//! only small-memory replicas run) is passed over rather than blocking everyone behind it; and,
//! as `sluice serve --queue-late-after` orders it (deploy/k8s sets ¾ of the TTFT target), requests
//! that have waited longer than the late-after time yield to those that have not. The queue is
//! bounded as `sluice serve` bounds it ([`QueueLimits`]): past its size a newcomer is refused,
//! and a request that waited past its timeout leaves it refused.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use sluice_policy::timeline::Request;

use crate::sim::fleet::Fleet;

/// How far past where it starts the router looks for requests the blocking of the first does
/// not concern.
const SCAN: usize = 64;

/// The gateway's own bounds on waiting, as `sluice serve` sets them by default (deploy/k8s
/// keeps them): at most `max_queue` requests wait (`--max-queue`: a newcomer beyond is
/// refused with a 429); one that has waited `queue_timeout_s` while some replica is ready
/// (`--queue-timeout`) or `hold_timeout_s` while none is (`--hold-timeout`, a pool at zero)
/// is refused. `None`: no bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QueueLimits {
    pub max_queue: Option<usize>,
    pub queue_timeout_s: Option<f64>,
    pub hold_timeout_s: Option<f64>,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            max_queue: Some(1024),
            queue_timeout_s: Some(30.0),
            hold_timeout_s: Some(60.0),
        }
    }
}

impl QueueLimits {
    /// No bound: every request waits until some replica takes it.
    pub const NONE: QueueLimits = QueueLimits {
        max_queue: None,
        queue_timeout_s: None,
        hold_timeout_s: None,
    };
}

#[derive(Debug, Default)]
pub struct Gateway {
    queue: VecDeque<u32>,
    /// The queued requests' prompt tokens, kept as they come and go: a queue that grows to
    /// a hundred thousand in the oracle's short replays is not summed at every tick.
    prompt_tokens: u64,
    /// `sluice serve --queue-late-after`: requests waiting longer yield to those that do not.
    late_after_s: Option<f64>,
    limits: QueueLimits,
}

impl Gateway {
    pub fn new(late_after_s: Option<f64>, limits: QueueLimits) -> Gateway {
        Gateway {
            late_after_s,
            limits,
            ..Gateway::default()
        }
    }

    /// Queues request `idx`; `false` (refused) when the queue is full.
    #[must_use]
    pub fn push(&mut self, idx: u32, r: &Request) -> bool {
        if self.limits.max_queue.is_some_and(|m| self.queue.len() >= m) {
            return false;
        }
        self.queue.push_back(idx);
        self.prompt_tokens += u64::from(r.prompt_tokens);
        true
    }

    /// Removes and returns the requests that have waited past their bound at `now`: the
    /// queue timeout while some replica is `ready`, the hold timeout while none is. Only the
    /// queue's front is looked at, which is its oldest but for requests a Spot reclaim put
    /// back (they arrived before the ones then queued unless late ones had yielded to them):
    /// such a one delays the refusal of older ones behind it until it leaves the front.
    pub fn expire(&mut self, now: f64, ready: bool, requests: &[Request]) -> Vec<u32> {
        let bound = if ready {
            self.limits.queue_timeout_s
        } else {
            self.limits.hold_timeout_s
        };
        let Some(bound) = bound else {
            return Vec::new();
        };
        let mut out = Vec::new();
        while let Some(&i) = self.queue.front() {
            let r = &requests[i as usize];
            if now - r.arrival_s < bound {
                break;
            }
            self.queue.pop_front();
            self.prompt_tokens -= u64::from(r.prompt_tokens);
            out.push(i);
        }
        out
    }

    /// Requests a Spot reclaim took back before their first token go first.
    pub fn requeue_front(&mut self, ids: &[u32], requests: &[Request]) {
        for &i in ids.iter().rev() {
            self.queue.push_front(i);
            self.prompt_tokens += u64::from(requests[i as usize].prompt_tokens);
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Prompt tokens of the requests queued.
    pub fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
    }

    /// Admits what it can at `now`; returns the replicas that took work. With a late-after
    /// time, the requests still on time (the newest, a suffix of the queue) go first, then the
    /// queue from its head. `weights[key]` is the planned batch of each pool key's variant,
    /// `bounds[key]` the longest prompt its replicas take (a prompt goes only to those).
    pub fn dispatch(
        &mut self,
        now: f64,
        requests: &[Request],
        fleet: &mut Fleet,
        active: &[usize],
        weights: &[f64],
        bounds: &[u32],
    ) -> Vec<usize> {
        let mut round = Round {
            now,
            requests,
            fleet,
            active,
            weights,
            bounds,
            touched: Vec::new(),
        };
        if let Some(late) = self.late_after_s {
            let on_time = self
                .queue
                .iter()
                .rev()
                .take_while(|&&i| now - requests[i as usize].arrival_s <= late)
                .count();
            self.admit_from(self.queue.len() - on_time, &mut round);
        }
        self.admit_from(0, &mut round);
        round.touched
    }

    /// Admits queued requests from place `start` on, each to the least-loaded ready replica
    /// that can take it, until one that fits a ready replica finds none with room now
    /// (head-of-line: everyone after it waits too) or `SCAN` places have been looked at.
    fn admit_from(&mut self, start: usize, round: &mut Round<'_>) {
        let mut i = start;
        while i < self.queue.len().min(start + SCAN) {
            let idx = self.queue[i];
            let r = &round.requests[idx as usize];
            match round.best_replica(r) {
                Choice::Admit(id) => {
                    round.fleet.replicas[id].admit(round.now, idx, r);
                    self.queue.remove(i);
                    self.prompt_tokens -= u64::from(r.prompt_tokens);
                    if !round.touched.contains(&id) {
                        round.touched.push(id);
                    }
                }
                // Head-of-line: it fits a ready replica, just not now; everyone waits.
                Choice::Wait => break,
                Choice::Never => i += 1,
            }
        }
    }
}

/// One dispatch round: the fleet it routes to and the replicas that took work so far.
struct Round<'a> {
    now: f64,
    requests: &'a [Request],
    fleet: &'a mut Fleet,
    active: &'a [usize],
    weights: &'a [f64],
    bounds: &'a [u32],
    touched: Vec<usize>,
}

/// Where a queued request goes this round.
enum Choice {
    Admit(usize),
    /// Some ready replica could hold it, none has room now.
    Wait,
    /// No ready replica could ever hold it.
    Never,
}

impl Round<'_> {
    /// The least-loaded ready replica (sequences over the variant's planned batch) that takes
    /// `r`'s prompt and can admit it now, ties to the earliest estimated first token.
    fn best_replica(&self, r: &Request) -> Choice {
        let mut best: Option<((f64, f64), usize)> = None;
        let mut could_fit = false;
        for &id in self.active {
            let rep = &self.fleet.replicas[id];
            if !rep.is_ready() {
                continue;
            }
            let takes = r.prompt_tokens <= self.bounds[rep.key];
            could_fit |= takes && rep.fits(r);
            if takes && rep.can_admit(r) {
                let load = (rep.seqs() + 1) as f64 / self.weights[rep.key].max(1e-9);
                let est = (load, rep.estimated_ttft_s(r));
                if best.is_none_or(|(b, _)| est < b) {
                    best = Some((est, id));
                }
            }
        }
        match best {
            Some((_, id)) => Choice::Admit(id),
            None if could_fit => Choice::Wait,
            None => Choice::Never,
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_policy::profile::Profile;

    use super::*;
    use crate::sim::fleet::Applied;

    /// The queue's prompt tokens, which the signals report at every tick, follow what is
    /// queued: arrivals and Spot requeues add, admissions take away.
    #[test]
    fn the_queued_prompt_tokens_follow_arrivals_requeues_and_admissions() {
        let profile = Profile::load("llama-3-8b").unwrap();
        let (limits, pools) = crate::sim::pools(&profile);
        let h100 = limits
            .iter()
            .position(|l| l.variant == "nvidia-h100-80gb")
            .unwrap()
            * 2;
        let mut fleet = Fleet::new(pools);
        let requests: Vec<Request> = [1000, 2000, 300, 40]
            .iter()
            .map(|&p| Request {
                arrival_s: 0.0,
                prompt_tokens: p,
                output_tokens: 10,
            })
            .collect();
        let mut gw = Gateway::new(None, QueueLimits::NONE);
        for i in 0..3 {
            assert!(gw.push(i, &requests[i as usize]));
        }
        gw.requeue_front(&[3], &requests);
        assert_eq!((gw.len(), gw.prompt_tokens()), (4, 3340));
        // Nothing ready: nothing admitted, nothing taken away.
        assert!(gw
            .dispatch(0.0, &requests, &mut fleet, &[], &[1.0; 4], &[u32::MAX; 4])
            .is_empty());
        assert_eq!(gw.prompt_tokens(), 3340);
        let id = fleet.add_replica(h100, 0.0, true, &mut Applied::default());
        let weights = [100.0; 4];
        let bounds = [u32::MAX; 4];
        let touched = gw.dispatch(0.0, &requests, &mut fleet, &[id], &weights, &bounds);
        assert_eq!(touched, vec![id]);
        assert_eq!((gw.len(), gw.prompt_tokens()), (0, 0));
    }

    /// As `sluice serve` bounds its queue: a newcomer finding it full is refused; one that
    /// has waited the queue timeout while a replica is ready, or the hold timeout while none
    /// is, leaves it (oldest first) and is returned to be counted as refused.
    #[test]
    fn the_queue_refuses_past_its_size_and_lets_go_past_its_timeouts() {
        let at = |t: f64| Request {
            arrival_s: t,
            prompt_tokens: 100,
            output_tokens: 10,
        };
        let requests = [at(0.0), at(40.0), at(50.0), at(51.0)];
        let limits = QueueLimits {
            max_queue: Some(3),
            queue_timeout_s: Some(30.0),
            hold_timeout_s: Some(60.0),
        };
        let mut gw = Gateway::new(None, limits);
        assert!(gw.push(0, &requests[0]) && gw.push(1, &requests[1]) && gw.push(2, &requests[2]));
        assert!(!gw.push(3, &requests[3]), "a fourth exceeds --max-queue 3");
        assert_eq!((gw.len(), gw.prompt_tokens()), (3, 300));
        // No replica ready: held up to the hold timeout, whatever the queue timeout.
        assert!(gw.expire(45.0, false, &requests).is_empty());
        assert_eq!(gw.expire(65.0, false, &requests), vec![0]);
        // A replica ready: the queue timeout counts from arrival.
        assert_eq!(gw.expire(75.0, true, &requests), vec![1]);
        assert_eq!((gw.len(), gw.prompt_tokens()), (1, 100));
        assert!(gw.push(3, &requests[3]), "room again");
        assert_eq!(gw.expire(81.0, true, &requests), vec![2, 3]);
        assert!(gw.is_empty());
        // Unbounded: nothing leaves.
        let mut open = Gateway::new(None, QueueLimits::NONE);
        assert!(open.push(0, &requests[0]));
        assert!(open.expire(1e9, true, &requests).is_empty());
    }
}

//! What the simulated metrics pipeline reports each tick: windows of arrivals and latencies,
//! and the fleet's state, as [`Signals`] — the same struct the controller will fill from
//! Prometheus.

use std::collections::VecDeque;

use sluice_metrics::{gateway, vllm};
use sluice_policy::capacity::Moments;
use sluice_policy::signals::{
    Arrivals, Latency, PoolSignals, Queue, SecondSums, Signals, VariantSignals, WindowShape,
};
use sluice_policy::timeline::Request;

use crate::sim::fleet::Fleet;
use crate::sim::gateway::Gateway;
use crate::sim::replica::Phase;

/// CPU utilisation of a GPU replica's container: the engine's scheduler loop keeps about one
/// of the four requested cores busy whether it batches one sequence or two hundred, and
/// tokenisation adds little next to the GPU's work. Nearly flat from idle to saturated.
pub fn cpu_utilisation(seqs: usize, max_seqs: usize) -> f64 {
    0.25 + 0.05 * seqs as f64 / max_seqs.max(1) as f64
}

/// The arrivals of one window ending now, as a controller reads them: the gateway counts
/// every request, the replicas' token counters and histograms only those they took. Each
/// arrival is (time, its prompt and output tokens if a replica took it), with the taken
/// ones' running moments.
#[derive(Debug)]
struct ArrivalWindow {
    window_s: f64,
    arrivals: VecDeque<(f64, Option<(u32, u32)>)>,
    taken: usize,
    prompt: Moments,
    output: Moments,
}

impl ArrivalWindow {
    fn new(window_s: f64) -> Self {
        ArrivalWindow {
            window_s,
            arrivals: VecDeque::new(),
            taken: 0,
            prompt: Moments::default(),
            output: Moments::default(),
        }
    }

    fn push(&mut self, t: f64, r: &Request, taken: bool) {
        let tokens = taken.then_some((r.prompt_tokens, r.output_tokens));
        self.arrivals.push_back((t, tokens));
        if let Some((p, o)) = tokens {
            self.taken += 1;
            self.prompt.add(p);
            self.output.add(o);
        }
    }

    fn expire(&mut self, now: f64) {
        while let Some(&(t, tokens)) = self.arrivals.front() {
            if t >= now - self.window_s {
                break;
            }
            self.arrivals.pop_front();
            if let Some((p, o)) = tokens {
                self.taken -= 1;
                self.prompt.remove(p);
                self.output.remove(o);
            }
        }
    }

    /// Every arrival, and the tokens and spread of those taken.
    fn shape(&self) -> WindowShape {
        let taken = self.taken as f64;
        WindowShape {
            window_s: self.window_s,
            requests: self.arrivals.len() as f64,
            prompt_tokens: self.prompt.sum.max(0.0),
            output_tokens: self.output.sum.max(0.0),
            prompt_tokens_cv2: self.prompt.cv2(taken),
            output_tokens_cv2: self.output.cv2(taken),
        }
    }
}

/// Prompt tokens arriving in each whole second of a window with any arrival, as the gateway
/// observes them into its `sluice_gateway_prompt_tokens_per_second` histogram.
#[derive(Debug)]
struct PerSecond {
    window_s: f64,
    /// (second, prompt tokens), seconds with an arrival only, oldest first.
    seconds: VecDeque<(i64, f64)>,
    /// (second, prompt tokens) of each prompt refused as too long that some variant serves,
    /// oldest first: the controller adds them to the sums without their seconds
    /// ([`SecondSums::add_unsummed`]).
    refused: VecDeque<(i64, f64)>,
}

impl PerSecond {
    fn push(&mut self, t: f64, prompt: u32) {
        let second = t.floor() as i64;
        match self.seconds.back_mut() {
            Some((s, sum)) if *s == second => *sum += f64::from(prompt),
            _ => self.seconds.push_back((second, f64::from(prompt))),
        }
    }

    fn push_refused(&mut self, t: f64, prompt: u32) {
        self.refused
            .push_back((t.floor() as i64, f64::from(prompt)));
    }

    /// The histogram over the whole seconds of the window ending at `now`.
    fn sums(&mut self, now: f64) -> SecondSums {
        let last = now.floor() as i64 - 1;
        let first = last - self.window_s as i64 + 1;
        for q in [&mut self.seconds, &mut self.refused] {
            while q.front().is_some_and(|&(s, _)| s < first) {
                q.pop_front();
            }
        }
        let within = |q: &VecDeque<(i64, f64)>| -> Vec<f64> {
            let mut v: Vec<f64> = q
                .iter()
                .filter(|&&(s, _)| s <= last)
                .map(|&(_, x)| x)
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let (seen, refused) = (within(&self.seconds), within(&self.refused));
        let mut buckets: Vec<(f64, f64)> = gateway::prompt_tokens_per_second_buckets()
            .into_iter()
            .map(|le| (le, seen.partition_point(|&x| x <= le) as f64))
            .collect();
        buckets.push((f64::INFINITY, seen.len() as f64));
        let mut sums = SecondSums {
            buckets,
            sum: seen.iter().sum(),
        };
        // As the controller folds in the gateway's refused-prompt histogram.
        let n = refused.len() as f64;
        sums.add_unsummed(n, refused.iter().sum(), |x| {
            refused.partition_point(|&p| p <= x) as f64 / n
        });
        sums
    }
}

#[derive(Debug)]
pub struct Observer {
    pub short_window_s: f64,
    pub latency_window_s: f64,
    /// The long window (its length is the signals' `window_s`).
    long: ArrivalWindow,
    /// The request shape's wider window (see [`Arrivals::wide`]).
    wide: ArrivalWindow,
    /// Prompt tokens per second over the wider window.
    per_second: PerSecond,
    ttft: VecDeque<(f64, f64, usize)>,
    /// First tokens of feasible requests in the latency window: (time, within the target).
    feasible: VecDeque<(f64, bool)>,
    ttft_target_s: f64,
    tpot: VecDeque<(f64, f64, usize)>,
}

/// The nearest-rank `q` quantile of `xs` (reordered in place: a selection, not a sort, since
/// every tick takes several over the latency window).
fn percentile(xs: &mut [f64], q: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let i = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1;
    Some(*xs.select_nth_unstable_by(i, f64::total_cmp).1)
}

impl Observer {
    pub fn new(
        window_s: f64,
        short_window_s: f64,
        latency_window_s: f64,
        shape_window_s: f64,
        ttft_target_s: f64,
    ) -> Observer {
        Observer {
            short_window_s,
            latency_window_s,
            long: ArrivalWindow::new(window_s),
            wide: ArrivalWindow::new(shape_window_s),
            per_second: PerSecond {
                window_s: shape_window_s,
                seconds: VecDeque::new(),
                refused: VecDeque::new(),
            },
            ttft: VecDeque::new(),
            feasible: VecDeque::new(),
            ttft_target_s,
            tpot: VecDeque::new(),
        }
    }

    /// Request `r` arrived at `t`; `taken`: a ready replica takes it (none refuses it for its
    /// length); `shaped`: its tokens count in the request shape — taken, or refused yet no
    /// longer than some variant serves in time, which the controller reads from the
    /// gateway's refused-prompt histogram. The gateway counts every arrival, but sums into
    /// the second's prompt tokens only prompts some ready replica's `--max-prompt-tokens`
    /// takes, which it reads from their model cards (its bytes / 4 estimate of a prompt's
    /// tokens is taken as exact here); a refused one that is shaped, the controller adds to
    /// the sums without its second (`scrape::front_door` in the autoscaler).
    pub fn on_arrival(&mut self, t: f64, r: &Request, taken: bool, shaped: bool) {
        self.long.push(t, r, shaped);
        self.wide.push(t, r, shaped);
        if taken {
            self.per_second.push(t, r.prompt_tokens);
        } else if shaped {
            self.per_second.push_refused(t, r.prompt_tokens);
        }
    }

    /// A first token at `t` on a replica of pool `key`.
    pub fn on_first_token(&mut self, t: f64, ttft: f64, key: usize, feasible: bool) {
        self.ttft.push_back((t, ttft, key));
        if feasible {
            self.feasible.push_back((t, ttft <= self.ttft_target_s));
        }
    }

    /// A request the gateway refused at `t` (its queue full, or a wait past its bounds): as
    /// the controller reads a gateway's unserved requests, a first token later than any
    /// (the TTFT histogram's highest bound) on no replica, and a feasible request missed.
    pub fn on_unserved(&mut self, t: f64) {
        let latest = vllm::TTFT_BUCKETS.last().copied().unwrap_or(f64::MAX);
        self.ttft.push_back((t, latest, usize::MAX));
        self.feasible.push_back((t, false));
    }

    pub fn on_finish(&mut self, t: f64, tpot: f64, key: usize) {
        self.tpot.push_back((t, tpot, key));
    }

    fn expire(&mut self, now: f64) {
        self.long.expire(now);
        self.wide.expire(now);
        let cut = now - self.latency_window_s;
        while self.ttft.front().is_some_and(|&(t, _, _)| t < cut) {
            self.ttft.pop_front();
        }
        while self.feasible.front().is_some_and(|&(t, _)| t < cut) {
            self.feasible.pop_front();
        }
        while self.tpot.front().is_some_and(|&(t, _, _)| t < cut) {
            self.tpot.pop_front();
        }
    }

    /// The signals at `now`, the queue the gateway's; `preempted` counts Spot notices
    /// per pool key since the last tick.
    pub fn signals(
        &mut self,
        now: f64,
        model: &str,
        fleet: &Fleet,
        gateway: &Gateway,
        preempted: &[u32],
    ) -> Signals {
        self.expire(now);
        let mut running = 0u64;
        let mut variants = Vec::new();
        let mut pools = Vec::new();
        // One entry per pool key, as `preempted` has.
        for (key, &preempted) in preempted.iter().enumerate() {
            let (vs, seqs) = self.variant(fleet, key, preempted, now);
            running += seqs;
            variants.push(vs);
            pools.push(pool_signals(fleet, key, now));
        }
        Signals {
            time_s: now,
            model: model.to_string(),
            arrivals: self.arrivals(now),
            queue: Queue {
                waiting: gateway.len() as u64,
                waiting_prompt_tokens: gateway.prompt_tokens(),
                running,
            },
            latency: self.latency(),
            variants,
            pools,
        }
    }

    /// Arrival rates and shape over the windows ending at `now`.
    fn arrivals(&mut self, now: f64) -> Arrivals {
        let span = self.long.window_s.min(now.max(self.short_window_s));
        let long = self.long.shape();
        let short = self
            .long
            .arrivals
            .iter()
            .rev()
            .take_while(|&&(t, _)| t >= now - self.short_window_s)
            .count() as f64;
        let short_rate = short / self.short_window_s.min(now.max(1.0));
        Arrivals {
            max_prompt_tokens: self
                .long
                .arrivals
                .iter()
                .filter_map(|&(_, tokens)| tokens.map(|(p, _)| u64::from(p)))
                .max()
                .unwrap_or(0),
            wide: Some(self.wide.shape()),
            per_second: Some(self.per_second.sums(now)),
            ..Arrivals::from_shape(&long, span, (self.short_window_s, short_rate))
        }
    }

    /// Fleet-wide latency percentiles over the latency window.
    fn latency(&self) -> Latency {
        let mut ttft: Vec<f64> = self.ttft.iter().map(|&(_, x, _)| x).collect();
        let mut tpot: Vec<f64> = self.tpot.iter().map(|&(_, x, _)| x).collect();
        Latency {
            window_s: self.latency_window_s,
            ttft_p50_s: percentile(&mut ttft, 0.5),
            ttft_p99_s: percentile(&mut ttft, 0.99),
            tpot_p50_s: percentile(&mut tpot, 0.5),
            tpot_p99_s: percentile(&mut tpot, 0.99),
            ttft_attainment: (!self.feasible.is_empty()).then(|| {
                let met = self.feasible.iter().filter(|&&(_, ok)| ok).count();
                met as f64 / self.feasible.len() as f64
            }),
        }
    }

    /// Pool `key`'s replicas by phase, their load and latency; and the sequences it runs.
    fn variant(
        &self,
        fleet: &Fleet,
        key: usize,
        preempted: u32,
        now: f64,
    ) -> (VariantSignals, u64) {
        let pool = &fleet.pools[key];
        let p99 = |xs: &VecDeque<(f64, f64, usize)>| {
            percentile(
                &mut xs
                    .iter()
                    .filter(|e| e.2 == key)
                    .map(|e| e.1)
                    .collect::<Vec<_>>(),
                0.99,
            )
        };
        let mut vs = VariantSignals {
            variant: pool.variant.name.clone(),
            capacity: pool.capacity,
            preempted,
            ttft_p99_s: p99(&self.ttft),
            tpot_p99_s: p99(&self.tpot),
            ..VariantSignals::default()
        };
        let (mut seqs, mut prefilling, mut kv, mut cpu) = (0usize, 0usize, 0.0, 0.0);
        for r in fleet.replicas.iter().filter(|r| r.key == key) {
            match r.phase {
                Phase::Ready => {
                    vs.ready += 1;
                    seqs += r.seqs();
                    prefilling += r.prefilling();
                    kv += r.kv_usage();
                    cpu += cpu_utilisation(r.seqs(), r.max_seqs());
                }
                Phase::Starting { .. } => {
                    if fleet.nodes[r.node].ready_s > now {
                        vs.pending += 1;
                        let age = now - fleet.nodes[r.node].created_s;
                        vs.oldest_pending_s = vs.oldest_pending_s.max(age);
                    } else {
                        vs.starting += 1;
                    }
                }
                Phase::Draining => {
                    vs.draining += 1;
                    seqs += r.seqs();
                }
                Phase::Gone => {}
            }
        }
        if vs.ready > 0 {
            let n = f64::from(vs.ready);
            vs.running_per_replica = (seqs - prefilling.min(seqs)) as f64 / n;
            vs.waiting_per_replica = prefilling as f64 / n;
            vs.kv_cache_usage = kv / n;
            vs.cpu_utilisation = cpu / n;
        }
        (vs, seqs as u64)
    }
}

/// Pool `key`'s live nodes: up, and still provisioning.
fn pool_signals(fleet: &Fleet, key: usize, now: f64) -> PoolSignals {
    let pool = &fleet.pools[key];
    let live_nodes = fleet
        .nodes
        .iter()
        .filter(|n| n.key == key && n.released_s.is_none());
    let (mut nodes, mut provisioning) = (0, 0);
    for n in live_nodes {
        if n.ready_s > now {
            provisioning += 1;
        } else {
            nodes += 1;
        }
    }
    PoolSignals {
        pool: format!("{}-{}", pool.variant.name, pool.capacity.as_str()),
        variant: pool.variant.name.clone(),
        capacity: pool.capacity,
        nodes,
        provisioning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_tokens_are_summed_per_whole_second_within_the_window() {
        let mut p = PerSecond {
            window_s: 10.0,
            seconds: VecDeque::new(),
            refused: VecDeque::new(),
        };
        // A batch of three in second 2, one request in 3, one in 14 (not over at 14.5).
        for (t, tokens) in [
            (2.1, 1000),
            (2.5, 2000),
            (2.9, 3000),
            (3.2, 300),
            (14.2, 50),
        ] {
            p.push(t, tokens);
        }
        let at_12 = p.sums(12.5);
        assert_eq!(at_12.sum, 6300.0);
        assert_eq!(at_12.seconds(), 2.0);
        let seconds_to = |le: f64| at_12.buckets.iter().find(|b| b.0 == le).map(|b| b.1);
        assert_eq!(seconds_to(5793.0), Some(1.0), "the 300-token second");
        assert_eq!(seconds_to(8192.0), Some(2.0), "the batch's second");
        // At 14.5 the window holds seconds 4..=13: neither the old seconds nor the open one.
        let at_14 = p.sums(14.5);
        assert_eq!((at_14.sum, at_14.seconds()), (0.0, 0.0));
        assert_eq!(p.sums(15.0).sum, 50.0);
    }

    /// As the controller reads a gateway's unserved requests: each is a feasible request
    /// missed and a first token later than any, in the fleet's figures only.
    #[test]
    fn refused_requests_are_late_first_tokens_of_the_fleet() {
        let mut o = Observer::new(60.0, 10.0, 60.0, 420.0, 2.0);
        for i in 0..3 {
            o.on_first_token(f64::from(i), 0.5, 0, true);
        }
        o.on_unserved(3.0);
        let l = o.latency();
        assert_eq!(l.ttft_attainment, Some(0.75));
        assert_eq!(l.ttft_p99_s, vllm::TTFT_BUCKETS.last().copied());
        assert_eq!(l.ttft_p50_s, Some(0.5));
        let pool_0: Vec<f64> = o.ttft.iter().filter(|e| e.2 == 0).map(|e| e.1).collect();
        assert_eq!(pool_0, [0.5; 3], "no replica's own figures");
    }
}

//! What the policy sees each tick: the [`Signals`] for one model.
//!
//! The simulator builds them from its fleet model; the Kubernetes controller will build them
//! from the gateway's and replicas' `/metrics` (vLLM names) and the API server's view of
//! Deployments and node pools. They are plain serde data so both can log, replay and test
//! them, and so a decision can be reproduced from the signals that caused it.

use serde::{Deserialize, Serialize};

use crate::profile::CapacityType;

/// Everything the policy knows about one model at one tick.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Signals {
    /// Seconds on a monotonic clock (the simulator's time; the controller's time since start).
    pub time_s: f64,
    pub model: String,
    pub arrivals: Arrivals,
    pub queue: Queue,
    pub latency: Latency,
    /// One entry per (variant, capacity type) the model can run on.
    pub variants: Vec<VariantSignals>,
    /// One entry per node pool.
    pub pools: Vec<PoolSignals>,
}

/// Arrivals at the gateway, as rates over two windows: the long one to plan from, the short one
/// to notice a spike.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Arrivals {
    pub window_s: f64,
    pub requests_per_s: f64,
    pub prompt_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
    pub short_window_s: f64,
    pub short_requests_per_s: f64,
    /// Largest prompt seen in the long window.
    pub max_prompt_tokens: u64,
    /// Squared coefficient of variation of prompt lengths in the long window (from
    /// `vllm:request_prompt_tokens`' histogram in a controller); 0 if unknown.
    #[serde(default)]
    pub prompt_tokens_cv2: f64,
    /// The same for output lengths (`vllm:request_generation_tokens`); 0 if unknown.
    #[serde(default)]
    pub output_tokens_cv2: f64,
    /// The request shape over a wider window, which [`Signals::workload`] reads when the long
    /// window holds fewer than [`SHAPE_MIN_REQUESTS`]; `None` when the source has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wide: Option<WindowShape>,
    /// Prompt tokens arriving in each second of the wider window, as a histogram of the
    /// per-second sums (the gateway's `sluice_gateway_prompt_tokens_per_second`): how bursty
    /// arrivals are below any window's rate. `None` when the source has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_second: Option<SecondSums>,
}

impl Arrivals {
    /// Rates from the long window's `long` shape measured over `span_s` (the window, or less
    /// while the source has been up for less), with the short window's `(length, rate)`. The
    /// largest prompt, the wider shape and the per-second sums are each source's to add.
    pub fn from_shape(long: &WindowShape, span_s: f64, short: (f64, f64)) -> Arrivals {
        let span = span_s.max(1e-9);
        Arrivals {
            window_s: long.window_s,
            requests_per_s: long.requests / span,
            prompt_tokens_per_s: long.prompt_tokens / span,
            output_tokens_per_s: long.output_tokens / span,
            short_window_s: short.0,
            short_requests_per_s: short.1,
            prompt_tokens_cv2: long.prompt_tokens_cv2,
            output_tokens_cv2: long.output_tokens_cv2,
            ..Arrivals::default()
        }
    }
}

/// A histogram of the prompt tokens that arrived in each whole second of a window, one
/// observation per second in which any request arrived (an empty second adds nothing to
/// what [`SecondSums::excess_share`] measures).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SecondSums {
    /// Cumulative `(upper bound, seconds)` pairs, ascending, the last bound `+Inf`
    /// (Prometheus's `le` buckets).
    pub buckets: Vec<(f64, f64)>,
    /// Prompt tokens over all the seconds.
    pub sum: f64,
}

impl SecondSums {
    /// The seconds observed.
    pub fn seconds(&self) -> f64 {
        self.buckets.last().map_or(0.0, |b| b.1)
    }

    /// The share of prompt tokens that arrived beyond `c` in their second: `Σ (S − c)⁺ / Σ S`
    /// over the seconds, with sums spread evenly within a bucket, and the `+Inf` bucket's
    /// tokens what the sum leaves over the finite ones. `None` when no token arrived. Counts
    /// are read as non-decreasing, as Prometheus's `histogram_quantile` reads them: increases
    /// it extrapolates per bucket can dip by a fraction.
    pub fn excess_share(&self, c: f64) -> Option<f64> {
        if self.sum <= 0.0 {
            return None;
        }
        let (mut excess, mut finite_tokens) = (0.0, 0.0);
        let (mut lo, mut below) = (0.0, 0.0);
        for &(hi, cum) in &self.buckets {
            let cum = cum.max(below);
            let k = cum - below;
            if hi.is_infinite() {
                if k > 0.0 {
                    let tokens = (self.sum - finite_tokens).max(k * lo);
                    excess += (tokens - k * c).max(0.0);
                }
                break;
            }
            finite_tokens += k * (lo + hi) / 2.0;
            excess += k * uniform_excess(lo, hi, c);
            (lo, below) = (hi, cum);
        }
        Some((excess / self.sum).min(1.0))
    }

    /// Adds `count` prompts that arrived over the window but were not summed (refused as too
    /// long while no ready replica took them), `tokens` in all, a share `share_at_most(x)` of
    /// them no longer than `x` tokens. Which second each came in is not known: each joins a
    /// second holding the mean sum while the bucket holding that mean has seconds left (a
    /// second of `mean + p` where one of about `mean` was), and is a second of its own after
    /// that. Counts stay non-decreasing: no more seconds leave the mean's bucket than it holds.
    pub fn add_unsummed(&mut self, count: f64, tokens: f64, share_at_most: impl Fn(f64) -> f64) {
        if count <= 0.0 {
            return;
        }
        let seconds = self.seconds();
        let mean = if seconds > 0.0 {
            self.sum / seconds
        } else {
            0.0
        };
        let at = self.buckets.iter().position(|&(le, _)| le >= mean);
        let room = at.map_or(0.0, |i| {
            let below = if i == 0 { 0.0 } else { self.buckets[i - 1].1 };
            (self.buckets[i].1 - below).max(0.0)
        });
        let joined = if seconds > 0.0 { count.min(room) } else { 0.0 };
        let alone = count - joined;
        for (i, (le, cum)) in self.buckets.iter_mut().enumerate() {
            if at.is_some_and(|a| i >= a) {
                *cum -= joined;
            }
            let (up, own) = if le.is_infinite() {
                (1.0, 1.0)
            } else {
                (share_at_most(*le - mean), share_at_most(*le))
            };
            *cum += joined * up + alone * own;
        }
        self.sum += tokens;
    }
}

/// `E[(U − c)⁺]` for `U` uniform on `[lo, hi]`.
fn uniform_excess(lo: f64, hi: f64, c: f64) -> f64 {
    if c <= lo {
        (lo + hi) / 2.0 - c
    } else if c >= hi {
        0.0
    } else {
        (hi - c).powi(2) / (2.0 * (hi - lo))
    }
}

/// The requests that arrived in a window and their tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WindowShape {
    pub window_s: f64,
    pub requests: f64,
    pub prompt_tokens: f64,
    pub output_tokens: f64,
    /// Squared coefficient of variation of the window's prompt lengths; 0 if unknown.
    pub prompt_tokens_cv2: f64,
    /// The same for output lengths; 0 if unknown.
    #[serde(default)]
    pub output_tokens_cv2: f64,
}

impl WindowShape {
    /// The window's mean request shape (a window holding no request has none: zeros).
    pub fn workload(&self) -> crate::capacity::Workload {
        let n = self.requests.max(f64::MIN_POSITIVE);
        crate::capacity::Workload {
            mean_prompt_tokens: self.prompt_tokens.max(0.0) / n,
            mean_output_tokens: self.output_tokens.max(0.0) / n,
            prompt_cv2: self.prompt_tokens_cv2,
            output_cv2: self.output_tokens_cv2,
        }
    }
}

/// Requests the long window must hold for its request shape to be used alone: a mean over `n`
/// requests has a relative standard error of `√(cv²/n)`, under 5 % at 500 heavy-tailed
/// prompts (cv² ≈ 1), where a minute at one request a second leaves 13 %. Capacity per
/// replica follows the mean prompt, so a noisy mean orders and releases replicas on noise.
pub const SHAPE_MIN_REQUESTS: f64 = 500.0;

/// The wider window's default length: about the start-up lead of a GPU replica on a new node,
/// so the shape planned for is no older than the wait for the capacity it orders.
pub const SHAPE_WINDOW_S: f64 = 420.0;

/// Work waiting: at the gateway and in the replicas' own queues.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Queue {
    /// Requests admitted nowhere yet (gateway queue plus replicas' waiting queues,
    /// `vllm:num_requests_waiting`).
    pub waiting: u64,
    /// Their prompt tokens still to prefill.
    pub waiting_prompt_tokens: u64,
    /// Sequences decoding or prefilling on replicas (`vllm:num_requests_running`).
    pub running: u64,
}

/// Latency percentiles over a recent window (`vllm:time_to_first_token_seconds`,
/// `vllm:inter_token_latency_seconds`); `None` when no request finished in the window.
///
/// The `*_p99_s` fields hold the quantile the SLO names, p99 unless a controller's
/// `ServingPool` asks for another percentile: the policy compares them with the SLO targets.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub window_s: f64,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    pub tpot_p50_s: Option<f64>,
    pub tpot_p99_s: Option<f64>,
    /// Share of the window's first tokens that came within the TTFT target, over requests
    /// whose prompt some variant prefills alone within it (the SLO's own measure: a queue
    /// in a replica's prefill shows here before any p99 the infeasible prompts dominate).
    #[serde(default)]
    pub ttft_attainment: Option<f64>,
}

/// Replicas of one variant bought one way.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VariantSignals {
    pub variant: String,
    pub capacity: CapacityType,
    /// Serving and routable.
    pub ready: u32,
    /// Scheduled and starting (image pull, model load).
    pub starting: u32,
    /// Waiting for a node (provisioning, or a stockout).
    pub pending: u32,
    /// Age of the oldest pending replica: a long wait on Spot means a stockout.
    pub oldest_pending_s: f64,
    /// Draining: taken out of routing, finishing their requests.
    pub draining: u32,
    /// Mean over ready replicas of running sequences, waiting sequences and KV-cache use (0..1).
    pub running_per_replica: f64,
    pub waiting_per_replica: f64,
    pub kv_cache_usage: f64,
    /// Mean CPU utilisation of the replicas' containers (0..1 of their request), which is what
    /// a CPU-based HPA reads.
    pub cpu_utilisation: f64,
    /// Spot preemption notices received since the previous tick.
    pub preempted: u32,
    /// This variant's own latency percentiles over the latency window (vLLM's histograms are
    /// per pod, so a controller can aggregate them per variant).
    #[serde(default)]
    pub ttft_p99_s: Option<f64>,
    #[serde(default)]
    pub tpot_p99_s: Option<f64>,
}

/// One node pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PoolSignals {
    pub pool: String,
    pub variant: String,
    pub capacity: CapacityType,
    pub nodes: u32,
    pub provisioning: u32,
}

impl Signals {
    /// The entry for a variant and capacity type, if any.
    pub fn variant(&self, name: &str, capacity: CapacityType) -> Option<&VariantSignals> {
        self.variants
            .iter()
            .find(|v| v.variant == name && v.capacity == capacity)
    }

    /// Replicas that exist or are on their way (ready + starting + pending), per entry.
    pub fn provisioned(&self, name: &str, capacity: CapacityType) -> u32 {
        self.variant(name, capacity)
            .map_or(0, |v| v.ready + v.starting + v.pending)
    }

    /// The request shape to plan for: over the long window when it holds at least
    /// [`SHAPE_MIN_REQUESTS`], otherwise over the wider window if it holds more; `None`
    /// when neither holds any.
    pub fn workload(&self) -> Option<crate::capacity::Workload> {
        let a = &self.arrivals;
        let long = a.requests_per_s * a.window_s;
        match &a.wide {
            Some(w) if long < SHAPE_MIN_REQUESTS && w.requests > long && w.requests > 0.0 => {
                Some(w.workload())
            }
            _ => self
                .request_shape()
                .map(|(p, o)| crate::capacity::Workload {
                    mean_prompt_tokens: p,
                    mean_output_tokens: o,
                    prompt_cv2: a.prompt_tokens_cv2,
                    output_cv2: a.output_tokens_cv2,
                }),
        }
    }

    /// The request shape to judge the prompt tail on: over the wider window when it holds
    /// more requests than the long one (a tail share needs more requests than a mean does),
    /// otherwise [`Signals::workload`].
    pub fn tail_workload(&self) -> Option<crate::capacity::Workload> {
        let a = &self.arrivals;
        match &a.wide {
            Some(w) if w.requests > a.requests_per_s * a.window_s => Some(w.workload()),
            _ => self.workload(),
        }
    }

    /// Mean prompt and output tokens per request over the long window, if any arrived.
    pub fn request_shape(&self) -> Option<(f64, f64)> {
        let a = &self.arrivals;
        (a.requests_per_s > 0.0).then(|| {
            (
                a.prompt_tokens_per_s / a.requests_per_s,
                a.output_tokens_per_s / a.requests_per_s,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten seconds of about 1,000 tokens: three prompts of 3,000 tokens not summed join three
    /// of them (seconds of ~4,000), the count of seconds unchanged; with no second to join
    /// (every prompt refused) each is a second of its own.
    #[test]
    fn unsummed_prompts_join_seconds_at_the_mean_then_stand_alone() {
        let mut s = SecondSums {
            buckets: vec![
                (512.0, 0.0),
                (1024.0, 10.0),
                (4096.0, 10.0),
                (f64::INFINITY, 10.0),
            ],
            sum: 10_000.0,
        };
        let at_3000 = |x: f64| if x >= 3000.0 { 1.0 } else { 0.0 };
        s.add_unsummed(3.0, 9000.0, at_3000);
        let counts: Vec<f64> = s.buckets.iter().map(|b| b.1).collect();
        assert_eq!(counts, vec![0.0, 7.0, 10.0, 10.0]);
        assert_eq!(s.sum, 19_000.0);
        // A fleet prefilling 1,024 tokens within the target leaves the three seconds' excess
        // late (a quarter of the tokens, read uniformly within their bucket).
        assert!(s.excess_share(1024.0).unwrap() > 0.2);

        let mut none = SecondSums {
            buckets: vec![(1024.0, 0.0), (4096.0, 0.0), (f64::INFINITY, 0.0)],
            sum: 0.0,
        };
        none.add_unsummed(2.0, 6000.0, at_3000);
        let counts: Vec<f64> = none.buckets.iter().map(|b| b.1).collect();
        assert_eq!(counts, vec![0.0, 2.0, 2.0]);
        // More prompts than seconds at the mean: the rest stand alone.
        let mut few = SecondSums {
            buckets: vec![(1024.0, 2.0), (8192.0, 2.0), (f64::INFINITY, 2.0)],
            sum: 2000.0,
        };
        few.add_unsummed(5.0, 15_000.0, at_3000);
        let counts: Vec<f64> = few.buckets.iter().map(|b| b.1).collect();
        assert_eq!(counts, vec![0.0, 5.0, 5.0]);
    }

    fn with_rate(rps: f64, prompt: f64) -> Signals {
        Signals {
            arrivals: Arrivals {
                window_s: 60.0,
                requests_per_s: rps,
                prompt_tokens_per_s: rps * prompt,
                output_tokens_per_s: rps * 100.0,
                prompt_tokens_cv2: 0.5,
                ..Arrivals::default()
            },
            ..Signals::default()
        }
    }

    #[test]
    fn the_shape_comes_from_the_wide_window_while_the_long_one_holds_too_few() {
        let wide = WindowShape {
            window_s: 420.0,
            requests: 840.0,
            prompt_tokens: 840.0 * 9000.0,
            output_tokens: 840.0 * 300.0,
            prompt_tokens_cv2: 2.0,
            output_tokens_cv2: 0.8,
        };
        // Two requests a second: 120 in the long window, 840 in the wide one.
        let mut s = with_rate(2.0, 12_000.0);
        assert_eq!(s.workload().unwrap().mean_prompt_tokens, 12_000.0);
        s.arrivals.wide = Some(wide.clone());
        let w = s.workload().unwrap();
        assert_eq!(
            (
                w.mean_prompt_tokens,
                w.mean_output_tokens,
                w.prompt_cv2,
                w.output_cv2
            ),
            (9000.0, 300.0, 2.0, 0.8)
        );
        // Nothing in the long window: the wide one still gives a shape.
        let mut idle = with_rate(0.0, 0.0);
        idle.arrivals.wide = Some(wide.clone());
        assert_eq!(idle.workload().unwrap().mean_prompt_tokens, 9000.0);
        // Enough in the long window: it is used, however wide the other.
        let mut busy = with_rate(20.0, 1000.0);
        busy.arrivals.wide = Some(wide);
        assert_eq!(busy.workload().unwrap().mean_prompt_tokens, 1000.0);
        assert_eq!(with_rate(0.0, 0.0).workload(), None);
    }

    #[test]
    fn the_prompt_tail_is_judged_on_whichever_window_holds_more_requests() {
        let wide = WindowShape {
            window_s: 420.0,
            requests: 8400.0,
            prompt_tokens: 8400.0 * 900.0,
            output_tokens: 8400.0 * 300.0,
            prompt_tokens_cv2: 1.5,
            output_tokens_cv2: 0.8,
        };
        // 20 requests a second: 1,200 in the long window, enough for the mean planned on, but
        // the wide one's 8,400 measure the tail.
        let mut busy = with_rate(20.0, 1000.0);
        busy.arrivals.wide = Some(wide.clone());
        assert_eq!(busy.workload().unwrap().mean_prompt_tokens, 1000.0);
        let tail = busy.tail_workload().unwrap();
        assert_eq!((tail.mean_prompt_tokens, tail.prompt_cv2), (900.0, 1.5));
        // A wide window holding fewer (just after a start): the long one.
        busy.arrivals.wide = Some(WindowShape {
            requests: 600.0,
            ..wide
        });
        assert_eq!(busy.tail_workload().unwrap().mean_prompt_tokens, 1000.0);
        assert_eq!(with_rate(0.0, 0.0).tail_workload(), None);
    }

    #[test]
    fn the_excess_share_is_what_arrived_beyond_a_bound_in_each_second() {
        // 90 seconds of 100 tokens (bucket (0, 128]) and 10 of 1,000 (bucket (512, 1024]).
        let sums = SecondSums {
            buckets: vec![
                (128.0, 90.0),
                (512.0, 90.0),
                (1024.0, 100.0),
                (f64::INFINITY, 100.0),
            ],
            sum: 90.0 * 100.0 + 10.0 * 1000.0,
        };
        // Beyond 1024 nothing; beyond 0 everything (the midpoints stand for the sum).
        assert_eq!(sums.excess_share(1024.0), Some(0.0));
        assert!(
            (sums.excess_share(0.0).unwrap() - (90.0 * 64.0 + 10.0 * 768.0) / 19_000.0).abs()
                < 1e-9
        );
        // Beyond 768, within the upper bucket spread evenly: (1024 − 768)² / (2 · 512) each.
        let beyond = 10.0 * 256.0f64.powi(2) / 1024.0;
        assert!((sums.excess_share(768.0).unwrap() - beyond / 19_000.0).abs() < 1e-12);
        // More room, less late.
        assert!(sums.excess_share(900.0) < sums.excess_share(600.0));
        assert_eq!(sums.seconds(), 100.0);
        // The +Inf bucket holds what the sum leaves over the finite ones, at least its bound.
        let inf = SecondSums {
            buckets: vec![(128.0, 90.0), (f64::INFINITY, 100.0)],
            sum: 90.0 * 64.0 + 10.0 * 5000.0,
        };
        let share = inf.excess_share(1000.0).unwrap();
        assert!((share - 10.0 * 4000.0 / inf.sum).abs() < 1e-12, "{share}");
        // A bucket that dips below the one before it (extrapolated increases) counts as flat:
        // no negative seconds, and none counted twice in the next bucket.
        let dipped = SecondSums {
            buckets: vec![
                (128.0, 90.5),
                (512.0, 90.0),
                (1024.0, 100.0),
                (f64::INFINITY, 100.0),
            ],
            ..sums.clone()
        };
        let at = dipped.excess_share(768.0).unwrap();
        assert!(
            (at - 9.5 * 256.0f64.powi(2) / 1024.0 / 19_000.0).abs() < 1e-12,
            "{at}"
        );
        assert_eq!(SecondSums::default().excess_share(1.0), None);
    }
}

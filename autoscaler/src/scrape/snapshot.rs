//! One scrape of one target reduced to the figures the policy reads: gauges (queue, running,
//! KV use), counters (finished requests, prompt and output tokens, preemptions) and
//! histograms (TTFT, time per output token, prompt length), each summed over label sets.
//!
//! Names (all `sluice-metrics`'): sluice replicas export vLLM's (`vllm:*`), so vLLM replicas
//! are read the same way; the load gauges, under older vLLM names and llama.cpp's server's
//! (`llamacpp:*`) too, are read by `ReplicaLoad`, as the gateway's router reads them. A routing
//! gateway's own series (`sluice_gateway_*`) give its admission queue and the replicas it
//! routes to.

use std::collections::{BTreeMap, BTreeSet};

use sluice_metrics::exposition::{parse_value, Sample};
use sluice_metrics::{gateway, vllm, ReplicaLoad};
use sluice_policy::capacity::Slo;
use sluice_policy::profile::Profile;
use sluice_policy::signals::SecondSums;

use super::front_door::{FrontDoor, FrontDoors};

/// A cumulative histogram: `(upper bound, count ≤ bound)` in increasing bound order, `+Inf`
/// last, as Prometheus exposes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
}

impl Histogram {
    /// Observations counted (the `+Inf` bucket).
    pub fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |b| b.1)
    }

    /// The `q` quantile by Prometheus's `histogram_quantile` rule: linear within the bucket
    /// holding the rank, the first bucket starting at zero, and the highest finite bound when
    /// the rank falls in `+Inf`. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 || self.buckets.is_empty() {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let mut prev = (0.0, 0.0);
        for &(le, cum) in &self.buckets {
            if cum >= rank && cum > prev.1 {
                if le.is_infinite() {
                    return Some(prev.0);
                }
                let lower = prev.0;
                let frac = (rank - prev.1) / (cum - prev.1);
                return Some(lower + (le - lower) * frac);
            }
            if le.is_finite() {
                prev = (le, cum);
            }
        }
        Some(prev.0)
    }

    /// Share of the observations at most `x`, interpolated linearly within its bucket as
    /// [`Histogram::quantile`] does (the inverse of it); `None` when empty.
    pub fn share_at_most(&self, x: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let mut prev = (0.0, 0.0);
        for &(le, cum) in &self.buckets {
            if x < le {
                if le.is_infinite() {
                    return Some(prev.1 / total);
                }
                let frac = ((x - prev.0) / (le - prev.0)).clamp(0.0, 1.0);
                return Some((prev.1 + (cum - prev.1) * frac) / total);
            }
            prev = (le, cum);
        }
        Some(1.0)
    }

    /// Mean and squared coefficient of variation of the observations, from the buckets'
    /// midpoints (for the prompt-length spread); `None` when empty.
    pub fn mean_cv2(&self) -> Option<(f64, f64)> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let (mut sum, mut sum_sq, mut prev) = (0.0, 0.0, (0.0, 0.0));
        for &(le, cum) in &self.buckets {
            let n = cum - prev.1;
            let mid = if le.is_finite() {
                (prev.0 + le) / 2.0
            } else {
                prev.0
            };
            sum += n * mid;
            sum_sq += n * mid * mid;
            prev = (if le.is_finite() { le } else { prev.0 }, cum);
        }
        let mean = sum / total;
        let cv2 = if mean > 0.0 {
            (sum_sq / total / (mean * mean) - 1.0).max(0.0)
        } else {
            0.0
        };
        Some((mean, cv2))
    }

    /// The upper bound of the highest bucket holding an observation (the highest finite
    /// bound when that is `+Inf`): the largest value seen, rounded up to a bound.
    pub fn max_bound(&self) -> Option<f64> {
        let mut prev = (0.0, 0.0);
        let mut max = None;
        for &(le, cum) in &self.buckets {
            if cum > prev.1 {
                max = Some(if le.is_finite() { le } else { prev.0 });
            }
            prev = (if le.is_finite() { le } else { prev.0 }, cum);
        }
        max
    }

    /// Adds another histogram bucket by bucket (bounds matched exactly; replicas of one
    /// model export the same buckets).
    pub fn add(&mut self, other: &Histogram) {
        let mut m: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for &(le, c) in self.buckets.iter().chain(&other.buckets) {
            m.entry(order_key(le)).or_insert((le, 0.0)).1 += c;
        }
        self.buckets = m.into_values().collect();
    }

    /// The increase from `earlier` to `self` per bucket; a bucket that fell means the process
    /// restarted, and its whole current count is the increase (Prometheus's `increase`).
    pub fn increase_since(&self, earlier: &Histogram) -> Histogram {
        let reset = self.count() < earlier.count();
        let buckets = self
            .buckets
            .iter()
            .map(|&(le, c)| {
                let before = if reset {
                    0.0
                } else {
                    earlier
                        .buckets
                        .iter()
                        .find(|b| b.0 == le)
                        .map_or(0.0, |b| b.1)
                };
                (le, (c - before).max(0.0))
            })
            .collect();
        Histogram { buckets }
    }
}

/// Sort key for a finite or infinite bound (all bounds are ≥ 0 in practice; negative ones
/// order first too).
pub(super) fn order_key(le: f64) -> u64 {
    let bits = le.to_bits();
    if le.is_sign_negative() {
        !bits
    } else {
        bits | (1 << 63)
    }
}

/// Histogram buckets as they are parsed: `(bound, count)` by the bound's sort key.
pub(super) type Buckets = BTreeMap<u64, (f64, f64)>;

/// A histogram with the sum of its observations, cumulative as exported or an increase over
/// a window: a gateway's prompt tokens per second for one model (the per-second sums,
/// `sluice_gateway_prompt_tokens_per_second{model}`), or the lengths of the prompts it saw
/// refused as too long (`sluice_gateway_model_refused_prompt_tokens{model}`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SummedHistogram {
    pub hist: Histogram,
    pub sum: f64,
}

impl SummedHistogram {
    /// The increase from `earlier` to `self` (the whole of `self` after a restart, as
    /// [`Histogram::increase_since`] decides).
    pub fn increase_since(&self, earlier: &SummedHistogram) -> SummedHistogram {
        let reset = self.hist.count() < earlier.hist.count();
        SummedHistogram {
            hist: self.hist.increase_since(&earlier.hist),
            sum: if reset {
                self.sum
            } else {
                (self.sum - earlier.sum).max(0.0)
            },
        }
    }

    pub fn add(&mut self, o: &SummedHistogram) {
        self.hist.add(&o.hist);
        self.sum += o.sum;
    }

    /// What the policy reads ([`SecondSums`]).
    pub fn sums(&self) -> SecondSums {
        SecondSums {
            buckets: self.hist.buckets.clone(),
            sum: self.sum,
        }
    }
}

/// The gateway's per-second prompt histograms as they are parsed, per model: buckets and the
/// sum.
#[derive(Default)]
struct Bursts(BTreeMap<String, (Buckets, f64)>);

impl Bursts {
    /// A `_bucket` or `_sum` sample of [`gateway::PROMPT_TOKENS_PER_SECOND`].
    fn record(&mut self, x: &Sample) {
        let Some(model) = x.label(gateway::MODEL) else {
            return;
        };
        let suffix = &x.name[gateway::PROMPT_TOKENS_PER_SECOND.len()..];
        match (suffix, x.label(vllm::LE).and_then(parse_le)) {
            ("_bucket", Some(le)) => {
                let e = self.0.entry(model.to_string()).or_default();
                e.0.entry(order_key(le)).or_insert((le, 0.0)).1 += x.value;
            }
            ("_sum", _) => self.0.entry(model.to_string()).or_default().1 += x.value,
            _ => {}
        }
    }

    fn finish(self) -> Option<BTreeMap<String, SummedHistogram>> {
        (!self.0.is_empty()).then(|| {
            self.0
                .into_iter()
                .map(|(model, (buckets, sum))| {
                    let hist = Histogram {
                        buckets: buckets.into_values().collect(),
                    };
                    (model, SummedHistogram { hist, sum })
                })
                .collect()
        })
    }
}

/// What a routing gateway holds for one model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelQueue {
    /// Waiting for a replica with room (`sluice_gateway_queue_depth{model}`, all priorities).
    pub waiting: f64,
    /// Held because no ready replica serves the model at all (`sluice_gateway_queue_held`):
    /// what wakes a pool at zero.
    pub held: f64,
    /// The oldest of them, seconds.
    pub oldest_wait_s: f64,
}

impl ModelQueue {
    /// Requests the gateway has for the model, waiting or held. sluice's gateway counts held
    /// requests in the depth too; the larger of the two also covers one that does not.
    pub fn total(&self) -> f64 {
        self.waiting.max(self.held).max(0.0)
    }

    /// Held requests the depth does not count.
    pub fn held_beyond_depth(&self) -> f64 {
        (self.held - self.waiting.max(0.0)).max(0.0)
    }

    pub fn add(&mut self, o: &ModelQueue) {
        self.waiting += o.waiting;
        self.held += o.held;
        self.oldest_wait_s = self.oldest_wait_s.max(o.oldest_wait_s);
    }
}

/// What one scrape of one target said. `None`: the target does not export that series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub waiting: Option<f64>,
    pub running: Option<f64>,
    /// 0..1, the fullest cache over label sets.
    pub kv_usage: Option<f64>,
    /// Finished requests (`vllm:e2e_request_latency_seconds_count`, else the sum of
    /// `vllm:request_success_total`).
    pub finished: Option<f64>,
    pub prompt_tokens: Option<f64>,
    pub generation_tokens: Option<f64>,
    pub preemptions: Option<f64>,
    pub ttft: Option<Histogram>,
    /// Time per output token per request when exported (vLLM's
    /// `vllm:request_time_per_output_token_seconds`), else inter-token latency per token
    /// (`vllm:inter_token_latency_seconds`, which is what sluice exports): the latter's p99
    /// is at least the per-request one's, so it errs towards more capacity.
    pub tpot: Option<Histogram>,
    pub prompt_len: Option<Histogram>,
    /// Each finished request's output length (`vllm:request_generation_tokens`).
    pub output_len: Option<Histogram>,
    /// A routing gateway's admission queue (`sluice_gateway_queue_depth`, all priorities).
    pub gateway_queue: Option<f64>,
    /// A routing gateway's queue per model (`sluice_gateway_queue_*{model}`): what a pool of
    /// that model has waiting in the gateway, held at zero replicas included.
    pub gateway_models: Option<BTreeMap<String, ModelQueue>>,
    /// A routing gateway's replica set: the `replica` labels of
    /// `sluice_gateway_replica_eligible` (the gateway drops a replica's series when it leaves
    /// the set), with whether each is eligible now.
    pub gateway_replicas: Option<BTreeMap<String, bool>>,
    /// A routing gateway's prompt tokens per second with arrivals, per model
    /// (`sluice_gateway_prompt_tokens_per_second{model}`; cumulative, as exported).
    pub prompt_bursts: Option<BTreeMap<String, SummedHistogram>>,
    /// A routing gateway's arrivals, client-side first tokens and unserved requests, per
    /// model (`sluice_gateway_model_*`; cumulative, as exported).
    pub front_door: Option<BTreeMap<String, FrontDoor>>,
}

impl Snapshot {
    /// Reduces parsed samples to the figures above.
    pub fn from_samples(samples: &[Sample]) -> Snapshot {
        let mut s = Snapshot::default();
        let mut load = ReplicaLoad::default();
        let mut e2e_count: Option<f64> = None;
        let mut success: Option<f64> = None;
        let mut hists: BTreeMap<&str, Buckets> = BTreeMap::new();
        let mut bursts = Bursts::default();
        let mut doors = FrontDoors::default();
        let add = |slot: &mut Option<f64>, v: f64| *slot = Some(slot.unwrap_or(0.0) + v);
        for x in samples {
            let v = x.value;
            if !v.is_finite() {
                continue;
            }
            if load.record(&x.name, v) || doors.record(x) {
                continue;
            }
            match x.name.as_str() {
                vllm::E2E_REQUEST_LATENCY_SECONDS_COUNT => add(&mut e2e_count, v),
                vllm::REQUEST_SUCCESS_TOTAL => add(&mut success, v),
                vllm::PROMPT_TOKENS_TOTAL => add(&mut s.prompt_tokens, v),
                vllm::GENERATION_TOKENS_TOTAL => add(&mut s.generation_tokens, v),
                vllm::NUM_PREEMPTIONS_TOTAL => add(&mut s.preemptions, v),
                gateway::QUEUE_DEPTH => {
                    add(&mut s.gateway_queue, v);
                    if let Some(m) = x.label(gateway::MODEL) {
                        s.model_queue(m).waiting += v;
                    }
                }
                gateway::QUEUE_HELD => {
                    if let Some(m) = x.label(gateway::MODEL) {
                        s.model_queue(m).held += v;
                    }
                }
                gateway::QUEUE_OLDEST_WAIT_SECONDS => {
                    if let Some(m) = x.label(gateway::MODEL) {
                        let q = s.model_queue(m);
                        q.oldest_wait_s = q.oldest_wait_s.max(v);
                    }
                }
                gateway::REPLICA_ELIGIBLE => {
                    if let Some(r) = x.label(gateway::REPLICA) {
                        s.gateway_replicas
                            .get_or_insert_with(BTreeMap::new)
                            .insert(normalise_url(r), v > 0.0);
                    }
                }
                name if name.starts_with(gateway::PROMPT_TOKENS_PER_SECOND) => bursts.record(x),
                name => {
                    let Some(base) = name.strip_suffix("_bucket") else {
                        continue;
                    };
                    let Some(le) = x.label(vllm::LE).and_then(parse_le) else {
                        continue;
                    };
                    let key = base_name(base);
                    if key.is_empty() {
                        continue;
                    }
                    let e = hists.entry(key).or_default();
                    e.entry(order_key(le)).or_insert((le, 0.0)).1 += v;
                }
            }
        }
        (s.waiting, s.running, s.kv_usage) = (load.waiting, load.running, load.kv_usage);
        s.finished = e2e_count.or(success);
        let mut take = |names: &[&str]| {
            names.iter().find_map(|n| {
                hists.remove(*n).map(|b| Histogram {
                    buckets: b.into_values().collect(),
                })
            })
        };
        s.ttft = take(&[vllm::TIME_TO_FIRST_TOKEN_SECONDS]);
        s.tpot = take(vllm::TPOT_HISTOGRAMS);
        s.prompt_len = take(&[vllm::REQUEST_PROMPT_TOKENS]);
        s.output_len = take(&[vllm::REQUEST_GENERATION_TOKENS]);
        s.prompt_bursts = bursts.finish();
        s.front_door = doors.finish();
        s
    }

    fn model_queue(&mut self, model: &str) -> &mut ModelQueue {
        self.gateway_models
            .get_or_insert_with(BTreeMap::new)
            .entry(model.to_string())
            .or_default()
    }

    /// What the gateway has waiting for `model` (zero when it exports nothing for it).
    pub fn model_queue_of(&self, model: &str) -> ModelQueue {
        self.gateway_models
            .as_ref()
            .and_then(|m| m.get(model))
            .copied()
            .unwrap_or_default()
    }

    /// Requests waiting on a replica: in its engine's queue, and in its own admission queue
    /// (a sluice replica is a `sluice serve` too, and holds requests past `--max-in-flight`).
    pub fn waiting_total(&self) -> f64 {
        self.waiting.unwrap_or(0.0) + self.gateway_queue.unwrap_or(0.0)
    }

    /// Requests on a replica: running plus waiting (zero when it exports neither).
    pub fn in_system(&self) -> f64 {
        self.running.unwrap_or(0.0) + self.waiting_total()
    }
}

/// The histogram names the snapshot keeps, so the map holds `&'static str` keys.
fn base_name(base: &str) -> &'static str {
    const KEPT: &[&str] = &[
        vllm::TIME_TO_FIRST_TOKEN_SECONDS,
        vllm::REQUEST_PROMPT_TOKENS,
        vllm::REQUEST_GENERATION_TOKENS,
    ];
    KEPT.iter()
        .chain(vllm::TPOT_HISTOGRAMS)
        .find(|k| **k == base)
        .copied()
        .unwrap_or("")
}

pub(super) fn parse_le(s: &str) -> Option<f64> {
    parse_value(s).filter(|v| !v.is_nan())
}

/// The TTFT target and the longest prompt some variant of the pool serves alone within it:
/// what the policy's `ttft_attainment` signal is measured against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftTarget {
    pub target_s: f64,
    pub longest_prompt_tokens: f64,
}

impl TtftTarget {
    pub fn new(profile: &Profile, slo: &Slo) -> TtftTarget {
        TtftTarget {
            target_s: slo.ttft_p99_s,
            longest_prompt_tokens: profile.longest_feasible_prompt(slo),
        }
    }

    /// From a window's TTFT and prompt-length histograms: the share of first tokens within
    /// the target, over the share of prompts no longer than the longest feasible one (the
    /// rest miss whatever the fleet), at most 1. Histograms hold no per-request pairs, so
    /// this assumes the late first tokens include every infeasible prompt's. `None` when
    /// either is empty or nothing was feasible.
    pub fn attainment(&self, ttft: &Histogram, prompts: &Histogram) -> Option<f64> {
        self.attainment_of(ttft, self.feasible_share(prompts)?)
    }

    /// The share of a window's prompts no longer than the longest feasible one; `None` when
    /// the histogram is empty.
    pub fn feasible_share(&self, prompts: &Histogram) -> Option<f64> {
        prompts.share_at_most(self.longest_prompt_tokens)
    }

    /// The share of `ttft`'s observations within the target over the `feasible` share, at most
    /// 1; `None` when `ttft` is empty or nothing was feasible.
    pub fn attainment_of(&self, ttft: &Histogram, feasible: f64) -> Option<f64> {
        let within = ttft.share_at_most(self.target_s)?;
        (feasible > 0.0).then(|| (within / feasible).min(1.0))
    }
}

/// `http://host:port` without a trailing slash, so a target URL and a gateway's label match.
pub fn normalise_url(u: &str) -> String {
    u.trim().trim_end_matches('/').to_string()
}

/// The replicas a gateway routes to, from its snapshot.
pub fn routed(s: &Snapshot) -> Option<BTreeSet<String>> {
    s.gateway_replicas
        .as_ref()
        .map(|m| m.keys().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_metrics::exposition::parse;

    fn hist(b: &[(f64, f64)]) -> Histogram {
        Histogram {
            buckets: b.to_vec(),
        }
    }

    #[test]
    fn quantiles_interpolate_like_histogram_quantile() {
        let h = hist(&[
            (0.1, 50.0),
            (0.5, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ]);
        // rank 50 sits at the top of the first bucket, rank 70 halfway through the second.
        assert!((h.quantile(0.5).unwrap() - 0.1).abs() < 1e-12);
        assert!((h.quantile(0.7).unwrap() - 0.3).abs() < 1e-12);
        assert!((h.quantile(0.99).unwrap() - 0.95).abs() < 1e-12);
        // In the +Inf bucket: the highest finite bound.
        let tail = hist(&[(1.0, 1.0), (f64::INFINITY, 10.0)]);
        assert_eq!(tail.quantile(0.99), Some(1.0));
        assert_eq!(
            hist(&[(1.0, 0.0), (f64::INFINITY, 0.0)]).quantile(0.5),
            None
        );
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn shares_invert_quantiles_and_attainment_leaves_out_infeasible_prompts() {
        let h = hist(&[
            (0.1, 50.0),
            (0.5, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ]);
        assert_eq!(h.share_at_most(0.1), Some(0.5));
        assert!((h.share_at_most(0.3).unwrap() - 0.7).abs() < 1e-12);
        assert_eq!(h.share_at_most(5.0), Some(1.0));
        assert_eq!(h.share_at_most(0.0), Some(0.0));
        for q in [0.2, 0.6, 0.95] {
            let x = h.quantile(q).unwrap();
            assert!((h.share_at_most(x).unwrap() - q).abs() < 1e-9, "{q}");
        }
        // Past the last finite bound only +Inf is left: it counts as above.
        let tail = hist(&[(1.0, 8.0), (f64::INFINITY, 10.0)]);
        assert_eq!(tail.share_at_most(3.0), Some(0.8));
        assert_eq!(Histogram::default().share_at_most(1.0), None);
        // 90 % of first tokens in time, 95 % of prompts feasible: 94.7 % of the feasible ones.
        let ttft = hist(&[(2.0, 90.0), (f64::INFINITY, 100.0)]);
        let prompts = hist(&[(8192.0, 95.0), (f64::INFINITY, 100.0)]);
        let target = |longest_prompt_tokens| TtftTarget {
            target_s: 2.0,
            longest_prompt_tokens,
        };
        let a = target(8192.0).attainment(&ttft, &prompts).unwrap();
        assert!((a - 0.9 / 0.95).abs() < 1e-12, "{a}");
        // Never above one; nothing feasible or nothing seen: no figure.
        let fewer = hist(&[(8192.0, 80.0), (f64::INFINITY, 100.0)]);
        assert_eq!(target(8192.0).attainment(&ttft, &fewer), Some(1.0));
        assert_eq!(target(0.0).attainment(&ttft, &prompts), None);
        assert_eq!(
            target(8192.0).attainment(&Histogram::default(), &prompts),
            None
        );
    }

    #[test]
    fn increases_handle_restarts_and_sums_match_buckets() {
        let a = hist(&[(1.0, 2.0), (f64::INFINITY, 3.0)]);
        let b = hist(&[(1.0, 5.0), (f64::INFINITY, 9.0)]);
        assert_eq!(
            b.increase_since(&a),
            hist(&[(1.0, 3.0), (f64::INFINITY, 6.0)])
        );
        // The process restarted: counts fell, the new counts are the increase.
        let c = hist(&[(1.0, 1.0), (f64::INFINITY, 1.0)]);
        assert_eq!(c.increase_since(&b), c);
        let mut s = a.clone();
        s.add(&b);
        assert_eq!(s, hist(&[(1.0, 7.0), (f64::INFINITY, 12.0)]));
        let mut e = Histogram::default();
        e.add(&a);
        assert_eq!(e, a);
    }

    #[test]
    fn prompt_length_spread_and_largest_bucket() {
        let equal = hist(&[(100.0, 0.0), (200.0, 10.0), (f64::INFINITY, 10.0)]);
        let (mean, cv2) = equal.mean_cv2().unwrap();
        assert_eq!((mean, cv2), (150.0, 0.0));
        assert_eq!(equal.max_bound(), Some(200.0));
        let spread = hist(&[(100.0, 5.0), (1000.0, 10.0), (f64::INFINITY, 10.0)]);
        assert!(spread.mean_cv2().unwrap().1 > 0.5);
    }

    #[test]
    fn vllm_names_and_gateway_series_are_read() {
        let text = r#"
vllm:num_requests_waiting{model_name="a"} 2
vllm:num_requests_waiting{model_name="b"} 1
vllm:num_requests_running{model_name="a"} 4
vllm:gpu_cache_usage_perc{model_name="a"} 0.3
vllm:kv_cache_usage_perc{model_name="b"} 0.6
vllm:request_success_total{model_name="a",finished_reason="stop"} 7
vllm:request_success_total{model_name="a",finished_reason="length"} 3
vllm:prompt_tokens_total{model_name="a"} 1000
vllm:time_to_first_token_seconds_bucket{model_name="a",le="0.5"} 4
vllm:time_to_first_token_seconds_bucket{model_name="a",le="+Inf"} 10
vllm:time_to_first_token_seconds_bucket{model_name="b",le="0.5"} 1
vllm:time_to_first_token_seconds_bucket{model_name="b",le="+Inf"} 1
vllm:inter_token_latency_seconds_bucket{model_name="a",le="0.1"} 1
vllm:inter_token_latency_seconds_bucket{model_name="a",le="+Inf"} 1
vllm:request_time_per_output_token_seconds_bucket{model_name="a",le="0.2"} 2
vllm:request_time_per_output_token_seconds_bucket{model_name="a",le="+Inf"} 2
vllm:request_generation_tokens_bucket{model_name="a",le="100"} 3
vllm:request_generation_tokens_bucket{model_name="a",le="+Inf"} 3
sluice_gateway_queue_depth{priority="0"} 3
sluice_gateway_queue_depth{priority="-1"} 2
sluice_gateway_replica_eligible{replica="http://127.0.0.1:9001/"} 1
sluice_gateway_replica_eligible{replica="http://127.0.0.1:9002"} 0
"#;
        let s = Snapshot::from_samples(&parse(text).unwrap());
        assert_eq!(s.waiting, Some(3.0));
        assert_eq!(s.running, Some(4.0));
        assert_eq!(s.kv_usage, Some(0.6));
        // No e2e histogram: the success counter's sum.
        assert_eq!(s.finished, Some(10.0));
        assert_eq!(s.prompt_tokens, Some(1000.0));
        assert_eq!(s.generation_tokens, None);
        assert_eq!(
            s.ttft,
            Some(hist(&[(0.5, 5.0), (f64::INFINITY, 11.0)])),
            "label sets summed per bound"
        );
        // The per-request TPOT histogram wins over per-token ITL.
        assert_eq!(s.tpot, Some(hist(&[(0.2, 2.0), (f64::INFINITY, 2.0)])));
        assert_eq!(
            s.output_len,
            Some(hist(&[(100.0, 3.0), (f64::INFINITY, 3.0)]))
        );
        assert_eq!(s.prompt_len, None);
        assert_eq!(s.gateway_queue, Some(5.0));
        let g = s.gateway_replicas.clone().unwrap();
        assert_eq!(g.get("http://127.0.0.1:9001"), Some(&true));
        assert_eq!(g.get("http://127.0.0.1:9002"), Some(&false));
        assert_eq!(s.in_system(), 12.0, "4 running, 3 waiting, 5 in admission");
        assert_eq!(Snapshot::default().in_system(), 0.0);
    }

    #[test]
    fn the_gateway_queue_is_read_per_model_held_requests_included() {
        let text = r#"
sluice_gateway_queue_depth{model="a",priority="0"} 3
sluice_gateway_queue_depth{model="a",priority="-1"} 1
sluice_gateway_queue_depth{model="b",priority="0"} 0
sluice_gateway_queue_held{model="a"} 0
sluice_gateway_queue_held{model="b"} 2
sluice_gateway_queue_oldest_wait_seconds{model="b"} 4.5
"#;
        let s = Snapshot::from_samples(&parse(text).unwrap());
        let a = s.model_queue_of("a");
        assert_eq!((a.waiting, a.held, a.total()), (4.0, 0.0, 4.0));
        let b = s.model_queue_of("b");
        assert_eq!((b.waiting, b.held, b.oldest_wait_s), (0.0, 2.0, 4.5));
        assert_eq!(s.model_queue_of("c"), ModelQueue::default());
        // sluice's gateway counts held requests in the depth as well: not twice.
        let both = Snapshot::from_samples(
            &parse(
                "sluice_gateway_queue_depth{model=\"a\",priority=\"0\"} 2\n\
                 sluice_gateway_queue_held{model=\"a\"} 2\n",
            )
            .unwrap(),
        );
        assert_eq!(both.model_queue_of("a").total(), 2.0);
        assert_eq!(both.model_queue_of("a").held_beyond_depth(), 0.0);
        assert_eq!(s.gateway_queue, Some(4.0), "the depth over every model");
        // Nothing per model from a gateway without the model label.
        let old = Snapshot::from_samples(
            &parse("sluice_gateway_queue_depth{priority=\"0\"} 3\n").unwrap(),
        );
        assert_eq!((old.gateway_queue, old.gateway_models), (Some(3.0), None));
    }
}

//! What one replica of a variant can serve while meeting the SLO.
//!
//! The performance model is a decode step of `α + β·b` seconds for a batch of `b` sequences,
//! prefill at `R` tokens/s sharing the steps (chunked prefill), and a KV cache of `K` tokens.
//! A replica receiving `λ` requests/s of `P` prompt and `O` output tokens spends `λP/R` of each
//! second prefilling, so a decode step takes `(α + βb) / (1 − λP/R)` on average, and by
//! Little's law `b = λ·O·TPOT`. Setting TPOT to the planning target `T` gives the largest rate
//! at which the TPOT SLO holds:
//!
//! ```text
//! λ_tpot = (T − α) / (T · (P/R + β·O))
//! ```
//!
//! bounded by the KV cache (`b ≤ K / (P + O·(1 + cv²))`: sequences reserve their whole length,
//! and the longer outputs hold it longer) and `max_num_seqs`, and by the prefill queue: an
//! M/G/1 queue of prompts whose mean wait plus service must fit in the planning share of the
//! TTFT SLO.

use serde::{Deserialize, Serialize};

use crate::profile::Variant;
use crate::signals::SecondSums;

/// The lowest prefill utilisation the TTFT bound plans for (see [`at_slo`]).
pub const MIN_PREFILL_UTILISATION: f64 = 0.5;

/// The share of first tokens a variant may leave late with prompts it cannot prefill in time
/// even idle, beyond those the fastest variant leaves late (see [`slow_prompt_share`]): the
/// whole error budget of a p99, since a fleet of that variant alone misses the SLO past it
/// whatever its size. Half the budget (what the sluice policy's prompt floors plan for) ruled
/// out the A100 for code-shaped prompts on windows whose fitted tail ran heavy (0.47 % on
/// the mean shape), where A100 fleets meet the SLO.
pub const SLOW_PROMPT_BUDGET: f64 = 0.01;

/// Latency objectives, as percentiles over requests.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Slo {
    pub ttft_p99_s: f64,
    pub tpot_p99_s: f64,
}

impl Slo {
    /// Both targets are positive numbers of seconds: nothing can be planned for a target of
    /// zero (every variant reads as ineligible), so entry points refuse one.
    pub fn is_valid(&self) -> bool {
        self.ttft_p99_s > 0.0 && self.tpot_p99_s > 0.0
    }
}

/// How much of the SLO the capacity model plans to use on average, leaving the rest for the
/// spread of per-request latency around the mean (the p99 is well above the mean).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Planning {
    /// Mean TPOT planned for, as a share of the TPOT SLO.
    pub tpot_share: f64,
    /// Mean prefill wait plus service planned for, as a share of the TTFT SLO.
    pub ttft_share: f64,
}

impl Default for Planning {
    fn default() -> Self {
        Planning {
            tpot_share: 0.5,
            ttft_share: 0.5,
        }
    }
}

/// Mean request shape the capacity is computed for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Workload {
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
    /// Squared coefficient of variation of prompt lengths (variance / mean²): 0 for equal
    /// prompts, 1 for exponential ones, more for heavy tails. Queueing for prefill grows with
    /// it (Pollaczek–Khinchine).
    #[serde(default)]
    pub prompt_cv2: f64,
    /// The same for output lengths. A sequence holds its KV for as long as it decodes, so the
    /// long outputs hold the cache longest: of the sequences running at once, the mean output
    /// is `(1 + cv²)` times the requests' (see [`kv_batch`]).
    #[serde(default)]
    pub output_cv2: f64,
}

impl Workload {
    /// Equal-length requests of this size.
    pub fn uniform(prompt: f64, output: f64) -> Workload {
        Workload {
            mean_prompt_tokens: prompt,
            mean_output_tokens: output,
            prompt_cv2: 0.0,
            output_cv2: 0.0,
        }
    }

    /// The shape of `n` requests whose prompt and output lengths summed to these moments.
    pub fn from_moments(n: f64, prompt: &Moments, output: &Moments) -> Workload {
        Workload {
            mean_prompt_tokens: prompt.sum / n,
            mean_output_tokens: output.sum / n,
            prompt_cv2: prompt.cv2(n),
            output_cv2: output.cv2(n),
        }
    }
}

/// The sum and the sum of squares of some lengths (prompt or output tokens): with their
/// count, their mean and spread ([`cv2`]). Added to as requests arrive, taken from as they
/// leave a window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moments {
    pub sum: f64,
    pub sum_sq: f64,
}

impl Moments {
    pub fn add(&mut self, x: u32) {
        self.sum += f64::from(x);
        self.sum_sq += f64::from(x).powi(2);
    }

    pub fn remove(&mut self, x: u32) {
        self.sum -= f64::from(x);
        self.sum_sq -= f64::from(x).powi(2);
    }

    /// The spread of `n` lengths with these moments.
    pub fn cv2(&self, n: f64) -> f64 {
        cv2(n, self.sum, self.sum_sq)
    }
}

impl std::iter::Sum for Moments {
    fn sum<I: Iterator<Item = Moments>>(iter: I) -> Moments {
        iter.fold(Moments::default(), |a, m| Moments {
            sum: a.sum + m.sum,
            sum_sq: a.sum_sq + m.sum_sq,
        })
    }
}

/// Squared coefficient of variation from a count, a sum and a sum of squares.
pub fn cv2(n: f64, sum: f64, sum_sq: f64) -> f64 {
    if n < 2.0 || sum <= 0.0 {
        return 0.0;
    }
    let mean = sum / n;
    (sum_sq / n / (mean * mean) - 1.0).max(0.0)
}

/// What bound a variant's capacity.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    /// The batch at which ITL (with prefill's share) reaches the TPOT target.
    Tpot,
    KvCache,
    MaxSeqs,
    /// The prefill queue would push TTFT past its target.
    Prefill,
    /// The variant cannot meet the SLO at all for this workload.
    Ineligible,
}

/// One replica's capacity at SLO for a workload.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Capacity {
    /// Requests per second one replica serves within the planning targets.
    pub requests_per_s: f64,
    /// The same in output tokens per second.
    pub output_tokens_per_s: f64,
    /// Running sequences at that rate (Little's law).
    pub batch: f64,
    /// Mean decode step at that batch, prefill share included.
    pub tpot_s: f64,
    pub bound: Bound,
}

impl Capacity {
    /// A variant that cannot meet the SLO for the workload: no capacity at all.
    pub fn ineligible(v: &Variant) -> Capacity {
        Capacity {
            requests_per_s: 0.0,
            output_tokens_per_s: 0.0,
            batch: 0.0,
            tpot_s: v.perf.itl_alpha_ms / 1000.0,
            bound: Bound::Ineligible,
        }
    }

    /// Requests per second a whole fleet of `n` such replicas serves.
    pub fn fleet(&self, n: u32) -> f64 {
        self.requests_per_s * f64::from(n)
    }
}

/// The largest batch whose ITL meets a TPOT target, bounded by KV and `max_num_seqs`
/// (decode only, no prefill sharing the steps).
pub fn batch_at_tpot(v: &Variant, w: &Workload, tpot_s: f64) -> f64 {
    let p = &v.perf;
    let alpha = p.itl_alpha_ms / 1000.0;
    let beta = p.itl_beta_ms / 1000.0;
    let by_itl = if tpot_s <= alpha {
        0.0
    } else if beta == 0.0 {
        f64::INFINITY
    } else {
        ((tpot_s - alpha) / beta).floor()
    };
    by_itl.min(kv_batch(v, w))
}

/// Sequences that fit in KV and the sequence limit at once. Each reserves its prompt and
/// output; a sequence decodes for a time in proportion to its output, so among those running
/// at once outputs are length-biased: `E[O²] / E[O] = Ō·(1 + cv²)` on average (prompt and
/// output lengths independent). With outputs as spread as an exponential's (cv² 1) that is
/// twice the mean, and a cache sized by the mean holds half the sequences it was credited.
fn kv_batch(v: &Variant, w: &Workload) -> f64 {
    let running_output = w.mean_output_tokens * (1.0 + w.output_cv2.max(0.0));
    let per_seq = (w.mean_prompt_tokens + running_output).max(1.0);
    (v.perf.kv_cache_tokens as f64 / per_seq)
        .floor()
        .min(f64::from(v.perf.max_num_seqs))
}

/// Why a variant cannot meet the SLO for a workload at all (see [`ineligibility`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ineligibility {
    /// A decode step alone (α) is at or over the mean TPOT planned for.
    DecodeStep { step_s: f64, planned_s: f64 },
    /// A lone decode behind a full prefill chunk is over the TPOT target.
    ChunkStep {
        step_s: f64,
        chunk: u32,
        target_s: f64,
    },
    /// The mean prompt's prefill alone takes the TTFT budget planned for.
    Prefill { prefill_s: f64, budget_s: f64 },
    /// A mean sequence (prompt and output) does not fit the KV cache.
    Kv { tokens: f64, kv_tokens: u64 },
}

impl std::fmt::Display for Ineligibility {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Ineligibility::DecodeStep { step_s, planned_s } => write!(
                f,
                "a decode step takes {:.0} ms, at or over the {:.0} ms mean TPOT planned for",
                step_s * 1e3,
                planned_s * 1e3
            ),
            Ineligibility::ChunkStep {
                step_s,
                chunk,
                target_s,
            } => write!(
                f,
                "a decode step behind a full {chunk}-token prefill chunk takes {:.0} ms, over \
                 the {:.0} ms TPOT target (a smaller max_batched_tokens in the profile \
                 shortens it)",
                step_s * 1e3,
                target_s * 1e3
            ),
            Ineligibility::Prefill {
                prefill_s,
                budget_s,
            } => write!(
                f,
                "the mean prompt's prefill takes {prefill_s:.2} s of the {budget_s:.2} s TTFT \
                 budget planned for"
            ),
            Ineligibility::Kv { tokens, kv_tokens } => write!(
                f,
                "a mean sequence of {tokens:.0} tokens does not fit its {kv_tokens} KV tokens"
            ),
        }
    }
}

/// Why one replica of `v` cannot meet the SLO for workload `w` at all, if it cannot: the
/// checks [`at_slo`] makes before sizing, in its order.
pub fn ineligibility(
    v: &Variant,
    w: &Workload,
    slo: &Slo,
    plan: &Planning,
) -> Option<Ineligibility> {
    let p = &v.perf;
    let alpha = p.itl_alpha_ms / 1000.0;
    let prompt = w.mean_prompt_tokens.max(0.0);
    let tokens = prompt + w.mean_output_tokens.max(1.0);
    let planned_s = slo.tpot_p99_s * plan.tpot_share;
    // A decode step that carries a full prefill chunk is the slowest a sequence sees; a request
    // decoding through a run of prompts sees it step after step, so even a lone decode behind
    // one must fit the TPOT SLO itself (not just the planned mean).
    let chunk_step =
        v.itl_s(1.0) + (f64::from(p.max_batched_tokens) - 1.0).max(0.0) / p.prefill_tokens_per_s;
    let prefill_s = prompt / p.prefill_tokens_per_s;
    let budget_s = slo.ttft_p99_s * plan.ttft_share;
    if planned_s <= alpha {
        Some(Ineligibility::DecodeStep {
            step_s: alpha,
            planned_s,
        })
    } else if chunk_step > slo.tpot_p99_s {
        Some(Ineligibility::ChunkStep {
            step_s: chunk_step,
            chunk: p.max_batched_tokens,
            target_s: slo.tpot_p99_s,
        })
    } else if prefill_s >= budget_s {
        Some(Ineligibility::Prefill {
            prefill_s,
            budget_s,
        })
    } else if tokens > p.kv_cache_tokens as f64 || kv_batch(v, w) < 1.0 {
        Some(Ineligibility::Kv {
            tokens,
            kv_tokens: p.kv_cache_tokens,
        })
    } else {
        None
    }
}

/// Capacity of one replica of `v` at the SLO for workload `w`.
pub fn at_slo(v: &Variant, w: &Workload, slo: &Slo, plan: &Planning) -> Capacity {
    let p = &v.perf;
    let alpha = p.itl_alpha_ms / 1000.0;
    let beta = p.itl_beta_ms / 1000.0;
    let prompt = w.mean_prompt_tokens.max(0.0);
    let out = w.mean_output_tokens.max(1.0);
    let t = slo.tpot_p99_s * plan.tpot_share;
    let prefill_s = prompt / p.prefill_tokens_per_s;
    let ttft_budget = slo.ttft_p99_s * plan.ttft_share;
    // Every step behind a full prefill chunk must fit the TPOT SLO (see [`ineligibility`]):
    // `α + β·b + (C − b)/R ≤ SLO` caps the batch when β exceeds 1/R.
    let chunk = f64::from(v.perf.max_batched_tokens);
    let per_token = 1.0 / v.perf.prefill_tokens_per_s;
    let b_step = if beta > per_token {
        ((slo.tpot_p99_s - alpha - chunk * per_token) / (beta - per_token)).floor()
    } else {
        f64::INFINITY
    };
    let b_kv = kv_batch(v, w).min(b_step);
    // `b_kv < 1` follows from the checks but for rounding at their edges.
    if ineligibility(v, w, slo, plan).is_some() || b_kv < 1.0 {
        return Capacity::ineligible(v);
    }
    let lambda_tpot = (t - alpha) / (t * (prefill_s + beta * out));
    // At the KV bound the batch is fixed, TPOT falls below `t`.
    let lambda_kv = 1.0 / (out * (alpha + beta * b_kv) / b_kv + prefill_s);
    // Sized for TPOT only (no TTFT budget, see `plan::capacities`), prefill is still planned
    // at the lowest utilisation the TTFT bound plans for: past it the queue behind long
    // prompts delays the shorter ones that could still meet the target.
    let lambda_prefill = if ttft_budget.is_finite() {
        prefill_rate(prefill_s, ttft_budget, w.prompt_cv2)
    } else {
        MIN_PREFILL_UTILISATION / prefill_s.max(1e-9)
    };
    // What caps the batch when it is fixed below the TPOT batch.
    let kv_bound = if b_kv >= b_step {
        Bound::Tpot
    } else if b_kv >= f64::from(p.max_num_seqs) {
        Bound::MaxSeqs
    } else {
        Bound::KvCache
    };
    let (lambda, bound) = lowest([
        (lambda_tpot, Bound::Tpot),
        (lambda_kv, kv_bound),
        (lambda_prefill, Bound::Prefill),
    ]);
    // Solve b = λ·O·(α + βb)/(1 − u) for the batch at this rate.
    let share = (1.0 - lambda * prefill_s).max(1e-9);
    let denom = share - lambda * out * beta;
    let batch = if denom > 0.0 {
        lambda * out * alpha / denom
    } else {
        b_kv
    };
    let tpot_s = (alpha + beta * batch) / share;
    Capacity {
        requests_per_s: lambda,
        output_tokens_per_s: lambda * out,
        batch,
        tpot_s,
        bound,
    }
}

/// The lowest rate and what bounds it; the first on a tie.
fn lowest(rates: [(f64, Bound); 3]) -> (f64, Bound) {
    rates
        .into_iter()
        .fold((f64::INFINITY, Bound::Tpot), |acc, x| {
            if x.0 < acc.0 {
                x
            } else {
                acc
            }
        })
}

/// The arrival rate one replica's prefill serves within the TTFT budget. An M/G/1 prefill
/// queue: mean wait ρS(1 + C²)/(2(1−ρ)) plus service S within the budget, C² the prompts'
/// squared coefficient of variation. When the service alone nearly fills the budget, queueing
/// is not what makes first tokens late and more replicas would not help: prefill utilisation
/// is never planned below one half (where the mean wait is S/2), so capacity does not collapse
/// to zero as prompts approach the budget.
fn prefill_rate(prefill_s: f64, ttft_budget: f64, prompt_cv2: f64) -> f64 {
    let k = (ttft_budget - prefill_s) / prefill_s.max(1e-9);
    let spread = 1.0 + prompt_cv2.max(0.0);
    let rho_max = (2.0 * k / (spread + 2.0 * k)).clamp(MIN_PREFILL_UTILISATION, 1.0);
    if prefill_s > 0.0 {
        rho_max / prefill_s
    } else {
        f64::INFINITY
    }
}

/// The standard normal distribution function.
fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// Prompt lengths `P` log-normal with the workload's mean and squared coefficient of
/// variation (the published traces' prompt lengths are close to log-normal): the mean, the
/// spread of the logarithm and `k`'s standard score; `None` for equal prompts (`cv² = 0`), no
/// prompt or `k ≤ 0`.
fn prompt_fit(w: &Workload, k: f64) -> Option<(f64, f64, f64)> {
    let m = w.mean_prompt_tokens.max(0.0);
    let s2 = (1.0 + w.prompt_cv2.max(0.0)).ln();
    if m <= 0.0 || k <= 0.0 || s2 <= 1e-12 {
        return None;
    }
    let s = s2.sqrt();
    Some((m, s, (k.ln() - (m.ln() - s2 / 2.0)) / s))
}

/// `E[(P − k)⁺]`: prompt tokens beyond `k` per request (log-normal fit, [`prompt_fit`]); all
/// equal to the mean when `cv² = 0`.
pub fn prompt_excess_tokens(w: &Workload, k: f64) -> f64 {
    match prompt_fit(w, k) {
        Some((m, s, z)) => (m * normal_cdf(s - z) - k * normal_cdf(-z)).max(0.0),
        None => (w.mean_prompt_tokens.max(0.0) - k).max(0.0),
    }
}

/// `P(P > k)`: the share of prompts longer than `k` tokens (log-normal fit, [`prompt_fit`]).
pub fn prompt_share_beyond(w: &Workload, k: f64) -> f64 {
    let m = w.mean_prompt_tokens.max(0.0);
    match prompt_fit(w, k) {
        Some((_, _, z)) => normal_cdf(-z),
        None if m > k.max(0.0) => 1.0,
        None => 0.0,
    }
}

/// The share of prompts longer than one idle replica of `v` prefills within the TTFT target
/// ([`Variant::longest_prompt_within`]): their first tokens are late however many replicas of
/// `v` there are. The capacity model's prefill bound is a mean and misses them: a variant
/// with slow prefill (an L4 at 3k tokens/s, chunks of 256) meets a 2 s target on the mean
/// conversation prompt yet leaves ~3 % of them late with nothing queued.
pub fn slow_prompt_share(v: &Variant, w: &Workload, slo: &Slo) -> f64 {
    prompt_share_beyond(w, v.longest_prompt_within(slo.ttft_p99_s))
}

/// The fewest replicas of `v` sharing `rate` requests/s at which at most `budget` of first
/// tokens are late behind another request's long prompt (`max` if none up to it is enough),
/// when that is more than the fewest whose prefill keeps up with the rate at all; `None` when
/// it is not: the rate then sets the fleet, and the capacity plan answers it.
///
/// The mean-based prefill bound of [`at_slo`] misses this. A request with the mean prompt may
/// wait `slack = TTFT − P̄/R`. It is late if it arrives while the prompt in prefill has more
/// than that left, which on a replica receiving `λ` is a share `λ·E[(S − slack)⁺]` of the time
/// (`S = P/R`), stretched by `1/(1 − ρ)` for the queue in front of it. With `n` replicas and
/// new requests routed to the least loaded, it is late only when every replica is so blocked:
/// `(λₙ·E[(S − slack)⁺]/(1 − ρₙ))ⁿ` with `λₙ = λ/n`. A heavy tail of prompt lengths blocks a
/// lone replica for seconds at low utilisation; a second one is what unblocks it.
pub fn tail_replicas(
    v: &Variant,
    w: &Workload,
    slo: &Slo,
    rate: f64,
    budget: f64,
    max: u32,
) -> Option<u32> {
    let r = v.perf.prefill_tokens_per_s;
    let mean_s = w.mean_prompt_tokens.max(0.0) / r;
    let slack = slo.ttft_p99_s - mean_s;
    if rate <= 0.0 || r <= 0.0 || slack <= 0.0 {
        return None;
    }
    let max = max.max(1);
    let excess_s = prompt_excess_tokens(w, slack * r) / r;
    let rho = |n: u32| rate / f64::from(n) * mean_s;
    let keeps_up = (1..=max).find(|&n| rho(n) < 1.0)?;
    let late = |n: u32| (rate / f64::from(n) * excess_s / (1.0 - rho(n))).powi(n as i32);
    let n = (keeps_up..=max).find(|&n| late(n) <= budget).unwrap_or(max);
    (n > keeps_up).then_some(n)
}

/// The prompt tokens a fleet must prefill within the TTFT target (`T`, summed over its
/// replicas: `Σ R·T`) so that at most `budget` of the tokens arriving in each second are late;
/// `None` when no token arrived.
///
/// Rates over any window hide a burst: a batch of requests sent within a second needs its
/// prompts prefilled within the target, which a fleet sharing it does up to its prefill over
/// `T`. The tokens beyond that in each second ([`SecondSums::excess_share`]) are late, less
/// those of prompts longer than the fastest replica prefills within `T` (`longest`), which are
/// late however large the fleet (their share from the log-normal fit of `w`).
pub fn burst_tokens(sums: &SecondSums, w: &Workload, longest: f64, budget: f64) -> Option<f64> {
    if w.mean_prompt_tokens <= 0.0 {
        return None;
    }
    sums.excess_share(0.0)?;
    let unfixable = prompt_excess_tokens(w, longest) / w.mean_prompt_tokens;
    let late = |c: f64| sums.excess_share(c).unwrap_or(0.0) - unfixable;
    let (mut lo, mut hi) = (0.0, sums.sum.max(1.0));
    if late(lo) <= budget {
        return Some(0.0);
    }
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if late(mid) <= budget {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// Sequences running on one replica receiving `rate` requests/s of workload `w` (Little's law
/// with the step-time model), or `None` if the replica cannot keep up at that rate.
pub fn batch_at_rate(v: &Variant, w: &Workload, rate: f64) -> Option<f64> {
    let alpha = v.perf.itl_alpha_ms / 1000.0;
    let beta = v.perf.itl_beta_ms / 1000.0;
    let out = w.mean_output_tokens.max(1.0);
    let share = 1.0 - rate * w.mean_prompt_tokens / v.perf.prefill_tokens_per_s;
    let denom = share - rate * out * beta;
    (share > 0.0 && denom > 0.0).then(|| rate * out * alpha / denom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Profile;

    fn slo() -> Slo {
        Slo {
            ttft_p99_s: 2.0,
            tpot_p99_s: 0.1,
        }
    }

    #[test]
    fn batch_at_tpot_is_the_largest_batch_whose_itl_meets_it_bounded_by_kv() {
        let p = Profile::load("llama-3-8b").unwrap();
        let h100 = p.variant("nvidia-h100-80gb").unwrap();
        let short = Workload::uniform(100.0, 100.0);
        // (12.7 − 4.56) / 0.0407 = 200.0: the NIM point itself.
        let b = batch_at_tpot(h100, &short, 0.0127);
        assert_eq!(b, 200.0);
        assert!(h100.itl_s(b) <= 0.0127 + 1e-12 && h100.itl_s(b + 1.0) > 0.0127);
        // Long sequences: 460,000 KV tokens / 20,000 per sequence = 23.
        let long = Workload::uniform(19_000.0, 1_000.0);
        assert_eq!(batch_at_tpot(h100, &long, 0.1), 23.0);
        // Below α no batch meets it.
        assert_eq!(batch_at_tpot(h100, &short, 0.004), 0.0);
    }

    /// Moments added, summed and taken away give the lengths' mean and spread: 100 and 300
    /// have mean 200 and cv² (100² + 300²) / 2 / 200² − 1 = 0.25.
    #[test]
    fn moments_give_the_mean_and_spread_of_what_they_hold() {
        let (mut a, mut b) = (Moments::default(), Moments::default());
        a.add(100);
        b.add(300);
        b.add(7);
        b.remove(7);
        let both: Moments = [a, b].into_iter().sum();
        assert_eq!(
            both,
            Moments {
                sum: 400.0,
                sum_sq: 100_000.0
            }
        );
        assert!((both.cv2(2.0) - 0.25).abs() < 1e-12);
        let w = Workload::from_moments(2.0, &both, &a);
        assert_eq!((w.mean_prompt_tokens, w.mean_output_tokens), (200.0, 50.0));
        assert!((w.prompt_cv2 - 0.25).abs() < 1e-12);
        // One length has no spread.
        assert_eq!(a.cv2(1.0), 0.0);
    }

    /// Outputs as spread as an exponential's (cv² 1): the sequences running at once have
    /// twice the mean output on average (a sequence runs for as long as its output), so the
    /// KV cache holds 460,000 / (1,000 + 2 × 9,500) = 23 of them, not 460,000 / 10,500 = 43;
    /// and one replica serves proportionally fewer requests.
    #[test]
    fn kv_holds_fewer_sequences_when_outputs_are_spread() {
        let p = Profile::load("llama-3-8b").unwrap();
        let h100 = p.variant("nvidia-h100-80gb").unwrap();
        let equal = Workload::uniform(1_000.0, 9_500.0);
        let spread = Workload {
            output_cv2: 1.0,
            ..equal
        };
        assert_eq!(batch_at_tpot(h100, &equal, 0.1), 43.0);
        assert_eq!(batch_at_tpot(h100, &spread, 0.1), 23.0);
        let plan = Planning::default();
        let (a, b) = (
            at_slo(h100, &equal, &slo(), &plan),
            at_slo(h100, &spread, &slo(), &plan),
        );
        assert_eq!((a.bound, b.bound), (Bound::KvCache, Bound::KvCache));
        // 23 sequences of 43, each step a little shorter: 0.43 req/s of 0.70.
        assert!(b.requests_per_s < 0.65 * a.requests_per_s, "{a:?} {b:?}");
    }

    #[test]
    fn capacity_meets_its_own_targets_and_names_the_binding_constraint() {
        let p = Profile::load("llama-3-8b").unwrap();
        let plan = Planning::default();
        let w = Workload::uniform(1000.0, 200.0);
        // An L4's decode step alone (α = 51 ms) exceeds the mean TPOT planned for a 100 ms p99.
        let l4 = p.variant("nvidia-l4").unwrap();
        assert_eq!(at_slo(l4, &w, &slo(), &plan).bound, Bound::Ineligible);
        for v in p.variants.iter().filter(|v| v.name != "nvidia-l4") {
            let c = at_slo(v, &w, &slo(), &plan);
            assert!(c.requests_per_s > 0.0, "{}", v.name);
            assert!(
                c.tpot_s <= slo().tpot_p99_s * plan.tpot_share + 1e-9,
                "{}: {c:?}",
                v.name
            );
            // Little's law and the step-time model agree at the answer.
            let u = c.requests_per_s * w.mean_prompt_tokens / v.perf.prefill_tokens_per_s;
            let step = v.itl_s(c.batch) / (1.0 - u);
            assert!((step - c.tpot_s).abs() < 1e-9);
            assert!((c.batch - c.requests_per_s * w.mean_output_tokens * c.tpot_s).abs() < 1e-6);
        }
        // Closed form for the H100, TPOT-bound: (T − α) / (T · (P/R + β·O)).
        let h = p.variant("nvidia-h100-80gb").unwrap();
        let c = at_slo(h, &w, &slo(), &plan);
        let t = 0.05;
        let expect = (t - 0.00456) / (t * (1000.0 / 24000.0 + 0.0000407 * 200.0));
        assert_eq!(c.bound, Bound::Tpot);
        assert!((c.requests_per_s - expect).abs() < 1e-9);
        // In flight grows steeply near capacity: at 70 % of the rate, well under 70 % of the batch.
        let b70 = batch_at_rate(h, &w, 0.7 * c.requests_per_s).unwrap();
        assert!(b70 < 0.5 * c.batch, "{b70} vs {}", c.batch);
        assert!((batch_at_rate(h, &w, c.requests_per_s).unwrap() - c.batch).abs() < 1e-6);
        assert_eq!(batch_at_rate(h, &w, 1e6), None);
        // At a 200 ms TPOT SLO the L4 qualifies (a decode behind a full 256-token prefill chunk
        // takes ~136 ms), and gives less per replica.
        let loose = Slo {
            ttft_p99_s: 2.0,
            tpot_p99_s: 0.2,
        };
        let cl4 = at_slo(l4, &w, &loose, &plan);
        assert!(
            cl4.requests_per_s > 0.0
                && cl4.requests_per_s < at_slo(h, &w, &loose, &plan).requests_per_s
        );
    }

    #[test]
    fn slow_prefill_makes_a_variant_ineligible_and_long_prompts_bind_prefill() {
        let p = Profile::load("llama-3-8b").unwrap();
        let plan = Planning::default();
        let long = Workload::uniform(15_000.0, 150.0);
        let l4 = p.variant("nvidia-l4").unwrap();
        assert_eq!(at_slo(l4, &long, &slo(), &plan).bound, Bound::Ineligible);
        let h = p.variant("nvidia-h100-80gb").unwrap();
        let c = at_slo(h, &long, &slo(), &plan);
        assert_eq!(c.bound, Bound::Prefill);
        // Variable prompts queue longer for prefill (Pollaczek–Khinchine): less capacity.
        let variable = Workload {
            prompt_cv2: 3.0,
            ..long
        };
        let cv = at_slo(h, &variable, &slo(), &plan);
        assert!(cv.requests_per_s < c.requests_per_s, "{cv:?} vs {c:?}");
        // Prefill utilisation stays below one, so the prompt queue is stable.
        assert!(c.requests_per_s * 15_000.0 / 24_000.0 < 1.0);
    }

    #[test]
    fn sized_for_tpot_only_prefill_is_still_planned_at_half_utilisation() {
        let p = Profile::load("llama-3-8b").unwrap();
        let a100 = p.variant("nvidia-a100-80gb").unwrap();
        let long = Workload::uniform(24_000.0, 40.0);
        assert_eq!(
            at_slo(a100, &long, &slo(), &Planning::default()).bound,
            Bound::Ineligible
        );
        let relaxed = Planning {
            ttft_share: f64::INFINITY,
            ..Planning::default()
        };
        let c = at_slo(a100, &long, &slo(), &relaxed);
        assert_eq!(c.bound, Bound::Prefill);
        let utilisation = c.requests_per_s * 24_000.0 / a100.perf.prefill_tokens_per_s;
        assert!(
            (utilisation - MIN_PREFILL_UTILISATION).abs() < 1e-9,
            "{utilisation}"
        );
    }

    #[test]
    fn ineligibility_names_what_rules_a_variant_out_and_at_slo_agrees() {
        let p = Profile::load("llama-3-8b").unwrap();
        let plan = Planning::default();
        let l4 = p.variant("nvidia-l4").unwrap();
        let h100 = p.variant("nvidia-h100-80gb").unwrap();
        let w = Workload::uniform(1000.0, 200.0);
        let slo_at = |ttft_p99_s, tpot_p99_s| Slo {
            ttft_p99_s,
            tpot_p99_s,
        };
        // An L4's 51 ms step against a 100 ms p99 planned at half.
        assert!(matches!(
            ineligibility(l4, &w, &slo(), &plan),
            Some(Ineligibility::DecodeStep { .. })
        ));
        // An H100 behind a 2048-token chunk: 4.6 + 85 ms, over 60 ms.
        let i = ineligibility(h100, &w, &slo_at(2.0, 0.06), &plan).unwrap();
        assert!(
            matches!(i, Ineligibility::ChunkStep { chunk: 2048, .. }),
            "{i}"
        );
        assert!(i.to_string().contains("2048-token prefill chunk"), "{i}");
        // 15k-token prompts on an L4: 5 s of prefill against a 1 s budget.
        let long = Workload::uniform(15_000.0, 100.0);
        assert!(matches!(
            ineligibility(l4, &long, &slo_at(2.0, 0.2), &plan),
            Some(Ineligibility::Prefill { .. })
        ));
        // Sequences longer than an L4's KV cache, with the TTFT target out of the way.
        let huge = Workload::uniform(45_000.0, 100.0);
        assert!(matches!(
            ineligibility(l4, &huge, &slo_at(60.0, 0.2), &plan),
            Some(Ineligibility::Kv { .. })
        ));
        // One owner: at_slo rules out exactly what ineligibility names, over a grid.
        for v in &p.variants {
            for prompt in [100.0, 1000.0, 8000.0, 30_000.0, 200_000.0] {
                for (ttft, tpot) in [(0.5, 0.05), (2.0, 0.1), (2.0, 0.2), (8.0, 1.0)] {
                    let w = Workload::uniform(prompt, 250.0);
                    let s = slo_at(ttft, tpot);
                    let out = at_slo(v, &w, &s, &plan).bound == Bound::Ineligible;
                    let why = ineligibility(v, &w, &s, &plan);
                    assert_eq!(
                        out,
                        why.is_some(),
                        "{} {prompt} {ttft} {tpot}: {why:?}",
                        v.name
                    );
                }
            }
        }
    }

    #[test]
    fn prompt_excess_matches_its_definition() {
        // Equal prompts: the excess is plain arithmetic.
        let equal = Workload::uniform(1000.0, 10.0);
        assert_eq!(prompt_excess_tokens(&equal, 600.0), 400.0);
        assert_eq!(prompt_excess_tokens(&equal, 1500.0), 0.0);
        // Log-normal: against a numerical integral of (p − k)⁺ over the density.
        let w = Workload {
            prompt_cv2: 2.25,
            ..Workload::uniform(9000.0, 300.0)
        };
        let s2 = (1.0f64 + 2.25).ln();
        let mu = 9000f64.ln() - s2 / 2.0;
        let k: f64 = 30_000.0;
        let (mut integral, steps) = (0.0, 200_000);
        let (lo, hi) = (k.ln(), mu + 12.0 * s2.sqrt());
        let dx = (hi - lo) / f64::from(steps);
        for i in 0..steps {
            let x = lo + (f64::from(i) + 0.5) * dx;
            let density =
                (-(x - mu).powi(2) / (2.0 * s2)).exp() / (2.0 * std::f64::consts::PI * s2).sqrt();
            integral += (x.exp() - k) * density * dx;
        }
        let e = prompt_excess_tokens(&w, k);
        assert!((e - integral).abs() < 1e-3 * integral, "{e} vs {integral}");
        // Everything is excess over zero; a heavier tail has more beyond the same point.
        assert!((prompt_excess_tokens(&w, 0.0) - 9000.0).abs() < 1e-9);
        let lighter = Workload {
            prompt_cv2: 0.5,
            ..w
        };
        assert!(prompt_excess_tokens(&lighter, k) < e);
    }

    #[test]
    fn prompt_share_beyond_is_the_fitted_tail_and_slow_prefill_leaves_it_late() {
        // Equal prompts: all or nothing.
        let equal = Workload::uniform(1000.0, 10.0);
        assert_eq!(prompt_share_beyond(&equal, 600.0), 1.0);
        assert_eq!(prompt_share_beyond(&equal, 1500.0), 0.0);
        // Log-normal: half the prompts lie beyond the median, m / √(1 + cv²); one standard
        // deviation of the logarithm above it, 15.87 %.
        let w = Workload {
            prompt_cv2: 0.9,
            ..Workload::uniform(1100.0, 250.0)
        };
        let median = 1100.0 / 1.9f64.sqrt();
        assert!((prompt_share_beyond(&w, median) - 0.5).abs() < 1e-12);
        let one_sigma = median * 1.9f64.ln().sqrt().exp();
        assert!((prompt_share_beyond(&w, one_sigma) - 0.158_655).abs() < 1e-5);
        assert_eq!(prompt_share_beyond(&w, 0.0), 1.0);
        // An idle L4 prefills ~3,760 tokens within 2 s (256-token chunks, 51 ms a step plus
        // the chunk at 3k tokens/s): a few percent of conversation prompts are longer, and no
        // number of L4s serves them in time. An H100 prefills ~45k.
        let p = Profile::load("llama-3-8b").unwrap();
        let l4 = p.variant("nvidia-l4").unwrap();
        let h100 = p.variant("nvidia-h100-80gb").unwrap();
        let late = slow_prompt_share(l4, &w, &slo());
        assert!((0.02..0.05).contains(&late), "{late}");
        assert!(slow_prompt_share(h100, &w, &slo()) < 1e-6);
        let k = l4.longest_prompt_within(slo().ttft_p99_s);
        assert!((l4.alone_ttft_s(k) - slo().ttft_p99_s).abs() < 1e-9);
        assert_eq!(late, prompt_share_beyond(&w, k));
    }

    #[test]
    fn a_heavy_prompt_tail_wants_a_second_replica_where_the_mean_does_not() {
        let p = Profile::load("llama-3-8b").unwrap();
        let h = p.variant("nvidia-h100-80gb").unwrap();
        let heavy = Workload {
            prompt_cv2: 2.25,
            ..Workload::uniform(9000.0, 300.0)
        };
        // Half a request a second is a fifth of one H100's prefill, well inside its
        // mean-based capacity...
        let c = at_slo(h, &heavy, &slo(), &Planning::default());
        assert!(c.requests_per_s > 1.0, "{c:?}");
        // ...but prompts of tens of thousands of tokens block it too often for a p99.
        assert_eq!(tail_replicas(h, &heavy, &slo(), 0.5, 0.005, 10), Some(2));
        // A lighter load, a looser budget or equal prompts need no more than the rate does.
        assert_eq!(tail_replicas(h, &heavy, &slo(), 0.05, 0.005, 10), None);
        assert_eq!(tail_replicas(h, &heavy, &slo(), 0.5, 0.05, 10), None);
        let equal = Workload::uniform(9000.0, 300.0);
        assert_eq!(tail_replicas(h, &equal, &slo(), 0.5, 0.005, 10), None);
        // Conversation-sized prompts never bind, even heavy-tailed and busy: past one H100's
        // prefill (24 req/s of 1,100 tokens) two are needed for the rate, not for the tail.
        let chat = Workload {
            prompt_cv2: 1.5,
            ..Workload::uniform(1100.0, 250.0)
        };
        assert_eq!(tail_replicas(h, &chat, &slo(), 15.0, 0.005, 10), None);
        assert_eq!(tail_replicas(h, &chat, &slo(), 30.0, 0.005, 10), None);
        // More load wants more replicas, within the bound given.
        assert_eq!(tail_replicas(h, &heavy, &slo(), 2.0, 0.005, 10), Some(2));
        assert_eq!(tail_replicas(h, &heavy, &slo(), 0.5, 1e-12, 3), Some(3));
    }

    /// Seconds of `steady` tokens each, and `batches` seconds of `batch` tokens, in buckets
    /// whose bounds are the values themselves (so the spread within a bucket is nil).
    fn seconds(steady: (f64, f64), batches: (f64, f64)) -> SecondSums {
        let ((n, x), (m, b)) = (steady, batches);
        SecondSums {
            buckets: vec![(x, n), (b * 0.999, n), (b, n + m), (f64::INFINITY, n + m)],
            sum: n * x + m * b,
        }
    }

    #[test]
    fn batches_within_a_second_want_the_prefill_that_takes_them_within_the_target() {
        let chat = Workload::uniform(2000.0, 30.0);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1.0);
        // 400 seconds of 4,000 tokens and ten batches of ~120,000 (2.8 M in all; the batches
        // spread evenly over their bucket, mean 119,940): 0.5 % is 14,000 tokens, 1,400 of
        // each batch, so the fleet must prefill 118,540 within the target; at 5 %, 105,940.
        let bursty = seconds((400.0, 4000.0), (10.0, 120_000.0));
        assert!(close(
            burst_tokens(&bursty, &chat, 48_000.0, 0.005),
            118_540.0
        ));
        assert!(close(
            burst_tokens(&bursty, &chat, 48_000.0, 0.05),
            105_940.0
        ));
        // Steady seconds alone (spread evenly over (0, 4000]) want 3,600: 0.5 % of 1.6 M is
        // 8,000, 400 · 400² / 8,000. Nothing measured, nothing asked.
        let steady = seconds((400.0, 4000.0), (0.0, 40_000.0));
        assert!(close(burst_tokens(&steady, &chat, 48_000.0, 0.005), 3600.0));
        let none = SecondSums::default();
        assert_eq!(burst_tokens(&none, &chat, 48_000.0, 0.005), None);
        // Prompts no replica prefills within the target are late however large the fleet:
        // their excess is not asked of it. Log-normal prompts of mean 9k and cv² 4 have 11 %
        // of their tokens beyond 48k, so the same seconds want what leaves 11.5 % late.
        let long = Workload {
            prompt_cv2: 4.0,
            ..Workload::uniform(9000.0, 300.0)
        };
        let unfixable = prompt_excess_tokens(&long, 48_000.0) / 9000.0;
        assert!((unfixable - 0.111).abs() < 0.002, "{unfixable}");
        let need = burst_tokens(&bursty, &long, 48_000.0, 0.005).unwrap();
        let late = bursty.excess_share(need).unwrap();
        assert!((late - unfixable - 0.005).abs() < 1e-6, "{need} {late}");
    }
}

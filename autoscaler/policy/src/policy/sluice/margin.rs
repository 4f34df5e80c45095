//! The latency margins: the planning margin widened while first tokens are late and narrowed
//! back once they are in time with steps within their target, and each variant's capacity
//! discounted while its own replicas breach the SLO.

use super::Sluice;
use crate::decision::{Decision, ReasonKind};
use crate::signals::Signals;

impl Sluice {
    /// Widens the demand margin while first tokens are late with requests queued (too little
    /// capacity overall), or while fewer feasible first tokens than the SLO's share come in
    /// time with none queued (long prompts ahead of short ones in the replicas' own prefill),
    /// and narrows it back once first tokens are in time with room (or at the attainment
    /// goal) and steps within the TPOT target. It does not widen while replicas are
    /// starting: capacity is already on its way, and integrating the error meanwhile would
    /// order more that arrives after the spike (anti-windup); nor while the latency window
    /// still holds first tokens of the backlog replicas just come up found ([`Arrived`]).
    /// A variant whose own replicas decode slower than the TPOT SLO has its capacity
    /// discounted instead (they are loaded past what they serve well): more of every variant
    /// would not fix it, fewer requests per replica of that one does. So does one whose first
    /// tokens are late with nothing queued while another variant prefills faster.
    pub(super) fn update_margin(&mut self, s: &Signals, d: &mut Decision) {
        let slo = self.config.slo;
        for l in &self.config.limits {
            let worst = |f: fn(&crate::signals::VariantSignals) -> Option<f64>| {
                s.variants
                    .iter()
                    .filter(|v| v.variant == l.variant)
                    .filter_map(f)
                    .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))))
            };
            let tpot = worst(|v| v.tpot_p99_s);
            let ttft = worst(|v| v.ttft_p99_s);
            // Late first tokens mostly come from the shared queue, which the demand margin
            // below answers. With nothing queued they come from the variant's own prefill and
            // steps: attributed to it when another variant prefills faster, so that load moves
            // there (more replicas of the same variant would not make its prompts faster).
            let own_ttft = s.queue.waiting == 0
                && ttft.is_some_and(|x| x > slo.ttft_p99_s)
                && self.faster_prefill_exists(&l.variant);
            let m = self.variant_margin.entry(l.variant.clone()).or_insert(1.0);
            if tpot.is_some_and(|x| x > slo.tpot_p99_s) || own_ttft {
                *m = (*m * 1.1).min(self.config.max_margin);
                d.reason(
                    ReasonKind::LatencyBreach,
                    Some(&l.variant),
                    format!(
                        "TTFT p99 {:.2}s, TPOT p99 {:.0}ms: capacity per replica ÷{:.2}",
                        ttft.unwrap_or(0.0),
                        tpot.unwrap_or(0.0) * 1e3,
                        *m
                    ),
                );
            } else if tpot.is_some_and(|x| x < 0.8 * slo.tpot_p99_s)
                && ttft.is_none_or(|x| x < 0.8 * slo.ttft_p99_s)
            {
                *m = (*m * 0.97).max(1.0);
            }
        }
        let l = &s.latency;
        let before_arrivals = self.arrivals.still_showing(s);
        let arriving = s.variants.iter().any(|v| v.starting + v.pending > 0) || before_arrivals;
        // Fleet-wide, first tokens are late either behind a queue at the gateway or, with
        // none, behind long prompts in the replicas' own prefill: a p99 cannot tell the
        // latter from the prompts no fleet serves in time, the attainment over feasible
        // requests can. Both want less load per replica; capacity on its way is the answer
        // already given.
        let goal = self.config.ttft_attainment_goal;
        let queued_late = l.ttft_p99_s.is_some_and(|x| x > slo.ttft_p99_s) && s.queue.waiting > 0;
        let missing = l.ttft_attainment.is_some_and(|a| a < goal);
        let ttft_high = (queued_late || missing) && !arriving;
        let ttft_met = l.ttft_p99_s.is_some_and(|x| x < 0.8 * slo.ttft_p99_s)
            || l.ttft_attainment.is_some_and(|a| a >= goal);
        // This margin answers first tokens: it narrows once they are in time, while steps
        // are within their target. A TPOT p99 near the target is no reason to keep it: decode
        // steps behind full prefill chunks (every step, under code-sized prompts) keep it there
        // whatever the fleet.
        let low = l.tpot_p99_s.is_some_and(|x| x <= slo.tpot_p99_s) && ttft_met;
        if ttft_high {
            self.margin = (self.margin * 1.1).min(self.config.max_margin);
            d.reason(
                ReasonKind::LatencyBreach,
                None,
                format!(
                    "TTFT p99 {:.2}s ({:.1} % of feasible first tokens in time), TPOT p99 \
                     {:.0}ms over the SLO: planning margin ×{:.2}",
                    l.ttft_p99_s.unwrap_or(0.0),
                    l.ttft_attainment.unwrap_or(1.0) * 100.0,
                    l.tpot_p99_s.unwrap_or(0.0) * 1e3,
                    self.margin
                ),
            );
        } else if low {
            self.margin = (self.margin * 0.97).max(1.0);
        }
    }

    /// Whether another limited variant prefills faster than `variant`.
    fn faster_prefill_exists(&self, variant: &str) -> bool {
        let prefill = |n: &str| {
            self.profile
                .variant(n)
                .map_or(0.0, |v| v.perf.prefill_tokens_per_s)
        };
        let own = prefill(variant);
        self.config.limits.iter().any(|o| prefill(&o.variant) > own)
    }
}

/// When replicas last came up, and when the backlog from before them was drained.
#[derive(Debug, Clone, Copy)]
pub(super) struct Arrived {
    ready: u32,
    at_s: f64,
    drained_s: Option<f64>,
}

impl Default for Arrived {
    fn default() -> Self {
        Arrived {
            ready: 0,
            at_s: f64::NEG_INFINITY,
            drained_s: Some(f64::NEG_INFINITY),
        }
    }
}

impl Arrived {
    /// Whether the latency window still shows the time before the last replicas came up:
    /// until a window after the backlog they found drained (a window after they came up at
    /// most, so a fleet that never drains it still widens the margin).
    fn still_showing(&mut self, s: &Signals) -> bool {
        let t = s.time_s;
        let window = s.latency.window_s;
        let ready: u32 = s.variants.iter().map(|v| v.ready).sum();
        if ready > self.ready {
            self.at_s = t;
            self.drained_s = None;
        }
        self.ready = ready;
        if self.drained_s.is_none() && (s.queue.waiting == 0 || t - self.at_s >= window) {
            self.drained_s = Some(t);
        }
        self.drained_s.is_none_or(|d| t - d < window)
    }
}

//! The prompt floors: demand raised so that few first tokens are late behind a long prompt
//! (the prompt-length tail) or a burst of prompts within a second, whatever the rate asks.

use super::{Planned, Sluice};
use crate::capacity::{self, Capacity, Workload};
use crate::decision::{Decision, ReasonKind};
use crate::mix::Offer;
use crate::policy::plan::VariantLimits;
use crate::profile::{CapacityType, Variant};
use crate::signals::{Signals, SHAPE_WINDOW_S};

/// A crowd: a panic in which the long window's rate reached [`CROWD_RATE_RATIO`] times what
/// it was before. Its seconds are a rate, not prompts sent within a second, but in the
/// per-second sums they look the same, and they stay there for the sums' window after it.
pub(super) const CROWD_RATE_RATIO: f64 = 4.0;

/// What [`Sluice::note_crowd`] keeps.
#[derive(Debug, Clone, Copy)]
pub(super) struct Crowd {
    /// The long window's rate on the last tick outside panic.
    calm_rate: f64,
    /// Until when the last crowd's seconds are in the per-second sums.
    until_s: f64,
}

impl Default for Crowd {
    fn default() -> Self {
        Crowd {
            calm_rate: 0.0,
            until_s: f64::NEG_INFINITY,
        }
    }
}

/// What the bursts within a second ask of the fleet (see [`Sluice::burst_need`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct BurstNeed {
    /// Prompt tokens to prefill within the TTFT target.
    tokens: f64,
    /// The same as requests/s of the shape.
    rate: f64,
}

impl Sluice {
    /// Notes a crowd ([`CROWD_RATE_RATIO`]): the burst floor then reads no per-second sums
    /// until the crowd's seconds have left their window. Panic and the rate answer a crowd
    /// while it lasts; the floor, reading its seconds as bursts within a second, ordered a
    /// prefill for them that came a start-up later and was held a window more (flash-crowd:
    /// five H100s for 15 req/s through the ten minutes after the crowd). A rate seen before
    /// any traffic (zero) makes no crowd: a first burst of traffic is not one.
    pub(super) fn note_crowd(&mut self, s: &Signals, panic: bool) {
        let rate = s.arrivals.requests_per_s;
        if !panic {
            self.crowd.calm_rate = rate;
        } else if self.crowd.calm_rate > 0.0 && rate > CROWD_RATE_RATIO * self.crowd.calm_rate {
            let window = s
                .arrivals
                .wide
                .as_ref()
                .map_or(SHAPE_WINDOW_S, |w| w.window_s);
            self.crowd.until_s = s.time_s + window;
        }
    }

    /// `planned`, raised to the floor the prompt-length tail sets: the capacity of as many
    /// replicas of an eligible variant as keep first tokens stuck behind long prompts within
    /// half the SLO's error budget at `rate` (see [`capacity::tail_replicas`]), of the variant
    /// whose floor is lowest; none where the rate alone sets some variant's count. The floor
    /// is those replicas' whole capacity, so the headroom on top is theirs.
    fn tail_floor(
        &self,
        limits: &[VariantLimits],
        caps: &[Capacity],
        w: &Workload,
        rate: f64,
        planned: f64,
        d: &mut Decision,
    ) -> f64 {
        let budget = self.half_error_budget();
        let floors = limits.iter().zip(caps).filter_map(|(l, c)| {
            let v = self.profile.variant(&l.variant).ok()?;
            (c.requests_per_s > 0.0).then(|| {
                let n = capacity::tail_replicas(v, w, &self.config.slo, rate, budget, l.max);
                let n = n.unwrap_or(0);
                (f64::from(n) * c.requests_per_s, n, &l.variant)
            })
        });
        let Some((floor, n, variant)) = floors.min_by(|a, b| a.0.total_cmp(&b.0)) else {
            return planned;
        };
        if floor > planned {
            d.reason(
                ReasonKind::PromptTail,
                Some(variant),
                format!(
                    "prompts of {:.0} tokens on average (cv² {:.2}) at {rate:.2} req/s: {n} \
                     replicas, so that few first tokens wait behind a long one",
                    w.mean_prompt_tokens, w.prompt_cv2
                ),
            );
        }
        floor.max(planned)
    }

    /// Raises `p.planned` to the prompt floors (the tail's, [`Self::tail_floor`]; the
    /// bursts', [`Self::burst_need`]) and tells the zero rule what they planned, so a pool
    /// kept warm for its traffic's return keeps them too. The bursts' need, for topping up
    /// prefill after the mix.
    pub(super) fn prompt_floors(
        &mut self,
        s: &Signals,
        (limits, caps): (&[VariantLimits], &[Capacity]),
        w: &Workload,
        p: &mut Planned,
        d: &mut Decision,
    ) -> Option<BurstNeed> {
        let before = p.planned;
        let rate = s.arrivals.requests_per_s.max(p.forecast);
        p.planned = self.tail_floor(limits, caps, w, rate, p.planned, d);
        let crowd_seconds = s.time_s < self.crowd.until_s;
        let burst = (!crowd_seconds)
            .then(|| self.burst_need(s, (limits, caps), w))
            .flatten();
        if let Some(b) = burst.as_ref().filter(|b| b.rate > p.planned) {
            p.planned = b.rate;
            d.reason(
                ReasonKind::Burst,
                None,
                format!(
                    "prompts arriving within a second: {:.0} tokens to prefill within the \
                     TTFT target, {:.2} req/s of the shape",
                    b.tokens, b.rate
                ),
            );
        }
        if let Some(z) = self.zero.as_mut() {
            let floor = if p.planned > before { p.planned } else { 0.0 };
            z.observe_floor(s.time_s, s.arrivals.window_s, floor);
        }
        burst
    }

    /// The share of first tokens each prompt floor (the tail's, the bursts') may leave late:
    /// half the SLO's error budget.
    fn half_error_budget(&self) -> f64 {
        (1.0 - self.config.ttft_attainment_goal).max(0.0) / 2.0
    }

    /// Prompt tokens one replica of `v` prefills within the TTFT target.
    fn prefill_within_target(&self, v: &Variant) -> f64 {
        v.perf.prefill_tokens_per_s * self.config.slo.ttft_p99_s
    }

    /// What the bursts of the shape window ask ([`capacity::burst_tokens`], to half the SLO's
    /// error budget): the prompt tokens the fleet must prefill within the TTFT target, and
    /// that prefill as requests/s of the eligible variant that serves the most requests per
    /// prefill token (the fewest any mix with that prefill serves). Prompts are whole: those
    /// longer than one replica of the variant whose prefill costs least prefills within the
    /// target (what the fleet grows by) are late however many there are. `None` without the
    /// signal.
    fn burst_need(
        &self,
        s: &Signals,
        (limits, caps): (&[VariantLimits], &[Capacity]),
        w: &Workload,
    ) -> Option<BurstNeed> {
        let sums = s.arrivals.per_second.as_ref()?;
        let budget = self.half_error_budget();
        // (prefill within the target, requests/s, price per hour) per eligible variant.
        let eligible: Vec<(f64, f64, f64)> = limits
            .iter()
            .zip(caps)
            .filter(|(_, c)| c.requests_per_s > 0.0)
            .filter_map(|(l, c)| {
                let v = self.profile.variant(&l.variant).ok()?;
                let price = v.replica_price_per_hour(CapacityType::OnDemand);
                Some((self.prefill_within_target(v), c.requests_per_s, price))
            })
            .filter(|&(prefill, _, _)| prefill > 0.0)
            .collect();
        let cheapest = eligible
            .iter()
            .min_by(|a, b| (a.2 / a.0).total_cmp(&(b.2 / b.0)))?;
        let tokens = capacity::burst_tokens(sums, w, cheapest.0, budget)?;
        let per_token = eligible
            .iter()
            .map(|&(p, c, _)| c / p)
            .fold(f64::INFINITY, f64::min);
        per_token.is_finite().then_some(BurstNeed {
            tokens,
            rate: tokens * per_token,
        })
    }

    /// Replicas added to `counts` until the fleet prefills `need.tokens` within the TTFT
    /// target: of the variant already in the mix (else any eligible one) whose prefill costs
    /// least per hour. A mix sized in requests/s may lack it where variants differ in prefill
    /// per request served.
    pub(super) fn top_up_prefill(
        &self,
        offers: &[Offer],
        counts: &mut [u32],
        need: &BurstNeed,
        d: &mut Decision,
    ) {
        let prefill: Vec<f64> = offers
            .iter()
            .map(|o| match self.profile.variant(&o.variant) {
                Ok(v) if o.requests_per_s > 0.0 => self.prefill_within_target(v),
                _ => 0.0,
            })
            .collect();
        let have = |counts: &[u32]| -> f64 {
            counts
                .iter()
                .zip(&prefill)
                .map(|(&n, p)| f64::from(n) * p)
                .sum()
        };
        let mut added = 0;
        while have(counts) < need.tokens {
            let key = |i: usize| (counts[i] == 0, offers[i].price_per_hour / prefill[i]);
            let pick = (0..offers.len())
                .filter(|&i| prefill[i] > 0.0 && counts[i] < offers[i].max)
                .min_by(|&i, &j| {
                    let (a, b) = (key(i), key(j));
                    a.0.cmp(&b.0).then(a.1.total_cmp(&b.1))
                });
            let Some(i) = pick else { break };
            counts[i] += 1;
            added += 1;
        }
        if added > 0 {
            d.reason(
                ReasonKind::Burst,
                None,
                format!(
                    "+{added} replicas: the mix for the rate prefills less than the {:.0} \
                     prompt tokens a second's burst asks within the TTFT target",
                    need.tokens
                ),
            );
        }
    }
}

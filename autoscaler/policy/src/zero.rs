//! Whether an idle model may go to zero replicas without spending more than its SLO allows.
//!
//! Going to zero saves the idle replicas' cost; the price is a cold start for whoever comes
//! next. On GPUs a cold start (a node, an image pull, weights loaded) takes minutes, and every
//! request arriving in it waits past a TTFT target of seconds: one cold start can miss more
//! requests than a p99 SLO allows in hours. Knative's and KEDA's scale to zero count only
//! idle time. Under [`ZeroRule::ErrorBudget`] sluice also counts the SLO: the pool goes to
//! zero only when the requests the next cold start is expected to miss, with those already
//! reserved by earlier cold starts, fit the error budget of the requests served over a
//! horizon (1 % of them for a p99 SLO). A long idle night after a busy day fits; twenty idle
//! minutes between sessions at the same rate never do, and the pool stays warm.
//!
//! The expected misses are the rate traffic last came at (its recent peak: see
//! [`PEAK_MEMORY_S`]) times the
//! part of the start-up that overruns the TTFT target: arrivals in its last TTFT seconds
//! still get their first token in time. When zero does not fit, the pool keeps capacity for
//! the rate its traffic returns at: a pool whose sessions come at 15 req/s keeps 15 req/s of
//! replicas, not one replica a session would swamp; or the demand its prompt floors planned
//! while traffic came, where more (bursts that need more prefill than the rate at a tight
//! TTFT target). Nothing in between: with less than the returning rate a
//! first-come-first-served queue grows until every later arrival waits past the target, so a
//! partial fleet misses nearly as much as none. Counts decay exponentially over the horizon,
//! so the budget is a rolling one.

use serde::{Deserialize, Serialize};

/// When an idle model's floors fall from `keep_warm` to `min` (see
/// [`VariantLimits`](crate::policy::plan::VariantLimits)).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", tag = "rule")]
pub enum ZeroRule {
    /// After the scale-to-zero delay without traffic, whatever the cold start costs.
    #[default]
    Idle,
    /// After the delay, and only when the next cold start fits the SLO's error budget:
    /// `miss_share` (0.01 for a p99 target) of the requests served over `horizon_s`.
    /// Otherwise the pool keeps the capacity its traffic's return needs beyond what the
    /// budget absorbs, even where `keep_warm` is 0.
    ErrorBudget { horizon_s: f64, miss_share: f64 },
}

impl ZeroRule {
    /// The counts the rule reads, if it reads any.
    pub fn budget(self) -> Option<ZeroBudget> {
        match self {
            ZeroRule::Idle => None,
            ZeroRule::ErrorBudget {
                horizon_s,
                miss_share,
            } => Some(ZeroBudget::new(horizon_s, miss_share)),
        }
    }

    /// The error-budget rule over a day, for a p99 SLO.
    pub const P99_DAY: ZeroRule = ZeroRule::ErrorBudget {
        horizon_s: 86_400.0,
        miss_share: 0.01,
    };
}

/// While traffic comes, the wake rate is the highest windowed rate seen, fading over this
/// many seconds so that an evening's trickle replaces the day's peak; while idle it holds.
/// A peak rather than a mean: the windowed rate understates a session while its window fills
/// and empties, and a pool kept for less than its traffic's return is swamped by it.
pub const PEAK_MEMORY_S: f64 = 600.0;

/// The rolling counts the error-budget rule reads.
#[derive(Debug, Clone, Default)]
pub struct ZeroBudget {
    horizon_s: f64,
    miss_share: f64,
    last_s: Option<f64>,
    /// Requests served, decayed over the horizon.
    served: f64,
    /// Misses reserved by cold starts taken, decayed over the horizon.
    spent: f64,
    /// The rate traffic is expected back at (see [`PEAK_MEMORY_S`]).
    wake_rate: f64,
    /// The demand the prompt floors planned while traffic came (the prompt tail's, the
    /// bursts'), remembered as `wake_rate` is: traffic that needed them returns needing them.
    wake_floor: f64,
    /// A cold start is reserved for the idle period under way.
    reserved: bool,
    /// The last observed rate was zero.
    idle: bool,
    /// When traffic last came back after an idle period.
    resumed_s: f64,
}

impl ZeroBudget {
    pub fn new(horizon_s: f64, miss_share: f64) -> Self {
        ZeroBudget {
            horizon_s: horizon_s.max(1.0),
            miss_share: miss_share.clamp(0.0, 1.0),
            ..ZeroBudget::default()
        }
    }

    /// Takes the long-window arrival rate at time `t`: counts what was served since the last
    /// observation, decays the counts, and learns the rate traffic comes at.
    pub fn observe(&mut self, t: f64, requests_per_s: f64) {
        let dt = self.last_s.map_or(0.0, |l| (t - l).max(0.0));
        self.last_s = Some(t);
        let decay = (-dt / self.horizon_s).exp();
        self.served = self.served * decay + requests_per_s * dt;
        self.spent *= decay;
        if requests_per_s > 0.0 && self.idle {
            self.resumed_s = t;
        }
        self.idle = requests_per_s <= 0.0;
        if requests_per_s > 0.0 {
            self.reserved = false;
            let fade = (-dt / PEAK_MEMORY_S).exp();
            self.wake_rate = (self.wake_rate * fade).max(requests_per_s);
            self.wake_floor *= fade;
        }
    }

    /// Takes the demand (requests/s) a prompt floor planned at `t`, 0 for none, after
    /// [`Self::observe`] of the same tick; only once traffic has come for a whole arrival
    /// window since it started or came back: before that the floors are measured on a few
    /// requests (at a trace's start the tail floor of a dozen prompts asked three H100s).
    pub fn observe_floor(&mut self, t: f64, window_s: f64, requests_per_s: f64) {
        if !self.idle && t - self.resumed_s >= window_s {
            self.wake_floor = self.wake_floor.max(requests_per_s);
        }
    }

    /// Whether the pool is idle, or its traffic came back less than one arrival window ago
    /// (the windowed rate still understates it): when the kept capacity matters.
    pub fn idle_or_returning(&self, t: f64, window_s: f64) -> bool {
        self.idle || t - self.resumed_s < window_s
    }

    /// Requests a cold start of `startup_s` is expected to miss against a TTFT target.
    pub fn expected_misses(&self, startup_s: f64, ttft_s: f64) -> f64 {
        self.wake_rate * (startup_s - ttft_s).max(0.0)
    }

    /// Requests the budget still allows to miss.
    pub fn remaining(&self) -> f64 {
        (self.miss_share * self.served - self.spent).max(0.0)
    }

    /// Requests/s of capacity a pool keeps for its traffic's return: the rate it returns at,
    /// or the prompt floors it needed if more, or 0 when a cold start of `startup_s` from zero
    /// fits the budget.
    pub fn warm_capacity(&self, startup_s: f64, ttft_s: f64) -> f64 {
        if self.reserved || self.expected_misses(startup_s, ttft_s) <= self.remaining() {
            return 0.0;
        }
        self.wake_rate.max(self.wake_floor)
    }

    /// Whether the pool may go to zero now, given the start-up of the replica that would
    /// wake it; the first yes of an idle period reserves its misses.
    pub fn allows_zero(&mut self, startup_s: f64, ttft_s: f64) -> bool {
        if self.reserved {
            return true;
        }
        if self.warm_capacity(startup_s, ttft_s) > 0.0 {
            return false;
        }
        self.spent += self.expected_misses(startup_s, ttft_s);
        self.reserved = true;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `rate` every 15 s from `from` for `seconds`.
    fn feed(b: &mut ZeroBudget, from: f64, seconds: f64, rate: f64) -> f64 {
        let mut t = from;
        while t < from + seconds {
            b.observe(t, rate);
            t += 15.0;
        }
        t
    }

    #[test]
    fn short_gaps_at_the_same_rate_never_afford_a_gpu_cold_start() {
        // Five-minute sessions at 15 req/s: ~4,500 requests, a budget of ~45; a 420 s start-up
        // against a 2 s TTFT misses ~6,300.
        let mut b = ZeroBudget::new(3600.0, 0.01);
        let t = feed(&mut b, 0.0, 300.0, 15.0);
        let t = feed(&mut b, t, 300.0, 0.0);
        assert!(b.expected_misses(420.0, 2.0) > 6000.0);
        assert!(!b.allows_zero(420.0, 2.0));
        // Kept: capacity for the rate the sessions come at.
        let warm = b.warm_capacity(420.0, 2.0);
        assert!((warm - 15.0).abs() < 1e-9, "{warm}");
        // A start-up within the TTFT target misses nothing: always affordable.
        assert!(b.allows_zero(1.5, 2.0));
        let _ = t;
    }

    #[test]
    fn the_prompt_floors_traffic_needed_are_kept_for_its_return() {
        // Sessions at 15 req/s whose bursts needed 40 req/s of prefill capacity.
        let mut b = ZeroBudget::new(3600.0, 0.01);
        let mut t = 0.0;
        while t < 300.0 {
            b.observe(t, 15.0);
            // The first minute's floors, on a few requests, are not remembered.
            b.observe_floor(t, 60.0, if t < 60.0 { 90.0 } else { 40.0 });
            t += 15.0;
        }
        let t = feed(&mut b, t, 300.0, 0.0);
        // What a floor says while idle is not the traffic's.
        b.observe_floor(t, 60.0, 90.0);
        assert!((b.warm_capacity(420.0, 2.0) - 40.0).abs() < 1e-9);
        // Traffic without floors, for longer than the memory: the rate again.
        let mut t = t;
        for _ in 0..400 {
            b.observe(t, 15.0);
            b.observe_floor(t, 60.0, 0.0);
            t += 15.0;
        }
        let warm = b.warm_capacity(420.0, 2.0);
        assert!((warm - 15.0).abs() < 1e-6, "{warm}");
    }

    #[test]
    fn a_long_busy_day_affords_a_cold_start_at_a_low_wake_rate_once() {
        // A day at 20 req/s, then the evening's trickle at 0.05 req/s, then idle: ~1.7 M
        // requests, a budget of ~17,000 (decayed over a day's horizon); waking at the trickle
        // misses 0.05 × 418 ≈ 21.
        let mut b = ZeroBudget::new(86_400.0, 0.01);
        let t = feed(&mut b, 0.0, 86_400.0, 20.0);
        let t = feed(&mut b, t, 7200.0, 0.05);
        let t = feed(&mut b, t, 600.0, 0.0);
        let _ = t;
        let misses = b.expected_misses(420.0, 2.0);
        assert!(misses < 1000.0, "{misses}");
        let before = b.remaining();
        assert!(b.allows_zero(420.0, 2.0));
        assert!((before - b.remaining() - misses).abs() < 1e-6);
        // The same idle period asks again: already reserved, not charged twice.
        assert!(b.allows_zero(420.0, 2.0));
        assert!((before - b.remaining() - misses).abs() < 1e-6);
    }

    #[test]
    fn cold_starts_spend_the_budget_until_it_is_gone() {
        // Little traffic: a budget of a few requests; each idle period reserves its misses.
        let mut b = ZeroBudget::new(3600.0, 0.01);
        let mut t = feed(&mut b, 0.0, 1800.0, 1.0);
        let mut zeros = 0;
        for _ in 0..10 {
            t = feed(&mut b, t, 60.0, 0.0);
            if b.allows_zero(10.0, 2.0) {
                zeros += 1;
            }
            t = feed(&mut b, t, 15.0, 1.0);
        }
        // ~18 requests of budget, 8 misses per cold start: two fit, not ten.
        assert!((1..=3).contains(&zeros), "{zeros}");
    }
}

//! Headroom learnt from the traffic: how far the load a start-up lead later exceeded what was
//! planned for it.
//!
//! Capacity ordered now serves from one start-up lead `L` later. Each tick the policy plans
//! for a load `F(t)` (the larger of the observed and forecast rate, in replica units so that a
//! change of request shape counts as load). `L` seconds later it sees the load that actually
//! came, `A(t + L)`. The shortfall `A(t + L) − F(t)` is the forecast's error over the lead; a
//! high quantile of the shortfalls seen so far is the headroom that would have covered that
//! share of them. Smooth traffic learns a fraction of a replica (the noise of a windowed
//! rate), bursty or ramping traffic learns more; neither needs a fixed margin. The error is
//! kept in replicas, not as a ratio: a ramp that doubles a trough's small load in one lead
//! must not double the peak's. Until enough errors are seen the quantile is pulled towards a
//! prior share of the planned load, one sample's weight at a time.

use std::collections::VecDeque;

/// The learnt headroom: plans waiting for their outcome, and past shortfalls.
#[derive(Debug, Clone)]
pub struct Headroom {
    /// Seconds between a plan and the load it is compared with (the start-up lead).
    lead_s: f64,
    /// Quantile of the shortfalls to cover (0..1).
    quantile: f64,
    /// Headroom assumed before any shortfall is measured, as a share of the planned load, and
    /// its weight in samples.
    prior: f64,
    prior_weight: f64,
    /// Most headroom, as a share of the planned load.
    max: f64,
    /// Most shortfalls kept (older ones fall out: the traffic may change character).
    keep: usize,
    pending: VecDeque<(f64, f64)>,
    errors: VecDeque<f64>,
}

impl Headroom {
    pub fn new(lead_s: f64, quantile: f64, prior: f64) -> Self {
        Headroom {
            lead_s,
            quantile: quantile.clamp(0.0, 1.0),
            prior,
            prior_weight: 20.0,
            max: 2.0,
            keep: 960,
            pending: VecDeque::new(),
            errors: VecDeque::new(),
        }
    }

    /// Records at `t` the load `actual` that came and the load `planned` for (both in the
    /// same unit, before headroom); shortfalls complete for plans made a lead ago or more.
    pub fn observe(&mut self, t: f64, actual: f64, planned: f64) {
        while let Some(&(at, p)) = self.pending.front() {
            if at + self.lead_s > t + 1e-9 {
                break;
            }
            self.pending.pop_front();
            self.errors.push_back(actual - p);
            if self.errors.len() > self.keep {
                self.errors.pop_front();
            }
        }
        if planned.is_finite() && planned >= 0.0 {
            self.pending.push_back((t, planned));
        }
    }

    /// Shortfalls measured so far.
    pub fn samples(&self) -> usize {
        self.errors.len()
    }

    /// The load to add to `planned`: the quantile of the measured shortfalls, blended with
    /// the prior share of `planned` by their counts; never negative, at most `max` × planned.
    pub fn extra(&self, planned: f64) -> f64 {
        let n = self.errors.len() as f64;
        let prior = self.prior * planned;
        let learnt = if self.errors.is_empty() {
            prior
        } else {
            let mut v: Vec<f64> = self.errors.iter().copied().collect();
            v.sort_by(f64::total_cmp);
            let i = ((self.quantile * n).ceil() as usize).clamp(1, v.len()) - 1;
            v[i]
        };
        let w = self.prior_weight;
        let blended = (w * prior + n * learnt) / (w + n);
        blended.clamp(0.0, self.max * planned.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_the_prior_and_learns_the_error_quantile() {
        let mut h = Headroom::new(60.0, 0.9, 0.2);
        assert!((h.extra(10.0) - 2.0).abs() < 1e-12);
        // A flat load planned exactly: the headroom falls towards none.
        for i in 0..400 {
            h.observe(f64::from(i) * 15.0, 10.0, 10.0);
        }
        assert!(h.samples() > 300);
        assert!(h.extra(10.0) < 0.1, "{}", h.extra(10.0));
        // Plans one short every time: it learns one, whatever the load planned now (the prior,
        // 20 samples' worth against the 960 kept, still pulls a little).
        let mut h = Headroom::new(60.0, 0.9, 0.2);
        for i in 0..2000 {
            h.observe(f64::from(i) * 15.0, 11.0, 10.0);
        }
        assert!((h.extra(10.0) - 1.0).abs() < 0.03, "{}", h.extra(10.0));
        assert!(h.extra(30.0) < 1.15, "{}", h.extra(30.0));
    }

    #[test]
    fn a_rare_spike_does_not_move_a_high_quantile_and_bounds_hold() {
        let mut h = Headroom::new(60.0, 0.9, 0.0);
        for i in 0..400 {
            let actual = if i % 50 == 0 { 100.0 } else { 10.0 };
            h.observe(f64::from(i) * 15.0, actual, 10.0);
        }
        assert!(h.extra(10.0) < 0.01, "{}", h.extra(10.0));
        let mut h = Headroom::new(60.0, 0.9, 0.0);
        for i in 0..400 {
            h.observe(f64::from(i) * 15.0, 100.0, 1.0);
        }
        assert_eq!(h.extra(1.0), 2.0);
        // Over-forecasts learn no negative headroom.
        let mut h = Headroom::new(60.0, 0.9, 0.0);
        for i in 0..400 {
            h.observe(f64::from(i) * 15.0, 5.0, 10.0);
        }
        assert_eq!(h.extra(10.0), 0.0);
    }
}

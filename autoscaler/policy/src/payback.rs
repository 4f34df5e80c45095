//! The scale-down window, lengthened by cuts that did not pay back.
//!
//! Cutting a replica saves its price for as long as it is not needed again. Buying it back
//! costs its start-up (billed while it serves nothing) and the requests that arrive before it
//! serves. So a cut pays back only if the fleet does not buy the capacity back within one
//! start-up lead. How long a traffic's lulls last is something the policy can measure:
//! - each time replicas of a variant are cut (ready ones released or ones on their way
//!   cancelled) and that variant is bought again within its start-up lead, the cut did not
//!   pay back: this
//!   traffic's lulls are shorter than a start-up, and the window becomes the start-up lead,
//!   the rent-or-buy break-even (holding a replica idle for longer than a start-up costs more
//!   than buying it back);
//! - each cut that pays back (a lead passes with no rebuy) halves what the window has grown.
//!
//! Steady traffic, a ramp down or a crowd that has gone keep the base window; traffic whose
//! lulls are shorter than a start-up learns to hold its fleet through them. Measured on the
//! suite and on bursty look-alikes in the autoscaler's README.

/// What a tick taught about the latest cuts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Nothing to judge yet.
    Open,
    /// A key was bought back this many seconds after it was cut, within its start-up lead
    /// `lead_s`: the window grew to the lead.
    BoughtBack { after_s: f64, lead_s: f64 },
    /// A start-up lead passed without a rebuy: the window shrank towards its base.
    PaidBack,
}

/// The adaptive scale-down window.
#[derive(Debug, Clone)]
pub struct Payback {
    base_s: f64,
    window_s: f64,
    /// Per offer key, the latest cut not yet judged: when it was made.
    cut_at: Vec<Option<f64>>,
}

impl Payback {
    /// A window of `base_s` seconds to start from and return to.
    pub fn new(base_s: f64) -> Self {
        let base_s = base_s.max(0.0);
        Payback {
            base_s,
            window_s: base_s,
            cut_at: Vec::new(),
        }
    }

    /// The scale-down window to hold demand for now, seconds.
    pub fn window_s(&self) -> f64 {
        self.window_s
    }

    /// A cut was bought back within its start-up lead `lead_s`: the window grows to that lead
    /// (the rent-or-buy break-even). Called by [`Payback::observe`], and by the policy for a
    /// cut another rule held back that would have been bought back.
    pub fn bought_back(&mut self, lead_s: f64) {
        self.window_s = self.window_s.max(self.base_s.max(lead_s));
    }

    /// One tick at `t`: replicas per offer key before (`from`) and after (`to`) the tick's
    /// decision, and each key's start-up lead (`leads`, seconds from asking to serving).
    pub fn observe(&mut self, t: f64, from: &[u32], to: &[u32], leads: &[f64]) -> Verdict {
        self.cut_at.resize(from.len(), None);
        let mut verdict = Verdict::Open;
        for (i, ((&was, &now), &lead_s)) in from.iter().zip(to).zip(leads).enumerate() {
            if let Some(cut) = self.cut_at[i] {
                if now > was && t - cut < lead_s {
                    self.bought_back(lead_s);
                    self.cut_at[i] = None;
                    verdict = Verdict::BoughtBack {
                        after_s: t - cut,
                        lead_s,
                    };
                } else if t - cut >= lead_s {
                    self.window_s = self.base_s + (self.window_s - self.base_s) / 2.0;
                    self.cut_at[i] = None;
                    if verdict == Verdict::Open {
                        verdict = Verdict::PaidBack;
                    }
                }
            }
            if now < was {
                self.cut_at[i] = Some(t);
            }
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: [f64; 1] = [420.0];

    #[test]
    fn a_cut_bought_back_within_its_lead_holds_for_that_lead() {
        let mut p = Payback::new(300.0);
        let lead = [900.0];
        assert_eq!(p.observe(0.0, &[3], &[2], &lead), Verdict::Open);
        assert_eq!(p.observe(60.0, &[2], &[2], &lead), Verdict::Open);
        assert_eq!(
            p.observe(135.0, &[2], &[3], &lead),
            Verdict::BoughtBack {
                after_s: 135.0,
                lead_s: 900.0
            }
        );
        assert_eq!(p.window_s(), 900.0);
        // More rebuys hold no longer than a lead.
        for i in 0..20 {
            let t = 1000.0 + f64::from(i) * 100.0;
            p.observe(t, &[3], &[2], &lead);
            p.observe(t + 90.0, &[2], &[3], &lead);
        }
        assert_eq!(p.window_s(), 900.0);
        // A start-up shorter than the base window never shortens it.
        let mut q = Payback::new(300.0);
        q.observe(0.0, &[3], &[2], &[120.0]);
        q.observe(60.0, &[2], &[3], &[120.0]);
        assert_eq!(q.window_s(), 300.0);
    }

    #[test]
    fn a_cut_that_pays_back_halves_the_growth_and_never_goes_below_the_base() {
        let mut p = Payback::new(300.0);
        let lead = [700.0];
        p.observe(0.0, &[3], &[2], &lead);
        p.observe(200.0, &[2], &[3], &lead);
        assert_eq!(p.window_s(), 700.0);
        p.observe(1000.0, &[3], &[2], &lead);
        // A rebuy later than a lead after the cut is not held against it.
        assert_eq!(p.observe(1700.0, &[2], &[3], &lead), Verdict::PaidBack);
        assert_eq!(p.window_s(), 500.0);
        p.observe(2000.0, &[3], &[2], &lead);
        assert_eq!(p.observe(2700.0, &[2], &[2], &lead), Verdict::PaidBack);
        assert_eq!(p.window_s(), 400.0);
        let mut flat = Payback::new(300.0);
        flat.observe(0.0, &[3], &[2], &H100);
        assert_eq!(flat.observe(500.0, &[2], &[2], &H100), Verdict::PaidBack);
        assert_eq!(flat.window_s(), 300.0);
    }

    #[test]
    fn only_a_rebuy_of_the_variant_cut_counts_and_a_steady_fleet_judges_nothing() {
        let mut p = Payback::new(300.0);
        let leads = [330.0, 420.0];
        for i in 0..100 {
            let v = p.observe(f64::from(i) * 15.0, &[0, 2], &[0, 2], &leads);
            assert_eq!(v, Verdict::Open);
        }
        assert_eq!(p.window_s(), 300.0);
        // A switch of mix (L4s cut, an H100 bought) is not a rebuy.
        p.observe(2000.0, &[4, 1], &[0, 2], &leads);
        assert_eq!(p.observe(2015.0, &[0, 2], &[0, 3], &leads), Verdict::Open);
        assert_eq!(p.window_s(), 300.0);
        // The latest cut of a variant is the one judged.
        p.observe(2100.0, &[0, 4], &[0, 3], &leads);
        p.observe(2115.0, &[0, 3], &[0, 2], &leads);
        assert_eq!(
            p.observe(2145.0, &[0, 2], &[0, 3], &leads),
            Verdict::BoughtBack {
                after_s: 30.0,
                lead_s: 420.0
            }
        );
        assert_eq!(p.window_s(), 420.0);
    }
}

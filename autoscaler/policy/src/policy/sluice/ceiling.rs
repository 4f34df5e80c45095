//! The ceiling on the forecast and headroom over a rate the traffic has held before.
//!
//! The plan is the larger of the rate and its forecast over the start-up lead (a trend capped
//! at 1.5× the rate), plus 20 % headroom: up to 1.8× the rate. On a ramp into new ground that
//! is what has capacity ready when the load arrives. On traffic that swings within a range it
//! has already shown (bursty code whose level wanders, a conversation trace's minute-scale
//! swings), each swing's upward noise reads as a trend too, and the plan runs well past any
//! rate the traffic has reached. So while the rate is within the highest one seen more than a
//! start-up lead ago, the plan is held to [`SluiceConfig::seen_peak_ratio`] times that peak:
//! a level the fleet has met before, with room above it. A rate past the old peak is new
//! ground, and the forecast and headroom apply in full. The recent lead is left out of the
//! peak so that a climb does not cap itself.
//!
//! The peak is the highest since the policy started: stale, it is only high, and a ceiling
//! that is high never binds. Measured on the drifting code look-alikes (seeds 1–8): ×4 $472 →
//! $455, ×1 $167 → $160 at the same SLO; the suite's code-drift 1.58 → 1.53×, Azure ×8
//! 1.49 → 1.44×, nothing's SLO moved. At 1.1× or 1.25× the peak instead, the forecast on
//! diurnal's and Azure's ramps was cut too (diurnal 99.83 → 98.36 %).
//!
//! [`SluiceConfig::seen_peak_ratio`]: super::SluiceConfig::seen_peak_ratio

use std::collections::VecDeque;

use super::Sluice;
use crate::decision::{Decision, ReasonKind};
use crate::signals::Signals;

/// The highest rate seen more than a start-up lead ago, and the rates of the last lead.
#[derive(Debug, Clone, Default)]
pub(super) struct SeenPeak {
    /// (time, rate) of the last lead's ticks, oldest first.
    recent: VecDeque<(f64, f64)>,
    /// The highest rate older than the lead; 0 until one is.
    peak: f64,
}

impl SeenPeak {
    /// Records the rate of a full window at `t`; rates older than `lead_s` join the peak.
    pub(super) fn observe(&mut self, t: f64, rate: f64, lead_s: f64) {
        self.recent.push_back((t, rate));
        while let Some(&(at, r)) = self.recent.front() {
            if at >= t - lead_s {
                break;
            }
            self.peak = self.peak.max(r);
            self.recent.pop_front();
        }
    }

    /// `planned` held to `ratio` × the old peak while `rate` (the highest rate being planned
    /// from) is within that peak; never below `rate`. `None` where it does not bind.
    pub(super) fn cap(&self, rate: f64, planned: f64, ratio: f64) -> Option<(f64, f64)> {
        let ceiling = (self.peak * ratio).max(rate);
        (self.peak > 0.0 && rate <= self.peak && planned > ceiling).then_some((ceiling, self.peak))
    }
}

impl Sluice {
    /// `with_headroom` (requests/s) held to the ceiling over the highest rate seen a start-up
    /// lead (`lead_s`) ago, after noting this tick's rate if its window is full; the short
    /// window's rate counts as the rate in panic. A reason where it binds.
    pub(super) fn under_ceiling(
        &mut self,
        s: &Signals,
        (panic, full_window, lead_s): (bool, bool, f64),
        with_headroom: f64,
        d: &mut Decision,
    ) -> f64 {
        let a = &s.arrivals;
        if full_window {
            self.seen.observe(s.time_s, a.requests_per_s, lead_s);
        }
        let Some(ratio) = self.config.seen_peak_ratio else {
            return with_headroom;
        };
        let rate = if panic {
            a.requests_per_s.max(a.short_requests_per_s)
        } else {
            a.requests_per_s
        };
        let Some((ceiling, peak)) = self.seen.cap(rate, with_headroom, ratio) else {
            return with_headroom;
        };
        d.reason(
            ReasonKind::Forecast,
            None,
            format!(
                "{with_headroom:.2} req/s with forecast and headroom held to {ceiling:.2}: \
                 {ratio}× the {peak:.2} req/s seen over a lead ago"
            ),
        );
        ceiling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rate seen a lead ago caps a plan over a rate within it; the last lead's rates do not
    /// count yet (a climb does not cap itself), and a rate past the old peak is not capped.
    #[test]
    fn a_plan_within_an_old_peak_is_held_to_a_ratio_of_it() {
        let mut s = SeenPeak::default();
        s.observe(0.0, 10.0, 100.0);
        s.observe(50.0, 20.0, 100.0);
        assert_eq!(
            s.cap(8.0, 30.0, 1.4),
            None,
            "nothing older than the lead yet"
        );
        s.observe(150.0, 6.0, 100.0);
        // 10 req/s left the lead; 20 has not.
        assert_eq!(s.cap(8.0, 30.0, 1.4), Some((14.0, 10.0)));
        assert_eq!(s.cap(8.0, 13.0, 1.4), None, "under the ceiling");
        assert_eq!(
            s.cap(11.0, 30.0, 1.4),
            None,
            "past the old peak: new ground"
        );
        s.observe(200.0, 6.0, 100.0);
        assert_eq!(s.cap(8.0, 40.0, 1.4), Some((28.0, 20.0)));
        // Never below the rate itself.
        assert_eq!(s.cap(20.0, 40.0, 0.5), Some((20.0, 20.0)));
    }
}

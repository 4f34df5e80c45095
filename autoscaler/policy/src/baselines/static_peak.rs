//! Static peak: the cheapest fleet that serves the trace's most demanding window at SLO, all
//! the time. What a team without an autoscaler runs; the SLO it reaches is the capacity
//! model's best case and its cost the ceiling autoscaling should beat.

use std::sync::Arc;

use crate::capacity::{Planning, Slo};
use crate::decision::{Decision, Demand, Mode, ReasonKind};
use crate::mix;
use crate::policy::plan::{self, VariantLimits};
use crate::policy::Policy;
use crate::profile::{CapacityType, Profile};
use crate::signals::Signals;
use crate::timeline::Timeline;

#[derive(Debug, Clone)]
pub struct StaticPeak {
    profile: Profile,
    limits: Vec<VariantLimits>,
    counts: Vec<u32>,
    demand: Demand,
}

impl StaticPeak {
    pub fn new(
        profile: Profile,
        limits: Vec<VariantLimits>,
        slo: &Slo,
        planning: &Planning,
        capacity: CapacityType,
        timeline: &Arc<Timeline>,
        window_s: f64,
    ) -> Self {
        let sizing = super::oracle::Sizing {
            profile: &profile,
            limits: &limits,
            slo,
            planning,
        };
        let peak = super::oracle::peak_window(sizing, timeline, window_s, 0.0, timeline.end_s());
        let (rate, w) = peak.unwrap_or((0.0, crate::capacity::Workload::uniform(0.0, 1.0)));
        let (caps, _) = plan::capacities(&profile, &limits, &w, slo, planning);
        let zero = vec![0; plan::offer_keys(&limits).len()];
        let offers = plan::offers(
            &profile,
            &limits,
            &caps,
            &zero,
            |_, k| k == capacity,
            |l| l.min,
        );
        let m = mix::cheapest(&offers, rate);
        let demand = Demand {
            planned_requests_per_s: rate,
            mean_prompt_tokens: w.mean_prompt_tokens,
            mean_output_tokens: w.mean_output_tokens,
            capacity_requests_per_s: m.requests_per_s,
            cost_per_hour: m.cost_per_hour,
            ..Demand::default()
        };
        StaticPeak {
            profile,
            limits,
            counts: m.counts,
            demand,
        }
    }
}

impl Policy for StaticPeak {
    fn name(&self) -> &str {
        "static-peak"
    }

    fn decide(&mut self, s: &Signals) -> Decision {
        let mut d = Decision {
            time_s: s.time_s,
            model: s.model.clone(),
            mode: Mode::Stable,
            demand: self.demand.clone(),
            ..Decision::default()
        };
        d.reason(
            ReasonKind::Baseline,
            None,
            format!(
                "sized once for the peak, {:.2} req/s",
                self.demand.planned_requests_per_s
            ),
        );
        plan::fill_targets(&mut d, &self.profile, &self.limits, &self.counts);
        d
    }
}

//! The oracle: knows every future arrival, so it is the cost floor for meeting the SLO given
//! start-up delays, under the same capacity model as every other policy.
//!
//! At each tick it looks at the arrivals over `[now, now + lead + hold]`, where `lead` is the
//! longest start-up on a new node: anything it asks for now is ready by `now + lead`, and it
//! must already hold whatever that window needs, because a replica released now could not be
//! back in time. It sizes the cheapest mix for the most demanding sliding window (each window
//! with its own request shape) and keeps its current mix unless switching saves more than the
//! tolerance — the same hysteresis sluice uses, so it neither flaps between mixes nor gets its
//! floor for free. `hold` is the shortest idle gap worth releasing a replica for: a release
//! saves money only if the gap exceeds the lead (the re-start is billed), so scaling down
//! requires the window ahead to stay low for `lead + hold`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::capacity::{Planning, Slo, Workload};
use crate::decision::{Decision, Demand, Mode, ReasonKind};
use crate::mix;
use crate::policy::plan::{self, VariantLimits};
use crate::policy::Policy;
use crate::profile::{CapacityType, Profile};
use crate::signals::Signals;
use crate::timeline::Timeline;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OracleConfig {
    pub slo: Slo,
    pub planning: Planning,
    pub limits: Vec<VariantLimits>,
    pub capacity: CapacityType,
    /// Sliding window over which a rate is measured (the same as sluice's long window).
    pub window_s: f64,
    pub hold_s: f64,
    /// As sluice's: a cheaper mix must pay back its start-ups within this many seconds.
    pub switch_amortise_s: f64,
}

#[derive(Debug, Clone)]
pub struct Oracle {
    config: OracleConfig,
    profile: Profile,
    timeline: Arc<Timeline>,
    lead_s: f64,
    /// Recent mixes, for the hold window.
    history: std::collections::VecDeque<(f64, Vec<u32>)>,
}

impl Oracle {
    pub fn new(profile: Profile, config: OracleConfig, timeline: Arc<Timeline>) -> Self {
        let lead_s = config
            .limits
            .iter()
            .filter_map(|l| profile.variant(&l.variant).ok())
            .map(|v| v.startup_s(true))
            .fold(0.0, f64::max);
        Oracle {
            config,
            profile,
            timeline,
            lead_s,
            history: std::collections::VecDeque::new(),
        }
    }
}

/// What sizing a fleet needs besides the demand.
#[derive(Debug, Clone, Copy)]
pub struct Sizing<'a> {
    pub profile: &'a Profile,
    pub limits: &'a [VariantLimits],
    pub slo: &'a Slo,
    pub planning: &'a Planning,
}

/// The most demanding sliding window in `[from, to]`: its rate and shape, judged by replicas of
/// the most efficient variant it would need.
pub fn peak_window(
    sizing: Sizing<'_>,
    timeline: &Timeline,
    window_s: f64,
    from: f64,
    to: f64,
) -> Option<(f64, Workload)> {
    let mut best: Option<(f64, f64, Workload)> = None;
    let step = timeline.bucket_s;
    let mut t = from;
    while t <= to {
        if let Some((rate, w)) = timeline.window(t, t + window_s) {
            let (caps, _) = plan::capacities(
                sizing.profile,
                sizing.limits,
                &w,
                sizing.slo,
                sizing.planning,
            );
            let per = caps.iter().map(|c| c.requests_per_s).fold(0.0, f64::max);
            let load = if per > 0.0 { rate / per } else { rate };
            if best.as_ref().is_none_or(|b| load > b.0) {
                best = Some((load, rate, w));
            }
        }
        t += step;
    }
    best.map(|(_, r, w)| (r, w))
}

impl Policy for Oracle {
    fn name(&self) -> &str {
        "oracle"
    }

    fn decide(&mut self, s: &Signals) -> Decision {
        let c = &self.config;
        let t = s.time_s;
        let mut d = Decision {
            time_s: t,
            model: s.model.clone(),
            mode: Mode::Stable,
            ..Decision::default()
        };
        let limits = &c.limits;
        let current = plan::current_counts(s, limits);
        let to = t + self.lead_s + c.hold_s;
        let sizing = Sizing {
            profile: &self.profile,
            limits,
            slo: &c.slo,
            planning: &c.planning,
        };
        let peak = peak_window(sizing, &self.timeline, c.window_s, t, to);
        let (rate, w) = peak.unwrap_or((0.0, crate::capacity::Workload::uniform(0.0, 1.0)));
        let (caps, _) = plan::capacities(&self.profile, limits, &w, &c.slo, &c.planning);
        let cap = c.capacity;
        let offers = plan::offers(
            &self.profile,
            limits,
            &caps,
            &current,
            |_, k| k == cap,
            |l| l.min,
        );
        let startup = plan::startup_times(&self.profile, limits);
        let (m, why) = plan::keep_or_switch(&offers, &current, rate, &startup, c.switch_amortise_s);
        // A replica it wanted within the hold window is not released yet: the variants are
        // interchangeable at the margin, and without this the fill-in count flaps tick to tick
        // while each cancelled start is billed.
        self.history.push_back((t, m.counts.clone()));
        while self.history.front().is_some_and(|(h, _)| *h < t - c.hold_s) {
            self.history.pop_front();
        }
        let mut counts: Vec<u32> = (0..m.counts.len())
            .map(|k| {
                let held = self.history.iter().map(|(_, v)| v[k]).max().unwrap_or(0);
                if m.counts[k] < current[k] {
                    held.min(current[k])
                } else {
                    m.counts[k]
                }
            })
            .collect();
        let ready = plan::ready_counts(s, limits);
        plan::make_before_break(&offers, &current, &ready, &mut counts, rate);
        let m = mix::evaluate(&offers, &counts);
        d.reason(
            ReasonKind::Baseline,
            None,
            format!("peak {rate:.2} req/s within the next {:.0}s", to - t),
        );
        d.reason(why, None, format!("${:.2}/h", m.cost_per_hour));
        d.demand = Demand {
            observed_requests_per_s: s.arrivals.requests_per_s,
            forecast_requests_per_s: rate,
            backlog_requests_per_s: 0.0,
            planned_requests_per_s: rate,
            mean_prompt_tokens: w.mean_prompt_tokens,
            mean_output_tokens: w.mean_output_tokens,
            capacity_requests_per_s: m.requests_per_s,
            cost_per_hour: mix::evaluate(&offers, &m.counts).cost_per_hour,
        };
        plan::fill_targets(&mut d, &self.profile, limits, &m.counts);
        d
    }
}

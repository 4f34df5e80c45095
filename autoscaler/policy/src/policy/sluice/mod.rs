//! sluice's policy: size the fleet from demand at SLO, cheapest mix first.
//!
//! Each tick: smooth the arrival rate with Holt's trend and forecast it over the start-up lead
//! time; plan for the larger of the observed and forecast rate (the short-window rate too in
//! panic), plus headroom (both held to a ceiling over a rate the traffic has already shown),
//! plus a rate that drains the backlog; convert each variant's capacity at SLO into offers
//! (Spot first, on-demand when Spot is out of stock); pick the cheapest mix (keeping the
//! current one when switching saves too little); scale up at once and scale down only to the
//! highest recommendation of the stabilisation window, never in panic; the window grows to a
//! start-up lead while cuts are bought back within one ([`Payback`]). Latency above the SLO
//! widens the planning margin, latency well below narrows it back.
//!
//! [`Policy::decide`] reads as the tick's steps; the steps with rules of their own live in
//! modules named for them: `ceiling`, `margin`, `floors` (the prompt tail's and the bursts'),
//! `stabilise` (with the cuts' payback and keep-warm), `spot`, and `config` (the knobs).

use std::collections::{HashMap, VecDeque};

use super::plan::{self, VariantLimits};
use super::Policy;
use crate::capacity::{Capacity, Workload};
use crate::decision::{Decision, Demand, Mode, ReasonKind};
use crate::forecast::Holt;
use crate::headroom::Headroom;
use crate::mix::{self, Offer};
use crate::payback::Payback;
use crate::profile::{CapacityType, Profile};
use crate::signals::Signals;
use crate::zero::ZeroBudget;

mod ceiling;
mod config;
mod floors;
mod margin;
mod spot;
mod stabilise;

pub use config::SluiceConfig;
use floors::Crowd;
use stabilise::Holdable;

/// The tick the forecast's smoothing was measured at (the simulator's default): its weights
/// compound by the time elapsed over it, so the Kubernetes controller's 10 s period or local
/// mode's 2 s ticks forecast as the simulator measured. Per observation, Azure ×4 cost 1.40×
/// the oracle at 10 s ticks (1.30× at 15 s) and met 98.66 % at 60 s (100 %).
const TUNED_TICK_S: f64 = 15.0;

/// The policy with its memory.
#[derive(Debug, Clone)]
pub struct Sluice {
    config: SluiceConfig,
    profile: Profile,
    holt: Holt,
    /// The forecast's shortfalls over the start-up lead, when the headroom is learnt.
    learnt: Option<Headroom>,
    shape: Option<Workload>,
    /// Recent planned demand (requests/s) for the scale-down window, each with whether it was
    /// planned in a panic's episode ([`Sluice::stabilise`]).
    history: VecDeque<(f64, f64, bool)>,
    /// A cut the rising load held back and not yet judged: when, the demand the fleet less the
    /// replica held serves, and that replica's start-up lead.
    held_cut: Option<(f64, f64, f64)>,
    /// The scale-down window's length, grown by cuts bought back within a start-up.
    payback: Payback,
    /// Each offer key's start-up lead ([`plan::startup_times`]; the profile and limits are
    /// fixed for the policy's life).
    leads: Vec<f64>,
    panic_until: f64,
    /// The long window's rate before the current panic, and until when the last crowd's
    /// seconds fill the per-second sums ([`Sluice::note_crowd`]).
    crowd: Crowd,
    last_traffic_s: f64,
    margin: f64,
    /// When replicas last came up, for the planning margin's anti-windup.
    arrivals: margin::Arrived,
    spot_out_until: HashMap<String, f64>,
    /// Per variant: how often its Spot replicas are reclaimed, as measured.
    spot_reclaims: HashMap<String, spot::ReclaimRate>,
    first_seen_s: Option<f64>,
    /// The first tick, for holding a fleet taken over before any traffic is seen.
    first_tick_s: Option<f64>,
    /// Per variant: capacity at SLO is divided by this while its own latency breaches the SLO.
    variant_margin: HashMap<String, f64>,
    /// The error budget a cold start must fit, under [`crate::zero::ZeroRule::ErrorBudget`].
    zero: Option<ZeroBudget>,
    /// The highest rate seen over a start-up lead ago ([`ceiling`]).
    seen: ceiling::SeenPeak,
}

impl Sluice {
    pub fn new(profile: Profile, config: SluiceConfig) -> Self {
        let mut s = Sluice {
            holt: Holt::new(config.holt_alpha, config.holt_beta)
                .damped(config.forecast_damping_s)
                .per_interval(TUNED_TICK_S),
            first_seen_s: None,
            first_tick_s: None,
            variant_margin: HashMap::new(),
            history: VecDeque::new(),
            held_cut: None,
            payback: Payback::new(config.scale_down_window_s),
            leads: plan::startup_times(&profile, &config.limits),
            profile,
            shape: None,
            panic_until: f64::NEG_INFINITY,
            crowd: Crowd::default(),
            last_traffic_s: f64::NEG_INFINITY,
            margin: 1.0,
            arrivals: margin::Arrived::default(),
            spot_out_until: HashMap::new(),
            spot_reclaims: HashMap::new(),
            learnt: None,
            zero: config.zero_rule.budget(),
            seen: ceiling::SeenPeak::default(),
            config,
        };
        let (lead, prior) = (s.horizon_s(), s.config.headroom);
        s.learnt = s
            .config
            .headroom_quantile
            .map(|q| Headroom::new(lead, q, prior));
        s
    }

    pub fn config(&self) -> &SluiceConfig {
        &self.config
    }

    fn horizon_s(&self) -> f64 {
        self.config.forecast_horizon_s.unwrap_or_else(|| {
            self.config
                .limits
                .iter()
                .filter_map(|l| self.profile.variant(&l.variant).ok())
                .map(|v| v.startup_s(true))
                .fold(0.0, f64::max)
        })
    }
}

/// The demand a tick plans for, before a mix is chosen.
#[derive(Debug, Clone, Copy)]
struct Planned {
    /// The arrival rate forecast over the start-up lead (0 until a full window was measured).
    forecast: f64,
    /// Extra rate to drain the queue.
    backlog: f64,
    /// What the fleet should serve: the base rate with headroom and margin, plus the backlog.
    planned: f64,
    /// Still measuring the first full window of arrivals.
    warming: bool,
    /// The load is rising: the trend is up and the forecast well above the observed rate.
    rising: bool,
}

/// The lowest count a variant keeps: `min`, or `keep_warm` while traffic is recent.
fn floor(l: &VariantLimits, idle: bool) -> u32 {
    if idle {
        l.min
    } else {
        l.min.max(l.keep_warm)
    }
}

/// Requests/s the ready replicas serve at SLO.
fn ready_capacity(s: &Signals, keys: &[(String, CapacityType)], caps: &[Capacity]) -> f64 {
    keys.iter()
        .enumerate()
        .map(|(k, (n, c))| {
            f64::from(s.variant(n, *c).map_or(0, |v| v.ready)) * caps[k / 2].requests_per_s
        })
        .sum()
}

impl Sluice {
    /// Remembers when traffic was last seen and the latest request shape; whether the model
    /// has been idle past the scale-to-zero delay.
    fn note_traffic(&mut self, s: &Signals) -> bool {
        if s.arrivals.requests_per_s > 0.0 || s.queue.waiting > 0 || s.queue.running > 0 {
            self.last_traffic_s = s.time_s;
        }
        if let Some(z) = self.zero.as_mut() {
            z.observe(s.time_s, s.arrivals.requests_per_s);
        }
        if let Some(w) = s.workload() {
            self.shape = Some(w);
        }
        s.time_s - self.last_traffic_s > self.config.scale_to_zero_after_s
    }

    /// Nothing ever arrived: each variant's floor, on demand; but a fleet it takes over is
    /// held until the scale-to-zero delay has passed since the first tick (its first signals
    /// may simply predate the first request).
    fn floors_only(
        &mut self,
        s: &Signals,
        mut d: Decision,
        limits: &[VariantLimits],
        idle: bool,
    ) -> Decision {
        let first = *self.first_tick_s.get_or_insert(s.time_s);
        let hold = s.time_s - first <= self.config.scale_to_zero_after_s;
        let current = plan::current_counts(s, limits);
        let counts: Vec<u32> = plan::offer_keys(limits)
            .iter()
            .enumerate()
            .map(|(k, (_, c))| {
                let f = if *c == CapacityType::OnDemand {
                    floor(&limits[k / 2], idle)
                } else {
                    0
                };
                if hold {
                    f.max(current[k])
                } else {
                    f
                }
            })
            .collect();
        let why = if hold {
            "no traffic seen yet: holding the fleet until the scale-to-zero delay"
        } else {
            "no traffic seen yet: floors only"
        };
        d.reason(ReasonKind::MinMax, None, why);
        plan::fill_targets(&mut d, &self.profile, limits, &counts);
        d
    }

    /// Each variant's capacity at SLO for the shape, divided by its latency margin. Whether a
    /// variant leaves too many prompts late that it cannot prefill in time is judged on the
    /// prompt tail of the wider window (a minute's fitted tail wobbles around any threshold),
    /// and with hysteresis: it is bought only while they are within half the budget
    /// [`plan::capacities`] allows, and ruled out once it has replicas only past the whole
    /// of it. Each crossing would cancel replicas minutes from serving and start others from
    /// scratch: the `llama-3-70b` profile's A100 ×4, ruled out mid-ramp and back in 75 s
    /// later, had 12 replicas on their way cancelled and left the ramp a queue of thousands.
    fn capacities(
        &self,
        s: &Signals,
        limits: &[VariantLimits],
        w: &Workload,
        d: &mut Decision,
    ) -> Vec<Capacity> {
        let has_replicas = |v: &str| {
            [CapacityType::OnDemand, CapacityType::Spot]
                .iter()
                .any(|&c| s.provisioned(v, c) > 0)
        };
        let budget = |v: &str| {
            let whole = crate::capacity::SLOW_PROMPT_BUDGET;
            if has_replicas(v) {
                whole
            } else {
                whole / 2.0
            }
        };
        let tail = s.tail_workload().unwrap_or(*w);
        let slow = plan::SlowPrompts {
            shape: &tail,
            budget: &budget,
        };
        let (mut caps, relaxed) = plan::capacities_within(
            &self.profile,
            limits,
            w,
            &self.config.slo,
            &self.config.planning,
            &slow,
        );
        for (l, c) in limits.iter().zip(caps.iter_mut()) {
            c.requests_per_s /= self.variant_margin.get(&l.variant).copied().unwrap_or(1.0);
        }
        for (l, c) in limits.iter().zip(&caps) {
            if c.requests_per_s == 0.0 {
                d.reason(
                    ReasonKind::Ineligible,
                    Some(&l.variant),
                    "cannot meet the SLO for this request shape",
                );
            }
        }
        if relaxed {
            d.reason(
                ReasonKind::Ineligible,
                None,
                "no variant meets the TTFT target for this prompt length; sized for TPOT only",
            );
        }
        caps
    }

    /// Panic: a spike the long window has not caught up with, or a queue the ready fleet
    /// cannot drain soon. Whether the policy is in panic now.
    fn update_panic(&mut self, s: &Signals, ready_capacity: f64, d: &mut Decision) -> bool {
        let (a, t) = (&s.arrivals, s.time_s);
        let spike = a.short_requests_per_s > self.config.panic_rate_ratio * ready_capacity;
        let queue_spike =
            s.queue.waiting as f64 > self.config.panic_queue_s * ready_capacity.max(1e-9);
        if (spike && a.short_requests_per_s > a.requests_per_s) || queue_spike {
            if t >= self.panic_until {
                d.reason(
                    ReasonKind::Panic,
                    None,
                    format!(
                        "short-window rate {:.1}/s or queue {} against ready capacity {:.1}/s",
                        a.short_requests_per_s, s.queue.waiting, ready_capacity
                    ),
                );
            }
            self.panic_until = t + self.config.panic_window_s;
        }
        t < self.panic_until
    }

    /// The rate to plan for: the larger of the observed and forecast rate (the short-window
    /// rate too in panic), with headroom and margin, plus the backlog's drain rate.
    fn plan_demand(
        &mut self,
        s: &Signals,
        panic: bool,
        idle: bool,
        ref_capacity: f64,
        d: &mut Decision,
    ) -> Planned {
        let (a, t) = (&s.arrivals, s.time_s);
        let horizon = self.horizon_s();
        // A trend needs a full window of history before it means anything.
        let first = *self.first_seen_s.get_or_insert(t);
        let full_window = t - first >= a.window_s;
        // Rates from before a full window was measured are not rates yet: the trend would
        // learn the window filling up.
        if full_window {
            self.holt.observe(t, a.requests_per_s);
        }
        let forecast = if full_window {
            let cap = self.config.forecast_cap_ratio * a.requests_per_s;
            self.holt.forecast(horizon).unwrap_or(0.0).min(cap)
        } else {
            0.0
        };
        let mut base = a.requests_per_s.max(forecast);
        if forecast > a.requests_per_s {
            d.reason(
                ReasonKind::Forecast,
                None,
                format!(
                    "rate {:.2}/s forecast to {:.2}/s in {:.0}s",
                    a.requests_per_s, forecast, horizon
                ),
            );
        }
        let learnt = self.learnt_headroom(t, a.requests_per_s, base, ref_capacity, full_window);
        if panic {
            base = base.max(a.short_requests_per_s);
        }
        // Replicas ordered for a backlog arrive minutes later, when most of it has drained
        // through the fleet that exists: the backlog at most doubles the planned rate.
        let drain_s = self.config.backlog_drain_s.unwrap_or(horizon).max(1.0);
        let backlog = (s.queue.waiting as f64 / drain_s).min(base.max(1e-3));
        if s.queue.waiting > 0 {
            d.reason(
                ReasonKind::Backlog,
                None,
                format!(
                    "{} queued: +{:.2}/s to drain in {:.0}s",
                    s.queue.waiting, backlog, drain_s
                ),
            );
        }
        let with_headroom = match learnt {
            Some(extra) => base + extra,
            None => base * (1.0 + self.config.headroom),
        };
        let with_headroom = self.under_ceiling(s, (panic, full_window, horizon), with_headroom, d);
        let mut planned = with_headroom * self.margin + backlog;
        if idle {
            planned = 0.0;
            d.reason(
                ReasonKind::ScaleToZero,
                None,
                "idle past the scale-to-zero delay",
            );
        }
        // A trend whose rise over the lead takes more than half the headroom is a ramp, not
        // the noise of a windowed rate.
        let rising_above = a.requests_per_s * (1.0 + self.config.headroom / 2.0);
        Planned {
            forecast,
            backlog,
            planned,
            warming: !full_window,
            rising: full_window && self.holt.trend() > 0.0 && forecast > rising_above,
        }
    }

    /// The rate added to the planned one when the headroom is learnt (`None` when it is
    /// fixed): the forecast's past shortfalls over the start-up lead. Loads are compared in
    /// replica units (requests/s over what the largest replica serves of the shape then), so
    /// a change of request shape is a change of load. Only rates from full windows teach it.
    fn learnt_headroom(
        &mut self,
        t: f64,
        observed: f64,
        planned: f64,
        ref_capacity: f64,
        full_window: bool,
    ) -> Option<f64> {
        let h = self.learnt.as_mut()?;
        if ref_capacity <= 0.0 {
            return None;
        }
        if full_window {
            h.observe(t, observed / ref_capacity, planned / ref_capacity);
        }
        Some(h.extra(planned / ref_capacity) * ref_capacity)
    }

    /// The replicas per offer key for `stable` req/s: the cheapest mix (or the current one
    /// when switching pays back too slowly), growing no variant that is dear per request
    /// ([`plan::cap_dear_growth`]), keeping ready replicas until their
    /// replacements are ready; while the ready fleet is short of it, nothing on its way is
    /// cancelled either.
    fn choose_counts(
        &self,
        s: &Signals,
        limits: &[VariantLimits],
        offers: &[Offer],
        current: &[u32],
        stable: f64,
        d: &mut Decision,
    ) -> Vec<u32> {
        let ready = plan::ready_counts(s, limits);
        let offers = &plan::cap_dear_growth(offers, current)[..];
        let kept = plan::keep_in_flight(offers, current, &ready, stable);
        if kept.is_some() {
            d.reason(
                ReasonKind::Stabilisation,
                None,
                "the ready fleet is short: replicas on their way are kept",
            );
        }
        let (mix, why) = plan::keep_or_switch(
            kept.as_deref().unwrap_or(offers),
            current,
            stable,
            &self.leads,
            self.config.switch_amortise_s,
        );
        d.reason(
            why,
            None,
            format!(
                "{:.2} req/s: ${:.2}/h for {:.2} req/s at SLO",
                stable, mix.cost_per_hour, mix.requests_per_s
            ),
        );
        if mix.requests_per_s + 1e-9 < stable {
            d.reason(
                ReasonKind::MinMax,
                None,
                "every variant at its maximum and still short",
            );
        }
        let mut counts = mix.counts.clone();
        if plan::make_before_break(offers, current, &ready, &mut counts, stable) {
            d.reason(
                ReasonKind::Stabilisation,
                None,
                "keeping ready replicas until their replacements are ready",
            );
        }
        counts
    }
}

impl Policy for Sluice {
    fn name(&self) -> &str {
        "sluice"
    }

    /// One tick: traffic and shape → capacity per variant → panic → planned demand → Spot
    /// availability → offers → stabilised demand → the mix → targets.
    fn decide(&mut self, s: &Signals) -> Decision {
        let mut d = Decision {
            time_s: s.time_s,
            model: s.model.clone(),
            ..Decision::default()
        };
        let idle = self.note_traffic(s);
        let limits = self.config.limits.clone();
        let Some(w) = self.shape else {
            return self.floors_only(s, d, &limits, idle);
        };
        self.update_margin(s, &mut d);
        let caps = self.capacities(s, &limits, &w, &mut d);
        let keys = plan::offer_keys(&limits);
        let ready_cap = ready_capacity(s, &keys, &caps);
        let panic = self.update_panic(s, ready_cap, &mut d);
        self.note_crowd(s, panic);
        d.mode = if panic { Mode::Panic } else { Mode::Stable };
        // What the largest replica serves of this shape, before latency margins: the unit a
        // learnt headroom measures load in.
        let ref_capacity = limits
            .iter()
            .zip(&caps)
            .map(|(l, c)| {
                c.requests_per_s * self.variant_margin.get(&l.variant).copied().unwrap_or(1.0)
            })
            .fold(0.0, f64::max);
        let mut p = self.plan_demand(s, panic, idle, ref_capacity, &mut d);
        let burst = (!idle)
            .then(|| self.prompt_floors(s, (&limits, &caps), &w, &mut p, &mut d))
            .flatten();
        let spot_ok = self.spot_allowed(s, &mut d);
        let spot = self.config.spot;
        let allow = |n: &str, c: CapacityType| match c {
            CapacityType::Spot => spot && spot_ok.get(n).copied().unwrap_or(false),
            CapacityType::OnDemand => !(spot && spot_ok.get(n).copied().unwrap_or(false)),
        };
        let current = self.coming_counts(s, &limits, &spot_ok);
        let mut offers = plan::offers(&self.profile, &limits, &caps, &current, allow, |l| {
            floor(l, idle)
        });
        self.discount_reclaims(s, &mut offers, &mut d);
        let current_capacity = mix::evaluate(&offers, &current).requests_per_s;
        let holdable = Holdable::new(s, ready_cap, current_capacity);
        let at = (s.time_s, s.arrivals.window_s);
        let held = self.stabilise(at, &p, holdable, panic, &mut d);
        self.judge_held_cut(
            s.time_s,
            (&offers, &current),
            current_capacity,
            held,
            &mut d,
        );
        let stable = held.demand;
        let stable = self.keep_warm_for_return(s, &limits, &caps, stable, &mut d);
        let mut counts = self.choose_counts(s, &limits, &offers, &current, stable, &mut d);
        if let Some(b) = &burst {
            self.top_up_prefill(&offers, &mut counts, b, &mut d);
        }
        let chosen = mix::evaluate(&offers, &counts);
        self.judge_cuts(s.time_s, &current, &counts, &mut d);
        d.demand = Demand {
            observed_requests_per_s: s.arrivals.requests_per_s,
            forecast_requests_per_s: p.forecast,
            backlog_requests_per_s: p.backlog,
            planned_requests_per_s: p.planned,
            mean_prompt_tokens: w.mean_prompt_tokens,
            mean_output_tokens: w.mean_output_tokens,
            capacity_requests_per_s: chosen.requests_per_s,
            cost_per_hour: chosen.cost_per_hour,
        };
        plan::fill_targets(&mut d, &self.profile, &limits, &counts);
        d
    }
}

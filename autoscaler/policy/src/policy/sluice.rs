//! sluice's policy: size the fleet from demand at SLO, cheapest mix first.
//!
//! Each tick: smooth the arrival rate with Holt's trend and forecast it over the start-up lead
//! time; plan for the larger of the observed and forecast rate (the short-window rate too in
//! panic), plus headroom, plus a rate that drains the backlog; convert each variant's capacity
//! at SLO into offers (Spot first, on-demand when Spot is out of stock); pick the cheapest mix
//! (keeping the current one when switching saves too little); scale up at once and scale down
//! only to the highest recommendation of the stabilisation window, never in panic; the window
//! grows to a start-up lead while cuts are bought back within one ([`Payback`]). Latency
//! above the SLO widens the planning margin, latency well below narrows it back.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::plan::{self, VariantLimits};
use super::Policy;
use crate::capacity::{self, Capacity, Planning, Slo, Workload};
use crate::decision::{Decision, Demand, Mode, ReasonKind};
use crate::forecast::Holt;
use crate::headroom::Headroom;
use crate::mix::{self, Offer};
use crate::payback::{Payback, Verdict};
use crate::profile::{CapacityType, Profile, Variant};
use crate::signals::Signals;
use crate::zero::{ZeroBudget, ZeroRule};

/// The policy's knobs. Defaults: HPA's five-minute scale-down stabilisation, KPA's
/// sixty-second panic window; a trend damped over ten minutes and capped at 1.5× the observed
/// rate (ramps are followed a start-up lead ahead, steps are not extrapolated).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SluiceConfig {
    pub slo: Slo,
    pub planning: Planning,
    pub limits: Vec<VariantLimits>,
    /// Buy Spot first (on-demand when Spot is out of stock).
    pub spot: bool,
    /// Extra capacity over the planned rate: the forecast follows trends, not the minute-scale
    /// swings of a bursty arrival process, and capacity ordered for a swing arrives minutes
    /// after it.
    pub headroom: f64,
    /// Learn the headroom instead: the extra load that covered this quantile of the
    /// shortfalls of each plan against the load seen one start-up lead later (see
    /// [`Headroom`]), starting from `headroom` × the planned load. `None` (the default):
    /// `headroom` fixed. Off by default: a quantile that spares steady traffic its headroom
    /// leaves too little for bursts of a minute or two, and one that covers those costs more
    /// than the fixed share.
    #[serde(default)]
    pub headroom_quantile: Option<f64>,
    /// Queued requests are planned to drain within this many seconds; `None` means the
    /// start-up lead: capacity ordered now serves only what is still queued when it is up.
    pub backlog_drain_s: Option<f64>,
    pub holt_alpha: f64,
    pub holt_beta: f64,
    /// The trend's damping time constant (see [`Holt`]).
    pub forecast_damping_s: f64,
    /// Forecast horizon; `None` means the longest start-up (new node) of the variants.
    pub forecast_horizon_s: Option<f64>,
    /// The forecast is at most this multiple of the observed rate: a trend learnt from a step
    /// (a flash crowd) would otherwise extrapolate it far past what any ramp reaches within
    /// a start-up lead.
    #[serde(default = "default_forecast_cap_ratio")]
    pub forecast_cap_ratio: f64,
    /// Panic when the short-window arrival rate exceeds the ready capacity by this factor...
    pub panic_rate_ratio: f64,
    /// ...or the queue holds more than this many seconds of the ready capacity.
    pub panic_queue_s: f64,
    pub panic_window_s: f64,
    /// The scale-down window to start from: it grows to the start-up lead while cuts are
    /// bought back within one, and shrinks back as cuts pay back (see [`Payback`]).
    pub scale_down_window_s: f64,
    /// A cheaper mix must pay back the start-up of its new replicas within this many seconds,
    /// or the current mix is kept.
    pub switch_amortise_s: f64,
    /// With no traffic for this long, floors fall from `keep_warm` to `min`.
    pub scale_to_zero_after_s: f64,
    /// Whether going to zero also has to fit the SLO's error budget (see [`ZeroRule`]).
    #[serde(default)]
    pub zero_rule: ZeroRule,
    /// A Spot replica pending longer than this means a stockout: use on-demand for a while.
    pub spot_stockout_after_s: f64,
    pub spot_retry_after_s: f64,
    /// Upper bound of the latency-driven planning margin.
    pub max_margin: f64,
    /// Share of first tokens the SLO wants within the TTFT target (0.99 for a p99): below
    /// it, measured over feasible requests, the planning margin grows.
    #[serde(default = "default_ttft_attainment_goal")]
    pub ttft_attainment_goal: f64,
}

impl SluiceConfig {
    pub fn new(slo: Slo, limits: Vec<VariantLimits>) -> Self {
        SluiceConfig {
            slo,
            planning: Planning::default(),
            limits,
            spot: false,
            headroom: 0.2,
            headroom_quantile: None,
            backlog_drain_s: None,
            holt_alpha: 0.3,
            holt_beta: 0.1,
            forecast_damping_s: 600.0,
            forecast_horizon_s: None,
            forecast_cap_ratio: default_forecast_cap_ratio(),
            panic_rate_ratio: 1.5,
            panic_queue_s: 10.0,
            panic_window_s: 60.0,
            scale_down_window_s: 300.0,
            switch_amortise_s: 600.0,
            scale_to_zero_after_s: 900.0,
            zero_rule: ZeroRule::Idle,
            spot_stockout_after_s: 600.0,
            spot_retry_after_s: 1800.0,
            max_margin: 1.5,
            ttft_attainment_goal: default_ttft_attainment_goal(),
        }
    }
}

fn default_forecast_cap_ratio() -> f64 {
    1.5
}

fn default_ttft_attainment_goal() -> f64 {
    0.99
}

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
    /// Recent planned demand (requests/s) for the scale-down window.
    history: VecDeque<(f64, f64)>,
    /// A cut the rising load held back and not yet judged: when, the demand the fleet less the
    /// replica held serves, and that replica's start-up lead.
    held_cut: Option<(f64, f64, f64)>,
    /// The scale-down window's length, grown by cuts bought back within a start-up.
    payback: Payback,
    /// Each offer key's start-up lead ([`plan::startup_times`]; the profile and limits are
    /// fixed for the policy's life).
    leads: Vec<f64>,
    panic_until: f64,
    last_traffic_s: f64,
    margin: f64,
    spot_out_until: HashMap<String, f64>,
    first_seen_s: Option<f64>,
    /// The first tick, for holding a fleet taken over before any traffic is seen.
    first_tick_s: Option<f64>,
    /// Per variant: capacity at SLO is divided by this while its own latency breaches the SLO.
    variant_margin: HashMap<String, f64>,
    /// The error budget a cold start must fit, under [`ZeroRule::ErrorBudget`].
    zero: Option<ZeroBudget>,
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
            last_traffic_s: f64::NEG_INFINITY,
            margin: 1.0,
            spot_out_until: HashMap::new(),
            learnt: None,
            zero: config.zero_rule.budget(),
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

    /// Widens the demand margin while first tokens are late with requests queued (too little
    /// capacity overall), or while fewer feasible first tokens than the SLO's share come in
    /// time with none queued (long prompts ahead of short ones in the replicas' own prefill),
    /// and narrows it back when the SLO is met with latency to spare. It does not
    /// widen while replicas are starting: capacity is already on its way, and integrating the
    /// error meanwhile would order more that arrives after the spike (anti-windup). A variant
    /// whose own replicas decode slower than the TPOT SLO has its capacity discounted instead
    /// (they are loaded past what they serve well): more of every variant would not fix it,
    /// fewer requests per replica of that one does. So does one whose first tokens are late
    /// with nothing queued while another variant prefills faster.
    fn update_margin(&mut self, s: &Signals, d: &mut Decision) {
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
        let arriving = s.variants.iter().any(|v| v.starting + v.pending > 0);
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
        let low = l.tpot_p99_s.is_some_and(|x| x < 0.8 * slo.tpot_p99_s) && ttft_met;
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

    fn spot_allowed(&mut self, s: &Signals, d: &mut Decision) -> HashMap<String, bool> {
        let mut out = HashMap::new();
        for l in &self.config.limits {
            if !self.config.spot {
                out.insert(l.variant.clone(), false);
                continue;
            }
            if let Some(v) = s.variant(&l.variant, CapacityType::Spot) {
                if v.pending > 0 && v.oldest_pending_s > self.config.spot_stockout_after_s {
                    self.spot_out_until
                        .insert(l.variant.clone(), s.time_s + self.config.spot_retry_after_s);
                }
                if v.preempted > 0 {
                    d.reason(
                        ReasonKind::SpotReplacement,
                        Some(&l.variant),
                        format!("{} Spot replicas preempted: replaced now", v.preempted),
                    );
                }
            }
            let out_of_stock = self
                .spot_out_until
                .get(&l.variant)
                .is_some_and(|&u| s.time_s < u);
            if out_of_stock {
                d.reason(
                    ReasonKind::Spot,
                    Some(&l.variant),
                    "Spot out of stock: on-demand fallback",
                );
            }
            out.insert(l.variant.clone(), !out_of_stock);
        }
        out
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

/// The demand stabilisation holds (see [`Sluice::stabilise`]).
#[derive(Debug, Clone, Copy)]
struct Stable {
    /// The demand the mix is sized for.
    demand: f64,
    /// The same without the hold of a rising load: where it is lower, the rise held a cut back.
    unheld_by_rise: f64,
}

/// What the bursts within a second ask of the fleet (see [`Sluice::burst_need`]).
#[derive(Debug, Clone, Copy)]
struct BurstNeed {
    /// Prompt tokens to prefill within the TTFT target.
    tokens: f64,
    /// The same as requests/s of the shape.
    rate: f64,
}

/// The lowest count a variant keeps: `min`, or `keep_warm` while traffic is recent.
fn floor(l: &VariantLimits, idle: bool) -> u32 {
    if idle {
        l.min
    } else {
        l.min.max(l.keep_warm)
    }
}

/// The most capacity (requests/s) stabilisation holds: what runs and is on its way; while the
/// pool is idle (nothing arrived within the window, nothing queued or running), what is ready.
/// A replica still starting when traffic stops would be paid for through the rest of its
/// start-up and the scale-down window, to serve traffic that has gone (idle-gaps: the replica
/// a five-minute session ordered arrived after it); what a return needs is kept warm after
/// ([`Sluice::keep_warm_for_return`]).
fn holdable_capacity(s: &Signals, ready: f64, current: f64) -> f64 {
    let idle = s.arrivals.requests_per_s <= 0.0 && s.queue.waiting == 0 && s.queue.running == 0;
    if idle {
        ready.min(current)
    } else {
        current
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

    /// Each variant's capacity at SLO for the shape, divided by its latency margin.
    fn capacities(
        &self,
        limits: &[VariantLimits],
        w: &Workload,
        d: &mut Decision,
    ) -> Vec<Capacity> {
        let (mut caps, relaxed) = plan::capacities(
            &self.profile,
            limits,
            w,
            &self.config.slo,
            &self.config.planning,
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

    /// Replicas per offer key that will serve: Spot replicas still pending in a stockout are
    /// not coming, so the plan goes without them.
    fn coming_counts(
        &self,
        s: &Signals,
        limits: &[VariantLimits],
        spot_ok: &HashMap<String, bool>,
    ) -> Vec<u32> {
        let spot = self.config.spot;
        plan::offer_keys(limits)
            .iter()
            .zip(&plan::current_counts(s, limits))
            .map(|((n, c), &k)| {
                let stocked_out =
                    *c == CapacityType::Spot && spot && !spot_ok.get(n).copied().unwrap_or(false);
                if stocked_out {
                    k - s.variant(n, *c).map_or(0, |v| v.pending).min(k)
                } else {
                    k
                }
            })
            .collect()
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
    fn prompt_floors(
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
        let burst = self.burst_need(s, (limits, caps), w);
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
    fn top_up_prefill(
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

    /// Stabilisation (HPA's, on the planned demand rather than per variant, so a switch of
    /// mix is never half held back): up at once, down only to the highest demand planned
    /// within the window; in panic, not down at all; not while the load is rising (a cut the
    /// forecast expects to buy back within a start-up, where a lull inside a ramp would
    /// release what the ramp needs a start-up later); and not before a full window of
    /// arrivals has been measured (taking over a running fleet, the first rates are not yet
    /// rates). Never above `holdable` ([`holdable_capacity`]). The demand the mix is sized
    /// for.
    fn stabilise(
        &mut self,
        t: f64,
        p: &Planned,
        holdable: f64,
        panic: bool,
        d: &mut Decision,
    ) -> Stable {
        let planned = p.planned;
        let held_now = if panic || p.warming || p.rising {
            planned.max(holdable)
        } else {
            planned
        };
        // The window remembers the demand planned, not the fleet panic held: replicas bought
        // for a backlog that has drained are not held for a whole window after the panic.
        // While the first window is measured the fleet is remembered (its rates are not yet
        // rates).
        let remembered = if p.warming { held_now } else { planned };
        self.history.push_back((t, remembered));
        while self
            .history
            .front()
            .is_some_and(|&(h, _)| h < t - self.payback.window_s())
        {
            self.history.pop_front();
        }
        // Holding never grows the fleet: at most what runs now (what is ready, while idle).
        let held = self
            .history
            .iter()
            .map(|&(_, p)| p)
            .fold(0.0, f64::max)
            .min(holdable);
        let stable = planned.max(held).max(held_now);
        // What the rise alone holds is what `stable` exceeds this by.
        let unheld = if panic || p.warming {
            stable
        } else {
            planned.max(held)
        };
        if stable > planned + 1e-9 && stable > 0.0 {
            let why = if panic {
                ": panic, no scale-down".to_string()
            } else if p.warming {
                ": still measuring the first window".to_string()
            } else if stable > unheld + 1e-9 {
                format!(
                    ": load rising (forecast {:.2} req/s in {:.0}s), no scale-down",
                    p.forecast,
                    self.horizon_s()
                )
            } else {
                format!(" for the {:.0}s scale-down window", self.payback.window_s())
            };
            d.reason(
                ReasonKind::Stabilisation,
                None,
                format!("holding {stable:.2} req/s (planned {planned:.2}){why}"),
            );
        }
        Stable {
            demand: stable,
            unheld_by_rise: unheld,
        }
    }

    /// A cut the rising load held back (see [`Sluice::stabilise`]) is judged as a cut: when,
    /// within the start-up lead of the smallest replica it kept, the demand without that hold
    /// is back above what the fleet less that replica serves, the cut would have been bought
    /// back, and the scale-down window grows as for one (see [`Payback`]). Otherwise the
    /// policy would not learn that this traffic's lulls are shorter than a start-up.
    fn judge_held_cut(
        &mut self,
        t: f64,
        (offers, current): (&[Offer], &[u32]),
        capacity: f64,
        held: Stable,
        d: &mut Decision,
    ) {
        if let Some((at, level, lead_s)) = self.held_cut {
            if t - at >= lead_s {
                self.held_cut = None;
            } else if held.unheld_by_rise > level + 1e-9 {
                self.held_cut = None;
                self.payback.bought_back(lead_s);
                d.reason(
                    ReasonKind::Stabilisation,
                    None,
                    format!(
                        "a cut the rising load held back {:.0}s ago would have been bought \
                         again: scale-down window now {:.0}s",
                        t - at,
                        self.payback.window_s()
                    ),
                );
            }
        }
        if held.demand <= held.unheld_by_rise + 1e-9 {
            return;
        }
        let smallest = offers
            .iter()
            .zip(current)
            .zip(&self.leads)
            .filter(|((o, &n), _)| n > 0 && o.requests_per_s > 0.0)
            .map(|((o, _), &lead_s)| (o.requests_per_s, lead_s))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((per_replica, lead_s)) = smallest {
            let level = capacity - per_replica;
            if level >= held.unheld_by_rise {
                self.held_cut = Some((t, level, lead_s));
            }
        }
    }

    /// Whether the last cuts of the fleet paid back (see [`Payback`]): a variant bought again
    /// within its start-up lead of a cut lengthens the scale-down window.
    fn judge_cuts(&mut self, t: f64, current: &[u32], counts: &[u32], d: &mut Decision) {
        if let Verdict::BoughtBack { after_s, lead_s } =
            self.payback.observe(t, current, counts, &self.leads)
        {
            d.reason(
                ReasonKind::Stabilisation,
                None,
                format!(
                    "replicas cut {after_s:.0}s ago bought again within their {lead_s:.0}s \
                     start-up: scale-down window now {:.0}s",
                    self.payback.window_s()
                ),
            );
        }
    }

    /// Under [`ZeroRule::ErrorBudget`], an idle pool goes to zero only when the cold start
    /// that would wake it fits the error budget; otherwise it keeps capacity for the rate its
    /// traffic returns at, also while the arrival window refills after the return (the
    /// windowed rate then understates it). The demand to size the mix for.
    fn keep_warm_for_return(
        &mut self,
        s: &Signals,
        limits: &[VariantLimits],
        caps: &[Capacity],
        stable: f64,
        d: &mut Decision,
    ) -> f64 {
        let Some(z) = self.zero.as_mut() else {
            return stable;
        };
        if !z.idle_or_returning(s.time_s, s.arrivals.window_s) {
            return stable;
        }
        // The replica that would wake the pool: the quickest to start of those that serve.
        let startup = limits
            .iter()
            .zip(caps)
            .filter(|(_, c)| c.requests_per_s > 0.0)
            .filter_map(|(l, _)| self.profile.variant(&l.variant).ok())
            .map(|v| v.startup_s(true))
            .fold(f64::INFINITY, f64::min);
        if !startup.is_finite() {
            return stable;
        }
        let ttft = self.config.slo.ttft_p99_s;
        if stable <= 0.0 && z.allows_zero(startup, ttft) {
            return stable;
        }
        let warm = z.warm_capacity(startup, ttft);
        if warm <= 0.0 || stable >= warm {
            return stable;
        }
        d.reason(
            ReasonKind::ScaleToZero,
            None,
            format!(
                "a cold start would miss ~{:.0} requests, over the {:.0} the error budget \
                 has left: {warm:.2} req/s kept for the traffic's return",
                z.expected_misses(startup, ttft),
                z.remaining()
            ),
        );
        warm
    }

    /// The replicas per offer key for `stable` req/s: the cheapest mix (or the current one
    /// when switching pays back too slowly), keeping ready replicas until their
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
        let caps = self.capacities(&limits, &w, &mut d);
        let keys = plan::offer_keys(&limits);
        let ready_cap = ready_capacity(s, &keys, &caps);
        let panic = self.update_panic(s, ready_cap, &mut d);
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
        let offers = plan::offers(&self.profile, &limits, &caps, &current, allow, |l| {
            floor(l, idle)
        });
        let current_capacity = mix::evaluate(&offers, &current).requests_per_s;
        let holdable = holdable_capacity(s, ready_cap, current_capacity);
        let held = self.stabilise(s.time_s, &p, holdable, panic, &mut d);
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

//! sluice's policy: size the fleet from demand at SLO, cheapest mix first.
//!
//! Each tick: smooth the arrival rate with Holt's trend and forecast it over the start-up lead
//! time; plan for the larger of the observed and forecast rate (the short-window rate too in
//! panic), plus headroom, plus a rate that drains the backlog; convert each variant's capacity
//! at SLO into offers (Spot first, on-demand when Spot is out of stock); pick the cheapest mix
//! (keeping the current one when switching saves too little); scale up at once and scale down
//! only to the highest recommendation of the stabilisation window, never in panic. Latency
//! above the SLO widens the planning margin, latency well below narrows it back.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::plan::{self, VariantLimits};
use super::Policy;
use crate::capacity::{Planning, Slo, Workload};
use crate::decision::{Decision, Demand, Mode, ReasonKind};
use crate::forecast::Holt;
use crate::profile::{CapacityType, Profile};
use crate::signals::Signals;

/// The policy's knobs. Defaults follow the autoscalers people know: HPA's five-minute
/// scale-down stabilisation, KPA's sixty-second panic window.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SluiceConfig {
    pub slo: Slo,
    pub planning: Planning,
    pub limits: Vec<VariantLimits>,
    /// Buy Spot first (on-demand when Spot is out of stock).
    pub spot: bool,
    /// Extra capacity over the planned rate, for arrivals' spread within the window.
    pub headroom: f64,
    /// Queued requests are planned to drain within this many seconds.
    pub backlog_drain_s: f64,
    pub holt_alpha: f64,
    pub holt_beta: f64,
    /// Forecast horizon; `None` means the longest start-up (new node) of the variants.
    pub forecast_horizon_s: Option<f64>,
    /// Panic when the short-window arrival rate exceeds the ready capacity by this factor...
    pub panic_rate_ratio: f64,
    /// ...or the queue holds more than this many seconds of the ready capacity.
    pub panic_queue_s: f64,
    pub panic_window_s: f64,
    pub scale_down_window_s: f64,
    /// Keep the current mix unless the cheapest costs this share less.
    pub switch_tolerance: f64,
    /// With no traffic for this long, floors fall from `keep_warm` to `min`.
    pub scale_to_zero_after_s: f64,
    /// A Spot replica pending longer than this means a stockout: use on-demand for a while.
    pub spot_stockout_after_s: f64,
    pub spot_retry_after_s: f64,
    /// Upper bound of the latency-driven planning margin.
    pub max_margin: f64,
}

impl SluiceConfig {
    pub fn new(slo: Slo, limits: Vec<VariantLimits>) -> Self {
        SluiceConfig {
            slo,
            planning: Planning::default(),
            limits,
            spot: false,
            headroom: 0.1,
            backlog_drain_s: 30.0,
            holt_alpha: 0.3,
            holt_beta: 0.1,
            forecast_horizon_s: None,
            panic_rate_ratio: 1.5,
            panic_queue_s: 10.0,
            panic_window_s: 60.0,
            scale_down_window_s: 300.0,
            switch_tolerance: 0.1,
            scale_to_zero_after_s: 900.0,
            spot_stockout_after_s: 600.0,
            spot_retry_after_s: 1800.0,
            max_margin: 1.5,
        }
    }
}

/// The policy with its memory.
#[derive(Debug, Clone)]
pub struct Sluice {
    config: SluiceConfig,
    profile: Profile,
    holt: Holt,
    shape: Option<Workload>,
    /// Per offer key: recent recommendations for the scale-down window.
    history: Vec<VecDeque<(f64, u32)>>,
    panic_until: f64,
    last_traffic_s: f64,
    margin: f64,
    spot_out_until: HashMap<String, f64>,
    seeded: bool,
}

impl Sluice {
    pub fn new(profile: Profile, config: SluiceConfig) -> Self {
        let keys = plan::offer_keys(&config.limits).len();
        Sluice {
            holt: Holt::new(config.holt_alpha, config.holt_beta),
            history: vec![VecDeque::new(); keys],
            profile,
            config,
            shape: None,
            panic_until: f64::NEG_INFINITY,
            last_traffic_s: f64::NEG_INFINITY,
            margin: 1.0,
            spot_out_until: HashMap::new(),
            seeded: false,
        }
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

    /// Widens the margin while latency breaches the SLO for reasons capacity fixes (slow
    /// decode, or slow first tokens with a queue), narrows it back when well below.
    fn update_margin(&mut self, s: &Signals, d: &mut Decision) {
        let slo = self.config.slo;
        let l = &s.latency;
        let tpot_high = l.tpot_p99_s.is_some_and(|x| x > slo.tpot_p99_s);
        let ttft_high = l.ttft_p99_s.is_some_and(|x| x > slo.ttft_p99_s) && s.queue.waiting > 0;
        let low = l.tpot_p99_s.is_some_and(|x| x < 0.8 * slo.tpot_p99_s)
            && l.ttft_p99_s.is_some_and(|x| x < 0.8 * slo.ttft_p99_s);
        if tpot_high || ttft_high {
            self.margin = (self.margin * 1.1).min(self.config.max_margin);
            d.reason(
                ReasonKind::LatencyBreach,
                None,
                format!(
                    "TTFT p99 {:.2}s, TPOT p99 {:.0}ms over the SLO: planning margin ×{:.2}",
                    l.ttft_p99_s.unwrap_or(0.0),
                    l.tpot_p99_s.unwrap_or(0.0) * 1e3,
                    self.margin
                ),
            );
        } else if low {
            self.margin = (self.margin * 0.97).max(1.0);
        }
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
            let out_of_stock = self.spot_out_until.get(&l.variant).is_some_and(|&u| s.time_s < u);
            if out_of_stock {
                d.reason(ReasonKind::Spot, Some(&l.variant), "Spot out of stock: on-demand fallback");
            }
            out.insert(l.variant.clone(), !out_of_stock);
        }
        out
    }
}

impl Policy for Sluice {
    fn name(&self) -> &str {
        "sluice"
    }

    fn decide(&mut self, s: &Signals) -> Decision {
        let t = s.time_s;
        let mut d = Decision {
            time_s: t,
            model: s.model.clone(),
            ..Decision::default()
        };
        let a = &s.arrivals;
        self.holt.observe(t, a.requests_per_s);
        if a.requests_per_s > 0.0 || s.queue.waiting > 0 || s.queue.running > 0 {
            self.last_traffic_s = t;
        }
        if let Some((p, o)) = s.request_shape() {
            self.shape = Some(Workload {
                mean_prompt_tokens: p,
                mean_output_tokens: o,
            });
        }
        let limits = self.config.limits.clone();
        let current = plan::current_counts(s, &limits);
        let idle = t - self.last_traffic_s > self.config.scale_to_zero_after_s;
        let floor = |l: &VariantLimits| if idle { l.min } else { l.min.max(l.keep_warm) };
        let Some(w) = self.shape else {
            // Nothing ever arrived: floors only.
            let counts: Vec<u32> = plan::offer_keys(&limits)
                .iter()
                .enumerate()
                .map(|(k, (_, c))| if *c == CapacityType::OnDemand { floor(&limits[k / 2]) } else { 0 })
                .collect();
            d.reason(ReasonKind::MinMax, None, "no traffic seen yet: floors only");
            plan::fill_targets(&mut d, &self.profile, &limits, &counts);
            return d;
        };
        let (caps, relaxed) = plan::capacities(&self.profile, &limits, &w, &self.config.slo, &self.config.planning);
        for (l, c) in limits.iter().zip(&caps) {
            if c.requests_per_s == 0.0 {
                d.reason(ReasonKind::Ineligible, Some(&l.variant), "cannot meet the SLO for this request shape");
            }
        }
        if relaxed {
            d.reason(ReasonKind::Ineligible, None, "no variant meets the TTFT target for this prompt length; sized for TPOT only");
        }
        let keys = plan::offer_keys(&limits);
        let ready_capacity: f64 = keys
            .iter()
            .enumerate()
            .map(|(k, (n, c))| {
                f64::from(s.variant(n, *c).map_or(0, |v| v.ready)) * caps[k / 2].requests_per_s
            })
            .sum();

        // Panic: a spike the long window has not caught up with, or a queue the ready fleet
        // cannot drain soon.
        let spike = a.short_requests_per_s > self.config.panic_rate_ratio * ready_capacity;
        let queue_spike = s.queue.waiting as f64 > self.config.panic_queue_s * ready_capacity.max(1e-9);
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
        let panic = t < self.panic_until;
        d.mode = if panic { Mode::Panic } else { Mode::Stable };

        self.update_margin(s, &mut d);
        let horizon = self.horizon_s();
        let forecast = self.holt.forecast(horizon).unwrap_or(0.0);
        let mut base = a.requests_per_s.max(forecast);
        if forecast > a.requests_per_s {
            d.reason(
                ReasonKind::Forecast,
                None,
                format!("rate {:.2}/s forecast to {:.2}/s in {:.0}s", a.requests_per_s, forecast, horizon),
            );
        }
        if panic {
            base = base.max(a.short_requests_per_s);
        }
        // Replicas ordered for a backlog arrive minutes later, when most of it has drained
        // through the fleet that exists: the backlog at most doubles the planned rate.
        let backlog = (s.queue.waiting as f64 / self.config.backlog_drain_s).min(base.max(1e-3));
        if s.queue.waiting > 0 {
            d.reason(
                ReasonKind::Backlog,
                None,
                format!("{} queued: +{:.2}/s to drain in {:.0}s", s.queue.waiting, backlog, self.config.backlog_drain_s),
            );
        }
        let mut planned = base * (1.0 + self.config.headroom) * self.margin + backlog;
        if idle {
            planned = 0.0;
            d.reason(ReasonKind::ScaleToZero, None, "idle past the scale-to-zero delay");
        }

        let spot_ok = self.spot_allowed(s, &mut d);
        let spot = self.config.spot;
        let allow = |n: &str, c: CapacityType| match c {
            CapacityType::Spot => spot && spot_ok.get(n).copied().unwrap_or(false),
            CapacityType::OnDemand => !(spot && spot_ok.get(n).copied().unwrap_or(false)),
        };
        let offers = plan::offers(&self.profile, &limits, &caps, &current, allow, floor);
        let (mix, why) = plan::keep_or_switch(&offers, &current, planned, self.config.switch_tolerance);
        d.reason(
            why,
            None,
            format!("{:.2} req/s planned: ${:.2}/h for {:.2} req/s at SLO", planned, mix.cost_per_hour, mix.requests_per_s),
        );
        if mix.requests_per_s + 1e-9 < planned {
            d.reason(ReasonKind::MinMax, None, "every variant at its maximum and still short");
        }

        // Stabilisation: up at once, down to the window's highest recommendation; panic holds.
        // The first tick seeds the window with the fleet as found, so a policy taking over a
        // running fleet does not shrink it on its first, least informed, look.
        let mut counts = Vec::with_capacity(keys.len());
        for (k, (name, _)) in keys.iter().enumerate() {
            let rec = mix.counts[k];
            let hist = &mut self.history[k];
            if !self.seeded {
                hist.push_back((t, current[k]));
            }
            hist.push_back((t, rec));
            while hist.front().is_some_and(|&(h, _)| h < t - self.config.scale_down_window_s) {
                hist.pop_front();
            }
            let cur = current[k];
            let n = if rec >= cur {
                rec
            } else if panic {
                d.reason(ReasonKind::Stabilisation, Some(name), format!("panic: holding {cur} (wanted {rec})"));
                cur
            } else {
                let windowed = hist.iter().map(|&(_, n)| n).max().unwrap_or(rec).min(cur);
                if windowed > rec {
                    d.reason(
                        ReasonKind::Stabilisation,
                        Some(name),
                        format!("holding {windowed} (wanted {rec}) for the scale-down window"),
                    );
                }
                windowed
            };
            counts.push(n);
        }
        self.seeded = true;
        let ready = plan::ready_counts(s, &limits);
        if plan::make_before_break(&offers, &current, &ready, &mut counts, planned) {
            d.reason(ReasonKind::Stabilisation, None, "keeping ready replicas until their replacements are ready");
        }
        d.demand = Demand {
            observed_requests_per_s: a.requests_per_s,
            forecast_requests_per_s: forecast,
            backlog_requests_per_s: backlog,
            planned_requests_per_s: planned,
            mean_prompt_tokens: w.mean_prompt_tokens,
            mean_output_tokens: w.mean_output_tokens,
            capacity_requests_per_s: crate::mix::evaluate(&offers, &counts).requests_per_s,
            cost_per_hour: crate::mix::evaluate(&offers, &counts).cost_per_hour,
        };
        plan::fill_targets(&mut d, &self.profile, &limits, &counts);
        d
    }
}

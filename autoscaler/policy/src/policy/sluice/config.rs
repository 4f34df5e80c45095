//! [`SluiceConfig`]: the policy's knobs and their defaults.

use serde::{Deserialize, Serialize};

use crate::capacity::{Planning, Slo};
use crate::policy::plan::VariantLimits;
use crate::zero::ZeroRule;

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
    /// [`crate::headroom::Headroom`]), starting from `headroom` × the planned load. `None`
    /// (the default): `headroom` fixed. Off by default: a quantile that spares steady traffic
    /// its headroom leaves too little for bursts of a minute or two, and one that covers those
    /// costs more than the fixed share.
    #[serde(default)]
    pub headroom_quantile: Option<f64>,
    /// Queued requests are planned to drain within this many seconds; `None` means the
    /// start-up lead: capacity ordered now serves only what is still queued when it is up.
    pub backlog_drain_s: Option<f64>,
    pub holt_alpha: f64,
    pub holt_beta: f64,
    /// The trend's damping time constant (see [`crate::forecast::Holt`]).
    pub forecast_damping_s: f64,
    /// Forecast horizon; `None` means the longest start-up (new node) of the variants.
    pub forecast_horizon_s: Option<f64>,
    /// The forecast is at most this multiple of the observed rate: a trend learnt from a step
    /// (a flash crowd) would otherwise extrapolate it far past what any ramp reaches within
    /// a start-up lead.
    #[serde(default = "default_forecast_cap_ratio")]
    pub forecast_cap_ratio: f64,
    /// While the rate is within the highest seen over a start-up lead ago, the rate with its
    /// forecast and headroom is planned at most this multiple of that peak (see the policy's
    /// `ceiling` module); `None`: no ceiling.
    #[serde(default = "default_seen_peak_ratio")]
    pub seen_peak_ratio: Option<f64>,
    /// Panic when the short-window arrival rate exceeds the ready capacity by this factor...
    pub panic_rate_ratio: f64,
    /// ...or the queue holds more than this many seconds of the ready capacity.
    pub panic_queue_s: f64,
    pub panic_window_s: f64,
    /// The scale-down window to start from: it grows to the start-up lead while cuts are
    /// bought back within one, and shrinks back as cuts pay back (see [`crate::payback::Payback`]).
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
            seen_peak_ratio: default_seen_peak_ratio(),
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

fn default_seen_peak_ratio() -> Option<f64> {
    Some(1.4)
}

fn default_ttft_attainment_goal() -> f64 {
    0.99
}

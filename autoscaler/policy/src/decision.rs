//! What the policy answers: replicas per variant, nodes per pool, and why.
//!
//! A [`Decision`] is complete (every variant the policy manages appears, zero included) so an
//! actuator can apply it without remembering the previous one, and it carries [`Reason`]s so
//! the controller can put them in the `ServingPool` status and logs can say which signal or
//! constraint bound each number.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::profile::CapacityType;

/// The policy's answer for one model at one tick.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Decision {
    pub time_s: f64,
    pub model: String,
    pub mode: Mode,
    /// Desired replicas per (variant, capacity type).
    pub targets: Vec<Target>,
    /// Nodes each pool needs for those replicas (gangs packed whole onto nodes).
    pub pools: Vec<PoolTarget>,
    /// The demand the targets were sized for.
    pub demand: Demand,
    pub reasons: Vec<Reason>,
}

/// Desired replicas of one variant bought one way.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Target {
    pub variant: String,
    pub capacity: CapacityType,
    pub replicas: u32,
}

/// Desired nodes in one pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PoolTarget {
    pub variant: String,
    pub capacity: CapacityType,
    pub nodes: u32,
}

/// Normal operation, or panic after a spike (scale up at once, no scale-down for a window).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Stable,
    Panic,
}

/// The demand a decision planned for, in requests/s of the observed shape.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Demand {
    pub observed_requests_per_s: f64,
    pub forecast_requests_per_s: f64,
    /// Extra rate to drain the backlog within the drain window.
    pub backlog_requests_per_s: f64,
    /// What the mix must serve at SLO, after headroom.
    pub planned_requests_per_s: f64,
    pub mean_prompt_tokens: f64,
    pub mean_output_tokens: f64,
    /// Capacity of the chosen targets at SLO (requests/s), and their cost per hour.
    pub capacity_requests_per_s: f64,
    pub cost_per_hour: f64,
}

/// One reason behind a decision: which signal or constraint, for which variant, and a sentence.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Reason {
    pub kind: ReasonKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub detail: String,
}

/// What bound a number in a decision.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum ReasonKind {
    /// Sized from the arrival rate.
    ArrivalRate,
    /// The forecast over the start-up lead time was above the current rate.
    Forecast,
    /// Extra capacity to drain queued requests.
    Backlog,
    /// Observed latency above the SLO raised the planning margin.
    LatencyBreach,
    /// The queue spiked: panic mode.
    Panic,
    /// A scale-down was held back by the stabilisation window or panic mode.
    Stabilisation,
    /// The variant mix was chosen as the cheapest cost per token at SLO.
    CheapestMix,
    /// The current mix was kept because switching would save too little.
    KeepMix,
    /// More replicas than the rate needs, so that first tokens are not stuck behind long
    /// prompts (a heavy tail of prompt lengths).
    PromptTail,
    /// More replicas than the rate needs, so that the prompts of requests arriving together
    /// (within a second) are prefilled within the TTFT target.
    Burst,
    /// A variant cannot meet the SLO for this workload (prefill too slow, KV too small).
    Ineligible,
    /// Bounded by a min or max replica count.
    MinMax,
    /// Kept warm instead of scaling to zero.
    KeepWarm,
    /// Scaled to zero after idling.
    ScaleToZero,
    /// Spot preferred; or on-demand used because Spot is out of stock.
    Spot,
    /// Replacing Spot capacity that was preempted.
    SpotReplacement,
    /// A baseline's own rule (HPA's formula, KPA's windows, the oracle's lookahead).
    Baseline,
}

impl Decision {
    /// Desired replicas for a variant and capacity type (zero if absent).
    pub fn replicas(&self, variant: &str, capacity: CapacityType) -> u32 {
        self.targets
            .iter()
            .find(|t| t.variant == variant && t.capacity == capacity)
            .map_or(0, |t| t.replicas)
    }

    /// Desired replicas of a variant, Spot and on-demand together.
    pub fn replicas_of(&self, variant: &str) -> u32 {
        self.targets
            .iter()
            .filter(|t| t.variant == variant)
            .map(|t| t.replicas)
            .sum()
    }

    pub fn reason(&mut self, kind: ReasonKind, variant: Option<&str>, detail: impl Into<String>) {
        self.reasons.push(Reason {
            kind,
            variant: variant.map(str::to_string),
            detail: detail.into(),
        });
    }

    pub fn has_reason(&self, kind: ReasonKind) -> bool {
        self.reasons.iter().any(|r| r.kind == kind)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = serde_json::to_value(self.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        match &self.variant {
            Some(v) => write!(f, "[{kind}] {v}: {}", self.detail),
            None => write!(f, "[{kind}] {}", self.detail),
        }
    }
}

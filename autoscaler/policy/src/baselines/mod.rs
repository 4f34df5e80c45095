//! The autoscalers people use today, on the same [`Signals`](crate::signals::Signals), so the
//! simulator compares like with like.
//!
//! - [`hpa`]: Kubernetes' HorizontalPodAutoscaler formula, tolerance and stabilisation, on CPU
//!   utilisation (`hpa-cpu`) or on in-flight requests per replica (`hpa-concurrency`).
//! - [`kpa`]: Knative's autoscaler, stable and panic windows on concurrency.
//! - [`static_peak`]: the cheapest fleet for the trace's peak, all the time.
//! - [`oracle`]: knows the future arrivals; the cost floor for the SLO given start-up delays.
//!
//! Single-variant baselines scale one variant (the scenario picks the one with the lowest cost
//! per request at SLO for the trace's mean shape), as a Deployment with an HPA does.

pub mod hpa;
pub mod kpa;
pub mod oracle;
pub mod static_peak;

use crate::decision::{Decision, Mode};
use crate::policy::plan::{self, VariantLimits};
use crate::profile::{CapacityType, Profile};

/// A single-variant decision: `n` replicas of `variant` bought as `capacity`.
pub(crate) fn single(
    time_s: f64,
    model: &str,
    profile: &Profile,
    variant: &str,
    capacity: CapacityType,
    n: u32,
    mode: Mode,
) -> Decision {
    let mut d = Decision {
        time_s,
        model: model.to_string(),
        mode,
        ..Decision::default()
    };
    let limits = [VariantLimits::new(variant, n)];
    let counts: Vec<u32> = plan::offer_keys(&limits)
        .iter()
        .map(|(_, c)| if *c == capacity { n } else { 0 })
        .collect();
    plan::fill_targets(&mut d, profile, &limits, &counts);
    d
}

//! Spot capacity: stockouts (a Spot replica pending too long) fall back to on-demand for a
//! while, Spot replicas still pending in a stockout are planned as not coming, and a Spot
//! replica is credited with the share of its time it serves between reclaims.

use std::collections::HashMap;

use super::Sluice;
use crate::decision::{Decision, ReasonKind};
use crate::mix::Offer;
use crate::policy::plan::{self, VariantLimits};
use crate::profile::CapacityType;
use crate::signals::Signals;

impl Sluice {
    pub(super) fn spot_allowed(&mut self, s: &Signals, d: &mut Decision) -> HashMap<String, bool> {
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

    /// Spot offers credited with the share of its time a replica serves: after each reclaim
    /// its replacement starts on a new node, a start-up lead `L` without it, so at `λ`
    /// reclaims per replica-second a Spot replica serves `1 − λ·L` of the time (at least
    /// half: past that, reclaims are an outage, not a discount). λ is measured here, from
    /// each tick's reclaims.
    pub(super) fn discount_reclaims(
        &mut self,
        s: &Signals,
        offers: &mut [Offer],
        d: &mut Decision,
    ) {
        for (k, o) in offers.iter_mut().enumerate() {
            if o.capacity != CapacityType::Spot {
                continue;
            }
            let Some(v) = s.variant(&o.variant, CapacityType::Spot) else {
                continue;
            };
            let rate = self.spot_reclaims.entry(o.variant.clone()).or_default();
            rate.observe(s.time_s, v.ready + v.starting, v.preempted);
            let share = rate.serving_share(self.leads[k]);
            if share < 1.0 {
                o.requests_per_s *= share;
                d.reason(
                    ReasonKind::Spot,
                    Some(&o.variant),
                    format!(
                        "{:.2} Spot reclaims per replica-hour: each replica credited with {:.0} % \
                         of its capacity, the rest spent replacing it",
                        rate.per_hour(),
                        share * 100.0
                    ),
                );
            }
        }
    }

    /// Replicas per offer key that will serve: Spot replicas still pending in a stockout are
    /// not coming, so the plan goes without them.
    pub(super) fn coming_counts(
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
}

/// Spot reclaims per replica-second of one variant, counted with an hour's exponential
/// memory and a prior of one replica-hour without any, so that the first reclaim of a small
/// fleet reads as a rate, not as certainty.
#[derive(Debug, Clone, Default)]
pub(super) struct ReclaimRate {
    reclaims: f64,
    replica_s: f64,
    last_s: Option<f64>,
}

impl ReclaimRate {
    const MEMORY_S: f64 = 3600.0;
    const PRIOR_REPLICA_S: f64 = 3600.0;

    /// `replicas` Spot replicas on a node since the last observation (ready or starting; a
    /// pending one has no node to lose), `reclaimed` taken back.
    pub(super) fn observe(&mut self, t: f64, replicas: u32, reclaimed: u32) {
        if let Some(last) = self.last_s {
            let dt = (t - last).max(0.0);
            let keep = (-dt / Self::MEMORY_S).exp();
            self.reclaims *= keep;
            self.replica_s = self.replica_s * keep + f64::from(replicas) * dt;
        }
        self.reclaims += f64::from(reclaimed);
        self.last_s = Some(t);
    }

    pub(super) fn per_hour(&self) -> f64 {
        3600.0 * self.reclaims / (self.replica_s + Self::PRIOR_REPLICA_S)
    }

    /// The share of its time a Spot replica serves when each reclaim costs `lead_s`.
    pub(super) fn serving_share(&self, lead_s: f64) -> f64 {
        (1.0 - self.per_hour() / 3600.0 * lead_s).clamp(0.5, 1.0)
    }
}

//! Spot capacity: stockouts (a Spot replica pending too long) fall back to on-demand for a
//! while, and Spot replicas still pending in a stockout are planned as not coming.

use std::collections::HashMap;

use super::Sluice;
use crate::decision::{Decision, ReasonKind};
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

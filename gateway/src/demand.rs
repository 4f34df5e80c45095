//! [`Demand`]: what a routing gateway saw of each model's traffic at its front door — the
//! requests that arrived for it, their first tokens as the client waited for them, the ones
//! that went unserved, and the prompts refused as too long (`sluice_gateway_model_*`, named in
//! `sluice-metrics`).
//!
//! Replicas count only what reaches them. Behind a gateway that holds requests until a replica
//! has room and refuses them past its bounds, a replica's arrivals are at most what the fleet
//! already serves, its TTFT leaves out the wait in the gateway's queue, and a refused request
//! leaves no trace on any replica: an overload that the gateway sheds would read as a fleet
//! keeping up. The autoscaler reads these series instead where a gateway exports them.
//!
//! The request's scope (`api::scope`) records into this: it knows when a request became
//! demand, when its first token came and how it ended.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use sluice_metrics::{gateway, vllm};

/// The per-model front-door series.
#[derive(Debug, Clone)]
pub struct Demand {
    arrivals: IntCounterVec,
    ttft: HistogramVec,
    unserved: IntCounterVec,
    refused_prompts: HistogramVec,
}

impl Demand {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let arrivals = IntCounterVec::new(
            Opts::new(
                gateway::ARRIVALS_TOTAL,
                "Requests routed for a model that passed their tenant's limits, refused ones \
                 included.",
            ),
            &[gateway::MODEL],
        )?;
        let ttft = HistogramVec::new(
            HistogramOpts::new(
                gateway::TIME_TO_FIRST_TOKEN_SECONDS,
                "Time from a routed request's arrival to the first byte of a replica's \
                 successful answer, queueing in the gateway included.",
            )
            .buckets(vllm::TTFT_BUCKETS.to_vec()),
            &[gateway::MODEL],
        )?;
        let unserved = IntCounterVec::new(
            Opts::new(
                gateway::UNSERVED_TOTAL,
                "Routed requests that ended without a first token for want of capacity or a \
                 working replica (429 or 5xx), by model and reason.",
            ),
            &[gateway::MODEL, gateway::REASON],
        )?;
        let refused_prompts = HistogramVec::new(
            HistogramOpts::new(
                gateway::REFUSED_PROMPT_TOKENS,
                "Estimated prompt tokens of routed requests refused as too long (400 \
                 context_length_exceeded) with no ready replica taking longer prompts.",
            )
            .buckets(vllm::request_tokens_buckets()),
            &[gateway::MODEL],
        )?;
        registry.register(Box::new(arrivals.clone()))?;
        registry.register(Box::new(ttft.clone()))?;
        registry.register(Box::new(unserved.clone()))?;
        registry.register(Box::new(refused_prompts.clone()))?;
        Ok(Self {
            arrivals,
            ttft,
            unserved,
            refused_prompts,
        })
    }

    /// A request for `model` arrived. `model` must be one this gateway serves (a label per
    /// model ever asked for would grow without bound).
    pub fn arrived(&self, model: &str) {
        self.arrivals.with_label_values(&[model]).inc();
    }

    /// Its first token came `seconds` after it arrived.
    pub fn first_token(&self, model: &str, seconds: f64) {
        self.ttft.with_label_values(&[model]).observe(seconds);
    }

    /// It was refused as too long, its prompt estimated at `tokens`, by the replica of its
    /// model that takes the longest prompts of those ready (`router::bounds`).
    pub fn refused_prompt(&self, model: &str, tokens: usize) {
        self.refused_prompts
            .with_label_values(&[model])
            .observe(tokens as f64);
    }

    /// It ended with HTTP `status` and no first token; counted when that is the fleet's
    /// failure (a 429 or a 5xx), under `reason`.
    pub fn ended_unserved(&self, model: &str, status: u16, reason: &str) {
        if status == 429 || (500..=599).contains(&status) {
            self.unserved.with_label_values(&[model, reason]).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_fleets_failures_count_as_unserved() {
        let d = Demand::register(&Registry::new()).unwrap();
        d.arrived("m");
        d.arrived("m");
        d.first_token("m", 0.3);
        // A refusal as too long is the client's answer, not the fleet's failure.
        d.refused_prompt("m", 5_000);
        for (status, reason) in [
            (429, "queue_full"),
            (503, "unavailable"),
            (504, "deadline_exceeded"),
            (499, "client_gone"),
            (400, "replica_status"),
            (200, "ok"),
        ] {
            d.ended_unserved("m", status, reason);
        }
        assert_eq!(d.arrivals.with_label_values(&["m"]).get(), 2);
        assert_eq!(d.ttft.with_label_values(&["m"]).get_sample_count(), 1);
        let refused = d.refused_prompts.with_label_values(&["m"]);
        assert_eq!(
            (refused.get_sample_count(), refused.get_sample_sum()),
            (1, 5_000.0)
        );
        let counted: Vec<(&str, u64)> = ["queue_full", "unavailable", "deadline_exceeded"]
            .into_iter()
            .map(|r| (r, d.unserved.with_label_values(&["m", r]).get()))
            .collect();
        assert_eq!(
            counted,
            [
                ("queue_full", 1),
                ("unavailable", 1),
                ("deadline_exceeded", 1)
            ]
        );
        for r in ["client_gone", "replica_status", "ok"] {
            assert_eq!(d.unserved.with_label_values(&["m", r]).get(), 0, "{r}");
        }
    }
}

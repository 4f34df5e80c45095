//! [`PromptBursts`]: the prompt tokens of requests routed to replicas, per model and second,
//! exported as `sluice_gateway_prompt_tokens_per_second` (one observation per second with any
//! arrival). A replica's own requests are not counted: behind a gateway it sees only its share
//! of a burst, and Prometheus would sum that with the gateway's count.
//!
//! Rates over a window, the replicas' counters and the prompt-length histogram all hide a
//! batch of requests sent within one second; the autoscaler sizes a fleet that prefills such a
//! batch within the TTFT target from this histogram. Only the gateway sees every arrival of a
//! model, so only it can sum them per second.
//!
//! A second is observed when it is over: at the model's next arrival, or at the next scrape
//! ([`PromptBursts::flush`]), so nothing waits on a timer task.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, Registry};
use sluice_metrics::gateway;

/// The per-second sums being counted, and the histogram they go to.
#[derive(Debug, Clone)]
pub struct PromptBursts {
    histogram: HistogramVec,
    /// Per model: the second being counted (since `epoch`) and its tokens so far.
    open: Arc<Mutex<HashMap<String, (u64, u64)>>>,
    epoch: Instant,
}

impl PromptBursts {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let histogram = HistogramVec::new(
            HistogramOpts::new(
                gateway::PROMPT_TOKENS_PER_SECOND,
                "Prompt tokens (bytes / 4) of the requests routed to replicas for a model that \
                 arrived within one second, once per second with any arrival.",
            )
            .buckets(gateway::prompt_tokens_per_second_buckets()),
            &[gateway::MODEL],
        )?;
        registry.register(Box::new(histogram.clone()))?;
        Ok(Self {
            histogram,
            open: Arc::default(),
            epoch: Instant::now(),
        })
    }

    /// A request for `model` with `tokens` of prompt arrived now. `model` must be one this
    /// gateway serves (a label per model ever asked for would grow without bound).
    pub fn record(&self, model: &str, tokens: u64) {
        self.record_at(model, tokens, self.second_now());
    }

    /// Observes every model's second that is over.
    pub fn flush(&self) {
        self.flush_at(self.second_now());
    }

    fn second_now(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    fn record_at(&self, model: &str, tokens: u64, second: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, sum)) = open.get_mut(model) {
            if *s != second {
                self.observe(model, *sum);
                (*s, *sum) = (second, 0);
            }
            *sum += tokens;
        } else {
            open.insert(model.to_string(), (second, tokens));
        }
    }

    fn flush_at(&self, second: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        for (model, (s, sum)) in open.iter_mut() {
            if *s < second {
                self.observe(model, *sum);
                *sum = 0;
            }
        }
    }

    /// A second's sum, unless nothing arrived in it (a second already flushed).
    fn observe(&self, model: &str, sum: u64) {
        if sum > 0 {
            self.histogram
                .with_label_values(&[model])
                .observe(sum as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(b: &PromptBursts, model: &str) -> (u64, f64) {
        let h = b.histogram.with_label_values(&[model]);
        (h.get_sample_count(), h.get_sample_sum())
    }

    #[test]
    fn each_second_with_arrivals_is_observed_once_when_it_is_over() {
        let registry = Registry::new();
        let b = PromptBursts::register(&registry).unwrap();
        // Second 5: a batch of three; second 6: one; nothing in 7; second 8: one.
        for tokens in [1000, 2000, 3000] {
            b.record_at("m", tokens, 5);
        }
        assert_eq!(counts(&b, "m"), (0, 0.0), "second 5 is not over yet");
        b.record_at("m", 400, 6);
        assert_eq!(
            counts(&b, "m"),
            (1, 6000.0),
            "second 5 ended at the next arrival"
        );
        b.flush_at(6);
        assert_eq!(counts(&b, "m"), (1, 6000.0), "second 6 is still open");
        b.flush_at(8);
        assert_eq!(counts(&b, "m"), (2, 6400.0), "a scrape ends second 6");
        b.flush_at(9);
        b.record_at("m", 50, 9);
        assert_eq!(
            counts(&b, "m"),
            (2, 6400.0),
            "empty seconds are not observed"
        );
        b.flush_at(10);
        assert_eq!(counts(&b, "m"), (3, 6450.0));
        // Buckets: 50 ≤ 256, 400 ≤ 512, the batch's 6000 above 5793 (2^12.5, rounded).
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        for (le, n) in [
            ("256", 1),
            ("512", 2),
            ("5793", 2),
            ("8192", 3),
            ("+Inf", 3),
        ] {
            let line = format!(
                "{}_bucket{{model=\"m\",le=\"{le}\"}} {n}\n",
                gateway::PROMPT_TOKENS_PER_SECOND
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
    }

    #[test]
    fn models_are_counted_apart() {
        let b = PromptBursts::register(&Registry::new()).unwrap();
        b.record_at("a", 100, 1);
        b.record_at("b", 7, 1);
        b.record_at("a", 100, 1);
        b.flush_at(2);
        assert_eq!(counts(&b, "a"), (1, 200.0));
        assert_eq!(counts(&b, "b"), (1, 7.0));
    }
}

//! A replica's load: what its `/metrics` said at the last poll (vLLM's names, which sluice
//! replicas export too), combined with the gateway's own count of requests it has in flight
//! there, which moves with every request between polls.
//!
//! The score is in "requests": roughly how many sequences are ahead of a new one. Queued
//! requests weigh double (they have not even started), and a full KV cache adds a few (the
//! next request will wait for blocks or preempt someone). A replica whose metrics went stale
//! — its poll failed or hangs — scores [`SATURATED`]: the gateway cannot tell its load, so it
//! is the last choice. A replica that exports none of these names (llama.cpp's server exports
//! `llamacpp:` ones, which `sluice-metrics` maps; a plain OpenAI server none) is scored by
//! in-flight alone.

use std::time::{Duration, Instant};

use sluice_metrics::ReplicaLoad;

/// The score of a replica whose load is unknown because its metrics are stale.
pub const SATURATED: f64 = 1e9;
/// How much a full KV cache adds to the score, in requests.
const KV_WEIGHT: f64 = 4.0;

/// The load figures one poll found (`sluice-metrics` reads them, as the autoscaler does):
/// waiting and running summed over label sets (one per model), KV use the fullest cache.
pub type Polled = ReplicaLoad;

/// Reads the load series from Prometheus text. Lines that do not parse are skipped, never
/// fatal.
pub fn parse_metrics(text: &str) -> Polled {
    ReplicaLoad::from_text(text)
}

/// What the gateway knows of a replica's metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signals {
    /// Not polled successfully yet.
    Unknown { since: Instant },
    /// The replica has no metrics endpoint or none of the load series: in-flight only.
    Absent,
    /// The last successful poll, and the gateway's in-flight count when it was taken.
    Fresh {
        polled: Polled,
        at: Instant,
        in_flight_at_poll: usize,
    },
}

impl Signals {
    /// The replica's score given the gateway's in-flight count there now.
    pub fn score(&self, in_flight: usize, now: Instant, stale_after: Duration) -> f64 {
        let inflight = in_flight as f64;
        match *self {
            Signals::Absent => inflight,
            // A replica just added gets a grace period as long as the staleness bound.
            Signals::Unknown { since } if now.duration_since(since) <= stale_after => inflight,
            Signals::Unknown { .. } => SATURATED,
            Signals::Fresh { at, .. } if now.duration_since(at) > stale_after => SATURATED,
            Signals::Fresh {
                polled,
                in_flight_at_poll,
                ..
            } => {
                let waiting = polled.waiting.unwrap_or(0.0);
                let running = polled.running.unwrap_or(0.0);
                // Requests sent (or finished) since the poll are not in its figures yet.
                let since_poll = inflight - in_flight_at_poll as f64;
                let active = (waiting + running + since_poll).max(inflight);
                active + waiting + KV_WEIGHT * polled.kv_usage.unwrap_or(0.0)
            }
        }
    }

    pub fn is_stale(&self, now: Instant, stale_after: Duration) -> bool {
        match *self {
            Signals::Absent => false,
            Signals::Unknown { since } => now.duration_since(since) > stale_after,
            Signals::Fresh { at, .. } => now.duration_since(at) > stale_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"
# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 3
vllm:num_requests_waiting{model_name="b"} 1
vllm:num_requests_running{model_name="a"} 5.0
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:kv_cache_usage_perc{model_name="b"} 0.5
vllm:prefix_cache_hits_total{model_name="a"} 100
vllm:num_requests_running{model_name="c"} NaN
garbage line without value
"#;

    #[test]
    fn vllm_series_are_summed_and_kv_takes_the_fullest() {
        let p = parse_metrics(VLLM);
        assert_eq!(p.waiting, Some(4.0));
        assert_eq!(p.running, Some(5.0));
        assert_eq!(p.kv_usage, Some(0.5));
    }

    #[test]
    fn llamacpp_names_map_and_missing_series_stay_unknown() {
        let p = parse_metrics("llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n");
        assert_eq!(p.running, Some(2.0));
        assert_eq!(p.waiting, Some(1.0));
        assert_eq!(p.kv_usage, None);
        assert!(parse_metrics("process_cpu_seconds_total 4\n").is_empty());
        assert!(parse_metrics("").is_empty());
    }

    #[test]
    fn scores_combine_polls_with_in_flight_and_stale_is_saturated() {
        let t0 = Instant::now();
        let stale = Duration::from_secs(1);
        let fresh = Signals::Fresh {
            polled: Polled {
                waiting: Some(2.0),
                running: Some(4.0),
                kv_usage: Some(0.5),
            },
            at: t0,
            in_flight_at_poll: 3,
        };
        // 2 waiting + 4 running, plus 2 sent since the poll; waiting counted twice; KV 0.5 × 4.
        assert_eq!(fresh.score(5, t0, stale), 8.0 + 2.0 + 2.0);
        // Two of ours finished since the poll.
        assert_eq!(fresh.score(1, t0, stale), 4.0 + 2.0 + 2.0);
        assert_eq!(
            fresh.score(5, t0 + Duration::from_secs(2), stale),
            SATURATED
        );
        assert_eq!(Signals::Absent.score(7, t0, stale), 7.0);
        let unknown = Signals::Unknown { since: t0 };
        assert_eq!(unknown.score(1, t0, stale), 1.0);
        assert_eq!(
            unknown.score(1, t0 + Duration::from_secs(2), stale),
            SATURATED
        );
        // Other clients' load counts even when the gateway has nothing there.
        let busy = Signals::Fresh {
            polled: Polled {
                waiting: None,
                running: Some(3.0),
                kv_usage: None,
            },
            at: t0,
            in_flight_at_poll: 0,
        };
        assert_eq!(busy.score(0, t0, stale), 3.0);
    }
}

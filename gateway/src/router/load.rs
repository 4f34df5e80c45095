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
//!
//! **Room** is whether one more request would start at once rather than queue on the replica
//! (late binding sends a request only to a replica with room; `router::queue`). With its
//! capacity known ([`crate::metrics::MAX_NUM_SEQS`], which sluice replicas export), a replica
//! has room while its sequences — running, waiting, and the gateway's requests sent since the
//! poll — stay below it and its KV cache is not nearly full. Without it (vLLM, llama.cpp), a
//! replica has room while it reported no queue and the gateway has sent it fewer than
//! [`PROBE`] requests since that poll. A replica with stale or no polled figures yet gets one
//! request at a time (so a stuck `/metrics` does not stop it), and one with no load series at
//! all is bounded only by `--replica-max-in-flight`.

use std::time::{Duration, Instant};

use sluice_metrics::{exposition, ReplicaLoad};

/// The score of a replica whose load is unknown because its metrics are stale.
pub const SATURATED: f64 = 1e9;
/// How much a full KV cache adds to the score, in requests.
const KV_WEIGHT: f64 = 4.0;
/// KV use at or above which a replica has no room.
pub const KV_FULL: f64 = 0.95;
/// Requests sent since a poll to a replica of unknown capacity before the next poll must say
/// whether it queues them.
pub const PROBE: f64 = 4.0;

/// The load figures one poll found (`sluice-metrics` reads them, as the autoscaler does):
/// waiting and running summed over label sets (one per model), KV use the fullest cache.
pub type Polled = ReplicaLoad;

/// Reads the load series from Prometheus text. Lines that do not parse are skipped, never
/// fatal.
pub fn parse_metrics(text: &str) -> Polled {
    ReplicaLoad::from_text(text)
}

/// The replica's capacity in sequences ([`crate::metrics::MAX_NUM_SEQS`], summed over its
/// models), if it reports one.
pub fn parse_capacity(text: &str) -> Option<f64> {
    let mut total = None;
    let named = exposition::samples_named(text, |n| n == crate::metrics::MAX_NUM_SEQS);
    for s in named.flatten() {
        if s.value.is_finite() && s.value > 0.0 {
            total = Some(total.unwrap_or(0.0) + s.value);
        }
    }
    total
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
        /// Sequences the replica runs at once, when it says.
        capacity: Option<f64>,
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

    /// Whether one more request would start at once; see the module doc.
    pub fn room(&self, in_flight: usize, now: Instant, stale_after: Duration) -> bool {
        let Signals::Fresh {
            polled,
            capacity,
            in_flight_at_poll,
            ..
        } = *self
        else {
            return matches!(self, Signals::Absent) || in_flight == 0;
        };
        if self.is_stale(now, stale_after) {
            return in_flight == 0;
        }
        if polled.kv_usage.unwrap_or(0.0) >= KV_FULL {
            return false;
        }
        let waiting = polled.waiting.unwrap_or(0.0);
        let since_poll = in_flight as f64 - in_flight_at_poll as f64;
        match capacity {
            Some(cap) => {
                let active = (waiting + polled.running.unwrap_or(0.0) + since_poll).max(0.0);
                active.max(in_flight as f64) < cap
            }
            None => waiting < 1.0 && since_poll < PROBE,
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
            capacity: None,
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
            capacity: None,
            at: t0,
            in_flight_at_poll: 0,
        };
        assert_eq!(busy.score(0, t0, stale), 3.0);
    }

    fn fresh(
        running: f64,
        waiting: f64,
        kv: f64,
        capacity: Option<f64>,
        at_poll: usize,
    ) -> Signals {
        Signals::Fresh {
            polled: Polled {
                waiting: Some(waiting),
                running: Some(running),
                kv_usage: Some(kv),
            },
            capacity,
            at: Instant::now(),
            in_flight_at_poll: at_poll,
        }
    }

    #[test]
    fn room_is_capacity_less_what_runs_and_what_was_sent_since_the_poll() {
        let now = Instant::now();
        let stale = Duration::from_secs(1);
        // Four slots, three running (two of them ours): one more fits, then none.
        let s = fresh(3.0, 0.0, 0.2, Some(4.0), 2);
        assert!(s.room(2, now, stale));
        assert!(!s.room(3, now, stale));
        // One of ours finished since the poll: room again.
        assert!(fresh(4.0, 0.0, 0.2, Some(4.0), 2).room(1, now, stale));
        // A queue on the replica (other clients) or a full cache: no room.
        assert!(!fresh(2.0, 3.0, 0.2, Some(4.0), 0).room(0, now, stale));
        assert!(!fresh(0.0, 0.0, 0.97, Some(4.0), 0).room(0, now, stale));
        // Capacity unknown: room while it reports no queue, up to a probe since the poll.
        let u = fresh(10.0, 0.0, 0.2, None, 0);
        assert!(u.room(3, now, stale) && !u.room(4, now, stale));
        assert!(!fresh(10.0, 1.0, 0.2, None, 0).room(0, now, stale));
        // No series at all: bounded only by the hard cap; unknown or stale: one at a time.
        assert!(Signals::Absent.room(100, now, stale));
        let unknown = Signals::Unknown { since: now };
        assert!(unknown.room(0, now, stale) && !unknown.room(1, now, stale));
        let old = now + Duration::from_secs(5);
        assert!(s.room(0, old, stale) && !s.room(1, old, stale));
    }

    #[test]
    fn capacity_is_read_from_the_replica_gauge() {
        let text = "sluice_engine_max_num_seqs{model_name=\"a\"} 64\nvllm:num_requests_running 1\n";
        assert_eq!(parse_capacity(text), Some(64.0));
        assert_eq!(parse_capacity("vllm:num_requests_running 1\n"), None);
    }
}

//! The gateway's own Prometheus series (`sluice_gateway_*`), registered next to the engine's.
//! The two the autoscaler reads are named in `sluice-metrics`.

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use sluice_metrics::gateway;

/// Latency buckets as the client sees it (seconds), matching vLLM's request buckets at the top
/// and finer below a second where the gateway's own cost shows.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
    640.0,
];

#[derive(Debug, Clone)]
pub struct GatewayMetrics {
    pub requests: IntCounterVec,
    pub rejections: IntCounterVec,
    pub queue_depth: IntGaugeVec,
    pub queue_wait: HistogramVec,
    pub in_flight: IntGaugeVec,
    pub ttft: HistogramVec,
    pub e2e: HistogramVec,
    pub deadline_exceeded: IntCounterVec,
    pub router: RouterMetrics,
}

impl GatewayMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "sluice_gateway_requests_total",
                "HTTP requests by route and status.",
            ),
            &["route", "status"],
        )?;
        let rejections = IntCounterVec::new(
            Opts::new(
                "sluice_gateway_rejections_total",
                "Requests refused before generation, by reason.",
            ),
            &["reason"],
        )?;
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                gateway::QUEUE_DEPTH,
                "Requests waiting in the admission queue, by priority.",
            ),
            &["priority"],
        )?;
        let queue_wait = HistogramVec::new(
            HistogramOpts::new(
                "sluice_gateway_queue_wait_seconds",
                "Time spent in the admission queue, by priority.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["priority"],
        )?;
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "sluice_gateway_in_flight",
                "Requests being generated, by tenant.",
            ),
            &["tenant"],
        )?;
        let ttft = HistogramVec::new(
            HistogramOpts::new(
                "sluice_gateway_time_to_first_token_seconds",
                "Time from request to the first token, as the client sees it.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route"],
        )?;
        let e2e = HistogramVec::new(
            HistogramOpts::new(
                "sluice_gateway_e2e_request_latency_seconds",
                "Time from request to the end of the response.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["route"],
        )?;
        let deadline_exceeded = IntCounterVec::new(
            Opts::new(
                "sluice_gateway_deadline_exceeded_total",
                "Requests whose deadline passed, by stage (queue, prefill, decode).",
            ),
            &["stage"],
        )?;
        registry.register(Box::new(deadline_exceeded.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(rejections.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(queue_wait.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(ttft.clone()))?;
        registry.register(Box::new(e2e.clone()))?;
        Ok(Self {
            router: RouterMetrics::register(registry)?,
            requests,
            rejections,
            queue_depth,
            queue_wait,
            in_flight,
            ttft,
            e2e,
            deadline_exceeded,
        })
    }
}

/// The router's series, labelled by replica URL where they are per replica.
#[derive(Debug, Clone)]
pub struct RouterMetrics {
    /// Attempts by replica and outcome: the HTTP status, or `connect_error`, `io_error`,
    /// `timeout`.
    pub upstream_requests: IntCounterVec,
    pub retries: IntCounter,
    pub ejections: IntCounterVec,
    pub replica_in_flight: IntGaugeVec,
    /// The last polled `waiting`, `running`, `kv_usage`, and the routing `score`.
    pub replica_load: GaugeVec,
    /// 1 while the replica may be picked (healthy, not ejected).
    pub eligible: IntGaugeVec,
    pub decisions: IntCounterVec,
    /// Streams that failed after their first byte (ended with an SSE error event).
    pub broken_streams: IntCounterVec,
}

impl RouterMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let upstream_requests = IntCounterVec::new(
            Opts::new(
                "sluice_gateway_upstream_requests_total",
                "Attempts sent to replicas, by replica and status (or connect_error, io_error, timeout).",
            ),
            &["replica", "status"],
        )?;
        let retries = IntCounter::new(
            "sluice_gateway_upstream_retries_total",
            "Attempts retried on another replica before the first byte.",
        )?;
        let ejections = IntCounterVec::new(
            Opts::new(
                "sluice_gateway_replica_ejections_total",
                "Times a replica was ejected after consecutive failures.",
            ),
            &["replica"],
        )?;
        let replica_in_flight = IntGaugeVec::new(
            Opts::new(
                "sluice_gateway_replica_in_flight",
                "Requests this gateway has in flight on each replica.",
            ),
            &["replica"],
        )?;
        let replica_load = GaugeVec::new(
            Opts::new(
                "sluice_gateway_replica_load",
                "Each replica's last polled load (waiting, running, kv_usage) and routing score.",
            ),
            &["replica", "signal"],
        )?;
        let eligible = IntGaugeVec::new(
            Opts::new(
                gateway::REPLICA_ELIGIBLE,
                "1 while a replica may be picked: its health check passes and it is not ejected.",
            ),
            &["replica"],
        )?;
        let decisions = IntCounterVec::new(
            Opts::new(
                "sluice_gateway_routing_decisions_total",
                "Replica picks by policy and reason (affinity_hit, session_hit, load_fallback, least_load, round_robin).",
            ),
            &["policy", "reason"],
        )?;
        let broken_streams = IntCounterVec::new(
            Opts::new(
                "sluice_gateway_upstream_broken_streams_total",
                "Answers that failed after their first byte had reached the client, by replica.",
            ),
            &["replica"],
        )?;
        registry.register(Box::new(upstream_requests.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(ejections.clone()))?;
        registry.register(Box::new(replica_in_flight.clone()))?;
        registry.register(Box::new(replica_load.clone()))?;
        registry.register(Box::new(eligible.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(broken_streams.clone()))?;
        Ok(Self {
            upstream_requests,
            retries,
            ejections,
            replica_in_flight,
            replica_load,
            eligible,
            decisions,
            broken_streams,
        })
    }
}

//! The gateway's own Prometheus series (`sluice_gateway_*`), registered next to the engine's.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

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
                "sluice_gateway_queue_depth",
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
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(rejections.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(queue_wait.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(ttft.clone()))?;
        registry.register(Box::new(e2e.clone()))?;
        Ok(Self {
            requests,
            rejections,
            queue_depth,
            queue_wait,
            in_flight,
            ttft,
            e2e,
        })
    }
}

//! The gateway's own Prometheus series (`sluice_gateway_*`), registered next to the engine's.
//! The ones the autoscaler reads are named in `sluice-metrics`.
//!
//! [`MAX_NUM_SEQS`] is a replica's series, not the gateway's: a `sluice serve --model` process
//! registers it ([`register_max_num_seqs`]) so that a routing gateway in front knows how many
//! sequences the replica runs at once, which vLLM's names do not say.

use prometheus::{
    Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry,
};
use sluice_metrics::{gateway, vllm};

use crate::demand::Demand;
use crate::prompt_bursts::PromptBursts;

/// A replica's `--max-num-seqs`, by `model_name` (gauge): the sequences its engine runs at once.
/// The router's room rule reads it (`router::load`).
pub const MAX_NUM_SEQS: &str = "sluice_engine_max_num_seqs";

/// Requests that failed because their deadline passed, by the stage they were in (`queue`,
/// `prefill`, `decode`) (counter).
pub const DEADLINE_EXCEEDED: &str = "sluice_gateway_deadline_exceeded_total";

/// Registers [`MAX_NUM_SEQS`] for the model this process serves.
pub fn register_max_num_seqs(
    registry: &Registry,
    model_name: &str,
    max_num_seqs: usize,
) -> prometheus::Result<()> {
    let g = GaugeVec::new(
        Opts::new(
            MAX_NUM_SEQS,
            "Sequences the engine runs at once (--max-num-seqs).",
        ),
        &[vllm::MODEL_NAME],
    )?;
    registry.register(Box::new(g.clone()))?;
    g.with_label_values(&[model_name]).set(max_num_seqs as f64);
    Ok(())
}

/// `sluice_gateway_queue_depth`, by priority and model: the admission queue's requests carry
/// an empty model (it is in front of every model), a routing model queue's the model's name.
#[derive(Debug, Clone)]
pub struct QueueDepth(IntGaugeVec);

impl QueueDepth {
    /// The admission queue's gauge of one priority (`values` is `[priority]`).
    pub fn with_label_values(&self, values: &[&str]) -> IntGauge {
        self.0.with_label_values(&[values[0], ""])
    }

    /// A model queue's gauge of one priority.
    pub fn of_model(&self, priority: &str, model: &str) -> IntGauge {
        self.0.with_label_values(&[priority, model])
    }
}

/// The per-model series of the routing queue (`router::queue`).
#[derive(Debug, Clone)]
pub struct QueueMetrics {
    pub depth: QueueDepth,
    /// Requests held because no ready replica serves their model.
    pub held: IntGaugeVec,
    /// The oldest waiting request's wait, seconds.
    pub oldest_wait: GaugeVec,
    /// [`DEADLINE_EXCEEDED`]: registered here, counted by the request's scope (`api::scope`)
    /// for every stage when the error reaches the client.
    pub deadline_exceeded: IntCounterVec,
}

impl QueueMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let depth = IntGaugeVec::new(
            Opts::new(
                gateway::QUEUE_DEPTH,
                "Requests waiting: in the admission queue (model empty), by priority, or in a \
                 model's routing queue for a replica with room, by priority and model.",
            ),
            &[gateway::PRIORITY, gateway::MODEL],
        )?;
        let held = IntGaugeVec::new(
            Opts::new(
                gateway::QUEUE_HELD,
                "Requests held because no ready replica serves their model, by model.",
            ),
            &[gateway::MODEL],
        )?;
        let oldest_wait = GaugeVec::new(
            Opts::new(
                gateway::QUEUE_OLDEST_WAIT_SECONDS,
                "How long the oldest request waiting for a replica of a model has waited.",
            ),
            &[gateway::MODEL],
        )?;
        let deadline_exceeded = IntCounterVec::new(
            Opts::new(
                DEADLINE_EXCEEDED,
                "Requests whose deadline passed, by stage (queue, prefill, decode).",
            ),
            &["stage"],
        )?;
        registry.register(Box::new(depth.clone()))?;
        registry.register(Box::new(held.clone()))?;
        registry.register(Box::new(oldest_wait.clone()))?;
        registry.register(Box::new(deadline_exceeded.clone()))?;
        Ok(Self {
            depth: QueueDepth(depth),
            held,
            oldest_wait,
            deadline_exceeded,
        })
    }

    /// The oldest-wait gauge of `model`.
    pub fn oldest(&self, model: &str) -> Gauge {
        self.oldest_wait.with_label_values(&[model])
    }
}

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
    pub queue_depth: QueueDepth,
    /// [`DEADLINE_EXCEEDED`], by stage.
    pub deadline_exceeded: IntCounterVec,
    pub queue_wait: HistogramVec,
    pub in_flight: IntGaugeVec,
    pub ttft: HistogramVec,
    pub e2e: HistogramVec,
    pub prompt_bursts: PromptBursts,
    /// Each model's arrivals, client-side first tokens and unserved requests.
    pub demand: Demand,
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
        let queue = QueueMetrics::register(registry)?;
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
        registry.register(Box::new(queue_wait.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(ttft.clone()))?;
        registry.register(Box::new(e2e.clone()))?;
        Ok(Self {
            prompt_bursts: PromptBursts::register(registry)?,
            demand: Demand::register(registry)?,
            router: RouterMetrics::register(registry, queue.clone())?,
            requests,
            rejections,
            queue_depth: queue.depth,
            deadline_exceeded: queue.deadline_exceeded,
            queue_wait,
            in_flight,
            ttft,
            e2e,
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
    /// The routing queue's per-model series.
    pub queue: QueueMetrics,
}

impl RouterMetrics {
    pub fn register(registry: &Registry, queue: QueueMetrics) -> prometheus::Result<Self> {
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
            queue,
        })
    }
}

//! What the policy sees each tick: the [`Signals`] for one model.
//!
//! The simulator builds them from its fleet model; the Kubernetes controller will build them
//! from the gateway's and replicas' `/metrics` (vLLM names) and the API server's view of
//! Deployments and node pools. They are plain serde data so both can log, replay and test
//! them, and so a decision can be reproduced from the signals that caused it.

use serde::{Deserialize, Serialize};

use crate::profile::CapacityType;

/// Everything the policy knows about one model at one tick.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Signals {
    /// Seconds on a monotonic clock (the simulator's time; the controller's time since start).
    pub time_s: f64,
    pub model: String,
    pub arrivals: Arrivals,
    pub queue: Queue,
    pub latency: Latency,
    /// One entry per (variant, capacity type) the model can run on.
    pub variants: Vec<VariantSignals>,
    /// One entry per node pool.
    pub pools: Vec<PoolSignals>,
}

/// Arrivals at the gateway, as rates over two windows: the long one to plan from, the short one
/// to notice a spike.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Arrivals {
    pub window_s: f64,
    pub requests_per_s: f64,
    pub prompt_tokens_per_s: f64,
    pub output_tokens_per_s: f64,
    pub short_window_s: f64,
    pub short_requests_per_s: f64,
    /// Largest prompt seen in the long window.
    pub max_prompt_tokens: u64,
    /// Squared coefficient of variation of prompt lengths in the long window (from
    /// `vllm:request_prompt_tokens`' histogram in a controller); 0 if unknown.
    #[serde(default)]
    pub prompt_tokens_cv2: f64,
}

/// Work waiting: at the gateway and in the replicas' own queues.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Queue {
    /// Requests admitted nowhere yet (gateway queue plus replicas' waiting queues,
    /// `vllm:num_requests_waiting`).
    pub waiting: u64,
    /// Their prompt tokens still to prefill.
    pub waiting_prompt_tokens: u64,
    /// Sequences decoding or prefilling on replicas (`vllm:num_requests_running`).
    pub running: u64,
}

/// Latency percentiles over a recent window (`vllm:time_to_first_token_seconds`,
/// `vllm:inter_token_latency_seconds`); `None` when no request finished in the window.
///
/// The `*_p99_s` fields hold the quantile the SLO names, p99 unless a controller's
/// `ServingPool` asks for another percentile: the policy compares them with the SLO targets.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub window_s: f64,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    pub tpot_p50_s: Option<f64>,
    pub tpot_p99_s: Option<f64>,
    /// Share of the window's first tokens that came within the TTFT target, over requests
    /// whose prompt some variant prefills alone within it (the SLO's own measure: a queue
    /// in a replica's prefill shows here before any p99 the infeasible prompts dominate).
    #[serde(default)]
    pub ttft_attainment: Option<f64>,
}

/// Replicas of one variant bought one way.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VariantSignals {
    pub variant: String,
    pub capacity: CapacityType,
    /// Serving and routable.
    pub ready: u32,
    /// Scheduled and starting (image pull, model load).
    pub starting: u32,
    /// Waiting for a node (provisioning, or a stockout).
    pub pending: u32,
    /// Age of the oldest pending replica: a long wait on Spot means a stockout.
    pub oldest_pending_s: f64,
    /// Draining: taken out of routing, finishing their requests.
    pub draining: u32,
    /// Mean over ready replicas of running sequences, waiting sequences and KV-cache use (0..1).
    pub running_per_replica: f64,
    pub waiting_per_replica: f64,
    pub kv_cache_usage: f64,
    /// Mean CPU utilisation of the replicas' containers (0..1 of their request), which is what
    /// a CPU-based HPA reads.
    pub cpu_utilisation: f64,
    /// Spot preemption notices received since the previous tick.
    pub preempted: u32,
    /// This variant's own latency percentiles over the latency window (vLLM's histograms are
    /// per pod, so a controller can aggregate them per variant).
    #[serde(default)]
    pub ttft_p99_s: Option<f64>,
    #[serde(default)]
    pub tpot_p99_s: Option<f64>,
}

/// One node pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PoolSignals {
    pub pool: String,
    pub variant: String,
    pub capacity: CapacityType,
    pub nodes: u32,
    pub provisioning: u32,
}

impl Signals {
    /// The entry for a variant and capacity type, if any.
    pub fn variant(&self, name: &str, capacity: CapacityType) -> Option<&VariantSignals> {
        self.variants
            .iter()
            .find(|v| v.variant == name && v.capacity == capacity)
    }

    /// Replicas that exist or are on their way (ready + starting + pending), per entry.
    pub fn provisioned(&self, name: &str, capacity: CapacityType) -> u32 {
        self.variant(name, capacity)
            .map_or(0, |v| v.ready + v.starting + v.pending)
    }

    /// The request shape over the long window, if any arrived.
    pub fn workload(&self) -> Option<crate::capacity::Workload> {
        self.request_shape()
            .map(|(p, o)| crate::capacity::Workload {
                mean_prompt_tokens: p,
                mean_output_tokens: o,
                prompt_cv2: self.arrivals.prompt_tokens_cv2,
            })
    }

    /// Mean prompt and output tokens per request over the long window, if any arrived.
    pub fn request_shape(&self) -> Option<(f64, f64)> {
        let a = &self.arrivals;
        (a.requests_per_s > 0.0).then(|| {
            (
                a.prompt_tokens_per_s / a.requests_per_s,
                a.output_tokens_per_s / a.requests_per_s,
            )
        })
    }
}

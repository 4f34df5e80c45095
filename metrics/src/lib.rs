//! The metric vocabulary sluice shares between the crates that write series and those that
//! read them: vLLM's names, labels and buckets (sluice replicas export vLLM's names, so
//! dashboards, HPA adapters and the Gateway API inference extension read them as they are), the
//! names other servers use for the same load, and one parser for the Prometheus text format.
//!
//! A leaf: it depends on nothing but std, so the engine (which writes the series), the gateway
//! (which polls replicas' load) and the autoscaler (which scrapes whole replicas) can all use
//! it without pulling in each other.
//!
//! - [`vllm`]: vLLM's metric names, label names and histogram buckets.
//! - [`llamacpp`]: llama.cpp server's names for the load series.
//! - [`gateway`]: the routing gateway's own series that the autoscaler reads.
//! - [`load`]: [`ReplicaLoad`], a replica's queue, running sequences and KV use, read from any of
//!   those names.
//! - [`exposition`]: the text-format parser.

pub mod exposition;
pub mod load;

pub use load::ReplicaLoad;

/// vLLM's metric names, label names and histogram buckets. Older names that readers still
/// accept are marked as such.
pub mod vllm {
    /// Requests in the queue, not yet scheduled (gauge).
    pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
    /// Requests in model execution batches (gauge).
    pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
    /// KV-cache use, 1 meaning full (gauge).
    pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
    /// The older name of [`KV_CACHE_USAGE_PERC`], from before vLLM 0.10.
    pub const GPU_CACHE_USAGE_PERC: &str = "vllm:gpu_cache_usage_perc";
    /// The KV cache's configuration as labels, value 1 (gauge): [`NUM_GPU_BLOCKS`] and
    /// [`BLOCK_SIZE`].
    pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";

    /// Time to first token, seconds (histogram).
    pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "vllm:time_to_first_token_seconds";
    /// Time between consecutive output tokens, seconds, one observation per token (histogram).
    pub const INTER_TOKEN_LATENCY_SECONDS: &str = "vllm:inter_token_latency_seconds";
    /// Mean time per output token of each finished request, seconds (histogram).
    pub const REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS: &str =
        "vllm:request_time_per_output_token_seconds";
    /// The older per-token name of [`INTER_TOKEN_LATENCY_SECONDS`].
    pub const TIME_PER_OUTPUT_TOKEN_SECONDS: &str = "vllm:time_per_output_token_seconds";
    /// End-to-end request latency, seconds (histogram).
    pub const E2E_REQUEST_LATENCY_SECONDS: &str = "vllm:e2e_request_latency_seconds";
    /// The `_count` series of [`E2E_REQUEST_LATENCY_SECONDS`]: requests finished.
    pub const E2E_REQUEST_LATENCY_SECONDS_COUNT: &str = "vllm:e2e_request_latency_seconds_count";
    /// Time spent waiting in the queue, seconds (histogram).
    pub const REQUEST_QUEUE_TIME_SECONDS: &str = "vllm:request_queue_time_seconds";
    /// Time spent in prefill, seconds (histogram).
    pub const REQUEST_PREFILL_TIME_SECONDS: &str = "vllm:request_prefill_time_seconds";
    /// Time spent in decode, seconds (histogram).
    pub const REQUEST_DECODE_TIME_SECONDS: &str = "vllm:request_decode_time_seconds";
    /// Prompt length of each request, tokens (histogram).
    pub const REQUEST_PROMPT_TOKENS: &str = "vllm:request_prompt_tokens";
    /// Output length of each finished request, tokens (histogram).
    pub const REQUEST_GENERATION_TOKENS: &str = "vllm:request_generation_tokens";

    /// Finished requests by [`FINISHED_REASON`] (counter).
    pub const REQUEST_SUCCESS_TOTAL: &str = "vllm:request_success_total";
    /// Prompt tokens prefilled (counter).
    pub const PROMPT_TOKENS_TOTAL: &str = "vllm:prompt_tokens_total";
    /// Output tokens generated (counter).
    pub const GENERATION_TOKENS_TOTAL: &str = "vllm:generation_tokens_total";
    /// Preemptions (counter).
    pub const NUM_PREEMPTIONS_TOTAL: &str = "vllm:num_preemptions_total";
    /// Prefix-cache queries, in tokens (counter).
    pub const PREFIX_CACHE_QUERIES_TOTAL: &str = "vllm:prefix_cache_queries_total";
    /// Prefix-cache hits, in tokens (counter).
    pub const PREFIX_CACHE_HITS_TOTAL: &str = "vllm:prefix_cache_hits_total";

    /// The TPOT histograms in order of preference: per request, its older per-token name, then
    /// per token (what sluice exports; its p99 is at least the per-request one's).
    pub const TPOT_HISTOGRAMS: &[&str] = &[
        REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
        TIME_PER_OUTPUT_TOKEN_SECONDS,
        INTER_TOKEN_LATENCY_SECONDS,
    ];

    /// The label every vLLM series carries: the served model's name.
    pub const MODEL_NAME: &str = "model_name";
    /// Why a request finished (`stop`, `length`, `abort`), on [`REQUEST_SUCCESS_TOTAL`].
    pub const FINISHED_REASON: &str = "finished_reason";
    /// KV blocks in the pool, on [`CACHE_CONFIG_INFO`].
    pub const NUM_GPU_BLOCKS: &str = "num_gpu_blocks";
    /// Tokens per KV block, on [`CACHE_CONFIG_INFO`].
    pub const BLOCK_SIZE: &str = "block_size";
    /// A histogram bucket's upper bound (Prometheus's, on every `_bucket` series).
    pub const LE: &str = "le";

    /// vLLM's time-to-first-token buckets (seconds).
    pub const TTFT_BUCKETS: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ];
    /// vLLM's inter-token latency buckets (seconds).
    pub const ITL_BUCKETS: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];
    /// Bucket bounds of the request-length histograms ([`REQUEST_PROMPT_TOKENS`],
    /// [`REQUEST_GENERATION_TOKENS`]): powers of √2, rounded, from 1 to 2²¹ tokens. vLLM's
    /// step 1-2-5; a relative step of 41 % keeps the spread (cv²) and the largest length an
    /// autoscaler reads from them closer to the lengths'.
    pub fn request_tokens_buckets() -> Vec<f64> {
        let mut b: Vec<f64> = (0..=42)
            .map(|k| 2f64.powf(f64::from(k) / 2.0).round())
            .collect();
        b.dedup();
        b
    }

    /// vLLM's request latency buckets (seconds): e2e, queue, prefill and decode time.
    pub const REQUEST_LATENCY_BUCKETS: &[f64] = &[
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
        240.0, 480.0, 960.0, 1920.0, 7680.0,
    ];
}

/// llama.cpp server's names for the load series (`--metrics`).
pub mod llamacpp {
    /// Requests waiting for a slot (gauge).
    pub const REQUESTS_DEFERRED: &str = "llamacpp:requests_deferred";
    /// Requests being processed (gauge).
    pub const REQUESTS_PROCESSING: &str = "llamacpp:requests_processing";
    /// KV-cache use, 1 meaning full (gauge).
    pub const KV_CACHE_USAGE_RATIO: &str = "llamacpp:kv_cache_usage_ratio";
}

/// The routing gateway's own series that the autoscaler reads (the gateway exports more,
/// named in its `metrics` module).
pub mod gateway {
    /// Requests in the gateway's admission queue, by [`PRIORITY`] (gauge). In routing mode
    /// also by [`MODEL`]: requests waiting in the gateway for a replica with room.
    pub const QUEUE_DEPTH: &str = "sluice_gateway_queue_depth";
    /// Requests held because no ready replica serves their model at all (a pool at zero, or
    /// all of its replicas starting), by [`MODEL`] (gauge). What scales a pool up from zero.
    pub const QUEUE_HELD: &str = "sluice_gateway_queue_held";
    /// How long the oldest request waiting for a replica of a model has waited, seconds, by
    /// [`MODEL`] (gauge; 0 with an empty queue).
    pub const QUEUE_OLDEST_WAIT_SECONDS: &str = "sluice_gateway_queue_oldest_wait_seconds";
    /// 1 while a replica may be picked, by [`REPLICA`] (gauge); a replica that leaves the set
    /// loses its series.
    pub const REPLICA_ELIGIBLE: &str = "sluice_gateway_replica_eligible";
    /// Prompt tokens of the requests a routing gateway sent on for a model that arrived
    /// within one second, observed once for every second in which any arrived, by [`MODEL`]
    /// (histogram). How bursty arrivals are below any window's rate: a batch sent at once
    /// needs its prompts prefilled within the TTFT target. The gateway does not tokenise what
    /// it proxies: a request counts its prompt bytes / 4. Requests a process serves itself
    /// are not counted (a replica sees only its share of a burst).
    pub const PROMPT_TOKENS_PER_SECOND: &str = "sluice_gateway_prompt_tokens_per_second";
    /// Requests a routing gateway took for a model once they passed their tenant's limits,
    /// by [`MODEL`] (counter): the demand at the front door, those it then refuses included.
    /// Replicas count only what reaches them; behind a gateway that queues (late binding) and
    /// refuses past its bounds, that is at most what the fleet already serves.
    pub const ARRIVALS_TOTAL: &str = "sluice_gateway_model_arrivals_total";
    /// Those requests' time from arrival to their first byte from a replica that answered
    /// (a success status), as the client sees it, by [`MODEL`] (histogram, buckets
    /// [`crate::vllm::TTFT_BUCKETS`]): the wait in the gateway's queue included, which a
    /// replica's own TTFT leaves out.
    pub const TIME_TO_FIRST_TOKEN_SECONDS: &str =
        "sluice_gateway_model_time_to_first_token_seconds";
    /// Those requests that ended without a first token for want of capacity or a working
    /// replica (a 429 or 5xx: queue full, queue or hold timeout, shed, deadline passed,
    /// replicas failing), by [`MODEL`] and [`REASON`] (counter). A client that went away, or
    /// a request a replica turned down as invalid, is not counted. Each is a request the fleet
    /// did not serve in time, which no TTFT histogram shows.
    pub const UNSERVED_TOTAL: &str = "sluice_gateway_model_unserved_total";
    /// Prompts of those requests that a replica refused as too long (a 400
    /// `context_length_exceeded`: past its `--max-prompt-tokens` or context) with no ready
    /// replica of the model that takes longer ones, by [`MODEL`] (histogram of prompt tokens,
    /// buckets [`crate::vllm::request_tokens_buckets`]): the gateway's estimate (bytes / 4, at
    /// least one past the refusing replica's bound). No replica's token counters hold them;
    /// with per-GPU bounds they include prompts a larger GPU the pool lacks would serve, which
    /// the autoscaler adds to the request shape it plans for.
    pub const REFUSED_PROMPT_TOKENS: &str = "sluice_gateway_model_refused_prompt_tokens";
    /// A replica's base URL.
    pub const REPLICA: &str = "replica";
    /// A request's admission priority.
    pub const PRIORITY: &str = "priority";
    /// The model a request asked for (its served name).
    pub const MODEL: &str = "model";
    /// Why a request went unserved (the gateway's rejection reason).
    pub const REASON: &str = "reason";

    /// [`PROMPT_TOKENS_PER_SECOND`]'s bucket bounds: powers of √2, rounded, from 256 to 2²²
    /// tokens (a relative step of 41 %, fine enough for a replica count).
    pub fn prompt_tokens_per_second_buckets() -> Vec<f64> {
        (16..=44)
            .map(|k| 2f64.powf(f64::from(k) / 2.0).round())
            .collect()
    }
}

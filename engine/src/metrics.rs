//! The engine's Prometheus metrics, named and bucketed as vLLM exports them (so dashboards,
//! HPA adapters and the Gateway API inference extension's endpoint picker read them as they
//! are), plus sluice's own step figures. Every series carries `model_name`.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// vLLM's time-to-first-token buckets (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token latency buckets (seconds).
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request latency buckets (seconds): e2e, queue, prefill and decode time.
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Handles to every series, already bound to this engine's `model_name`.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    pub requests_waiting: IntGauge,
    pub requests_running: IntGauge,
    pub kv_cache_usage: prometheus::Gauge,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue_time: Histogram,
    pub prefill_time: Histogram,
    pub decode_time: Histogram,
    pub prompt_tokens: IntCounter,
    pub generation_tokens: IntCounter,
    pub preemptions: IntCounter,
    pub prefix_queries: IntCounter,
    pub prefix_hits: IntCounter,
    success: IntCounterVec,
    model_name: String,
    pub step_seconds: Histogram,
    pub batch_tokens: Histogram,
    pub batch_sequences: Histogram,
}

impl EngineMetrics {
    /// Creates the series and registers them in `registry`.
    pub fn register(registry: &Registry, model_name: &str) -> prometheus::Result<Self> {
        let label = &["model_name"];
        let gauge = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let v = IntGaugeVec::new(Opts::new(name, help), label)?;
            registry.register(Box::new(v.clone()))?;
            Ok(v.with_label_values(&[model_name]))
        };
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let v = IntCounterVec::new(Opts::new(name, help), label)?;
            registry.register(Box::new(v.clone()))?;
            Ok(v.with_label_values(&[model_name]))
        };
        let histogram = |name: &str, help: &str, b: Vec<f64>| -> prometheus::Result<Histogram> {
            let v = HistogramVec::new(HistogramOpts::new(name, help).buckets(b), label)?;
            registry.register(Box::new(v.clone()))?;
            Ok(v.with_label_values(&[model_name]))
        };
        let kv = prometheus::GaugeVec::new(
            Opts::new(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ),
            label,
        )?;
        registry.register(Box::new(kv.clone()))?;
        let success = IntCounterVec::new(
            Opts::new(
                "vllm:request_success_total",
                "Count of finished requests, by why they finished.",
            ),
            &["model_name", "finished_reason"],
        )?;
        registry.register(Box::new(success.clone()))?;
        let powers = |max: f64| {
            let mut b = vec![1.0];
            while *b.last().expect("non-empty") < max {
                b.push(b.last().expect("non-empty") * 2.0);
            }
            b
        };
        Ok(Self {
            requests_waiting: gauge(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            )?,
            requests_running: gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            )?,
            kv_cache_usage: kv.with_label_values(&[model_name]),
            ttft: histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS.to_vec(),
            )?,
            itl: histogram(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS.to_vec(),
            )?,
            e2e: histogram(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                REQUEST_BUCKETS.to_vec(),
            )?,
            queue_time: histogram(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_BUCKETS.to_vec(),
            )?,
            prefill_time: histogram(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_BUCKETS.to_vec(),
            )?,
            decode_time: histogram(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_BUCKETS.to_vec(),
            )?,
            prompt_tokens: counter(
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
            )?,
            generation_tokens: counter(
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
            )?,
            preemptions: counter(
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
            )?,
            prefix_queries: counter(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            )?,
            prefix_hits: counter(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            )?,
            success,
            model_name: model_name.to_string(),
            step_seconds: histogram(
                "sluice_engine_step_seconds",
                "Wall time of one engine iteration (schedule, forward, sample).",
                prometheus::exponential_buckets(0.001, 2.0, 15)?,
            )?,
            batch_tokens: histogram(
                "sluice_engine_batch_tokens",
                "Tokens fed to one forward call.",
                powers(8192.0),
            )?,
            batch_sequences: histogram(
                "sluice_engine_batch_sequences",
                "Sequences in one forward call.",
                powers(1024.0),
            )?,
        })
    }

    /// Counts a finished choice under its reason.
    pub fn finished(&self, reason: &str) {
        self.success
            .with_label_values(&[self.model_name.as_str(), reason])
            .inc();
    }

    /// Finished choices counted under `reason` so far.
    pub fn finished_count(&self, reason: &str) -> u64 {
        self.success
            .with_label_values(&[self.model_name.as_str(), reason])
            .get()
    }
}

/// vLLM's `vllm:cache_config_info`: a gauge of 1 whose labels carry the KV pool's shape
/// (`num_gpu_blocks`, `block_size`), which the Gateway API inference extension reads. vLLM
/// names the count for GPUs; a CPU replica reports its pool under the same label.
pub fn register_cache_config_info(
    registry: &Registry,
    model_name: &str,
    num_blocks: usize,
    block_size: usize,
) -> prometheus::Result<()> {
    let info = IntGaugeVec::new(
        Opts::new(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
        ),
        &["model_name", "num_gpu_blocks", "block_size"],
    )?;
    registry.register(Box::new(info.clone()))?;
    info.with_label_values(&[model_name, &num_blocks.to_string(), &block_size.to_string()])
        .set(1);
    Ok(())
}

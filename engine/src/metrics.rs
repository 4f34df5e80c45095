//! The engine's Prometheus metrics, named and bucketed as vLLM exports them (so dashboards,
//! HPA adapters and the Gateway API inference extension's endpoint picker read them as they
//! are), plus sluice's own step figures. Every series carries `model_name`. The names, labels
//! and buckets are `sluice-metrics`', which the gateway and the autoscaler read them by; the
//! help texts are here.

use prometheus::core::Collector;
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use sluice_metrics::vllm;

/// A series' name and help text.
#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    help: &'static str,
}

const fn spec(name: &'static str, help: &'static str) -> Spec {
    Spec { name, help }
}

const WAITING: Spec = spec(
    vllm::NUM_REQUESTS_WAITING,
    "Number of requests waiting to be processed.",
);
const RUNNING: Spec = spec(
    vllm::NUM_REQUESTS_RUNNING,
    "Number of requests in model execution batches.",
);
const KV_USAGE: Spec = spec(
    vllm::KV_CACHE_USAGE_PERC,
    "KV-cache usage. 1 means 100 percent usage.",
);
const SUCCESS: Spec = spec(
    vllm::REQUEST_SUCCESS_TOTAL,
    "Count of finished requests, by why they finished.",
);
const TTFT: Spec = spec(
    vllm::TIME_TO_FIRST_TOKEN_SECONDS,
    "Histogram of time to first token in seconds.",
);
const ITL: Spec = spec(
    vllm::INTER_TOKEN_LATENCY_SECONDS,
    "Histogram of inter-token latency in seconds.",
);
const E2E: Spec = spec(
    vllm::E2E_REQUEST_LATENCY_SECONDS,
    "Histogram of e2e request latency in seconds.",
);
const QUEUE_TIME: Spec = spec(
    vllm::REQUEST_QUEUE_TIME_SECONDS,
    "Histogram of time spent in WAITING phase for request.",
);
const PREFILL_TIME: Spec = spec(
    vllm::REQUEST_PREFILL_TIME_SECONDS,
    "Histogram of time spent in PREFILL phase for request.",
);
const DECODE_TIME: Spec = spec(
    vllm::REQUEST_DECODE_TIME_SECONDS,
    "Histogram of time spent in DECODE phase for request.",
);
const REQUEST_PROMPT: Spec = spec(
    vllm::REQUEST_PROMPT_TOKENS,
    "Number of prefill tokens processed, per request.",
);
const REQUEST_GENERATION: Spec = spec(
    vllm::REQUEST_GENERATION_TOKENS,
    "Number of generation tokens processed, per request.",
);
const PROMPT_TOKENS: Spec = spec(
    vllm::PROMPT_TOKENS_TOTAL,
    "Number of prefill tokens processed.",
);
const GENERATION_TOKENS: Spec = spec(
    vllm::GENERATION_TOKENS_TOTAL,
    "Number of generation tokens processed.",
);
const PREEMPTIONS: Spec = spec(
    vllm::NUM_PREEMPTIONS_TOTAL,
    "Cumulative number of preemption from the engine.",
);
const PREFIX_QUERIES: Spec = spec(
    vllm::PREFIX_CACHE_QUERIES_TOTAL,
    "Prefix cache queries, in terms of number of queried tokens.",
);
const PREFIX_HITS: Spec = spec(
    vllm::PREFIX_CACHE_HITS_TOTAL,
    "Prefix cache hits, in terms of number of cached tokens.",
);
const STEP_SECONDS: Spec = spec(
    "sluice_engine_step_seconds",
    "Wall time of one engine iteration (schedule, forward, sample).",
);
const BATCH_TOKENS: Spec = spec(
    "sluice_engine_batch_tokens",
    "Tokens fed to one forward call.",
);
const BATCH_SEQUENCES: Spec = spec(
    "sluice_engine_batch_sequences",
    "Sequences in one forward call.",
);

/// Handles to every series, already bound to this engine's `model_name`.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    pub requests_waiting: IntGauge,
    pub requests_running: IntGauge,
    pub kv_cache_usage: Gauge,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue_time: Histogram,
    pub prefill_time: Histogram,
    pub decode_time: Histogram,
    /// Each request's prompt length, observed with its first token (as the TTFT is, so an
    /// autoscaler can set the TTFTs in time against the prompts a replica prefills in time).
    pub request_prompt_tokens: Histogram,
    /// Each finished choice's output length: with the prompt's, the spread of sequence
    /// lengths that decides how many share the KV cache.
    pub request_generation_tokens: Histogram,
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
        let r = Registrar {
            registry,
            model_name,
        };
        let success = r.register(IntCounterVec::new(
            SUCCESS.opts(),
            &[vllm::MODEL_NAME, vllm::FINISHED_REASON],
        )?)?;
        Ok(Self {
            requests_waiting: r.gauge(WAITING)?,
            requests_running: r.gauge(RUNNING)?,
            kv_cache_usage: r.float_gauge(KV_USAGE)?,
            ttft: r.histogram(TTFT, vllm::TTFT_BUCKETS.to_vec())?,
            itl: r.histogram(ITL, vllm::ITL_BUCKETS.to_vec())?,
            e2e: r.histogram(E2E, vllm::REQUEST_LATENCY_BUCKETS.to_vec())?,
            queue_time: r.histogram(QUEUE_TIME, vllm::REQUEST_LATENCY_BUCKETS.to_vec())?,
            prefill_time: r.histogram(PREFILL_TIME, vllm::REQUEST_LATENCY_BUCKETS.to_vec())?,
            decode_time: r.histogram(DECODE_TIME, vllm::REQUEST_LATENCY_BUCKETS.to_vec())?,
            request_prompt_tokens: r.histogram(REQUEST_PROMPT, vllm::request_tokens_buckets())?,
            request_generation_tokens: r
                .histogram(REQUEST_GENERATION, vllm::request_tokens_buckets())?,
            prompt_tokens: r.counter(PROMPT_TOKENS)?,
            generation_tokens: r.counter(GENERATION_TOKENS)?,
            preemptions: r.counter(PREEMPTIONS)?,
            prefix_queries: r.counter(PREFIX_QUERIES)?,
            prefix_hits: r.counter(PREFIX_HITS)?,
            success,
            model_name: model_name.to_string(),
            step_seconds: r.histogram(
                STEP_SECONDS,
                prometheus::exponential_buckets(0.001, 2.0, 15)?,
            )?,
            batch_tokens: r.histogram(BATCH_TOKENS, powers_of_two(8192.0))?,
            batch_sequences: r.histogram(BATCH_SEQUENCES, powers_of_two(1024.0))?,
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

impl Spec {
    fn opts(self) -> Opts {
        Opts::new(self.name, self.help)
    }
}

/// Registers series labelled by `model_name` and returns each bound to this engine's model.
struct Registrar<'a> {
    registry: &'a Registry,
    model_name: &'a str,
}

impl Registrar<'_> {
    const LABELS: &'static [&'static str] = &[vllm::MODEL_NAME];

    fn register<C: Collector + Clone + 'static>(&self, c: C) -> prometheus::Result<C> {
        self.registry.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn gauge(&self, s: Spec) -> prometheus::Result<IntGauge> {
        let v = self.register(IntGaugeVec::new(s.opts(), Self::LABELS)?)?;
        Ok(v.with_label_values(&[self.model_name]))
    }

    fn float_gauge(&self, s: Spec) -> prometheus::Result<Gauge> {
        let v = self.register(GaugeVec::new(s.opts(), Self::LABELS)?)?;
        Ok(v.with_label_values(&[self.model_name]))
    }

    fn counter(&self, s: Spec) -> prometheus::Result<IntCounter> {
        let v = self.register(IntCounterVec::new(s.opts(), Self::LABELS)?)?;
        Ok(v.with_label_values(&[self.model_name]))
    }

    fn histogram(&self, s: Spec, buckets: Vec<f64>) -> prometheus::Result<Histogram> {
        let opts = HistogramOpts::new(s.name, s.help).buckets(buckets);
        let v = self.register(HistogramVec::new(opts, Self::LABELS)?)?;
        Ok(v.with_label_values(&[self.model_name]))
    }
}

/// 1, 2, 4, … up to the first power of two at or above `max`.
fn powers_of_two(max: f64) -> Vec<f64> {
    let mut b = vec![1.0];
    while *b.last().expect("non-empty") < max {
        b.push(b.last().expect("non-empty") * 2.0);
    }
    b
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
            vllm::CACHE_CONFIG_INFO,
            "Information of the KV cache configuration.",
        ),
        &[vllm::MODEL_NAME, vllm::NUM_GPU_BLOCKS, vllm::BLOCK_SIZE],
    )?;
    registry.register(Box::new(info.clone()))?;
    info.with_label_values(&[model_name, &num_blocks.to_string(), &block_size.to_string()])
        .set(1);
    Ok(())
}

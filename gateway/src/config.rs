//! `sluice serve` options: every flag also an environment variable, parsed raw by clap and
//! then validated into [`ServeConfig`] with messages that name the flag.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sluice_models::DeviceSpec;

use crate::discovery::Source;
use crate::router::health::EjectionPolicy;
use crate::router::policy::Policy;
use crate::router::remote::{RemoteOptions, ReplicaUrl};
use crate::router::{Binding, RouterConfig};

/// A routing-only gateway's default `--max-in-flight`.
pub const ROUTING_MAX_IN_FLIGHT: usize = 4096;

/// The model served when neither --model nor any routing flag is given.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// Raw `sluice serve` flags.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to bind.
    #[arg(long, env = "SLUICE_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0: any free port, printed at start).
    #[arg(long, env = "SLUICE_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Model to run in-process: a registry name or a .gguf path (default
    /// smollm2-135m-instruct unless --upstream or --discover make this a routing gateway).
    #[arg(long, env = "SLUICE_MODEL")]
    pub model: Option<String>,
    /// Where registry models are cached.
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    pub model_dir: PathBuf,
    /// The model id clients use (default: the registry name, else the file stem).
    #[arg(long, env = "SLUICE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Compute threads (0: one per core).
    #[arg(long, env = "SLUICE_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Where the forward pass runs: `cpu` or `cuda:N` (builds with the `cuda` feature).
    #[arg(long, env = "SLUICE_DEVICE", default_value = "cpu")]
    pub device: String,
    /// The forward pass: `kernels` (CPU only, the CPU default) or `candle` (implied by cuda:N).
    #[arg(long, env = "SLUICE_BACKEND")]
    pub backend: Option<String>,
    /// On a GPU: the share of the memory free after the weights load that the KV pool takes.
    #[arg(long, env = "SLUICE_GPU_MEMORY_UTILIZATION", default_value_t = 0.90)]
    pub gpu_memory_utilization: f64,
    /// API keys and tenants (TOML or JSON). Without it the server is open.
    #[arg(long, env = "SLUICE_API_KEYS")]
    pub api_keys: Option<PathBuf>,
    /// Sequences per engine step.
    #[arg(long, env = "SLUICE_MAX_NUM_SEQS", default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Tokens per engine step (decodes plus prefill chunks).
    #[arg(long, env = "SLUICE_MAX_NUM_BATCHED_TOKENS", default_value_t = 256)]
    pub max_num_batched_tokens: usize,
    /// Longest prompt + completion (default: the model's context).
    #[arg(long, env = "SLUICE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Refuse prompts longer than this many tokens with a 400 before any prefill (TGI's
    /// `--max-input-tokens`): a prompt no replica prefills within the TTFT target holds a
    /// replica's prefill and misses anyway. `sluice-autoscaler profiles` prints the longest
    /// prompt each GPU serves in time; give every replica of a model the largest over its
    /// GPUs (the gateway routes by load, not by bound). Needs `--model`: a gateway that only
    /// routes does not tokenise, so set it on the replicas. Default: only the context.
    #[arg(long, env = "SLUICE_MAX_PROMPT_TOKENS")]
    pub max_prompt_tokens: Option<usize>,
    /// KV cache memory in MiB.
    #[arg(long, env = "SLUICE_KV_CACHE_MIB", default_value_t = 1024)]
    pub kv_cache_mib: usize,
    /// Turn automatic prefix caching off.
    #[arg(long, env = "SLUICE_NO_PREFIX_CACHING")]
    pub no_prefix_caching: bool,
    /// Requests generating at once before the admission queue holds new ones
    /// (default: twice max-num-seqs; 4096 for a gateway that only routes).
    #[arg(long, env = "SLUICE_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Requests the admission queue holds, and each model's routing queue; beyond it, 429.
    #[arg(long, env = "SLUICE_MAX_QUEUE", default_value_t = 1024)]
    pub max_queue: usize,
    /// Longest wait in the admission queue, or in a model's routing queue while its replicas
    /// are ready but full, before a 429 (e.g. 30s, 500ms).
    #[arg(long, env = "SLUICE_QUEUE_TIMEOUT", default_value = "30s")]
    pub queue_timeout: String,
    /// A request queued longer than this (the deployment's TTFT target, e.g. 2s) yields its
    /// place to requests that can still meet it; late ones are served, in order, whenever no
    /// on-time request waits. Unset: fair arrival order only.
    #[arg(long, env = "SLUICE_QUEUE_LATE_AFTER")]
    pub queue_late_after: Option<String>,
    /// Time in-flight requests get to finish after SIGTERM.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT", default_value = "30s")]
    pub drain_timeout: String,
    /// Time to receive a request's headers (slow-loris protection).
    #[arg(long, env = "SLUICE_HEADER_TIMEOUT", default_value = "10s")]
    pub header_timeout: String,
    /// Time to receive a request's body.
    #[arg(long, env = "SLUICE_BODY_TIMEOUT", default_value = "30s")]
    pub body_timeout: String,
    /// Total time allowed per generation request (default: none).
    #[arg(long, env = "SLUICE_REQUEST_TIMEOUT")]
    pub request_timeout: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, env = "SLUICE_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Log prompts (off by default: prompts are user data).
    #[arg(long, env = "SLUICE_LOG_PROMPTS")]
    pub log_prompts: bool,
    /// A chat template in place of the model's: a file, or the template itself (Jinja, as in
    /// Hugging Face's `tokenizer_config.json`) when no such file exists. Read and compiled
    /// when the model loads; an error there stops the start.
    #[arg(long, env = "SLUICE_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Accept a `chat_template` in chat requests (a template is code the server runs, bounded
    /// in instructions and output, but the caller's; off by default, as vLLM's flag).
    #[arg(long, env = "SLUICE_TRUST_REQUEST_CHAT_TEMPLATE")]
    pub trust_request_chat_template: bool,
    /// Parse and validate every option (flags and SLUICE_* variables), print the resulting
    /// configuration as one JSON object and exit: 0 when valid, 1 when not. Binds nothing,
    /// loads nothing, reads no file. Deployment checks run the manifests' arguments through it.
    /// (A mode, not a setting: deliberately no environment variable, so no pod can inherit it.)
    #[arg(long)]
    pub check_config: bool,
    #[command(flatten)]
    pub routing: RoutingArgs,
}

/// Routing to remote replicas.
#[derive(Args, Debug, Clone)]
pub struct RoutingArgs {
    /// A replica to route to, http://HOST:PORT (repeatable; comma-separated in the variable).
    #[arg(long = "upstream", env = "SLUICE_UPSTREAM", value_delimiter = ',')]
    pub upstreams: Vec<String>,
    /// Replicas to discover: dns://NAME:PORT, file://PATH or k8s://NAMESPACE/SERVICE:PORT
    /// (repeatable).
    #[arg(long = "discover", env = "SLUICE_DISCOVER", value_delimiter = ',')]
    pub discover: Vec<String>,
    /// How DNS names are re-resolved and discovery files re-checked.
    #[arg(long, env = "SLUICE_DISCOVER_INTERVAL", default_value = "5s")]
    pub discover_interval: String,
    /// round-robin, least-load or prefix-affinity.
    #[arg(long, env = "SLUICE_POLICY", default_value = "prefix-affinity")]
    pub policy: String,
    /// How often each replica's /metrics is polled for load.
    #[arg(long, env = "SLUICE_POLL_INTERVAL", default_value = "200ms")]
    pub poll_interval: String,
    /// Polled load older than this counts as saturated (default: 5 poll intervals, at least 1s).
    #[arg(long, env = "SLUICE_STALE_AFTER")]
    pub stale_after: Option<String>,
    /// How often each replica's health is checked; a check waits as long for its answer
    /// (at least 1s, at most 5s).
    #[arg(long, env = "SLUICE_HEALTH_INTERVAL", default_value = "1s")]
    pub health_interval: String,
    /// The replicas' health-check path (sluice replicas also serve /ready).
    #[arg(long, env = "SLUICE_HEALTH_PATH", default_value = "/health")]
    pub health_path: String,
    /// Time to connect to a replica.
    #[arg(long, env = "SLUICE_UPSTREAM_CONNECT_TIMEOUT", default_value = "1s")]
    pub upstream_connect_timeout: String,
    /// Time to a replica's first byte (for a non-streaming request, its whole answer).
    #[arg(long, env = "SLUICE_UPSTREAM_TIMEOUT", default_value = "60s")]
    pub upstream_timeout: String,
    /// Attempts per request before its first byte, the first included.
    #[arg(long, env = "SLUICE_UPSTREAM_ATTEMPTS", default_value_t = 3)]
    pub upstream_attempts: u32,
    /// First retry's backoff (doubling, jittered).
    #[arg(long, env = "SLUICE_RETRY_BACKOFF", default_value = "10ms")]
    pub retry_backoff: String,
    /// Requests in flight per replica beyond which it is not picked.
    #[arg(long, env = "SLUICE_REPLICA_MAX_IN_FLIGHT", default_value_t = 256)]
    pub replica_max_in_flight: usize,
    /// Prefix affinity's bounded load: skip the prefix's replica when its load score exceeds the
    /// least loaded one's by more than this (in requests).
    #[arg(long, env = "SLUICE_AFFINITY_THRESHOLD", default_value_t = 4.0)]
    pub affinity_threshold: f64,
    /// Leading prompt bytes that decide affinity.
    #[arg(long, env = "SLUICE_AFFINITY_PREFIX_BYTES", default_value_t = 512)]
    pub affinity_prefix_bytes: usize,
    /// Consecutive failures that eject a replica.
    #[arg(long, env = "SLUICE_EJECT_AFTER", default_value_t = 3)]
    pub eject_after: u32,
    /// First ejection's length; each further one doubles, up to --eject-max.
    #[arg(long, env = "SLUICE_EJECT_BASE", default_value = "1s")]
    pub eject_base: String,
    #[arg(long, env = "SLUICE_EJECT_MAX", default_value = "30s")]
    pub eject_max: String,
    /// When a request is bound to a replica: `late` (it waits in the gateway's per-model queue
    /// until a replica has room) or `early` (at once, to wait in the replica's queue).
    #[arg(long, env = "SLUICE_BINDING", default_value = "late")]
    pub binding: String,
    /// The longest a request for a known model is held while no replica of it is ready
    /// (a pool at zero); then 503 with Retry-After.
    #[arg(long, env = "SLUICE_HOLD_TIMEOUT", default_value = "60s")]
    pub hold_timeout: String,
    /// Models routed even while no replica serves them (comma-separated): listed by
    /// /v1/models, their requests held until a replica is ready.
    #[arg(long, env = "SLUICE_SERVED_MODELS", value_delimiter = ',')]
    pub served_models: Vec<String>,
}

/// Validated routing configuration.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    pub sources: Vec<Source>,
    pub discover_interval: Duration,
    pub router: RouterConfig,
}

impl RoutingArgs {
    /// `--upstream` as one static source, and each `--discover`.
    fn sources(&self) -> Result<Vec<Source>, String> {
        let mut sources = Vec::new();
        if !self.upstreams.is_empty() {
            let urls = self
                .upstreams
                .iter()
                .map(|u| ReplicaUrl::parse(u).map_err(|e| format!("--upstream: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            sources.push(Source::Static(urls));
        }
        for d in &self.discover {
            sources.push(Source::parse(d).map_err(|e| e.to_string())?);
        }
        let models: Vec<String> = self
            .served_models
            .iter()
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty())
            .collect();
        if !models.is_empty() {
            sources.push(Source::Models(models));
        }
        Ok(sources)
    }

    /// The flags that are plain numbers or paths.
    fn check_limits(&self) -> Result<(), String> {
        if !self.health_path.starts_with('/') {
            return Err(format!(
                "--health-path: '{}' must start with /",
                self.health_path
            ));
        }
        if self.upstream_attempts == 0 {
            return Err("--upstream-attempts must be at least 1".into());
        }
        if self.replica_max_in_flight == 0 {
            return Err("--replica-max-in-flight must be at least 1".into());
        }
        if self.eject_after == 0 {
            return Err("--eject-after must be at least 1".into());
        }
        if !(self.affinity_threshold.is_finite() && self.affinity_threshold >= 0.0) {
            return Err("--affinity-threshold must be a number ≥ 0".into());
        }
        if self.affinity_prefix_bytes == 0 {
            return Err("--affinity-prefix-bytes must be at least 1".into());
        }
        Ok(())
    }

    /// `None` when neither --upstream nor --discover is given.
    pub fn validate(&self) -> Result<Option<RoutingConfig>, String> {
        if self.upstreams.is_empty() && self.discover.is_empty() && self.served_models.is_empty() {
            return Ok(None);
        }
        let sources = self.sources()?;
        self.check_limits()?;
        let poll_interval = parse_duration("poll-interval", &self.poll_interval)?;
        let health_interval = parse_duration("health-interval", &self.health_interval)?;
        let discover_interval = parse_duration("discover-interval", &self.discover_interval)?;
        for (flag, d) in [
            ("poll-interval", poll_interval),
            ("health-interval", health_interval),
            ("discover-interval", discover_interval),
        ] {
            if d < Duration::from_millis(10) {
                return Err(format!("--{flag} must be at least 10ms"));
            }
        }
        let stale_after = match &self.stale_after {
            Some(s) => parse_duration("stale-after", s)?,
            None => (poll_interval * 5).max(Duration::from_secs(1)),
        };
        if stale_after <= poll_interval {
            return Err("--stale-after must be longer than --poll-interval".into());
        }
        let ejection = EjectionPolicy {
            eject_after: self.eject_after,
            base: parse_duration("eject-base", &self.eject_base)?,
            max: parse_duration("eject-max", &self.eject_max)?,
        };
        Ok(Some(RoutingConfig {
            sources,
            discover_interval,
            router: RouterConfig {
                policy: Policy::parse(&self.policy)?,
                poll_interval,
                stale_after,
                health_interval,
                health_path: self.health_path.clone(),
                upstream_timeout: parse_duration("upstream-timeout", &self.upstream_timeout)?,
                max_attempts: self.upstream_attempts,
                backoff: parse_duration("retry-backoff", &self.retry_backoff)?,
                replica_max_in_flight: self.replica_max_in_flight,
                affinity_threshold: self.affinity_threshold,
                affinity_prefix_bytes: self.affinity_prefix_bytes,
                ejection,
                remote: RemoteOptions {
                    connect_timeout: parse_duration(
                        "upstream-connect-timeout",
                        &self.upstream_connect_timeout,
                    )?,
                    ..RemoteOptions::default()
                },
                binding: Binding::parse(&self.binding)?,
                hold_timeout: parse_duration("hold-timeout", &self.hold_timeout)?,
                // The serve flags' queue bounds, set by `ServeArgs::validate`.
                ..RouterConfig::default()
            },
        }))
    }
}

/// Validated `serve` configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub addr: SocketAddr,
    /// The model to run in-process, if any.
    pub model: Option<String>,
    /// Remote replicas to route to, if any.
    pub routing: Option<RoutingConfig>,
    pub model_dir: PathBuf,
    pub served_model_name: Option<String>,
    pub threads: usize,
    pub device: DeviceSpec,
    pub backend: sluice_models::Backend,
    pub gpu_memory_utilization: f64,
    pub api_keys: Option<PathBuf>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: Option<usize>,
    /// Prompts longer than this are refused (`--max-prompt-tokens`).
    pub max_prompt_tokens: Option<usize>,
    pub kv_cache_bytes: usize,
    pub prefix_caching: bool,
    pub max_in_flight: usize,
    pub max_queue: usize,
    pub queue_timeout: Duration,
    pub queue_late_after: Option<Duration>,
    pub drain_timeout: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub request_timeout: Option<Duration>,
    pub max_body_bytes: usize,
    pub log_prompts: bool,
    pub chat_template: Option<String>,
    pub trust_request_chat_template: bool,
}

impl ServeConfig {
    /// What `--check-config` prints: the validated configuration in the terms a deployment
    /// is checked against (the port probes must target, the paths sluice serves, the drain
    /// timeout a termination grace period must exceed, the discovery targets).
    pub fn summary(&self) -> serde_json::Value {
        use crate::api::{HEALTH_PATH, METRICS_PATH, READY_PATH};
        use crate::discovery::k8s::Port;
        let sources: Vec<serde_json::Value> = self
            .routing
            .iter()
            .flat_map(|r| &r.sources)
            .map(|s| match s {
                Source::Static(urls) => serde_json::json!({
                    "kind": "static",
                    "upstreams": urls.iter().map(ToString::to_string).collect::<Vec<_>>(),
                }),
                Source::Dns { host, port } => {
                    serde_json::json!({ "kind": "dns", "host": host, "port": port })
                }
                Source::File(path) => serde_json::json!({ "kind": "file", "path": path }),
                Source::Models(models) => serde_json::json!({ "kind": "models", "models": models }),
                Source::K8s(t) => serde_json::json!({
                    "kind": "k8s",
                    "namespace": t.namespace,
                    "service": t.service,
                    "port": match &t.port {
                        Port::Number(n) => serde_json::json!(n),
                        Port::Name(name) => serde_json::json!(name),
                    },
                }),
            })
            .collect();
        serde_json::json!({
            "host": self.addr.ip().to_string(),
            "port": self.addr.port(),
            "model": self.model,
            "model_dir": self.model_dir,
            "served_model_name": self.served_model_name,
            "routing": self.routing.is_some(),
            "discovery": sources,
            "health_check_path": self.routing.as_ref().map(|r| r.router.health_path.clone()),
            "binding": self.routing.as_ref().map(|r| r.router.binding.label()),
            "hold_timeout_s": self.routing.as_ref().map(|r| r.router.hold_timeout.as_secs_f64()),
            "paths": { "health": HEALTH_PATH, "ready": READY_PATH, "metrics": METRICS_PATH },
            "drain_timeout_s": self.drain_timeout.as_secs_f64(),
            "max_num_seqs": self.max_num_seqs,
            "max_prompt_tokens": self.max_prompt_tokens,
            "kv_cache_mib": self.kv_cache_bytes >> 20,
            "device": self.device.to_string(),
            "cuda_in_binary": cfg!(feature = "cuda"),
            "backend": self.backend.to_string(),
        })
    }
}

/// A duration such as `30s`, `500ms`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(flag: &str, s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("--{flag}: '{s}' is not a duration (e.g. 30s, 500ms, 2m)"))?;
    let secs = match unit.trim() {
        "ms" => v / 1000.0,
        "s" | "" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        other => {
            return Err(format!(
                "--{flag}: unknown unit '{other}' (use ms, s, m or h)"
            ))
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("--{flag}: '{s}' is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl ServeArgs {
    /// `--device`, `--backend` and `--gpu-memory-utilization`, checked together: the device's
    /// syntax, that a GPU has a model to run, and that the backend runs on the device. Whether
    /// this binary has CUDA is not checked here (deployment checks validate GPU manifests with
    /// a CPU build): the summary reports it, and loading the model on a GPU fails clearly
    /// without it.
    fn device_and_backend(
        &self,
        has_model: bool,
    ) -> Result<(DeviceSpec, sluice_models::Backend), String> {
        let device: DeviceSpec = self
            .device
            .parse()
            .map_err(|e: sluice_models::ModelError| format!("--device: {e}"))?;
        if device != DeviceSpec::Cpu && !has_model {
            return Err(format!(
                "--device {device}: a gateway that only routes runs no model (add --model)"
            ));
        }
        let backend = self
            .backend
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|e| format!("--backend: {e}"))?;
        let backend =
            sluice_models::Backend::resolve(backend, device).map_err(|e| e.to_string())?;
        let u = self.gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return Err(format!("--gpu-memory-utilization {u} must be in (0, 1]"));
        }
        Ok((device, backend))
    }

    pub fn validate(&self) -> Result<ServeConfig, String> {
        let ip: IpAddr = self
            .host
            .parse()
            .map_err(|_| format!("--host: '{}' is not an IP address", self.host))?;
        let positive = |flag: &str, v: usize| {
            if v == 0 {
                Err(format!("--{flag} must be at least 1"))
            } else {
                Ok(v)
            }
        };
        positive("max-num-seqs", self.max_num_seqs)?;
        positive("max-num-batched-tokens", self.max_num_batched_tokens)?;
        positive("kv-cache-mib", self.kv_cache_mib)?;
        positive("max-body-bytes", self.max_body_bytes)?;
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(format!(
                "--max-num-batched-tokens ({}) must be at least --max-num-seqs ({})",
                self.max_num_batched_tokens, self.max_num_seqs
            ));
        }
        let mut routing = self.routing.validate()?;
        let queue_timeout = parse_duration("queue-timeout", &self.queue_timeout)?;
        let queue_late_after = self
            .queue_late_after
            .as_deref()
            .map(|s| parse_duration("queue-late-after", s))
            .transpose()?;
        if let Some(r) = routing.as_mut() {
            r.router.max_queue = self.max_queue;
            r.router.queue_timeout = queue_timeout;
            r.router.queue_late_after = queue_late_after;
        }
        // A gateway that only routes holds no sequences itself: its own limit is the replicas'
        // (each capped by --replica-max-in-flight), so its default admission cap is wide.
        let default_in_flight = if routing.is_some() && self.model.is_none() {
            ROUTING_MAX_IN_FLIGHT
        } else {
            2 * self.max_num_seqs
        };
        let max_in_flight = self.max_in_flight.unwrap_or(default_in_flight);
        positive("max-in-flight", max_in_flight)?;
        // A routing gateway runs no model unless asked to.
        let model = match (&self.model, &routing) {
            (Some(m), _) => Some(m.clone()),
            (None, None) => Some(DEFAULT_MODEL.to_string()),
            (None, Some(_)) => None,
        };
        let (device, backend) = self.device_and_backend(model.is_some())?;
        if let Some(n) = self.max_prompt_tokens {
            positive("max-prompt-tokens", n)?;
            if model.is_none() {
                return Err(
                    "--max-prompt-tokens: a gateway that only routes does not tokenise \
                            prompts; set it on the replicas (or add --model)"
                        .into(),
                );
            }
        }
        Ok(ServeConfig {
            addr: SocketAddr::new(ip, self.port),
            model,
            routing,
            model_dir: self.model_dir.clone(),
            served_model_name: self.served_model_name.clone(),
            threads: self.threads,
            device,
            backend,
            gpu_memory_utilization: self.gpu_memory_utilization,
            api_keys: self.api_keys.clone(),
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            max_prompt_tokens: self.max_prompt_tokens,
            kv_cache_bytes: self.kv_cache_mib << 20,
            prefix_caching: !self.no_prefix_caching,
            max_in_flight,
            max_queue: self.max_queue,
            queue_timeout,
            queue_late_after,
            drain_timeout: parse_duration("drain-timeout", &self.drain_timeout)?,
            header_timeout: parse_duration("header-timeout", &self.header_timeout)?,
            body_timeout: parse_duration("body-timeout", &self.body_timeout)?,
            request_timeout: self
                .request_timeout
                .as_deref()
                .map(|s| parse_duration("request-timeout", s))
                .transpose()?,
            max_body_bytes: self.max_body_bytes,
            log_prompts: self.log_prompts,
            chat_template: self.chat_template.clone(),
            trust_request_chat_template: self.trust_request_chat_template,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("x", "30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("x", "30s").unwrap(), Duration::from_secs(30));
        assert_eq!(
            parse_duration("x", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_duration("x", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(
            parse_duration("x", "0.5s").unwrap(),
            Duration::from_millis(500)
        );
        assert!(parse_duration("queue-timeout", "soon")
            .unwrap_err()
            .contains("--queue-timeout"));
        assert!(parse_duration("x", "3d").is_err());
    }

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn cfg(args: &[&str]) -> Result<ServeConfig, String> {
        use clap::Parser;
        let mut argv = vec!["sluice"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .serve
            .validate()
    }

    #[test]
    fn device_and_backend_flags_are_checked_together() {
        use sluice_models::{Backend, DeviceSpec};
        let c = cfg(&[]).unwrap();
        assert_eq!((c.device, c.backend), (DeviceSpec::Cpu, Backend::Kernels));
        let c = cfg(&["--backend", "candle"]).unwrap();
        assert_eq!(c.backend, Backend::Candle);
        let c = cfg(&["--device", "cuda:1"]).unwrap();
        assert_eq!(
            (c.device, c.backend),
            (DeviceSpec::Cuda(1), Backend::Candle)
        );
        let err = |args: &[&str]| cfg(args).unwrap_err();
        assert!(err(&["--device", "gpu"]).contains("--device: device: unknown device 'gpu'"));
        assert!(err(&["--backend", "torch"]).contains("--backend: device: unknown backend"));
        let e = err(&["--device", "cuda:0", "--backend", "kernels"]);
        assert!(e.contains("CPU only"), "{e}");
        let e = err(&["--gpu-memory-utilization", "1.5"]);
        assert!(e.contains("--gpu-memory-utilization"), "{e}");
    }

    #[test]
    fn routing_flags_make_a_gateway_without_a_model() {
        let local = cfg(&[]).unwrap();
        assert_eq!(local.model.as_deref(), Some(DEFAULT_MODEL));
        assert!(local.routing.is_none());
        let gw = cfg(&[
            "--upstream",
            "http://a:1",
            "--upstream",
            "http://b:2",
            "--policy",
            "least-load",
        ])
        .unwrap();
        assert!(gw.model.is_none());
        assert_eq!(gw.max_in_flight, ROUTING_MAX_IN_FLIGHT);
        assert_eq!(local.max_in_flight, 128);
        let r = gw.routing.unwrap();
        assert_eq!(r.sources.len(), 1);
        assert_eq!(r.router.policy, Policy::LeastLoad);
        let both = cfg(&["--model", "m", "--discover", "dns://x:1"]).unwrap();
        assert_eq!(both.model.as_deref(), Some("m"));
        for (args, flag) in [
            (&["--upstream", "https://a:1"][..], "--upstream"),
            (&["--discover", "zk://x"][..], "--discover"),
            (
                &["--upstream", "http://a:1", "--policy", "random"][..],
                "--policy",
            ),
            (
                &["--upstream", "http://a:1", "--upstream-attempts", "0"][..],
                "--upstream-attempts",
            ),
            (
                &["--upstream", "http://a:1", "--poll-interval", "1ms"][..],
                "--poll-interval",
            ),
        ] {
            let e = cfg(args).unwrap_err();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn a_prompt_bound_needs_a_model_to_tokenise_with() {
        let local = cfg(&["--max-prompt-tokens", "45000"]).unwrap();
        assert_eq!(local.max_prompt_tokens, Some(45_000));
        assert_eq!(local.summary()["max_prompt_tokens"], 45_000);
        assert_eq!(cfg(&[]).unwrap().max_prompt_tokens, None);
        for args in [
            &["--max-prompt-tokens", "0"][..],
            &["--upstream", "http://a:1", "--max-prompt-tokens", "100"][..],
        ] {
            let e = cfg(args).unwrap_err();
            assert!(e.contains("--max-prompt-tokens"), "{args:?}: {e}");
        }
    }

    #[test]
    fn queue_flags_reach_the_router_and_models_alone_make_a_routing_gateway() {
        let gw = cfg(&["--served-models", "a, b", "--max-queue", "7"]).unwrap();
        let r = gw.routing.as_ref().unwrap();
        assert_eq!(r.sources, [Source::Models(vec!["a".into(), "b".into()])]);
        assert_eq!(r.router.binding, Binding::Late);
        assert_eq!(r.router.max_queue, 7);
        assert_eq!(r.router.hold_timeout, Duration::from_secs(60));
        assert_eq!(r.router.queue_timeout, Duration::from_secs(30));
        assert_eq!(
            (r.router.queue_late_after, gw.queue_late_after),
            (None, None)
        );
        assert!(gw.model.is_none());
        let late = cfg(&["--served-models", "a", "--queue-late-after", "2s"]).unwrap();
        let two = Some(Duration::from_secs(2));
        assert_eq!(late.routing.as_ref().unwrap().router.queue_late_after, two);
        assert_eq!(late.queue_late_after, two);
        let e = cfg(&["--served-models", "a", "--queue-late-after", "soon"]).unwrap_err();
        assert!(e.contains("--queue-late-after"), "{e}");
        let early = cfg(&[
            "--upstream",
            "http://a:1",
            "--binding",
            "early",
            "--hold-timeout",
            "5s",
        ])
        .unwrap()
        .routing
        .unwrap();
        assert_eq!(early.router.binding, Binding::Early);
        assert_eq!(early.router.hold_timeout, Duration::from_secs(5));
        for (args, flag) in [
            (
                &["--upstream", "http://a:1", "--binding", "lazy"][..],
                "--binding",
            ),
            (
                &["--upstream", "http://a:1", "--hold-timeout", "soon"][..],
                "--hold-timeout",
            ),
        ] {
            let e = cfg(args).unwrap_err();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn device_is_checked_for_syntax_and_a_model() {
        let gpu = cfg(&["--model", "m", "--device", "cuda:1"]).unwrap();
        assert_eq!(gpu.device, DeviceSpec::Cuda(1));
        assert_eq!(gpu.summary()["device"], "cuda:1");
        assert_eq!(gpu.summary()["cuda_in_binary"], cfg!(feature = "cuda"));
        for (args, want) in [
            (&["--device", "gpu0"][..], "--device"),
            (&["--device", "cuda:x"][..], "cuda:x"),
            (
                &["--upstream", "http://a:1", "--device", "cuda:0"][..],
                "--model",
            ),
        ] {
            let e = cfg(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }

    #[test]
    fn check_config_summary_names_what_a_deployment_is_checked_against() {
        let gw = cfg(&[
            "--check-config",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--discover",
            "k8s://llm/sluice-replicas:http",
            "--health-path",
            "/ready",
            "--drain-timeout",
            "45s",
        ])
        .unwrap();
        let s = gw.summary();
        assert_eq!(s["port"], 8000);
        assert_eq!(s["host"], "0.0.0.0");
        assert_eq!(s["model"], serde_json::Value::Null);
        assert_eq!(s["routing"], true);
        assert_eq!(
            s["discovery"],
            serde_json::json!([{
                "kind": "k8s", "namespace": "llm", "service": "sluice-replicas", "port": "http"
            }])
        );
        assert_eq!(s["health_check_path"], "/ready");
        assert_eq!(s["drain_timeout_s"], 45.0);
        assert_eq!(
            s["paths"],
            serde_json::json!({ "health": "/health", "ready": "/ready", "metrics": "/metrics" })
        );
        let replica = cfg(&[
            "--model",
            "smollm2-135m-instruct",
            "--discover",
            "dns://r:8000",
        ])
        .unwrap()
        .summary();
        assert_eq!(replica["model"], "smollm2-135m-instruct");
        assert_eq!(replica["device"], "cpu");
        assert_eq!(
            replica["discovery"][0],
            serde_json::json!({ "kind": "dns", "host": "r", "port": 8000 })
        );
    }
}

//! `sluice serve` options: every flag also an environment variable, parsed raw by clap and
//! then validated into [`ServeConfig`] with messages that name the flag.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

/// Raw `sluice serve` flags.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to bind.
    #[arg(long, env = "SLUICE_HOST", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0: any free port, printed at start).
    #[arg(long, env = "SLUICE_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Model to run in-process: a registry name or a .gguf path.
    #[arg(long, env = "SLUICE_MODEL", default_value = "smollm2-135m-instruct")]
    pub model: String,
    /// Where registry models are cached.
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    pub model_dir: PathBuf,
    /// The model id clients use (default: the registry name, else the file stem).
    #[arg(long, env = "SLUICE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Compute threads (0: one per core).
    #[arg(long, env = "SLUICE_THREADS", default_value_t = 0)]
    pub threads: usize,
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
    /// KV cache memory in MiB.
    #[arg(long, env = "SLUICE_KV_CACHE_MIB", default_value_t = 1024)]
    pub kv_cache_mib: usize,
    /// Turn automatic prefix caching off.
    #[arg(long, env = "SLUICE_NO_PREFIX_CACHING")]
    pub no_prefix_caching: bool,
    /// Requests generating at once before the admission queue holds new ones
    /// (default: twice max-num-seqs).
    #[arg(long, env = "SLUICE_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Requests the admission queue holds; beyond it, 429.
    #[arg(long, env = "SLUICE_MAX_QUEUE", default_value_t = 1024)]
    pub max_queue: usize,
    /// Longest wait in the admission queue before a 429 (e.g. 30s, 500ms).
    #[arg(long, env = "SLUICE_QUEUE_TIMEOUT", default_value = "30s")]
    pub queue_timeout: String,
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
}

/// Validated `serve` configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub addr: SocketAddr,
    pub model: String,
    pub model_dir: PathBuf,
    pub served_model_name: Option<String>,
    pub threads: usize,
    pub api_keys: Option<PathBuf>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: Option<usize>,
    pub kv_cache_bytes: usize,
    pub prefix_caching: bool,
    pub max_in_flight: usize,
    pub max_queue: usize,
    pub queue_timeout: Duration,
    pub drain_timeout: Duration,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub request_timeout: Option<Duration>,
    pub max_body_bytes: usize,
    pub log_prompts: bool,
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
        let max_in_flight = self.max_in_flight.unwrap_or(2 * self.max_num_seqs);
        positive("max-in-flight", max_in_flight)?;
        Ok(ServeConfig {
            addr: SocketAddr::new(ip, self.port),
            model: self.model.clone(),
            model_dir: self.model_dir.clone(),
            served_model_name: self.served_model_name.clone(),
            threads: self.threads,
            api_keys: self.api_keys.clone(),
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            kv_cache_bytes: self.kv_cache_mib << 20,
            prefix_caching: !self.no_prefix_caching,
            max_in_flight,
            max_queue: self.max_queue,
            queue_timeout: parse_duration("queue-timeout", &self.queue_timeout)?,
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
}

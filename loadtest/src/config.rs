//! The command line: raw clap arguments ([`Args`], every flag also a `SLUICE_LOADTEST_*`
//! variable) validated into a typed [`Config`] that the rest of the crate takes. Nothing else
//! reads flags or the environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hyper::header::{HeaderName, HeaderValue};
use serde::Serialize;

use crate::client::Endpoint;
use crate::dataset::{LenDist, Source};
use crate::error::{Error, Result};
use crate::metrics::Slo;
use crate::schedule::Arrival;

/// Arrival process names for `--arrival`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ArrivalKind {
    Poisson,
    Constant,
    Gamma,
}

/// Load-test any OpenAI-compatible endpoint (sluice, vLLM, llama.cpp, TGI) with vLLM bench's
/// metric definitions: TTFT, TPOT, ITL, E2E, throughput, goodput.
#[derive(Debug, Clone, Parser)]
#[command(name = "sluice-loadtest", version)]
pub struct Args {
    /// Server base URL (`http://host:port` or `https://...`; a trailing `/v1` is accepted).
    #[arg(
        long,
        env = "SLUICE_LOADTEST_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub url: String,
    /// Which API to drive.
    #[arg(
        long,
        env = "SLUICE_LOADTEST_ENDPOINT",
        value_enum,
        default_value = "chat"
    )]
    pub endpoint: Endpoint,
    /// Model id; default: the first id `/v1/models` lists.
    #[arg(long, env = "SLUICE_LOADTEST_MODEL")]
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "SLUICE_LOADTEST_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Extra header `K:V`; repeatable (env: comma-separated).
    #[arg(long = "header", env = "SLUICE_LOADTEST_HEADER", value_delimiter = ',')]
    pub headers: Vec<String>,
    /// Stream responses (SSE) — the default; needed for TTFT/ITL/TPOT.
    #[arg(long, env = "SLUICE_LOADTEST_STREAM", overrides_with = "no_stream")]
    pub stream: bool,
    /// Ask for whole responses: only E2E and throughput are measured.
    #[arg(long, env = "SLUICE_LOADTEST_NO_STREAM", overrides_with = "stream")]
    pub no_stream: bool,
    /// Send `ignore_eos: true` so every request generates exactly `max_tokens`.
    #[arg(long, env = "SLUICE_LOADTEST_IGNORE_EOS")]
    pub ignore_eos: bool,
    /// Per-request timeout, seconds.
    #[arg(long, env = "SLUICE_LOADTEST_TIMEOUT", default_value_t = 600.0)]
    pub timeout: f64,

    /// Closed loop: keep N requests in flight.
    #[arg(long, env = "SLUICE_LOADTEST_CONCURRENCY", conflicts_with = "rate")]
    pub concurrency: Option<usize>,
    /// Open loop: R requests/s on average (`inf` sends all at once).
    #[arg(long, env = "SLUICE_LOADTEST_RATE")]
    pub rate: Option<f64>,
    /// Inter-arrival distribution of the open loop.
    #[arg(
        long,
        env = "SLUICE_LOADTEST_ARRIVAL",
        value_enum,
        default_value = "poisson"
    )]
    pub arrival: ArrivalKind,
    /// Gamma shape K for `--arrival gamma` (1 = Poisson, < 1 burstier).
    #[arg(long, env = "SLUICE_LOADTEST_BURSTINESS", default_value_t = 1.0)]
    pub burstiness: f64,
    /// Cap on requests in flight in an open loop (waiting for a slot counts as latency).
    #[arg(long, env = "SLUICE_LOADTEST_MAX_CONCURRENCY")]
    pub max_concurrency: Option<usize>,
    /// Sweep: a synchronous run, a max-throughput run, then `--sweep-steps` rates between.
    #[arg(long, env = "SLUICE_LOADTEST_SWEEP", conflicts_with_all = ["rate", "concurrency", "trace"])]
    pub sweep: bool,
    /// Rates between the sweep's ends.
    #[arg(long, env = "SLUICE_LOADTEST_SWEEP_STEPS", default_value_t = 4)]
    pub sweep_steps: usize,

    /// Requests to measure (default 100 unless `--duration`).
    #[arg(long, env = "SLUICE_LOADTEST_REQUESTS")]
    pub requests: Option<usize>,
    /// Stop scheduling after S seconds (in-flight requests are waited for).
    #[arg(long, env = "SLUICE_LOADTEST_DURATION")]
    pub duration: Option<f64>,
    /// Requests sent first and excluded from the figures.
    #[arg(long, env = "SLUICE_LOADTEST_WARMUP", default_value_t = 0)]
    pub warmup: usize,
    /// Seed for prompts, lengths and arrivals.
    #[arg(long, env = "SLUICE_LOADTEST_SEED", default_value_t = 0)]
    pub seed: u64,

    /// `random` or `sharegpt:FILE`.
    #[arg(long, env = "SLUICE_LOADTEST_DATASET", default_value = "random")]
    pub dataset: String,
    /// Replay a trace: a request CSV (Azure LLM inference 2023/2024, BurstGPT) or Mooncake
    /// JSONL (detected by content).
    #[arg(long, env = "SLUICE_LOADTEST_TRACE", conflicts_with_all = ["rate", "concurrency"])]
    pub trace: Option<PathBuf>,
    /// Trace time divisor: 2 replays twice as fast.
    #[arg(long, env = "SLUICE_LOADTEST_TIME_SCALE", default_value_t = 1.0)]
    pub time_scale: f64,
    /// Trace token multiplier for prompt and output lengths (and Mooncake blocks).
    #[arg(long, env = "SLUICE_LOADTEST_TOKEN_SCALE", default_value_t = 1.0)]
    pub token_scale: f64,
    /// Random dataset prompt length, tokens.
    #[arg(long, env = "SLUICE_LOADTEST_INPUT_LEN", default_value_t = 256)]
    pub input_len: u32,
    /// Output length (`max_tokens`), tokens; for ShareGPT it overrides the reply's length.
    #[arg(long, env = "SLUICE_LOADTEST_OUTPUT_LEN")]
    pub output_len: Option<u32>,
    /// Random lengths as factors of the given ones: `fixed`, `uniform:LO,HI`, `normal:MEAN,SD`.
    #[arg(long, env = "SLUICE_LOADTEST_LEN_DIST", default_value = "fixed")]
    pub len_dist: String,
    /// Do not ask the server's `/tokenize`: count with `--tokenizer` if given, else assume ~4
    /// characters per token.
    #[arg(long, env = "SLUICE_LOADTEST_NO_TOKENIZE")]
    pub no_tokenize: bool,
    /// Local tokenizer for prompt lengths when the server has no `/tokenize` (or with
    /// `--no-tokenize`): a Hugging Face `tokenizer.json` or a `.gguf` model file.
    #[arg(long, env = "SLUICE_LOADTEST_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,

    /// Goodput objectives, e.g. `ttft=500,tpot=50,e2e=10000` (ms).
    #[arg(long, env = "SLUICE_LOADTEST_SLO")]
    pub slo: Option<String>,
    /// Exit with status 3 when failed/all exceeds this fraction.
    #[arg(long, env = "SLUICE_LOADTEST_MAX_ERROR_RATE")]
    pub max_error_rate: Option<f64>,
    /// Write the summary (vLLM key names) and configuration as JSON.
    #[arg(long, env = "SLUICE_LOADTEST_JSON")]
    pub json: Option<PathBuf>,
    /// Write one JSON line per request.
    #[arg(long, env = "SLUICE_LOADTEST_PER_REQUEST")]
    pub per_request: Option<PathBuf>,
    /// Write a plot, `.svg` or `.png`: latency CDFs, throughput and in-flight over time; for a
    /// sweep, latency against achieved rate.
    #[arg(long, env = "SLUICE_LOADTEST_PLOT")]
    pub plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, env = "SLUICE_LOADTEST_QUIET")]
    pub quiet: bool,
}

/// How the load is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mode {
    Closed {
        concurrency: usize,
    },
    Open {
        rate: f64,
        arrival: &'static str,
        burstiness: f64,
    },
    Burst,
    Trace {
        time_scale: f64,
    },
    Sweep {
        steps: usize,
    },
}

/// Validated configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub base_url: String,
    pub endpoint: Endpoint,
    pub model: Option<String>,
    #[serde(skip)]
    pub api_key: Option<String>,
    #[serde(skip)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub stream: bool,
    pub ignore_eos: bool,
    pub timeout_s: f64,
    pub mode: Mode,
    #[serde(skip)]
    pub arrival: Arrival,
    pub max_concurrency: Option<usize>,
    pub requests: Option<usize>,
    pub duration_s: Option<f64>,
    pub warmup: usize,
    pub seed: u64,
    #[serde(skip)]
    pub source: Source,
    pub dataset: String,
    pub token_scale: f64,
    pub input_len: u32,
    pub output_len: Option<u32>,
    #[serde(skip)]
    pub len_dist: LenDist,
    pub use_tokenize: bool,
    pub tokenizer: Option<PathBuf>,
    pub slo: Slo,
    pub max_error_rate: Option<f64>,
    pub json: Option<PathBuf>,
    pub per_request: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    pub quiet: bool,
}

/// Positive and finite (NaN is neither).
fn positive(x: f64) -> bool {
    x > 0.0 && x.is_finite()
}

fn invalid(flag: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArg {
        flag,
        reason: reason.into(),
    }
}

fn parse_headers(raw: &[String]) -> Result<Vec<(HeaderName, HeaderValue)>> {
    raw.iter()
        .map(|h| {
            let (k, v) = h
                .split_once(':')
                .ok_or_else(|| invalid("--header", format!("`{h}` is not K:V")))?;
            let k = HeaderName::try_from(k.trim())
                .map_err(|e| invalid("--header", format!("`{k}`: {e}")))?;
            let v = HeaderValue::try_from(v.trim())
                .map_err(|e| invalid("--header", format!("`{v}`: {e}")))?;
            Ok((k, v))
        })
        .collect()
}

/// The arrival process and its name for the JSON.
fn arrival_of(a: &Args) -> Result<(Arrival, &'static str)> {
    if !positive(a.burstiness) {
        return Err(invalid("--burstiness", "must be positive"));
    }
    Ok(match a.arrival {
        ArrivalKind::Poisson => (Arrival::Poisson, "poisson"),
        ArrivalKind::Constant => (Arrival::Constant, "constant"),
        ArrivalKind::Gamma => (
            Arrival::Gamma {
                shape: a.burstiness,
            },
            "gamma",
        ),
    })
}

fn mode_of(a: &Args, arrival_name: &'static str) -> Result<Mode> {
    if a.sweep {
        if a.sweep_steps == 0 {
            return Err(invalid("--sweep-steps", "must be at least 1"));
        }
        return Ok(Mode::Sweep {
            steps: a.sweep_steps,
        });
    }
    if a.trace.is_some() {
        if !positive(a.time_scale) {
            return Err(invalid("--time-scale", "must be positive"));
        }
        return Ok(Mode::Trace {
            time_scale: a.time_scale,
        });
    }
    match a.rate {
        Some(r) if r.is_infinite() && r > 0.0 => Ok(Mode::Burst),
        Some(r) if r > 0.0 => Ok(Mode::Open {
            rate: r,
            arrival: arrival_name,
            burstiness: a.burstiness,
        }),
        Some(_) => Err(invalid("--rate", "must be positive (or inf)")),
        None => match a.concurrency.unwrap_or(1) {
            0 => Err(invalid("--concurrency", "must be at least 1")),
            c => Ok(Mode::Closed { concurrency: c }),
        },
    }
}

/// `--requests`, defaulted to 100 where nothing else bounds the run, and checked against `mode`.
fn requests_of(a: &Args, mode: Mode) -> Result<Option<usize>> {
    let requests = match (a.requests, a.duration) {
        (None, None) if a.trace.is_none() => Some(100),
        (r, _) => r,
    };
    if requests == Some(0) {
        return Err(invalid("--requests", "must be at least 1"));
    }
    if matches!(mode, Mode::Sweep { .. }) && requests.is_none() {
        return Err(invalid(
            "--sweep",
            "needs --requests (each point sends that many)",
        ));
    }
    if matches!(mode, Mode::Burst) && requests.is_none() {
        return Err(invalid(
            "--rate inf",
            "needs --requests (everything is due at once; a duration bounds nothing)",
        ));
    }
    Ok(requests)
}

fn source_of(a: &Args) -> Result<Source> {
    if let Some(t) = &a.trace {
        Ok(Source::Trace(t.clone()))
    } else if a.dataset == "random" {
        Ok(Source::Random)
    } else if let Some(f) = a.dataset.strip_prefix("sharegpt:") {
        Ok(Source::ShareGpt(PathBuf::from(f)))
    } else {
        Err(invalid(
            "--dataset",
            format!("`{}`: want random or sharegpt:FILE", a.dataset),
        ))
    }
}

/// The checks of single values that no other setting depends on.
fn check_values(a: &Args) -> Result<()> {
    if !positive(a.timeout) {
        return Err(invalid("--timeout", "must be positive"));
    }
    if a.max_concurrency == Some(0) {
        return Err(invalid("--max-concurrency", "must be at least 1"));
    }
    if a.duration.is_some_and(|d| !positive(d)) {
        return Err(invalid("--duration", "must be positive"));
    }
    if !positive(a.token_scale) {
        return Err(invalid("--token-scale", "must be positive"));
    }
    if a.max_error_rate.is_some_and(|r| !(0.0..=1.0).contains(&r)) {
        return Err(invalid("--max-error-rate", "must be between 0 and 1"));
    }
    if a.plot
        .as_ref()
        .is_some_and(|p| crate::plot::Format::of(p).is_none())
    {
        return Err(invalid("--plot", "the file name must end in .svg or .png"));
    }
    if a.input_len == 0 || a.output_len == Some(0) {
        return Err(invalid("--input-len/--output-len", "must be at least 1"));
    }
    Ok(())
}

impl Config {
    /// Checks and types the raw arguments.
    pub fn from_args(a: Args) -> Result<Self> {
        let base_url = crate::client::normalize_base(&a.url)?;
        let headers = parse_headers(&a.headers)?;
        let (arrival, arrival_name) = arrival_of(&a)?;
        let mode = mode_of(&a, arrival_name)?;
        let requests = requests_of(&a, mode)?;
        let source = source_of(&a)?;
        let slo = match &a.slo {
            Some(s) => s.parse()?,
            None => Slo::default(),
        };
        check_values(&a)?;
        Ok(Self {
            base_url,
            endpoint: a.endpoint,
            model: a.model,
            api_key: a.api_key,
            headers,
            stream: !a.no_stream,
            ignore_eos: a.ignore_eos,
            timeout_s: a.timeout,
            mode,
            arrival,
            max_concurrency: a.max_concurrency,
            requests,
            duration_s: a.duration,
            warmup: a.warmup,
            seed: a.seed,
            source,
            dataset: a
                .trace
                .as_ref()
                .map_or(a.dataset.clone(), |t| format!("trace:{}", t.display())),
            token_scale: a.token_scale,
            input_len: a.input_len,
            output_len: a.output_len,
            len_dist: a.len_dist.parse()?,
            use_tokenize: !a.no_tokenize,
            tokenizer: a.tokenizer,
            slo,
            max_error_rate: a.max_error_rate,
            json: a.json,
            per_request: a.per_request,
            plot: a.plot,
            quiet: a.quiet,
        })
    }

    /// The run bounds.
    pub fn duration(&self) -> Option<Duration> {
        self.duration_s.map(Duration::from_secs_f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config> {
        let mut v = vec!["sluice-loadtest"];
        v.extend_from_slice(args);
        Config::from_args(Args::try_parse_from(v).expect("clap accepts"))
    }

    #[test]
    fn defaults_are_a_closed_loop_of_one_streaming() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.mode, Mode::Closed { concurrency: 1 });
        assert!(c.stream);
        assert_eq!(c.requests, Some(100));
    }

    #[test]
    fn rates_and_arrivals() {
        let c = parse(&["--rate", "5", "--arrival", "gamma", "--burstiness", "0.5"]).unwrap();
        assert_eq!(c.arrival, Arrival::Gamma { shape: 0.5 });
        assert!(matches!(c.mode, Mode::Open { rate, .. } if rate == 5.0));
        assert_eq!(parse(&["--rate", "inf"]).unwrap().mode, Mode::Burst);
        assert!(parse(&["--rate", "0"]).is_err());
        assert!(!parse(&["--no-stream"]).unwrap().stream);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let e = parse(&["--header", "nocolon"]).unwrap_err().to_string();
        assert!(e.contains("--header"), "{e}");
        let e = parse(&["--dataset", "bogus"]).unwrap_err().to_string();
        assert!(e.contains("--dataset"), "{e}");
        assert!(parse(&["--url", "ftp://x"]).is_err());
        assert!(parse(&["--url", "https://x"]).is_ok());
        assert!(parse(&["--plot", "x.png"]).is_ok());
        assert!(parse(&["--plot", "x.pdf"]).is_err());
        let e = parse(&["--rate", "inf", "--duration", "5"]).unwrap_err();
        assert!(e.to_string().contains("--requests"), "{e}");
        assert!(parse(&["--slo", "ttft=1,bogus=2"]).is_err());
    }
}

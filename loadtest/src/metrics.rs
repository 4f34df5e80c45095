//! The figures, with vLLM bench's definitions so numbers compare:
//!
//! - **TTFT**: scheduled send → first chunk with content.
//! - **TPOT** per request: `(e2e − TTFT) / (output tokens − 1)`, for requests with > 1 token.
//! - **ITL**: gaps between content chunks. A gap before a chunk that carried `k` tokens counts as
//!   `k` samples of `gap / k`, so a server that batches tokens into chunks is not credited with
//!   fewer, longer gaps (vLLM's complaint). Tokens per chunk come from per-chunk usage when the
//!   server sends it, else are spread evenly from the final usage, else 1 each.
//! - **E2E**: scheduled send → end of the response.
//!
//! Everything is measured from the *scheduled* time, so time a request spent waiting for a
//! concurrency slot or for a late client counts against the server, not hidden. That holds for a
//! request retried after a stale keep-alive connection too: its figures include the lost
//! attempt (a fraction of a millisecond) and the new connection's handshake.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::client::Observed;

/// Where a request's output token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's usage object.
    Usage,
    /// Counted content chunks (one token each).
    Chunks,
    /// Non-streamed text without usage: ~4 characters per token.
    Approx,
}

/// One request's figures, as written to `--per-request`.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub id: usize,
    /// Scheduled send, seconds from the run's start.
    pub scheduled_s: f64,
    /// How late the request actually left (waiting for a concurrency slot), ms.
    pub send_delay_ms: f64,
    pub ok: bool,
    /// Sent a second time, on a new connection, after the first attempt met a keep-alive
    /// connection the server had closed (see [`sluice_conn`]).
    pub retried: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// The server's name for the error (OpenAI `error.type`/`code`), if it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub max_tokens: u32,
    pub token_source: TokenSource,
    /// Whether tokens per chunk were known exactly (per-chunk usage).
    pub itl_exact: bool,
    /// ITL samples (per token, see the module doc), ms.
    pub itl_ms: Vec<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// ITL samples from chunk arrival times and what is known of their token counts.
pub fn itl_samples(
    chunks: &[Duration],
    chunk_tokens: &[Option<u32>],
    total: Option<u64>,
) -> (Vec<f64>, bool) {
    if chunks.len() < 2 {
        return (Vec::new(), chunk_tokens.iter().all(Option::is_some));
    }
    let exact = chunk_tokens.iter().all(Option::is_some);
    let gaps = chunks.len() - 1;
    let per_gap: Vec<u64> = if exact {
        chunk_tokens[1..]
            .iter()
            .map(|k| u64::from(k.unwrap_or(1).max(1)))
            .collect()
    } else {
        spread(chunks, total.map_or(gaps as u64, |t| t.saturating_sub(1)))
    };
    let mut out = Vec::with_capacity(per_gap.iter().sum::<u64>() as usize);
    for (w, &k) in chunks.windows(2).zip(&per_gap) {
        let gap = ms(w[1] - w[0]);
        out.extend(std::iter::repeat_n(gap / k as f64, k as usize));
    }
    (out, exact)
}

/// Without per-chunk counts: the `tokens` after the first chunk spread over the gaps in whole
/// tokens, at least one per chunk, so each gap's samples still sum to the gap. Where they do not
/// divide evenly the longest gaps get the extra token (a chunk that carried more tokens took
/// longer to make).
fn spread(chunks: &[Duration], tokens: u64) -> Vec<u64> {
    let gaps = chunks.len() - 1;
    let tokens = tokens.max(gaps as u64);
    let mut per_gap = vec![tokens / gaps as u64; gaps];
    let extra = (tokens % gaps as u64) as usize;
    let mut order: Vec<usize> = (0..gaps).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(chunks[i + 1] - chunks[i]));
    for &i in &order[..extra] {
        per_gap[i] += 1;
    }
    per_gap
}

/// Turns one request's observations into its figures.
pub fn record(
    id: usize,
    scheduled: Duration,
    obs: &Observed,
    intended_input: u32,
    max_tokens: u32,
) -> Record {
    let e2e = ms(obs.end);
    let usage = obs.usage.unwrap_or_default();
    let (output_tokens, token_source) = match usage.completion_tokens {
        Some(n) => (n, TokenSource::Usage),
        None if !obs.chunks.is_empty() => (obs.chunks.len() as u64, TokenSource::Chunks),
        None => ((obs.text_chars as u64).div_ceil(4), TokenSource::Approx),
    };
    let ttft = obs.chunks.first().map(|&d| ms(d));
    let tpot = match ttft {
        Some(t) if output_tokens > 1 => Some((e2e - t) / (output_tokens - 1) as f64),
        _ => None,
    };
    let (itl_ms, itl_exact) = itl_samples(&obs.chunks, &obs.chunk_tokens, usage.completion_tokens);
    Record {
        id,
        scheduled_s: scheduled.as_secs_f64(),
        send_delay_ms: ms(obs.sent),
        ok: obs.failure.is_none(),
        retried: obs.retried,
        error: obs.failure.as_ref().map(|f| f.label()),
        error_message: obs.failure.as_ref().map(|f| f.message()),
        error_type: obs
            .failure
            .as_ref()
            .and_then(|f| f.kind().map(str::to_owned)),
        ttft_ms: ttft,
        tpot_ms: tpot,
        e2el_ms: e2e,
        input_tokens: usage.prompt_tokens.unwrap_or(intended_input as u64),
        output_tokens,
        max_tokens,
        token_source,
        itl_exact,
        itl_ms,
    }
}

/// Mean, standard deviation and percentiles of one figure, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Stats {
    pub count: u64,
    pub mean: f64,
    pub std: f64,
    pub median: f64,
    pub p90: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    /// Mean and std exactly (they need no histogram); percentiles from an HdrHistogram at
    /// microsecond resolution, 3 significant digits, 1 µs to 1 hour (longer values saturate).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
            .expect("bounds and 3 significant digits are valid");
        let (mut n, mut mean, mut m2, mut max) = (0u64, 0.0f64, 0.0f64, 0.0f64);
        for v in values {
            n += 1;
            let d = v - mean;
            mean += d / n as f64;
            m2 += d * (v - mean);
            max = max.max(v);
            h.saturating_record((v * 1e3).round().max(0.0) as u64);
        }
        if n == 0 {
            return Self::default();
        }
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
        Self {
            count: n,
            mean,
            std: if n > 1 { (m2 / n as f64).sqrt() } else { 0.0 },
            median: q(0.5),
            p90: q(0.9),
            p95: q(0.95),
            p99: q(0.99),
            max,
        }
    }
}

/// Service-level objectives: a request is *good* when it meets every one given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl std::str::FromStr for Slo {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        let bad = |reason: String| crate::Error::InvalidArg {
            flag: "--slo",
            reason,
        };
        let mut slo = Slo::default();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not KEY=MS")))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| bad(format!("`{v}` is not a number of ms")))?;
            match k.trim() {
                "ttft" => slo.ttft_ms = Some(v),
                "tpot" => slo.tpot_ms = Some(v),
                "e2e" | "e2el" => slo.e2e_ms = Some(v),
                other => return Err(bad(format!("unknown SLO `{other}` (ttft, tpot, e2e)"))),
            }
        }
        Ok(slo)
    }
}

impl Slo {
    fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2e_ms.is_some()
    }

    /// Whether `r` meets every objective. A request with one token has no TPOT and meets a TPOT
    /// objective (as in vLLM, where its TPOT is 0).
    pub fn met(&self, r: &Record) -> bool {
        let within = |v: Option<f64>, limit: Option<f64>, missing_ok: bool| match (v, limit) {
            (_, None) => true,
            (None, Some(_)) => missing_ok,
            (Some(v), Some(l)) => v <= l,
        };
        // No TTFT means no content arrived: that fails a TTFT objective.
        r.ok && within(r.ttft_ms, self.ttft_ms, false)
            && within(r.tpot_ms, self.tpot_ms, true)
            && within(Some(r.e2el_ms), self.e2e_ms, true)
    }
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub completed: u64,
    pub failed: u64,
    pub duration: f64,
    pub total_input_tokens: u64,
    pub total_output_tokens: u64,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub request_goodput: Option<f64>,
    pub ttft: Stats,
    pub tpot: Stats,
    pub itl: Stats,
    pub e2el: Stats,
    /// Failures by class (`http_429`, `timeout`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Failures by class and the server's error type, where it named one (`http_429 rate_limit`).
    pub error_types: BTreeMap<String, u64>,
    /// How output tokens were counted, requests per source.
    pub token_sources: BTreeMap<String, u64>,
    /// Requests whose ITL used exact per-chunk token counts.
    pub itl_exact_requests: u64,
    pub max_in_flight: u64,
    /// Requests sent again on a new connection after a stale keep-alive one; not failures.
    pub retried_stale: u64,
}

impl Summary {
    /// Aggregates `records` of a run that took `duration` (first scheduled send to last end).
    pub fn of(records: &[Record], duration: Duration, slo: &Slo) -> Self {
        let secs = duration.as_secs_f64().max(1e-9);
        let ok: Vec<&Record> = records.iter().filter(|r| r.ok).collect();
        let mut errors = BTreeMap::new();
        let mut error_types = BTreeMap::new();
        for r in records.iter().filter(|r| !r.ok) {
            let label = r.error.clone().unwrap_or_default();
            if let Some(t) = &r.error_type {
                *error_types.entry(format!("{label} {t}")).or_insert(0) += 1;
            }
            *errors.entry(label).or_insert(0) += 1;
        }
        let mut token_sources = BTreeMap::new();
        for r in &ok {
            let key = serde_json::to_value(r.token_source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            *token_sources.entry(key).or_insert(0) += 1;
        }
        let tin: u64 = ok.iter().map(|r| r.input_tokens).sum();
        let tout: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let good = ok.iter().filter(|r| slo.met(r)).count() as f64;
        Self {
            completed: ok.len() as u64,
            failed: (records.len() - ok.len()) as u64,
            duration: secs,
            total_input_tokens: tin,
            total_output_tokens: tout,
            request_throughput: ok.len() as f64 / secs,
            output_throughput: tout as f64 / secs,
            total_token_throughput: (tin + tout) as f64 / secs,
            request_goodput: slo.is_set().then_some(good / secs),
            ttft: Stats::of(ok.iter().filter_map(|r| r.ttft_ms)),
            tpot: Stats::of(ok.iter().filter_map(|r| r.tpot_ms)),
            itl: Stats::of(ok.iter().flat_map(|r| r.itl_ms.iter().copied())),
            e2el: Stats::of(ok.iter().map(|r| r.e2el_ms)),
            errors,
            error_types,
            token_sources,
            itl_exact_requests: ok
                .iter()
                .filter(|r| r.itl_exact && !r.itl_ms.is_empty())
                .count() as u64,
            max_in_flight: crate::timeline::in_flight_steps(records)
                .iter()
                .map(|s| s.1)
                .max()
                .unwrap_or(0),
            retried_stale: records.iter().filter(|r| r.retried).count() as u64,
        }
    }

    /// Failed / all.
    pub fn error_rate(&self) -> f64 {
        let all = self.completed + self.failed;
        if all == 0 {
            0.0
        } else {
            self.failed as f64 / all as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn itl_divides_multi_token_chunks() {
        let t = |v: u64| Duration::from_millis(v);
        // Chunks at 50, 60, 80 ms; the third carried two tokens.
        let (itl, exact) = itl_samples(&[t(50), t(60), t(80)], &[Some(1), Some(1), Some(2)], None);
        assert!(exact);
        assert_eq!(itl, vec![10.0, 10.0, 10.0]);
        // Without per-chunk counts, 5 tokens over 3 chunks: 2 tokens per later chunk.
        let (itl, exact) = itl_samples(&[t(50), t(70), t(90)], &[None, None, None], Some(5));
        assert!(!exact);
        assert_eq!(itl, vec![10.0; 4]);
        // 4 tokens over gaps of 30 and 10 ms: the longer gap gets the extra token, and each
        // gap's samples sum to the gap.
        let (itl, _) = itl_samples(&[t(0), t(30), t(40)], &[None, None, None], Some(4));
        assert_eq!(itl, vec![15.0, 15.0, 10.0]);
        // Usage saying fewer tokens than chunks: one per chunk.
        let (itl, _) = itl_samples(&[t(0), t(30), t(40)], &[None, None, None], Some(1));
        assert_eq!(itl, vec![30.0, 10.0]);
    }

    #[test]
    fn stats_match_known_values() {
        let s = Stats::of((1..=100).map(f64::from));
        assert_eq!(s.count, 100);
        assert!((s.mean - 50.5).abs() < 1e-9);
        assert!((s.std - 28.866).abs() < 1e-3);
        assert!((s.median - 50.0).abs() < 0.1, "{}", s.median);
        assert!((s.p99 - 99.0).abs() < 0.1, "{}", s.p99);
    }

    #[test]
    fn slo_parses_and_judges() {
        let slo: Slo = "ttft=100,tpot=20".parse().unwrap();
        assert_eq!(slo.ttft_ms, Some(100.0));
        assert!("ttft=x".parse::<Slo>().is_err());
        let obs = Observed {
            chunks: vec![Duration::from_millis(90), Duration::from_millis(100)],
            chunk_tokens: vec![None, None],
            end: Duration::from_millis(130),
            ..Observed::default()
        };
        let r = record(0, Duration::ZERO, &obs, 10, 2);
        assert_eq!(r.token_source, TokenSource::Chunks);
        assert_eq!(r.tpot_ms, Some(40.0));
        assert!(!slo.met(&r));
        assert!("ttft=100,tpot=50".parse::<Slo>().unwrap().met(&r));
    }
}

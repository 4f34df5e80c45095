//! A [`SignalSource`] that reads each replica pod's `/metrics` (vLLM names) directly.
//!
//! Interim: local mode's `crate::scrape` (a separate branch) owns scraping and windowed rates
//! for both modes; once merged, this module should become a thin adapter over it. Until then it
//! reads the gauges (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:kv_cache_usage_perc`) and turns three counters (`vllm:request_success_total`,
//! `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`) summed over the pool into rates
//! over a long and a short window of its own samples. Latency percentiles are left unknown
//! (`None`): the policy then sizes from demand alone. A pool whose pods all fail to answer,
//! or that has no ready endpoint, has no fresh figures (`None`): the controller holds it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{join_all, BoxFuture};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use super::error::Result;
use super::source::{Load, ScrapeTarget, SignalSource, VariantLoad};

/// One pod's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodFigures {
    pub waiting: f64,
    pub running: f64,
    pub kv: f64,
    pub requests: f64,
    pub prompt_tokens: f64,
    pub generation_tokens: f64,
}

/// Parses the Prometheus text format for the figures above (labels ignored, series summed).
pub fn parse(text: &str) -> PodFigures {
    let mut f = PodFigures::default();
    let mut kv_n = 0.0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let rest = match line[name_end..].rfind('}') {
            Some(i) => &line[name_end + i + 1..],
            None => &line[name_end..],
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        match name {
            "vllm:num_requests_waiting" => f.waiting += value,
            "vllm:num_requests_running" => f.running += value,
            "vllm:kv_cache_usage_perc" => {
                f.kv += value;
                kv_n += 1.0;
            }
            "vllm:request_success_total" => f.requests += value,
            "vllm:prompt_tokens_total" => f.prompt_tokens += value,
            "vllm:generation_tokens_total" => f.generation_tokens += value,
            _ => {}
        }
    }
    if kv_n > 0.0 {
        f.kv /= kv_n;
    }
    f
}

/// The scraper, with each pool's recent counter totals.
#[derive(Debug)]
pub struct PodScraper {
    client: Client<HttpConnector, Empty<Bytes>>,
    window_s: f64,
    short_window_s: f64,
    timeout: Duration,
    history: Mutex<HashMap<String, VecDeque<(f64, PodFigures)>>>,
}

impl Default for PodScraper {
    fn default() -> Self {
        PodScraper::new()
    }
}

impl PodScraper {
    pub fn new() -> Self {
        PodScraper {
            client: Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(),
            window_s: 60.0,
            short_window_s: 10.0,
            timeout: Duration::from_secs(5),
            history: Mutex::new(HashMap::new()),
        }
    }

    async fn fetch(&self, url: &str) -> Option<PodFigures> {
        let uri: hyper::Uri = url.parse().ok()?;
        let req = hyper::Request::get(uri).body(Empty::new()).ok()?;
        let resp = tokio::time::timeout(self.timeout, self.client.request(req))
            .await
            .ok()?
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = tokio::time::timeout(self.timeout, resp.into_body().collect())
            .await
            .ok()?
            .ok()?
            .to_bytes();
        Some(parse(&String::from_utf8_lossy(&body)))
    }

    async fn load(&self, pool: &str, targets: &[ScrapeTarget], now_s: f64) -> Option<Load> {
        if targets.is_empty() {
            return None;
        }
        let got = join_all(targets.iter().map(|t| self.fetch(&t.url))).await;
        let mut total = PodFigures::default();
        let mut per: HashMap<String, (f64, VariantLoad)> = HashMap::new();
        let mut answered = 0;
        for (t, f) in targets.iter().zip(got) {
            let Some(f) = f else { continue };
            answered += 1;
            total.waiting += f.waiting;
            total.running += f.running;
            total.requests += f.requests;
            total.prompt_tokens += f.prompt_tokens;
            total.generation_tokens += f.generation_tokens;
            let (n, v) = per.entry(t.variant.clone()).or_default();
            *n += 1.0;
            v.running_per_replica += f.running;
            v.waiting_per_replica += f.waiting;
            v.kv_cache_usage += f.kv;
        }
        if answered == 0 {
            return None;
        }
        let mut history = self.history.lock().ok()?;
        let h = history.entry(pool.to_string()).or_default();
        h.push_back((now_s, total));
        while h.front().is_some_and(|&(t, _)| t < now_s - self.window_s) {
            h.pop_front();
        }
        let rate = |window: f64, f: fn(&PodFigures) -> f64| -> (f64, f64) {
            let first = h.iter().find(|&&(t, _)| t >= now_s - window);
            match first {
                Some(&(t0, ref a)) if now_s > t0 => {
                    ((f(&total) - f(a)).max(0.0) / (now_s - t0), now_s - t0)
                }
                _ => (0.0, 0.0),
            }
        };
        let (requests_per_s, span) = rate(self.window_s, |f| f.requests);
        let mut load = Load::default();
        load.arrivals.window_s = span;
        load.arrivals.requests_per_s = requests_per_s;
        load.arrivals.prompt_tokens_per_s = rate(self.window_s, |f| f.prompt_tokens).0;
        load.arrivals.output_tokens_per_s = rate(self.window_s, |f| f.generation_tokens).0;
        let (short, short_span) = rate(self.short_window_s, |f| f.requests);
        load.arrivals.short_requests_per_s = short;
        load.arrivals.short_window_s = short_span;
        load.queue.waiting = total.waiting.round() as u64;
        load.queue.running = total.running.round() as u64;
        load.variants = per
            .into_iter()
            .map(|(k, (n, mut v))| {
                v.running_per_replica /= n;
                v.waiting_per_replica /= n;
                v.kv_cache_usage /= n;
                (k, v)
            })
            .collect();
        Some(load)
    }
}

impl SignalSource for PodScraper {
    fn read<'a>(
        &'a self,
        pool: &'a str,
        targets: &'a [ScrapeTarget],
        now_s: f64,
    ) -> BoxFuture<'a, Result<Option<Load>>> {
        Box::pin(async move { Ok(self.load(pool, targets, now_s).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_gauges_and_counters_across_series() {
        let text = "# HELP vllm:num_requests_waiting x\n\
            vllm:num_requests_waiting{model_name=\"m\"} 3\n\
            vllm:num_requests_running{model_name=\"m\"} 5.0\n\
            vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n\
            vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\"} 10\n\
            vllm:request_success_total{finished_reason=\"length\",model_name=\"m\"} 2\n\
            vllm:prompt_tokens_total{model_name=\"m\"} 1200\n\
            vllm:generation_tokens_total{model_name=\"m\"} 240 1700000000000\n\
            other_metric 7\nbroken line\n";
        let f = parse(text);
        assert_eq!(
            f,
            PodFigures {
                waiting: 3.0,
                running: 5.0,
                kv: 0.5,
                requests: 12.0,
                prompt_tokens: 1200.0,
                generation_tokens: 240.0
            }
        );
    }
}

//! A [`SignalSource`] over a Prometheus HTTP API (`spec.signals.prometheusUrl`): for clusters
//! that already scrape the replicas (GKE Managed Prometheus through its query frontend, the
//! Prometheus Operator, Thanos or Mimir), so the controller adds no scrapes of its own and
//! reads windows that outlive its restarts.
//!
//! Each reconcile sends one instant query per figure, all at one evaluation time, each
//! selecting the pool's series by `namespace` and `model_name` and grouping by `pod` (the
//! label names are flags: GMP and the Operator write `namespace` and `pod`). Results are
//! attributed to variants client-side:
//! - gauges (running, waiting, KV use) and freshness count only the pool's ready pods;
//! - window figures (arrivals, tokens, latency histograms) also count pods that have left,
//!   recognised by their Deployment's name prefix (`<deployment>-`), so what a replica served
//!   before a scale-down still counts until it leaves the window, as the scraper does.
//!
//! The figures mean what [`crate::scrape`]'s do, computed by PromQL instead of by hand:
//! arrivals are requests finished in the window (`increase` of
//! `vllm:e2e_request_latency_seconds_count`) plus the change of requests in the replicas
//! (`delta` of running and waiting); latency quantiles come from the summed bucket increases
//! (`sum by (pod, le) (increase(…_bucket[w]))`) through the same [`Histogram`] code, at the
//! percentiles the pool's SLO names. A gateway's prompt bursts and front door
//! (`sluice_gateway_model_*`, [`crate::scrape::front_door`]) are summed over every series with
//! the model's `model` label, in any namespace: a gateway may route for several.
//!
//! Stale is what cannot be trusted: Prometheus unreachable or answering an error, or a ready
//! pod whose newest `vllm:num_requests_running` sample is older than the maximum age (a pod
//! not yet scraped, or one Prometheus no longer reaches). The controller then holds.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::future::{join_all, BoxFuture};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde::Deserialize;
use sluice_metrics::exposition::parse_value;
use sluice_metrics::{gateway, vllm};

use sluice_policy::signals::{Arrivals, Latency, Queue, SecondSums, WindowShape};

use super::error::{Error, Result};
use super::source::{Load, Query, Reading, ReplicaPod, SignalSource, VariantLoad};
use crate::crd::PolicySpec;
use crate::scrape::front_door::{FrontDoor, FrontDoorWindows};
use crate::scrape::{error_chain, Histogram, SummedHistogram};

/// Largest query answer read.
const MAX_BODY: usize = 16 << 20;

/// How the source reaches Prometheus and judges freshness.
#[derive(Debug, Clone, PartialEq)]
pub struct PrometheusConfig {
    /// Deadline of each query (connect, answer, body).
    pub timeout: Duration,
    /// A ready pod whose newest sample is older than this makes the reading stale. Above the
    /// scrape interval (GMP's default is 60 s; the manifests here scrape every 15 s).
    pub max_age: Duration,
    /// The label carrying the pod name, and the one carrying its namespace.
    pub pod_label: String,
    pub namespace_label: String,
    /// Sent as `Authorization: Bearer …`, read afresh for each reconcile (tokens rotate).
    pub bearer_token_file: Option<PathBuf>,
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        PrometheusConfig {
            timeout: Duration::from_secs(5),
            max_age: Duration::from_secs(90),
            pod_label: "pod".into(),
            namespace_label: "namespace".into(),
            bearer_token_file: None,
        }
    }
}

/// Why one query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("request failed: {0}")]
    Request(String),
    #[error("HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("{error_type}: {error}")]
    Api { error_type: String, error: String },
    #[error("not a Prometheus API answer: {0}")]
    Malformed(String),
}

/// One sample of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

#[derive(Deserialize)]
struct ApiAnswer {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorEntry {
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// Parses an `/api/v1/query` answer holding an instant vector.
pub fn parse_answer(status: u16, body: &[u8]) -> Result<Vec<Sample>, QueryError> {
    let answer: ApiAnswer = match serde_json::from_slice(body) {
        Ok(a) => a,
        Err(e) if status != 200 => {
            return Err(QueryError::Status {
                status,
                message: format!(
                    "{} ({e})",
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                ),
            })
        }
        Err(e) => return Err(QueryError::Malformed(e.to_string())),
    };
    if answer.status != "success" {
        return Err(QueryError::Api {
            error_type: answer.error_type.unwrap_or_else(|| "error".into()),
            error: answer.error.unwrap_or_default(),
        });
    }
    let data = answer
        .data
        .ok_or_else(|| QueryError::Malformed("success without data".into()))?;
    if data.result_type != "vector" {
        return Err(QueryError::Malformed(format!(
            "resultType {}, not vector",
            data.result_type
        )));
    }
    let entries: Vec<VectorEntry> =
        serde_json::from_value(data.result).map_err(|e| QueryError::Malformed(e.to_string()))?;
    entries
        .into_iter()
        .map(|e| {
            let value = parse_value(&e.value.1)
                .ok_or_else(|| QueryError::Malformed(format!("sample value {:?}", e.value.1)))?;
            Ok(Sample {
                labels: e.metric,
                value,
            })
        })
        .collect()
}

/// A PromQL string literal.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A PromQL range in whole milliseconds (`[60000ms]`).
fn range(seconds: f64) -> String {
    format!("[{}ms]", (seconds * 1000.0).round().max(1.0) as u64)
}

/// The queries one reading sends, built for a pool's selector and windows.
#[derive(Debug, Clone, PartialEq)]
pub struct Queries {
    pub last_sample: String,
    pub running: String,
    pub waiting: String,
    pub kv_usage: String,
    /// Arrivals and the request shape over the long window; arrivals over the short one.
    pub long: ShapeQueries,
    pub arrivals_short: ArrivalQueries,
    pub ttft: String,
    pub tpot: Vec<String>,
    /// The request shape over the wider window.
    pub wide: ShapeQueries,
    /// The gateways' prompt tokens per second over the wider window: the histogram's
    /// buckets and sum (`sluice_gateway_prompt_tokens_per_second`, by the gateway's `model`
    /// label; any namespace, as a gateway may route for several).
    pub bursts: String,
    pub bursts_sum: String,
    /// The gateways' front door for the model (by their `model` label, any namespace).
    pub front_door: FrontDoorQueries,
}

/// A gateway's front door over the windows: arrivals over the long and short ones, unserved
/// requests and the client-side TTFT histogram over the latency (long) one, and the prompts
/// refused as too long (buckets and sum) over the long and wider ones.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontDoorQueries {
    pub arrivals: String,
    pub arrivals_short: String,
    pub unserved: String,
    pub ttft: String,
    pub refused: (String, String),
    pub refused_wide: (String, String),
}

impl FrontDoorQueries {
    fn all(&self) -> [&str; 8] {
        [
            &self.arrivals,
            &self.arrivals_short,
            &self.unserved,
            &self.ttft,
            &self.refused.0,
            &self.refused.1,
            &self.refused_wide.0,
            &self.refused_wide.1,
        ]
    }
}

/// The request shape over one window: arrivals, their prompt and output tokens, and the
/// prompt- and output-length histograms.
#[derive(Debug, Clone, PartialEq)]
pub struct ShapeQueries {
    pub arrivals: ArrivalQueries,
    pub prompt_tokens: String,
    pub generation_tokens: String,
    pub prompt_len: String,
    pub output_len: String,
}

impl ShapeQueries {
    fn all(&self) -> Vec<&str> {
        let mut v = vec![
            self.prompt_tokens.as_str(),
            &self.generation_tokens,
            &self.prompt_len,
            &self.output_len,
        ];
        v.extend(self.arrivals.all());
        v
    }
}

/// What arrivals over one window are made of: requests finished in it, and the change in
/// requests running and waiting on the replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrivalQueries {
    pub finished: String,
    pub running_delta: String,
    pub waiting_delta: String,
}

impl ArrivalQueries {
    fn all(&self) -> [&str; 3] {
        [&self.finished, &self.running_delta, &self.waiting_delta]
    }
}

impl Queries {
    /// `matchers` are the label matchers inside braces (`namespace="ns",model_name="m"`),
    /// `model` the model's name as the gateway labels it; `window_s` the long window (also
    /// the latency window), `short_s` the short one, `shape_s` the request shape's wider one.
    pub fn new(
        pod: &str,
        (matchers, model): (&str, &str),
        window_s: f64,
        short_s: f64,
        shape_s: f64,
    ) -> Queries {
        let w = range(window_s);
        let s = range(short_s);
        let wide = range(shape_s);
        let by = |agg: &str, inner: String| format!("{agg} by ({pod}) ({inner})");
        let sel = |name: &str| format!("{name}{{{matchers}}}");
        let hist = |name: &str, r: &str| {
            format!("sum by ({pod}, le) (increase({name}_bucket{{{matchers}}}{r}))")
        };
        let arrivals = |r: &str| ArrivalQueries {
            finished: by(
                "sum",
                format!(
                    "increase({}{r})",
                    sel(vllm::E2E_REQUEST_LATENCY_SECONDS_COUNT)
                ),
            ),
            running_delta: by(
                "sum",
                format!("delta({}{r})", sel(vllm::NUM_REQUESTS_RUNNING)),
            ),
            waiting_delta: by(
                "sum",
                format!("delta({}{r})", sel(vllm::NUM_REQUESTS_WAITING)),
            ),
        };
        let tokens = |name: &str, r: &str| by("sum", format!("increase({}{r})", sel(name)));
        let of_model = format!("{{{}={}}}", gateway::MODEL, quote(model));
        // A gateway series of the model (any namespace), summed; a histogram's buckets by `le`.
        let door = |name: &str, r: &str| format!("sum(increase({name}{of_model}{r}))");
        let door_buckets =
            |name: &str, r: &str| format!("sum by (le) (increase({name}_bucket{of_model}{r}))");
        let door_hist =
            |name: &str, r: &str| (door_buckets(name, r), door(&format!("{name}_sum"), r));
        let shape = |r: &str| ShapeQueries {
            arrivals: arrivals(r),
            prompt_tokens: tokens(vllm::PROMPT_TOKENS_TOTAL, r),
            generation_tokens: tokens(vllm::GENERATION_TOKENS_TOTAL, r),
            prompt_len: hist(vllm::REQUEST_PROMPT_TOKENS, r),
            output_len: hist(vllm::REQUEST_GENERATION_TOKENS, r),
        };
        Queries {
            last_sample: by(
                "max",
                format!("timestamp({})", sel(vllm::NUM_REQUESTS_RUNNING)),
            ),
            running: by("sum", sel(vllm::NUM_REQUESTS_RUNNING)),
            waiting: by("sum", sel(vllm::NUM_REQUESTS_WAITING)),
            kv_usage: by(
                "max",
                format!(
                    "{{__name__=~\"{}|{}\",{matchers}}}",
                    vllm::KV_CACHE_USAGE_PERC,
                    vllm::GPU_CACHE_USAGE_PERC
                ),
            ),
            long: shape(&w),
            arrivals_short: arrivals(&s),
            ttft: hist(vllm::TIME_TO_FIRST_TOKEN_SECONDS, &w),
            tpot: vllm::TPOT_HISTOGRAMS.iter().map(|n| hist(n, &w)).collect(),
            wide: shape(&wide),
            bursts: door_buckets(gateway::PROMPT_TOKENS_PER_SECOND, &wide),
            bursts_sum: door(&format!("{}_sum", gateway::PROMPT_TOKENS_PER_SECOND), &wide),
            front_door: FrontDoorQueries {
                arrivals: door(gateway::ARRIVALS_TOTAL, &w),
                arrivals_short: door(gateway::ARRIVALS_TOTAL, &s),
                unserved: door(gateway::UNSERVED_TOTAL, &w),
                ttft: door_buckets(gateway::TIME_TO_FIRST_TOKEN_SECONDS, &w),
                refused: door_hist(gateway::REFUSED_PROMPT_TOKENS, &w),
                refused_wide: door_hist(gateway::REFUSED_PROMPT_TOKENS, &wide),
            },
        }
    }

    fn all(&self) -> Vec<&str> {
        let mut v = vec![
            self.last_sample.as_str(),
            &self.running,
            &self.waiting,
            &self.kv_usage,
            &self.ttft,
        ];
        v.extend(self.long.all());
        v.extend(self.arrivals_short.all());
        v.extend(self.tpot.iter().map(String::as_str));
        v.extend(self.wide.all());
        v.extend([self.bursts.as_str(), &self.bursts_sum]);
        v.extend(self.front_door.all());
        v
    }
}

/// Which variant a pod's series count for: the pool's ready pods by name; for window figures
/// also pods that have left, by their Deployment's name prefix.
struct Members<'a> {
    ready: HashMap<&'a str, &'a ReplicaPod>,
    /// (Deployment name + `-`, variant entry name), longest first.
    prefixes: Vec<(String, &'a str)>,
}

impl<'a> Members<'a> {
    fn new(q: &Query<'a>) -> Members<'a> {
        let ready = q.targets.iter().map(|t| (t.pod.as_str(), t)).collect();
        let mut prefixes: Vec<(String, &str)> = q
            .spec
            .variants
            .iter()
            .map(|v| (format!("{}-", v.deployment), v.name.as_str()))
            .collect();
        prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        Members { ready, prefixes }
    }

    fn ready_variant(&self, pod: &str) -> Option<&'a str> {
        self.ready.get(pod).map(|t| t.variant.as_str())
    }

    fn window_variant(&self, pod: &str) -> Option<&'a str> {
        self.ready_variant(pod).or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| pod.starts_with(p.as_str()))
                .map(|(_, v)| *v)
        })
    }
}

/// The Prometheus source.
#[derive(Debug)]
pub struct PrometheusSource {
    config: PrometheusConfig,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl PrometheusSource {
    pub fn new(config: PrometheusConfig) -> Result<Self> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| Error::Signals(format!("no TLS root certificates: {e}")))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https);
        Ok(PrometheusSource { config, client })
    }

    /// One instant query at `time` (Unix seconds).
    pub async fn query(
        &self,
        base: &str,
        promql: &str,
        time: f64,
        token: Option<&str>,
    ) -> Result<Vec<Sample>, QueryError> {
        let url = format!("{}/api/v1/query", base.trim_end_matches('/'));
        let form = format!("query={}&time={time:.3}", form_escape(promql));
        let mut req = hyper::Request::post(&url)
            .header(
                hyper::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(hyper::header::ACCEPT, "application/json");
        if let Some(t) = token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(form)))
            .map_err(|e| QueryError::Request(e.to_string()))?;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| QueryError::Request(error_chain(&e)))?;
            let status = resp.status().as_u16();
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| QueryError::Request(format!("reading the answer: {e}")))?
                .to_bytes();
            parse_answer(status, &body)
        };
        tokio::time::timeout(self.config.timeout, exchange)
            .await
            .map_err(|_| QueryError::Timeout(self.config.timeout))?
    }

    async fn load(&self, q: Query<'_>) -> Result<Reading> {
        let base = q.spec.signals.prometheus_url.as_deref().unwrap_or_default();
        let uri: hyper::Uri = base
            .parse()
            .map_err(|_| Error::Signals(format!("prometheusUrl {base:?} is not a URL")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(Error::Signals(format!(
                "prometheusUrl {base:?}: an http:// or https:// URL with a host"
            )));
        }
        if q.targets.is_empty() {
            return Ok(Reading::Stale("no ready replica pod".into()));
        }
        let token = match &self.config.bearer_token_file {
            Some(path) => match tokio::fs::read_to_string(path).await {
                Ok(t) => Some(t.trim().to_string()),
                Err(e) => {
                    return Ok(Reading::Stale(format!(
                        "bearer token {}: {e}",
                        path.display()
                    )))
                }
            },
            None => None,
        };
        let c = &self.config;
        let matchers = format!(
            "{}={},model_name={}",
            c.namespace_label,
            quote(q.namespace),
            quote(&q.spec.model)
        );
        let policy = &q.spec.policy;
        let queries = Queries::new(
            &c.pod_label,
            (&matchers, &q.spec.model),
            policy.window_seconds,
            policy.short_window_seconds,
            policy.shape_window_seconds,
        );
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let texts = queries.all();
        let answers = join_all(
            texts
                .iter()
                .map(|text| self.query(base, text, time, token.as_deref())),
        )
        .await;
        let mut results: HashMap<&str, Vec<Sample>> = HashMap::new();
        for (text, answer) in texts.iter().zip(answers) {
            match answer {
                Ok(v) => {
                    results.insert(text, v);
                }
                Err(e) => {
                    tracing::warn!(pool = q.pool, query = text, error = %e, "prometheus query failed");
                    return Ok(Reading::Stale(format!("prometheus {base}: {e}")));
                }
            }
        }
        let members = Members::new(&q);
        let get = |text: &str| results.get(text).map(Vec::as_slice).unwrap_or_default();
        Ok(compute(
            &members,
            &c.pod_label,
            &queries,
            &get,
            time,
            c.max_age.as_secs_f64(),
            q,
        ))
    }
}

/// Percent-encodes a form value.
fn form_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The reading from the queries' answers.
fn compute<'a>(
    members: &Members<'_>,
    pod_label: &str,
    queries: &Queries,
    get: &dyn Fn(&str) -> &'a [Sample],
    now_unix: f64,
    max_age_s: f64,
    q: Query<'_>,
) -> Reading {
    let ans = Answers {
        members,
        pod_label,
        get,
    };
    if let Some(why) = ans.stale(queries, q.targets, now_unix, max_age_s) {
        return Reading::Stale(why);
    }
    let (queue, sums) = ans.gauges(queries, q.targets);
    let (arrivals, prompt_len) = ans.arrivals(queries, &q.spec.policy);
    let (tq, pq) = (
        q.spec.slo.ttft.percentile / 100.0,
        q.spec.slo.tpot.percentile / 100.0,
    );
    let (ttft, ttft_by) = ans.histograms(&queries.ttft);
    let (tpot, tpot_by) = queries
        .tpot
        .iter()
        .map(|t| ans.histograms(t))
        .find(|(h, _)| !h.buckets.is_empty())
        .unwrap_or_default();
    let latency = Latency {
        window_s: q.spec.policy.window_seconds,
        ttft_p50_s: ttft.quantile(0.5),
        ttft_p99_s: ttft.quantile(tq),
        tpot_p50_s: tpot.quantile(0.5),
        tpot_p99_s: tpot.quantile(pq),
        ttft_attainment: q.ttft_target.attainment(&ttft, &prompt_len),
    };
    let feasible_share = q.ttft_target.feasible_share(&prompt_len);
    let variants = sums
        .into_iter()
        .map(|(v, s)| {
            (
                v.to_string(),
                VariantLoad {
                    running_per_replica: s.running / s.pods,
                    waiting_per_replica: s.waiting / s.pods,
                    kv_cache_usage: s.kv / s.pods,
                    ttft_p99_s: ttft_by.get(v).and_then(|h| h.quantile(tq)),
                    tpot_p99_s: tpot_by.get(v).and_then(|h| h.quantile(pq)),
                },
            )
        })
        .collect();
    Reading::Fresh(Box::new(Load {
        arrivals,
        queue,
        latency,
        feasible_share,
        variants,
        front_door: ans.front_door(&queries.front_door, &q.spec.policy),
    }))
}

/// One variant's ready pods and the sums of their gauges.
#[derive(Debug, Default)]
struct GaugeSums {
    pods: f64,
    running: f64,
    waiting: f64,
    kv: f64,
}

/// The queries' answers for one pool, read by member pod.
struct Answers<'a, 'm> {
    members: &'m Members<'m>,
    pod_label: &'m str,
    get: &'m dyn Fn(&str) -> &'a [Sample],
}

impl<'a, 'm> Answers<'a, 'm> {
    fn pod_of(&self, s: &'a Sample) -> &'a str {
        s.labels.get(self.pod_label).map_or("", String::as_str)
    }

    /// Freshness: every ready pod has a recent sample; if not, which have none and why.
    fn stale(
        &self,
        queries: &Queries,
        targets: &[ReplicaPod],
        now_unix: f64,
        max_age_s: f64,
    ) -> Option<String> {
        let newest: HashMap<&str, f64> = (self.get)(&queries.last_sample)
            .iter()
            .map(|s| (self.pod_of(s), s.value))
            .collect();
        let mut missing = Vec::new();
        for t in targets {
            match newest.get(t.pod.as_str()) {
                Some(ts) if now_unix - ts <= max_age_s => {}
                Some(ts) => missing.push(format!(
                    "{} (newest sample {:.0} s old)",
                    t.pod,
                    now_unix - ts
                )),
                None => missing.push(format!("{} (no series)", t.pod)),
            }
        }
        (!missing.is_empty()).then(|| {
            format!(
                "no vllm:num_requests_running sample within {max_age_s:.0} s for {}",
                missing.join(", ")
            )
        })
    }

    /// A gauge per ready pod.
    fn per_pod(&self, text: &str) -> HashMap<&'a str, f64> {
        (self.get)(text)
            .iter()
            .filter(|s| self.members.ready_variant(self.pod_of(s)).is_some() && s.value.is_finite())
            .map(|s| (self.pod_of(s), s.value))
            .collect()
    }

    /// Gauges, ready pods only: the pool's queue, and per variant the sums to average.
    fn gauges<'t>(
        &self,
        queries: &Queries,
        targets: &'t [ReplicaPod],
    ) -> (Queue, BTreeMap<&'t str, GaugeSums>) {
        let running = self.per_pod(&queries.running);
        let waiting = self.per_pod(&queries.waiting);
        let kv = self.per_pod(&queries.kv_usage);
        let mut queue = Queue::default();
        let mut sums: BTreeMap<&str, GaugeSums> = BTreeMap::new();
        for t in targets {
            let (r, w) = (
                running.get(t.pod.as_str()).copied().unwrap_or(0.0).max(0.0),
                waiting.get(t.pod.as_str()).copied().unwrap_or(0.0).max(0.0),
            );
            queue.running += r.round() as u64;
            queue.waiting += w.round() as u64;
            let e = sums.entry(t.variant.as_str()).or_default();
            e.pods += 1.0;
            e.running += r;
            e.waiting += w;
            e.kv += kv.get(t.pod.as_str()).copied().unwrap_or(0.0);
        }
        (queue, sums)
    }

    /// A window figure summed over every member pod, ready or gone.
    fn total(&self, text: &str) -> f64 {
        (self.get)(text)
            .iter()
            .filter(|s| {
                self.members.window_variant(self.pod_of(s)).is_some() && s.value.is_finite()
            })
            .map(|s| s.value)
            .sum()
    }

    /// A histogram over every member pod, and one per variant.
    fn histograms(&self, text: &str) -> (Histogram, HashMap<&'m str, Histogram>) {
        let mut by_pod: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for s in (self.get)(text) {
            let pod = self.pod_of(s);
            let Some(le) = s.labels.get(vllm::LE).and_then(|le| parse_value(le)) else {
                continue;
            };
            if self.members.window_variant(pod).is_some() && s.value.is_finite() {
                by_pod.entry(pod).or_default().push((le, s.value.max(0.0)));
            }
        }
        let mut all = Histogram::default();
        let mut per_variant: HashMap<&str, Histogram> = HashMap::new();
        for (pod, mut buckets) in by_pod {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let h = Histogram { buckets };
            all.add(&h);
            if let Some(v) = self.members.window_variant(pod) {
                per_variant.entry(v).or_default().add(&h);
            }
        }
        (all, per_variant)
    }

    /// Arrival rates and shape over the policy's windows, and the long window's prompt-length
    /// histogram (the TTFT attainment reads it too).
    fn arrivals(&self, queries: &Queries, policy: &PolicySpec) -> (Arrivals, Histogram) {
        let (w, ws) = (policy.window_seconds, policy.short_window_seconds);
        let (long, prompt_len) = self.shape(&queries.long, w);
        let (wide, _) = self.shape(&queries.wide, policy.shape_window_seconds);
        let short_rate = self.arrivals_over(&queries.arrivals_short) / ws;
        let arrivals = Arrivals {
            max_prompt_tokens: prompt_len.max_bound().map_or(0, |m| m.round() as u64),
            wide: Some(wide),
            per_second: self.bursts(queries),
            ..Arrivals::from_shape(&long, w, (ws, short_rate))
        };
        (arrivals, prompt_len)
    }

    /// The gateways' per-second prompt sums, `None` when no gateway exports them.
    fn bursts(&self, queries: &Queries) -> Option<SecondSums> {
        let buckets = self.gateway_buckets(&queries.bursts)?;
        let sum = self.gateway_total(&queries.bursts_sum).unwrap_or(0.0);
        Some(SecondSums {
            buckets,
            sum: sum.max(0.0),
        })
    }

    /// The gateways' front door for the model over the windows; `None` when no gateway
    /// exports it.
    fn front_door(&self, q: &FrontDoorQueries, policy: &PolicySpec) -> Option<FrontDoorWindows> {
        let arrivals = self.gateway_total(&q.arrivals)?;
        let door = |arrivals: f64| FrontDoor {
            arrivals,
            ..FrontDoor::default()
        };
        let short = self.gateway_total(&q.arrivals_short).unwrap_or(0.0);
        let refused = |(buckets, sum): &(String, String)| SummedHistogram {
            hist: Histogram {
                buckets: self.gateway_buckets(buckets).unwrap_or_default(),
            },
            sum: self.gateway_total(sum).unwrap_or(0.0),
        };
        let latency = FrontDoor {
            arrivals,
            unserved: self.gateway_total(&q.unserved).unwrap_or(0.0),
            ttft: Histogram {
                buckets: self.gateway_buckets(&q.ttft).unwrap_or_default(),
            },
            ..FrontDoor::default()
        };
        let long = FrontDoor {
            refused_prompts: refused(&q.refused),
            ..door(arrivals)
        };
        let wide = FrontDoor {
            refused_prompts: refused(&q.refused_wide),
            ..FrontDoor::default()
        };
        Some(FrontDoorWindows {
            long: (long, policy.window_seconds),
            short: (door(short), policy.short_window_seconds),
            latency,
            wide,
        })
    }

    /// A gateway histogram summed `by (le)`, in bound order; `None` when empty.
    fn gateway_buckets(&self, text: &str) -> Option<Vec<(f64, f64)>> {
        let mut buckets: Vec<(f64, f64)> = (self.get)(text)
            .iter()
            .filter_map(|s| {
                let le = s.labels.get(vllm::LE).and_then(|le| parse_value(le))?;
                s.value.is_finite().then_some((le, s.value.max(0.0)))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        (!buckets.is_empty()).then_some(buckets)
    }

    /// A gateway sum's value (not the pool's pods: a gateway is none of them); `None` when
    /// no series answered.
    fn gateway_total(&self, text: &str) -> Option<f64> {
        let answer = (self.get)(text);
        (!answer.is_empty()).then(|| {
            answer
                .iter()
                .map(|s| s.value)
                .filter(|v| v.is_finite())
                .sum::<f64>()
                .max(0.0)
        })
    }

    /// The requests that arrived over one window and their tokens, with its prompt-length
    /// histogram.
    fn shape(&self, q: &ShapeQueries, window_s: f64) -> (WindowShape, Histogram) {
        let (prompt_len, _) = self.histograms(&q.prompt_len);
        let (output_len, _) = self.histograms(&q.output_len);
        let shape = WindowShape {
            window_s,
            requests: self.arrivals_over(&q.arrivals),
            prompt_tokens: self.total(&q.prompt_tokens).max(0.0),
            output_tokens: self.total(&q.generation_tokens).max(0.0),
            prompt_tokens_cv2: prompt_len.mean_cv2().map_or(0.0, |p| p.1),
            output_tokens_cv2: output_len.mean_cv2().map_or(0.0, |p| p.1),
        };
        (shape, prompt_len)
    }

    /// Requests arrived over a window: finished in it plus the change in running and waiting.
    fn arrivals_over(&self, a: &ArrivalQueries) -> f64 {
        a.all().iter().map(|q| self.total(q)).sum::<f64>().max(0.0)
    }
}

impl SignalSource for PrometheusSource {
    fn read<'a>(&'a self, q: Query<'a>) -> BoxFuture<'a, Result<Reading>> {
        Box::pin(self.load(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_parse_and_errors_say_what_prometheus_said() {
        let ok = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"pod":"a","le":"+Inf"},"value":[1700000000.5,"3"]},
            {"metric":{"pod":"b"},"value":[1700000000.5,"NaN"]}]}}"#;
        let v = parse_answer(200, ok).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].labels["le"], "+Inf");
        assert_eq!(v[0].value, 3.0);
        assert!(v[1].value.is_nan());
        let bad = br#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#;
        let e = parse_answer(400, bad).unwrap_err().to_string();
        assert!(e.contains("bad_data") && e.contains("parse error"), "{e}");
        let e = parse_answer(502, b"<html>bad gateway</html>")
            .unwrap_err()
            .to_string();
        assert!(e.contains("HTTP 502") && e.contains("bad gateway"), "{e}");
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#;
        assert!(parse_answer(200, scalar)
            .unwrap_err()
            .to_string()
            .contains("scalar"));
        assert!(parse_answer(200, b"{}").is_err());
    }

    #[test]
    fn label_values_and_forms_are_escaped() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(
            form_escape("sum by (pod) (x{a=\"b\"})"),
            "sum+by+%28pod%29+%28x%7Ba%3D%22b%22%7D%29"
        );
        assert_eq!(range(60.0), "[60000ms]");
        assert_eq!(range(0.25), "[250ms]");
        let q = Queries::new(
            "pod",
            (r#"namespace="ns",model_name="m""#, "m"),
            60.0,
            10.0,
            420.0,
        );
        assert_eq!(
            q.running,
            r#"sum by (pod) (vllm:num_requests_running{namespace="ns",model_name="m"})"#
        );
        assert_eq!(
            q.ttft,
            r#"sum by (pod, le) (increase(vllm:time_to_first_token_seconds_bucket{namespace="ns",model_name="m"}[60000ms]))"#
        );
        assert!(q.arrivals_short.finished.contains("[10000ms]"));
        assert!(q
            .wide
            .prompt_len
            .contains("vllm:request_prompt_tokens_bucket"));
        assert!(q.wide.arrivals.finished.contains("[420000ms]"));
        assert!(q.all().contains(&q.wide.generation_tokens.as_str()));
        assert_eq!(
            q.bursts,
            r#"sum by (le) (increase(sluice_gateway_prompt_tokens_per_second_bucket{model="m"}[420000ms]))"#
        );
        assert!(q.all().contains(&q.bursts_sum.as_str()));
    }
}

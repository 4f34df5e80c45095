//! Live signals from replicas' Prometheus `/metrics`: fetch every target over HTTP each tick,
//! keep a short history per target, and turn it into the [`Signals`] inputs the policy reads —
//! arrival and token rates over the long and short windows, the queue, running sequences, KV
//! use, and TTFT / TPOT percentiles over the latency window — per (variant, capacity type)
//! and for the whole model.
//!
//! Used by local mode (targets: the replica processes it started) and by the Kubernetes
//! controller (targets: pod IPs from EndpointSlices); both pass the target list each tick, so
//! a replica that appears is scraped from then on and one that leaves keeps contributing what
//! it served until that falls out of the windows.
//!
//! A target that does not answer within the timeout, answers non-200, or answers something
//! that is not the exposition format is **stale**: it is reported as such (with the error),
//! its last good figures still count towards the queue, and it is never read as idle — the
//! actuator must not scale down on stale metrics (as HPA does with missing metrics).
//!
//! - [`exposition`]: the text-format parser (`sluice-metrics`').
//! - [`snapshot`]: one scrape reduced to the figures (vLLM, llama.cpp and gateway names).
//! - [`window`]: per-target history and increases over a window.
//! - [`front_door`]: a routing gateway's view of each model's demand, folded into the
//!   replicas'.

pub use sluice_metrics::exposition;
pub mod front_door;
pub mod snapshot;
pub mod window;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use front_door::{FrontDoorWindows, LatencyRule};
pub use snapshot::{normalise_url, Histogram, ModelQueue, Snapshot, SummedHistogram, TtftTarget};
use window::{History, Increase};

use sluice_policy::profile::CapacityType;
use sluice_policy::signals::{Arrivals, Latency, Queue, SecondSums, Signals, SHAPE_WINDOW_S};

/// Largest `/metrics` body read (a replica's is ~20 kB).
const MAX_BODY: usize = 8 << 20;

/// What a target is: a replica (engine metrics) or a routing gateway (its admission queue
/// and the set of replicas it routes to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Replica,
    Gateway,
}

/// One endpoint to scrape: `url` is the server's base (`http://10.0.0.7:8000`), the path is
/// the scraper's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub variant: String,
    pub capacity: CapacityType,
    pub url: String,
    pub role: Role,
}

impl Endpoint {
    pub fn replica(variant: &str, capacity: CapacityType, url: &str) -> Endpoint {
        Endpoint {
            variant: variant.to_string(),
            capacity,
            url: normalise_url(url),
            role: Role::Replica,
        }
    }

    pub fn gateway(url: &str) -> Endpoint {
        Endpoint {
            variant: String::new(),
            capacity: CapacityType::OnDemand,
            url: normalise_url(url),
            role: Role::Gateway,
        }
    }
}

/// Windows and limits of the scraper.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeConfig {
    /// Per-target deadline for the whole exchange (connect, headers, body).
    pub timeout: Duration,
    pub path: String,
    /// The long arrival window the policy plans from.
    pub window_s: f64,
    /// The short arrival window that notices a spike.
    pub short_window_s: f64,
    /// The window of the latency percentiles.
    pub latency_window_s: f64,
    /// The request shape's wider window (see [`Arrivals::wide`]).
    pub shape_window_s: f64,
    /// The quantiles the SLO names for TTFT and TPOT (0.99 for p99). The signals' `*_p99_s`
    /// fields carry these quantiles: the policy compares them with the SLO's targets.
    pub ttft_quantile: f64,
    pub tpot_quantile: f64,
    /// What TTFT attainment is measured against; `None`: no attainment signal.
    pub ttft_target: Option<TtftTarget>,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            timeout: Duration::from_secs(2),
            path: "/metrics".into(),
            window_s: 60.0,
            short_window_s: 10.0,
            latency_window_s: 60.0,
            shape_window_s: SHAPE_WINDOW_S,
            ttft_quantile: 0.99,
            tpot_quantile: 0.99,
            ttft_target: None,
        }
    }
}

/// Why a target's scrape failed (the target is then stale).
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("{url}: not a valid URL")]
    Url { url: String },
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: request failed")]
    Request {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: reading the body failed: {message}")]
    Body { url: String, message: String },
    #[error("{url}: not the Prometheus text format")]
    Parse {
        url: String,
        #[source]
        source: exposition::ParseError,
    },
}

/// One target's state after a tick.
#[derive(Debug, Clone)]
pub struct TargetStatus {
    pub target: Endpoint,
    /// This tick's scrape failed (the error, with its causes); `None` when fresh.
    pub error: Option<String>,
    /// The last good snapshot (this tick's when fresh), if the target ever answered.
    pub last: Option<Snapshot>,
}

impl TargetStatus {
    pub fn is_stale(&self) -> bool {
        self.error.is_some()
    }
}

/// Load of one (variant, capacity type) now, and its latency over the latency window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VariantLoad {
    /// Replicas scraped this tick, and replicas whose scrape failed.
    pub fresh: u32,
    pub stale: u32,
    /// Means over fresh replicas.
    pub running_per_replica: f64,
    pub waiting_per_replica: f64,
    pub kv_cache_usage: f64,
    pub ttft_p99_s: Option<f64>,
    pub tpot_p99_s: Option<f64>,
}

/// Everything one tick of scraping found.
#[derive(Debug, Clone)]
pub struct Observation {
    pub time_s: f64,
    pub targets: Vec<TargetStatus>,
    pub arrivals: Arrivals,
    pub queue: Queue,
    pub latency: Latency,
    pub variants: BTreeMap<(String, CapacityType), VariantLoad>,
    /// The replicas a gateway target routes to now (union over gateways; a sluice gateway
    /// exports `sluice_gateway_replica_eligible` per replica in its set); `None` without a
    /// fresh gateway scrape.
    pub routed: Option<BTreeSet<String>>,
    /// What the gateways (fresh or not: their last figures) have waiting per model, held
    /// requests of a pool at zero included.
    pub gateway_models: BTreeMap<String, ModelQueue>,
    /// The prompt tokens per second the gateways saw over the shape window, per model
    /// (summed over gateways: with several, each sees its share of a burst).
    pub prompt_bursts: BTreeMap<String, SummedHistogram>,
    /// The gateways' arrivals, client-side first tokens and unserved requests over the
    /// windows, per model (summed over gateways).
    pub front_door: BTreeMap<String, FrontDoorWindows>,
    /// How the front door's first tokens are read: the SLO's quantile, the TTFT target and
    /// the share of the latency window's prompts some variant serves alone within it.
    pub latency_rule: LatencyRule,
}

impl Observation {
    /// The prompt tokens per second the gateways saw for `model` (as they label it: the
    /// served name), `None` when they export none.
    pub fn prompt_bursts_of(&self, model: &str) -> Option<SecondSums> {
        self.prompt_bursts.get(model).map(SummedHistogram::sums)
    }

    /// What the gateways have waiting or held for `model`.
    pub fn gateway_queue_of(&self, model: &str) -> ModelQueue {
        self.gateway_models.get(model).copied().unwrap_or_default()
    }

    /// Whether any target's metrics are stale this tick (then no scale-down).
    pub fn any_stale(&self) -> bool {
        self.targets.iter().any(TargetStatus::is_stale)
    }

    /// The status of the target at `url`.
    pub fn target(&self, url: &str) -> Option<&TargetStatus> {
        let url = normalise_url(url);
        self.targets.iter().find(|t| t.target.url == url)
    }

    /// Writes what was observed into `s`: arrivals, queue and latency, and the load fields of
    /// each of its variant entries (the fleet counts — ready, starting — are the actuator's);
    /// with what the gateways saw of `model` (as they label it: the served name): its prompt
    /// tokens per second, and its front door folded into the arrivals and latency.
    pub fn apply(&self, model: &str, s: &mut Signals) {
        s.time_s = self.time_s;
        s.arrivals = self.arrivals.clone();
        s.arrivals.per_second = self.prompt_bursts_of(model);
        s.queue = self.queue.clone();
        s.latency = self.latency.clone();
        if let Some(door) = self.front_door.get(model) {
            door.apply(&mut s.arrivals, &mut s.latency, &self.latency_rule);
        }
        for v in &mut s.variants {
            if let Some(l) = self.variants.get(&(v.variant.clone(), v.capacity)) {
                v.running_per_replica = l.running_per_replica;
                v.waiting_per_replica = l.waiting_per_replica;
                v.kv_cache_usage = l.kv_cache_usage;
                v.ttft_p99_s = l.ttft_p99_s;
                v.tpot_p99_s = l.tpot_p99_s;
            }
        }
    }
}

/// Per (variant, capacity type).
type ByVariant<T> = BTreeMap<(String, CapacityType), T>;

#[derive(Debug)]
struct Tracked {
    target: Endpoint,
    history: History,
    last_seen_s: f64,
}

/// The scraper and its per-target histories.
#[derive(Debug)]
pub struct Scraper {
    config: ScrapeConfig,
    client: Client<HttpConnector, Empty<Bytes>>,
    tracked: BTreeMap<String, Tracked>,
    started_s: Option<f64>,
}

impl Scraper {
    pub fn new(config: ScrapeConfig) -> Scraper {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(config.timeout));
        http.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(http);
        Scraper {
            config,
            client,
            tracked: BTreeMap::new(),
            started_s: None,
        }
    }

    pub fn config(&self) -> &ScrapeConfig {
        &self.config
    }

    /// Scrapes every target at once (each bounded by the timeout) at time `now_s` (seconds
    /// on the caller's monotonic clock), and computes the windows.
    pub async fn scrape(&mut self, targets: &[Endpoint], now_s: f64) -> Observation {
        let mut set = tokio::task::JoinSet::new();
        for (i, t) in targets.iter().enumerate() {
            let client = self.client.clone();
            let url = format!("{}{}", t.url, self.config.path);
            let timeout = self.config.timeout;
            set.spawn(async move { (i, fetch(&client, &url, timeout).await) });
        }
        let mut results: Vec<Option<Result<Snapshot, ScrapeError>>> =
            (0..targets.len()).map(|_| None).collect();
        while let Some(joined) = set.join_next().await {
            if let Ok((i, r)) = joined {
                results[i] = Some(r);
            }
        }
        let results = results
            .into_iter()
            .zip(targets)
            .map(|(r, t)| {
                r.unwrap_or_else(|| {
                    Err(ScrapeError::Body {
                        url: t.url.clone(),
                        message: "the scrape task failed".into(),
                    })
                })
            })
            .collect();
        self.record(targets, results, now_s)
    }

    /// Folds one tick's results (one per target, in order) into the histories and computes
    /// the observation. Separate from the HTTP half so the arithmetic is tested with exact
    /// snapshots and times.
    pub fn record(
        &mut self,
        targets: &[Endpoint],
        results: Vec<Result<Snapshot, ScrapeError>>,
        now_s: f64,
    ) -> Observation {
        let started = *self.started_s.get_or_insert(now_s);
        let mut statuses = Vec::with_capacity(targets.len());
        for (t, r) in targets.iter().zip(results) {
            let tracked = self
                .tracked
                .entry(t.url.clone())
                .or_insert_with(|| Tracked {
                    target: t.clone(),
                    history: History::default(),
                    last_seen_s: now_s,
                });
            tracked.target = t.clone();
            tracked.last_seen_s = now_s;
            let error = match r {
                Ok(snap) => {
                    tracked.history.push(now_s, snap);
                    None
                }
                Err(e) => Some(error_chain(&e)),
            };
            statuses.push(TargetStatus {
                target: t.clone(),
                error,
                last: tracked.history.latest().map(|(_, s)| s.clone()),
            });
        }
        let keep = self
            .config
            .window_s
            .max(self.config.short_window_s)
            .max(self.config.latency_window_s)
            .max(self.config.shape_window_s);
        // Departed targets keep counting what they served until it leaves every window.
        self.tracked.retain(|_, tr| {
            tr.history.prune(now_s, keep);
            tr.last_seen_s > now_s - keep
        });
        self.observe(statuses, now_s, started)
    }

    fn observe(&self, statuses: Vec<TargetStatus>, now: f64, started: f64) -> Observation {
        let c = &self.config;
        let (arrivals, latency, per_variant, latency_rule) = self.windows(now, started);
        let (queue, mut variants, routed) = current_load(&statuses);
        let gateway_models = gateway_models(&statuses);
        for (key, v) in variants.iter_mut() {
            if let Some(l) = per_variant.get(key) {
                v.ttft_p99_s = l.ttft.quantile(c.ttft_quantile);
                v.tpot_p99_s = l.tpot.quantile(c.tpot_quantile);
            }
        }
        Observation {
            time_s: now,
            targets: statuses,
            arrivals,
            queue,
            latency,
            variants,
            routed,
            gateway_models,
            prompt_bursts: self.prompt_bursts(now),
            front_door: self.front_door(now, started),
            latency_rule,
        }
    }

    /// The gateways' front door per model over the arrival and latency windows.
    fn front_door(&self, now: f64, started: f64) -> BTreeMap<String, FrontDoorWindows> {
        let c = &self.config;
        let windows = (
            c.window_s,
            c.short_window_s,
            c.latency_window_s,
            c.shape_window_s,
        );
        let mut out: BTreeMap<String, FrontDoorWindows> = BTreeMap::new();
        let gateways = self
            .tracked
            .values()
            .filter(|t| t.target.role == Role::Gateway);
        for tr in gateways {
            for (model, w) in tr.history.front_door_windows(now, windows) {
                out.entry(model)
                    .or_insert_with(|| {
                        FrontDoorWindows::spanning(c.window_s, c.short_window_s, now - started)
                    })
                    .add(&w);
            }
        }
        out
    }

    /// The gateways' per-second prompt sums over the shape window, per model.
    fn prompt_bursts(&self, now: f64) -> BTreeMap<String, SummedHistogram> {
        let mut out: BTreeMap<String, SummedHistogram> = BTreeMap::new();
        let gateways = self
            .tracked
            .values()
            .filter(|t| t.target.role == Role::Gateway);
        for tr in gateways {
            for (model, sums) in tr.history.burst_increase(now, self.config.shape_window_s) {
                out.entry(model).or_default().add(&sums);
            }
        }
        out
    }

    /// The window figures over every replica tracked (departed ones too): arrivals, latency,
    /// each variant's latency-window increase, and how a gateway's first tokens are read.
    fn windows(
        &self,
        now: f64,
        started: f64,
    ) -> (Arrivals, Latency, ByVariant<Increase>, LatencyRule) {
        let c = &self.config;
        let elapsed = (now - started).max(0.0);
        let span = |w: f64| w.min(elapsed).max(1e-3);
        let mut long = Increase::default();
        let mut short = Increase::default();
        let mut lat = Increase::default();
        let mut wide = Increase::default();
        let mut per_variant: BTreeMap<(String, CapacityType), Increase> = BTreeMap::new();
        for tr in self.tracked.values() {
            if tr.target.role != Role::Replica {
                continue;
            }
            long.add(&tr.history.increase(now, c.window_s));
            short.add(&tr.history.increase(now, c.short_window_s));
            wide.add(&tr.history.increase(now, c.shape_window_s));
            let l = tr.history.increase(now, c.latency_window_s);
            lat.add(&l);
            per_variant
                .entry((tr.target.variant.clone(), tr.target.capacity))
                .or_default()
                .add(&l);
        }
        let (w, ws) = (span(c.window_s), span(c.short_window_s));
        let short_rate = short.arrivals.max(0.0) / ws;
        let arrivals = Arrivals {
            max_prompt_tokens: long.prompt_len.max_bound().map_or(0, |m| m.round() as u64),
            wide: Some(wide.shape(c.shape_window_s)),
            ..Arrivals::from_shape(&long.shape(c.window_s), w, (c.short_window_s, short_rate))
        };
        let latency = Latency {
            window_s: c.latency_window_s,
            ttft_p50_s: lat.ttft.quantile(0.5),
            ttft_p99_s: lat.ttft.quantile(c.ttft_quantile),
            tpot_p50_s: lat.tpot.quantile(0.5),
            tpot_p99_s: lat.tpot.quantile(c.tpot_quantile),
            ttft_attainment: c
                .ttft_target
                .and_then(|t| t.attainment(&lat.ttft, &lat.prompt_len)),
        };
        let rule = LatencyRule {
            ttft_quantile: c.ttft_quantile,
            target: c.ttft_target.map(|t| {
                // No prompt reached a replica in the window: count every one as feasible.
                (t, t.feasible_share(&lat.prompt_len).unwrap_or(1.0))
            }),
        };
        (arrivals, latency, per_variant, rule)
    }
}

/// The current gauges from this tick's scrapes: the queue (a gateway's admission queue and
/// every replica's), each variant's fresh and stale replicas and their mean load, and the
/// replicas the gateways route to (`None` without a fresh gateway).
fn current_load(
    statuses: &[TargetStatus],
) -> (Queue, ByVariant<VariantLoad>, Option<BTreeSet<String>>) {
    let mut queue = Queue::default();
    let mut variants: BTreeMap<(String, CapacityType), VariantLoad> = BTreeMap::new();
    let mut sums: BTreeMap<(String, CapacityType), (f64, f64, f64)> = BTreeMap::new();
    let mut routed: Option<BTreeSet<String>> = None;
    for st in statuses {
        let t = &st.target;
        match t.role {
            Role::Gateway => {
                if let Some(s) = &st.last {
                    // Held requests (no replica of their model ready) the depth leaves out.
                    let held: f64 = s
                        .gateway_models
                        .iter()
                        .flat_map(|m| m.values())
                        .map(ModelQueue::held_beyond_depth)
                        .sum();
                    queue.waiting +=
                        (s.gateway_queue.unwrap_or(0.0).max(0.0) + held).round() as u64;
                    // A fresh gateway without replica series routes to none.
                    if !st.is_stale() {
                        routed
                            .get_or_insert_with(BTreeSet::new)
                            .extend(snapshot::routed(s).unwrap_or_default());
                    }
                }
            }
            Role::Replica => {
                let key = (t.variant.clone(), t.capacity);
                let v = variants.entry(key.clone()).or_default();
                // Stale: the last good figures still count towards the queue.
                if let Some(s) = &st.last {
                    queue.waiting += s.waiting_total().max(0.0).round() as u64;
                    queue.running += s.running.unwrap_or(0.0).max(0.0).round() as u64;
                }
                if st.is_stale() {
                    v.stale += 1;
                    continue;
                }
                v.fresh += 1;
                if let Some(s) = &st.last {
                    let e = sums.entry(key).or_default();
                    e.0 += s.running.unwrap_or(0.0);
                    e.1 += s.waiting_total();
                    e.2 += s.kv_usage.unwrap_or(0.0);
                }
            }
        }
    }
    for (key, v) in variants.iter_mut() {
        if v.fresh > 0 {
            let (r, q, kv) = sums.get(key).copied().unwrap_or_default();
            let n = f64::from(v.fresh);
            v.running_per_replica = r / n;
            v.waiting_per_replica = q / n;
            v.kv_cache_usage = kv / n;
        }
    }
    (queue, variants, routed)
}

/// The gateways' queues per model, summed over gateway targets (a stale one's last figures).
fn gateway_models(statuses: &[TargetStatus]) -> BTreeMap<String, ModelQueue> {
    let mut out: BTreeMap<String, ModelQueue> = BTreeMap::new();
    for st in statuses.iter().filter(|s| s.target.role == Role::Gateway) {
        let Some(models) = st.last.as_ref().and_then(|s| s.gateway_models.as_ref()) else {
            continue;
        };
        for (m, q) in models {
            out.entry(m.clone()).or_default().add(q);
        }
    }
    out
}

/// An error and its causes on one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// GETs `url` and parses it, all within `timeout`.
pub async fn fetch(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    timeout: Duration,
) -> Result<Snapshot, ScrapeError> {
    let text = fetch_text(client, url, timeout).await?;
    let samples = exposition::parse(&text).map_err(|source| ScrapeError::Parse {
        url: url.to_string(),
        source,
    })?;
    Ok(Snapshot::from_samples(&samples))
}

async fn fetch_text(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    timeout: Duration,
) -> Result<String, ScrapeError> {
    let uri: hyper::Uri = url.parse().map_err(|_| ScrapeError::Url {
        url: url.to_string(),
    })?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(ScrapeError::Url {
            url: url.to_string(),
        });
    }
    let exchange = async {
        let resp = client
            .get(uri)
            .await
            .map_err(|source| ScrapeError::Request {
                url: url.to_string(),
                source,
            })?;
        if resp.status() != hyper::StatusCode::OK {
            return Err(ScrapeError::Status {
                url: url.to_string(),
                status: resp.status().as_u16(),
            });
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| ScrapeError::Body {
                url: url.to_string(),
                message: e.to_string(),
            })?
            .to_bytes();
        String::from_utf8(body.to_vec()).map_err(|_| ScrapeError::Body {
            url: url.to_string(),
            message: "not UTF-8".into(),
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ScrapeError::Timeout {
            url: url.to_string(),
            timeout,
        })?
}

#[cfg(test)]
mod tests;

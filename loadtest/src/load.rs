//! Offers the load: closed loop (`N` workers, each sends when its last request ended) or open
//! loop (requests leave at precomputed offsets, whatever the server does, optionally capped by a
//! semaphore). Every request is timed from its *scheduled* time; prompt bodies are built before
//! that time so the tool's own work does not land in the figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::Client;
use crate::dataset::Dataset;
use crate::metrics::{self, Record};
use crate::prompt::PromptMaker;
use crate::schedule::{self, Arrival};
use crate::stop::Stop;

/// The shape of the offered load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// `concurrency` requests always in flight.
    Closed { concurrency: usize },
    /// `rate` requests/s on average, gaps drawn by `arrival`.
    Open {
        rate: f64,
        arrival: Arrival,
        max_concurrency: Option<usize>,
    },
    /// Everything due at once (the sweep's max-throughput point; vLLM's `--request-rate inf`).
    Burst { max_concurrency: Option<usize> },
    /// The dataset's own trace times, divided by `time_scale`.
    Trace {
        time_scale: f64,
        max_concurrency: Option<usize>,
    },
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// At most this many requests.
    pub requests: Option<usize>,
    /// No request is *scheduled* after this long; those in flight are waited for.
    pub duration: Option<Duration>,
}

/// Live counters for the progress bar.
#[derive(Debug, Default)]
pub struct Counters {
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub in_flight: AtomicU64,
}

/// What a run needs that does not change between runs (a sweep shares it).
#[derive(Debug, Clone)]
pub struct Shared {
    pub client: Client,
    pub dataset: Arc<Dataset>,
    pub maker: Arc<PromptMaker>,
    pub seed: u64,
    pub counters: Arc<Counters>,
    /// Once set, nothing more is sent; requests in flight finish.
    pub stop: Stop,
}

/// A finished run: per-request records and its duration (first scheduled send to last end).
#[derive(Debug, Clone)]
pub struct RunResult {
    pub records: Vec<Record>,
    pub duration: Duration,
}

struct Prepared {
    id: usize,
    body: Bytes,
    input_tokens: u32,
    max_tokens: u32,
}

impl Shared {
    fn prepare(&self, index: usize) -> Option<(Prepared, Option<f64>)> {
        let spec = self.dataset.get(index)?;
        let (prompt, input_tokens) = self.maker.render(&spec.input);
        let body = self.client.body(&prompt, spec.output_len);
        Some((
            Prepared {
                id: index,
                body,
                input_tokens,
                max_tokens: spec.output_len,
            },
            spec.trace_time_s,
        ))
    }

    async fn fire(&self, p: Prepared, start: Instant, scheduled: Instant) -> Record {
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let obs = self.client.send(p.body, scheduled).await;
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
        let rec = metrics::record(p.id, scheduled - start, &obs, p.input_tokens, p.max_tokens);
        self.counters.done.fetch_add(1, Ordering::Relaxed);
        if !rec.ok {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        rec
    }
}

/// Runs `load` over dataset indices `first..`, within `bounds`.
pub async fn run(shared: &Shared, load: Load, bounds: Bounds, first: usize) -> RunResult {
    let start = Instant::now();
    let records = match load {
        Load::Closed { concurrency } => closed(shared, concurrency, bounds, first, start).await,
        Load::Open {
            rate,
            arrival,
            max_concurrency,
        } => {
            let n = match (bounds.requests, bounds.duration) {
                (Some(n), _) => n,
                // Enough offsets to outlast the duration at any plausible draw.
                (None, Some(d)) => (rate * d.as_secs_f64() * 1.5) as usize + 100,
                (None, None) => unreachable!("config requires requests or duration"),
            };
            let seed = shared.seed ^ 0xA5A5_0000;
            let offsets = schedule::offsets(n, rate, arrival, seed);
            open(shared, offsets, max_concurrency, bounds, first, start).await
        }
        Load::Burst { max_concurrency } => {
            let n = bounds.requests.unwrap_or(usize::MAX);
            let n = shared
                .dataset
                .len()
                .map_or(n, |len| n.min(len.saturating_sub(first)));
            let offsets = vec![Duration::ZERO; n];
            open(shared, offsets, max_concurrency, bounds, first, start).await
        }
        Load::Trace {
            time_scale,
            max_concurrency,
        } => {
            let len = shared.dataset.len().unwrap_or(0).saturating_sub(first);
            let n = bounds.requests.map_or(len, |r| r.min(len));
            let times: Vec<f64> = (first..first + n)
                .map(|i| {
                    shared
                        .dataset
                        .get(i)
                        .and_then(|s| s.trace_time_s)
                        .unwrap_or(0.0)
                })
                .collect();
            let offsets = schedule::from_trace(&times, time_scale);
            open(shared, offsets, max_concurrency, bounds, first, start).await
        }
    };
    let end = records
        .iter()
        .map(|r| Duration::from_secs_f64(r.scheduled_s + r.e2el_ms / 1e3))
        .max()
        .unwrap_or_default();
    RunResult {
        records,
        duration: end,
    }
}

async fn closed(
    shared: &Shared,
    concurrency: usize,
    bounds: Bounds,
    first: usize,
    start: Instant,
) -> Vec<Record> {
    let next = Arc::new(AtomicU64::new(first as u64));
    let limit = bounds.requests.map(|n| (first + n) as u64);
    let mut set = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (shared, next) = (shared.clone(), next.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            loop {
                if shared.stop.is_set() || bounds.duration.is_some_and(|d| start.elapsed() >= d) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if limit.is_some_and(|l| i >= l) {
                    break;
                }
                let Some((p, _)) = shared.prepare(i as usize) else {
                    break;
                };
                // One clock reading both bounds the run and schedules the request, so nothing
                // is scheduled past `--duration` however long preparing it took.
                let now = Instant::now();
                if bounds.duration.is_some_and(|d| now - start >= d) {
                    break;
                }
                out.push(shared.fire(p, start, now).await);
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.expect("worker does not panic"));
    }
    all.sort_by_key(|r| r.id);
    all
}

async fn open(
    shared: &Shared,
    offsets: Vec<Duration>,
    max_concurrency: Option<usize>,
    bounds: Bounds,
    first: usize,
    start: Instant,
) -> Vec<Record> {
    let sem = max_concurrency.map(|n| Arc::new(Semaphore::new(n.max(1))));
    let mut set = JoinSet::new();
    for (k, off) in offsets.into_iter().enumerate() {
        if bounds.duration.is_some_and(|d| off > d) {
            break;
        }
        let Some((p, _)) = shared.prepare(first + k) else {
            break;
        };
        let due = start + off;
        tokio::select! {
            biased;
            _ = shared.stop.wait() => break,
            _ = tokio::time::sleep_until(due.into()) => {}
        }
        let (shared, sem) = (shared.clone(), sem.clone());
        set.spawn(async move {
            // Waiting for a slot counts: the clock started at `due`.
            let _permit = match &sem {
                Some(s) => Some(s.clone().acquire_owned().await.expect("never closed")),
                None => None,
            };
            shared.fire(p, start, due).await
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.push(r.expect("request task does not panic"));
    }
    all.sort_by_key(|r| r.id);
    all
}

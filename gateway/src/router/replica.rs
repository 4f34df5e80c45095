//! [`Replica`]: one remote replica as the router sees it — its HTTP client, the gateway's
//! in-flight count there, its last polled load, its health, and the models it serves — and the
//! two background tasks that keep those current: the metrics poller (every
//! `poll_interval`) and the health checker (every `health_interval`, which also refreshes the
//! model list). Both hold only a `Weak` reference and are aborted when the replica leaves.
//!
//! Every change that may give a replica room — a poll, a health verdict, a model list, a
//! request of the gateway's ending there — wakes the router's queues (`wake`), so a waiting
//! request is bound the moment a replica can take it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::metrics::RouterMetrics;
use crate::router::health::{Health, Transition};
use crate::router::load::{parse_capacity, parse_metrics, Signals};
use crate::router::remote::{RemoteBackend, RemoteError, ReplicaUrl};
use crate::router::RouterConfig;

/// Largest `/metrics` or `/v1/models` answer read.
const MAX_SMALL_BODY: usize = 4 << 20;

/// A model a replica serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    pub id: String,
    pub max_model_len: Option<usize>,
    /// The replica refuses longer prompts (`--max-prompt-tokens`); `None`: it takes any
    /// prompt within the context.
    pub max_prompt_tokens: Option<usize>,
}

impl ServedModel {
    /// The longest prompt the replica takes: its prompt bound or context, whichever is
    /// shorter; `None` when it reports neither.
    pub fn longest_prompt(&self) -> Option<usize> {
        match (self.max_prompt_tokens, self.max_model_len) {
            (Some(p), Some(c)) => Some(p.min(c)),
            (p, c) => p.or(c),
        }
    }
}

#[derive(Debug)]
pub struct Replica {
    pub backend: RemoteBackend,
    in_flight: AtomicUsize,
    signals: Mutex<Signals>,
    health: Mutex<Health>,
    models: RwLock<Arc<Vec<ServedModel>>>,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Left the set: its per-replica series are gone and must not be recreated.
    stopped: AtomicBool,
    metrics: RouterMetrics,
    /// The router's queues, woken on every change here.
    wake: Arc<Notify>,
}

impl Replica {
    /// Creates the replica and starts its poller and health checker.
    pub fn start(
        url: ReplicaUrl,
        cfg: &Arc<RouterConfig>,
        metrics: RouterMetrics,
        wake: Arc<Notify>,
    ) -> Arc<Self> {
        let r = Arc::new(Self {
            backend: RemoteBackend::new(url, &cfg.remote),
            in_flight: AtomicUsize::new(0),
            signals: Mutex::new(Signals::Unknown {
                since: Instant::now(),
            }),
            health: Mutex::new(Health::new(cfg.ejection)),
            models: RwLock::default(),
            tasks: Mutex::default(),
            stopped: AtomicBool::new(false),
            metrics,
            wake,
        });
        r.metrics.eligible.with_label_values(&[r.label()]).set(0);
        r.metrics
            .replica_in_flight
            .with_label_values(&[r.label()])
            .set(0);
        let poller = tokio::spawn(poll_loop(Arc::downgrade(&r), cfg.clone()));
        let checker = tokio::spawn(health_loop(Arc::downgrade(&r), cfg.clone()));
        *r.tasks.lock().unwrap() = vec![poller.abort_handle(), checker.abort_handle()];
        r
    }

    pub fn url(&self) -> &ReplicaUrl {
        self.backend.url()
    }

    fn label(&self) -> &str {
        self.url().as_str()
    }

    /// Stops the background tasks and drops the replica's series.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
        let l = self.label();
        let m = &self.metrics;
        let _ = m.eligible.remove_label_values(&[l]);
        let _ = m.replica_in_flight.remove_label_values(&[l]);
        for signal in ["waiting", "running", "kv_usage", "score"] {
            let _ = m.replica_load.remove_label_values(&[l, signal]);
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn serves(&self, model: &str) -> bool {
        self.models.read().unwrap().iter().any(|m| m.id == model)
    }

    pub fn models(&self) -> Arc<Vec<ServedModel>> {
        self.models.read().unwrap().clone()
    }

    /// The longest prompt of `model` this replica takes (`ServedModel::longest_prompt`);
    /// `usize::MAX` while it reports no bound (or does not serve the model).
    pub fn longest_prompt(&self, model: &str) -> usize {
        self.models
            .read()
            .unwrap()
            .iter()
            .find(|m| m.id == model)
            .and_then(ServedModel::longest_prompt)
            .unwrap_or(usize::MAX)
    }

    pub fn eligible(&self, now: Instant) -> bool {
        self.health.lock().unwrap().eligible(now)
    }

    pub fn score(&self, now: Instant, stale_after: Duration) -> f64 {
        let s = *self.signals.lock().unwrap();
        s.score(self.in_flight(), now, stale_after)
    }

    /// Whether one more request would start here at once (`load::Signals::room`), within
    /// `hard_cap` requests of the gateway's in flight.
    pub fn has_room(&self, now: Instant, stale_after: Duration, hard_cap: usize) -> bool {
        let in_flight = self.in_flight();
        let s = *self.signals.lock().unwrap();
        in_flight < hard_cap && s.room(in_flight, now, stale_after)
    }

    /// Counts a request in flight here until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlightHere {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let counted = !self.stopped.load(Ordering::Acquire);
        if counted {
            self.metrics
                .replica_in_flight
                .with_label_values(&[self.label()])
                .inc();
        }
        InFlightHere {
            replica: self.clone(),
            counted,
        }
    }

    pub fn success(&self) {
        self.health.lock().unwrap().success();
    }

    /// A failed request; may eject the replica.
    pub fn failure(&self) {
        let t = self.health.lock().unwrap().failure(Instant::now());
        if let Transition::Ejected(period) = t {
            tracing::warn!(replica = %self.url(), ?period, "replica ejected after consecutive failures");
            self.metrics
                .ejections
                .with_label_values(&[self.label()])
                .inc();
        }
    }

    async fn poll(&self, cfg: &RouterConfig) {
        let in_flight_at_poll = self.in_flight();
        let res = self
            .backend
            .get("/metrics", cfg.stale_after, MAX_SMALL_BODY)
            .await;
        let now = Instant::now();
        let next = match res {
            Ok(body) => {
                let text = String::from_utf8_lossy(&body);
                let polled = parse_metrics(&text);
                if polled.is_empty() {
                    Signals::Absent
                } else {
                    Signals::Fresh {
                        polled,
                        capacity: parse_capacity(&text),
                        at: now,
                        in_flight_at_poll,
                    }
                }
            }
            // No metrics endpoint at all: route by in-flight counts.
            Err(RemoteError::Status {
                status:
                    StatusCode::NOT_FOUND | StatusCode::NOT_IMPLEMENTED | StatusCode::METHOD_NOT_ALLOWED,
                ..
            }) => Signals::Absent,
            Err(e) => {
                tracing::debug!("polling metrics: {e}");
                *self.signals.lock().unwrap()
            }
        };
        *self.signals.lock().unwrap() = next;
        self.wake.notify_waiters();
        let l = self.label();
        let m = &self.metrics.replica_load;
        if let Signals::Fresh { polled, .. } = next {
            m.with_label_values(&[l, "waiting"])
                .set(polled.waiting.unwrap_or(0.0));
            m.with_label_values(&[l, "running"])
                .set(polled.running.unwrap_or(0.0));
            m.with_label_values(&[l, "kv_usage"])
                .set(polled.kv_usage.unwrap_or(0.0));
        }
        m.with_label_values(&[l, "score"])
            .set(self.score(now, cfg.stale_after));
        self.metrics
            .eligible
            .with_label_values(&[l])
            .set(self.eligible(now) as i64);
    }

    async fn check(&self, cfg: &RouterConfig, refresh_models: bool) {
        // As patient as the interval, within Kubernetes' default probe timeout (1 s) and 5 s:
        // checks run one after another, so a slow answer delays the next check rather than
        // overlapping it, and a replica whose serving threads are busy computing (a CPU
        // replica on a small machine) can take a few hundred milliseconds to answer while
        // being perfectly healthy. A dead process refuses the connection at once whatever
        // the timeout.
        let timeout = cfg
            .health_interval
            .clamp(Duration::from_secs(1), Duration::from_secs(5));
        let ok = match self
            .backend
            .get(&cfg.health_path, timeout, MAX_SMALL_BODY)
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!("health check: {e}");
                false
            }
        };
        let stale_models = self.models.read().unwrap().is_empty();
        if ok && (refresh_models || stale_models) {
            match self
                .backend
                .get("/v1/models", timeout, MAX_SMALL_BODY)
                .await
            {
                Ok(body) => match serde_json::from_slice::<ModelList>(&body) {
                    Ok(list) => {
                        let models = list
                            .data
                            .into_iter()
                            .map(|m| ServedModel {
                                id: m.id,
                                max_model_len: m.max_model_len.filter(|&n| n > 0),
                                max_prompt_tokens: m.max_prompt_tokens.filter(|&n| n > 0),
                            })
                            .collect();
                        *self.models.write().unwrap() = Arc::new(models);
                    }
                    Err(e) => tracing::warn!(replica = %self.url(), "unreadable /v1/models: {e}"),
                },
                Err(e) => tracing::debug!("listing models: {e}"),
            }
        }
        let t = self.health.lock().unwrap().checked(ok);
        match t {
            Transition::Up => tracing::info!(replica = %self.url(), "replica up"),
            Transition::Down => {
                tracing::warn!(replica = %self.url(), "replica down: health check failed")
            }
            _ => {}
        }
        self.wake.notify_waiters();
        self.metrics
            .eligible
            .with_label_values(&[self.label()])
            .set(self.eligible(Instant::now()) as i64);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().unwrap().drain(..) {
            t.abort();
        }
    }
}

#[derive(Debug, Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Debug, Deserialize)]
struct ModelEntry {
    id: String,
    #[serde(default)]
    max_model_len: Option<usize>,
    #[serde(default)]
    max_prompt_tokens: Option<usize>,
}

/// A request in flight on a replica; dropping it (the response ended) counts it out.
#[derive(Debug)]
pub struct InFlightHere {
    replica: Arc<Replica>,
    /// Counted in the replica's gauge (it had not left the set).
    counted: bool,
}

impl InFlightHere {
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }
}

impl Drop for InFlightHere {
    fn drop(&mut self) {
        let r = &self.replica;
        r.in_flight.fetch_sub(1, Ordering::Relaxed);
        // A replica that has left the set has no series to update (removing them while
        // requests finish would otherwise recreate them).
        if self.counted && !r.stopped.load(Ordering::Acquire) {
            r.metrics
                .replica_in_flight
                .with_label_values(&[r.label()])
                .dec();
        }
        r.wake.notify_waiters();
    }
}

async fn poll_loop(replica: Weak<Replica>, cfg: Arc<RouterConfig>) {
    let mut tick = tokio::time::interval(cfg.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(r) = replica.upgrade() else { return };
        r.poll(&cfg).await;
    }
}

async fn health_loop(replica: Weak<Replica>, cfg: Arc<RouterConfig>) {
    let mut tick = tokio::time::interval(cfg.health_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        let Some(r) = replica.upgrade() else { return };
        // The model list changes rarely: refresh it every tenth check.
        r.check(&cfg, n.is_multiple_of(10)).await;
        n += 1;
    }
}

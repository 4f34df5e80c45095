//! Routing across remote replicas: which replicas exist (fed by `crate::discovery`), which may
//! take a request now, which one gets it, and retrying elsewhere before the first byte.
//!
//! - [`remote`]: one replica's pooled HTTP client ([`remote::RemoteBackend`]) and its URL.
//! - [`sluice_conn`] (a crate of its own, shared with the load tester): connections that tell
//!   a request lost to keep-alive reuse from a failed one.
//! - [`replica`]: one replica's client, in-flight count, polled load, health and models, and
//!   the tasks that poll them.
//! - [`load`]: parsing vLLM-named load series and turning them into a score.
//! - [`health`]: passive outlier ejection and active health-check state.
//! - [`policy`]: round-robin, least-load (the minimum, ties at random), prefix-affinity (bounded load).
//! - [`affinity`]: affinity keys from prompt prefixes and sessions; rendezvous hashing.
//! - [`bounds`]: which replicas take a prompt of a given length (their
//!   `--max-prompt-tokens`), and retrying a too-long refusal on one that takes longer.
//! - [`queue`]: each model's queue in the gateway: a request waits there until a replica
//!   has room for it (late binding) or, with no ready replica at all, is held.
//! - [`dispatch`]: one request's attempts: bind, send, wait for the first byte, retry.
//!
//! The set of replicas is the union of what each discovery source last reported; a source
//! replaces only its own part. A replica leaving the set stops being picked at once; requests
//! already on it finish (they hold the replica until their response ends). Sources also report
//! model names, known even while no replica serves them (a pool at zero): such a model is
//! listed, and its requests are held until a replica of it is ready.

pub mod affinity;
pub mod bounds;
pub mod dispatch;
pub mod health;
pub mod load;
pub mod policy;
pub mod queue;
pub mod remote;
pub mod replica;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::metrics::RouterMetrics;
use crate::router::remote::{RemoteOptions, ReplicaUrl};
use health::EjectionPolicy;
use policy::{Candidate, Key, Policy, Reason};
use queue::ModelQueue;
use replica::{Replica, ServedModel};

/// When a request is bound to a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// As soon as a ready replica serving its model is below `replica_max_in_flight`: the
    /// request then waits in that replica's own queue.
    Early,
    /// When a replica has room for it (`load::Signals::room`): it waits in the gateway's queue
    /// until then, so a replica that becomes ready takes the backlog.
    Late,
}

impl Binding {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "early" => Ok(Self::Early),
            "late" => Ok(Self::Late),
            _ => Err(format!("--binding: '{s}' is not early or late")),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Early => "early",
            Self::Late => "late",
        }
    }
}

/// How the router behaves; validated from `sluice serve` flags.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub policy: Policy,
    /// How often each replica's `/metrics` is read.
    pub poll_interval: Duration,
    /// Metrics older than this count as saturated.
    pub stale_after: Duration,
    pub health_interval: Duration,
    pub health_path: String,
    /// Time allowed for a replica's first byte (for a non-streaming request, its whole answer).
    pub upstream_timeout: Duration,
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    /// First retry's backoff; doubles per retry, jittered ±50%.
    pub backoff: Duration,
    /// Requests in flight per replica beyond which it is not picked.
    pub replica_max_in_flight: usize,
    /// Prefix-affinity's bounded load: the owner is skipped when its score exceeds the least
    /// loaded candidate's by more than this.
    pub affinity_threshold: f64,
    pub affinity_prefix_bytes: usize,
    pub ejection: EjectionPolicy,
    pub remote: RemoteOptions,
    pub binding: Binding,
    /// Requests each model's queue holds beyond the one being bound.
    pub max_queue: usize,
    /// The longest a request waits for room while replicas of its model are ready.
    pub queue_timeout: Duration,
    /// Queued longer than this, a request yields to those that can still meet it (the TTFT
    /// target; see `crate::admission`); `None`: fair order only.
    pub queue_late_after: Option<Duration>,
    /// The longest a request is held while no replica of its model is ready.
    pub hold_timeout: Duration,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            policy: Policy::PrefixAffinity,
            poll_interval: Duration::from_millis(200),
            stale_after: Duration::from_secs(1),
            health_interval: Duration::from_secs(1),
            health_path: "/health".into(),
            upstream_timeout: Duration::from_secs(60),
            max_attempts: 3,
            backoff: Duration::from_millis(10),
            replica_max_in_flight: 256,
            affinity_threshold: 4.0,
            affinity_prefix_bytes: 512,
            ejection: EjectionPolicy::default(),
            remote: RemoteOptions::default(),
            binding: Binding::Late,
            max_queue: 1024,
            queue_timeout: Duration::from_secs(30),
            queue_late_after: None,
            hold_timeout: Duration::from_secs(60),
        }
    }
}

/// Why no replica could be picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoPick {
    /// No known replica serves the model.
    UnknownModel,
    /// Replicas serve it but none is healthy now.
    NoneHealthy,
    /// Healthy replicas serve it, all at their concurrency cap.
    AllAtCap,
}

/// One discovery source's last report.
#[derive(Debug, Default)]
struct Report {
    urls: BTreeSet<ReplicaUrl>,
    models: BTreeSet<String>,
}

#[derive(Debug)]
pub struct Router {
    cfg: Arc<RouterConfig>,
    metrics: RouterMetrics,
    sources: Mutex<Vec<Report>>,
    replicas: RwLock<Arc<HashMap<ReplicaUrl, Arc<Replica>>>>,
    turn: AtomicUsize,
    /// Woken on every change that may let a waiting request be bound.
    wake: Arc<Notify>,
    queues: Mutex<HashMap<String, Arc<ModelQueue>>>,
}

impl Router {
    pub fn new(cfg: RouterConfig, metrics: RouterMetrics) -> Arc<Self> {
        Arc::new(Self {
            cfg: Arc::new(cfg),
            metrics,
            sources: Mutex::default(),
            replicas: RwLock::default(),
            turn: AtomicUsize::new(0),
            wake: Arc::default(),
            queues: Mutex::default(),
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    /// A slot for one discovery source's reports.
    pub fn add_source(&self) -> usize {
        let mut s = self.sources.lock().unwrap();
        s.push(Report::default());
        s.len() - 1
    }

    /// Replaces source `source`'s model names: models known even with no replica serving them.
    pub fn set_source_models(&self, source: usize, models: BTreeSet<String>) {
        let mut sources = self.sources.lock().unwrap();
        if sources[source].models != models {
            tracing::info!(?models, "models announced");
            sources[source].models = models;
            self.wake.notify_waiters();
        }
    }

    /// Models some discovery source names.
    pub fn known_models(&self) -> BTreeSet<String> {
        let sources = self.sources.lock().unwrap();
        sources
            .iter()
            .flat_map(|s| s.models.iter().cloned())
            .collect()
    }

    /// Replaces source `source`'s replicas; starts new replicas, stops departed ones. Must run
    /// inside the tokio runtime (replicas start tasks).
    pub fn set_source(&self, source: usize, urls: BTreeSet<ReplicaUrl>) {
        let mut sources = self.sources.lock().unwrap();
        if sources[source].urls == urls {
            return;
        }
        sources[source].urls = urls;
        let want: BTreeSet<&ReplicaUrl> = sources.iter().flat_map(|s| &s.urls).collect();
        let current = self.replicas.read().unwrap().clone();
        let mut next = HashMap::with_capacity(want.len());
        for url in want {
            let r = match current.get(url) {
                Some(r) => r.clone(),
                None => {
                    tracing::info!(replica = %url, "replica added");
                    Replica::start(
                        url.clone(),
                        &self.cfg,
                        self.metrics.clone(),
                        self.wake.clone(),
                    )
                }
            };
            next.insert(url.clone(), r);
        }
        for (url, r) in current.iter() {
            if !next.contains_key(url) {
                tracing::info!(replica = %url, "replica removed");
                r.stop();
            }
        }
        *self.replicas.write().unwrap() = Arc::new(next);
        self.wake.notify_waiters();
    }

    pub fn replicas(&self) -> Arc<HashMap<ReplicaUrl, Arc<Replica>>> {
        self.replicas.read().unwrap().clone()
    }

    /// Whether any replica may take requests now.
    pub fn any_eligible(&self) -> bool {
        let now = Instant::now();
        self.replicas().values().any(|r| r.eligible(now))
    }

    /// Every model some healthy replica serves (the largest context length any reports, and
    /// the largest prompt bound while every one has a bound), and every model a discovery
    /// source names (no context length while no replica reports one).
    pub fn models(&self) -> Vec<ServedModel> {
        let now = Instant::now();
        let mut out: Vec<ServedModel> = Vec::new();
        for r in self.replicas().values().filter(|r| r.eligible(now)) {
            for m in r.models().iter() {
                match out.iter_mut().find(|o| o.id == m.id) {
                    Some(o) => {
                        o.max_model_len = o.max_model_len.max(m.max_model_len);
                        o.max_prompt_tokens = o
                            .max_prompt_tokens
                            .zip(m.max_prompt_tokens)
                            .map(|(a, b)| a.max(b));
                    }
                    None => out.push(m.clone()),
                }
            }
        }
        for id in self.known_models() {
            if !out.iter().any(|o| o.id == id) {
                out.push(ServedModel {
                    id,
                    max_model_len: None,
                    max_prompt_tokens: None,
                });
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The longest prompt some healthy replica of `model` takes (its `--max-prompt-tokens`
    /// or its context), when every one of them reports one; `None` when one takes any
    /// prompt or none is healthy.
    pub fn prompt_bound(&self, model: &str) -> Option<usize> {
        let now = Instant::now();
        self.replicas()
            .values()
            .filter(|r| r.serves(model) && r.eligible(now))
            .map(|r| r.longest_prompt(model))
            .max()
            .filter(|&b| b < usize::MAX)
    }

    /// Whether requests for `model` are routed: a replica serves it, or a source names it.
    pub fn serves(&self, model: &str) -> bool {
        self.replicas().values().any(|r| r.serves(model))
            || self
                .sources
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.models.contains(model))
    }

    /// Whether a replica serving `model` may take requests now.
    pub fn ready_for(&self, model: &str, now: Instant) -> bool {
        self.replicas()
            .values()
            .any(|r| r.serves(model) && r.eligible(now))
    }

    /// Picks a replica for `model` that takes a prompt of `tokens` tokens (`bounds::taking`),
    /// avoiding `tried` while others are available.
    pub fn pick(
        &self,
        model: &str,
        key: Option<Key>,
        tried: &[ReplicaUrl],
        tokens: Option<usize>,
    ) -> Result<(Arc<Replica>, Reason), NoPick> {
        let now = Instant::now();
        let all = self.replicas();
        let serving: Vec<&Arc<Replica>> = all.values().filter(|r| r.serves(model)).collect();
        if serving.is_empty() {
            return Err(NoPick::UnknownModel);
        }
        let healthy: Vec<&Arc<Replica>> = serving.into_iter().filter(|r| r.eligible(now)).collect();
        if healthy.is_empty() {
            return Err(NoPick::NoneHealthy);
        }
        let open: Vec<&Arc<Replica>> = bounds::taking(healthy, model, tokens)
            .into_iter()
            .filter(|r| r.in_flight() < self.cfg.replica_max_in_flight)
            .collect();
        if open.is_empty() {
            return Err(NoPick::AllAtCap);
        }
        let untried: Vec<&Arc<Replica>> = open
            .iter()
            .copied()
            .filter(|r| !tried.contains(r.url()))
            .collect();
        let pool = if untried.is_empty() { open } else { untried };
        Ok(self.choose(&pool, key, now))
    }

    /// The policy's choice among `pool` (not empty), counted in the decisions metric.
    fn choose(
        &self,
        pool: &[&Arc<Replica>],
        key: Option<Key>,
        now: Instant,
    ) -> (Arc<Replica>, Reason) {
        let cands: Vec<Candidate<'_>> = pool
            .iter()
            .map(|r| Candidate {
                url: r.url(),
                score: r.score(now, self.cfg.stale_after),
            })
            .collect();
        let (i, reason) = policy::choose(
            self.cfg.policy,
            &cands,
            key,
            self.cfg.affinity_threshold,
            &self.turn,
            &mut rand::rng(),
        )
        .expect("candidates are not empty");
        self.metrics
            .decisions
            .with_label_values(&[self.cfg.policy.label(), reason.label()])
            .inc();
        (pool[i].clone(), reason)
    }

    /// Stops every replica's tasks.
    pub fn shutdown(&self) {
        for r in self.replicas().values() {
            r.stop();
        }
    }
}

//! The Kubernetes controller behind `sluice-autoscaler run`: it applies the same policy the
//! simulator runs to the Deployments and node pools a `ServingPool` names.
//!
//! # Layout
//! - [`cli`]: the `run` flags, validated into a [`Config`].
//! - [`lease`]: leader election on a `coordination.k8s.io/v1` Lease.
//! - [`observe`]: Deployments, pods, nodes and endpoints of one pool.
//! - [`source`]: the [`SignalSource`](source::SignalSource) trait the load comes through;
//!   [`scraped`]: that trait over `crate::scrape` (shared with local mode); [`prometheus`]:
//!   over a Prometheus HTTP API.
//! - [`gateway`]: what the routing gateway holds for a pool's model (waking a pool at zero).
//! - [`allocate`]: the policy's targets spread over the pool's variants, with fallback.
//! - [`reconcile`]: one pass over one pool (decide, scale, node pools, status, Events).
//! - [`status`]: conditions and their transition times.
//! - [`metrics`]: `sluice_autoscaler_*` and `/healthz`.
//! - [`error`]: the controller's error type.
//!
//! [`Controller::run`] is the loop: while it holds the Lease it reconciles every pool each
//! period and at once when a `ServingPool` or a Node changes (a Spot reclaim must not wait
//! for the period); a pool whose reconcile fails is retried with exponential back-off. A
//! standby renews nothing and forgets its per-pool memory, so on taking over it starts from
//! the cluster as it is.

pub mod allocate;
pub mod cli;
pub mod error;
pub mod gateway;
pub mod lease;
pub mod metrics;
pub mod observe;
pub mod prometheus;
pub mod reconcile;
pub mod report;
pub mod scraped;
pub mod source;
pub mod status;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use tokio::sync::Notify;

use crate::crd::ServingPool;
use error::{Error, Result};
use lease::LeaseLock;
pub use reconcile::{Context, Outcomes, PoolState};

/// How the loop runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Watch one namespace, or all.
    pub namespace: Option<String>,
    /// Reconcile every pool this often.
    pub period: Duration,
    /// Leader election; `None` acts alone.
    pub lease: Option<LeaseConfig>,
    /// First retry delay after a failed reconcile, doubling up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

/// Where the Lease is and who is asking.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a holder's renewal keeps others out.
    pub duration: Duration,
    /// How often a standby checks the Lease.
    pub retry: Duration,
}

/// The controller: shared context plus each pool's memory.
#[derive(Debug)]
pub struct Controller {
    ctx: Context,
    config: Config,
    pools: HashMap<String, PoolState>,
    /// Pool → (next attempt, consecutive failures).
    backoff: HashMap<String, (f64, u32)>,
    started: Instant,
}

impl Controller {
    pub fn new(ctx: Context, config: Config) -> Self {
        Controller {
            ctx,
            config,
            pools: HashMap::new(),
            backoff: HashMap::new(),
            started: Instant::now(),
        }
    }

    /// Reconciles every `ServingPool` at `now_s`; each pool's result, keyed `namespace/name`.
    /// A pool still backing off after a failure is skipped.
    pub async fn reconcile_all(&mut self, now_s: f64) -> Result<Vec<(String, Result<Outcomes>)>> {
        let api: Api<ServingPool> = match &self.config.namespace {
            Some(ns) => Api::namespaced(self.ctx.client.clone(), ns),
            None => Api::all(self.ctx.client.clone()),
        };
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list servingpools"))?;
        let mut out = Vec::new();
        let mut present = Vec::new();
        for pool in list.items {
            let ns = pool.namespace().unwrap_or_default();
            let key = format!("{ns}/{}", pool.name_any());
            present.push(key.clone());
            if self
                .backoff
                .get(&key)
                .is_some_and(|&(next, _)| now_s < next)
            {
                continue;
            }
            let t0 = Instant::now();
            let r = self.reconcile_one(&key, &pool, now_s).await;
            self.ctx
                .metrics
                .reconcile_duration
                .with_label_values(&[ns.as_str(), pool.name_any().as_str()])
                .observe(t0.elapsed().as_secs_f64());
            match &r {
                Ok(_) => {
                    self.backoff.remove(&key);
                }
                Err(e) => self.failed(&key, &pool, e, now_s).await,
            }
            out.push((key, r));
        }
        self.pools.retain(|k, _| present.contains(k));
        self.backoff.retain(|k, _| present.contains(k));
        Ok(out)
    }

    async fn reconcile_one(
        &mut self,
        key: &str,
        pool: &ServingPool,
        now_s: f64,
    ) -> Result<Outcomes> {
        if !self.pools.contains_key(key) {
            self.pools.insert(key.to_string(), PoolState::new(pool)?);
        }
        let state = self.pools.get_mut(key).expect("inserted above");
        reconcile::reconcile(&self.ctx, state, pool, now_s).await
    }

    /// Counts a failure, schedules the retry, and tells the pool's owner (Event, condition).
    async fn failed(&mut self, key: &str, pool: &ServingPool, e: &Error, now_s: f64) {
        let ns = pool.namespace().unwrap_or_default();
        self.ctx
            .metrics
            .reconcile_errors
            .with_label_values(&[ns.as_str(), pool.name_any().as_str(), e.metric_label()])
            .inc();
        let failures = self.backoff.get(key).map_or(0, |&(_, n)| n) + 1;
        let delay = self
            .config
            .backoff_base
            .saturating_mul(1u32 << (failures - 1).min(16))
            .min(self.config.backoff_max);
        self.backoff
            .insert(key.to_string(), (now_s + delay.as_secs_f64(), failures));
        tracing::warn!(pool = %key, error = %e, retry_in_s = delay.as_secs_f64(), "reconcile failed");
        if self.ctx.dry_run {
            return;
        }
        let ev = Event {
            type_: EventType::Warning,
            reason: "ReconcileFailed".into(),
            note: Some(error_chain(e)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.ctx.recorder.publish(&ev, &pool.object_ref(&())).await {
            tracing::warn!(pool = %key, error = %err, "cannot record an event");
        }
        let api: Api<ServingPool> = Api::namespaced(self.ctx.client.clone(), &ns);
        if let Err(err) = api
            .patch_status(
                &pool.name_any(),
                &PatchParams::apply("sluice-autoscaler").force(),
                &Patch::Apply(report::failed_status(pool, e)),
            )
            .await
        {
            tracing::warn!(pool = %key, error = %err, "cannot write the failure to status");
        }
    }

    /// The controller's metrics (to serve them).
    pub fn metrics(&self) -> &metrics::Metrics {
        &self.ctx.metrics
    }

    /// Seconds on the controller's monotonic clock.
    pub fn now_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The loop, until `shutdown` resolves (then the Lease is released for a standby).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let changed = Arc::new(Notify::new());
        let mut watchers = Vec::new();
        let pools: Api<ServingPool> = match &self.config.namespace {
            Some(ns) => Api::namespaced(self.ctx.client.clone(), ns),
            None => Api::all(self.ctx.client.clone()),
        };
        watchers.push(tokio::spawn(poke_on_change(pools, changed.clone())));
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        watchers.push(tokio::spawn(poke_on_change(nodes, changed.clone())));
        let lease = self.config.lease.as_ref().map(|l| {
            LeaseLock::new(
                self.ctx.client.clone(),
                &l.namespace,
                &l.name,
                &l.identity,
                l.duration,
            )
        });
        tokio::pin!(shutdown);
        loop {
            self.ctx.metrics.beat();
            let leading = match &lease {
                None => true,
                Some(l) => l.try_acquire_or_renew().await.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "lease");
                    false
                }),
            };
            self.ctx.metrics.leader.set(i64::from(leading));
            let wait = if leading {
                let now = self.now_s();
                if let Err(e) = self.reconcile_all(now).await {
                    tracing::warn!(error = %e, "listing ServingPools");
                }
                self.config.period
            } else {
                self.pools.clear();
                self.backoff.clear();
                self.config
                    .lease
                    .as_ref()
                    .map_or(self.config.period, |l| l.retry)
            };
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(wait) => {}
                () = changed.notified(), if leading => {}
            }
        }
        for w in watchers {
            w.abort();
        }
        if let Some(l) = &lease {
            l.release().await?;
        }
        Ok(())
    }
}

/// Wakes the loop whenever an object of the watched kind changes.
async fn poke_on_change<K>(api: Api<K>, changed: Arc<Notify>)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures_util::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                changed.notify_one()
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "watch"),
        }
    }
}

fn error_chain(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// Re-exported so tests can build a [`Context`] without naming kube's module path.
pub use kube::runtime::events::{Recorder, Reporter};

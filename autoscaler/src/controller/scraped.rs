//! The controller's [`SignalSource`] over [`crate::scrape`] (shared with local mode): one
//! scraper per `ServingPool`, fed the pool's ready replica endpoints each reconcile, its
//! windows and SLO quantiles from the pool's spec.
//!
//! Only a fully fresh tick counts: if any target's scrape failed (timeout, HTTP error, not the
//! exposition format), or the pool has no ready endpoint to read, the answer is stale and the
//! controller holds every Deployment as it is, never scaling down on missing metrics.

use std::collections::HashMap;

use futures_util::future::BoxFuture;
use tokio::sync::Mutex;

use super::error::Result;
use super::source::{Load, Query, Reading, SignalSource, VariantLoad};
use crate::crd::ServingPoolSpec;
use crate::scrape::{Endpoint, ScrapeConfig, Scraper, TtftTarget};

/// Scrapers by pool (`namespace/name`), each keeping its targets' histories.
#[derive(Debug)]
pub struct PodScraper {
    config: ScrapeConfig,
    pools: Mutex<HashMap<String, Scraper>>,
}

/// The scrape configuration a pool's spec asks for: `base` (timeout) with the spec's windows,
/// metrics path, SLO quantiles and TTFT target.
pub fn pool_config(
    base: &ScrapeConfig,
    spec: &ServingPoolSpec,
    path: &str,
    ttft_target: TtftTarget,
) -> ScrapeConfig {
    ScrapeConfig {
        path: path.to_string(),
        window_s: spec.policy.window_seconds,
        short_window_s: spec.policy.short_window_seconds,
        latency_window_s: spec.policy.window_seconds,
        shape_window_s: spec.policy.shape_window_seconds,
        ttft_quantile: spec.slo.ttft.percentile / 100.0,
        tpot_quantile: spec.slo.tpot.percentile / 100.0,
        ttft_target: Some(ttft_target),
        ..base.clone()
    }
}

impl PodScraper {
    pub fn new(config: ScrapeConfig) -> Self {
        PodScraper {
            config,
            pools: Mutex::new(HashMap::new()),
        }
    }

    async fn load(&self, q: Query<'_>) -> Reading {
        let Some(first) = q.targets.first() else {
            return Reading::Stale("no ready replica endpoint to scrape".into());
        };
        let config = pool_config(&self.config, q.spec, &first.path, q.ttft_target);
        let mut pools = self.pools.lock().await;
        let scraper = pools
            .entry(q.pool.to_string())
            .or_insert_with(|| Scraper::new(config.clone()));
        if *scraper.config() != config {
            // The spec's windows or percentiles changed: start the histories afresh.
            tracing::info!(
                pool = q.pool,
                "scrape windows changed; restarting the histories"
            );
            *scraper = Scraper::new(config);
        }
        let ts: Vec<Endpoint> = q
            .targets
            .iter()
            .map(|t| Endpoint::replica(&t.profile_variant, t.capacity, &t.url))
            .collect();
        let obs = scraper.scrape(&ts, q.now_s).await;
        if obs.any_stale() {
            let mut why = Vec::new();
            for t in obs.targets.iter().filter(|t| t.is_stale()) {
                let error = t.error.as_deref().unwrap_or("");
                tracing::warn!(pool = q.pool, target = %t.target.url, error, "stale metrics");
                why.push(error.to_string());
            }
            return Reading::Stale(why.join("; "));
        }
        let variants = q
            .targets
            .iter()
            .filter_map(|t| {
                let l = obs.variants.get(&(t.profile_variant.clone(), t.capacity))?;
                Some((
                    t.variant.clone(),
                    VariantLoad {
                        running_per_replica: l.running_per_replica,
                        waiting_per_replica: l.waiting_per_replica,
                        kv_cache_usage: l.kv_cache_usage,
                        ttft_p99_s: l.ttft_p99_s,
                        tpot_p99_s: l.tpot_p99_s,
                    },
                ))
            })
            .collect();
        Reading::Fresh(Box::new(Load {
            arrivals: obs.arrivals,
            queue: obs.queue,
            latency: obs.latency,
            feasible_share: obs.latency_rule.target.map(|t| t.1),
            variants,
            front_door: None,
        }))
    }
}

impl SignalSource for PodScraper {
    fn read<'a>(&'a self, q: Query<'a>) -> BoxFuture<'a, Result<Reading>> {
        Box::pin(async move { Ok(self.load(q).await) })
    }
}

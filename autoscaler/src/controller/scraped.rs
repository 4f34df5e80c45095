//! The controller's [`SignalSource`] over [`crate::scrape`] (shared with local mode): one
//! scraper per `ServingPool`, fed the pool's ready replica endpoints each reconcile.
//!
//! Only a fully fresh tick counts: if any target's scrape failed (timeout, HTTP error, not the
//! exposition format), or the pool has no ready endpoint to read, the answer is `None` and the
//! controller holds every Deployment as it is, never scaling down on missing metrics.

use std::collections::HashMap;

use futures_util::future::BoxFuture;
use tokio::sync::Mutex;

use super::error::Result;
use super::source::{Load, ScrapeTarget, SignalSource, VariantLoad};
use crate::scrape::{ScrapeConfig, Scraper, Target};

/// Scrapers by pool (`namespace/name`), each keeping its targets' histories.
#[derive(Debug)]
pub struct PodScraper {
    config: ScrapeConfig,
    pools: Mutex<HashMap<String, Scraper>>,
}

impl PodScraper {
    pub fn new(config: ScrapeConfig) -> Self {
        PodScraper {
            config,
            pools: Mutex::new(HashMap::new()),
        }
    }

    async fn load(&self, pool: &str, targets: &[ScrapeTarget], now_s: f64) -> Option<Load> {
        if targets.is_empty() {
            return None;
        }
        let mut pools = self.pools.lock().await;
        let path = targets[0].path.clone();
        let scraper = pools.entry(pool.to_string()).or_insert_with(|| {
            Scraper::new(ScrapeConfig {
                path: path.clone(),
                ..self.config.clone()
            })
        });
        let ts: Vec<Target> = targets
            .iter()
            .map(|t| Target::replica(&t.profile_variant, t.capacity, &t.url))
            .collect();
        let obs = scraper.scrape(&ts, now_s).await;
        if obs.any_stale() {
            for t in obs.targets.iter().filter(|t| t.is_stale()) {
                tracing::warn!(pool, target = %t.target.url, error = t.error.as_deref().unwrap_or(""), "stale metrics");
            }
            return None;
        }
        let variants = targets
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
        Some(Load {
            arrivals: obs.arrivals,
            queue: obs.queue,
            latency: obs.latency,
            variants,
        })
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

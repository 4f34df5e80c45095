//! Where the controller's load figures come from, behind the [`SignalSource`] trait.
//!
//! The controller finds the replica pods (EndpointSlices of the pool's Service, each endpoint
//! mapped to its variant through its pod) and hands them to a source, which answers with the
//! pool's load: arrival rates, queue, latency, and per-variant figures. Scraping `/metrics`
//! and turning counters into rates over windows is `crate::scrape`'s job (shared with local
//! mode), adapted in [`super::scraped`]; tests use a source whose figures they set. A source answers `None` when it has no
//! fresh figures: the controller then holds the fleet as it is (never scales down on missing
//! metrics, as HPA does).

use std::collections::HashMap;

use futures_util::future::BoxFuture;

use super::error::Result;
use crate::signals::{Arrivals, Latency, Queue};

/// One replica pod to read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScrapeTarget {
    pub pod: String,
    /// The ServingPool variant (entry name) the pod belongs to.
    pub variant: String,
    /// That entry's profile variant and capacity type (the policy's key).
    pub profile_variant: String,
    pub capacity: crate::profile::CapacityType,
    /// `http://IP:PORT`.
    pub url: String,
    /// The metrics path (`/metrics`).
    pub path: String,
}

/// The pool's load at one time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    pub arrivals: Arrivals,
    pub queue: Queue,
    pub latency: Latency,
    /// Per ServingPool variant (entry name).
    pub variants: HashMap<String, VariantLoad>,
}

/// One variant's replicas, averaged over its ready pods.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VariantLoad {
    pub running_per_replica: f64,
    pub waiting_per_replica: f64,
    pub kv_cache_usage: f64,
    pub ttft_p99_s: Option<f64>,
    pub tpot_p99_s: Option<f64>,
}

/// Reads a pool's load.
pub trait SignalSource: Send + Sync + std::fmt::Debug {
    /// The load of the pool whose pods are `targets` (keyed by `pool`, `namespace/name`),
    /// at `now_s` on the controller's monotonic clock; `None` when no fresh figures exist.
    fn read<'a>(
        &'a self,
        pool: &'a str,
        targets: &'a [ScrapeTarget],
        now_s: f64,
    ) -> BoxFuture<'a, Result<Option<Load>>>;
}

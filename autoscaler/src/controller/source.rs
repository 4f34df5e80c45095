//! Where the controller's load figures come from, behind the [`SignalSource`] trait.
//!
//! The controller finds the replica pods (EndpointSlices of the pool's Service, each endpoint
//! mapped to its variant through its pod; or, for a Prometheus source, the variants' ready
//! pods) and hands them to a source, which answers with the pool's load: arrival rates, queue,
//! latency, and per-variant figures. Two sources ship, chosen per pool by `spec.signals`
//! ([`BySpec`]): scraping `/metrics` (`crate::scrape`, shared with local mode, adapted in
//! [`super::scraped`]) and a Prometheus HTTP API ([`super::prometheus`]); tests use a source
//! whose figures they set. A source answers [`Reading::Stale`] when it has no fresh figures:
//! the controller then holds the fleet as it is (never scales down on missing metrics, as HPA
//! does) and says why in the `MetricsStale` condition.

use std::collections::HashMap;

use futures_util::future::BoxFuture;

use sluice_policy::signals::{Arrivals, Latency, Queue};

use super::error::Result;
use crate::crd::ServingPoolSpec;
use crate::scrape::front_door::{FrontDoorWindows, LatencyRule};
use crate::scrape::TtftTarget;

/// One replica pod to read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReplicaPod {
    pub pod: String,
    /// The ServingPool variant (entry name) the pod belongs to.
    pub variant: String,
    /// That entry's profile variant and capacity type (the policy's key).
    pub profile_variant: String,
    pub capacity: sluice_policy::profile::CapacityType,
    /// `http://IP:PORT` when scraped; empty for a Prometheus source (it reads by pod name).
    pub url: String,
    /// The metrics path (`/metrics`); empty for a Prometheus source.
    pub path: String,
}

/// The pool's load at one time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Load {
    pub arrivals: Arrivals,
    pub queue: Queue,
    pub latency: Latency,
    /// The share of the latency window's prompts some variant serves alone within the TTFT
    /// target; `None` when none reached a replica.
    pub feasible_share: Option<f64>,
    /// Per ServingPool variant (entry name).
    pub variants: HashMap<String, VariantLoad>,
    /// The gateways' front door for the model (`crate::scrape::front_door`), not yet in the
    /// arrivals and latency above: the source's when it reads gateways, else the direct read
    /// of `spec.signals.gatewayUrl`; [`Load::fold_front_door`] folds it, once.
    pub front_door: Option<FrontDoorWindows>,
}

impl Load {
    /// The front door folded into the arrivals and latency (rates the larger of the two
    /// counts', first tokens the client's with every unserved request late), read at the
    /// SLO's TTFT quantile and against `ttft_target`; then gone, so nothing folds it twice.
    pub fn fold_front_door(&mut self, ttft_quantile: f64, ttft_target: TtftTarget) {
        let Some(door) = self.front_door.take() else {
            return;
        };
        let rule = LatencyRule {
            ttft_quantile,
            target: Some((ttft_target, self.feasible_share.unwrap_or(1.0))),
        };
        door.apply(&mut self.arrivals, &mut self.latency, &rule);
    }
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

/// What a source is asked: one pool's load now.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    /// `namespace/name`: a source keeps per-pool state under it.
    pub pool: &'a str,
    pub namespace: &'a str,
    /// The pool's spec: its signal source, windows (`policy`) and SLO percentiles.
    pub spec: &'a ServingPoolSpec,
    /// The pool's ready replica pods, each with its variant (and, when scraped, its URL).
    pub targets: &'a [ReplicaPod],
    /// Seconds on the controller's monotonic clock.
    pub now_s: f64,
    /// The pool's TTFT target and longest feasible prompt, for the attainment signal.
    pub ttft_target: TtftTarget,
}

/// A source's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    Fresh(Box<Load>),
    /// No fresh figures, and why (a target timed out, Prometheus is unreachable, a pod has no
    /// recent sample): the controller holds every variant as it is.
    Stale(String),
}

/// Reads a pool's load.
pub trait SignalSource: Send + Sync + std::fmt::Debug {
    /// The load of the pool `q` names. `Err` only for what retrying cannot fix by itself
    /// (a bad URL in the spec); everything transient is a [`Reading::Stale`].
    fn read<'a>(&'a self, q: Query<'a>) -> BoxFuture<'a, Result<Reading>>;
}

/// The source each pool's `spec.signals` names: its replicas' `/metrics` scraped directly, or
/// a Prometheus HTTP API.
#[derive(Debug)]
pub struct BySpec {
    pub scrape: Box<dyn SignalSource>,
    pub prometheus: Box<dyn SignalSource>,
}

impl SignalSource for BySpec {
    fn read<'a>(&'a self, q: Query<'a>) -> BoxFuture<'a, Result<Reading>> {
        if q.spec.signals.prometheus_url.is_some() {
            self.prometheus.read(q)
        } else {
            self.scrape.read(q)
        }
    }
}

//! `sluice-autoscaler`: how many replicas of each accelerator variant a model needs, and a
//! simulator that proves it on real traces.
//!
//! The policy is pure code: [`Signals`](signals::Signals) in, [`Decision`](decision::Decision)
//! out, through [`Policy::decide`](policy::Policy::decide). It sizes the fleet from demand at
//! the SLO — arrival rate, its trend, queue, latency — never from CPU, which says nothing about
//! a GPU inference server's load. An actuator applies the decision: the simulator's fleet model
//! here, the Kubernetes controller (Deployments' scale subresource, node pools) later, with the
//! same policy code.
//!
//! # Layout
//! - [`profile`]: variants from TOML (`profiles/`): GPUs per replica and node, the performance
//!   model (ITL = α + β·batch, prefill rate, KV), prices on demand and Spot, start-up time.
//! - [`signals`], [`decision`]: the policy's serde inputs and outputs, with reasons.
//! - [`capacity`]: what one replica serves at the SLO (largest batch meeting TPOT, bounded by
//!   KV, prefill's share of each step, the prefill queue against TTFT).
//! - [`mix`]: the cheapest mix of variants for a demand (exact small integer search) and gang
//!   packing of replicas onto nodes.
//! - [`forecast`]: Holt's linear trend over the start-up lead time.
//! - [`policy`]: the [`Policy`](policy::Policy) trait, shared planning, and [`policy::sluice`].
//! - [`baselines`]: HPA on CPU and on concurrency, Knative's KPA, static peak, the oracle.
//! - [`trace`]: Azure CSV and Mooncake JSONL traces, rate scaling, arrival timelines.
//! - [`sim`]: the discrete-event simulator (gateway queue, routing, replicas, nodes, Spot).
//! - [`scenario`]: the default scenario and running every policy side by side.
//! - [`report`], [`plot`]: the table, JSON and SVG.
//! - [`scrape`]: live signals from replicas' (and a gateway's) Prometheus `/metrics`.
//! - [`local`]: local mode — the policy driving `sluice serve` replica processes on this
//!   machine, announced to a routing gateway through a discovery file.
//! - [`error`]: the library's error type.
//! - [`crd`]: the `ServingPool` custom resource (`sluice.dev/v1alpha1`).
//! - [`controller`]: the Kubernetes controller (`sluice-autoscaler run`): leader election,
//!   reconcile, fallback by priority, stockouts, Spot, status, Events, its metrics.
//! - [`nodepool`]: node pools behind `NodePoolProvider` (`gke`, `provisioning-request`, none).

pub mod baselines;
pub mod capacity;
pub mod controller;
pub mod crd;
pub mod decision;
pub mod error;
pub mod forecast;
pub mod local;
pub mod mix;
pub mod nodepool;
pub mod plot;
pub mod policy;
pub mod profile;
pub mod report;
pub mod scenario;
pub mod scrape;
pub mod signals;
pub mod sim;
pub mod trace;

pub use error::{Error, Result};

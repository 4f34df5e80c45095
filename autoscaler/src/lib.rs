//! `sluice-autoscaler`: the `sluice-autoscaler` binary, and the actuators that apply the
//! `sluice-policy` decisions to real replicas.
//!
//! Two actuators share the policy and the scraper: the Kubernetes controller (`run`), which
//! scales `ServingPool`s' Deployments and node pools, and local mode (`run --local`), which
//! starts and stops `sluice serve` processes on this machine. The binary's `simulate`
//! subcommand runs `sluice-sim`.
//!
//! # Modules
//! - [`scrape`]: live signals from replicas' (and a gateway's) Prometheus `/metrics`.
//! - [`local`]: local mode — the policy driving `sluice serve` replica processes on this
//!   machine, announced to a routing gateway through a discovery file.
//! - [`crd`]: the `ServingPool` custom resource (`sluice.dev/v1alpha1`).
//! - [`controller`]: the Kubernetes controller (`sluice-autoscaler run`): leader election,
//!   reconcile, fallback by priority, stockouts, Spot, status, Events, its metrics.
//! - [`nodepool`]: node pools behind `NodePoolProvider` (`gke`, `provisioning-request`, none).

pub mod controller;
pub mod crd;
pub mod local;
pub mod nodepool;
pub mod scrape;

//! `sluice-policy`: how many replicas of each accelerator variant a model needs.
//!
//! The policy is pure code: [`Signals`](signals::Signals) in, [`Decision`](decision::Decision)
//! out, through [`Policy::decide`](policy::Policy::decide). It sizes the fleet from demand at
//! the SLO — arrival rate, its trend, queue, latency — never from CPU, which says nothing about
//! a GPU inference server's load. An actuator applies the decision: the simulator's fleet
//! (`sluice-sim`), or the Kubernetes controller and local mode (`sluice-autoscaler`), with the
//! same policy code. This crate does no I/O besides reading a profile file.
//!
//! # Modules
//! - [`profile`]: variants from TOML (`autoscaler/profiles/`): GPUs per replica and node, the
//!   performance model (ITL = α + β·batch, prefill rate, KV), prices on demand and Spot,
//!   start-up time.
//! - [`signals`], [`decision`]: the policy's serde inputs and outputs, with reasons.
//! - [`capacity`]: what one replica serves at the SLO (largest batch meeting TPOT, bounded by
//!   KV, prefill's share of each step, the prefill queue against TTFT).
//! - [`mix`]: the cheapest mix of variants for a demand (exact small integer search) and gang
//!   packing of replicas onto nodes.
//! - [`forecast`]: Holt's linear trend over the start-up lead time.
//! - [`headroom`]: a headroom learnt from the forecast's shortfalls over the start-up lead.
//! - [`payback`]: the scale-down window, lengthened by releases bought back within a start-up.
//! - [`policy`]: the [`Policy`](policy::Policy) trait, shared planning, and [`policy::sluice`].
//! - [`baselines`]: HPA on CPU and on concurrency, Knative's KPA, static peak, the oracle.
//! - [`timeline`]: requests and their arrivals in buckets, which the oracle and the
//!   static-peak sizing read.
//! - [`zero`]: whether an idle model may go to zero within its SLO's error budget.
//! - [`error`]: the crate's error type (profiles).

pub mod baselines;
pub mod capacity;
pub mod decision;
pub mod error;
pub mod forecast;
pub mod headroom;
pub mod mix;
pub mod payback;
pub mod policy;
pub mod profile;
pub mod signals;
pub mod timeline;
pub mod zero;

pub use error::{Error, Result};

//! `sluice-sim`: replays a request trace through a fleet model under each scaling policy and
//! compares them on cost and SLO.
//!
//! The policies come from `sluice-policy`; this crate is their actuator in simulated time. It
//! reads traces, runs the discrete-event fleet, and writes what happened as a table, JSON and
//! SVG. Everything is deterministic for a seed.
//!
//! # Modules
//! - [`trace`]: Azure CSV and Mooncake JSONL traces, rate scaling.
//! - [`feasibility`]: which requests any variant could serve within the SLO alone.
//! - [`oracle`]: the cheapest replica schedule a search over replays confirms meets the goal.
//! - [`sim`]: the discrete-event simulator (gateway queue, routing, replicas, nodes, Spot).
//! - [`scenario`]: the default scenario and running every policy side by side.
//! - [`suite`]: seeded synthetic trace families plus the shared traces, every policy over each.
//! - [`targets`]: a policy against the autoscaler's targets over the suite, trace by trace.
//! - [`seeds`]: the suite over several seeds: the mean and the worst draw per trace and
//!   policy, the targets seed by seed.
//! - [`zero`]: scale to zero: the cost a policy saves over idle periods against itself at
//!   min 1, and its cold starts.
//! - [`report`], [`plot`]: the table, JSON and SVG.
//! - [`error`]: the crate's error type.

pub mod error;
pub mod feasibility;
pub mod oracle;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod seeds;
pub mod sim;
pub mod suite;
pub mod targets;
pub mod trace;
pub mod zero;

pub use error::{Error, Result};

//! The [`Policy`] trait and the pieces every capacity-model policy shares.
//!
//! `Signals → Policy::decide → Decision`: a policy is a state machine fed one [`Signals`] per
//! tick. It keeps its own memory (forecaster, stabilisation history, panic deadline) and never
//! touches the fleet: an actuator (the simulator's fleet, the Kubernetes controller, local mode)
//! applies the [`Decision`].

pub mod plan;
pub mod sluice;

use crate::decision::Decision;
use crate::signals::Signals;

pub use plan::VariantLimits;
pub use sluice::{Sluice, SluiceConfig};

/// A scaling policy for one model.
pub trait Policy: std::fmt::Debug {
    /// The policy's name in reports (`sluice`, `hpa-cpu`, ...).
    fn name(&self) -> &str;
    /// One tick: what the fleet should be now.
    fn decide(&mut self, signals: &Signals) -> Decision;
}

#[cfg(test)]
mod tests;

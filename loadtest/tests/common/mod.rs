//! Shared harness for the integration tests.
pub mod closing;
pub mod fake;

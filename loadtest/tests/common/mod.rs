//! Shared harness for the integration tests.
pub mod fake;

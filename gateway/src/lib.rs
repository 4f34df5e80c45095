//! `sluice-gateway`: the sluice gateway library — who may send requests, how fast, and in what
//! order they reach the backends. The `sluice` binary (`main.rs`) puts HTTP in front of it.
//!
//! Nothing here speaks HTTP: each module takes plain values (a header string, an `Instant`, a
//! tenant) and returns typed errors whose messages are written for an OpenAI-style error body and
//! whose `metric_label()` names the rejection reason; the HTTP layer maps them to status codes in
//! one place.
//!
//! # Layout
//! - [`tenants`]: the `--api-keys` file (TOML or JSON), validated into [`tenants::Tenants`];
//!   `Authorization: Bearer` keys checked in constant time against stored SHA-256 digests.
//! - [`rate_limit`]: per-tenant token buckets for requests and tokens per minute, checked before
//!   a request queues; tokens are reserved up front and the unused part refunded.
//! - [`admission`]: the queue in front of saturated backends — priority classes, weighted fair
//!   share between tenants, per-tenant concurrency caps, shedding, queue timeouts, and removal
//!   of requests whose client left.
//!
//! Each module has its own `thiserror` enum: the three fail for unrelated reasons and are
//! handled at different points of a request (start-up, authentication, before and in the queue).

pub mod admission;
pub mod rate_limit;
pub mod tenants;

//! `sluice-gateway`: what the `sluice` binary serves — the OpenAI-compatible HTTP API, API
//! keys and tenants, rate limits, the admission queue, and where a generation runs (the local
//! engine or a replica).
//!
//! Only [`api`] and [`error`] speak HTTP. The policy modules take plain values (a header
//! string, an `Instant`, a tenant) and return typed errors whose messages are written for an
//! OpenAI-style error body and whose `metric_label()` names the rejection reason; [`error`]
//! maps everything to status codes in one place.
//!
//! # Layout
//! - [`api`]: the router ([`api::app`]), request/response types, validation, streaming.
//! - [`error`]: every API error and its one mapping to status + OpenAI error JSON.
//! - [`tenants`]: the `--api-keys` file (TOML or JSON), validated into [`tenants::Tenants`];
//!   `Authorization: Bearer` keys checked in constant time against stored SHA-256 digests.
//! - [`rate_limit`]: per-tenant token buckets for requests and tokens per minute, checked before
//!   a request queues; tokens are reserved up front and the unused part refunded.
//! - [`admission`]: the queue in front of saturated backends — priority classes, weighted fair
//!   share between tenants, per-tenant concurrency caps, shedding, queue timeouts, and removal
//!   of requests whose client left.
//! - [`backend`]: where a generation runs, a `Target`: `LocalBackend` (an in-process engine)
//!   or the router.
//! - [`router`]: remote replicas' clients (`router::remote`, one pooled hyper client each),
//!   load, health and models; the routing policies (round-robin, least-load, prefix-affinity);
//!   retries before the first byte.
//! - [`discovery`]: where replicas come from — a static list, DNS, a file, Kubernetes
//!   EndpointSlices — fed into the router as they change.
//! - [`server`]: the socket, header timeout and the SIGTERM drain.
//! - [`config`]: `sluice serve` flags and their validation.
//! - [`metrics`]: `sluice_gateway_*` series; [`demand`]: each model's arrivals, client-side
//!   first tokens and unserved requests, for the autoscaler.
//!
//! The policy modules each have their own `thiserror` enum: they fail for unrelated reasons
//! and are handled at different points of a request (start-up, authentication, before and in
//! the queue); [`error::ApiError`] is the crate's error at the HTTP boundary.

pub mod admission;
pub mod api;
pub mod backend;
pub mod config;
pub mod demand;
pub mod discovery;
pub mod error;
pub mod metrics;
pub mod prompt_bursts;
pub mod rate_limit;
pub mod router;
pub mod server;
pub mod tenants;

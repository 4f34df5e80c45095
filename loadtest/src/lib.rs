//! `sluice-loadtest`: a load generator and reporter for any OpenAI-compatible endpoint (sluice,
//! vLLM, llama.cpp, TGI). It depends on no other sluice crate, so it measures sluice exactly as
//! it measures anything else.
//!
//! # Layout
//! - [`config`]: clap flags (each also `SLUICE_LOADTEST_*`) validated into a [`config::Config`].
//! - [`schedule`]: open-loop send offsets (Poisson, constant, gamma) and trace times, fixed
//!   before a run so latency is measured from the scheduled time.
//! - [`dataset`]: requests as recipes: random lengths, ShareGPT, Azure CSV and Mooncake traces.
//! - [`prompt`]: recipe → prompt text of a token length; [`calibrate`]: who counts tokens (the
//!   server's `/tokenize`, else a local [`tokenizer`] read from `tokenizer.json` or [`gguf`]
//!   metadata, else ~4 chars/token) and the one-token filler words.
//! - [`client`]: pooled hyper client (rustls for `https://`), OpenAI bodies, per-chunk timing;
//!   [`sse`]: the SSE parser; [`sluice_conn`]: tells a stale keep-alive connection (retried
//!   once on a new one) from a failing server.
//! - [`load`]: closed and open loops. [`metrics`]: vLLM's figure definitions and HdrHistogram
//!   percentiles; [`timeline`]: throughput and in-flight over time. [`session`]: one invocation
//!   end to end; [`stop`]: Ctrl-C or SIGTERM ends it early, with a report of what ran.
//!   [`report`]: table, JSON, JSONL; [`plot`]: SVG or PNG charts.

pub mod calibrate;
pub mod client;
pub mod config;
pub mod dataset;
pub mod error;
pub mod gguf;
pub mod load;
pub mod metrics;
pub mod plot;
pub mod prompt;
pub mod report;
pub mod schedule;
pub mod session;
pub mod sse;
pub mod stop;
pub mod timeline;
pub mod tokenizer;

pub use error::{Error, Result};

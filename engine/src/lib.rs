//! `sluice-engine`: a generation request's life inside one replica — queueing, iteration-level
//! (continuous) batching with chunked prefill, KV block allocation with prefix caching and
//! preemption, sampling, incremental detokenisation with stop strings, and streaming.
//!
//! The engine knows nothing about HTTP or OpenAI JSON: it takes token ids and sampling
//! parameters and yields events. The gateway renders and tokenises.
//!
//! # Layout
//! - [`engine`]: [`Engine::start`] runs the step loop on its own OS thread; [`EngineHandle`]
//!   submits requests, reports [`Load`], and shuts down.
//! - `scheduler`: which sequences run each step and with how many tokens; preemption.
//! - [`block_manager`]: free pool, reference counts, the prefix cache and its LRU eviction.
//! - `sequence`: one choice's state and its output path.
//! - `sampler`: bias, penalties, the grammar's mask, temperature, top-k/top-p/min-p,
//!   per-choice seeded draws.
//! - [`constraint`]: grammar-constrained decoding (JSON schemas, Lark grammars) with llguidance.
//! - `detokenizer`, `stop`: text that never breaks a character or shows a stop string.
//! - [`metrics`]: vLLM-named Prometheus series.
//! - [`request`], [`event`], [`config`], [`error`]: the types callers use.

pub mod block_manager;
pub mod config;
pub mod constraint;
mod detokenizer;
pub mod engine;
pub mod error;
pub mod event;
pub mod metrics;
pub mod request;
pub mod sampler;
mod scheduler;
mod sequence;
mod stop;

pub use config::EngineConfig;
pub use constraint::{Constraint, Grammar, GrammarError};
pub use engine::{Engine, EngineHandle, EventStream, Load, MaskCost};
pub use error::{EngineError, SubmitError};
pub use event::{
    Delta, Event, Finish, FinishReason, MatchedStop, PromptLogprobs, Stage, TokenLogprob, Usage,
};
pub use metrics::EngineMetrics;
pub use request::{
    Field, Invalid, Request, Resume, SamplingParams, MAX_N, MAX_STOP, MAX_TOP_LOGPROBS,
};

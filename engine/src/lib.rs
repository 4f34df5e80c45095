//! `sluice-engine`: a generation request's life inside one replica (queueing, iteration-level
//! scheduling, KV block allocation and prefix caching, preemption, sampling, streaming).
//!
//! Empty for now: the engine issue fills it, on top of `sluice_models::Llama::forward`.

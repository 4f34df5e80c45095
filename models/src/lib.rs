//! `sluice-models`: everything about a model and nothing about requests.
//!
//! It reads GGUF files, builds the tokenizer and chat template from their metadata, and runs the
//! batched ragged Llama forward pass over a block-paged KV store. The engine decides what goes
//! into a batch and which KV blocks a sequence owns; this crate only computes.
//!
//! # Layout
//! - [`registry`]: registry names (`smollm2-135m-instruct`) and paths to model files.
//! - [`gguf`]: GGUF metadata and tensors, with errors that name the file.
//! - [`hf`]: Hugging Face model directories (safetensors) in GGUF's names and layout;
//!   [`hf_export`] writes one from a GGUF file.
//! - [`config`]: the architecture read from metadata ([`LlamaConfig`]).
//! - [`tokenizer`] and [`chat_template`]: text in and out, exactly as llama.cpp does it.
//! - [`batch`]: the ragged batch ([`StepBatch`]) a forward call takes; [`host_logits`]: the
//!   logits it returns, on the host ([`HostLogits`]); [`adjust`]: what a request changes in
//!   a row before its token is picked ([`Adjust`]).
//! - [`kv`]: the block pool holding K and V ([`KvStore`]).
//! - [`llama`]: weights and the forward pass on the CPU kernels ([`Llama`]).
//! - [`candle`]: the forward pass on candle tensors, CPU or GPU ([`CandleLlama`]).
//! - [`kernels`]: batch-invariant CPU kernels (the only `unsafe` code).
//! - [`model`]: [`Model`], the loaded bundle of all of the above.
//! - [`device`]: `cpu` / `cuda:N`, and the backend ([`Backend`]).
//! - [`weights`]: [`WeightSource`], tensors by GGUF name from any model format.

pub mod adjust;
pub mod batch;
pub mod candle;
pub mod chat_template;
pub mod config;
pub mod device;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod hf_export;
pub mod host_logits;
#[allow(unsafe_code)]
pub mod kernels;
pub mod kv;
pub mod linear;
pub mod llama;
pub mod logits;
pub mod model;
pub mod registry;
pub mod tokenizer;
pub mod weights;

pub use adjust::Adjust;
pub use batch::{Logits, Nucleus, Pick, SeqChunk, StepBatch};
pub use candle::CandleLlama;
pub use config::LlamaConfig;
pub use device::{Backend, DeviceSpec};
pub use error::{ModelError, Result};
pub use host_logits::HostLogits;
pub use kv::KvStore;
pub use llama::Llama;
pub use model::{Model, ModelOptions, ModelSource, Network};
pub use weights::WeightSource;

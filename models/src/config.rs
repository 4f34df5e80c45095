//! The architecture of a Llama-family model, read from GGUF metadata.

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// Architectures whose forward pass this crate implements. Mistral-style GGUFs are written as
/// `llama` too; anything else is refused before any weight is read.
const SUPPORTED_ARCHITECTURES: &[&str] = &["llama"];

/// Shape and hyper-parameters of a Llama model: everything the forward pass and the engine need to
/// know about the network, and nothing about requests.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub architecture: String,
    pub name: String,
    pub block_count: usize,
    pub embedding_length: usize,
    pub feed_forward_length: usize,
    pub head_count: usize,
    pub head_count_kv: usize,
    pub head_dim: usize,
    pub rope_dimension: usize,
    pub rope_freq_base: f32,
    pub rms_norm_eps: f32,
    pub context_length: usize,
    pub vocab_size: usize,
}

impl LlamaConfig {
    /// Reads and validates the `llama.*` keys.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let architecture = file.string("general.architecture")?.to_owned();
        if !SUPPORTED_ARCHITECTURES.contains(&architecture.as_str()) {
            return Err(ModelError::Unsupported(format!(
                "architecture '{architecture}' (supported: {SUPPORTED_ARCHITECTURES:?})"
            )));
        }
        let a = architecture.as_str();
        let key = |k: &str| format!("{a}.{k}");
        let embedding_length = file.usize(&key("embedding_length"))?;
        let head_count = file.usize(&key("attention.head_count"))?;
        let head_count_kv = if file.has(&key("attention.head_count_kv")) {
            file.usize(&key("attention.head_count_kv"))?
        } else {
            head_count
        };
        if head_count == 0 || embedding_length % head_count != 0 {
            return Err(ModelError::Unsupported(format!(
                "embedding length {embedding_length} is not a multiple of {head_count} heads"
            )));
        }
        if head_count_kv == 0 || head_count % head_count_kv != 0 {
            return Err(ModelError::Unsupported(format!(
                "{head_count} query heads cannot be grouped over {head_count_kv} KV heads"
            )));
        }
        let head_dim = if file.has(&key("attention.key_length")) {
            file.usize(&key("attention.key_length"))?
        } else {
            embedding_length / head_count
        };
        let rope_dimension = if file.has(&key("rope.dimension_count")) {
            file.usize(&key("rope.dimension_count"))?
        } else {
            head_dim
        };
        if rope_dimension != head_dim || head_dim % 2 != 0 {
            return Err(ModelError::Unsupported(format!(
                "partial or odd RoPE (dimension {rope_dimension}, head dim {head_dim})"
            )));
        }
        if file.has(&key("rope.scaling.type")) {
            let kind = file.string(&key("rope.scaling.type"))?;
            if kind != "none" {
                return Err(ModelError::Unsupported(format!("RoPE scaling '{kind}'")));
            }
        }
        let rope_freq_base = if file.has(&key("rope.freq_base")) {
            file.f32(&key("rope.freq_base"))?
        } else {
            10_000.0
        };
        let vocab_size = if file.has(&key("vocab_size")) {
            file.usize(&key("vocab_size"))?
        } else {
            file.tensor_dims("token_embd.weight")?[0]
        };
        let config = Self {
            name: file
                .string("general.name")
                .map(str::to_owned)
                .unwrap_or_default(),
            block_count: file.usize(&key("block_count"))?,
            embedding_length,
            feed_forward_length: file.usize(&key("feed_forward_length"))?,
            head_count,
            head_count_kv,
            head_dim,
            rope_dimension,
            rope_freq_base,
            rms_norm_eps: file.f32(&key("attention.layer_norm_rms_epsilon"))?,
            context_length: file.usize(&key("context_length"))?,
            vocab_size,
            architecture,
        };
        if config.head_dim * config.head_count != config.embedding_length {
            return Err(ModelError::Unsupported(format!(
                "head dim {} × {} heads differs from the embedding length {}",
                config.head_dim, config.head_count, config.embedding_length
            )));
        }
        Ok(config)
    }

    /// Width of one token's K (or V) vector across all KV heads.
    pub fn kv_width(&self) -> usize {
        self.head_count_kv * self.head_dim
    }

    /// Query heads that share one KV head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.head_count / self.head_count_kv
    }
}

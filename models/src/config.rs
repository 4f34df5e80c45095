//! The architecture of a Llama-family model, read from GGUF metadata or a Hugging Face
//! `config.json`.

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// Architectures whose forward pass this crate implements. Mistral-style GGUFs are written as
/// `llama` too; anything else is refused before any weight is read.
const SUPPORTED_ARCHITECTURES: &[&str] = &["llama"];

/// Hugging Face `architectures` entries that are this crate's network: Mistral's is Llama's with
/// grouped-query attention (sliding-window attention, where set, is refused).
const SUPPORTED_HF_ARCHITECTURES: &[&str] = &["LlamaForCausalLM", "MistralForCausalLM"];

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
        Self {
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
        }
        .validated()
    }

    /// Reads a Hugging Face `config.json` (parsed), refusing other architectures by name.
    pub fn from_hf(json: &serde_json::Value) -> Result<Self> {
        let hf = HfKeys(json);
        let architecture = match json["architectures"].as_array().map(Vec::as_slice) {
            Some([one]) => one.as_str().unwrap_or_default().to_owned(),
            other => {
                return Err(ModelError::Unsupported(format!(
                    "config.json: architectures {other:?} (expected one of {SUPPORTED_HF_ARCHITECTURES:?})"
                )))
            }
        };
        if !SUPPORTED_HF_ARCHITECTURES.contains(&architecture.as_str()) {
            return Err(ModelError::Unsupported(format!(
                "architecture '{architecture}' (supported: {SUPPORTED_HF_ARCHITECTURES:?})"
            )));
        }
        for key in ["rope_scaling", "sliding_window"] {
            if !json[key].is_null() {
                return Err(ModelError::Unsupported(format!(
                    "config.json: {key} = {} is not supported",
                    json[key]
                )));
            }
        }
        let embedding_length = hf.usize("hidden_size")?;
        let head_count = hf.usize("num_attention_heads")?;
        let head_dim = hf.usize_or("head_dim", embedding_length / head_count.max(1))?;
        Self {
            architecture: "llama".into(),
            name: json["_name_or_path"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            block_count: hf.usize("num_hidden_layers")?,
            embedding_length,
            feed_forward_length: hf.usize("intermediate_size")?,
            head_count,
            head_count_kv: hf.usize_or("num_key_value_heads", head_count)?,
            head_dim,
            rope_dimension: head_dim,
            rope_freq_base: hf.f32_or("rope_theta", 10_000.0)?,
            rms_norm_eps: hf.f32_or("rms_norm_eps", 1e-6)?,
            context_length: hf.usize("max_position_embeddings")?,
            vocab_size: hf.usize("vocab_size")?,
        }
        .validated()
    }

    /// Checks the shape's internal consistency (heads divide the width, KV heads divide the
    /// query heads, full even RoPE).
    fn validated(self) -> Result<Self> {
        let config = self;
        if config.head_count == 0 || config.head_count_kv == 0 {
            return Err(ModelError::Unsupported(format!(
                "{} query heads over {} KV heads",
                config.head_count, config.head_count_kv
            )));
        }
        if !config.head_count.is_multiple_of(config.head_count_kv) {
            return Err(ModelError::Unsupported(format!(
                "{} query heads cannot be grouped over {} KV heads",
                config.head_count, config.head_count_kv
            )));
        }
        if config.rope_dimension != config.head_dim || !config.head_dim.is_multiple_of(2) {
            return Err(ModelError::Unsupported(format!(
                "partial or odd RoPE (dimension {}, head dim {})",
                config.rope_dimension, config.head_dim
            )));
        }
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

/// Typed look-ups in a Hugging Face `config.json`, with errors naming the key.
struct HfKeys<'a>(&'a serde_json::Value);

impl HfKeys<'_> {
    fn usize(&self, key: &str) -> Result<usize> {
        self.0[key]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                ModelError::Metadata(format!(
                    "config.json: '{key}' should be an unsigned integer, found {}",
                    self.0[key]
                ))
            })
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        if self.0[key].is_null() {
            Ok(default)
        } else {
            self.usize(key)
        }
    }

    fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        match &self.0[key] {
            serde_json::Value::Null => Ok(default),
            v => v.as_f64().map(|x| x as f32).ok_or_else(|| {
                ModelError::Metadata(format!(
                    "config.json: '{key}' should be a number, found {v}"
                ))
            }),
        }
    }
}

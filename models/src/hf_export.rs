//! Writes a Hugging Face model directory from a GGUF file: every tensor dequantized to a dense
//! type, Q and K rows put back in Hugging Face's RoPE layout, and the GGUF's tokenizer and chat
//! template as `tokenizer.json` and `tokenizer_config.json`.
//!
//! This is how the tests (and the `to_safetensors` example) make a Hugging Face copy of the
//! default model; loading the copy through [`crate::hf`] must give back the GGUF's network.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::json;

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::hf::{hf_name, rope_heads, unpermute_rope_rows};
use crate::tokenizer::Tokenizer;

/// `torch_dtype` of a dense type, as `config.json` names it.
pub fn torch_dtype(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F16 => Ok("float16"),
        DType::BF16 => Ok("bfloat16"),
        DType::F32 => Ok("float32"),
        other => Err(ModelError::Unsupported(format!(
            "dtype {other:?}: a Hugging Face copy is written in f16, bf16 or f32"
        ))),
    }
}

/// Converts `gguf` into a directory `out` (created if needed) with weights in `dtype`.
pub fn write_hf_dir(gguf: &Path, out: &Path, dtype: DType) -> Result<()> {
    let torch = torch_dtype(dtype)?;
    std::fs::create_dir_all(out).map_err(|source| ModelError::Io {
        path: out.to_owned(),
        source,
    })?;
    let mut file = GgufFile::open(gguf)?;
    let config = LlamaConfig::from_gguf(&file)?;
    let tokenizer = Tokenizer::from_gguf(file.content())?;
    let tensors = hf_tensors(&mut file, &config, dtype)?;
    let tied = !tensors.contains_key("lm_head.weight");
    candle_core::safetensors::save(&tensors, out.join("model.safetensors"))?;
    write(
        &out.join("config.json"),
        &config_json(&config, &tokenizer, tied, torch),
    )?;
    write(&out.join("tokenizer.json"), &tokenizer.to_json()?)?;
    let template = match file.content().metadata.get("tokenizer.chat_template") {
        Some(v) => Some(
            v.to_string()
                .map_err(|e| ModelError::Metadata(format!("tokenizer.chat_template: {e}")))?
                .clone(),
        ),
        None => None,
    };
    write(
        &out.join("tokenizer_config.json"),
        &tokenizer_config_json(&tokenizer, template)?,
    )
}

/// Every tensor of the GGUF under its Hugging Face name, dense, in Hugging Face's layout.
fn hf_tensors(
    file: &mut GgufFile,
    config: &LlamaConfig,
    dtype: DType,
) -> Result<HashMap<String, Tensor>> {
    let mut names: Vec<String> = file.content().tensor_infos.keys().cloned().collect();
    names.sort();
    let mut tensors = HashMap::new();
    for name in names {
        let hf = hf_name(&name).ok_or_else(|| {
            ModelError::Unsupported(format!("tensor '{name}' has no Hugging Face Llama name"))
        })?;
        let mut t = file.read_qtensor(&name)?.dequantize(&Device::Cpu)?;
        if let Some(heads) = rope_heads(&name, config) {
            t = unpermute_rope_rows(&t, heads)?;
        }
        tensors.insert(hf, t.to_dtype(dtype)?);
    }
    Ok(tensors)
}

fn config_json(
    config: &LlamaConfig,
    tokenizer: &Tokenizer,
    tied: bool,
    torch: &str,
) -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_name_or_path": config.name,
        "hidden_size": config.embedding_length,
        "intermediate_size": config.feed_forward_length,
        "num_hidden_layers": config.block_count,
        "num_attention_heads": config.head_count,
        "num_key_value_heads": config.head_count_kv,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.context_length,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_freq_base,
        "rope_scaling": null,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": tied,
        "torch_dtype": torch,
        "bos_token_id": tokenizer.bos_id(),
        "eos_token_id": tokenizer.eos_id(),
    })
}

fn tokenizer_config_json(
    tokenizer: &Tokenizer,
    chat_template: Option<String>,
) -> Result<serde_json::Value> {
    let bos = tokenizer
        .bos_id()
        .map(|id| tokenizer.id_to_token(id).unwrap_or_default());
    let eos = tokenizer.id_to_token(tokenizer.eos_id()).ok_or_else(|| {
        ModelError::Tokenizer(format!("eos id {} has no token", tokenizer.eos_id()))
    })?;
    Ok(json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": tokenizer.add_bos(),
        "add_eos_token": false,
        "chat_template": chat_template,
    }))
}

fn write(path: &Path, contents: &impl std::fmt::Display) -> Result<()> {
    std::fs::write(path, contents.to_string()).map_err(|source| ModelError::Io {
        path: path.to_owned(),
        source,
    })
}

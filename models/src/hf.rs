//! Hugging Face model directories: `config.json`, `tokenizer.json`, `tokenizer_config.json` and
//! `*.safetensors` (one file, or shards listed by `model.safetensors.index.json`).
//!
//! [`HfDir`] is a [`WeightSource`]: it answers in GGUF's names and layout, so both backends load
//! a directory exactly as they load a GGUF file. Two things differ between the formats besides
//! names:
//! - Hugging Face stores each head's Q and K rows with the two halves of the head rotating
//!   together under RoPE (`rotate_half`), GGUF with adjacent pairs rotating together.
//!   [`permute_rope_rows`] reorders rows from the first layout to the second at load;
//!   [`unpermute_rope_rows`] is its inverse (for writing a directory from a GGUF).
//! - Tensors are dense (f16, bf16 or f32); they come back as dense `QTensor`s of that type.
//!
//! Tensor data is read from the files with positioned reads, tensor by tensor, rather than
//! memory-mapped: the crate keeps `unsafe` in its kernels only.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::chat_template::ChatTemplate;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::tokenizer::{SpecialIds, Tokenizer};
use crate::weights::WeightSource;

/// Safetensors element types a directory may hold, with the dense GGML type each loads as.
const SUPPORTED_DTYPES: &[(&str, DType, GgmlDType)] = &[
    ("F16", DType::F16, GgmlDType::F16),
    ("BF16", DType::BF16, GgmlDType::BF16),
    ("F32", DType::F32, GgmlDType::F32),
];

/// `torch_dtype` values of `config.json` this loader accepts.
const SUPPORTED_TORCH_DTYPES: &[&str] = &["float16", "bfloat16", "float32"];

/// Whether `path` looks like a Hugging Face model directory (a directory with `config.json`).
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// Per-layer tensors: Hugging Face's name inside `model.layers.N.` and GGUF's inside `blk.N.`.
const LAYER_NAMES: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// Tensors outside the layers.
const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// The GGUF name of a Hugging Face tensor, or `None` for tensors the network does not use
/// (such as `rotary_emb.inv_freq`).
pub fn gguf_name(hf: &str) -> Option<String> {
    if let Some((_, g)) = GLOBAL_NAMES.iter().find(|(h, _)| *h == hf) {
        return Some((*g).to_owned());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let (_, g) = LAYER_NAMES.iter().find(|(h, _)| *h == part)?;
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// The Hugging Face name of a GGUF tensor (the inverse of [`gguf_name`]).
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((h, _)) = GLOBAL_NAMES.iter().find(|(_, g)| *g == gguf) {
        return Some((*h).to_owned());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let (h, _) = LAYER_NAMES.iter().find(|(_, g)| *g == part)?;
    Some(format!("model.layers.{layer}.{h}.{suffix}"))
}

/// How many heads a GGUF tensor's rows are grouped in, if its rows rotate under RoPE (the Q and
/// K projections).
pub fn rope_heads(gguf: &str, config: &LlamaConfig) -> Option<usize> {
    if gguf.ends_with(".attn_q.weight") {
        Some(config.head_count)
    } else if gguf.ends_with(".attn_k.weight") {
        Some(config.head_count_kv)
    } else {
        None
    }
}

/// Reorders a `[heads·head_dim, cols]` projection from Hugging Face's RoPE layout to GGUF's.
///
/// Within a head of `d` rows, Hugging Face rotates row `j` with row `j + d/2` (the two halves);
/// GGUF rotates row `2j` with row `2j + 1`. So GGUF row `2j + s` (s ∈ {0, 1}) is Hugging Face
/// row `s·d/2 + j`: view each head as `[2, d/2]` and transpose it to `[d/2, 2]`.
pub fn permute_rope_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    regroup_head_rows(t, heads, 2)
}

/// The inverse of [`permute_rope_rows`]: GGUF's interleaved pairs back to Hugging Face halves
/// (view each head as `[d/2, 2]` and transpose it to `[2, d/2]`).
pub fn unpermute_rope_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let (rows, _) = t.dims2()?;
    regroup_head_rows(t, heads, rows / heads.max(1) / 2)
}

/// Views each head's `d` rows as `[outer, d/outer]` and transposes that to `[d/outer, outer]`.
fn regroup_head_rows(t: &Tensor, heads: usize, outer: usize) -> Result<Tensor> {
    let (rows, cols) = t.dims2()?;
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(ModelError::Unsupported(format!(
            "cannot split {rows} rows into {heads} heads of even size"
        )));
    }
    let d = rows / heads;
    Ok(t.reshape((heads, outer, d / outer, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))?)
}

/// Where one tensor lies in a safetensors file.
#[derive(Debug, Clone)]
struct TensorEntry {
    hf_name: String,
    file: usize,
    dtype: DType,
    ggml: GgmlDType,
    shape: Vec<usize>,
    /// Byte range in the file.
    start: u64,
    len: usize,
}

/// A Hugging Face model directory read as a [`WeightSource`].
#[derive(Debug)]
pub struct HfDir {
    path: PathBuf,
    config: LlamaConfig,
    files: Vec<PathBuf>,
    /// By GGUF name.
    tensors: HashMap<String, TensorEntry>,
}

impl HfDir {
    /// Opens a directory: parses `config.json` and the safetensors headers, and checks every
    /// tensor's dtype. No tensor data is read yet.
    pub fn open(path: &Path) -> Result<Self> {
        let json = read_json(&path.join("config.json"))?;
        let config = LlamaConfig::from_hf(&json)?;
        if let Some(dtype) = json["torch_dtype"].as_str() {
            if !SUPPORTED_TORCH_DTYPES.contains(&dtype) {
                return Err(ModelError::Unsupported(format!(
                    "{}: torch_dtype '{dtype}' (supported: {SUPPORTED_TORCH_DTYPES:?})",
                    path.display()
                )));
            }
        }
        let files = safetensors_files(path)?;
        let mut tensors = HashMap::new();
        for (index, file) in files.iter().enumerate() {
            for entry in read_header(file, index)? {
                if let Some(name) = gguf_name(&entry.hf_name) {
                    tensors.insert(name, entry);
                }
            }
        }
        if json["tie_word_embeddings"].as_bool().unwrap_or(false) {
            tensors.remove("output.weight");
        } else if !tensors.contains_key("output.weight") {
            return Err(ModelError::Unsupported(format!(
                "{}: lm_head.weight is missing and tie_word_embeddings is not set",
                path.display()
            )));
        }
        Ok(Self {
            path: path.to_owned(),
            config,
            files,
            tensors,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.tensors.get(name).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{}: tensor '{name}' ({}) is missing",
                self.path.display(),
                hf_name(name).unwrap_or_default()
            ))
        })
    }

    /// Reads one tensor's bytes into a candle tensor of its stored dtype.
    fn read_tensor(&self, entry: &TensorEntry) -> Result<Tensor> {
        let path = &self.files[entry.file];
        let io = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        let mut file = File::open(path).map_err(io)?;
        file.seek(SeekFrom::Start(entry.start)).map_err(io)?;
        let mut bytes = vec![0u8; entry.len];
        file.read_exact(&mut bytes).map_err(io)?;
        Ok(Tensor::from_raw_buffer(
            &bytes,
            entry.dtype,
            &entry.shape,
            &Device::Cpu,
        )?)
    }
}

impl WeightSource for HfDir {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn tensor_dims(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.entry(name)?.shape.clone())
    }

    fn read_qtensor(&mut self, name: &str) -> Result<QTensor> {
        let entry = self.entry(name)?.clone();
        let mut t = self.read_tensor(&entry)?;
        if let Some(heads) = rope_heads(name, &self.config) {
            t = permute_rope_rows(&t, heads)?;
        }
        Ok(QTensor::quantize(&t, entry.ggml)?)
    }

    fn check_tensor_types(&self) -> Result<()> {
        // Every dtype was checked when the headers were read.
        Ok(())
    }
}

/// The safetensors files of a directory: the shards its index names, else every
/// `*.safetensors` file, in name order.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    let names: BTreeSet<String> = if index.is_file() {
        let json = read_json(&index)?;
        let map = json["weight_map"]
            .as_object()
            .ok_or_else(|| ModelError::Metadata(format!("{}: no weight_map", index.display())))?;
        map.values()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    } else {
        let entries = std::fs::read_dir(dir).map_err(|source| ModelError::Io {
            path: dir.to_owned(),
            source,
        })?;
        entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".safetensors"))
            .collect()
    };
    if names.is_empty() {
        return Err(ModelError::NotFound {
            path: dir.join("model.safetensors"),
            hint: "a Hugging Face model directory needs its *.safetensors weights".into(),
        });
    }
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Parses a safetensors header: a little-endian u64 length, then that many bytes of JSON
/// mapping each name to its dtype, shape and byte range after the header.
fn read_header(path: &Path, index: usize) -> Result<Vec<TensorEntry>> {
    let io = |source| ModelError::Io {
        path: path.to_owned(),
        source,
    };
    let bad = |what: String| ModelError::Metadata(format!("{}: {what}", path.display()));
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let header_len = u64::from_le_bytes(len);
    if header_len > file_len.saturating_sub(8) || header_len > 100 << 20 {
        return Err(bad(format!("safetensors header of {header_len} bytes")));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let json: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("safetensors header: {e}")))?;
    let map = json
        .as_object()
        .ok_or_else(|| bad("safetensors header is not an object".into()))?;
    let data_start = 8 + header_len;
    let mut entries = Vec::new();
    for (name, info) in map.iter().filter(|(n, _)| *n != "__metadata__") {
        let dtype_name = info["dtype"].as_str().unwrap_or_default();
        let Some(&(_, dtype, ggml)) = SUPPORTED_DTYPES.iter().find(|(n, ..)| *n == dtype_name)
        else {
            let names: Vec<&str> = SUPPORTED_DTYPES.iter().map(|(n, ..)| *n).collect();
            return Err(ModelError::Unsupported(format!(
                "{}: tensor '{name}' has dtype {dtype_name} (supported: {names:?})",
                path.display()
            )));
        };
        let shape: Vec<usize> = info["shape"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_u64().map(|d| d as usize))
                    .collect()
            })
            .unwrap_or_default();
        let offsets = info["data_offsets"].as_array();
        let (begin, end) = match offsets.map(Vec::as_slice) {
            Some([b, e]) => (b.as_u64().unwrap_or(0), e.as_u64().unwrap_or(0)),
            _ => return Err(bad(format!("tensor '{name}': no data_offsets"))),
        };
        let len = shape.iter().product::<usize>() * dtype.size_in_bytes();
        if end < begin || (end - begin) as usize != len || data_start + end > file_len {
            return Err(bad(format!(
                "tensor '{name}': bytes {begin}..{end} do not hold shape {shape:?} of {dtype_name}"
            )));
        }
        entries.push(TensorEntry {
            hf_name: name.clone(),
            file: index,
            dtype,
            ggml,
            shape,
            start: data_start + begin,
            len,
        });
    }
    Ok(entries)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ModelError::Metadata(format!("{}: {e}", path.display())))
}

/// The text of a special token in `tokenizer_config.json`: a string, or an object with
/// `content`.
fn token_text(v: &serde_json::Value) -> Option<&str> {
    v.as_str().or_else(|| v["content"].as_str())
}

/// Builds the tokenizer from `tokenizer.json`, with BOS/EOS named by `tokenizer_config.json`
/// (as texts) or else by `config.json` (as ids).
pub fn tokenizer(dir: &Path) -> Result<Tokenizer> {
    let json_path = dir.join("tokenizer.json");
    if !json_path.is_file() {
        return Err(ModelError::NotFound {
            path: json_path,
            hint: "only directories with a fast tokenizer (tokenizer.json) are supported".into(),
        });
    }
    let bytes = std::fs::read(&json_path).map_err(|source| ModelError::Io {
        path: json_path.clone(),
        source,
    })?;
    let tok_json: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ModelError::Tokenizer(format!("parsing {}: {e}", json_path.display())))?;
    let tok_config = read_json_or_null(&dir.join("tokenizer_config.json"))?;
    let config = read_json(&dir.join("config.json"))?;
    let id_of = |key: &str, id_key: &str| -> Option<u32> {
        match token_text(&tok_config[key]) {
            Some(text) => token_id(&tok_json, text),
            None => first_id(&config[id_key]),
        }
    };
    let bos = id_of("bos_token", "bos_token_id");
    let eos = id_of("eos_token", "eos_token_id").ok_or_else(|| {
        ModelError::Metadata(format!(
            "{}: no eos_token in tokenizer_config.json or eos_token_id in config.json",
            dir.display()
        ))
    })?;
    // Without the flag, a post-processor that inserts the BOS text means prompts start with it.
    let add_bos = match tok_config["add_bos_token"].as_bool() {
        Some(flag) => flag,
        None => bos.is_some_and(|_| {
            let text = token_text(&tok_config["bos_token"]).unwrap_or("\u{0}");
            tok_json["post_processor"].to_string().contains(text)
        }),
    };
    Tokenizer::from_json_bytes(&bytes, SpecialIds { bos, eos, add_bos })
}

fn read_json_or_null(path: &Path) -> Result<serde_json::Value> {
    if path.is_file() {
        read_json(path)
    } else {
        Ok(serde_json::Value::Null)
    }
}

/// An id from `config.json`: a number, or the first of a list.
fn first_id(v: &serde_json::Value) -> Option<u32> {
    v.as_u64()
        .or_else(|| v.as_array()?.first()?.as_u64())
        .and_then(|id| u32::try_from(id).ok())
}

/// Looks a token's text up in `tokenizer.json`: its added tokens, then the model's vocabulary.
fn token_id(tok_json: &serde_json::Value, text: &str) -> Option<u32> {
    let added = tok_json["added_tokens"].as_array().and_then(|tokens| {
        tokens
            .iter()
            .find(|t| t["content"].as_str() == Some(text))
            .and_then(|t| t["id"].as_u64())
    });
    added
        .or_else(|| tok_json["model"]["vocab"][text].as_u64())
        .and_then(|id| u32::try_from(id).ok())
}

/// The chat template of a directory: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates of which `default` is used). The
/// template sees the BOS/EOS texts as the GGUF path gives them.
pub fn chat_template(dir: &Path, tokenizer: &Tokenizer) -> Result<Option<ChatTemplate>> {
    let jinja = dir.join("chat_template.jinja");
    let source = if jinja.is_file() {
        std::fs::read_to_string(&jinja).map_err(|source| ModelError::Io {
            path: jinja.clone(),
            source,
        })?
    } else {
        let tok_config = read_json_or_null(&dir.join("tokenizer_config.json"))?;
        let value = &tok_config["chat_template"];
        let named = value.as_array().and_then(|list| {
            list.iter()
                .find(|t| t["name"] == "default")
                .or_else(|| list.first())
        });
        match named.map_or(value, |t| &t["template"]).as_str() {
            Some(s) => s.to_owned(),
            None => return Ok(None),
        }
    };
    ChatTemplate::for_tokenizer(&source, tokenizer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        for (hf, gguf) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.norm.weight", "output_norm.weight"),
            (
                "model.layers.7.self_attn.q_proj.weight",
                "blk.7.attn_q.weight",
            ),
            (
                "model.layers.0.mlp.down_proj.weight",
                "blk.0.ffn_down.weight",
            ),
            (
                "model.layers.12.post_attention_layernorm.weight",
                "blk.12.ffn_norm.weight",
            ),
        ] {
            assert_eq!(gguf_name(hf).as_deref(), Some(gguf));
            assert_eq!(hf_name(gguf).as_deref(), Some(hf));
        }
        assert_eq!(
            gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq"),
            None
        );
    }

    #[test]
    fn the_rope_permutation_interleaves_halves_and_inverts() {
        let (heads, d, cols) = (3, 8, 5);
        let rows = heads * d;
        let data: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let hf = Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap();
        let gguf = permute_rope_rows(&hf, heads).unwrap();
        let hf_rows = hf.to_vec2::<f32>().unwrap();
        let gguf_rows = gguf.to_vec2::<f32>().unwrap();
        for h in 0..heads {
            for j in 0..d / 2 {
                for s in 0..2 {
                    assert_eq!(gguf_rows[h * d + 2 * j + s], hf_rows[h * d + s * d / 2 + j]);
                }
            }
        }
        assert_ne!(gguf_rows, hf_rows);
        let back = unpermute_rope_rows(&gguf, heads).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), hf_rows);
        let again = permute_rope_rows(&unpermute_rope_rows(&hf, heads).unwrap(), heads).unwrap();
        assert_eq!(again.to_vec2::<f32>().unwrap(), hf_rows);
    }
}

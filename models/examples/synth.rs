//! Writes a random-weight GGUF of a named shape, for benchmarks where a real model's file cannot
//! travel and for tests that want small models:
//!
//! - `--shape smollm2-135m` (the default model's: 30 layers, 576 wide, 9/3 heads, ff 1536,
//!   vocabulary 49152) or `--shape llama3-8b` (32 layers, 4096 wide, 32/8 heads, ff 14336,
//!   vocabulary 128256, untied output);
//! - `--layers N` keeps the first N layers; `--vocab N` pads the vocabulary past the
//!   tokenizer's (ids with no text, as padded checkpoints have); `--dtype q4_1|q4_k|q8_0|f16` quantizes the matrices
//!   (norms stay f32). A Q4_K matrix needs rows that are a multiple of 256 wide; narrower ones
//!   (576) fall back to Q8_0, as llama.cpp falls back from K-quants;
//! - weights are normal with std 0.02 (norms 1.0) from `--seed`: the same arguments write the
//!   same bytes;
//! - the tokenizer is the default model's (`tokenizer.*` metadata copied from
//!   `--tokenizer-from`, default the default model): it fits every shape's vocabulary.
//!
//! `--truncate-from model.gguf --layers N` instead copies a real model's embeddings, output,
//! norms and its first N layers (and all its metadata) into a smaller file.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use clap::Parser;
use rayon::prelude::*;
use sluice_models::registry;

#[derive(Parser, Debug)]
#[command(about = "Write a random-weight (or truncated) Llama GGUF")]
struct Args {
    /// smollm2-135m or llama3-8b.
    #[arg(long, default_value = "smollm2-135m")]
    shape: String,
    /// Keep only the first N layers (default: all of the shape's).
    #[arg(long)]
    layers: Option<usize>,
    /// Score this many ids instead of the shape's vocabulary (at least the tokenizer's): a
    /// padded embedding table, as many real checkpoints have.
    #[arg(long)]
    vocab: Option<usize>,
    /// q4_1, q4_k, q8_0 or f16.
    #[arg(long, default_value = "q4_1")]
    dtype: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The file to write.
    #[arg(long)]
    out: PathBuf,
    /// A GGUF whose `tokenizer.*` metadata to copy (default: the default model).
    #[arg(long)]
    tokenizer_from: Option<PathBuf>,
    /// Copy this GGUF's first --layers layers instead of writing random weights.
    #[arg(long, requires = "layers")]
    truncate_from: Option<PathBuf>,
    /// Where registry models are cached.
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    model_dir: PathBuf,
}

/// A network shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    name: &'static str,
    layers: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    ff: usize,
    vocab: usize,
    context: usize,
    rope_base: f32,
    tied: bool,
}

const SHAPES: &[Shape] = &[
    Shape {
        name: "smollm2-135m",
        layers: 30,
        hidden: 576,
        heads: 9,
        kv_heads: 3,
        ff: 1536,
        vocab: 49152,
        context: 8192,
        rope_base: 100_000.0,
        tied: true,
    },
    Shape {
        name: "llama3-8b",
        layers: 32,
        hidden: 4096,
        heads: 32,
        kv_heads: 8,
        ff: 14336,
        vocab: 128_256,
        context: 8192,
        rope_base: 500_000.0,
        tied: false,
    },
];

fn main() -> Result<()> {
    let args = Args::parse();
    let started = std::time::Instant::now();
    let (metadata, tensors) = match &args.truncate_from {
        Some(src) => truncated(src, args.layers.unwrap_or(0))?,
        None => synthetic(&args)?,
    };
    let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = BufWriter::new(
        File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?,
    );
    gguf_file::write(&mut out, &md, &ts)?;
    drop(out);
    let bytes = std::fs::metadata(&args.out)?.len();
    eprintln!(
        "wrote {} ({} tensors, {:.1} MB) in {:.1} s",
        args.out.display(),
        ts.len(),
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

type Metadata = Vec<(String, Value)>;
type Tensors = Vec<(String, QTensor)>;

fn read_gguf(path: &Path) -> Result<(Content, File)> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let content =
        Content::read(&mut file).with_context(|| format!("reading {}", path.display()))?;
    Ok((content, file))
}

/// A real model cut down to its first `layers` layers.
fn truncated(src: &Path, layers: usize) -> Result<(Metadata, Tensors)> {
    let (content, mut file) = read_gguf(src)?;
    let arch = content.metadata["general.architecture"]
        .to_string()?
        .clone();
    let mut metadata: Metadata = content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let key = format!("{arch}.block_count");
    metadata.retain(|(k, _)| *k != key);
    metadata.push((key, Value::U32(layers as u32)));
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let keep = |name: &str| match name.strip_prefix("blk.") {
        Some(rest) => rest
            .split('.')
            .next()
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i < layers),
        None => true,
    };
    let mut names: Vec<&String> = content.tensor_infos.keys().filter(|n| keep(n)).collect();
    names.sort();
    let mut tensors = Vec::new();
    for name in names {
        let info = &content.tensor_infos[name];
        let t = info.read(&mut file, content.tensor_data_offset, &Device::Cpu)?;
        tensors.push((name.clone(), t));
    }
    Ok((metadata, tensors))
}

/// Random weights of a named shape, with the default model's tokenizer.
fn synthetic(args: &Args) -> Result<(Metadata, Tensors)> {
    let Some(mut shape) = SHAPES.iter().copied().find(|s| s.name == args.shape) else {
        let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        bail!(
            "unknown --shape '{}': expected one of {names:?}",
            args.shape
        );
    };
    if let Some(n) = args.layers {
        shape.layers = n.min(shape.layers);
    }
    if let Some(v) = args.vocab {
        shape.vocab = v;
    }
    let dtype = match args.dtype.as_str() {
        "q4_1" => GgmlDType::Q4_1,
        "q4_k" => GgmlDType::Q4K,
        "q8_0" => GgmlDType::Q8_0,
        "f16" => GgmlDType::F16,
        other => bail!("unknown --dtype '{other}': expected q4_1, q4_k, q8_0 or f16"),
    };
    let tokenizer_from = match &args.tokenizer_from {
        Some(p) => p.clone(),
        None => registry::resolve(registry::default_model().name, &args.model_dir)?.path,
    };
    let mut metadata = tokenizer_metadata(&tokenizer_from, shape.vocab)?;
    metadata.extend(shape_metadata(&shape, &args.dtype));
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let specs = tensor_specs(&shape);
    let tensors = specs
        .par_iter()
        .enumerate()
        .map(|(i, (name, dims, is_norm))| {
            let seed = args.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let t = if *is_norm {
                QTensor::quantize(
                    &Tensor::ones(dims[0], candle_core::DType::F32, &Device::Cpu)?,
                    GgmlDType::F32,
                )?
            } else {
                random_matrix(dims[0], dims[1], dtype, seed)?
            };
            Ok((name.clone(), t))
        })
        .collect::<Result<Tensors>>()?;
    Ok((metadata, tensors))
}

/// The `tokenizer.*` keys of a GGUF, checked to fit a vocabulary of `vocab`.
fn tokenizer_metadata(path: &Path, vocab: usize) -> Result<Metadata> {
    let (content, _) = read_gguf(path)?;
    let tokens = content
        .metadata
        .get("tokenizer.ggml.tokens")
        .context("the tokenizer GGUF has no tokenizer.ggml.tokens")?
        .to_vec()?
        .len();
    if tokens > vocab {
        bail!(
            "{} has {tokens} tokens, more than the shape's vocabulary {vocab}",
            path.display()
        );
    }
    Ok(content
        .metadata
        .into_iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .collect())
}

fn shape_metadata(s: &Shape, dtype: &str) -> Metadata {
    let u = |n: usize| Value::U32(n as u32);
    let head_dim = s.hidden / s.heads;
    vec![
        ("general.architecture".into(), Value::String("llama".into())),
        (
            "general.name".into(),
            Value::String(format!("synthetic {} {dtype}", s.name)),
        ),
        ("llama.block_count".into(), u(s.layers)),
        ("llama.context_length".into(), u(s.context)),
        ("llama.embedding_length".into(), u(s.hidden)),
        ("llama.feed_forward_length".into(), u(s.ff)),
        ("llama.attention.head_count".into(), u(s.heads)),
        ("llama.attention.head_count_kv".into(), u(s.kv_heads)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-5),
        ),
        ("llama.rope.dimension_count".into(), u(head_dim)),
        ("llama.rope.freq_base".into(), Value::F32(s.rope_base)),
        ("llama.vocab_size".into(), u(s.vocab)),
    ]
}

/// Every tensor's name, `[rows, cols]` (or `[len]`) and whether it is a norm.
fn tensor_specs(s: &Shape) -> Vec<(String, Vec<usize>, bool)> {
    let (d, kv) = (s.hidden, s.hidden / s.heads * s.kv_heads);
    let mut specs = vec![
        ("token_embd.weight".to_owned(), vec![s.vocab, d], false),
        ("output_norm.weight".to_owned(), vec![d], true),
    ];
    if !s.tied {
        specs.push(("output.weight".to_owned(), vec![s.vocab, d], false));
    }
    for i in 0..s.layers {
        let n = |t: &str| format!("blk.{i}.{t}.weight");
        specs.extend([
            (n("attn_norm"), vec![d], true),
            (n("ffn_norm"), vec![d], true),
            (n("attn_q"), vec![d, d], false),
            (n("attn_k"), vec![kv, d], false),
            (n("attn_v"), vec![kv, d], false),
            (n("attn_output"), vec![d, d], false),
            (n("ffn_gate"), vec![s.ff, d], false),
            (n("ffn_up"), vec![s.ff, d], false),
            (n("ffn_down"), vec![d, s.ff], false),
        ]);
    }
    specs
}

/// Rows per independently seeded chunk: the unit of parallel work.
const CHUNK_ROWS: usize = 256;

/// Standard deviation of the weights.
const STD: f32 = 0.02;

/// A `rows × cols` matrix of random weights with mean 0 and std 0.02 in `dtype` (Q8_0 where a
/// Q4_K row would not fill whole super-blocks). Each chunk of rows has its own stream, so the
/// result does not depend on the thread count.
///
/// f16 weights are normal. Quantized weights are written as blocks directly (random quants
/// under fixed scales, so uniform values): quantizing normal floats would cost minutes for
/// Llama-3-8B's shape, which the device check writes on the GPU machine.
fn random_matrix(rows: usize, cols: usize, dtype: GgmlDType, seed: u64) -> Result<QTensor> {
    let dtype = if dtype == GgmlDType::Q4K && !cols.is_multiple_of(256) {
        GgmlDType::Q8_0
    } else {
        dtype
    };
    let chunks: Vec<Vec<u8>> = (0..rows.div_ceil(CHUNK_ROWS))
        .into_par_iter()
        .map(|c| {
            let n = CHUNK_ROWS.min(rows - c * CHUNK_ROWS);
            let stream = seed.wrapping_add((c as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
            random_rows(n, cols, dtype, &mut SplitMix(stream))
        })
        .collect::<Result<_>>()?;
    Ok(qtensor_from_ggml(
        dtype,
        &chunks.concat(),
        vec![rows, cols],
        &Device::Cpu,
    )?)
}

/// `n` rows of `cols` weights in `dtype`'s storage format.
fn random_rows(n: usize, cols: usize, dtype: GgmlDType, rng: &mut SplitMix) -> Result<Vec<u8>> {
    if dtype == GgmlDType::F16 {
        let data: Vec<f32> = (0..n * cols).map(|_| STD * rng.normal()).collect();
        let t = Tensor::from_vec(data, (n, cols), &Device::Cpu)?;
        return Ok(QTensor::quantize(&t, dtype)?.data()?.into_owned());
    }
    let blocks = n * cols / dtype.block_size();
    let size = dtype.type_size();
    let mut bytes = vec![0u8; blocks * size];
    for chunk in bytes.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    // A uniform 4-bit quant has std √((16² − 1) / 12) ≈ 4.61 and mean 7.5; a uniform i8 one
    // std ≈ 73.9 and mean −0.5.
    let d4 = STD / 4.61;
    for block in bytes.chunks_exact_mut(size) {
        match dtype {
            // d, m (f16), then 16 bytes of 4-bit quants: d·q + m.
            GgmlDType::Q4_1 => set_f16s(block, &[d4, -7.5 * d4]),
            // d (f16), then 32 signed bytes: d·q.
            GgmlDType::Q8_0 => set_f16s(block, &[STD / 73.9]),
            // d, dmin (f16), 12 bytes of 6-bit scales and mins (all 1 here), 128 bytes of
            // 4-bit quants: d·1·q − dmin·1.
            GgmlDType::Q4K => {
                set_f16s(block, &[d4, 7.5 * d4]);
                block[4..8].fill(1);
                block[8..12].fill(1);
                block[12..16].fill(0x11);
            }
            other => bail!("no random block writer for {other:?}"),
        }
    }
    Ok(bytes)
}

/// Writes little-endian f16 values at the start of a block.
fn set_f16s(block: &mut [u8], values: &[f32]) {
    for (i, v) in values.iter().enumerate() {
        block[2 * i..2 * i + 2].copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
    }
}

/// splitmix64: small, fast and the same everywhere.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// A standard normal (Box–Muller, one of the pair).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

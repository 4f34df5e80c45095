//! Writes a Hugging Face model directory (`model.safetensors`, `config.json`, `tokenizer.json`,
//! `tokenizer_config.json`) from a GGUF file: every tensor dequantized, the Q and K rows put back
//! in Hugging Face's RoPE layout, the GGUF's tokenizer and chat template alongside.
//!
//! `cargo run -p sluice-models --example to_safetensors -- --out /tmp/smollm2-hf [--dtype bf16]`

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::DType;
use clap::Parser;
use sluice_models::hf_export::write_hf_dir;
use sluice_models::registry;

#[derive(Parser, Debug)]
#[command(about = "Convert a GGUF model into a Hugging Face safetensors directory")]
struct Args {
    /// A path to a .gguf file or a registry name.
    #[arg(long, env = "SLUICE_MODEL", default_value = "smollm2-135m-instruct")]
    model: String,
    /// Where registry models are cached.
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    model_dir: PathBuf,
    /// The directory to write (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Element type of the weights: f16, bf16 or f32.
    #[arg(long, default_value = "f16")]
    dtype: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dtype = match args.dtype.as_str() {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        other => bail!("unknown --dtype '{other}': expected f16, bf16 or f32"),
    };
    let location = registry::resolve(&args.model, &args.model_dir)?;
    write_hf_dir(&location.path, &args.out, dtype)
        .with_context(|| format!("converting {}", location.path.display()))?;
    println!("wrote {} ({})", args.out.display(), args.dtype);
    Ok(())
}

//! Tokenise, chat greedily, or score forced tokens with a model: the models crate end to end,
//! without the engine. With `--json` the last line of stdout is one JSON object (a contract
//! that checks outside this crate rely on):
//!
//! - `--tokenize TEXT [--parse-special]` → `{"ids": [...]}`
//! - `--messages JSON [--max-tokens N]` → `{"prompt_ids": [...], "ids": [...], "text": "..."}`
//! - `--prompt-ids JSON --force-ids JSON --top K` → `{"steps": [[[id, logprob], ...], ...]}`

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use sluice_models::chat_template::ChatMessage;
use sluice_models::logits::{argmax, top_logprobs};
use sluice_models::{
    registry, Backend, DeviceSpec, KvStore, Logits, Model, ModelOptions, SeqChunk, StepBatch,
};

#[derive(Parser, Debug)]
#[command(about = "Run a GGUF model directly: tokenize, greedy chat, or score forced tokens")]
struct Args {
    /// A path to a .gguf file or a registry name (smollm2-135m-instruct).
    #[arg(long, env = "SLUICE_MODEL", default_value = "smollm2-135m-instruct")]
    model: String,
    /// Where registry models are cached.
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    model_dir: PathBuf,
    /// Compute threads (0: one per core).
    #[arg(long, env = "SLUICE_THREADS", default_value_t = 0)]
    threads: usize,
    /// `kernels` (the CPU default) or `candle` (implied by a GPU device).
    #[arg(long, env = "SLUICE_BACKEND")]
    backend: Option<Backend>,
    /// `cpu` or `cuda:N`.
    #[arg(long, env = "SLUICE_DEVICE", default_value = "cpu")]
    device: DeviceSpec,
    /// Print one JSON object on the last line instead of text.
    #[arg(long)]
    json: bool,
    /// Tokenise this text.
    #[arg(long, conflicts_with_all = ["messages", "prompt_ids"])]
    tokenize: Option<String>,
    /// With --tokenize: recognise special-token text such as <|im_start|>.
    #[arg(long, requires = "tokenize")]
    parse_special: bool,
    /// A chat as JSON (`[{"role": "user", "content": "..."}]`) to answer greedily.
    #[arg(long, conflicts_with = "prompt_ids")]
    messages: Option<String>,
    /// With --messages: the most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Token ids of a prompt to score (JSON array).
    #[arg(long, requires = "force_ids")]
    prompt_ids: Option<String>,
    /// Token ids forced after the prompt (JSON array).
    #[arg(long, requires = "prompt_ids")]
    force_ids: Option<String>,
    /// With --prompt-ids: how many of the most likely tokens to report per step.
    #[arg(long, default_value_t = 10)]
    top: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let location = registry::resolve(&args.model, &args.model_dir)?;
    let options = ModelOptions {
        threads: args.threads,
        device: args.device,
        backend: Backend::resolve(args.backend, args.device)?,
    };
    let model = Model::load(&location.path, &options)
        .with_context(|| format!("loading {}", location.path.display()))?;
    let mut out = std::io::stdout().lock();
    if let Some(text) = &args.tokenize {
        let ids = model.tokenizer().encode(text, args.parse_special)?;
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "ids": ids }))?;
        } else {
            for id in &ids {
                writeln!(
                    out,
                    "{id:>6} {:?}",
                    model.tokenizer().id_to_token(*id).unwrap_or_default()
                )?;
            }
        }
    } else if let Some(messages) = &args.messages {
        let messages: Vec<ChatMessage> =
            serde_json::from_str(messages).context("--messages is not a JSON chat")?;
        let template = model
            .chat_template()
            .context("the model has no chat template")?;
        let prompt = template.render(&messages, true)?;
        let prompt_ids = model.tokenizer().encode(&prompt, true)?;
        let ids = greedy(&model, &prompt_ids, args.max_tokens)?;
        let text = model.tokenizer().decode(&ids, true)?;
        if args.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({ "prompt_ids": prompt_ids, "ids": ids, "text": text })
            )?;
        } else {
            writeln!(out, "{prompt}{text}")?;
        }
    } else if let (Some(prompt), Some(force)) = (&args.prompt_ids, &args.force_ids) {
        let prompt: Vec<u32> =
            serde_json::from_str(prompt).context("--prompt-ids is not a JSON array of ids")?;
        let force: Vec<u32> =
            serde_json::from_str(force).context("--force-ids is not a JSON array of ids")?;
        let steps = score(&model, &prompt, &force, args.top)?;
        if args.json {
            writeln!(out, "{}", serde_json::json!({ "steps": steps }))?;
        } else {
            for (i, step) in steps.iter().enumerate() {
                writeln!(out, "step {i}: {step:?}")?;
            }
        }
    } else {
        bail!("nothing to do: pass --tokenize, --messages or --prompt-ids with --force-ids");
    }
    Ok(())
}

/// A KV store just large enough for one sequence of `tokens` positions, and its block table.
fn single_sequence_kv(model: &Model, tokens: usize) -> Result<(KvStore, Vec<u32>)> {
    let block = sluice_models::kv::DEFAULT_BLOCK_SIZE;
    let kv = model.new_kv_store(tokens.div_ceil(block).max(1), block)?;
    let table = (0..kv.num_blocks() as u32).collect();
    Ok((kv, table))
}

/// Greedy decoding: prefill the prompt, then one token per step until EOS (kept) or the limit.
fn greedy(model: &Model, prompt: &[u32], max_tokens: usize) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let ctx = model.config().context_length;
    let max_tokens = max_tokens.min(ctx.saturating_sub(prompt.len()));
    let (mut kv, table) = single_sequence_kv(model, prompt.len() + max_tokens)?;
    let mut ids = Vec::new();
    let mut feed = prompt.to_vec();
    let mut pos = 0;
    while ids.len() < max_tokens {
        let batch = StepBatch {
            seqs: vec![SeqChunk {
                tokens: feed.clone(),
                start_pos: pos,
                block_table: table.clone(),
                logits: Logits::Last,
            }],
        };
        let logits = model.forward(&batch, &mut kv)?.to_vec2::<f32>()?;
        pos += feed.len();
        let next = argmax(&logits[0]);
        ids.push(next);
        if model.tokenizer().is_eos(next) {
            break;
        }
        feed = vec![next];
    }
    Ok(ids)
}

/// The `top` most likely tokens after the prompt and after each forced token but the last.
fn score(model: &Model, prompt: &[u32], force: &[u32], top: usize) -> Result<Vec<Vec<(u32, f32)>>> {
    if prompt.is_empty() || force.is_empty() {
        bail!("--prompt-ids and --force-ids must both be non-empty");
    }
    let mut tokens = prompt.to_vec();
    tokens.extend_from_slice(&force[..force.len() - 1]);
    let (mut kv, table) = single_sequence_kv(model, tokens.len())?;
    let batch = StepBatch {
        seqs: vec![SeqChunk {
            tokens,
            start_pos: 0,
            block_table: table,
            logits: Logits::All,
        }],
    };
    let rows = model.forward(&batch, &mut kv)?.to_vec2::<f32>()?;
    Ok(rows[prompt.len() - 1..]
        .iter()
        .map(|row| top_logprobs(row, top))
        .collect())
}

//! `make bench`: the engine-free figures of the forward pass on this machine.
//!
//! Prints model load time, RSS after load, prefill tok/s for a 512-token prompt, single-stream
//! decode tok/s at context 512, and batched decode tok/s at batch 4, 16 and 64 (every sequence
//! at context 512, sharing the prompt's KV blocks as a prefix cache would). Each figure is the
//! best of `--repeat` runs (3), as the peer's script reports its best of three. With `--peer FILE`
//! (the JSON line of ../shared/peers/llamacpp_bench.py, measured in the same run) it prints the
//! ratios to llama.cpp too. `--backend candle` (or `--device cuda:N`) measures the candle
//! backend instead of the CPU kernels.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use sluice_models::{
    registry, Backend, DeviceSpec, KvStore, Logits, Model, ModelOptions, SeqChunk, StepBatch,
};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, env = "SLUICE_MODEL", default_value = "smollm2-135m-instruct")]
    model: String,
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    model_dir: PathBuf,
    /// Compute threads (the peer uses 2).
    #[arg(long, env = "SLUICE_THREADS", default_value_t = 2)]
    threads: usize,
    /// Decode steps per measurement.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Repetitions of each measurement; the best is reported (the peer's script takes the
    /// best of three too: on a shared host, the best run is the one least disturbed).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Batch sizes for batched decode.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64")]
    batches: Vec<usize>,
    /// The peer's JSON figures, to print ratios.
    #[arg(long)]
    peer: Option<PathBuf>,
    /// `kernels` (the CPU default) or `candle` (implied by a GPU device).
    #[arg(long)]
    backend: Option<Backend>,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
}

const CONTEXT: usize = 512;
const BLOCK: usize = 16;

/// Everything measured, for printing.
struct Figures {
    load_s: f64,
    rss_mib: f64,
    prefill_s: f64,
    single: f64,
    batched: Vec<(usize, f64)>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let location = registry::resolve(&args.model, &args.model_dir)?;
    let t0 = Instant::now();
    let model = Model::load(
        &location.path,
        &ModelOptions {
            threads: args.threads,
            device: args.device,
            backend: Backend::resolve(args.backend, args.device)?,
        },
    )?;
    let load_s = t0.elapsed().as_secs_f64();
    let rss_mib = rss_mib().unwrap_or(f64::NAN);
    let prompt = bench_prompt(&model)?;
    let mut bench = Bench::new(&model, &args, prompt)?;
    let prefill_s = bench.prefill()?;
    bench.decode_once(1)?; // warm-up
    let single = bench.decode(1)?;
    let mut batched = Vec::new();
    for &b in &args.batches {
        batched.push((b, bench.decode(b)?));
    }
    let figures = Figures {
        load_s,
        rss_mib,
        prefill_s,
        single,
        batched,
    };
    print_figures(&model, &location.path, &figures);
    match &args.peer {
        Some(peer) => print_peer(peer, &figures)?,
        None => println!("peer: not measured (make bench runs it when the llama.cpp venv exists; see ../shared/peers)"),
    }
    Ok(())
}

/// The same text as the peer's script, cut to 512 tokens.
fn bench_prompt(model: &Model) -> Result<Vec<u32>> {
    let words =
        "the quick brown fox jumps over the lazy dog while seven wise owls count stars ".repeat(60);
    let prompt: Vec<u32> = model
        .tokenizer()
        .encode(&words, false)?
        .into_iter()
        .take(CONTEXT)
        .collect();
    anyhow::ensure!(
        prompt.len() == CONTEXT,
        "the bench prompt is only {} tokens",
        prompt.len()
    );
    Ok(prompt)
}

/// The model, a KV pool and the prompt every sequence shares as a cached prefix.
struct Bench<'a> {
    model: &'a Model,
    kv: KvStore,
    prompt: Vec<u32>,
    prompt_blocks: usize,
    own_blocks: usize,
    steps: usize,
    repeat: usize,
}

impl<'a> Bench<'a> {
    fn new(model: &'a Model, args: &Args, prompt: Vec<u32>) -> Result<Self> {
        let max_batch = args.batches.iter().copied().max().unwrap_or(1).max(1);
        let prompt_blocks = CONTEXT / BLOCK;
        let own_blocks = args.steps.div_ceil(BLOCK) + 1;
        let kv = model.new_kv_store(prompt_blocks + max_batch * own_blocks, BLOCK)?;
        Ok(Self {
            model,
            kv,
            prompt,
            prompt_blocks,
            own_blocks,
            steps: args.steps,
            repeat: args.repeat.max(1),
        })
    }

    /// Sequence `s`'s blocks: the shared prompt's, then its own.
    fn table(&self, s: usize) -> Vec<u32> {
        let mut t: Vec<u32> = (0..self.prompt_blocks as u32).collect();
        let first = (self.prompt_blocks + s * self.own_blocks) as u32;
        t.extend(first..first + self.own_blocks as u32);
        t
    }

    /// Seconds to prefill the prompt: best of `repeat`.
    fn prefill(&mut self) -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..self.repeat {
            let batch = StepBatch {
                seqs: vec![SeqChunk {
                    tokens: self.prompt.clone(),
                    start_pos: 0,
                    block_table: self.table(0),
                    logits: Logits::Last,
                }],
            };
            let t = Instant::now();
            self.model.forward_host(&batch, &mut self.kv)?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    }

    /// Decode tok/s of one run of `steps` steps at `batch_size`.
    fn decode_once(&mut self, batch_size: usize) -> Result<f64> {
        let t = Instant::now();
        for step in 0..self.steps {
            let seqs = (0..batch_size)
                .map(|s| SeqChunk {
                    tokens: vec![self.prompt[(step + s) % CONTEXT]],
                    start_pos: CONTEXT + step,
                    block_table: self.table(s),
                    logits: Logits::Last,
                })
                .collect();
            self.model.forward_host(&StepBatch { seqs }, &mut self.kv)?;
        }
        Ok((batch_size * self.steps) as f64 / t.elapsed().as_secs_f64())
    }

    /// Decode tok/s at `batch_size`: best of `repeat` runs.
    fn decode(&mut self, batch_size: usize) -> Result<f64> {
        let mut best = 0f64;
        for _ in 0..self.repeat {
            best = best.max(self.decode_once(batch_size)?);
        }
        Ok(best)
    }
}

fn print_figures(model: &Model, path: &std::path::Path, f: &Figures) {
    let net = model.network();
    let gb = net.weight_bytes() as f64 / 1e9;
    // A step reads the weights once whatever its batch; prefill of the prompt is one step.
    let rates = |tok_s: f64, steps_s: f64, ctx: usize| {
        format!(
            "{:>6.1} GB/s of weights, {:>6.1} GFLOP/s",
            gb * steps_s,
            tok_s * net.flops_per_token(ctx) / 1e9
        )
    };
    println!(
        "sluice forward pass ({} backend on {}, {} threads, {})",
        model.backend(),
        model.device(),
        net.threads(),
        path.display()
    );
    println!(
        "  weights per step {:.1} MB; {:.3} GFLOP per token at context 512",
        gb * 1e3,
        net.flops_per_token(CONTEXT) / 1e9
    );
    println!("  load time              {:>8.2} s", f.load_s);
    println!("  RSS after load         {:>8.0} MiB", f.rss_mib);
    let prefill = CONTEXT as f64 / f.prefill_s;
    let prefill_rates = rates(prefill, 1.0 / f.prefill_s, CONTEXT / 2);
    println!("  prefill, 512 tokens    {prefill:>8.1} tok/s   {prefill_rates}");
    println!(
        "  decode at context 512  {:>8.1} tok/s   {}",
        f.single,
        rates(f.single, f.single, CONTEXT)
    );
    for (b, v) in &f.batched {
        let r = rates(*v, v / *b as f64, CONTEXT);
        println!(
            "  batched decode, {b:>3}    {v:>8.1} tok/s   {r}  ({:.2}x single stream)",
            v / f.single
        );
    }
}

/// The ratios to the peer's figures from the same run.
fn print_peer(peer: &std::path::Path, f: &Figures) -> Result<()> {
    let text =
        std::fs::read_to_string(peer).with_context(|| format!("reading {}", peer.display()))?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .context("no JSON in the peer output")?;
    let p: serde_json::Value = serde_json::from_str(line)?;
    let pp = p["prefill_512_tok_s"]
        .as_f64()
        .context("peer prefill figure")?;
    let tg = p["decode_tok_s_at_ctx_512"]
        .as_f64()
        .context("peer decode figure")?;
    println!(
        "peer: {} ({} threads), same run",
        p["peer"].as_str().unwrap_or("?"),
        p["threads"]
    );
    let prefill = CONTEXT as f64 / f.prefill_s;
    println!(
        "  prefill, 512 tokens    {pp:>8.1} tok/s   sluice/peer {:.2}",
        prefill / pp
    );
    println!(
        "  decode at context 512  {tg:>8.1} tok/s   sluice/peer {:.2}",
        f.single / tg
    );
    for (b, v) in &f.batched {
        println!(
            "  batched decode, {b:>3}    sluice/peer single stream {:.2}",
            v / tg
        );
    }
    Ok(())
}

/// Resident set size from /proc (Linux); `None` elsewhere.
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

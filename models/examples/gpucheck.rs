//! The measurements of `make check-gpu` (scripts/check-gpu.sh runs this binary on a GPU
//! machine and assembles its answers into one JSON file). Each mode prints one JSON object:
//!
//! - `agree`: teacher-forced logprobs of the model on `--device` against the CPU kernels, over
//!   fixed token sequences: max and mean |Δ logprob| over each row's reference top 10, and the
//!   share of rows whose top-1 token agrees;
//! - `bench`: prefill tok/s over `--batches`' largest batch of `--ctx`-token prompts, then for
//!   each batch size `--steps` decode steps at context `--ctx`: aggregate tok/s and the
//!   inter-token latency (a step's time) mean, p50 and p90;
//! - `identical`: whether a sequence's greedy tokens are the same alone and inside a batch of
//!   16 sequences of other lengths;
//! - `profile` (candle only): `bench`'s decode steps with the device synchronised at each phase
//!   of the forward pass, giving each phase's milliseconds per step by batch size (the
//!   synchronisation serialises the step, so the total exceeds `bench`'s step time; what is
//!   left over by the phases' kernels is launch overhead);
//! - `attention` (candle only): the paged-attention op against the gather path on the same
//!   device: teacher-forced logprobs of a ragged batch (prefill chunks, then decodes) with every
//!   row paged and split (decodes paged, prefill gathered), each against every row gathered
//!   (|Δ logprob| over each row's top 10); then `bench`'s prefill and decode steps timed on
//!   each path;
//! - `graphs` (candle only): decode steps replayed from CUDA graphs (`SLUICE_CUDA_GRAPHS`,
//!   which this mode sets) against eager ones: teacher-forced logprobs of a ragged batch both
//!   ways (|Δ logprob| over each row's top 10), how many steps were replayed and graphs
//!   captured (or why capturing failed), then `bench`'s decode steps timed each way. On the
//!   CPU the path runs eagerly: nothing is captured.
//! - `host-copy` (candle only): a step's logits copied to the host through pageable memory,
//!   into a page-locked buffer (`SLUICE_PINNED_LOGITS`, the default), and with the rows of
//!   greedy and sampled sequences reduced to their token on the device besides
//!   (`SLUICE_DEVICE_ARGMAX`, `SLUICE_DEVICE_DRAWS`, the defaults): teacher-forced logprobs
//!   each way (identical unless a copy is wrong), whether the buffers stayed on (an
//!   allocation failure turns them off), sixteen prompts' greedy and sampled tokens, and top
//!   lists for top-p over the whole row, picked on the device against the host's from whole
//!   rows (`device_picks_ids`: `greedy`, `sampled`, `nucleus`, and `changed`: draws after a
//!   bias and penalties made on the device), then `bench`'s
//!   prefill and decode steps timed each way (with `--sampled`, sampled decode steps too).
//!   On the CPU nothing is pinned.
//!
//! The timed decode steps ask for their tokens alone ([`Logits::Pick`]), as the engine does
//! for a request that reads nothing else: greedy ids, and with `--sampled` (`bench` and the
//! comparisons) draws at temperature 1 besides. A step is timed until its tokens are on the
//! host (picked there from whole rows, on all cores, when the device does not pick them).
//!
//! `--attention` (or `SLUICE_ATTENTION`) picks the candle backend's attention path for the
//! other modes.
//!
//! It runs on the CPU too (`--device cpu`), which is how the script is tested without a GPU.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use rayon::prelude::*;
use serde_json::json;
use sluice_models::adjust::Entry;
use sluice_models::candle::AttentionPath;
use sluice_models::host_logits::Row;
use sluice_models::logits::{argmax, log_softmax};
use sluice_models::{
    Adjust, Backend, DeviceSpec, HostLogits, KvStore, LlamaConfig, Logits, Nucleus, Pick, SeqChunk,
    StepBatch,
};

#[derive(Parser, Debug)]
#[command(about = "GPU check measurements (one JSON object per run)")]
struct Args {
    /// The model (a .gguf file or a Hugging Face directory).
    #[arg(long)]
    model: PathBuf,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// kernels (CPU only) or candle.
    #[arg(long, default_value = "kernels")]
    backend: String,
    /// Compute threads for CPU backends (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The candle backend's attention path: auto, gather, paged or split (default: SLUICE_ATTENTION,
    /// else auto).
    #[arg(long)]
    attention: Option<AttentionPath>,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    Agree {
        /// Tokens per sequence (two sequences).
        #[arg(long, default_value_t = 96)]
        tokens: usize,
    },
    Bench(SpeedArgs),
    Identical {
        #[arg(long, default_value_t = 24)]
        tokens: usize,
    },
    Profile {
        #[arg(long, value_delimiter = ',', default_value = "1,64")]
        batches: Vec<usize>,
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        #[arg(long, default_value_t = 8)]
        steps: usize,
    },
    Attention(CompareArgs),
    Graphs(CompareArgs),
    HostCopy(CompareArgs),
}

/// Decode batch sizes, the context they decode at, and the decode steps timed at each.
#[derive(clap::Args, Debug)]
struct SpeedArgs {
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    batches: Vec<usize>,
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    #[arg(long, default_value_t = 32)]
    steps: usize,
    /// Also time decode steps that draw at temperature 1 (OpenAI's default), beside greedy
    /// ones (`decode_sampled`).
    #[arg(long)]
    sampled: bool,
}

/// What the comparisons of two ways of running (`attention`, `graphs`) measure.
#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// Tokens per sequence in the agreement check (four sequences, the last 8 decoded).
    #[arg(long, default_value_t = 96)]
    tokens: usize,
    #[command(flatten)]
    speed: SpeedArgs,
}

const BLOCK: usize = 16;

// ---- Wiring to the models crate: everything below this block uses only `Net`. ----

struct Net {
    model: sluice_models::Model,
}

impl Net {
    fn load(path: &Path, device: &str, backend: &str, threads: usize) -> Result<Self> {
        let device: DeviceSpec = device.parse()?;
        let backend = Backend::resolve(Some(backend.parse()?), device)?;
        let options = sluice_models::ModelOptions {
            device,
            backend,
            threads,
        };
        let model = sluice_models::Model::load(path, &options)
            .with_context(|| format!("loading {}", path.display()))?;
        Ok(Self { model })
    }

    fn config(&self) -> &LlamaConfig {
        self.model.config()
    }

    fn new_kv(&self, tokens_per_seq: usize, seqs: usize) -> Result<KvStore> {
        let blocks = seqs * tokens_per_seq.div_ceil(BLOCK);
        Ok(self.model.new_kv_store(blocks, BLOCK)?)
    }

    /// The candle network, for its per-phase profile.
    fn candle(&self) -> Result<&sluice_models::CandleLlama> {
        match self.model.network() {
            sluice_models::Network::Candle(c) => Ok(c),
            sluice_models::Network::Kernels(_) => {
                anyhow::bail!("profile, attention and --attention need --backend candle")
            }
        }
    }

    /// The logits rows the batch asks for, on the host, each copied into its own `Vec`.
    fn forward(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<Vec<Vec<f32>>> {
        Ok(self.model.forward_host(batch, kv)?.to_vecs())
    }

    /// The logits rows where the step left them on the host, as a served step hands them to
    /// sampling: what the timed loops time.
    fn forward_host(&self, batch: &StepBatch, kv: &mut KvStore) -> Result<HostLogits> {
        Ok(self.model.forward_host(batch, kv)?)
    }
}

// ---- End of the wiring. ----

fn main() -> Result<()> {
    let args = Args::parse();
    if matches!(args.mode, Mode::Graphs(_)) {
        // Read when the device opens: a capture needs the GPU on a stream of its own. Nothing
        // else runs yet to read the environment concurrently.
        std::env::set_var("SLUICE_CUDA_GRAPHS", "1");
    }
    let net = Net::load(&args.model, &args.device, &args.backend, args.threads)?;
    if let Some(path) = args.attention {
        net.candle()?.set_attention(path);
    }
    let started = Instant::now();
    let mut out = match &args.mode {
        Mode::Agree { tokens } => agree(&net, &args, *tokens)?,
        Mode::Bench(s) => bench(&net, s)?,
        Mode::Identical { tokens } => identical(&net, *tokens)?,
        Mode::Profile {
            batches,
            ctx,
            steps,
        } => profile(&net, batches, *ctx, *steps)?,
        Mode::Attention(a) => attention(&net, a)?,
        Mode::Graphs(a) => graphs(&net, a)?,
        Mode::HostCopy(a) => host_copy(&net, a)?,
    };
    out["model"] = json!(args.model.display().to_string());
    out["device"] = json!(args.device);
    out["backend"] = json!(args.backend);
    out["layers"] = json!(net.config().block_count);
    out["seconds"] = json!(started.elapsed().as_secs_f64());
    println!("{out}");
    Ok(())
}

/// Deterministic token ids below the vocabulary size (no tokenizer needed: synthetic models
/// and real ones alike).
fn tokens(seed: usize, n: usize, vocab: usize) -> Vec<u32> {
    let mut x = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Ordinary tokens: skip the first 1000 ids, where special tokens live.
            (1000 + x % (vocab as u64 - 1000)) as u32
        })
        .collect()
}

/// A sequence's chunk with its own contiguous run of blocks in a pool shared by `slot`s.
fn chunk(tokens: Vec<u32>, start: usize, slot: usize, per_seq: usize, logits: Logits) -> SeqChunk {
    let blocks = per_seq.div_ceil(BLOCK);
    SeqChunk {
        block_table: ((slot * blocks) as u32..((slot + 1) * blocks) as u32).collect(),
        tokens,
        start_pos: start,
        logits,
    }
}

fn teacher_forced(net: &Net, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
    let per_seq = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let mut kv = net.new_kv(per_seq, seqs.len())?;
    let batch = StepBatch {
        seqs: seqs
            .iter()
            .enumerate()
            .map(|(s, t)| chunk(t.clone(), 0, s, per_seq, Logits::All))
            .collect(),
    };
    Ok(net
        .forward(&batch, &mut kv)?
        .iter()
        .map(|r| log_softmax(r))
        .collect())
}

fn agree(net: &Net, args: &Args, n: usize) -> Result<serde_json::Value> {
    let vocab = net.config().vocab_size;
    let seqs = vec![tokens(1, n, vocab), tokens(2, n * 2 / 3, vocab)];
    let reference = Net::load(&args.model, "cpu", "kernels", args.threads)?;
    let want = teacher_forced(&reference, &seqs)?;
    let got = teacher_forced(net, &seqs)?;
    let (mut max, mut sum, mut count, mut top1) = (0f32, 0f64, 0usize, 0usize);
    for (w, g) in want.iter().zip(&got) {
        let mut order: Vec<usize> = (0..w.len()).collect();
        order.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
        top1 += usize::from(argmax(g) as usize == order[0]);
        for &i in &order[..10] {
            let d = (w[i] - g[i]).abs();
            max = max.max(d);
            sum += f64::from(d);
            count += 1;
        }
    }
    Ok(json!({
        "mode": "agree",
        "reference": "cpu kernels",
        "rows": want.len(),
        "max_abs_dlogprob": max,
        "mean_abs_dlogprob": sum / count.max(1) as f64,
        "top1_agreement": top1 as f64 / want.len().max(1) as f64,
    }))
}

fn bench(net: &Net, a: &SpeedArgs) -> Result<serde_json::Value> {
    let (most, ctx) = (a.batches.iter().copied().max().unwrap_or(1), a.ctx);
    let mut kv = net.new_kv(ctx + a.steps + 1, most)?;
    let mut out = speed(net, &mut kv, a)?;
    out["mode"] = json!("bench");
    out["ctx"] = json!(ctx);
    out["prefill_tokens"] = json!(most * ctx);
    Ok(out)
}

/// Prefill tok/s over `a`'s largest batch of `a.ctx`-token prompts, then each batch size's
/// decode steps (greedy, and sampled when `a.sampled`), in `kv` (room for the largest batch).
fn speed(net: &Net, kv: &mut KvStore, a: &SpeedArgs) -> Result<serde_json::Value> {
    let (ctx, steps) = (a.ctx, a.steps);
    let most = a.batches.iter().copied().max().unwrap_or(1);
    let per_seq = ctx + steps + 1;
    let (last, prefill_s) = prefill(net, kv, most, ctx, per_seq)?;
    let mut out = json!({"prefill_tok_s": (most * ctx) as f64 / prefill_s});
    let kinds: &[(&str, Decode)] = if a.sampled {
        &[
            ("decode", Decode::Greedy),
            ("decode_sampled", Decode::Sampled),
        ]
    } else {
        &[("decode", Decode::Greedy)]
    };
    for &(key, decode) in kinds {
        let mut timed = Vec::new();
        for &b in &a.batches {
            timed.push(decode_steps(
                net,
                kv,
                &last[..b],
                ctx,
                per_seq,
                steps,
                decode,
            )?);
        }
        out[key] = json!(timed);
    }
    Ok(out)
}

/// `bench`'s decode steps, profiled phase by phase for each batch size.
fn profile(net: &Net, batches: &[usize], ctx: usize, steps: usize) -> Result<serde_json::Value> {
    let candle = net.candle()?;
    let most = batches.iter().copied().max().unwrap_or(1);
    let per_seq = ctx + steps + 1;
    let mut kv = net.new_kv(per_seq, most)?;
    let (last, _) = prefill(net, &mut kv, most, ctx, per_seq)?;
    let mut out = Vec::new();
    for &b in batches {
        let mut timed = || {
            decode_steps(
                net,
                &mut kv,
                &last[..b],
                ctx,
                per_seq,
                steps,
                Decode::Greedy,
            )
        };
        let plain = timed()?;
        candle.set_profiling(true);
        // `decode_steps` runs one unmeasured warm-up step more than it times.
        let profiled = timed()?;
        let phases = candle.take_profile();
        candle.set_profiling(false);
        let per_step = |s: f64| s * 1e3 / (steps + 1) as f64;
        let phase_ms: serde_json::Map<String, serde_json::Value> = phases
            .iter()
            .map(|&(name, s)| (name.to_string(), json!(per_step(s))))
            .collect();
        out.push(json!({
            "batch": b,
            "step_ms": plain["itl_ms_mean"],
            "profiled_step_ms": profiled["itl_ms_mean"],
            "phase_ms_per_step": phase_ms,
        }));
    }
    Ok(json!({"mode": "profile", "ctx": ctx, "steps": steps, "profile": out}))
}

/// Prefills `most` prompts of `ctx` tokens, one sequence per step after a warm-up; returns each
/// sequence's next token and the seconds the prompts took.
fn prefill(
    net: &Net,
    kv: &mut KvStore,
    most: usize,
    ctx: usize,
    per_seq: usize,
) -> Result<(Vec<u32>, f64)> {
    let vocab = net.config().vocab_size;
    // Warm-up (kernel loading, first allocations), then every prompt prefilled once, one
    // sequence per step.
    let warm = StepBatch {
        seqs: vec![chunk(tokens(0, 8, vocab), 0, 0, per_seq, Logits::Last)],
    };
    net.forward(&warm, kv)?;
    let started = Instant::now();
    let mut last = Vec::with_capacity(most);
    for s in 0..most {
        let batch = StepBatch {
            seqs: vec![chunk(
                tokens(s + 10, ctx, vocab),
                0,
                s,
                per_seq,
                Logits::Last,
            )],
        };
        last.extend(argmaxes(&net.forward_host(&batch, kv)?));
    }
    Ok((last, started.elapsed().as_secs_f64()))
}

/// Each row's greedy token (whole rows only).
fn argmaxes(logits: &HostLogits) -> Vec<u32> {
    (0..logits.rows()).map(|i| argmax(logits.row(i))).collect()
}

/// How timed decode steps choose their tokens, as the engine asks for a request's.
#[derive(Debug, Clone, Copy)]
enum Decode {
    /// Greedy ids ([`Pick::Argmax`]).
    Greedy,
    /// Draws at temperature 1 ([`Pick::Draw`]; OpenAI's default and the load tester's).
    Sampled,
    /// Top-p over the whole row ([`Pick::Top`] with a [`Nucleus`]): 0.95 at temperature 0.7
    /// (what chat front ends often send) for even sequences, 0.5 at 0.2 for odd ones (a
    /// sharp nucleus, which the top 64 hold even on a random model): the top 64 with the
    /// row's mass, or the row whole.
    Nucleus,
}

impl Decode {
    /// Sequence `s`'s pick at decode step `step`, over the ids below `below`.
    fn pick(self, below: u32, step: usize, s: usize) -> Pick {
        match self {
            Decode::Greedy => Pick::Argmax {
                below,
                logprobs: None,
            },
            Decode::Sampled => Pick::Draw {
                below,
                temperature: 1.0,
                min_p: 0.0,
                uniform: uniform(step, s),
                logprobs: None,
            },
            Decode::Nucleus => Pick::Top {
                below,
                k: 64,
                nucleus: Some(Nucleus {
                    temperature: [0.7, 0.2][s % 2],
                    top_p: [0.95, 0.5][s % 2],
                }),
            },
        }
    }
}

/// A fixed number in [0, 1) for sequence `s` at step `step` (splitmix64's finaliser).
fn uniform(step: usize, s: usize) -> f64 {
    let mut x = ((step as u64) << 32 | s as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as f64 / 2f64.powi(64)
}

/// Each row's token under its pick: the device's where it made it, else made here from the
/// whole row, after its changes (`changed[i]`, or none), as the engine's sampler does (rows
/// in parallel, as the engine draws them).
fn picked(logits: &HostLogits, picks: &[Pick], changed: &[Option<&Adjust>]) -> Vec<u32> {
    (0..logits.rows())
        .into_par_iter()
        .map(|i| match logits.get(i) {
            Row::Picked(p) => p.id,
            // Not asked for here; its most likely id, as `on_host` says.
            Row::Top(t) => t.logits[0].0,
            Row::Logits(r) => match changed.get(i).copied().flatten() {
                Some(c) => {
                    let mut r = r.to_vec();
                    c.apply(&mut r);
                    picks[i].on_host(&r)
                }
                None => picks[i].on_host(r),
            },
        })
        .collect()
}

/// `steps` decode steps of `first.len()` sequences whose prompts fill `0..ctx`; each step
/// rewrites positions from `ctx` on, so batch sizes can be measured one after the other.
fn decode_steps(
    net: &Net,
    kv: &mut KvStore,
    first: &[u32],
    ctx: usize,
    per_seq: usize,
    steps: usize,
    decode: Decode,
) -> Result<serde_json::Value> {
    let below = net.config().vocab_size as u32;
    let mut next = first.to_vec();
    let mut times = Vec::with_capacity(steps);
    for step in 0..=steps {
        let picks: Vec<Pick> = (0..next.len())
            .map(|s| decode.pick(below, step, s))
            .collect();
        let batch = StepBatch {
            seqs: next
                .iter()
                .enumerate()
                .map(|(s, &t)| chunk(vec![t], ctx + step, s, per_seq, Logits::Pick(picks[s])))
                .collect(),
        };
        let started = Instant::now();
        next = picked(&net.forward_host(&batch, kv)?, &picks, &[]);
        // Step 0 warms this batch shape up.
        if step > 0 {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let pct = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize] * 1e3;
    Ok(json!({
        "batch": first.len(),
        "steps": times.len(),
        "tok_s": first.len() as f64 / mean,
        "itl_ms_mean": mean * 1e3,
        "itl_ms_p50": pct(0.5),
        "itl_ms_p90": pct(0.9),
    }))
}

/// Greedy tokens of each prompt, all decoded together in one batch per step.
fn greedy(net: &Net, prompts: &[Vec<u32>], n: usize) -> Result<Vec<Vec<u32>>> {
    let per_seq = prompts.iter().map(Vec::len).max().unwrap_or(0) + n + 1;
    let mut kv = net.new_kv(per_seq, prompts.len())?;
    let prefill = StepBatch {
        seqs: prompts
            .iter()
            .enumerate()
            .map(|(s, p)| chunk(p.clone(), 0, s, per_seq, Logits::Last))
            .collect(),
    };
    let mut out: Vec<Vec<u32>> = net
        .forward(&prefill, &mut kv)?
        .iter()
        .map(|r| vec![argmax(r)])
        .collect();
    for step in 1..n {
        let batch = StepBatch {
            seqs: out
                .iter()
                .enumerate()
                .map(|(s, o)| {
                    let pos = prompts[s].len() + step - 1;
                    chunk(vec![o[step - 1]], pos, s, per_seq, Logits::Last)
                })
                .collect(),
        };
        for (o, r) in out.iter_mut().zip(net.forward(&batch, &mut kv)?) {
            o.push(argmax(&r));
        }
    }
    Ok(out)
}

fn identical(net: &Net, n: usize) -> Result<serde_json::Value> {
    let vocab = net.config().vocab_size;
    let prompts: Vec<Vec<u32>> = (0..16).map(|s| tokens(s + 100, 5 + 7 * s, vocab)).collect();
    let alone = greedy(net, &prompts[3..4], n)?;
    let together = greedy(net, &prompts, n)?;
    Ok(json!({
        "mode": "identical",
        "tokens": n,
        "batch": prompts.len(),
        "identical_alone_and_in_batch": alone[0] == together[3],
        "alone": alone[0],
        "in_batch": together[3],
    }))
}

/// Teacher-forced logprobs of `seqs`: all but each one's last `decodes` tokens prefilled in one
/// ragged batch, then those tokens fed one decode step at a time, all sequences together.
fn forced_steps(net: &Net, seqs: &[Vec<u32>], decodes: usize) -> Result<Vec<Vec<f32>>> {
    let per_seq = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let mut kv = net.new_kv(per_seq, seqs.len())?;
    let prefill = StepBatch {
        seqs: seqs
            .iter()
            .enumerate()
            .map(|(s, t)| chunk(t[..t.len() - decodes].to_vec(), 0, s, per_seq, Logits::All))
            .collect(),
    };
    let mut rows = net.forward(&prefill, &mut kv)?;
    for d in (1..=decodes).rev() {
        let batch = StepBatch {
            seqs: seqs
                .iter()
                .enumerate()
                .map(|(s, t)| {
                    let at = t.len() - d;
                    chunk(vec![t[at]], at, s, per_seq, Logits::Last)
                })
                .collect(),
        };
        rows.extend(net.forward(&batch, &mut kv)?);
    }
    Ok(rows.iter().map(|r| log_softmax(r)).collect())
}

/// Max and mean |Δ logprob| over every row's reference top 10.
fn logprob_gap(want: &[Vec<f32>], got: &[Vec<f32>]) -> serde_json::Value {
    let (mut max, mut sum, mut count) = (0f32, 0f64, 0usize);
    for (w, g) in want.iter().zip(got) {
        let mut order: Vec<usize> = (0..w.len()).collect();
        order.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
        for &i in &order[..10] {
            let d = (w[i] - g[i]).abs();
            max = max.max(d);
            sum += f64::from(d);
            count += 1;
        }
    }
    json!({"rows": want.len(), "max_abs_dlogprob": max, "mean_abs_dlogprob": sum / count.max(1) as f64})
}

/// The paged op against the gather path: agreement, then prefill and decode speed on each
/// path (split: decodes paged, prefill chunks gathered).
fn attention(net: &Net, a: &CompareArgs) -> Result<serde_json::Value> {
    let candle = net.candle()?;
    let paths = [
        ("gather", AttentionPath::Gather),
        ("paged", AttentionPath::Paged),
        ("split", AttentionPath::Split),
    ];
    let set = |path| candle.set_attention(path);
    let c = compare(net, (&paths, &set), a)?;
    candle.set_attention(AttentionPath::Auto);
    Ok(c.report("attention", &paths, &["paged", "split"], a))
}

/// Decode steps replayed from CUDA graphs against eager ones: agreement, what was captured and
/// replayed, then speed each way (prefill runs eagerly either way).
fn graphs(net: &Net, a: &CompareArgs) -> Result<serde_json::Value> {
    let candle = net.candle()?;
    let ways = [("eager", false), ("graphs", true)];
    let set = |on| candle.set_cuda_graphs(on);
    let mut out = compare(net, (&ways, &set), a)?.report("graphs", &ways, &["agreement"], a);
    out["status"] = status_json(&candle.cuda_graphs());
    Ok(out)
}

fn host_copy(net: &Net, a: &CompareArgs) -> Result<serde_json::Value> {
    let candle = net.candle()?;
    // (page-locked buffers, tokens picked on the device)
    let ways = [
        ("pageable", (false, false)),
        ("page_locked", (true, false)),
        ("device_picks", (true, true)),
    ];
    let set = |(pinned, picks)| {
        candle.set_pinned_logits(pinned);
        candle.set_device_argmax(picks);
        candle.set_device_draws(picks);
    };
    // The teacher-forced rows are whole rows whatever the switch: the third way's gap says
    // only that picking tokens leaves them alone; `device_picks_ids` checks the tokens.
    let gaps = ["agreement", "agreement_device_picks"];
    let mut out = compare(net, (&ways, &set), a)?.report("host-copy", &ways, &gaps, a);
    out["page_locked_after"] = json!(candle.pinned_logits());
    out["device_picks_ids"] = json!({
        "greedy": picks_agree(net, a.tokens, Decode::Greedy, false)?,
        "sampled": picks_agree(net, a.tokens, Decode::Sampled, false)?,
        "nucleus": picks_agree(net, a.tokens, Decode::Nucleus, false)?,
        "changed": picks_agree(net, a.tokens, Decode::Sampled, true)?,
    });
    set((true, true));
    Ok(out)
}

/// Sixteen prompts' tokens picked on the device and on the host from whole rows, in one
/// prefill step each way: how many agree (all of them, exact ties and a draw's rounding at a
/// boundary between two tokens aside; a top list's first id against the row's argmax), and
/// how many rows came back as top lists (`listed`; a nucleus they do not hold comes whole).
/// With `changed`, each row first gets a bias and penalties ([`changes`]): made on the device
/// one way, on the host's whole rows the other.
fn picks_agree(net: &Net, n: usize, decode: Decode, changed: bool) -> Result<serde_json::Value> {
    let candle = net.candle()?;
    let vocab = net.config().vocab_size;
    let seqs: Vec<Vec<u32>> = (0..16).map(|s| tokens(s + 40, n.max(2), vocab)).collect();
    let per_seq = n.max(2);
    let picks: Vec<Pick> = (0..seqs.len())
        .map(|s| decode.pick(vocab as u32, 0, s))
        .collect();
    let adjust: Vec<Option<Adjust>> = seqs
        .iter()
        .enumerate()
        .map(|(s, prompt)| changed.then(|| changes(s, prompt, vocab)))
        .collect();
    let (mut tokens_each_way, mut listed) = (Vec::new(), 0);
    for on_device in [true, false] {
        candle.set_device_argmax(on_device);
        candle.set_device_draws(on_device);
        let mut kv = net.new_kv(per_seq, seqs.len())?;
        let batch = StepBatch {
            seqs: (0..seqs.len())
                .map(|s| chunk(seqs[s].clone(), 0, s, per_seq, Logits::Pick(picks[s])))
                .collect(),
        };
        let logits = net.model.forward_host_adjusted(&batch, &mut kv, &adjust)?;
        if on_device {
            listed = (0..logits.rows())
                .filter(|&i| matches!(logits.get(i), Row::Top(_)))
                .count();
        }
        let changed: Vec<Option<&Adjust>> = adjust.iter().map(Option::as_ref).collect();
        tokens_each_way.push(picked(&logits, &picks, &changed));
    }
    let [device, host] = &tokens_each_way[..] else {
        unreachable!("two ways")
    };
    let same = device.iter().zip(host).filter(|(a, b)| a == b).count();
    Ok(json!({"rows": device.len(), "same": same, "listed": listed}))
}

/// Sequence `s`'s bias and penalties for [`picks_agree`]: a strong bias towards one id and
/// against another, and a repetition penalty with a frequency penalty on its prompt's ids.
fn changes(s: usize, prompt: &[u32], vocab: usize) -> Adjust {
    let mut entries: Vec<Entry> = prompt
        .iter()
        .map(|&id| Entry {
            repeat: 1.5,
            minus: 0.4,
            ..Entry::of(id)
        })
        .collect();
    let lifted = ((s * 7_919 + 11) % vocab) as u32;
    entries.push(Entry {
        bias: 6.0,
        ..Entry::of(lifted)
    });
    entries.push(Entry {
        bias: -100.0,
        ..Entry::of(prompt[0])
    });
    Adjust::merged(entries)
}

/// Ways of running the model, by name, and how to switch to one.
type Ways<'a, V> = (&'a [(&'a str, V)], &'a dyn Fn(V));

/// Each way's teacher-forced logprobs of a ragged batch (four sequences of about `n` tokens,
/// their last few decoded), then its prefill and decode speed.
fn compare<V: Copy>(net: &Net, (ways, set): Ways<'_, V>, a: &CompareArgs) -> Result<Compared> {
    let n = a.tokens;
    let vocab = net.config().vocab_size;
    let seqs: Vec<Vec<u32>> = (0..4)
        .map(|s| tokens(s + 20, n.saturating_sub(7 * s).max(2), vocab))
        .collect();
    let decodes = 8.min(seqs.iter().map(Vec::len).min().unwrap_or(1) - 1);
    let mut rows = Vec::new();
    for &(_, way) in ways {
        set(way);
        rows.push(forced_steps(net, &seqs, decodes)?);
    }
    let most = a.speed.batches.iter().copied().max().unwrap_or(1);
    let mut kv = net.new_kv(a.speed.ctx + a.speed.steps + 1, most)?;
    let mut speeds = serde_json::Map::new();
    for &(name, way) in ways {
        set(way);
        speeds.insert(name.into(), speed(net, &mut kv, &a.speed)?);
    }
    Ok(Compared {
        decodes,
        rows,
        speed: speeds,
    })
}

/// What [`compare`] measured: decodes per sequence, each way's logprob rows, speeds by name.
struct Compared {
    decodes: usize,
    rows: Vec<Vec<Vec<f32>>>,
    speed: serde_json::Map<String, serde_json::Value>,
}

impl Compared {
    /// A mode's report: the first of `ways` is the reference, and each other way's logprob
    /// gap to it goes under its key in `gaps`, in order.
    fn report<V>(
        self,
        mode: &str,
        ways: &[(&str, V)],
        gaps: &[&str],
        a: &CompareArgs,
    ) -> serde_json::Value {
        let mut out = json!({
            "mode": mode,
            "reference": ways[0].0,
            "decodes_per_sequence": self.decodes,
            "ctx": a.speed.ctx,
            "speed": self.speed,
        });
        for (i, key) in gaps.iter().enumerate() {
            out[*key] = logprob_gap(&self.rows[0], &self.rows[i + 1]);
        }
        out
    }
}

fn status_json(s: &sluice_models::candle::GraphStatus) -> serde_json::Value {
    json!({
        "on": s.on,
        "steps": s.steps,
        "replayed": s.replayed,
        "captured": s.captured,
        "capture_failed": s.capture_failed,
    })
}

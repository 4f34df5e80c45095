//! `make bench-engine`: closed-loop load straight on an `EngineHandle` (no HTTP).
//!
//! For each concurrency level, that many clients each submit requests back to back: a
//! ~200-token prompt (distinct per request, so nothing is cached) and 128 output tokens
//! (`ignore_eos`). Reports output tokens/s, TTFT and inter-token latency p50/p99; then the
//! prefix-cache case, where every prompt shares a long prefix; then the structured-output
//! case: the same load with every output held to a JSON schema, against unconstrained, with
//! the grammar masks' cost per token. The end-to-end peer
//! (llama.cpp's server over HTTP) is measured by the load tester; its figures from
//! `shared/peers/README.md` are printed for orientation only, not as a same-run ratio.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use sluice_engine::sampler::{sample, sample_all, Draw, SamplerState};
use sluice_engine::{
    Constraint, Engine, EngineConfig, EngineHandle, Event, Grammar, Request, SamplingParams,
};
use sluice_models::{registry, Logits, Model, ModelOptions, SeqChunk, StepBatch};

#[derive(Parser, Debug)]
struct Args {
    /// Registry name or path of a GGUF file.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    #[arg(long, env = "SLUICE_MODEL_DIR", default_value = "models/cache")]
    model_dir: PathBuf,
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Concurrency levels to run.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Requests per client at each level.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    #[arg(long, default_value_t = 128)]
    output_tokens: usize,
    #[arg(long, default_value_t = 200)]
    prompt_tokens: usize,
    /// Step token budget (the engine's default when unset).
    #[arg(long)]
    max_num_batched_tokens: Option<usize>,
    /// Unconstrained and schema runs of the structured-output case, alternated so both see
    /// the same machine.
    #[arg(long, default_value_t = 2)]
    structured_pairs: usize,
    /// Only the structured-output case.
    #[arg(long)]
    structured_only: bool,
    /// Only the sampling case.
    #[arg(long)]
    sampling_only: bool,
}

#[derive(Debug, Default)]
struct Sample {
    ttft: Duration,
    itl: Vec<Duration>,
    tokens: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let path = registry::resolve(&args.model, &args.model_dir)?.path;
    let model = Arc::new(Model::load(
        &path,
        &ModelOptions {
            threads: args.threads,
            ..ModelOptions::default()
        },
    )?);
    let mut config = EngineConfig::for_model(&model);
    if let Some(t) = args.max_num_batched_tokens {
        config.max_num_batched_tokens = t;
    }
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1);
    config.max_num_seqs = config.max_num_seqs.max(max_c);
    config.max_num_batched_tokens = config.max_num_batched_tokens.max(max_c);
    println!(
        "sluice engine, closed loop on the handle ({} threads, step budget {} tokens, {} KV blocks)",
        model.network().threads(),
        config.max_num_batched_tokens,
        config.num_kv_blocks.map_or("default".to_string(), |n| n.to_string())
    );
    println!(
        "  prompts ~{} tokens, {} output tokens, {} requests per client",
        args.prompt_tokens, args.output_tokens, args.rounds
    );
    sampling_case(&model)?;
    if args.sampling_only {
        return Ok(());
    }
    let engine = Engine::start(model.clone(), config)?;
    // Warm-up: page in the weights and the first KV blocks.
    let level = |clients| Level {
        clients,
        rounds: args.rounds,
        output_tokens: args.output_tokens,
        prompt_tokens: args.prompt_tokens,
        shared: None,
        constraint: None,
    };
    let warm_up = Level {
        rounds: 1,
        output_tokens: 16,
        ..level(1)
    };
    run_level(&engine, &model, warm_up);
    let c = 16.min(max_c);
    if args.structured_only {
        return structured_case(&engine, &model, level(c), args.structured_pairs);
    }
    for &c in &args.concurrency {
        let (elapsed, samples) = run_level(&engine, &model, level(c));
        report(&format!("concurrency {c:>3}"), elapsed, &samples);
    }
    let hits_before = engine.metrics().prefix_hits.get();
    let queries_before = engine.metrics().prefix_queries.get();
    let prefix = Level {
        shared: Some(args.prompt_tokens * 9 / 10),
        ..level(c)
    };
    let (elapsed, samples) = run_level(&engine, &model, prefix);
    report(&format!("prefix {c:>3}   "), elapsed, &samples);
    let hits = engine.metrics().prefix_hits.get() - hits_before;
    let queries = engine.metrics().prefix_queries.get() - queries_before;
    println!(
        "  prefix case: 90% of each prompt shared; cache hit rate {:.0}% of prompt tokens",
        100.0 * hits as f64 / queries.max(1) as f64
    );
    structured_case(&engine, &model, level(c), args.structured_pairs)?;
    println!(
        "peer figures from shared/peers/README.md (llama.cpp server over HTTP, for orientation):"
    );
    println!("  concurrency   1: 58 output tok/s, TTFT p50 0.75 s, ITL p50 10.8 ms");
    println!("  concurrency   4: 89 output tok/s, TTFT p50 2.65 s, ITL p50 29 ms");
    println!("  concurrency  16: 101 output tok/s, TTFT p50 6.8 s, ITL p50 89 ms");
    Ok(())
}

/// The sampling case: what drawing a batch-64 step's tokens costs on the host, whatever runs
/// the forward pass (on a GPU the step's budget at the batch-64 target is 6.4 ms for
/// this model). 64 rows of the model's own logits (every 15th position of this file's
/// source, teacher-forced), sampled under common parameter sets, one row after another on
/// this thread and as the engine does (`sample_all`, one thread per core).
fn sampling_case(model: &Model) -> anyhow::Result<()> {
    let text = include_str!("bench_engine.rs");
    let ids: Vec<u32> = model.tokenizer().encode(text, false)?;
    let ids = &ids[..ids.len().min(64 * 15)];
    let blocks = ids.len().div_ceil(16);
    let mut kv = model.new_kv_store(blocks, 16)?;
    let batch = StepBatch {
        seqs: vec![SeqChunk {
            tokens: ids.to_vec(),
            start_pos: 0,
            block_table: (0..blocks as u32).collect(),
            logits: Logits::All,
        }],
    };
    let all = model.forward(&batch, &mut kv)?.to_vec2::<f32>()?;
    let rows: Vec<&[f32]> = all.iter().step_by(15).map(Vec::as_slice).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(cores).build()?;
    let sets: [(&str, SamplingParams); 5] = [
        ("greedy", SamplingParams::greedy(1)),
        ("temperature 1", SamplingParams::default()),
        (
            "T 1, top-p 0.95",
            SamplingParams {
                top_p: 0.95,
                ..Default::default()
            },
        ),
        (
            "T 0.7, top-k 50",
            SamplingParams {
                temperature: 0.7,
                top_k: 50,
                ..Default::default()
            },
        ),
        (
            "greedy, 5 logprobs",
            SamplingParams {
                logprobs: Some(5),
                ..SamplingParams::greedy(1)
            },
        ),
    ];
    println!(
        "sampling {} rows of {} logits (ms per step, best of 5; one thread / {cores} threads):",
        rows.len(),
        rows[0].len()
    );
    for (name, params) in &sets {
        let mut states: Vec<SamplerState> = (0..rows.len())
            .map(|i| SamplerState::new(Some(1), i, &[]))
            .collect();
        let mut best = [f64::INFINITY; 2];
        for _ in 0..5 {
            let started = Instant::now();
            for (row, state) in rows.iter().zip(states.iter_mut()) {
                std::hint::black_box(sample(row, params, state, &[], None));
            }
            best[0] = best[0].min(started.elapsed().as_secs_f64());
            let draws = rows
                .iter()
                .zip(states.iter_mut())
                .map(|(row, state)| Draw {
                    raw: row,
                    params,
                    state,
                    suppress: &[],
                    mask: None,
                })
                .collect();
            let started = Instant::now();
            std::hint::black_box(sample_all(&pool, draws));
            best[1] = best[1].min(started.elapsed().as_secs_f64());
        }
        println!(
            "  {name:<20} {:>7.2} / {:>6.2}",
            best[0] * 1e3,
            best[1] * 1e3
        );
    }
    Ok(())
}

/// The structured-output case: the same level unconstrained and with every output held to a
/// JSON schema (a list of at least 32 records, so outputs run to the budget, as unconstrained
/// ones do), alternated `pairs` times so both see the same machine; then the ratio of the
/// summed throughputs and what the grammar masks cost per token.
fn structured_case(
    engine: &EngineHandle,
    model: &Arc<Model>,
    level: Level,
    pairs: usize,
) -> anyhow::Result<()> {
    let schema = serde_json::json!({
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                "name": {"type": "string", "maxLength": 12},
                "ok": {"type": "boolean"}
            },
            "required": ["id", "name", "ok"],
            "additionalProperties": false
        },
        "minItems": 32
    });
    let c = level.clients;
    let constraint = engine
        .compile(&Grammar::JsonSchema(schema))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let before = engine.mask_cost();
    let (mut plain, mut json) = (Totals::default(), Totals::default());
    for _ in 0..pairs.max(1) {
        let (s, samples) = run_level(engine, model, level.clone());
        report(&format!("plain  {c:>3}   "), s, &samples);
        plain.add(s, &samples);
        let structured = Level {
            constraint: Some(constraint.clone()),
            ..level.clone()
        };
        let (s, samples) = run_level(engine, model, structured);
        report(&format!("schema {c:>3}   "), s, &samples);
        json.add(s, &samples);
    }
    let after = engine.mask_cost();
    let masks = (after.masks - before.masks).max(1);
    println!(
        "  structured case, concurrency {c}: schema {:.1} vs unconstrained {:.1} output tok/s \
         ({} vs {} tokens) = {:.1}%; mask {:.0} µs per token to compute, {:.0} µs per \
         token on the step's critical path (after the forward pass; the engine computes masks \
         beside it when a core is free, else after it)",
        json.rate(),
        plain.rate(),
        json.tokens,
        plain.tokens,
        100.0 * json.rate() / plain.rate(),
        (after.compute - before.compute).as_secs_f64() * 1e6 / masks as f64,
        (after.wait - before.wait).as_secs_f64() * 1e6 / masks as f64,
    );
    Ok(())
}

/// Output tokens and wall time summed over runs.
#[derive(Debug, Default)]
struct Totals {
    tokens: usize,
    elapsed: Duration,
}

impl Totals {
    fn add(&mut self, elapsed: Duration, samples: &[Sample]) {
        self.tokens += samples.iter().map(|x| x.tokens).sum::<usize>();
        self.elapsed += elapsed;
    }

    fn rate(&self) -> f64 {
        self.tokens as f64 / self.elapsed.as_secs_f64()
    }
}

/// A prompt of about `len` tokens, distinct per `id`, or sharing its first `shared` tokens
/// with every other prompt of the run.
fn make_prompt(model: &Model, id: usize, len: usize, shared: Option<usize>) -> Vec<u32> {
    let tok = model.tokenizer();
    let words = [
        "river", "stone", "lantern", "harbor", "meadow", "copper", "signal", "orchard", "beacon",
        "thistle", "canyon", "ember", "glacier", "willow", "quartz", "falcon",
    ];
    let mut text = String::new();
    let mut state = (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut out = Vec::new();
    if let Some(n) = shared {
        let base = tok
            .encode(
                &"Shared context: the sluice gate opens at dawn. ".repeat(n / 8 + 2),
                false,
            )
            .expect("tokenises");
        out.extend_from_slice(&base[..n.min(base.len())]);
    }
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(words[(state % words.len() as u64) as usize]);
        text.push(' ');
        if text.len() > 64 {
            out.extend(tok.encode(&text, false).expect("tokenises"));
            text.clear();
        }
    }
    out.truncate(len);
    out
}

/// One load level: its clients, their requests, and what the requests share.
#[derive(Debug, Clone)]
struct Level {
    clients: usize,
    rounds: usize,
    output_tokens: usize,
    prompt_tokens: usize,
    /// Leading prompt tokens every request shares (the prefix-cache case).
    shared: Option<usize>,
    /// A grammar every output must match (the structured-output case).
    constraint: Option<Arc<Constraint>>,
}

fn run_level(engine: &EngineHandle, model: &Arc<Model>, level: Level) -> (Duration, Vec<Sample>) {
    let Level {
        clients,
        rounds,
        output_tokens,
        prompt_tokens,
        shared,
        constraint,
    } = level;
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let engine = engine.clone();
            let model = model.clone();
            let constraint = constraint.clone();
            std::thread::spawn(move || {
                let mut samples = Vec::new();
                for _ in 0..rounds {
                    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let prompt = make_prompt(&model, id, prompt_tokens, shared);
                    let sampling = SamplingParams {
                        ignore_eos: true,
                        constraint: constraint.clone(),
                        ..SamplingParams::greedy(output_tokens)
                    };
                    let submitted = Instant::now();
                    let mut stream = engine
                        .submit(Request {
                            prompt,
                            sampling,
                            priority: 0,
                            ..Request::default()
                        })
                        .expect("accepted");
                    let mut s = Sample::default();
                    let mut last = None::<Instant>;
                    while let Some(ev) = stream.blocking_next() {
                        match ev {
                            Event::Delta(d) => {
                                let now = Instant::now();
                                let n = d.token_ids.len().max(1);
                                match last {
                                    None => s.ttft = now - submitted,
                                    Some(l) => {
                                        let gap = (now - l) / n as u32;
                                        s.itl.extend(std::iter::repeat_n(gap, n));
                                    }
                                }
                                s.tokens += d.token_ids.len();
                                last = Some(now);
                            }
                            Event::Finish(f) => {
                                // Like with like: every output, constrained or not, runs to the
                                // budget (the schema cannot close sooner).
                                assert_eq!(f.usage.completion_tokens, output_tokens);
                                break;
                            }
                            Event::Prompt(_) => unreachable!("no prompt log-probabilities asked"),
                        }
                    }
                    samples.push(s);
                }
                samples
            })
        })
        .collect();
    let samples = workers
        .into_iter()
        .flat_map(|w| w.join().expect("client thread"))
        .collect();
    (started.elapsed(), samples)
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn report(label: &str, elapsed: Duration, samples: &[Sample]) {
    let tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<Duration> = samples.iter().map(|s| s.ttft).collect();
    let mut itl: Vec<Duration> = samples.iter().flat_map(|s| s.itl.iter().copied()).collect();
    println!(
        "  {label}: {:>6.1} output tok/s   TTFT p50 {:>6.3} s p99 {:>6.3} s   ITL p50 {:>6.1} ms p99 {:>6.1} ms",
        tokens as f64 / elapsed.as_secs_f64(),
        percentile(&mut ttft, 0.5).as_secs_f64(),
        percentile(&mut ttft, 0.99).as_secs_f64(),
        percentile(&mut itl, 0.5).as_secs_f64() * 1e3,
        percentile(&mut itl, 0.99).as_secs_f64() * 1e3,
    );
}
